"""Issue 17.1: one set of input rules on every surface. Each rule's bad values go through the API,
the admin's forms and the `odal` command line, and each surface refuses them alike: 422 (code
invalid_request or the rule's own), a form error on the field, or a CommandError that exits 2 (a
malformed value) or 1 (a refusal, as a bad reason is in CONTRACT.md) — with nothing written and
never a traceback."""

import base64
import io
import json
import socket
import uuid

import pytest
from django.contrib.admin import helpers
from django.core.management import call_command
from django.core.management.base import CommandError
from django_otp.plugins.otp_totp.models import TOTPDevice

from odal.core.models import ApiToken, AuditEntry, Passport
from outbox.models import Consumer, Delivery, Event
from registry.models import Registration
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    PassportFactory,
    UserFactory,
    backed_off_registration,
)

pytestmark = pytest.mark.django_db

UPI = "https://id.example.eu/01/09506000134352/21/RULES-1"
PYTHON_TARGET = "tests.consumers.accept"

# Every rule's bad values. A value is refused by every surface that takes it.
BAD = {
    "consumer name": ["bad name with spaces", "", "x" * 300, "café", "tab\there"],
    "attempt budget": [0, -1, 1001, 99_999_999_999],
    "timeout": [0, 61, 2_147_483_647, 99_999_999_999],
    "event pattern": ["passport.published\n", "Bad Type", "passport.**", "p" * 101],
    "event type": ["zz.test\n", "Zz.test", "zz..test", "z" * 101],
    "upi": ["http://id.example.eu/01/1", "ftp://id.example.eu/01/1", "https://id.example.eu/" + "x" * 2000],
    "operator id": ["   ", "x" * 300, "OP\x01"],
    "facility id": ["x" * 300, "FAC\x1b[31m"],
    "commodity code": ["x" * 51, "8507\n60"],
    "token name": ["", "x" * 101, "ci\x07"],
    "reason": ["", "  ", "two\nlines", "x" * 600],
    "time": ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "yesterday"],
    "id": ["42", "not-a-uuid"],
    "actor": ["x" * 300, "ops\nroot", "\x1b[2J"],
    "batch size": ["-1", "0", "10001", "many"],
    "port": ["99999", "-1", "http"],
}


@pytest.fixture
def world():
    """What the surfaces act on: a draft passport, a dead delivery, a live token, a registration
    the registry is checking."""
    return {
        "passport": PassportFactory(),
        "dead": DeadDeliveryFactory(),
        "token": ApiToken.objects.issue(name="ci", scope="read")[0],
        "submitted": backed_off_registration(status="submitted", correlation_id="req-1"),
    }


def enrolled_user() -> str:
    """A user with an authenticator (for `odal user reset-2fa`): a reset taken would be audited."""
    user = UserFactory()
    TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)
    return user.username


def state() -> tuple:
    """Everything a refused input must leave as it was."""
    return (
        sorted(Consumer.objects.values_list("name", "max_attempts", "timeout_seconds")),
        sorted(Passport.objects.values_list("upi", "status")),
        sorted(ApiToken.objects.values_list("name", "revoked_at")),
        sorted(Delivery.objects.values_list("status", "attempts")),
        sorted(Registration.objects.values_list("status", "handle")),
        AuditEntry.objects.count(),
        Event.objects.count(),
    )


# -- the API ------------------------------------------------------------------------------------


def consumer_body(**fields):
    return {"name": "billing", "kind": "python", "target": PYTHON_TARGET, **fields}


def passport_body(**fields):
    return {"upi": UPI, "operatorId": "OP-1", **fields}


