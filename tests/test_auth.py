import pytest

from odal.models import ApiToken
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
    ApiToken.objects.all().revoke()
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


def test_staff_session_reads_and_superuser_writes(client):
    passport = PassportFactory()
    staff = UserFactory()
    client.force_login(staff)
    assert client.get(f"/vault/api/v1/dpp/{passport.pk}").status_code == 200
    assert client.post("/vault/api/v1/dpp", GOOD, content_type="application/json").status_code == 403
    boss = UserFactory(is_superuser=True)
    client.force_login(boss)
    assert client.post("/vault/api/v1/dpp", GOOD, content_type="application/json").status_code == 201


def test_session_write_needs_csrf_token():
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(is_superuser=True))
    response = client.post("/vault/api/v1/dpp", GOOD, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed"


def test_non_staff_session_is_401(client):
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/vault/api/v1/dpp/00000000-0000-0000-0000-000000000000").status_code == 401
