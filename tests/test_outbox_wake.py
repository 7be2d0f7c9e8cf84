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
from tests.waiting import wait_for


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
