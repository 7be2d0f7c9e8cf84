"""ODAL_LOG_FORMAT=json: one JSON object per line, carrying the ids of the delivery or
registration it is about, whatever text the message holds; the sweep and the drain log every
failed attempt and every late outcome that way."""

import copy
import io
import json
import logging
import logging.config
import os
import socket
import subprocess
import sys
import uuid
from datetime import datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from odal.core.logs import JsonFormatter
from outbox import consumers
from outbox.events import emit
from outbox.models import Delivery, DeliveryAttempt
from outbox.sweep import Finished, finish_attempts, sweep_once
from registry.drain import Attempt, DrainReport, drain_once
from registry.models import Registration, RegistrationAttempt
from tests.factories import DeliveryFactory, RegistrationFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer


@pytest.fixture
def json_log():
    """odal's LOGGING with the console handler in json format and writing to a buffer; returns a
    function giving the lines written so far, each parsed. Restores the settings' logging after."""
    buffer = io.StringIO()
    config = copy.deepcopy(django_settings.LOGGING)
    config["handlers"]["console"].update(formatter="json", stream=buffer)
    logging.config.dictConfig(config)

    def lines() -> list[dict]:
        return [json.loads(line) for line in buffer.getvalue().splitlines()]

    yield lines
    logging.config.dictConfig(django_settings.LOGGING)


def the_line(lines: list[dict], logger: str, containing: str) -> dict:
    found = [line for line in lines if line["logger"] == logger and containing in line["message"]]
    assert len(found) == 1, lines
    return found[0]


@pytest.fixture
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0


@pytest.mark.django_db
@pytest.mark.usefixtures("_no_backoff")
def test_a_failed_webhook_attempt_is_a_json_line_with_its_ids(json_log):
    with WebhookServer(script=[500]) as server:
        WebhookConsumerFactory(url=server.url, name="billing", max_attempts=3)
        event, _ = emit("passport.published", {"dppId": "abc"})
        assert sweep_once().failed == 1
    delivery = Delivery.objects.get()
    claim = DeliveryAttempt.objects.get().claim_token

    line = the_line(json_log(), "outbox.sweep", "failed")
    assert line["level"] == "WARNING"
    assert {k: line[k] for k in ("delivery", "consumer", "claim", "attempt", "event")} == {
        "delivery": str(delivery.pk),
        "consumer": "billing",
        "claim": str(claim),
        "attempt": 1,
        "event": str(event.pk),
    }
    assert "HTTP 500: upstream exploded" in line["message"]
    assert datetime.fromisoformat(line["time"]).utcoffset() == timedelta(0)
    assert abs(datetime.fromisoformat(line["time"]) - timezone.now()) < timedelta(minutes=1)


@pytest.mark.django_db
def test_a_late_delivery_outcome_is_a_json_line_with_its_ids(json_log):
    DeliveryFactory()
    first = Delivery.objects.claim(limit=1, select_related=("event",))
    Delivery.objects.update(next_attempt_at=timezone.now())  # the hold ran out: due again
    second = Delivery.objects.claim(limit=1, select_related=("event",))
    assert second.rows and second.token != first.token
    stale = first.rows[0]
    now = timezone.now()

    settled = finish_attempts(first.token, [Finished(stale, consumers.Outcome(True), now, now)])

    assert settled.taken == set()
    line = the_line(json_log(), "outbox.sweep", "late")
    assert line["level"] == "WARNING"
    assert (line["delivery"], line["claim"], line["attempt"], line["event"]) == (
        str(stale.pk),
        str(first.token),
        1,
        str(stale.event_id),
    )


@pytest.mark.django_db
def test_a_failed_registry_attempt_is_a_json_line_with_its_ids(json_log):
    reg = RegistrationFactory()  # the registry is a closed port here (conftest): the attempt fails
    assert drain_once().failed == 1
    claim = RegistrationAttempt.objects.get().claim_token

    line = the_line(json_log(), "registry.drain", "failed")
    assert line["level"] == "WARNING"
    assert (line["registration"], line["claim"], line["attempt"]) == (str(reg.pk), str(claim), 1)
    assert "connection" in line["message"].lower()


@pytest.mark.django_db
def test_a_late_registry_answer_is_a_json_line_with_its_ids(json_log):
    RegistrationFactory()
    stale = Registration.objects.claim(limit=1, select_related=("passport",))
    token = uuid.uuid4()  # a claim that no longer holds the row

    Attempt(stale.rows[0], token, DrainReport()).failed("register", "registry answered HTTP 503")

    lines = json_log()
    late = the_line(lines, "registry.drain", "late")
    assert (late["registration"], late["claim"], late["attempt"]) == (str(stale.rows[0].pk), str(token), 1)
    failed = the_line(lines, "registry.drain", "failed:")
    assert failed["registration"] == str(stale.rows[0].pk)


