"""Each delivery carries its event's type (issue 26): the lists filtered by type (GET
outbox/deliveries?eventType=, the deliveries admin's filter and search, replay and resend by
filter) walk delivery_type_idx, newest first, where they joined every event and read the whole
table for a rare type.

The deliveries made before it get their event's type in batches of BATCH rows, each committed on
its own (the migration is not atomic): a sweep running beside it waits for at most one batch's
row locks, and a migration stopped halfway resumes where it stopped."""

from django.db import migrations, models

BATCH = 20_000


def copy_event_types(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        while True:
            cursor.execute(
                "UPDATE outbox_delivery SET event_type = "
                "(SELECT type FROM outbox_event WHERE outbox_event.id = outbox_delivery.event_id) "
                "WHERE id IN (SELECT id FROM outbox_delivery WHERE event_type = '' LIMIT %s)",
                [BATCH],
            )
            if cursor.rowcount == 0:
                return


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
