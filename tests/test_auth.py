import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from odal.core.models import ApiToken, AuditEntry
from tests.factories import PassportFactory, UserFactory, issue_token

pytestmark = pytest.mark.django_db

GOOD = {"upi": "https://id.example.eu/01/1/21/A", "operatorId": "OP"}


def test_no_credentials_is_401(api_as):
    response = api_as(None).get("dpp/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


def test_unknown_token_is_401(client):
    response = client.get(
        "/vault/api/v1/dpp/00000000-0000-0000-0000-000000000000",
        headers={"Authorization": "Bearer odal_deadbeef_nope"},
    )
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_token"


def test_revoked_token_is_401(client):
    plaintext = issue_token("admin")
    ApiToken.objects.all().revoke(actor="test")
    response = client.get(
        "/vault/api/v1/dpp/00000000-0000-0000-0000-000000000000",
        headers={"Authorization": f"Bearer {plaintext}"},
    )
    assert response.status_code == 401


def test_read_token_cannot_write(api_as):
    response = api_as("read").post("dpp", GOOD)
    assert response.status_code == 403
    assert response.json() == {
        "detail": "This needs the write scope; these credentials have read.",
        "code": "insufficient_scope",
        "requiredScope": "write",
    }


@pytest.mark.parametrize("scope, status", [("read", 403), ("write", 201), ("admin", 201)])
def test_admin_implies_write(api_as, scope, status):
    assert api_as(scope).post("dpp", GOOD).status_code == status


def test_token_secret_is_not_stored():
    token, plaintext = ApiToken.objects.issue(name="ci", scope="read")
    secret = plaintext.split("_", 2)[2]
    stored = ApiToken.objects.filter(pk=token.pk).values().get()
    assert all(secret not in str(value) for value in stored.values())
    assert plaintext not in str(stored)
    assert ApiToken.objects.authenticate(plaintext) == token
    assert ApiToken.objects.authenticate(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")) is None


def test_token_use_is_recorded():
    token, plaintext = ApiToken.objects.issue(name="ci", scope="read")
    ApiToken.objects.authenticate(plaintext)
    token.refresh_from_db()
    assert token.last_used_at is not None


def token_writes(queries) -> int:
    return sum(1 for q in queries.captured_queries if q["sql"].startswith('UPDATE "odal_apitoken"'))


def test_token_use_costs_no_statement_while_the_value_read_is_fresh(monkeypatch):
    token, plaintext = ApiToken.objects.issue(name="ci", scope="read")
    client = Client(headers={"Authorization": f"Bearer {plaintext}"})
    clock = [timezone.now()]
    monkeypatch.setattr(timezone, "now", lambda: clock[0])  # the test's clock, not the machine's

    def writes_over(requests: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            for _ in range(requests):
                assert client.get("/vault/api/v1/registry").status_code == 200
        return token_writes(queries)

    assert writes_over(4) == 1  # the first use; the next three read a fresh value
    first = clock[0]
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    clock[0] += timedelta(seconds=59)
    assert writes_over(3) == 0
    clock[0] += timedelta(seconds=2)  # a use read 61 s old is recorded again, once
    assert writes_over(3) == 1
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first + timedelta(seconds=61)


def test_two_requests_that_read_an_old_use_record_it_once():
    token, _ = ApiToken.objects.issue(name="ci", scope="read")
    now = timezone.now()
    assert ApiToken.objects.filter(pk=token.pk).mark_used(at=now) is True
    # The second read the row before the first wrote: its write finds a fresh value and takes nothing.
    assert ApiToken.objects.filter(pk=token.pk).mark_used(at=now + timedelta(seconds=5)) is False
    assert ApiToken.objects.get(pk=token.pk).last_used_at == now
    # Once the interval has passed, a use is recorded again.
    later = now + timedelta(minutes=1, seconds=1)
    assert ApiToken.objects.filter(pk=token.pk).mark_used(at=later) is True
    assert ApiToken.objects.get(pk=token.pk).last_used_at == later


def grant(user, *perms):
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return type(user).objects.get(pk=user.pk)  # a fresh object: Django caches permissions per object


def test_a_session_needs_the_routes_permission(client):
    passport = PassportFactory()
    staff = UserFactory()
    client.force_login(staff)
    response = client.get(f"/vault/api/v1/dpp/{passport.pk}")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "This needs the permission odal.view_passport; your account does not have it. "
        "Ask an administrator to give it to you (or to a group of yours).",
        "code": "insufficient_permission",
        "requiredPermission": "odal.view_passport",
    }
    grant(staff, "odal.view_passport")
    assert client.get(f"/vault/api/v1/dpp/{passport.pk}").status_code == 200
    refused = client.post("/vault/api/v1/dpp", GOOD, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["requiredPermission"] == "odal.add_passport"
    grant(staff, "odal.add_passport")
    created = client.post("/vault/api/v1/dpp", GOOD, content_type="application/json")
    assert created.status_code == 201
    assert AuditEntry.objects.get(action="passport_created").actor == f"user:{staff.username}"


def test_publishing_does_not_let_a_session_suspend(client):
    """Each lifecycle step its own permission: a session that may publish may not suspend."""
    passport = PassportFactory()
    client.force_login(grant(UserFactory(), "odal.publish_passport"))
    assert client.post(f"/vault/api/v1/dpp/{passport.pk}/publish").status_code == 200
    response = client.post(f"/vault/api/v1/dpp/{passport.pk}/suspend")
    assert response.status_code == 403
    assert response.json()["requiredPermission"] == "odal.suspend_passport"
    passport.refresh_from_db()
    assert passport.status == "published"


def test_posting_events_has_a_permission_of_its_own(client):
    staff = grant(UserFactory(), "odal.publish_passport", "odal.add_passport", "outbox.view_event")
    client.force_login(staff)
    body = {"type": "passport.published", "payload": {}}
    response = client.post("/vault/api/v1/events", body, content_type="application/json")
    assert response.status_code == 403 and response.json()["requiredPermission"] == "outbox.post_event"
    grant(staff, "outbox.post_event")
    assert client.post("/vault/api/v1/events", body, content_type="application/json").status_code == 201


def test_a_superuser_session_may_do_anything(client):
    client.force_login(UserFactory(is_superuser=True))
    assert client.post("/vault/api/v1/dpp", GOOD, content_type="application/json").status_code == 201


def test_session_write_needs_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(is_superuser=True))
    response = client.post("/vault/api/v1/dpp", GOOD, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed"


def test_non_staff_session_is_401(client):
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/vault/api/v1/dpp/00000000-0000-0000-0000-000000000000").status_code == 401


def test_a_session_write_with_the_csrf_token_passes():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(is_superuser=True))
    client.get("/admin/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/vault/api/v1/dpp", GOOD, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201


# -- revocation is audited ----------------------------------------------------------------------


def test_revoking_audits_each_token_it_took_and_only_those():
    live, _ = ApiToken.objects.issue(name="live", scope="write")
    old, _ = ApiToken.objects.issue(name="old", scope="read")
    ApiToken.objects.filter(pk=old.pk).revoke(actor="user:first")
    first_revoked_at = ApiToken.objects.get(pk=old.pk).revoked_at
    assert ApiToken.objects.all().revoke(actor="user:ann") == 1
    entries = AuditEntry.objects.filter(action="token_revoked").order_by("id")
    assert [(e.actor, e.object_id) for e in entries] == [
        ("user:first", str(old.pk)),
        ("user:ann", str(live.pk)),
    ]
    assert entries[1].details == {"name": "live", "scope": "write", "prefix": live.prefix}
    assert ApiToken.objects.get(pk=old.pk).revoked_at == first_revoked_at  # not revoked again
    assert ApiToken.objects.all().revoke(actor="user:ann") == 0
    assert AuditEntry.objects.filter(action="token_revoked").count() == 2


def test_the_admin_action_audits_a_revocation(admin_client, admin_user):
    token, plaintext = ApiToken.objects.issue(name="ci", scope="read")
    admin_client.post(
        "/admin/odal/apitoken/",
        {"action": "revoke_selected", "index": "0", "_selected_action": [str(token.pk)]},
    )
    assert ApiToken.objects.authenticate(plaintext) is None
    entry = AuditEntry.objects.get(action="token_revoked")
    assert (entry.actor, entry.object_id) == (f"user:{admin_user.username}", str(token.pk))


def test_revoking_in_the_admin_needs_the_token_permission(client):
    token, plaintext = ApiToken.objects.issue(name="ci", scope="read")
    client.force_login(grant(UserFactory(), "odal.view_apitoken"))  # sees the tokens, may not revoke
    client.post(
        "/admin/odal/apitoken/",
        {"action": "revoke_selected", "index": "0", "_selected_action": [str(token.pk)]},
    )
    assert ApiToken.objects.authenticate(plaintext) == token
    assert not AuditEntry.objects.filter(action="token_revoked").exists()


def test_the_command_audits_a_revocation():
    token, _ = ApiToken.objects.issue(name="ci", scope="read")
    call_command("token", "revoke", token.prefix, "--actor", "ops", stdout=io.StringIO())
    entry = AuditEntry.objects.get(action="token_revoked")
    assert (entry.actor, entry.object_id) == ("cli:ops", str(token.pk))


# -- only a superuser mints an admin token ------------------------------------------------------


def token_adder(client, **fields):
    user = grant(UserFactory(**fields), "odal.add_apitoken", "odal.view_apitoken")
    client.force_login(user)
    return user


def test_staff_who_may_add_tokens_cannot_mint_an_admin_token(client):
    token_adder(client)
    form = client.get("/admin/odal/apitoken/add/").content.decode()
    assert 'value="write"' in form and 'value="admin"' not in form
    response = client.post("/admin/odal/apitoken/add/", {"name": "sneaky", "scope": "admin"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.exists()
    client.post("/admin/odal/apitoken/add/", {"name": "deploy", "scope": "write"})
    assert ApiToken.objects.get().scope == "write"


def test_a_superuser_may_mint_an_admin_token(client):
    token_adder(client, is_superuser=True)
    client.post("/admin/odal/apitoken/add/", {"name": "root", "scope": "admin"})
    assert ApiToken.objects.get().scope == "admin"
    assert AuditEntry.objects.get(action="token_created").details == {"name": "root", "scope": "admin"}
