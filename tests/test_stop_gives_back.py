"""Stopping (ODAL_STOP_SECONDS) while an attempt outlives the clock: the rows the pass never
started are given back before the process is ended, not left claimed with an attempt counted."""

import os
import signal
import socket
import time

import pytest

from registry.models import Registration
from tests.factories import RegistrationFactory
from tests.test_bounds import proxy, started, stopped_within, sweep_stopped, worker_env  # noqa: F401 (proxy: a fixture)
from tests.waiting import wait_for


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_sweep_ended_by_the_clock_has_given_back_the_rows_it_never_started(proxy, tmp_path):  # noqa: F811
    """A consumer that stalls past ODAL_STOP_SECONDS: the clock ends the sweep (143). The 4 rows
    queued behind the stalled one were never attempted: they should have been given back (claim
    None, attempts 0) before the process ended, as on a clean stop."""
    code, _, said, received, states = sweep_stopped(
        proxy, tmp_path, stall=30, timeout_seconds=25, stop_seconds=4
    )
    assert code == 143, (code, said[-3000:])
    assert len(received) == 1
    never_started = [s for s in states if s[2] is None]
    assert len(never_started) == 4, (states, said[-3000:])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_drain_ended_by_the_clock_has_given_back_the_rows_it_never_started(proxy, tmp_path):  # noqa: F811
    """A registry that takes the request and never answers: the clock ends the drain (143). The
    rows queued behind the stalled request should have been given back first."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections complete in the kernel; nothing ever answers
    regs = [RegistrationFactory() for _ in range(5)]
    env = worker_env(
        proxy,
        ODAL_STOP_SECONDS="4",
        ODAL_REGISTRY_CONCURRENCY="1",
        ODAL_REGISTRY_TIMEOUT_SECONDS="30",
        ODAL_REGISTRY_LOOKUP_SECONDS="10",  # (a find, 10 s and two requests of 30, fits a 90 s task: odal.E001)
    )
    env["ODAL_REGISTRY_URL"] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    with (tmp_path / "drain.log").open("w+") as log:
        process = started(["registry", "drain"], env, log)
        try:
            claimed = lambda: Registration.objects.filter(claim_token__isnull=False).count() == 5  # noqa: E731
            assert wait_for(claimed, 60), "never claimed"
            time.sleep(1)
            code, seconds = stopped_within(process, 20)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            silent.close()
        log.seek(0)
        said = log.read()
    states = sorted(
        Registration.objects.filter(pk__in=[r.pk for r in regs]).values_list(
            "status", "attempts", "claim_token"
        )
    )
    assert code == 143, (code, said[-3000:])
    assert len([s for s in states if s[2] is None]) == 4, (states, said[-3000:])


@pytest.mark.django_db(transaction=True)
def test_a_successor_waiting_for_the_lock_longer_than_the_server_bound_does_not_lead_and_raises_nothing(
    settings,
):
    """ODAL_DB_STATEMENT_SECONDS=2 makes statement_timeout 1.8 s, shorter than a relay successor's
    wait for its predecessor's lock (SUCCESSOR_WAIT_SECONDS): the wait was cancelled as an
    error (QueryCanceled), failing the django-q2 task, instead of ending as "another leads"."""
    from django.db import connection

    from odal.work import wake
    from tests.test_bounds import new_connection

    settings.ODAL_DB_STATEMENT_SECONDS = 2
    connection.close()
    holder = new_connection()
    holder.autocommit = True
    holder.execute("SELECT pg_advisory_lock(%s)", [wake.SWEEP.lock])
    try:
        with wake.Listener(wake.SWEEP) as listener:
            began = time.monotonic()
            assert listener.wait_to_lead(3) is False  # another leads
            assert time.monotonic() - began >= 2.9
            assert [
                listener.conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("statement_timeout", "lock_timeout")
            ] == [
                "1800ms",
                "1800ms",
            ]  # the session's own again
        holder.execute("SELECT pg_advisory_unlock(%s)", [wake.SWEEP.lock])
        with wake.Listener(wake.SWEEP) as listener:
            assert listener.wait_to_lead(3) is True
    finally:
        holder.close()


@pytest.mark.django_db(transaction=True)
def test_an_admin_page_whose_statement_outlasts_the_bound_answers_503_not_500(settings, admin_client):
    """A row locked longer than the bound (an import's batch, `odal passport canonicalise`): the
    admin's action used to wait for it; since the bounds it met a cancelled statement, and
    answered Django's 500."""
    import psycopg
    from django.db import connection
    from django.urls import reverse

    from odal.core.models import Passport
    from tests.factories import PassportFactory

    passport = PassportFactory()
    settings.ODAL_DB_STATEMENT_SECONDS = 1
    connection.close()
    params = {
        k: v for k, v in connection.get_connection_params().items() if k not in ("options", "cursor_factory")
    }
    with psycopg.connect(**params) as other:
        other.execute("SELECT 1 FROM odal_passport WHERE id = %s FOR UPDATE", [passport.pk])
        admin_client.raise_request_exception = False
        page = admin_client.post(
            reverse("admin:odal_passport_changelist"),
            {
                "action": "publish_selected",
                "_selected_action": [str(passport.pk)],
                "post": "yes",
                "reason": "go live",
            },
        )
    assert page.status_code == 503, page.content[:300]
    assert page["Retry-After"] and b"does not answer in time" in page.content
    assert Passport.objects.get(pk=passport.pk).status == "draft"
