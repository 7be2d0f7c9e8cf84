"""Python consumers in a sweep pass: they run on a thread of their own, so webhook outcomes are
written while they run, and none starts after the claim's hold ran out (issue 12); one past its
timeoutSeconds fails its attempt and the pass goes on, and a process whose overrunning threads
of one consumer piled up takes none of its rows (issue 23)."""

import logging
import threading
from concurrent.futures import Future

import pytest
from django.test import Client
from django.utils import timezone

from outbox import python_consumers
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from tests import consumers
from tests.factories import ConsumerFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer


def metrics() -> dict[str, float]:
    """The samples on /metrics, {'name{labels}': value}; their HELP lines there too."""
    text = Client().get("/metrics").content.decode()
    for name in (
        "outbox_python_timeouts_total",
        "outbox_python_consumer_blocked_total",
        "outbox_python_consumer_held_back",
    ):
        assert f"# HELP {name} " in text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {sample: float(value) for sample, value in samples}


def overrun_lines(*names: str) -> dict[str, float]:
    found = metrics()
    return {
        f'{metric}{{consumer="{name}"}}': found.get(f'{metric}{{consumer="{name}"}}')
        for name in names
        for metric in ("outbox_python_timeouts_total", "outbox_python_consumer_blocked_total")
    }


@pytest.fixture(autouse=True)
def _calls():
    consumers.calls.clear()
    consumers.gate.clear()
    yield
    consumers.gate.set()  # no consumer thread outlives its test
    python_consumers.OVERRUNS.join(15)


@pytest.mark.django_db(transaction=True)  # the Python consumer reads what the sweep committed
def test_webhook_outcomes_are_written_while_a_python_consumer_runs():
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        ConsumerFactory(target="tests.consumers.waits_for_a_delivered_webhook")
        emit("passport.published", {"n": 1})

        report = sweep_once()

    assert consumers.calls == ["saw the webhook delivered"]
    assert (report.claimed, report.delivered, report.late) == (2, 2, 0)


