"""A webhook URL's credentials (its whole userinfo, every path parameter's and query value) are
shown whole only to admin scope and to staff who may change consumers; everyone and everything
else (read and write scope, Viewers and Operators, the audit trail, the logs, the attempt log and
the command line's reading of it) reads ***."""

import base64
import io
import logging
import urllib.parse

import pytest
from django.contrib.auth.models import Group, Permission

from odal.core.groups import ensure_groups
from odal.core.logs import JsonFormatter, RedactUrls
from odal.core.models import AuditEntry
from odal.core.redact import redacted_url, redacted_urls_in, without_secrets_of
from outbox.events import emit
from outbox.models import Consumer, Delivery
from outbox.schemas import consumer_json
from outbox.sweep import sweep_once
from tests.factories import UserFactory, WebhookConsumerFactory
from tests.webhook_server import Answer, WebhookServer

PASSWORD, TOKEN = "PASSWORD-of-alice", "SECRET-token-42"
URL = f"http://alice:{PASSWORD}@127.0.0.1:9/hook?token={TOKEN}&v=2"
SHOWN = "http://***@127.0.0.1:9/hook?token=***&v=***"


def assert_hidden(text) -> None:
    text = str(text)
    assert PASSWORD not in text and TOKEN not in text, text


@pytest.mark.parametrize(
    "url, shown",
    [
        (URL, SHOWN),
        ("https://hooks.example/x", "https://hooks.example/x"),
        ("https://alice@hooks.example/x", "https://***@hooks.example/x"),  # a user alone may be a key
        ("https://hooks.example/x?SECRET", "https://hooks.example/x?***"),  # a value without a key
        ("https://hooks.example/x?a=1#frag-token", "https://hooks.example/x?a=***#***"),
        ("https://:pw@hooks.example:8443/x?a=%20b&c=", "https://***@hooks.example:8443/x?a=***&c=***"),
        ("http://[::1/x?token=SECRET", "***"),  # cannot be read: hidden whole
    ],
)
def test_redacted_url_hides_the_password_and_every_query_value(url, shown):
    assert redacted_url(url) == shown


def test_urls_inside_a_text_are_redacted():
    text = f"connection to {URL} failed; see https://docs.example/page"
    assert redacted_urls_in(text) == f"connection to {SHOWN} failed; see https://docs.example/page"


# -- the API -----------------------------------------------------------------------------------------


def staff(client, *perms: str, group: str | None = None):
    user = UserFactory()
    if group:
        ensure_groups()
        user.groups.add(Group.objects.get(name=group))
    user.user_permissions.add(*(Permission.objects.get(codename=p) for p in perms))
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("scope, whole", [("read", False), ("write", False), ("admin", True)])
def test_the_api_shows_a_webhook_url_whole_to_admin_scope_only(api_as, scope, whole):
    WebhookConsumerFactory(name="hook", url=URL)
    api = api_as(scope)
    one = api.get("outbox/consumers/hook").json()
    [listed] = api.get("outbox/consumers").json()["items"]
    assert one["url"] == listed["url"] == (URL if whole else SHOWN)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "group, perms, whole",
    [("Viewers", (), False), ("Operators", (), False), (None, ("view_consumer", "change_consumer"), True)],
)
def test_a_staff_session_sees_a_webhook_url_whole_only_if_it_may_change_consumers(
    client, group, perms, whole
):
    WebhookConsumerFactory(name="hook", url=URL)
    staff(client, *perms, group=group)
    one = client.get("/vault/api/v1/outbox/consumers/hook")
    listed = client.get("/vault/api/v1/outbox/consumers")
    assert one.status_code == listed.status_code == 200
    assert one.json()["url"] == listed.json()["items"][0]["url"] == (URL if whole else SHOWN)


