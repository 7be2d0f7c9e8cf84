"""Two groups for the back office: Operators may replay dead deliveries, abandon registrations
and record handles (and see everything); Viewers see everything and change nothing."""

from django.db import migrations

from odal.core.groups import ensure_groups


def create_groups(apps, schema_editor):
    ensure_groups(apps)


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["Viewers", "Operators"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("odal", "0002_audit_append_only"),
        ("outbox", "0003_deadletter"),
        ("registry", "0003_stalledregistration"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_groups, remove_groups)]
