"""Issue 41, item 2: the second factor. With ODAL_ENV=production a staff account that may change
anything (a superuser, an Operator) reaches only the enrolment page until it has confirmed an
authenticator and typed its code, and its session's API writes are refused; enrolment with a real
TOTP computed from the page's secret; sign-in with the password and then a code; recovery codes
that work once; Viewers not forced; `odal user reset-2fa`."""

import io
import re
import threading
import time
from base64 import b32decode

import psycopg
import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from odal.core.groups import ensure_groups
from odal.core.models import AuditEntry
from outbox.models import Delivery
from tests.factories import DeadDeliveryFactory, PassportFactory, UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests"
ENROL, CODE = "/admin/second-factor/", "/admin/second-factor/code/"


@pytest.fixture
def production(settings):
    settings.PRODUCTION = True


def person(kind: str):
    """A superuser, or staff in the Operators or Viewers group (as the migrations make them)."""
    if kind == "superuser":
        return UserFactory(is_superuser=True)
    ensure_groups()
    user = UserFactory()
    user.groups.add(Group.objects.get(name=kind))
    return user


def sign_in(client, user):
    """The admin's own sign-in form, with the password (not force_login: the real flow)."""
    response = client.post("/admin/login/?next=/admin/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302, response.content[:500]


def secret_of(page) -> bytes:
    shown = re.search(rb'id="otp-secret"[^>]*value="([A-Z2-7 ]+)"', page.content).group(1)
    return b32decode(shown.replace(b" ", b""))


def code(key: bytes, steps_ahead: int = 0) -> str:
    """The authenticator's code now (or `steps_ahead` 30-second steps from now), as RFC 6238 makes it."""
    return f"{totp(key, drift=steps_ahead):06d}"


def enrol(client) -> tuple[bytes, list[str]]:
    """Set up the authenticator from the enrolment page: its secret, and the recovery codes shown."""
    key = secret_of(client.get(ENROL))
    done = client.post(ENROL, {"code": code(key)})
    assert done.status_code == 200 and b"Two-factor sign-in is on" in done.content
    codes = re.search(rb'<textarea id="secret-once"[^>]*>([^<]*)</textarea>', done.content).group(1).split()
    return key, [c.decode() for c in codes]


# -- production: who may change anything reaches only enrolment ---------------------------------


@pytest.mark.parametrize("kind", ["superuser", "Operators"])
def test_a_changer_without_a_verified_device_reaches_only_enrolment(production, client, kind):
    user = person(kind)
    sign_in(client, user)
    passport, dead = PassportFactory(), DeadDeliveryFactory()
    for path in ["/admin/", "/admin/outbox/delivery/", f"/admin/odal/passport/{passport.pk}/change/"]:
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith(ENROL), path
    action = client.post(
        "/admin/outbox/delivery/",
        {"action": "replay_selected", helpers.ACTION_CHECKBOX_NAME: [str(dead.pk)], "post": "yes",
         "reason": "consumer is back"},
    )  # fmt: skip
    assert action.status_code == 302 and action["Location"].startswith(ENROL)
    assert Delivery.objects.get(pk=dead.pk).status == "dead"
    assert not AuditEntry.objects.filter(action="delivery_replayed").exists()
    page = client.get(f"{ENROL}?next=/admin/")
    assert page.status_code == 200 and b"needs a second factor before anything else" in page.content


@pytest.mark.parametrize("kind", ["superuser", "Operators"])
def test_a_session_without_its_second_factor_may_not_write_through_the_api(production, client, kind, api_as):
    user = person(kind)
    sign_in(client, user)
    dead = DeadDeliveryFactory()
    path = f"/vault/api/v1/outbox/deliveries/{dead.pk}/replay"
    refused = client.post(path, {"reason": "consumer is back"}, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "second_factor_required" and refused.json()["detail"].endswith(".")
    assert Delivery.objects.get(pk=dead.pk).status == "dead"
    assert client.get(f"/vault/api/v1/outbox/deliveries/{dead.pk}").status_code == 200  # reads stay open
    # a bearer token needs no second factor
    assert api_as("admin").post(f"outbox/deliveries/{dead.pk}/replay", {"reason": "r"}).status_code == 200


def test_a_viewer_is_not_forced(production, client):
    sign_in(client, person("Viewers"))
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/outbox/delivery/").status_code == 200


def test_in_development_the_second_factor_is_optional(client):
    sign_in(client, person("superuser"))
    assert client.get("/admin/").status_code == 200


def test_an_oidc_session_counts_as_verified(production, client):
    sign_in(client, person("superuser"))
    session = client.session
    session["odal_signed_in_by"] = "oidc"  # what single sign-on marks: the identity provider owns it
    session.save()
    assert client.get("/admin/").status_code == 200


# -- enrolment, then signing in with the password and a code ------------------------------------


@pytest.mark.parametrize("kind", ["superuser", "Operators"])
def test_enrol_then_sign_in_with_password_and_code(production, client, kind):
    user = person(kind)
    sign_in(client, user)
    key = secret_of(client.get(ENROL))
    assert client.get(ENROL).content.count(b'id="otp-secret"') == 1
    assert secret_of(client.get(ENROL)) == key  # a reload shows the same secret
    wrong = client.post(ENROL, {"code": f"{(int(code(key)) + 1) % 10**6:06d}"})
    assert wrong.status_code == 200 and b"That code is not right" in wrong.content
    assert not TOTPDevice.objects.filter(user=user).exists()

    key, recovery = enrol(client)
    assert len(recovery) == len(set(recovery)) == 10
    device = TOTPDevice.objects.get(user=user)
    assert device.confirmed and StaticToken.objects.filter(device__user=user).count() == 10
    assert client.get("/admin/").status_code == 200  # verified by the enrolment's code

    client.post("/admin/logout/")
    sign_in(client, user)
    asked = client.get("/admin/outbox/delivery/")
    assert asked.status_code == 302 and asked["Location"].startswith(CODE)
    assert client.get(ENROL)["Location"].startswith(CODE)  # no second device before the first's code
    page = client.get(asked["Location"])
    assert page.status_code == 200 and b"authenticator app" in page.content
    again = client.post(asked["Location"], {"code": code(key)})  # the enrolment's code, replayed
    assert again.status_code == 200 and b"That code is not right, or was used already" in again.content
    assert client.get("/admin/").status_code == 302

    TOTPDevice.objects.filter(pk=device.pk).update(
        throttling_failure_count=0
    )  # (no waiting out the throttle)
    fresh = code(key, steps_ahead=1)  # the next step's code: within the tolerance, after the last used
    done = client.post(asked["Location"], {"code": fresh})
    assert done.status_code == 302 and done["Location"] == "/admin/outbox/delivery/"
    assert client.get("/admin/outbox/delivery/").status_code == 200

    client.post("/admin/logout/")
    sign_in(client, user)
    replayed = client.post(CODE, {"code": fresh})  # the same code within its step: refused
    assert b"That code is not right, or was used already" in replayed.content
    assert client.get("/admin/").status_code == 302


def test_a_recovery_code_works_once(production, client):
    user = person("superuser")
    sign_in(client, user)
    _key, recovery = enrol(client)
    client.post("/admin/logout/")
    sign_in(client, user)
    assert client.post(CODE, {"code": recovery[3].upper()})["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    assert StaticToken.objects.filter(device__user=user).count() == 9

    client.post("/admin/logout/")
    sign_in(client, user)
    second = client.post(CODE, {"code": recovery[3]})
    assert second.status_code == 200 and b"was used already" in second.content
    assert client.get("/admin/").status_code == 302
    assert StaticToken.objects.filter(device__user=user).count() == 9


def test_a_wrong_code_is_a_sentence_and_the_next_try_waits(production, client):
    user = person("superuser")
    sign_in(client, user)
    key, _ = enrol(client)
    client.post("/admin/logout/")
    sign_in(client, user)
    right = code(key, steps_ahead=1)
    wrong = client.post(CODE, {"code": f"{(int(right) + 1) % 10**6:06d}"})
    assert wrong.status_code == 200 and b"That code is not right" in wrong.content
    assert client.get("/admin/").status_code == 302
    # guessing is slowed: straight after a wrong code even the right one waits (1, 2, 4… s)
    waits = client.post(CODE, {"code": right})
    assert waits.status_code == 200 and b"Too many wrong codes in a row: try again after" in waits.content
    assert client.get("/admin/").status_code == 302
    assert StaticToken.objects.filter(device__user=user).count() == 10


def test_an_enrolled_account_is_asked_for_its_code_in_development_too(client):
    user = person("Viewers")
    sign_in(client, user)
    enrol(client)
    client.post("/admin/logout/")
    sign_in(client, user)
    assert client.get("/admin/")["Location"].startswith(CODE)


@pytest.mark.django_db(transaction=True)
def test_an_admin_page_whose_database_does_not_answer_the_check_is_503_not_500(settings, admin_client):
    """The check runs before the view, where DatabaseUnansweredMiddleware does not see it."""
    was, settings.ODAL_DB_STATEMENT_SECONDS = settings.ODAL_DB_STATEMENT_SECONDS, 1
    connection.close()
    params = {
        k: v for k, v in connection.get_connection_params().items() if k not in ("options", "cursor_factory")
    }
    with psycopg.connect(**params) as other:
        other.execute(f"LOCK TABLE {TOTPDevice._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        admin_client.raise_request_exception = False
        page = admin_client.get("/admin/")
    settings.ODAL_DB_STATEMENT_SECONDS = was  # the teardown's TRUNCATE of every table may take longer
    connection.close()
    assert page.status_code == 503, page.content[:300]
    assert page["Retry-After"] and b"does not answer in time" in page.content


# -- odal user reset-2fa -----------------------------------------------------------------------


def run(*argv) -> str:
    out = io.StringIO()
    call_command("user", *argv, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_reset_2fa_removes_the_devices_and_is_audited(production):
    user, other = person("Operators"), person("Operators")
    for someone in (user, other):
        client = Client()
        sign_in(client, someone)
        enrol(client)
    said = run("reset-2fa", user.username, "--reason", "lost phone", "--actor", "ops-lead")
    assert f"Removed the second factor of {user.username}" in said
    assert (
        not TOTPDevice.objects.filter(user=user).exists()
        and not StaticDevice.objects.filter(user=user).exists()
    )
    assert not StaticToken.objects.filter(device__user=user).exists()
    assert TOTPDevice.objects.filter(user=other).exists()  # only theirs
    entry = AuditEntry.objects.get(action="reset_2fa")
    assert (entry.actor, entry.reason, entry.object_id) == ("cli:ops-lead", "lost phone", str(user.pk))
    client = Client()
    sign_in(client, user)
    assert client.get("/admin/")["Location"].startswith(ENROL)  # enrols again


def test_reset_2fa_of_a_user_without_one_says_so_and_writes_nothing():
    user = person("superuser")
    assert run("reset-2fa", user.username, "--reason", "lost phone") == (
        f"{user.username} has no second factor: nothing to reset.\n"
    )
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "argv, returncode, said",
    [
        (["nobody-here", "--reason", "lost phone"], 1, "No user named 'nobody-here'."),
        (["{user}", "--reason", "   "], 1, "A reason is required"),
        (["{user}"], 2, "--reason"),
    ],
)
def test_reset_2fa_refusals(argv, returncode, said):
    user = person("superuser")
    TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)
    with pytest.raises(CommandError) as refused:
        run("reset-2fa", *[a.format(user=user.username) for a in argv])
    assert refused.value.returncode == returncode and said in str(refused.value)
    assert TOTPDevice.objects.filter(user=user).exists() and not AuditEntry.objects.exists()


def waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)  # the two sign-ins run on their own threads and connections
def test_a_recovery_code_typed_in_two_sessions_at_once_signs_in_only_one(production):
    """A stolen recovery code (or one typed twice) used by two sessions at the same moment: both
    read it before either used it up; only one may be let in."""
    user = person("superuser")
    first = Client()
    sign_in(first, user)
    _key, recovery = enrol(first)
    clients = [Client(), Client()]
    for each in clients:
        sign_in(each, user)
    held, answers = threading.Event(), {}

    def hold_the_code():  # the row the sessions use up stays locked until both are at it
        with transaction.atomic():
            list(StaticToken.objects.select_for_update().filter(token=recovery[0]))
            held.set()
            assert release.wait(30)
        connections.close_all()

    def type_code(n):
        answers[n] = clients[n].post(CODE, {"code": recovery[0]})
        connections.close_all()

    release = threading.Event()
    threads = [threading.Thread(target=hold_the_code)] + [
        threading.Thread(target=type_code, args=(n,)) for n in (0, 1)
    ]
    threads[0].start()
    assert held.wait(30)
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 30
    while waiting_on_locks() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    release.set()
    for thread in threads:
        thread.join(30)

    let_in = [n for n in (0, 1) if answers[n].status_code == 302 and answers[n]["Location"] == "/admin/"]
    assert len(let_in) == 1, [answers[n].status_code for n in (0, 1)]
    assert StaticToken.objects.filter(device__user=user).count() == 9
