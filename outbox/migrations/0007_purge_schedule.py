"""Retention: a django-q2 schedule that runs outbox.tasks.purge every 10 minutes (outbox.retention)."""

from django.db import migrations


def create(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="outbox purge",
        defaults={"func": "outbox.tasks.purge", "schedule_type": "I", "minutes": 10, "repeats": -1},
    )


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="outbox purge").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0006_post_event_permission"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]
    operations = [migrations.RunPython(create, remove)]
