import io
import json
import subprocess
import sys
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import ApiToken, AuditEntry, Passport
from tests.factories import PassportFactory

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_token_create_prints_the_token_once_and_stores_its_hash():
    plaintext = run("token", "create", "--name", "deploy", "--scope", "admin").strip()
    token = ApiToken.objects.get(name="deploy")
    assert token.scope == "admin"
    assert plaintext.startswith(f"odal_{token.prefix}_")
    assert plaintext not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    assert ApiToken.objects.authenticate(plaintext) == token
    assert plaintext not in run("token", "list")


def test_token_revoke():
    token, plaintext = ApiToken.objects.issue(name="x", scope="read")
    run("token", "revoke", token.prefix)
    assert ApiToken.objects.authenticate(plaintext) is None
    with pytest.raises(CommandError) as refused:
        run("token", "revoke", token.prefix)
    assert refused.value.returncode == 1


def test_passport_create_publish_suspend():
    created = json.loads(
        run("passport", "create", "--upi", "https://id.example.eu/01/5/21/Z", "--operator", "OP-5", "--json")
    )
    assert created["status"] == "draft"
    assert "Published" in run("passport", "publish", created["id"], "--actor", "ops")
    assert Passport.objects.get(pk=created["id"]).status == "published"
    assert AuditEntry.objects.filter(action="passport_published", actor="cli:ops").count() == 1
    assert "Suspended" in run("passport", "suspend", created["id"])


def test_passport_create_refuses_a_bad_upi():
    with pytest.raises(CommandError, match="https"):
        run("passport", "create", "--upi", "http://id.example.eu/x", "--operator", "OP")
    assert not Passport.objects.exists()


def test_suspending_a_draft_exits_1_with_the_reason():
    passport = PassportFactory()
    with pytest.raises(CommandError, match="draft") as refused:
        run("passport", "suspend", str(passport.pk))
    assert refused.value.returncode == 1


def test_unknown_and_malformed_ids_are_refused():
    with pytest.raises(CommandError, match="No passport"):
        run("passport", "publish", str(uuid.uuid4()))
    with pytest.raises(CommandError, match="not a passport id"):
        run("passport", "publish", "42")


@pytest.mark.parametrize(
    "argv",
    [
        ("passport", "publish", "42"),
        ("passport", "suspend", "not-a-uuid"),
        ("passport", "show", "x"),
        ("registry", "abandon", "42", "--reason", "r"),
        ("registry", "handle", "42", "reg-1", "--reason", "r"),
        ("outbox", "replay", "42", "--reason", "r"),
    ],
)
def test_a_malformed_id_is_a_usage_error_on_every_command(argv):
    with pytest.raises(CommandError, match=r"is not a (passport|delivery) id \(a UUID\)") as usage:
        run(*argv)
    assert usage.value.returncode == 2


def test_usage_error_exits_2():
    result = subprocess.run(
        [sys.executable, "-m", "odal", "token", "create", "--name", "x", "--scope", "root"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
