"""Issue 41: a sign-in that cannot be guessed at (the lock of an account from an address, the
client's address behind trusted proxies only), single sign-on against a local OpenID provider,
password sign-in turned off, and sessions that end ODAL_SESSION_SECONDS after sign-in."""

import ipaddress
import threading
import time
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.db.models import F
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from odal.core.models import AuditEntry
from odal.surfaces.signin.sso import NOT_STAFF
from tests.factories import UserFactory, issue_token
from tests.oidc_provider import OpenIdProvider
from tests.test_settings import read_settings, refusal

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests"
ATTACKER = "203.0.113.7"
LOCKED = "Too many wrong passwords for this account from your address"


def sign_in(username, password, *, address=ATTACKER, forwarded=None, client=None):
    """A POST of the admin's login form, from `address` (with X-Forwarded-For `forwarded`)."""
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    return (client or Client()).post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
        headers=headers,
    )


def signed_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


def guess(username, times, **where):
    """`times` wrong passwords; the one that reaches the limit is answered with the lock's page."""
    for _ in range(times):
        response = sign_in(username, "wrong-password", **where)
        assert response.status_code in (200, 429) and not signed_in(response), response.status_code
    return response


# -- the lock --------------------------------------------------------------------------------


def test_five_wrong_passwords_lock_the_account_from_that_address_even_with_the_right_one():
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    assert guess(alice.username, 4).status_code == 200
    assert LOCKED in guess(alice.username, 1).content.decode()  # the fifth

    refused = sign_in(alice.username, PASSWORD)
    assert refused.status_code == 429
    page = refused.content.decode()
    assert LOCKED in page and "even with the right password" in page
    assert "UTC (in 15 minutes)" in page
    assert 800 < int(refused["Retry-After"]) <= 900
    assert 'id="login-form"' in page  # the page stays Django admin's login page, for another account

    assert signed_in(sign_in(bob.username, PASSWORD))  # another account from the same address
    assert signed_in(sign_in(alice.username, PASSWORD, address="198.51.100.20"))  # another address
    assert sign_in(alice.username, PASSWORD).status_code == 429  # and still locked from here


def test_the_apis_bearer_tokens_are_not_touched_by_a_lock_on_their_address():
    """(What must not change: this one passed before issue 41 too.)"""
    guess(UserFactory(username="alice").username, 5)
    token = issue_token("read")
    answer = Client().get(
        "/vault/api/v1/registry", REMOTE_ADDR=ATTACKER, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200


def test_an_authentication_without_a_request_is_left_to_the_password_backend():
    """Django's test client's login() passes no request: no address to count against."""
    UserFactory(username="alice")
    assert Client().login(username="alice", password=PASSWORD)


def test_fewer_wrong_passwords_than_the_limit_do_not_lock():
    """(The limit's other side: this one passed before issue 41 too.)"""
    alice = UserFactory(username="alice")
    guess(alice.username, 4)
    assert signed_in(sign_in(alice.username, PASSWORD))


def test_the_lock_is_recorded_once_in_the_audit_trail_and_counted_in_metrics():
    alice = UserFactory(username="alice")
    guess(alice.username, 5)
    assert sign_in(alice.username, PASSWORD).status_code == 429
    assert sign_in(alice.username, "wrong-password").status_code == 429  # refused tries: the same lock

    [entry] = AuditEntry.objects.filter(action="login_locked")
    assert entry.actor == "alice"
    assert entry.details == {"address": ATTACKER, "attempts": 5}
    assert "wrong-password" not in str(entry.details) and PASSWORD not in str(entry.details)
    metrics = Client().get("/metrics").content.decode()
    assert "odal_login_locked_total 1.0" in metrics
    admin = Client()
    admin.force_login(UserFactory(username="ops", is_superuser=True))
    trail = admin.get("/admin/odal/auditentry/?action=login_locked")
    assert trail.status_code == 200 and "login_locked" in trail.content.decode()


def test_the_end_of_the_window_unlocks():
    alice = UserFactory(username="alice")
    guess(alice.username, 5)
    assert sign_in(alice.username, PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=14))
    assert sign_in(alice.username, PASSWORD).status_code == 429  # a minute of the window left
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=1, seconds=1))
    assert signed_in(sign_in(alice.username, PASSWORD))


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_one_locked(settings):
    settings.ODAL_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    alice = UserFactory(username="alice")
    # the client's address, as the proxies saw it, is the right-most one that is not a proxy
    guess(alice.username, 5, address="10.0.0.2", forwarded="198.51.100.9")
    refused = sign_in(alice.username, PASSWORD, address="10.0.0.2", forwarded="198.51.100.9, 10.0.0.3")
    assert refused.status_code == 429
    assert AuditEntry.objects.get(action="login_locked").details["address"] == "198.51.100.9"
    # another person behind the same proxies is not locked
    assert signed_in(sign_in(alice.username, PASSWORD, address="10.0.0.2", forwarded="198.51.100.10"))