API = {
    "consumer name": lambda api, w, v: api.post("outbox/consumers", consumer_body(name=v)),
    "attempt budget": lambda api, w, v: api.post("outbox/consumers", consumer_body(maxAttempts=v)),
    "timeout": lambda api, w, v: api.post("outbox/consumers", consumer_body(timeoutSeconds=v)),
    "event pattern": lambda api, w, v: api.post("outbox/consumers", consumer_body(eventTypes=[v])),
    "event type": lambda api, w, v: api.post("events", {"type": v, "payload": {}}),
    "upi": lambda api, w, v: api.post("dpp", passport_body(upi=v)),
    "operator id": lambda api, w, v: api.post("dpp", passport_body(operatorId=v)),
    "facility id": lambda api, w, v: api.post("dpp", passport_body(facilityId=v)),
    "commodity code": lambda api, w, v: api.post("dpp", passport_body(commodityCode=v)),
    "reason": lambda api, w, v: api.post(f"outbox/deliveries/{w['dead'].pk}/replay", {"reason": v}),
    "time": lambda api, w, v: api.post("outbox/replay", {"reason": "r", "deadSince": v}),
    "id": lambda api, w, v: api.post(f"dpp/{v}/publish"),
}
API_CODES = {
    "event pattern": {"invalid_event_type"},
    "event type": {"invalid_event_type"},
    "reason": {"invalid_reason"},
}


# -- the admin ----------------------------------------------------------------------------------


def consumer_form(**fields):
    return {
        "name": "billing", "kind": "python", "url": "", "target": PYTHON_TARGET, "event_types": "[]",
        "max_attempts": "3", "timeout_seconds": "5", **fields,
    }  # fmt: skip


def passport_form(**fields):
    return {
        "upi": UPI,
        "operator_id": "OP-1",
        "facility_id": "",
        "commodity_code": "",
        "data": "{}",
        **fields,
    }


def add_consumer(client, w, field, value):
    return client.post("/admin/outbox/consumer/add/", consumer_form(**{field: value})), field


def add_passport(client, w, field, value):
    return client.post("/admin/odal/passport/add/", passport_form(**{field: value})), field


def replay_with_reason(client, w, value):
    data = {"action": "replay_selected", helpers.ACTION_CHECKBOX_NAME: [str(w["dead"].pk)], "post": "yes"}
    return client.post("/admin/outbox/delivery/", {**data, "reason": value}), "reason"


ADMIN = {
    "consumer name": lambda c, w, v: add_consumer(c, w, "name", v),
    "attempt budget": lambda c, w, v: add_consumer(c, w, "max_attempts", str(v)),
    "timeout": lambda c, w, v: add_consumer(c, w, "timeout_seconds", str(v)),
    "event pattern": lambda c, w, v: add_consumer(c, w, "event_types", json.dumps([v])),
    "upi": lambda c, w, v: add_passport(c, w, "upi", v),
    "operator id": lambda c, w, v: add_passport(c, w, "operator_id", v),
    "facility id": lambda c, w, v: add_passport(c, w, "facility_id", v),
    "commodity code": lambda c, w, v: add_passport(c, w, "commodity_code", v),
    "token name": lambda c, w, v: (c.post("/admin/odal/apitoken/add/", {"name": v, "scope": "read"}), "name"),
    "reason": replay_with_reason,
}


# -- the command line ---------------------------------------------------------------------------

