"""Hostile review of the late changes (bulk items failing alone, the rate limit's schedule, a
database that does not answer, kicks resting, DeadlineTransport): each test here failed before
its fix."""

import json

import pytest

from odal.core.models import Passport

UPI = "https://id.example.eu/01/09506000134352/21/LATE-{}"


def item(n, **extra) -> dict:
    return {"upi": UPI.format(n), "operatorId": "OP-1", **extra}


def deep_body(levels: int, inner: str = "[]") -> str:
    nested = "[" * (levels - 1) + inner + "]" * (levels - 1)
    return json.dumps({"items": [item(0, data={"x": "@"}), item(1)]}).replace('"@"', nested)


def deepest_parsed(api) -> int:
    """The deepest item the API's boundary parses (deeper, the whole body is refused: Python's
    parser gives up), found without a key."""
    for levels in range(1200, 0, -5):
        if api.post("dpp/bulk", deep_body(levels)).status_code == 200:
            Passport.objects.all().delete()
            return levels
    raise AssertionError("no depth parsed")


@pytest.mark.django_db
@pytest.mark.parametrize("depth", ["300 levels", "the deepest parsed"])
def test_an_item_nested_deep_fails_alone_with_an_idempotency_key_too(api_as, depth):
    """The boundary leaves a bulk item's depth to the route; the key's hash then read the item
    with pydantic's JSON dump (it stops at 255 levels: ValueError) and json.dumps (recursive, and
    further down the stack than the body's parse): 500 internal_error, for what fails alone
    without a key. The same body again is the first answer; another deep item, 409."""
    api = api_as("write")
    levels = 300 if depth == "300 levels" else deepest_parsed(api)
    first = api.post("dpp/bulk", deep_body(levels), HTTP_IDEMPOTENCY_KEY="deep")
    assert first.status_code == 200, first.content[:300]
    out = first.json()["results"]
    assert out[0]["error"]["code"] == "invalid_request" and "nested more than" in out[0]["error"]["detail"]
    assert [str(pk) for pk in Passport.objects.values_list("pk", flat=True)] == [out[1]["id"]]
    again = api.post("dpp/bulk", deep_body(levels), HTTP_IDEMPOTENCY_KEY="deep")
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    other = api.post("dpp/bulk", deep_body(levels, inner="[1]"), HTTP_IDEMPOTENCY_KEY="deep")
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert Passport.objects.count() == 1


def test_the_canonical_json_of_a_request_is_json_dumps_sorted():
    """The hash of a record stored before this change still matches its body sent again."""
    from odal.core.idempotency import canonical_json

    value = {"b": [1, 2.5, None, True, {"z": 'é\u2028"\\', "a": []}], "a": {"": -0.0, "\u0000": "x"}}
    assert canonical_json(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert canonical_json(json.loads("[" * 900 + "]" * 900)) == "[" * 900 + "]" * 900


def test_the_503_of_a_database_that_does_not_answer_names_nothing_of_it_to_a_client(transactional_db, caplog):
    """Anyone can send a well-formed token: its lookup meets the lost database first. The 503
    said the database's name, host and port and the driver's message (the network's layout, to
    a client that is not even authenticated); as /healthz and the 500, it says no more than what
    to do, and the log keeps the rest."""
    from django.db import connection
    from django.test import Client

    from tests.test_database_unanswered import closed_port

    settings_dict = connection.settings_dict
    port, name = settings_dict["PORT"], settings_dict["NAME"]
    connection.close()
    gone = str(closed_port())
    settings_dict["PORT"] = gone
    try:
        response = Client(raise_request_exception=False).get(
            "/vault/api/v1/registry", headers={"Authorization": "Bearer odal_12345678_not-a-secret"}
        )
    finally:
        connection.close()
        settings_dict["PORT"] = port
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["code"] == "database_unavailable" and "does not answer" in body["detail"]
    for secret in (name, gone, "127.0.0.1", "Connection refused", "OperationalError"):
        assert secret not in response.content.decode(), secret
    assert any(name in r.getMessage() and gone in r.getMessage() for r in caplog.records)


def test_odal_qcluster_started_while_its_database_is_down_waits_for_it(tmp_path):
    """django-q2's ORM broker (the default) connects as the cluster starts: with the database
    down, `odal qcluster` ended with tracebacks and exit 1 (neither riding the outage out, as the
    other workers do, nor the one line and exit 4 of a command). It waits, as `odal outbox sweep`
    does, and SIGTERM stops it meanwhile."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.test_database_unanswered import closed_port

    port = closed_port()
    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/odal_gone"}
    env.pop("ODAL_BROKER_URL", None)
    log = tmp_path / "qcluster.log"
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "-m", "odal", "qcluster"],
            cwd=Path(__file__).resolve().parent.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            time.sleep(6)
            alive = cluster.poll() is None
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(timeout=20)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
    text = log.read_text()
    assert alive, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    assert "lost the database" in text and "waiting for it to answer again" in text, text[-2000:]
    assert cluster.returncode == 0, text[-2000:]


def test_odal_qcluster_help_needs_no_database():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_database_unanswered import closed_port

    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{closed_port()}/odal_gone"}
    result = subprocess.run(
        [sys.executable, "-m", "odal", "qcluster", "--help"], cwd=Path(__file__).resolve().parent.parent,
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr[-2000:]
