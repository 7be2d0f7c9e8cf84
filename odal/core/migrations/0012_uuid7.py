"""odal_uuid7(): a time-ordered UUID made by PostgreSQL (odal.core.ids), for the rows insert_rows keys
on the server."""

from django.db import migrations

from odal.core.ids import UUID7_SQL


def forward(apps, schema_editor):
    schema_editor.execute(UUID7_SQL, params=None)


def backward(apps, schema_editor):
    schema_editor.execute("DROP FUNCTION IF EXISTS odal_uuid7()", params=None)


class Migration(migrations.Migration):
    dependencies = [("odal", "0011_tally_triggers_without_joins")]

    operations = [migrations.RunPython(forward, backward)]
