"""Keep the drain running: a django-q2 schedule that runs registry.tasks.drain every minute.
Publishing and suspending also enqueue a drain at once."""

from django.db import migrations


def create(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="registry drain",
        defaults={"func": "registry.tasks.drain", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="registry drain").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]
    operations = [migrations.RunPython(create, remove)]
