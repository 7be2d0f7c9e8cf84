import pytest
from django.db import DatabaseError, connection, transaction

from odal.core.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_database_refuses_update_of_an_audit_entry():
    entry = AuditEntry.objects.record(actor="system", action="test", reason="kept")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(reason="rewritten")
    entry.refresh_from_db()
    assert entry.reason == "kept"


def test_database_refuses_delete_of_an_audit_entry():
    entry = AuditEntry.objects.record(actor="system", action="test")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as c:
        c.execute("DELETE FROM odal_auditentry")
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_admin_shows_the_audit_trail_read_only(admin_client):
    entry = AuditEntry.objects.record(actor="system", action="test")
    assert admin_client.get("/admin/odal/auditentry/").status_code == 200
    page = admin_client.get(f"/admin/odal/auditentry/{entry.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert admin_client.get("/admin/odal/auditentry/add/").status_code == 403
    assert admin_client.post(f"/admin/odal/auditentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
