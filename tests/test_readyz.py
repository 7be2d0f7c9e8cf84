"""/readyz: ready while the database answers and no due delivery waits on a stalled sweep; 503
with a machine code otherwise, open like /healthz and saying no more than it."""

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from odal.core import tally
from odal.core.models import Heartbeat
from outbox.sweep import sweep_once
from tests.factories import DeliveryFactory
from tests.test_settings import read_settings, refusal

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_beats(monkeypatch):
    monkeypatch.setattr(tally, "_last_beat", {})  # a pass in an earlier test must not silence this one's beat


def beat_ago(seconds: float) -> None:
    Heartbeat.objects.create(
        role=tally.SWEEP, worker="elsewhere:1", at=timezone.now() - timedelta(seconds=seconds)
    )


def test_an_idle_node_is_ready_without_any_heartbeat(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def test_pending_deliveries_not_due_yet_need_no_sweep(client):
    DeliveryFactory(next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert client.get("/readyz").status_code == 200


def test_a_due_delivery_and_an_old_heartbeat_is_a_stalled_sweep(client, settings):
    settings.ODAL_READYZ_SWEEP_SECONDS = 300
    DeliveryFactory()
    beat_ago(301)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready" and body["code"] == "sweep_stalled"
    assert "ODAL_READYZ_SWEEP_SECONDS" in body["detail"]


def test_a_due_delivery_and_a_recent_heartbeat_is_ready(client, settings):
    settings.ODAL_READYZ_SWEEP_SECONDS = 300
    DeliveryFactory()
    beat_ago(290)
    assert client.get("/readyz").status_code == 200


def test_a_due_delivery_and_no_heartbeat_ever_is_a_stalled_sweep(client):
    DeliveryFactory()
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["code"] == "sweep_stalled"


def test_a_real_sweep_pass_makes_the_node_ready_again(client):
    first = DeliveryFactory()
    DeliveryFactory(consumer=first.consumer)
    beat_ago(3600)
    assert client.get("/readyz").status_code == 503

    assert sweep_once(batch=1).delivered == 1  # one delivery stays due: only the heartbeat can answer
    assert Heartbeat.objects.filter(role=tally.SWEEP).count() == 2
    assert client.get("/readyz").status_code == 200


def test_readyz_needs_no_token_and_no_session(client, settings):
    settings.ODAL_METRICS_TOKEN = "m-secret-token"
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 401


def test_the_due_check_is_one_exists_on_the_due_index(client):
    DeliveryFactory()
    beat_ago(1)
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/readyz").status_code == 200
    due = next(q["sql"] for q in queries.captured_queries if "outbox_delivery" in q["sql"])
    assert "LIMIT 1" in due  # Django's exists()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the planner show its index
        cursor.execute(f"EXPLAIN {due}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "delivery_due_idx" in plan, plan


# -- the database does not answer: a real odal process pointed at a port where PostgreSQL is not ---

READYZ = (
    "import django, json, sys, time; django.setup(); from django.test import Client; "
    "started = time.monotonic(); r = Client().get(sys.argv[1], HTTP_HOST='localhost'); "
    "print(json.dumps({'status': r.status_code, 'body': r.json(), 'seconds': time.monotonic() - started}))"
)


def readyz_against(port: int, path: str = "/readyz") -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ODAL_", "DEBUG", "SECRET_KEY"))}
    environment.update(
        DJANGO_SETTINGS_MODULE="odal.settings",
        DATABASE_URL=f"postgres://odal:not-a-real-password@127.0.0.1:{port}/odal",
        DEBUG="false",
    )
    result = subprocess.run(
        [sys.executable, "-c", READYZ, path], env=environment, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"log": result.stderr}


def test_a_closed_port_is_database_unreachable_and_leaks_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    answer = readyz_against(port)
    assert answer["status"] == 503
    assert answer["body"] == {
        "status": "not_ready",
        "code": "database_unreachable",
        "detail": "The database does not answer.",
    }
    assert "not-a-real-password" not in json.dumps(answer["body"])
    assert "database did not answer" in answer["log"]  # the reason is in the log, for the operator


def test_healthz_without_a_database_is_503_not_a_500():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = readyz_against(port, "/healthz")
    assert answer["status"] == 503
    assert answer["body"]["code"] == "database_unreachable"
    assert "database did not answer" in answer["log"]


@pytest.mark.slow
def test_a_database_that_accepts_and_never_answers_is_unreachable_within_seconds():
    """A server that takes the connection and says nothing (a hung host, a full backlog) would
    hold a probe for minutes without the connect timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever answers
        started = time.monotonic()
        answer = readyz_against(silent.getsockname()[1])
        elapsed = time.monotonic() - started
    assert answer["status"] == 503 and answer["body"]["code"] == "database_unreachable"
    assert answer["seconds"] < 10 and elapsed < 20


@pytest.mark.parametrize("value", ["0", "-5", "five", "1.5"])
def test_a_bad_odal_readyz_sweep_seconds_stops_start_up_naming_the_variable(value):
    assert refusal(ODAL_READYZ_SWEEP_SECONDS=value).startswith("ODAL_READYZ_SWEEP_SECONDS must be")


def test_odal_readyz_sweep_seconds_is_read_from_the_environment():
    read = read_settings(
        base=dict(os.environ),
        ODAL_READYZ_SWEEP_SECONDS="45",
        DATABASE_URL="postgres://odal@127.0.0.1:5432/odal",
    )
    assert (
        read["ODAL_READYZ_SWEEP_SECONDS"],
        read["DATABASES"]["default"]["OPTIONS"]["connect_timeout"],
    ) == (45, 3)