def test_nul_lone_surrogates_and_odd_extras_still_make_one_line_of_json(json_log):
    class Hostile:
        def __str__(self):
            raise RuntimeError("no text for you")

    log = logging.getLogger("outbox.sweep")
    try:
        raise ValueError("bad \udcff\x00 value")
    except ValueError:
        log.exception(
            "answer %r was \x00 and \ud800 and %s",
            b"\xff\x00",
            "\udfff",
            extra={
                "delivery": uuid.UUID(int=1),
                "consumer": Hostile(),
                "attempt": 3,
                "claim": None,
                "event": 1.5,
            },
        )
    [line] = json_log()
    assert line["message"] == "answer b'\\xff\\x00' was \x00 and \ufffd and \ufffd"
    assert line["delivery"] == str(uuid.UUID(int=1))
    assert line["consumer"] == "<unprintable Hostile: RuntimeError>"
    assert (line["attempt"], line["claim"], line["event"]) == (3, None, "1.5")
    assert "ValueError: bad \ufffd\x00 value" in line["exc"] and "Traceback" in line["exc"]


def test_the_formatter_writes_ascii_and_no_lone_surrogate_escape():
    record = logging.LogRecord("odal", logging.ERROR, __file__, 1, "x\ud800y\x00z é", (), None)
    text = JsonFormatter().format(record)
    assert text.isascii() and "\n" not in text
    assert "\\ud800" not in text and "\\u0000" in text and "\\ufffd" in text
    assert set(json.loads(text)) == {"time", "level", "logger", "message"}  # no ids passed, none written


# -- the variable, in a real start-up ------------------------------------------------------------

LOG_ONE_LINE = (
    "import django, logging; django.setup(); "
    "logging.getLogger('outbox.sweep').warning('delivery %s failed', 'd-1', extra={'delivery': 'd-1', 'attempt': 2}); "
    "logging.getLogger('django.request').error('Internal Server Error: /x')"
)


def start(script: str = LOG_ONE_LINE, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ODAL_", "DEBUG", "SECRET_KEY"))}
    environment.update(env, DJANGO_SETTINGS_MODULE="odal.settings")  # DEBUG on: Django's console handler too
    return subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True)


def test_odal_log_format_json_makes_every_line_json():
    result = start(ODAL_LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["logger"], line["level"]) for line in lines] == [
        ("outbox.sweep", "WARNING"),
        ("django.request", "ERROR"),  # Django's own lines too, once each
    ]
    assert (lines[0]["message"], lines[0]["delivery"], lines[0]["attempt"]) == (
        "delivery d-1 failed",
        "d-1",
        2,
    )


def test_odal_log_format_text_is_the_plain_format():
    result = start()
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].endswith(" WARNING outbox.sweep: delivery d-1 failed")


@pytest.mark.parametrize("value", ["xml", "JSON ", "logfmt"])
def test_a_bad_odal_log_format_stops_start_up_naming_the_variable(value):
    from tests.test_settings import refusal

    assert refusal(ODAL_LOG_FORMAT=value).startswith("ODAL_LOG_FORMAT must be one of text, json")


@pytest.mark.parametrize("value", ["bogus", "info", "VERBOSE"])
def test_a_bad_odal_log_level_stops_start_up_naming_the_variable(value):
    """(It was a traceback from the logging configuration: "Unknown level".)"""
    from tests.test_settings import refusal

    said = refusal(ODAL_LOG_LEVEL=value)
    assert said.startswith("ODAL_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"), said


def test_a_record_no_filter_has_seen_still_carries_its_traceback():
    """The traceback is made by RedactUrls (without credentials) where the logging settings put
    it; a handler without that filter (a library's own, a test's) still gets it in `exc`."""
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("odal.test", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    assert not record.exc_text
    line = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in line["exc"] and "Traceback" in line["exc"]


def unused_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


# What django-q2's pusher does when its ORM broker's database cannot be reached, then what it
# does with a bug of its own (a package it cannot read).
DJANGO_Q_LOGS_A_LOST_DATABASE_AND_A_BUG = """
import django, logging
django.setup()
import django_q.conf  # its logger and, unless the settings gave one, its own handler
from django.db import connection
log = logging.getLogger("django-q")
try:
    connection.ensure_connection()
except Exception:
    log.exception("Failed to pull task from broker")
try:
    raise TypeError("a bug")
except TypeError:
    log.exception("Failed to push task to queue")
"""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_django_q_says_a_lost_database_in_one_line_and_keeps_a_bugs_traceback(log_format):
    """The pusher logs every poll while its database is gone: a traceback each time would bury
    the log (and it is no bug). Any other error keeps its traceback."""
    result = start(
        DJANGO_Q_LOGS_A_LOST_DATABASE_AND_A_BUG,
        ODAL_LOG_FORMAT=log_format,
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{unused_port()}/odal",
    )
    assert result.returncode == 0, result.stderr
    said = result.stderr
    lost, bug = said.split("Failed to push task to queue")
    assert "Failed to pull task from broker: the database does not answer (odal on 127.0.0.1:" in lost, said
    assert "Traceback" not in lost and "psycopg" not in lost.split("does not answer")[0], said
    assert "Traceback" in bug and "TypeError: a bug" in bug, said
    if log_format == "json":
        assert [json.loads(line)["logger"] for line in said.splitlines()] == ["django-q", "django-q"]
