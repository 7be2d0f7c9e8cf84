"""Each delivery carries its event's type (issue 26): the lists filtered by type (GET
outbox/deliveries?eventType=, the deliveries admin's filter and search, replay and resend by
filter) walk delivery_type_idx, newest first, where they joined every event and read the whole
table for a rare type.

The deliveries made before it get their event's type in batches of BATCH rows, each committed on
its own (the migration is not atomic): a sweep running beside it waits for at most one batch's
row locks, and a migration stopped halfway resumes where it stopped. A delivery made by a
process of the release before, still running after this (a rolling deploy), gets its type from
the retention task (DeliveryQuerySet.copy_event_types, every 10 minutes)."""

from django.db import migrations, models

BATCH = 20_000


def copy_event_types(apps, schema_editor):
    """In batches by primary key, each past the last: a delivery whose event's type is '' itself
    (never a valid type, but no constraint forbids it) stays '' and is not taken again."""
    with schema_editor.connection.cursor() as cursor:
        after = None
        while True:
            cursor.execute(
                "SELECT id FROM outbox_delivery WHERE event_type = ''"
                + ("" if after is None else " AND id > %s")
                + " ORDER BY id LIMIT %s",
                [BATCH] if after is None else [after, BATCH],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return
            cursor.execute(
                "UPDATE outbox_delivery SET event_type = "
                "(SELECT type FROM outbox_event WHERE outbox_event.id = outbox_delivery.event_id) "
                "WHERE event_type = '' AND id <= %s" + ("" if after is None else " AND id > %s"),
                [ids[-1]] if after is None else [ids[-1], after],
            )
            after = ids[-1]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("outbox", "0015_event_passport_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="event_type",
            field=models.CharField(db_default="", editable=False, max_length=100),
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(fields=["event_type", "-created_at", "-id"], name="delivery_type_idx"),
        ),
        migrations.RunPython(copy_event_types, migrations.RunPython.noop),
    ]
