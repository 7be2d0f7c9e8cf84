"""A database that does not answer (down, restarting, cut off) is a sentence and a retryable
answer on every surface that is not a worker loop (those ride it out: tests/test_reconnect.py):
the command line exits 4 with one line naming the database, the API answers 503
`database_unavailable` with Retry-After, and a bulk import stops instead of calling each batch
after the loss refused."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from odal.core.models import Passport
from odal.surfaces import bulk
from tests.factories import issue_token

ROOT = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # (closed again when this returns: nothing listens there)


@pytest.fixture(scope="module")
def passports_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("import") / "passports.jsonl"
    path.write_text('{"upi": "https://id.example.eu/01/1/21/DOWN-1", "operatorId": "OP"}\n')
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["outbox", "status"],
        ["outbox", "sweep", "--once"],
        ["registry", "drain", "--once"],
        ["registry", "abandon", "6f1c2b5e-8d4a-4c3e-9f4b-2a1d3c5e7f90", "--reason", "3 a.m."],
        ["passport", "import", "{file}", "--publish"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_command_whose_database_does_not_answer_says_so_and_exits_4(argv, passports_file):
    port = closed_port()
    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/odal_gone"}
    argv = [a.replace("{file}", str(passports_file)) for a in argv]
    result = subprocess.run(
        [sys.executable, "-m", "odal", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 4, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"odal: The database does not answer (odal_gone on 127.0.0.1:{port}" in result.stderr
    assert "Try again once it answers." in result.stderr


@pytest.fixture
def database_gone(transactional_db):
    """The default connection pointed at a closed port until the test ends."""
    settings_dict = connection.settings_dict
    port = settings_dict["PORT"]
    token = issue_token("write")
    connection.close()
    settings_dict["PORT"] = str(closed_port())
    try:
        yield token
    finally:
        connection.close()
        settings_dict["PORT"] = port


def test_the_api_answers_503_database_unavailable_when_the_database_does_not_answer(database_gone):
    client = Client(raise_request_exception=False)
    response = client.get("/vault/api/v1/registry", headers={"Authorization": f"Bearer {database_gone}"})
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["code"] == "database_unavailable" and "does not answer" in body["detail"]


def test_a_bulk_intake_that_loses_its_database_stops_instead_of_failing_each_batch(
    transactional_db, monkeypatch
):
    """The second batch loses the database: the first is in, and the loss is raised (the command
    and the route say so), not reported as every later batch refused."""
    insert = bulk.Intake._insert
    calls = []

    def losing(self, fresh):
        calls.append(len(fresh))
        if len(calls) == 2:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return insert(self, fresh)

    monkeypatch.setattr(bulk.Intake, "_insert", losing)
    items = [(n, {"upi": f"https://id.example.eu/01/1/21/LOST-{n}", "operatorId": "OP"}) for n in range(6)]
    intake = bulk.Intake(actor="test", publish=False)
    with pytest.raises(Exception) as raised:
        intake.take(items, batch=2)
    from odal.core import reconnect

    assert reconnect.is_lost(raised.value), raised.value
    assert calls == [2, 2]
    connection.close()
    assert sorted(Passport.objects.values_list("upi", flat=True)) == [
        "https://id.example.eu/01/1/21/LOST-0", "https://id.example.eu/01/1/21/LOST-1"
    ]  # fmt: skip
