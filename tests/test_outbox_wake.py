"""Waking the sweep: a commit NOTIFYs the listening sweep (and enqueues nothing while one
listens), a retry falling due is swept by the listener's poll without any notification, one
sweep leads at a time, and a leading task relays to a successor while work is pending.

These run real PostgreSQL LISTEN/NOTIFY and advisory locks; the listener runs on its own thread
with its own connections, as in a django-q2 worker."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import TestCase
from django.utils import timezone
from django_q.models import OrmQ

from odal.work import wake
from odal.work.wake import SWEEP, Listener
from outbox import tasks
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import Sweep, sweep_listening
from tests.factories import ConsumerFactory, DeliveryFactory
from tests.waiting import advisory_lock_holders, wait_for


class ListeningSweep(threading.Thread):
    """A listener that leads, sweeping for `seconds` at most; a notification or `poll_seconds`
    wakes it. stop() ends it at its next wake-up, which stop's own NOTIFY brings at once."""

    def __init__(self, *, seconds: float, poll_seconds: float):
        super().__init__(daemon=True)
        self.seconds, self.poll_seconds = seconds, poll_seconds
        self.ready, self.stopping = threading.Event(), threading.Event()
        self.report = None

    def run(self):
        try:
            with Listener.open() as listener:
                assert listener.try_lead()
                self.ready.set()
                self.report = sweep_listening(
                    listener,
                    seconds=self.seconds,
                    poll_seconds=self.poll_seconds,
                    should_stop=self.stopping.is_set,
                )
        finally:
            connections.close_all()

    def stop(self):
        self.stopping.set()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [SWEEP.channel])
        self.join()


@pytest.mark.django_db(transaction=True)
def test_a_commit_wakes_the_listening_sweep_and_enqueues_no_task(settings):
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory()
    sweep = ListeningSweep(seconds=4, poll_seconds=60)  # only a notification can wake it in time
    sweep.start()
    assert sweep.ready.wait(5)
    time.sleep(0.3)  # its first pass found nothing; it is waiting
    with transaction.atomic():
        emit("passport.published", {"n": 1})
    assert wait_for(lambda: Delivery.objects.filter(status="delivered").exists(), 3.5)
    sweep.stop()
    assert sweep.report.delivered == 1
    assert not OrmQ.objects.exists()  # a sweep was listening: nothing went through django-q2


@pytest.mark.django_db(transaction=True)
def test_a_retry_falling_due_is_swept_by_the_poll_without_a_notification():
    ConsumerFactory()
    delivery = DeliveryFactory(next_attempt_at=timezone.now() + timedelta(seconds=1))  # no commit hook
    sweep = ListeningSweep(seconds=4, poll_seconds=0.2)
    sweep.start()
    assert wait_for(lambda: Delivery.objects.get(pk=delivery.pk).status == "delivered", 3.5)
    sweep.stop()
    attempt = Delivery.objects.get(pk=delivery.pk).attempt_log.get()
    assert attempt.started_at >= delivery.next_attempt_at


def test_with_no_sweep_listening_a_commit_enqueues_one(db, settings):
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory()
    with TestCase.captureOnCommitCallbacks(execute=True):
        emit("passport.published", {})
    assert OrmQ.objects.count() == 1


def test_while_a_sweep_listens_a_commit_enqueues_nothing(db, settings):
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory()
    with Listener.open() as listener:
        assert listener.try_lead()
        with TestCase.captureOnCommitCallbacks(execute=True):
            emit("passport.published", {})  # (the NOTIFY itself only lands with a real commit)
    assert not OrmQ.objects.exists()


def test_one_sweep_leads_at_a_time_and_a_closed_leader_frees_the_lock(db):
    first, second = Listener.open(), Listener.open()
    try:
        assert first.try_lead()
        assert not second.try_lead()
        assert not second.wait_to_lead(0.2)
        first.close()  # a leader that dies loses its connection, and the lock with it
        assert second.wait_to_lead(2)
    finally:
        first.close()
        second.close()


@pytest.fixture
def short_turns(monkeypatch):
    monkeypatch.setattr(wake, "TURN_SECONDS", 0.1)
    monkeypatch.setattr(wake, "HANDOVER_SECONDS", 0.1)


def test_a_leading_turn_relays_to_a_successor_while_work_is_pending(db, settings, short_turns):
    settings.ODAL_KICK_SWEEP = True
    DeliveryFactory(consumer=ConsumerFactory(), next_attempt_at=timezone.now() + timedelta(hours=1))
    tasks.sweep()
    (queued,) = OrmQ.objects.all()
    assert queued.task["func"] == "outbox.tasks.sweep" and queued.task["kwargs"] == {"relay": True}