ADD = ("outbox", "consumer", "add", "billing", "--target", PYTHON_TARGET)
CREATE = ("passport", "create", "--upi", UPI, "--operator", "OP-1")
CLI = {
    "consumer name": [lambda w, v: ("outbox", "consumer", "add", v, "--target", PYTHON_TARGET)],
    "attempt budget": [lambda w, v: (*ADD, "--max-attempts", str(v))],
    "timeout": [lambda w, v: (*ADD, "--timeout", str(v))],
    "event pattern": [lambda w, v: (*ADD, "--events", v)],
    "upi": [lambda w, v: ("passport", "create", "--upi", v, "--operator", "OP-1")],
    "operator id": [lambda w, v: ("passport", "create", "--upi", UPI, "--operator", v)],
    "facility id": [lambda w, v: (*CREATE, "--facility", v)],
    "commodity code": [lambda w, v: (*CREATE, "--commodity", v)],
    "token name": [lambda w, v: ("token", "create", "--name", v, "--scope", "read")],
    "reason": [
        lambda w, v: ("outbox", "replay", str(w["dead"].pk), "--reason", v),
        lambda w, v: ("registry", "handle", str(w["submitted"].passport_id), "reg-1", "--reason", v),
        lambda w, v: ("user", "reset-2fa", enrolled_user(), "--reason", v),
    ],
    "time": [lambda w, v: ("outbox", "replay", "--dead", "--since", v, "--reason", "r")],
    "id": [
        lambda w, v: ("passport", "publish", v),
        lambda w, v: ("outbox", "replay", v, "--reason", "r"),
        lambda w, v: ("registry", "abandon", v, "--reason", "r"),
    ],
    "actor": [
        lambda w, v: ("passport", "publish", str(w["passport"].pk), "--actor", v),
        lambda w, v: ("outbox", "replay", str(w["dead"].pk), "--reason", "r", "--actor", v),
        lambda w, v: (
            "registry",
            "handle",
            str(w["submitted"].passport_id),
            "reg-1",
            "--reason",
            "r",
            "--actor",
            v,
        ),
        lambda w, v: ("token", "revoke", w["token"].prefix, "--actor", v),
        lambda w, v: ("user", "reset-2fa", enrolled_user(), "--reason", "r", "--actor", v),
    ],  # fmt: skip
    "batch size": [
        lambda w, v: ("outbox", "sweep", "--once", "--batch", v),
        lambda w, v: ("registry", "drain", "--once", "--batch", v),
    ],
    "port": [
        lambda w, v: ("registry", "simulate", "--port", v),
        lambda w, v: ("outbox", "receive", "--port", v),
    ],
}
CLI_EXIT = {"reason": 1}  # a bad reason is a refusal (CONTRACT.md: 422, exit 1); the rest are usage


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "…"


def cases(table: dict, multi: bool = False) -> list:
    return list(_cases(table, multi))


def _cases(table: dict, multi: bool):
    for rule, values in BAD.items():
        if rule not in table:
            continue
        for index, value in enumerate(values):
            ways = table[rule] if multi else [table[rule]]
            for way, surface in enumerate(ways):
                yield pytest.param(
                    rule, value, surface, id=f"{rule.replace(' ', '_')}{index}-{way} {shown(value)}"
                )


