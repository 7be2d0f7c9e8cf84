"""Keep the sweep running: a django-q2 schedule that runs outbox.tasks.sweep every minute.
Commits that create deliveries also enqueue a sweep at once (odal.work.wake)."""

from django.db import migrations


def create(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="outbox sweep",
        defaults={"func": "outbox.tasks.sweep", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="outbox sweep").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]
    operations = [migrations.RunPython(create, remove)]
