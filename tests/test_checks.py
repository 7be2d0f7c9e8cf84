"""odal's system checks (outbox/checks.py, registry/checks.py): odal.W001, a claim hold not longer than a timeout that
can run under it, shown on every start and by `odal check`.

The tests run the checks the way Django does (django.core.checks.run_checks, or a real `odal`
process), never by importing them: each app's ready() is what must register them."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection

from outbox.models import Consumer
from tests.factories import ConsumerFactory
from tests.test_database_unanswered import closed_port
from tests.test_django_q import database_url

ROOT = Path(__file__).resolve().parent.parent


def w001(about: str = "") -> list[str]:
    """The odal.W001 warnings as `odal check` prints them (message, then hint); about="consumers"
    or "registry", those of the consumers' timeouts or of the registry's settings only."""
    found = [f"{m.msg}\nHINT: {m.hint}" for m in run_checks() if m.id == "odal.W001"]
    if about:
        found = [w for w in found if ("timeoutSeconds" in w) == (about == "consumers")]
    return found


def odal(*argv, **env) -> subprocess.CompletedProcess:
    """`odal ARGV` with the hold at 10 s (and the registry's bounds at their defaults), and `env`."""
    env = {
        **os.environ, "ODAL_CLAIM_HOLD_SECONDS": "10", "ODAL_REGISTRY_TIMEOUT_SECONDS": "10",
        "ODAL_REGISTRY_LOOKUP_SECONDS": "60", **env,
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "odal", *argv], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# -- the registry's requests ------------------------------------------------------------------


@pytest.mark.parametrize("hold", [10, 4])
@pytest.mark.parametrize("bound", ["ODAL_REGISTRY_TIMEOUT_SECONDS", "ODAL_REGISTRY_LOOKUP_SECONDS"])
def test_a_hold_not_longer_than_what_the_drain_runs_under_it_warns_naming_both(settings, db, bound, hold):
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = settings.ODAL_REGISTRY_LOOKUP_SECONDS = 1  # (shorter)
    settings.ODAL_CLAIM_HOLD_SECONDS = hold
    setattr(settings, bound, 10)
    (warning,) = w001()
    assert f"ODAL_CLAIM_HOLD_SECONDS={hold} is not longer than {bound}=10" in warning
    assert "an attempt that takes its whole timeout outlives its claim" in warning
    assert "the registration may be sent again meanwhile" in warning
    assert "the late outcome changes nothing" in warning
    assert (
        f"HINT: Raise ODAL_CLAIM_HOLD_SECONDS above 10 by a margin (the default is 300), or lower {bound}."
        in warning
    )
    if bound == "ODAL_REGISTRY_LOOKUP_SECONDS":  # (it says which)
        assert "how long the drain may read the registry's task list" in warning


def test_a_hold_longer_than_every_timeout_is_silent(settings, db):
    settings.ODAL_CLAIM_HOLD_SECONDS = 11
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = settings.ODAL_REGISTRY_LOOKUP_SECONDS = 10
    ConsumerFactory(timeout_seconds=10)
    assert w001() == []


def test_a_node_without_registry_queues_has_no_registry_timeout_to_warn_of(settings, db):
    settings.ODAL_REGISTRY_ADAPTER = "none"  # the drain sends nothing
    settings.ODAL_CLAIM_HOLD_SECONDS = 5
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = settings.ODAL_REGISTRY_LOOKUP_SECONDS = 10
    assert w001() == []


# -- the consumers' timeouts, from the database -----------------------------------------------


def test_a_consumer_whose_timeout_is_not_shorter_than_the_hold_is_named_with_both_values(settings, db):
    settings.ODAL_CLAIM_HOLD_SECONDS = 30
    ConsumerFactory(name="billing", timeout_seconds=30)
    ConsumerFactory(name="site", timeout_seconds=29)
    (warning,) = w001("consumers")
    assert "ODAL_CLAIM_HOLD_SECONDS=30 is not longer than consumer 'billing' timeoutSeconds=30:" in warning
    assert "'site'" not in warning
    assert "the delivery may be sent again meanwhile" in warning
    assert "HINT: Raise ODAL_CLAIM_HOLD_SECONDS above 30" in warning
    assert "or lower its timeout: odal outbox consumer change NAME --timeout SECONDS" in warning


def test_many_consumers_the_longest_few_are_named_and_the_rest_counted(settings, db):
    settings.ODAL_CLAIM_HOLD_SECONDS = 20
    for name, seconds in [("a", 20), ("b", 60), ("c", 20), ("d", 45), ("e", 20), ("f", 20), ("g", 21)]:
        ConsumerFactory(name=name, timeout_seconds=seconds)
    ConsumerFactory(name="fast", timeout_seconds=19)
    (warning,) = w001("consumers")
    assert (
        "ODAL_CLAIM_HOLD_SECONDS=20 is not longer than the timeoutSeconds of 7 consumers "
        "(the longest: 'b' 60, 'd' 45, 'g' 21, 'a' 20, 'c' 20; 2 more):"
    ) in warning
    assert (
        "HINT: Raise ODAL_CLAIM_HOLD_SECONDS above 60 by a margin (the default is 300), or lower their timeouts"
        in warning
    )


def test_a_database_without_odal_tables_checks_the_settings_alone(settings, db):
    """`odal migrate` on a new database runs the checks before it makes the tables."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 10
    ConsumerFactory(name="billing", timeout_seconds=10)
    with connection.cursor() as cursor:  # (rolled back with the test)
        cursor.execute("ALTER TABLE outbox_consumer RENAME TO outbox_consumer_elsewhere")
    assert w001("consumers") == []
    assert any("ODAL_REGISTRY_TIMEOUT_SECONDS=10" in warning for warning in w001("registry"))


@pytest.mark.django_db(transaction=True)
def test_the_check_closes_the_connection_it_opened(settings):
    """`odal qcluster` forks its processes after the checks ran: none may inherit a connection."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 10
    ConsumerFactory(name="billing", timeout_seconds=10)
    connection.close()
    assert any("'billing'" in warning for warning in w001("consumers"))  # (it did read the database)
    assert connection.connection is None


# -- odal check, and a start ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "argv, done",
    [
        (["check"], "System check identified 3 issues"),
        (["outbox", "sweep", "--once"], "Swept once: 0 claimed"),
        (["registry", "drain", "--once"], "Drained once"),
    ],
    ids=["check", "sweep", "drain"],
)
def test_odal_check_and_every_start_show_the_warning(argv, done):
    ConsumerFactory(name="billing", timeout_seconds=10)
    result = odal(*argv, DATABASE_URL=database_url())
    assert result.returncode == 0, result.stderr[-2000:]
    said = result.stdout + result.stderr
    assert (
        "(odal.W001) ODAL_CLAIM_HOLD_SECONDS=10 is not longer than ODAL_REGISTRY_TIMEOUT_SECONDS=10" in said
    )
    assert "(odal.W001) ODAL_CLAIM_HOLD_SECONDS=10 is not longer than ODAL_REGISTRY_LOOKUP_SECONDS=60" in said
    assert (
        "(odal.W001) ODAL_CLAIM_HOLD_SECONDS=10 is not longer than consumer 'billing' timeoutSeconds=10"
        in said
    )
    assert done in said