def test_behind_a_trusted_proxy_what_the_client_wrote_left_of_its_address_changes_nothing(settings):
    settings.ODAL_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    alice = UserFactory(username="alice")
    for n in range(5):
        guess(alice.username, 1, address="10.0.0.2", forwarded=f"192.0.2.{n}, 198.51.100.9")
    refused = sign_in(alice.username, PASSWORD, address="10.0.0.2", forwarded="192.0.2.99, 198.51.100.9")
    assert refused.status_code == 429


def test_a_forwarded_for_header_from_an_untrusted_peer_is_ignored(settings):
    settings.ODAL_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    alice = UserFactory(username="alice")
    for n in range(5):  # a new address in the header every time
        guess(alice.username, 1, forwarded=f"192.0.2.{n}")
    assert sign_in(alice.username, PASSWORD, forwarded="192.0.2.99").status_code == 429
    assert AuditEntry.objects.get(action="login_locked").details["address"] == ATTACKER


def test_an_ipv6_client_is_counted_by_its_64_network():
    """One subscriber's IPv6 /64 holds 2^64 addresses: a new one for every guess is no escape."""
    alice = UserFactory(username="alice")
    for n in range(1, 6):
        guess(alice.username, 1, address=f"2001:db8:1:2::{n:x}")
    assert sign_in(alice.username, PASSWORD, address="2001:db8:1:2:ffff::99").status_code == 429
    assert AuditEntry.objects.get(action="login_locked").details["address"] == "2001:db8:1:2::"
    assert signed_in(sign_in(alice.username, PASSWORD, address="2001:db8:1:3::1"))  # another network


@pytest.mark.parametrize(
    "env, said",
    [
        ({"ODAL_LOGIN_ATTEMPTS": "0"}, "ODAL_LOGIN_ATTEMPTS must be between 1 and 1000, got 0"),
        ({"ODAL_LOGIN_ATTEMPTS": "abc"}, "ODAL_LOGIN_ATTEMPTS must be a whole number, got 'abc'"),
        ({"ODAL_LOGIN_WINDOW": "xyz"}, "ODAL_LOGIN_WINDOW must be a duration such as 24h, 90m or 7d; got 'xyz'"),
        ({"ODAL_LOGIN_WINDOW": "off"}, "ODAL_LOGIN_WINDOW must be a duration such as 24h, 90m or 7d; got 'off'"),
        ({"ODAL_TRUSTED_PROXIES": "999.1.1.1"}, "ODAL_TRUSTED_PROXIES must be comma-separated IP addresses or networks"),
        ({"ODAL_TRUSTED_PROXIES": "10.0.0.0/8, proxy.internal"}, "ODAL_TRUSTED_PROXIES must be comma-separated"),
        ({"ODAL_SESSION_SECONDS": "8h"}, "ODAL_SESSION_SECONDS must be a whole number, got '8h'"),
        ({"ODAL_OIDC_ISSUER": "https://id.example.eu"}, "Single sign-on needs ODAL_OIDC_ISSUER, ODAL_OIDC_CLIENT_ID and ODAL_OIDC_CLIENT_SECRET all set; ODAL_OIDC_CLIENT_ID, ODAL_OIDC_CLIENT_SECRET are not"),
        ({"ODAL_OIDC_ISSUER": "id.example.eu", "ODAL_OIDC_CLIENT_ID": "odal", "ODAL_OIDC_CLIENT_SECRET": "s"}, "ODAL_OIDC_ISSUER must be a http or https URL"),
        ({"ODAL_PASSWORD_LOGIN": "0"}, "ODAL_PASSWORD_LOGIN=0 turns password sign-in off only when single sign-on is on"),
    ],
)  # fmt: skip
def test_a_bad_sign_in_setting_stops_start_up_naming_it(env, said):
    assert refusal(**env).startswith(said)