def run(*argv):
    call_command(*argv, stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("rule, value, surface", cases(API))
def test_the_api_refuses_what_the_rule_refuses(admin_api, world, rule, value, surface):
    before = state()
    response = surface(admin_api, world, value)
    assert response.status_code == 422, response.content[:300]
    body = response.json()
    assert body["code"] in {"invalid_request", *API_CODES.get(rule, ())}, body
    assert body["detail"].endswith("."), body
    assert state() == before


@pytest.mark.parametrize("rule, value, surface", cases(ADMIN))
def test_the_admin_forms_refuse_what_the_rule_refuses(admin_client, world, rule, value, surface):
    before = state()
    response, field = surface(admin_client, world, value)
    assert response.status_code == 200, "the form was accepted"
    form = response.context["adminform"].form if "adminform" in response.context else response.context["form"]
    assert form.errors.get(field), f"no error on {field}: {form.errors!r}"
    assert state() == before


@pytest.mark.parametrize("rule, value, surface", cases(CLI, multi=True))
def test_the_command_line_refuses_what_the_rule_refuses(world, rule, value, surface):
    before = state()
    with pytest.raises(CommandError) as refused:
        run(*surface(world, value))
    assert refused.value.returncode == CLI_EXIT.get(rule, 2), str(refused.value)
    message = str(refused.value)
    assert len(message.split()) >= 3 and "Traceback" not in message, message
    assert state() == before


def test_every_rule_is_refused_on_every_surface_that_takes_it():
    """The table names every rule once, and every surface a rule reaches."""
    assert set(API) | set(ADMIN) | set(CLI) == set(BAD)
    both = {"consumer name", "attempt budget", "timeout", "event pattern", "upi", "operator id", "reason"}
    assert both <= set(API) & set(ADMIN) & set(CLI)


# -- values at the bounds pass everywhere --------------------------------------------------------


@pytest.mark.parametrize("surface", ["api", "admin", "cli"])
def test_values_at_the_bounds_are_accepted_on_every_surface(admin_api, admin_client, surface):
    name, attempts, timeout, pattern = "A-" + "z" * 98, 1000, 60, "passport.published"
    if surface == "api":
        response = admin_api.post(
            "outbox/consumers",
            consumer_body(name=name, maxAttempts=attempts, timeoutSeconds=timeout, eventTypes=[pattern]),
        )
        assert response.status_code == 201, response.content
    elif surface == "admin":
        fields = {
            "name": name,
            "max_attempts": attempts,
            "timeout_seconds": timeout,
            "event_types": f'["{pattern}"]',
        }
        response = admin_client.post("/admin/outbox/consumer/add/", consumer_form(**fields))
        assert response.status_code == 200, response.context["adminform"].form.errors
        assert b"Signing secret of" in response.content  # the page that shows it once
    else:
        run("outbox", "consumer", "add", name, "--target", PYTHON_TARGET, "--max-attempts", "1000",
            "--timeout", "60", "--events", pattern)  # fmt: skip
    consumer = Consumer.objects.get()
    assert (consumer.name, consumer.max_attempts, consumer.timeout_seconds) == (name, attempts, timeout)
    assert consumer.event_types == [pattern]


def test_the_smallest_budget_and_timeout_are_accepted():
    run(*ADD, "--max-attempts", "1", "--timeout", "1")
    assert Consumer.objects.filter(max_attempts=1, timeout_seconds=1).exists()


# -- the observations of the issue, one by one ---------------------------------------------------


def test_an_event_type_ending_in_a_newline_is_not_an_event_type(admin_api):
    response = admin_api.post("events", {"type": "zz.test\n", "payload": {}})
    assert response.status_code == 422 and response.json()["code"] == "invalid_event_type"
    assert not Event.objects.exists()


@pytest.mark.parametrize("surface", ["api", "admin", "cli"])
def test_a_consumer_subscribed_to_a_type_with_a_final_newline_is_refused(admin_api, admin_client, surface):
    if surface == "api":
        response = admin_api.post("outbox/consumers", consumer_body(eventTypes=["passport.published\n"]))
        assert response.status_code == 422
    elif surface == "admin":
        response = admin_client.post(
            "/admin/outbox/consumer/add/", consumer_form(event_types='["passport.published\\n"]')
        )
        assert response.context["adminform"].form.errors["event_types"]
    else:
        with pytest.raises(CommandError) as usage:
            run(*ADD, "--events", "passport.*,passport.published\n")
        assert usage.value.returncode == 2
    assert not Consumer.objects.exists()


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_a_cursor_whose_time_overflows_in_utc_is_refused(admin_api, moment):
    cursor = base64.urlsafe_b64encode(f"{moment}|{uuid.uuid4()}".encode()).decode()
    response = admin_api.get("outbox/deliveries", cursor=cursor)
    assert response.status_code == 422 and response.json()["code"] == "invalid_cursor"


def test_the_admin_consumer_form_refuses_what_the_issue_found(admin_client):
    for field, value in [("max_attempts", "0"), ("timeout_seconds", "2147483647")]:
        response = admin_client.post("/admin/outbox/consumer/add/", consumer_form(**{field: value}))
        assert response.context["adminform"].form.errors[field]
    assert not Consumer.objects.exists()


def test_a_duplicate_consumer_name_is_a_refusal_not_a_usage_error():
    ConsumerFactory(name="billing")
    with pytest.raises(CommandError, match="already exists") as refused:
        run(*ADD)
    assert refused.value.returncode == 1


def test_the_simulator_on_a_busy_port_says_so():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandError, match=f"port {port}") as refused:
            run("registry", "simulate", "--port", str(port))
    assert refused.value.returncode == 1