def test_odal_check_without_a_database_checks_the_settings_and_makes_none():
    url = f"postgres://postgres@127.0.0.1:{closed_port()}/odal_gone"
    result = odal("check", DATABASE_URL=url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert (
        "(odal.W001) ODAL_CLAIM_HOLD_SECONDS=10 is not longer than ODAL_REGISTRY_TIMEOUT_SECONDS=10"
        in result.stderr
    )
    assert "System check identified 2 issues" in result.stdout + result.stderr  # (the registry's two)


# -- a person who sets such a timeout hears of it at once --------------------------------------


def test_the_command_line_warns_of_a_timeout_it_sets_not_shorter_than_the_hold(settings, db):
    """The start's checks ran before the command changed anything: a consumer added, or a timeout
    changed, gets its warning after the write (and the command still succeeds)."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 30

    def run(*args) -> str:
        out, err = io.StringIO(), io.StringIO()
        call_command("outbox", "consumer", *args, stdout=out, stderr=err)
        return err.getvalue()

    said = run("add", "slow", "--url", "https://hooks.example.eu/a", "--timeout", "30")
    assert "Warning: ODAL_CLAIM_HOLD_SECONDS=30 is not longer than consumer 'slow' timeoutSeconds=30:" in said
    assert "Raise ODAL_CLAIM_HOLD_SECONDS above 30 by a margin, or lower this timeout (odal.W001)." in said
    assert run("add", "quick", "--url", "https://hooks.example.eu/b", "--timeout", "29") == ""
    assert "'quick' timeoutSeconds=45" in run("change", "quick", "--timeout", "45")
    assert (
        run("change", "slow", "--max-attempts", "3") == ""
    )  # (its timeout was named as the command started)
    assert run("change", "slow", "--timeout", "5") == ""


def test_the_admin_warns_of_a_timeout_it_sets_not_shorter_than_the_hold(settings, admin_client):
    settings.ODAL_CLAIM_HOLD_SECONDS = 30
    form = {"url": "https://deploy.example.eu/hook", "target": "", "event_types": "[]", "max_attempts": 5}

    def messages(response) -> str:
        return " ".join(str(m) for m in response.context["messages"])

    added = admin_client.post(
        "/admin/outbox/consumer/add/",
        {**form, "name": "slow", "kind": "webhook", "timeout_seconds": 30},
        follow=True,
    )
    assert "ODAL_CLAIM_HOLD_SECONDS=30 is not longer than consumer 'slow' timeoutSeconds=30:" in messages(
        added
    )
    change = f"/admin/outbox/consumer/{Consumer.objects.get(name='slow').pk}/change/"

    def opened() -> dict:  # the form as opened now (it carries the consumer's version)
        return {**form, "opened_at_version": Consumer.objects.get(name="slow").version}

    unchanged = admin_client.post(change, {**opened(), "max_attempts": 6, "timeout_seconds": 30}, follow=True)
    assert "ODAL_CLAIM_HOLD_SECONDS" not in messages(unchanged)  # (its timeout was not what changed)
    longer = admin_client.post(change, {**opened(), "timeout_seconds": 40}, follow=True)
    assert "'slow' timeoutSeconds=40" in messages(longer)
    shorter = admin_client.post(change, {**opened(), "timeout_seconds": 29}, follow=True)
    assert "ODAL_CLAIM_HOLD_SECONDS" not in messages(shorter)
    assert Consumer.objects.get(name="slow").timeout_seconds == 29