def test_sign_in_settings_and_their_defaults():
    default = read_settings()
    assert default["AXES_FAILURE_LIMIT"] == 5
    assert default["AXES_COOLOFF_TIME"] == timedelta(minutes=15)
    assert default["ODAL_TRUSTED_PROXIES"] == ()
    assert default["SESSION_COOKIE_AGE"] == 28800
    assert "odal.surfaces.signin.sso.SignOnBackend" not in default["AUTHENTICATION_BACKENDS"]
    given = read_settings(
        ODAL_LOGIN_ATTEMPTS="3",
        ODAL_LOGIN_WINDOW="1h",
        ODAL_TRUSTED_PROXIES="10.0.0.0/8, 2001:db8::1",
        ODAL_SESSION_SECONDS="3600",
    )
    assert (given["AXES_FAILURE_LIMIT"], given["AXES_COOLOFF_TIME"]) == (3, timedelta(hours=1))
    assert given["ODAL_TRUSTED_PROXIES"] == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("2001:db8::1/128"),
    )
    assert given["SESSION_COOKIE_AGE"] == 3600


# -- sessions ----------------------------------------------------------------------------------


def test_a_session_ends_odal_session_seconds_after_sign_in_however_busy(settings):
    settings.ODAL_SESSION_SECONDS = 600
    UserFactory(username="alice")
    client = Client()
    before = timezone.now()
    assert signed_in(sign_in("alice", PASSWORD, client=client))
    ends = client.session.get_expiry_date()
    assert before + timedelta(seconds=600) <= ends <= timezone.now() + timedelta(seconds=600)
    assert client.session["odal_signed_in_by"] == "password"
    session = client.session
    session["busy"] = True  # a later request that writes the session does not move its end
    session.save()
    assert client.session.get_expiry_date() == ends
    assert client.get("/admin/").status_code == 200


# -- single sign-on ----------------------------------------------------------------------------


@pytest.fixture
def provider(settings):
    with OpenIdProvider() as provider:
        settings.ODAL_OIDC = True
        settings.ODAL_OIDC_ISSUER = provider.url
        settings.ODAL_OIDC_CLIENT_ID = provider.client_id
        settings.ODAL_OIDC_CLIENT_SECRET = provider.client_secret
        settings.AUTHENTICATION_BACKENDS = [
            "odal.surfaces.signin.lockout.LockBackend",
            "odal.surfaces.signin.sso.SignOnBackend",
            "django.contrib.auth.backends.ModelBackend",
        ]
        yield provider


def sign_on(client):
    """The button, the provider (which signs its `claims` in at once) and back to odal."""
    start = client.get("/admin/sso/start/?next=/admin/")
    assert start.status_code == 302, start.content
    at_provider = httpx.get(start["Location"])
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["Location"])
    assert back.path == "/admin/sso/callback/"
    return client.get(back.path, dict(parse_qsl(back.query)))


