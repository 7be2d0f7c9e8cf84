"""Make the audit trail append-only in the database itself: a trigger refuses every UPDATE and
DELETE of odal_auditentry, whoever asks (the admin, a shell, a raw SQL session)."""

from django.db import migrations

INSTALL = """
CREATE OR REPLACE FUNCTION odal_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'odal_auditentry is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER odal_audit_append_only
    BEFORE UPDATE OR DELETE ON odal_auditentry
    FOR EACH ROW EXECUTE FUNCTION odal_audit_append_only();
"""

REMOVE = """
DROP TRIGGER IF EXISTS odal_audit_append_only ON odal_auditentry;
DROP FUNCTION IF EXISTS odal_audit_append_only();
"""


def install(apps, schema_editor):
    schema_editor.execute(INSTALL, params=None)


def remove(apps, schema_editor):
    schema_editor.execute(REMOVE, params=None)


class Migration(migrations.Migration):
    dependencies = [("odal", "0001_initial")]
    operations = [migrations.RunPython(install, remove)]