@pytest.mark.django_db
def test_an_operator_pausing_through_the_api_gets_the_url_redacted(client):
    WebhookConsumerFactory(name="hook", url=URL)
    staff(client, group="Operators")
    answer = client.post(
        "/vault/api/v1/outbox/consumers/hook/pause",
        {"reason": "maintenance"},
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["url"] == SHOWN


@pytest.mark.django_db
def test_the_command_lines_json_shows_the_url_whole():
    # Whoever runs `odal` holds the database (and its DATABASE_URL): nothing to hide from them.
    assert consumer_json(WebhookConsumerFactory(url=URL))["url"] == URL


# -- the audit trail ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_audit_trail_keeps_no_credentials_of_a_webhook_url(admin_api):
    made = admin_api.post("outbox/consumers", {"name": "hook", "url": URL})
    assert made.status_code == 201, made.content
    assert made.json()["url"] == URL  # (admin scope: whole)
    other = URL.replace(TOKEN, TOKEN + "-2")
    changed = admin_api.patch("outbox/consumers/hook", {"url": other, "reason": "new token"})
    assert changed.status_code == 200, changed.content
    assert Consumer.objects.get().url == other  # the sweep calls the whole URL
    removed = admin_api.delete("outbox/consumers/hook", {"reason": "gone"})
    assert removed.status_code == 200, removed.content

    entries = {e.action: e.details for e in AuditEntry.objects.filter(object_type="outbox.consumer")}
    assert set(entries) == {"consumer_created", "consumer_changed", "consumer_removed"}
    assert entries["consumer_created"]["url"] == SHOWN
    # Only the token changed: both read the same, and the entry says the credentials changed.
    assert entries["consumer_changed"]["url"] == {"was": SHOWN, "now": SHOWN, "credentialsChanged": True}
    assert entries["consumer_removed"]["url"] == SHOWN
    for details in entries.values():
        assert_hidden(details)


# -- the admin -----------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("group", ["Viewers", "Operators"])
def test_the_admin_hides_the_credentials_from_staff_who_may_not_change_consumers(client, group):
    consumer = WebhookConsumerFactory(name="hook", url=URL)
    staff(client, group=group)
    listed = client.get("/admin/outbox/consumer/")
    page = client.get(f"/admin/outbox/consumer/{consumer.pk}/change/")
    assert listed.status_code == page.status_code == 200
    assert "http://***@127.0.0.1:9/hook?token=***" in listed.content.decode()
    assert "http://***@127.0.0.1:9/hook?token=***" in page.content.decode()
    assert_hidden(listed.content.decode())
    assert_hidden(page.content.decode())


@pytest.mark.django_db
def test_a_viewer_cannot_spell_the_secret_out_by_searching(client):
    WebhookConsumerFactory(name="hook", url=URL)
    staff(client, group="Viewers")
    found = client.get("/admin/outbox/consumer/", {"q": TOKEN[:8]})
    assert found.status_code == 200 and found.context["cl"].result_count == 0
    assert client.get("/admin/outbox/consumer/", {"q": "hook"}).context["cl"].result_count == 1


@pytest.mark.django_db
def test_the_admin_shows_the_url_whole_to_who_may_change_consumers(admin_client):
    consumer = WebhookConsumerFactory(name="hook", url=URL)
    page = admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    assert f'value="{URL}"' in page.replace("&amp;", "&")
    assert URL in admin_client.get("/admin/outbox/consumer/").content.decode().replace("&amp;", "&")


# -- the attempt log and the logs ------------------------------------------------------------------


@pytest.mark.django_db
def test_the_attempt_log_keeps_no_credential_a_redirect_or_an_answer_quotes(settings, caplog):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    # A server that adds a trailing slash answers with the request's own query: the token.
    moved = Answer(
        301,
        f"Moved to /hook/?token={TOKEN} for alice:{PASSWORD}".encode(),
        [("location", f"/hook/?token={TOKEN}&v=2")],
    )
    with WebhookServer([moved]) as server, caplog.at_level(logging.WARNING, logger="outbox"):
        url = server.url.replace("http://", f"http://alice:{PASSWORD}@") + f"?token={TOKEN}"
        WebhookConsumerFactory(url=url, timeout_seconds=1)
        emit("passport.published", {"n": 1})
        assert sweep_once().failed == 1
        assert server.received  # the whole URL was called: its credentials were sent
        basic = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
        assert server.received[0].headers["authorization"] == basic  # (as HTTP Basic, as httpx sent them)
    delivery = Delivery.objects.get()
    line = delivery.attempt_log.get()
    assert line.error == "HTTP 301 redirect to /hook/?token=***&v=2 (not followed)"
    assert_hidden(line.error)
    assert_hidden(line.answer)
    assert_hidden(delivery.last_error)
    assert "failed: HTTP 301 redirect" in caplog.text
    assert_hidden(caplog.text)


def test_every_line_of_the_log_has_its_urls_redacted():
    record = logging.LogRecord("outbox.sweep", logging.WARNING, __file__, 1, "calling %s", (URL,), None)
    try:
        raise ValueError(f"no route to {URL}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactUrls().filter(record) is True
    plain = logging.Formatter("%(message)s").format(record)
    assert f"calling {SHOWN}" in plain and "no route to" in plain
    assert_hidden(plain)
    assert_hidden(JsonFormatter().format(record))


def test_the_console_handler_redacts():
    # The handler odal's settings give its loggers (LOGGING), as a process writes through it.
    [handler] = logging.getLogger("outbox").handlers
    record = logging.LogRecord("outbox.sweep", logging.WARNING, __file__, 1, "calling %s", (URL,), None)
    assert handler.filter(record)
    assert f"calling {SHOWN}" in handler.format(record)
    assert_hidden(handler.format(record))


@pytest.mark.django_db
def test_an_audit_entry_written_before_redaction_is_shown_redacted(client):
    # The trail is append-only: an entry from before this release keeps the URL it was written with.
    consumer = WebhookConsumerFactory(name="hook", url=URL)
    entry = AuditEntry.objects.record(
        actor="token:ops", action="consumer_created", obj=consumer, details={"kind": "webhook", "url": URL}
    )
    staff(client, group="Viewers")
    page = client.get(f"/admin/odal/auditentry/{entry.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode().replace("&quot;", '"')
    assert SHOWN.replace("&", "&amp;") in text
    assert_hidden(text)


@pytest.mark.django_db
def test_staff_who_may_add_but_not_change_consumers_can_still_type_a_url(client):
    staff(client, "view_consumer", "add_consumer")
    page = client.get("/admin/outbox/consumer/add/").content.decode()
    assert 'name="url"' in page


def test_an_answer_echoing_the_requests_basic_authorization_has_it_hidden():
    """The URL's userinfo goes out as HTTP Basic (base64 of user:password): an answer that
    echoes the request's headers quotes it in that form, not as the password itself."""
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert (
        without_secrets_of(URL, f"you sent authorization: Basic {basic}")
        == "you sent authorization: Basic ***"
    )


# -- credentials in other spellings (issue 37) -----------------------------------------------------
# The client sends `alice%3APASSWORD` as Basic `alice:PASSWORD:`, and a user name alone may be an API
# key (`sk_live_…`): the whole userinfo is a credential. A path parameter (`;token=…`) is a query
# value by another name.


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://alice%3APASSWORD@hooks.example/x", "http://***@hooks.example/x"),
        ("http://alice%3aPASSWORD@hooks.example/x", "http://***@hooks.example/x"),
        ("https://sk_live_51HxKEY@hooks.example/x", "https://***@hooks.example/x"),
        ("https://:PASSWORD@hooks.example/", "https://***@hooks.example/"),
        ("https://alice:PASS%40WORD@hooks.example/", "https://***@hooks.example/"),
        ("https://alice:PASS@WORD@hooks.example/", "https://***@hooks.example/"),  # a raw @ in it
        ("http://alice:PASSWORD@[2001:db8::1]:8443/x", "http://***@[2001:db8::1]:8443/x"),
        ("HTTP://alice:PASSWORD@Hooks.Example/x", "http://***@Hooks.Example/x"),
        (
            "https://hooks.example/a;token=SECRET;v=2/b;key=SECRET/c;SECRET?q=1",
            "https://hooks.example/a;token=***;v=***/b;key=***/c;***?q=***",
        ),
        ("https://alice%3APASSWORD@[::1/x;token=SECRET", "***"),  # cannot be read: hidden whole
    ],
)
def test_redacted_url_hides_the_whole_userinfo_and_every_path_parameter(url, shown):
    assert redacted_url(url) == shown
    assert redacted_urls_in(f"calling {url} failed") == f"calling {shown} failed"


# Spellings a consumer can be made with (`{host}`: where it listens), and what each must never show.
SPELLINGS = {
    "percent-encoded colon": ("http://alice%3APASSWORD-37@{host}/hook", ["PASSWORD-37"]),
    "lower-case %3a": ("http://alice%3aPASSWORD-37@{host}/hook", ["PASSWORD-37"]),
    "an API key as the user": ("http://sk_live_KEY37abcdef@{host}/hook", ["sk_live_KEY37abcdef"]),
    "empty user": ("http://:PASSWORD-37@{host}/hook", ["PASSWORD-37"]),
    "@ percent-encoded in the password": (
        "http://alice:PASS%40WORD-37@{host}/hook",
        ["PASS%40WORD-37", "PASS@WORD-37"],
    ),
    "upper-case scheme": ("HTTP://alice:PASSWORD-37@{host}/hook", ["PASSWORD-37"]),
    "path parameters": (
        "http://{host}/a;token=SECRET-37;v=22/b;key=KEY-37-abc;x=y/hook",
        ["SECRET-37", "KEY-37-abc"],
    ),
}
STORED = {**SPELLINGS, "IPv6 host": ("http://alice:PASSWORD-37@[::1]:9/hook", ["PASSWORD-37"])}


def stored(spelling: str) -> tuple[str, list[str]]:
    url, secrets = STORED[spelling]
    return url.format(host="127.0.0.1:9"), secrets


def assert_none_of(secrets: list[str], text) -> None:
    text = str(text)
    for secret in secrets:
        assert secret not in text, (secret, text)


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", STORED)
def test_read_and_write_scope_and_viewers_see_no_credential_in_any_spelling(api_as, client, spelling):
    url, secrets = stored(spelling)
    WebhookConsumerFactory(name="hook", url=url)
    staff(client, group="Viewers")
    for get in (api_as("read").get, api_as("write").get):
        one, listed = get("outbox/consumers/hook"), get("outbox/consumers")
        assert one.status_code == listed.status_code == 200
        assert one.json()["url"] == listed.json()["items"][0]["url"] == redacted_url(url)
        assert_none_of(secrets, one.content.decode() + listed.content.decode())
    for path in ("/vault/api/v1/outbox/consumers/hook", "/vault/api/v1/outbox/consumers"):
        answer = client.get(path)
        assert answer.status_code == 200 and "***" in answer.content.decode()
        assert_none_of(secrets, answer.content.decode())
    assert api_as("admin").get("outbox/consumers/hook").json()["url"] == url  # (admin scope: whole)


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", STORED)
def test_the_admin_shows_viewers_no_credential_in_any_spelling(client, spelling):
    url, secrets = stored(spelling)
    consumer = WebhookConsumerFactory(name="hook", url=url)
    staff(client, group="Viewers")
    listed = client.get("/admin/outbox/consumer/")
    page = client.get(f"/admin/outbox/consumer/{consumer.pk}/change/")
    assert listed.status_code == page.status_code == 200
    shown = redacted_url(url).replace("&", "&amp;")
    assert shown in listed.content.decode() and shown in page.content.decode()
    assert_none_of(secrets, listed.content.decode() + page.content.decode())


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", STORED)
def test_the_audit_trail_keeps_no_credential_in_any_spelling(admin_api, client, spelling):
    url, secrets = stored(spelling)
    made = admin_api.post("outbox/consumers", {"name": "hook", "url": url})
    assert made.status_code == 201, made.content
    other = url.replace("37", "38")
    changed = admin_api.patch("outbox/consumers/hook", {"url": other, "reason": "new credential"})
    assert changed.status_code == 200, changed.content
    assert admin_api.delete("outbox/consumers/hook", {"reason": "gone"}).status_code == 200
    entries = {e.action: e.details for e in AuditEntry.objects.filter(object_type="outbox.consumer")}
    assert set(entries) == {"consumer_created", "consumer_changed", "consumer_removed"}
    assert entries["consumer_created"]["url"] == redacted_url(url)
    assert entries["consumer_changed"]["url"]["credentialsChanged"] is True  # both read the same
    for details in entries.values():
        assert_none_of([*secrets, *(s.replace("37", "38") for s in secrets)], details)
    # An entry from before this release, holding the URL whole, is read redacted by a Viewer.
    old = AuditEntry.objects.record(
        actor="token:ops", action="consumer_created", obj=None, details={"kind": "webhook", "url": url}
    )
    staff(client, group="Viewers")
    page = client.get(f"/admin/odal/auditentry/{old.pk}/change/")
    assert page.status_code == 200
    assert_none_of(secrets, page.content.decode())


@pytest.mark.parametrize("spelling", STORED)
def test_every_log_line_hides_the_credential_in_any_spelling(spelling):
    url, secrets = stored(spelling)
    [handler] = logging.getLogger("outbox").handlers
    record = logging.LogRecord("outbox.sweep", logging.WARNING, __file__, 1, "calling %s", (url,), None)
    try:
        raise ValueError(f"no route to {url}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert handler.filter(record)
    line = handler.format(record)
    assert f"calling {redacted_url(url)}" in line and "no route to" in line
    assert_none_of(secrets, line)
    assert_none_of(secrets, JsonFormatter().format(record))


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_an_attempt_and_the_command_line_reading_it_quote_no_credential_in_any_spelling(
    settings, caplog, spelling
):
    """A real webhook redirecting to its own whole URL, with a body echoing the request's Basic
    authorization and the URL: the attempt log, lastError, the log line and `odal outbox show`
    quote none of its credentials."""
    import httpx
    from django.core.management import call_command

    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    template, secrets = SPELLINGS[spelling]
    with WebhookServer() as server:
        url = template.format(host=server.url.removeprefix("http://").removesuffix("/hooks"))
        parsed = httpx.URL(url)
        basic = base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode()
        secrets = [*secrets, basic] if parsed.userinfo else secrets
        server.script = [Answer(301, f"you sent Basic {basic} to {url}".encode(), [("location", url)])]
        WebhookConsumerFactory(url=url, timeout_seconds=1)
        emit("passport.published", {"n": 1})
        with caplog.at_level(logging.WARNING, logger="outbox"):
            assert sweep_once().failed == 1
        assert server.received  # the whole URL was called
        if parsed.userinfo:
            assert server.received[0].headers["authorization"] == f"Basic {basic}"
    delivery = Delivery.objects.get()
    line = delivery.attempt_log.get()
    assert line.error.startswith("HTTP 301 redirect to ")
    shown = io.StringIO()
    call_command("outbox", "show", str(delivery.pk), stdout=shown, stderr=io.StringIO())
    assert "HTTP 301 redirect" in shown.getvalue()
    for text in (line.error, line.answer, delivery.last_error, caplog.text, shown.getvalue()):
        assert_none_of(secrets, text)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_an_echo_of_any_credential_is_hidden(spelling):
    url, secrets = stored(spelling)
    echo = " ".join(secrets) + " and " + " ".join(urllib.parse.unquote(s) for s in secrets)
    assert_none_of(secrets, without_secrets_of(url, echo))