@pytest.mark.parametrize("claim, group", [(["staff", "operators"], "Operators"), ("Viewers", "Viewers")])
def test_single_sign_on_signs_a_person_in_with_the_group_the_claim_names(provider, claim, group):
    provider.claims = {
        "sub": "p-1",
        "preferred_username": "carol",
        "email": "carol@example.eu",
        "groups": claim,
    }
    client = Client()
    assert client.get("/admin/login/").content.decode().count("Sign in with single sign-on") == 1

    answer = sign_on(client)
    assert (answer.status_code, answer["Location"]) == (302, "/admin/")
    carol = get_user_model().objects.get(username="carol")
    assert carol.is_staff and not carol.is_superuser and not carol.has_usable_password()
    assert [g.name for g in carol.groups.all()] == [group]
    assert client.session["odal_signed_in_by"] == "oidc"
    assert client.get("/admin/").status_code == 200
    assert provider.token_requests[0]["code_verifier"]  # PKCE


def test_single_sign_on_updates_the_groups_at_every_sign_in(provider):
    provider.claims = {"sub": "p-1", "email": "dan@example.eu", "groups": ["Operators"]}
    sign_on(Client())
    provider.claims = {"sub": "p-1", "email": "dan@example.eu", "groups": ["Viewers"]}
    sign_on(Client())
    dan = get_user_model().objects.get(username="dan@example.eu")  # no preferred_username: the email
    assert [g.name for g in dan.groups.all()] == ["Viewers"]


def test_a_person_in_neither_group_is_not_let_in(provider):
    provider.claims = {"sub": "p-2", "preferred_username": "eve", "groups": ["Accounting"]}
    client = Client()
    answer = sign_on(client)
    assert (answer.status_code, answer["Location"]) == (302, "/admin/login/")
    assert escape(NOT_STAFF) in client.get("/admin/login/").content.decode()
    assert not get_user_model().objects.get(username="eve").is_staff
    assert client.get("/admin/").status_code == 302  # to the login page


def test_an_id_token_for_another_client_is_refused(provider):
    provider.claims = {"sub": "p-1", "preferred_username": "carol", "groups": ["Operators"], "aud": "other"}
    client = Client()
    assert sign_on(client)["Location"] == "/admin/login/"
    assert "did not sign you in" in client.get("/admin/login/").content.decode()
    assert "_auth_user_id" not in client.session


def test_an_unreachable_provider_is_said_on_the_login_page(settings):
    with OpenIdProvider() as gone:
        url = gone.url
    settings.ODAL_OIDC = True
    settings.ODAL_OIDC_ISSUER = url
    settings.ODAL_OIDC_CLIENT_ID, settings.ODAL_OIDC_CLIENT_SECRET = "odal", "secret"
    client = Client()
    answer = client.get("/admin/sso/start/")
    assert (answer.status_code, answer["Location"]) == (302, "/admin/login/")
    assert "Single sign-on is unavailable" in client.get("/admin/login/").content.decode()


def test_without_single_sign_on_there_is_no_button_and_no_route():
    assert "single sign-on" not in Client().get("/admin/login/").content.decode()
    assert Client().get("/admin/sso/start/").status_code == 404


def test_with_password_sign_in_off_the_form_is_gone_and_a_password_is_refused(provider, settings):
    settings.ODAL_PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = [
        "odal.surfaces.signin.lockout.LockBackend",
        "odal.surfaces.signin.sso.SignOnBackend",
    ]
    UserFactory(username="alice")
    page = Client().get("/admin/login/").content.decode()
    assert 'id="login-form"' not in page and "Sign in with single sign-on" in page
    refused = sign_in("alice", PASSWORD)
    assert refused.status_code == 403
    assert "Password sign-in is turned off" in refused.content.decode()