def test_a_leading_turn_with_nothing_pending_ends_without_a_successor(db, settings, short_turns):
    settings.ODAL_KICK_SWEEP = True
    tasks.sweep()
    assert not OrmQ.objects.exists()


def test_a_sweep_task_that_cannot_lead_sweeps_what_is_due_and_returns(db, monkeypatch):
    ConsumerFactory()
    emit("passport.published", {})
    monkeypatch.setattr(Sweep, "listening", lambda *a, **k: pytest.fail("it must not listen"))
    with Listener.open() as leader:
        assert leader.try_lead()
        summary = tasks.sweep()
    assert summary.startswith("1 claimed, 1 delivered")
    assert Delivery.objects.get().status == "delivered"


# -- the hand-over between turns (issue 26: no gap in which nobody sweeps) ----------------------


def lock_is_held() -> bool:
    return advisory_lock_holders(SWEEP.lock) > 0


class Successor(threading.Thread):
    """A relay successor: once the lock is held, it waits for it (as run_kicked_task's relay does)."""

    def __init__(self, wait_seconds: float):
        super().__init__(daemon=True)
        self.wait_seconds, self.led = wait_seconds, None

    def run(self):
        try:
            assert wait_for(lock_is_held, 30)
            listener = Listener.open()
            try:
                self.led = listener.wait_to_lead(self.wait_seconds)
            finally:
                listener.close()
        finally:
            connections.close_all()


def test_a_leader_hands_over_only_once_its_successor_waits_for_the_lock(db):
    leader = Listener.open()
    try:
        assert leader.try_lead()
        assert not leader.hand_over()  # nobody waits: it keeps the lock
        assert leader.leading and lock_is_held()
        successor = Successor(wait_seconds=30)
        successor.start()
        assert wait_for(leader.hand_over, 30)  # true once the successor waits, and the lock is given up
        successor.join(30)
        assert successor.led is True and not leader.leading
    finally:
        leader.close()


def test_a_leading_turn_works_on_until_its_successor_waits_then_hands_over(db, settings, monkeypatch):
    """Handing over after a fixed time, come the successor or not, left nobody sweeping until it
    came: 100–250 ms of commits unswept at every turn at 50 events/s. The leader now keeps
    sweeping until its successor waits for the lock (HANDOVER_SECONDS is only the longest)."""
    settings.ODAL_KICK_SWEEP = True
    monkeypatch.setattr(wake, "TURN_SECONDS", 0.1)
    monkeypatch.setattr(wake, "HANDOVER_SECONDS", 120)
    DeliveryFactory(consumer=ConsumerFactory(), next_attempt_at=timezone.now() + timedelta(hours=1))  # owed
    successor = Successor(wait_seconds=120)
    successor.start()
    started = time.monotonic()
    tasks.sweep()
    successor.join(30)
    assert successor.led is True
    assert time.monotonic() - started < 60  # not the 120 s of a leader that waits out its hand-over
    (queued,) = OrmQ.objects.all()
    assert queued.task["kwargs"] == {"relay": True}


def test_a_helper_beside_a_leader_stops_at_its_first_pass_short_of_a_batch(db):
    """On a steady trickle there is always a row due: a helper that swept until idle kept its
    django-q2 worker (50 s), and the leader's relay successor found no worker to start on."""
    consumer = ConsumerFactory()
    DeliveryFactory.create_batch(3, consumer=consumer)
    report = Sweep().until_idle(batch=2, while_full=True)
    assert (report.passes, report.claimed) == (2, 3)


def test_a_sweep_task_that_cannot_lead_helps_only_while_batches_are_full(db, monkeypatch):
    asked = []
    monkeypatch.setattr(Sweep, "until_idle", lambda self, **kwargs: asked.append(kwargs) or Sweep.Report())
    with Listener.open() as leader:
        assert leader.try_lead()
        tasks.sweep()
    assert asked == [{"max_seconds": 50, "while_full": True}]


def test_a_relay_successor_sweeps_once_before_it_waits_for_the_lock(db):
    """Its first pass is a run's slowest (housekeeping, new connections): run beside the leader,
    not in the moment after the leader lets go."""
    ConsumerFactory()
    emit("passport.published", {})
    seen = []
    report = Sweep().listening(
        None, seconds=5, lead=lambda: seen.append(Delivery.objects.get().status) and False
    )
    assert seen == ["delivered"] and report.passes == 1


def test_a_leading_turn_that_swept_relays_even_with_nothing_pending_at_its_end(db, settings, short_turns):
    """On a steady trickle every row may be settled just when the turn asks: a turn that swept
    something relays, or nobody would listen until the next commit's task started."""
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory()
    emit("passport.published", {})
    tasks.sweep()
    assert Delivery.objects.get().status == "delivered"
    (queued,) = OrmQ.objects.all()
    assert queued.task["kwargs"] == {"relay": True}
