"""A pass that runs in a django-q2 task starts no attempt that could not end, and be written,
before the task's timeout ends it (issue 37, item 2): past its deadline it gives the rest of its
rows back as on a stop; and the settings must leave a task room for its longest attempt."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.utils import timezone
from django_q.timeout import TimeoutHandler

from odal.surfaces import lifecycle
from odal.work import deadline
from outbox import tasks
from outbox.models import Delivery, DeliveryAttempt
from outbox.sweep import sweep_once
from registry import adapters, checks, drain_pass
from registry.drain import drain_once
from registry.models import Registration, RegistrationAttempt
from tests.factories import DeliveryFactory, PassportFactory, RegistrationFactory, WebhookConsumerFactory
from tests.waiting import wait_for
from tests.webhook_server import WebhookServer


@pytest.fixture
def movable_clock(monkeypatch):
    """odal.work.deadline's clock, which the test moves forward (`moved[0]` seconds)."""
    moved = [0.0]
    monkeypatch.setattr(deadline, "clock", lambda: time.monotonic() + moved[0])
    return moved


@pytest.mark.django_db(transaction=True)  # the pass runs on a thread of its own
def test_a_sweep_pass_whose_task_runs_out_of_time_gives_back_the_rows_it_did_not_start(
    settings, movable_clock
):
    """One attempt at a time; the task's time runs out while the first is out: the four rows
    behind it are given back at once (due again, attempts restored, nothing logged), the first
    one's outcome is written, and the report says the pass met its deadline."""
    settings.ODAL_WEBHOOK_CONCURRENCY = 1
    answer = threading.Event()
    box = {}

    def task():
        try:
            with deadline.task(60):
                box["report"] = sweep_once()
        finally:
            connections.close_all()

    with WebhookServer([("stall", answer, 204)]) as server:
        consumer = WebhookConsumerFactory(url=server.url, timeout_seconds=5)
        ids = [DeliveryFactory(consumer=consumer).pk for _ in range(5)]
        given_back = Delivery.objects.filter(pk__in=ids, attempts=0, claim_token__isnull=True)
        sweeping = threading.Thread(target=task)
        sweeping.start()
        try:
            assert wait_for(lambda: server.received, 30), "no attempt started"
            movable_clock[0] = 3600.0  # the task's deadline passes while the first attempt is out
            back = wait_for(lambda: given_back.count() == 4, 30)
        finally:
            answer.set()
            sweeping.join(30)
        received = len(server.received)
    assert back, f"{given_back.count()} given back while the first attempt was still out"
    report = box["report"]
    assert (report.claimed, report.delivered, report.not_started, report.out_of_time) == (5, 1, 4, 1)
    assert received == 1
    assert Delivery.objects.filter(pk__in=ids, status="delivered", attempts=1).count() == 1
    assert given_back.count() == 4
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == 1
    assert "4 not started (given back: the task's time was up)" in report.summary()


@pytest.mark.django_db(transaction=True)
def test_a_webhook_whose_turn_comes_after_the_deadline_is_not_sent_even_before_the_pass_looks(
    settings, movable_clock
):
    """The deadline passes and the attempt under way ends at once: the next row's turn comes on
    the client's loop before the pass's own thread looks again; it is not started either."""
    settings.ODAL_WEBHOOK_CONCURRENCY = 1
    answer = threading.Event()
    box = {}

    def task():
        try:
            with deadline.task(60):
                box["report"] = sweep_once()
        finally:
            connections.close_all()

    with WebhookServer([("stall", answer, 204)]) as server:
        consumer = WebhookConsumerFactory(url=server.url, timeout_seconds=5)
        ids = [DeliveryFactory(consumer=consumer).pk for _ in range(3)]
        sweeping = threading.Thread(target=task)
        sweeping.start()
        try:
            assert wait_for(lambda: server.received, 30), "no attempt started"
            movable_clock[0] = 3600.0
        finally:
            answer.set()
            sweeping.join(30)
        received = len(server.received)
    assert received == 1
    assert (box["report"].delivered, box["report"].not_started) == (1, 2)
    assert Delivery.objects.filter(pk__in=ids, attempts=0, claim_token__isnull=True).count() == 2


@pytest.mark.django_db
def test_a_drain_pass_whose_task_runs_out_of_time_gives_back_the_rows_it_did_not_start(
    settings, movable_clock
):
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    for _ in range(3):
        lifecycle.publish(PassportFactory().pk, actor="test")

    class Adapter:
        def register(self, registration):
            movable_clock[0] = 3600.0  # the task's time runs out while the request is out
            return adapters.Accepted(request_id=f"req-{registration.pk}")

        def close(self):
            pass

    with deadline.task(60):
        report = drain_once(adapter=Adapter())
    assert (report.claimed, report.submitted, report.not_started, report.out_of_time) == (3, 1, 2, 1)
    rows = Registration.objects.all()
    assert rows.filter(status="submitted").count() == 1
    assert rows.filter(status="pending", attempts=0, claim_token__isnull=True).count() == 2
    assert RegistrationAttempt.objects.count() == 1