def test_the_demo_receiver_on_a_busy_port_says_so():
    ConsumerFactory(name="demo-receiver")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandError, match=f"port {port}") as refused:
            run("outbox", "receive", "--port", str(port))
    assert refused.value.returncode == 1


@pytest.mark.parametrize(
    "addr", ["nonsense", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:http", "bad host:8000"]
)
def test_up_refuses_a_malformed_address_before_starting_anything(monkeypatch, addr):
    import subprocess

    def no_process(*args, **kwargs):
        raise AssertionError(f"odal up started {args[0]!r} on a malformed address")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(CommandError, match="--addr") as usage:
        run("up", "--addr", addr)
    assert usage.value.returncode == 2


# -- the rules themselves ------------------------------------------------------------------------


def test_the_lengths_are_the_columns_the_values_are_stored_in():
    from odal.core import rules

    column = {
        rules.CONSUMER_NAME_LENGTH: Consumer._meta.get_field("name"),
        rules.PYTHON_TARGET_LENGTH: Consumer._meta.get_field("target"),
        rules.EVENT_TYPE_LENGTH: Event._meta.get_field("type"),
        rules.OPERATOR_ID_LENGTH: Passport._meta.get_field("operator_id"),
        rules.FACILITY_ID_LENGTH: Passport._meta.get_field("facility_id"),
        rules.COMMODITY_CODE_LENGTH: Passport._meta.get_field("commodity_code"),
        rules.TOKEN_NAME_LENGTH: ApiToken._meta.get_field("name"),
    }
    for length, field in column.items():
        assert length == field.max_length, field
    assert len("cli:") + rules.ACTOR_LENGTH <= AuditEntry._meta.get_field("actor").max_length


@pytest.mark.parametrize("value", ["zz.test\n", "passport.published\n", "\npassport.published"])
def test_a_newline_is_never_part_of_an_event_type(value):
    from odal.core import rules
    from odal.core.errors import Refused
    from outbox.events import check_event_pattern, check_event_type

    for check in (rules.event_type, rules.event_pattern):
        with pytest.raises(ValueError):
            check(value)
    for check in (check_event_type, check_event_pattern):
        with pytest.raises(Refused):
            check(value)


def test_the_older_names_still_check_with_the_rules():
    from odal.core.cli import parse_uuid
    from odal.core.errors import Refused
    from odal.core.reasons import MAX_REASON_LENGTH, clean_reason
    from odal.core.schemas import check_text, check_upi

    assert check_upi("HTTPS://ID.example.eu:443/01/1") == "https://id.example.eu/01/1"
    assert check_text(" OP ", max_length=5, required=True) == "OP"
    with pytest.raises(ValueError, match="control characters"):
        check_text("a\x1bb", max_length=5, required=True)
    assert clean_reason(" fixed ") == "fixed" and MAX_REASON_LENGTH == 500
    with pytest.raises(Refused, match="A reason is required"):
        clean_reason(" ")
    with pytest.raises(CommandError, match=r"is not a delivery id \(a UUID\)") as usage:
        parse_uuid("42", "delivery id")
    assert usage.value.returncode == 2


@pytest.mark.parametrize(
    "value, rate", [("100/s", 100), ("100", 100), (" 5 / s ", 5), ("1000000/s", 1_000_000)]
)
def test_a_rate_per_second_is_n_per_s(value, rate):
    from odal.core import rules

    assert rules.rate_per_second(value) == rate


@pytest.mark.parametrize("value", ["0/s", "-1/s", "1e3/s", "100/m", "100/", "/s", "fast", "1000001/s", 100])
def test_a_rate_per_second_refuses_what_is_not_one(value):
    from odal.core import rules

    with pytest.raises(ValueError, match="must be a rate such as 100/s"):
        rules.rate_per_second(value)
