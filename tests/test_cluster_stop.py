"""Stopping `odal qcluster` as supervisors do (issue 37, item 1): the stop reaches django-q2's
workers, whose passes start no new attempt, give back at once what they did not start, let the
attempts under way end and write their outcomes; the cluster exits within ODAL_STOP_SECONDS."""

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.utils import timezone
from django_q.tasks import async_task

from odal.core import stopping
from outbox.events import emit_many
from outbox.models import Delivery, DeliveryAttempt
from tests.factories import WebhookConsumerFactory
from tests.test_bounds import MARGIN, started
from tests.test_django_q import database_url
from tests.waiting import wait_for
from tests.webhook_server import WebhookServer

PASS_ROWS = 100  # a sweep pass's claim (outbox.sweep.Sweep.batch)
CONCURRENCY = 3  # ODAL_WEBHOOK_CONCURRENCY: attempts a pass has in flight (one consumer)
IN_FLIGHT = 2 * CONCURRENCY  # two workers, a pass each
STOP_SECONDS = 15

SIGNALS = {
    "sigterm_to_the_main_process": lambda pid: os.kill(pid, signal.SIGTERM),  # docker stop
    "sigterm_to_the_process_group": lambda pid: os.killpg(pid, signal.SIGTERM),  # systemd
    "sigint_to_the_process_group": lambda pid: os.killpg(pid, signal.SIGINT),  # Ctrl-C in a terminal
}


@contextmanager
def two_passes_under_way(settings, tmp_path):
    """`odal qcluster` (two workers) on the test database, each worker with a sweep pass of 100
    claimed deliveries, three of them being sent: the receiver holds them until the test sets
    `answer`. Yields (the cluster's process, the deliveries' ids, `answer`, the receiver,
    the cluster's log)."""
    settings.ODAL_KICK_SWEEP = False
    answer = threading.Event()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_Q_WORKERS": "2",
        "ODAL_KICK_SWEEP": "false",
        "ODAL_REGISTRY_ADAPTER": "none",
        "ODAL_WEBHOOK_CONCURRENCY": str(CONCURRENCY),
        "ODAL_STOP_SECONDS": str(STOP_SECONDS),
    }
    with WebhookServer([("stall", answer, 204)]) as server, (tmp_path / "cluster.log").open("w+") as log:
        WebhookConsumerFactory(url=server.url, event_types=["stop.test"], timeout_seconds=40)
        emit_many("stop.test", [{"n": n} for n in range(2 * PASS_ROWS)])
        ids = list(Delivery.objects.values_list("pk", flat=True))
        cluster = started(["qcluster"], env, log)
        try:
            for _ in range(2):  # one task leads and listens, the other helps: a pass each
                async_task("outbox.tasks.sweep", q_options={"save": False})
            assert wait_for(lambda: len(server.received) >= IN_FLIGHT, 90), "the two passes never began"
            yield cluster, ids, answer, server, log
        finally:
            answer.set()
            if cluster.poll() is None:
                os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()


def said(log) -> str:
    log.seek(0)
    return log.read()


def exited(cluster: subprocess.Popen) -> int | None:
    try:
        return cluster.wait(timeout=2 * STOP_SECONDS)
    except subprocess.TimeoutExpired:
        return None


def assert_given_back_and_written(ids: list, received: int, text: str) -> None:
    """Each row: delivered with its one log line (the attempts under way), or due again with its
    attempt restored and no line (the rest); none left claimed; no attempt started after the stop."""
    rows = Delivery.objects.filter(pk__in=ids)
    lines = DeliveryAttempt.objects.filter(delivery_id__in=ids)
    assert received == IN_FLIGHT, "an attempt started after the stop"
    delivered = rows.filter(status="delivered", attempts=1, claim_token__isnull=True)
    assert delivered.count() == IN_FLIGHT, text[-3000:]
    assert set(lines.values_list("delivery_id", flat=True)) == set(delivered.values_list("pk", flat=True))
    assert lines.count() == IN_FLIGHT
    due_again = rows.filter(
        status="pending", attempts=0, claim_token__isnull=True, next_attempt_at__lte=timezone.now()
    )
    assert due_again.count() == len(ids) - IN_FLIGHT
    assert "Traceback" not in text, text[-3000:]


def given_back_at_once(ids: list, log) -> None:
    """The rows not started are given back while the attempts under way are still out."""
    given_back = Delivery.objects.filter(pk__in=ids, claim_token__isnull=True, attempts=0)
    if not wait_for(lambda: given_back.count() == len(ids) - IN_FLIGHT, 2 * STOP_SECONDS):
        still = Delivery.objects.filter(pk__in=ids, claim_token__isnull=False).count()
        pytest.fail(
            f"{still} rows still claimed with an attempt counted, {given_back.count()} given back; "
            f"the cluster said:\n{said(log)[-3000:]}"
        )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the cluster reads what the test commits
@pytest.mark.parametrize("how", list(SIGNALS))
def test_a_stopped_cluster_gives_back_what_its_workers_did_not_start_and_writes_what_they_did(
    how, settings, tmp_path
):
    """The signal: the 194 deliveries not started are given back at once (due again, attempts
    restored, no log line), while the six requests are still out; then the receiver answers them,
    their outcomes are written, and the cluster exits 0 within ODAL_STOP_SECONDS."""
    with two_passes_under_way(settings, tmp_path) as (cluster, ids, answer, server, log):
        signalled = time.monotonic()
        SIGNALS[how](cluster.pid)
        given_back_at_once(ids, log)
        answer.set()  # the attempts under way end now
        code = exited(cluster)
        seconds = time.monotonic() - signalled
        received, text = len(server.received), said(log)
    assert code == 0 and seconds <= STOP_SECONDS + MARGIN, (code, seconds, text[-3000:])
    assert_given_back_and_written(ids, received, text)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_sent_sigterm_alone_stops_its_pass_as_odal_does(settings, tmp_path):
    """SIGTERM to the sentinel's processes alone, as the sentinel sends it to a worker past its
    task's timeout: each worker's pass starts nothing more, gives back what it did not start and
    writes what it did (the pusher and the monitor take their orders from the sentinel only).
    The cluster goes on; stopping it then is as quick as ever."""
    with two_passes_under_way(settings, tmp_path) as (cluster, ids, answer, server, log):
        processes = stopping.descendants(cluster.pid)
        (sentinel,) = [pid for pid in processes if parent_of(pid) == cluster.pid]
        for pid in processes:
            if parent_of(pid) == sentinel:  # the workers, the pusher and the monitor
                os.kill(pid, signal.SIGTERM)
        given_back_at_once(ids, log)
        answer.set()
        written = Delivery.objects.filter(pk__in=ids, status="delivered")
        assert wait_for(lambda: written.count() == IN_FLIGHT, 2 * STOP_SECONDS), said(log)[-3000:]
        assert cluster.poll() is None, "the cluster went with its workers"
        signalled = time.monotonic()
        cluster.send_signal(signal.SIGTERM)
        code = exited(cluster)
        seconds = time.monotonic() - signalled
        received, text = len(server.received), said(log)
    assert code == 0 and seconds <= STOP_SECONDS + MARGIN, (code, seconds, text[-3000:])
    assert_given_back_and_written(ids, received, text)