@pytest.mark.django_db
def test_no_python_consumer_starts_after_the_claims_hold_ran_out(settings):
    """Two deliveries to a Python consumer that takes 1.2 s, a 1 s hold: the second's turn
    comes when it is due again for any claimer. It is not called, gets its counted attempt back,
    and is due at once."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    ConsumerFactory(target="tests.consumers.slow")
    emit("passport.published", {"n": 1})
    emit("passport.published", {"n": 2})

    report = sweep_once()

    assert (report.claimed, report.delivered, report.not_started) == (2, 1, 1)
    assert len(consumers.calls) == 1
    waiting = Delivery.objects.get(status="pending")
    assert (waiting.attempts, waiting.claim_token) == (0, None)
    assert not waiting.attempt_log.exists()


@pytest.mark.django_db(transaction=True)  # the late outcome is written from the consumer's own thread
def test_a_python_consumer_past_its_timeout_fails_its_attempt_and_the_pass_goes_on():
    """A Python consumer that blocks (until the test opens its gate), timeoutSeconds=1, beside a
    webhook and another Python consumer: the pass ends with the blocked attempt failed as timed
    out and the others delivered. When the consumer returns later, its outcome takes nothing:
    it is an attempt-log line marked late (its success noted as lateSuccessAt)."""
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        other = ConsumerFactory()
        blocked = ConsumerFactory(target="tests.consumers.blocks", timeout_seconds=1)
        emit("passport.published", {"n": 1})
        assert set(overrun_lines(blocked.name, other.name).values()) == {0.0}  # there before any overrun

        report = sweep_once()

    assert (report.claimed, report.delivered, report.failed, report.late) == (3, 2, 1, 0)
    row = Delivery.objects.get(consumer=blocked)
    assert (row.status, row.attempts, row.claim_token) == ("pending", 1, None)
    assert row.last_error.startswith("timed out after 1s")
    assert list(row.attempt_log.values_list("outcome", "late")) == [("failed", False)]
    assert "returned" not in consumers.calls  # still blocked: the pass did not wait for it
    assert overrun_lines(blocked.name, other.name) == {  # one timeout, under the bound of 4
        f'outbox_python_timeouts_total{{consumer="{blocked.name}"}}': 1.0,
        f'outbox_python_consumer_blocked_total{{consumer="{blocked.name}"}}': 0.0,
        f'outbox_python_timeouts_total{{consumer="{other.name}"}}': 0.0,
        f'outbox_python_consumer_blocked_total{{consumer="{other.name}"}}': 0.0,
    }

    consumers.gate.set()
    python_consumers.OVERRUNS.join(15)

    assert "returned" in consumers.calls
    assert list(row.attempt_log.order_by("late").values_list("outcome", "late")) == [
        ("failed", False),
        ("delivered", True),
    ]
    row.refresh_from_db()
    assert (row.status, row.attempts, row.claim_token) == ("pending", 1, None)
    assert row.late_success_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_process_whose_overrunning_threads_piled_up_claims_none_of_that_consumers_rows(monkeypatch, caplog):
    """The bound at 1: the blocked consumer's first attempt times out and leaves its thread
    running, so its second delivery of the pass is given back unstarted, and the next pass claims
    none of its rows (only the other consumer's), saying so once in the log. Once the thread
    returns, its rows are claimed again."""
    monkeypatch.setattr(python_consumers, "PYTHON_OVERRUNS_PER_CONSUMER", 1)
    blocked = ConsumerFactory(target="tests.consumers.blocks", timeout_seconds=1)
    ConsumerFactory()
    emit("passport.published", {"n": 1})
    emit("passport.published", {"n": 2})

    with caplog.at_level(logging.WARNING, logger="outbox"):
        first = sweep_once()
        emit("passport.published", {"n": 3})
        second = sweep_once()

    assert (first.claimed, first.delivered, first.failed, first.not_started) == (4, 2, 1, 1)
    assert (second.claimed, second.delivered) == (1, 1)  # the other consumer's row only
    due = Delivery.objects.filter(consumer=blocked, status="pending", next_attempt_at__lte=timezone.now())
    assert due.filter(claim_token=None).count() == 2  # due, and left alone
    said = [r for r in caplog.records if "takes none of its deliveries" in r.getMessage()]
    assert len(said) == 1
    assert not [r for r in caplog.records if "took none of its" in r.getMessage()]  # (a new runner at once)
    assert overrun_lines(blocked.name) == {  # and on /metrics: one timeout, and it blocked the process
        f'outbox_python_timeouts_total{{consumer="{blocked.name}"}}': 1.0,
        f'outbox_python_consumer_blocked_total{{consumer="{blocked.name}"}}': 1.0,
    }
    assert held_back(blocked.name) == 1.0  # one process holds it back now

    consumers.gate.set()
    python_consumers.OVERRUNS.join(15)
    third = sweep_once()

    assert (third.claimed, third.delivered) == (2, 2)  # the blocked consumer's two due rows
    assert held_back(blocked.name) == 0.0


def held_back(name: str) -> float | None:
    """outbox_python_consumer_held_back for consumer `name` on /metrics."""
    return metrics().get(f'outbox_python_consumer_held_back{{consumer="{name}"}}')


def test_a_list_handed_to_a_runner_that_never_takes_it_goes_to_a_new_runner(monkeypatch, caplog):
    """The watcher bounds the wait for a runner to start, not only each attempt: a runner busy
    with something else (here, a job that waits for a gate) takes none of the list within the
    shortest timeout of the list, so a new runner runs it, and that is logged. Nothing hangs."""
    from types import SimpleNamespace

    gate = threading.Event()
    busy = python_consumers.PythonRunner()
    busy.jobs.put(gate.wait)
    monkeypatch.setattr(python_consumers, "RUNNER", busy)
    consumer = SimpleNamespace(pk=1, name="quick", timeout_seconds=1)
    ran = []
    jobs = python_consumers.Jobs(
        [(consumer, n, Future()) for n in range(3)],
        call=lambda consumer, n: ran.append((n, threading.current_thread())) or n,
        skip=lambda consumer: False,
        late=lambda result: None,
        timed_out=lambda consumer, n, started_at: "timed out",
    )
    watching = threading.Thread(target=python_consumers.run_each, args=(jobs,))
    with caplog.at_level(logging.ERROR, logger="outbox"):
        try:
            watching.start()
            watching.join(10)
            assert not watching.is_alive(), "the list waited for a runner that never took it"
        finally:
            gate.set()
            watching.join(5)
        assert [future.result(0) for _, _, future in jobs.items] == [0, 1, 2]
        assert [n for n, _ in ran] == [0, 1, 2] and {thread for _, thread in ran} != {busy.thread}
        assert python_consumers.RUNNER is not busy
        busy.thread.join(5)  # (its own job returned: it was stopped, and the list is not its own any more)

    assert not busy.thread.is_alive()
    assert len(ran) == 3  # the list was run once
    assert [r.getMessage() for r in caplog.records] == [
        "the Python runner took none of its 3 attempts in 1s; a new runner takes them"
    ]  # (and nothing else: the old runner left the list alone, it did not trip over it)


def test_a_late_write_that_loses_the_database_does_not_leave_its_thread_counted(caplog):
    """A late outcome's write that meets a lost database raises DatabaseLost, a BaseException:
    the runner's count of overrunning threads was decremented only after an `except Exception`,
    so each such blip left a thread counted that had returned, and after
    PYTHON_OVERRUNS_PER_CONSUMER of them the process took none of the consumer's rows again, ever."""
    from types import SimpleNamespace

    import psycopg

    from odal.core.reconnect import DatabaseLost

    consumer = SimpleNamespace(pk=-37, name="blips", timeout_seconds=0.2)

    def lose_the_database(result):
        raise DatabaseLost(psycopg.OperationalError("server closed the connection unexpectedly"))

    counted = []
    for _ in range(python_consumers.PYTHON_OVERRUNS_PER_CONSUMER):
        gate = threading.Event()
        jobs = python_consumers.Jobs(
            [(consumer, 1, Future())],
            call=lambda consumer, n, gate=gate: gate.wait(10) and n,
            skip=lambda consumer: False,
            late=lose_the_database,
            timed_out=lambda consumer, n, started_at: "timed out",
        )
        with caplog.at_level(logging.WARNING, logger="outbox"):
            python_consumers.run_each(jobs)  # (past its timeout: the runner is left to finish it)
            assert jobs.items[0][2].result(0) == "timed out"
            gate.set()
            python_consumers.OVERRUNS.join(10)
        counted.append(len(python_consumers.OVERRUNS.threads.get(consumer.pk, ())))
    assert counted == [0] * python_consumers.PYTHON_OVERRUNS_PER_CONSUMER, (
        f"threads still counted as overrunning after each late write that lost the database: {counted}"
    )
    assert python_consumers.OVERRUNS.skip() is None  # its rows are claimed
    assert [r.getMessage() for r in caplog.records if "late outcome" in r.getMessage()] == [
        "Python consumer blips: a late outcome could not be written: the database does not answer "
        "(OperationalError: server closed the connection unexpectedly)"
    ] * python_consumers.PYTHON_OVERRUNS_PER_CONSUMER


@pytest.mark.django_db
def test_a_process_that_stopped_saying_it_holds_a_consumer_back_is_not_counted(settings):
    """outbox_python_consumer_held_back counts the processes whose heartbeat for the consumer is
    younger than ODAL_READYZ_SWEEP_SECONDS: one that died holding it back stops counting."""
    from datetime import timedelta

    from odal.core.models import Heartbeat

    settings.ODAL_READYZ_SWEEP_SECONDS = 300
    consumer = ConsumerFactory(name="hangs")
    role = f"{python_consumers.HELD_BACK}{consumer.pk}"
    now = timezone.now()
    Heartbeat.objects.create(role=role, worker="worker-1:10", at=now)
    Heartbeat.objects.create(role=role, worker="worker-2:20", at=now - timedelta(seconds=30))
    Heartbeat.objects.create(role=role, worker="gone:30", at=now - timedelta(seconds=301))
    assert held_back("hangs") == 2.0
