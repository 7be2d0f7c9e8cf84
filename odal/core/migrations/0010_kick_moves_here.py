"""Kick moves from the outbox app to odal (odal.work, the claimed-work machine the sweep and the
drain share). State only: its table stays outbox_kick, rows and all."""

from django.db import migrations, models


class Migration(migrations.Migration):
    # Not on the outbox's migrations: nothing happens to the database here, and the outbox's
    # own (0013) drops the model from its state after this one.
    dependencies = [("odal", "0009_retention_positions")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Kick",
                    fields=[
                        ("task", models.CharField(max_length=200, primary_key=True, serialize=False)),
                        ("enqueued_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={"db_table": "outbox_kick"},
                ),
            ],
        ),
    ]