@pytest.mark.django_db
def test_a_drain_under_a_rate_limit_books_no_slot_past_its_tasks_deadline(settings):
    """One request every 10 s, and a task whose requests (10 s each) must start within 5 s: the
    first goes out now; the next two, whose slots would come later, are given back unbooked."""
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 0.1
    for _ in range(3):
        lifecycle.publish(PassportFactory().pk, actor="test")

    class Adapter:
        def register(self, registration):
            return adapters.Accepted(request_id=f"req-{registration.pk}")

        def close(self):
            pass

    with deadline.task(settings.ODAL_REGISTRY_TIMEOUT_SECONDS + deadline.MARGIN_SECONDS + 5):
        report = drain_once(adapter=Adapter())
    assert (report.claimed, report.submitted, report.not_started, report.out_of_time) == (3, 1, 2, 1)
    assert Registration.objects.filter(status="pending", attempts=0, claim_token__isnull=True).count() == 2


@pytest.mark.django_db
def test_a_deactivation_that_must_find_first_waits_for_a_task_with_time_for_its_lookup(settings):
    """Its lookup and two requests (10 + 2 x 10 s) cannot end within a task that has 40 s left
    (less the margin): that row is given back for a fresh task, while a register (one request of
    10 s) goes out in the same pass."""
    settings.ODAL_REGISTRY_LOOKUP_SECONDS = 30
    lifecycle.publish(PassportFactory().pk, actor="test")
    finding = RegistrationFactory(
        operation="deactivate", attempts=1, passport=PassportFactory(status="suspended"),
        next_attempt_at=timezone.now() - timedelta(minutes=1),  # claimed first: the register after it
    )  # fmt: skip
    assert finding.finds_first

    class Adapter:
        def register(self, registration):
            return adapters.Accepted(request_id=f"req-{registration.pk}")

        def find_submission(self, upi):  # pragma: no cover - must not be asked
            raise AssertionError("a lookup was started that could not end within its task")

        def close(self):
            pass

    with deadline.task(40):
        report = drain_once(adapter=Adapter())
    assert (report.claimed, report.submitted, report.not_started, report.out_of_time) == (2, 1, 1, 1)
    finding.refresh_from_db()
    assert (finding.status, finding.attempts, finding.claim_token) == ("pending", 1, None)
    with deadline.task(60):  # a task with time for it
        assert deadline.start_by(drain_pass.longest_attempt_seconds(finds=True)) > deadline.now()


def test_outside_a_task_a_pass_has_no_deadline_but_the_hold():
    assert deadline.start_by(10) == float("inf")
    with deadline.task(60):
        assert 44 < deadline.start_by(10) - deadline.now() <= 60 - 10 - deadline.MARGIN_SECONDS
    assert deadline.start_by(10) == float("inf")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("workers", [1, 2])  # (1: the task runs until_idle; 2: it leads, listening)
def test_django_q2s_timeout_never_lands_inside_an_attempt(settings, workers):
    """The sweep's task as a django-q2 worker runs it, under its alarm (TimeoutHandler, 8 s):
    40 deliveries of half a second each, one at a time. It used to go on starting attempts until
    the claim's hold; the alarm then ended the task inside one ("Task exceeded maximum timeout
    value"), its outcome never written and every row left claimed. Now its pass stops starting
    them in time, gives the rest back, and the task returns before the alarm: whatever the speed
    of the machine, each row is delivered with its log line or due again untouched."""
    settings.ODAL_WEBHOOK_CONCURRENCY = 1
    settings.ODAL_KICK_SWEEP = False
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": workers}
    with WebhookServer([("stall", 0.5, 204)]) as server:
        consumer = WebhookConsumerFactory(url=server.url, timeout_seconds=2)
        ids = [DeliveryFactory(consumer=consumer).pk for _ in range(40)]
        began = time.monotonic()
        try:
            with TimeoutHandler(8):
                summary = tasks.sweep()
        except Exception as exc:  # (django_q's TimeoutException)
            pytest.fail(f"django-q2's timeout ended the task: {exc}")
        took = time.monotonic() - began
    rows = Delivery.objects.filter(pk__in=ids)
    assert took < 8 and "given back: the task's time was up" in summary, (took, summary)
    assert not rows.filter(claim_token__isnull=False).exists()
    delivered = rows.filter(status="delivered", attempts=1)
    assert delivered.count() + rows.filter(status="pending", attempts=0).count() == 40
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == delivered.count()


# -- the settings must add up (registry.checks) ----------------------------------------------------------


def errors() -> list[Error]:
    return [m for m in checks.task_timeouts_add_up() if m.is_serious()]


def test_the_default_timeouts_add_up():
    assert errors() == []


@pytest.mark.parametrize(
    "changes, code, says",
    [
        ({"Q_CLUSTER": {"timeout": 70}}, "odal.E001", "ODAL_REGISTRY_LOOKUP_SECONDS=60"),
        ({"ODAL_REGISTRY_LOOKUP_SECONDS": 90}, "odal.E001", "ODAL_REGISTRY_LOOKUP_SECONDS=90"),
        ({"Q_CLUSTER": {"timeout": 60}, "ODAL_REGISTRY_ADAPTER": "none"}, "odal.E001", "timeoutSeconds"),
        ({"Q_CLUSTER": {"retry": 90}}, "odal.E002", "retry"),
        ({"Q_CLUSTER": {"timeout": None}}, "odal.E002", "no timeout"),
    ],
)  # fmt: skip
def test_timeouts_that_cannot_add_up_are_refused(db, settings, changes, code, says):
    for name, value in changes.items():
        if name == "Q_CLUSTER":
            value = {**settings.Q_CLUSTER, **value}
        setattr(settings, name, value)
    found = errors()
    assert [e.id for e in found] == [code], [e.msg for e in found]
    assert says in found[0].msg, found[0].msg
    with pytest.raises(SystemCheckError, match=code):  # and every command refuses to start with them
        call_command("check")
