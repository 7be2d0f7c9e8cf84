"""Each attempt-log line carries its delivery's consumer (issue 38, item 3): a consumer's page
reads its health (outbox.health) from its own lines by attempt_by_consumer_idx, where it would
join every delivery of the consumer to the attempt log.

The column is added without a default (no table rewrite) and the index is built concurrently (the
sweep keeps logging attempts meanwhile; the migration is not atomic for that). Lines of the
last 24 hours (what the health's figures count) get their consumer in one UPDATE; older lines
stay null: they count in no consumer's health (the last success or failure before this release
is not shown), which the retention purge ends within ODAL_RETENTION_DAYS. A line written by a
process of the release before, still running after this (a rolling deploy), is null too."""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class AddIndexConcurrentlyWhereItCan(AddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY, as `odal migrate` runs it (outside a transaction); inside one
    (a test that migrates a database back and forth within its own transaction) a plain CREATE
    INDEX, which PostgreSQL allows there."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.in_atomic_block:
            return AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)
        return super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.in_atomic_block:
            return AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)
        return super().database_backwards(app_label, schema_editor, from_state, to_state)

BACKFILL = """
UPDATE outbox_deliveryattempt a SET consumer_id = d.consumer_id
FROM outbox_delivery d
WHERE d.id = a.delivery_id AND a.consumer_id IS NULL AND a.finished_at >= now() - interval '24 hours'
"""


def backfill(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKFILL)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("outbox", "0016_delivery_event_type"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryattempt",
            name="consumer",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="outbox.consumer",
            ),
        ),
        AddIndexConcurrentlyWhereItCan(
            model_name="deliveryattempt",
            index=models.Index(
                fields=["consumer", "outcome", "finished_at"],
                include=["duration_ms"],
                name="attempt_by_consumer_idx",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