def test_single_sign_on_does_not_take_over_a_local_account_of_the_same_username(provider):
    """An identity provider's person named like a local account with a password (a superuser made
    on the command line) neither signs in as it, skipping its password and second factor, nor
    changes its groups or email."""
    admin = UserFactory(username="admin", is_superuser=True, email="root@odal.example")
    provider.claims = {"sub": "idp-9", "preferred_username": "admin", "email": "x@evil.example",
                       "groups": []}  # fmt: skip
    client = Client()
    assert sign_on(client)["Location"] == "/admin/login/"
    assert "did not sign you in" in client.get("/admin/login/").content.decode()
    assert "_auth_user_id" not in client.session
    admin.refresh_from_db()
    assert (admin.is_staff, admin.email, admin.has_usable_password()) == (True, "root@odal.example", True)


def test_single_sign_on_by_email_does_not_take_over_a_local_account_named_by_that_email(provider):
    local = UserFactory(username="ops@odal.example")
    provider.claims = {"sub": "idp-10", "email": "ops@odal.example", "groups": ["Operators"]}
    client = Client()
    assert sign_on(client)["Location"] == "/admin/login/"
    assert "_auth_user_id" not in client.session
    assert not local.groups.exists()


def waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def wait_for_waiters(count: int) -> None:
    deadline = time.monotonic() + 30
    while waiting_on_locks() < count:
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)  # the sign-ins run on their own threads and connections
def test_wrong_passwords_sent_at_once_do_not_race_past_the_limit():
    """Four wrong passwords counted; two more and then the right one sent at the same moment. Each
    read four before any was counted, so each had its password checked: the right one, the
    seventh guess, signed in. A guess must see the ones sent before it counted."""
    alice = UserFactory(username="alice")
    guess(alice.username, 4)
    answers, release, held = {}, threading.Event(), threading.Event()

    def hold_the_count():  # the count's row stays locked until every guess is at it
        with transaction.atomic():
            list(AccessAttempt.objects.select_for_update().filter(username="alice"))
            held.set()
            assert release.wait(30)
        connections.close_all()

    def try_password(n, password):
        answers[n] = sign_in(alice.username, password)
        connections.close_all()

    threads = [threading.Thread(target=hold_the_count)]
    threads[0].start()
    assert held.wait(30)
    for n, password in enumerate(["wrong-1", "wrong-2", PASSWORD]):
        threads.append(threading.Thread(target=try_password, args=(n, password)))
        threads[-1].start()
        wait_for_waiters(n + 1)
    release.set()
    for thread in threads:
        thread.join(30)

    assert not signed_in(answers[2]), "the right password, sent after six wrong ones, signed in"
    assert answers[2].status_code == 429


def test_another_person_of_the_provider_with_the_same_username_is_not_signed_in_as_the_first(provider):
    """The provider's `sub` is the person; preferred_username and email are names a person may be
    given or change. Another subject named like an account single sign-on made is refused, and
    does not change it; its own subject signs in under a new name too."""
    provider.claims = {"sub": "p-1", "preferred_username": "carol", "groups": ["Operators"]}
    assert sign_on(Client())["Location"] == "/admin/"
    provider.claims = {"sub": "p-666", "preferred_username": "carol", "groups": []}
    client = Client()
    assert sign_on(client)["Location"] == "/admin/login/"
    assert "_auth_user_id" not in client.session
    carol = get_user_model().objects.get(username="carol")
    assert carol.is_staff and [g.name for g in carol.groups.all()] == ["Operators"]
    provider.claims = {"sub": "p-1", "preferred_username": "carol.new", "groups": ["Operators"]}
    client = Client()
    assert sign_on(client)["Location"] == "/admin/"
    assert client.session["_auth_user_id"] == str(carol.pk)


@pytest.mark.parametrize("claim", [7, {"Operators": True}, None, True])
def test_a_groups_claim_that_is_neither_a_list_nor_a_name_gives_no_group(provider, claim):
    provider.claims = {"sub": "p-3", "preferred_username": "frank", "groups": claim}
    client = Client()
    answer = sign_on(client)
    assert (answer.status_code, answer["Location"]) == (302, "/admin/login/")
    assert escape(NOT_STAFF) in client.get("/admin/login/").content.decode()
