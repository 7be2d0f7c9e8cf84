"""Debounced kicks: the drain is woken like the sweep (odal.work.wake, one mechanism), a burst of
commits enqueues one django-q2 task per worker kind however many there are, and a commit that
lands while a leading task is finishing its turn is still picked up at once, not by the
minute's schedule.

Real PostgreSQL LISTEN/NOTIFY and advisory locks, real commits; the listening drain runs on its
own thread with its own connections, as in a django-q2 worker."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from odal.core.kicks import Kick
from odal.surfaces import lifecycle
from odal.work import wake
from odal.work.wake import DRAIN, Listener
from registry import drain, tasks
from registry.drain import drain_listening
from registry.models import Registration
from tests.factories import ConsumerFactory, PassportFactory
from tests.waiting import wait_for


def published():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def queued() -> list[str]:
    return sorted(q.task["func"] for q in OrmQ.objects.all())


@pytest.fixture
def short_turns(monkeypatch):
    monkeypatch.setattr(wake, "TURN_SECONDS", 0.1)
    monkeypatch.setattr(wake, "HANDOVER_SECONDS", 0.1)


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_publishes_enqueues_one_drain_and_one_sweep(settings):
    """Thirty publishes, each its own commit, with nothing listening: the first enqueues a
    drain and a sweep; the others find those kicks on their way and enqueue nothing."""
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory(event_types=["passport.*"])
    for _ in range(30):
        published()
    assert queued() == ["outbox.tasks.sweep", "registry.tasks.drain"]
    assert Registration.objects.filter(status="pending").count() == 30


def test_a_kick_is_on_its_way_until_its_task_starts_or_the_window_passes(db):
    task = "registry.tasks.drain"
    now = timezone.now()
    assert Kick.objects.request(task, now=now, window_seconds=5)
    assert not Kick.objects.request(task, now=now + timedelta(seconds=4), window_seconds=5)
    assert Kick.objects.request(task, now=now + timedelta(seconds=6), window_seconds=5)  # lost: again
    Kick.objects.started(task)
    assert Kick.objects.request(task, now=now + timedelta(seconds=7), window_seconds=5)  # taken: again
    assert Kick.objects.request("outbox.tasks.sweep", now=now, window_seconds=5)  # each task its own


@pytest.mark.django_db(transaction=True)
def test_a_drain_task_takes_its_kick_when_it_starts(registry_sim, settings, monkeypatch):
    """A kicked drain task, once started, lets the next commit kick again: that commit's row may
    come after the task's last look."""
    settings.ODAL_KICK_SWEEP = True
    monkeypatch.setattr(wake, "TURN_SECONDS", 1.0)
    published()
    assert queued() == ["registry.tasks.drain"]
    OrmQ.objects.all().delete()  # (a cluster took it)
    tasks.drain()  # registers it: a turn that worked relays (a successor, taken by a cluster)
    assert Registration.objects.get().status == "registered"
    assert [q.task["kwargs"] for q in OrmQ.objects.all()] == [{"relay": True}]
    OrmQ.objects.all().delete()
    published()
    assert queued() == ["registry.tasks.drain"]


class ListeningDrain(threading.Thread):
    """A drain that leads the drain's listener lock for `seconds`; only a NOTIFY (or a poll of
    `poll_seconds`) wakes it."""

    def __init__(self, *, seconds: float, poll_seconds: float):
        super().__init__(daemon=True)
        self.seconds, self.poll_seconds = seconds, poll_seconds
        self.ready = threading.Event()
        self.report = None

    def run(self):
        try:
            with Listener.open(DRAIN) as listener:
                assert listener.try_lead()
                self.ready.set()
                self.report = drain_listening(listener, seconds=self.seconds, poll_seconds=self.poll_seconds)
        finally:
            connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_a_publish_wakes_the_listening_drain_and_enqueues_no_task(registry_sim, settings):
    settings.ODAL_KICK_SWEEP = True
    drain = ListeningDrain(seconds=4, poll_seconds=60)  # only a notification can wake it in time
    drain.start()
    assert drain.ready.wait(5)
    time.sleep(0.3)  # its first pass found nothing; it is waiting
    passport = published()
    assert wait_for(lambda: Registration.objects.get(passport=passport).status == "registered", 3.5)
    drain.join()
    assert drain.report.registered == 1
    assert queued() == []  # a drain was listening: nothing went through django-q2


@pytest.mark.django_db(transaction=True)
def test_a_publish_committed_while_a_leading_drain_ends_its_turn_is_kicked(
    settings, monkeypatch, short_turns
):
    """The leading drain finds nothing owed and ends its turn; a publish commits just before
    it unlocks, so its kick finds the lock held and enqueues nothing. The drain's last look comes
    after the unlock: it sees the row and wakes a task. (Looking before unlocking would miss it,
    and the row would wait for the minute's schedule.)"""
    settings.ODAL_KICK_SWEEP = True
    unlock = Listener.close
    committed = []

    def publish_then_unlock(listener):
        if listener.wake == DRAIN and not committed:
            committed.append(published())  # its kick: the lock is held, nothing enqueued
            assert queued() == []
        unlock(listener)

    monkeypatch.setattr(Listener, "close", publish_then_unlock)
    tasks.drain()
    assert committed and queued() == ["registry.tasks.drain"]


def test_a_leading_drain_relays_while_a_registration_falls_due_within_the_horizon(db, settings, short_turns):
    settings.ODAL_KICK_SWEEP = True
    published()
    Registration.objects.update(next_attempt_at=timezone.now() + drain.RELAY_HORIZON - timedelta(seconds=5))
    tasks.drain()
    (successor,) = OrmQ.objects.all()
    assert successor.task["func"] == "registry.tasks.drain" and successor.task["kwargs"] == {"relay": True}


def test_a_leading_drain_leaves_a_registration_due_past_the_horizon_to_the_schedule(
    db, settings, short_turns
):
    settings.ODAL_KICK_SWEEP = True
    published()
    Registration.objects.update(next_attempt_at=timezone.now() + drain.RELAY_HORIZON + timedelta(seconds=5))
    tasks.drain()
    assert not OrmQ.objects.exists()


def test_a_kick_the_broker_refuses_is_withdrawn_so_the_next_commit_tries_again(db, monkeypatch, caplog):
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "ORM", "no-such-database")  # the broker refuses every task
    wake.wake_up(DRAIN)  # nothing listens: a kick, which fails
    assert "could not enqueue registry.tasks.drain" in caplog.text
    assert not Kick.objects.filter(enqueued_at__isnull=False).exists()
    monkeypatch.undo()
    wake._rest_until = float("-inf")  # (the broker's rest is over: the next test's)
    wake.wake_up(DRAIN)
    assert queued() == ["registry.tasks.drain"]


def test_a_broker_that_failed_a_kick_is_not_asked_again_while_it_rests(db, monkeypatch):
    """A hung Redis costs a kick its timeout; a web process would pay it on every publish. After
    one failure this process enqueues nothing (nor takes a kick's mark) for BROKER_REST_SECONDS."""
    import django_q.tasks

    asked = []

    def hung(*args, **kwargs):
        asked.append(args[0])
        raise TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(django_q.tasks, "async_task", hung)
    wake.wake_up(DRAIN)
    with CaptureQueriesContext(connections["default"]) as statements:
        wake.wake_up(wake.SWEEP)
        wake.wake_up(DRAIN)
    assert not [q["sql"] for q in statements.captured_queries if "outbox_kick" in q["sql"]]
    assert not wake.kick("registry.tasks.drain", "a kick of its own")
    assert asked == ["registry.tasks.drain"]
    assert not Kick.objects.filter(enqueued_at__isnull=False).exists()
    monkeypatch.setattr(wake, "_rest_until", time.monotonic() - 0.001)  # the rest is over
    wake.wake_up(wake.SWEEP)
    assert asked == ["registry.tasks.drain", "outbox.tasks.sweep"]


def test_withdrawing_a_kick_takes_back_only_its_own_mark(db):
    now = timezone.now()
    assert Kick.objects.request("registry.tasks.drain", now=now, window_seconds=5)
    later = now + timedelta(seconds=6)
    assert Kick.objects.request("registry.tasks.drain", now=later, window_seconds=5)  # a later kick's
    assert Kick.objects.withdraw("registry.tasks.drain", enqueued_at=now) == 0
    assert Kick.objects.get().enqueued_at == later


def turn(wake_of):
    """run_kicked_task with work that only says it ran."""
    return wake.run_kicked_task(
        wake_of, relay=False, listening=lambda *a, **k: "listened", until_idle=lambda: "idle",
        owed=lambda: False, due=lambda: False,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_task_whose_kick_could_not_be_taken_takes_it_once_its_work_is_done(monkeypatch):
    """A partition as the task starts: Kick.started fails. Its mark would hold back every commit's
    kick for KICK_WINDOW_SECONDS (the short partition run saw its drain starve): the task does
    what is due, waiting for the database, then takes the kick."""
    from django.db import OperationalError

    from odal.core.kicks import KickQuerySet

    Kick.objects.request(wake.SWEEP.task, window_seconds=60)
    real, calls = KickQuerySet.started, []

    def started(self, task):
        calls.append(task)
        if len(calls) == 1:
            raise OperationalError("the database went")
        return real(self, task)

    monkeypatch.setattr(KickQuerySet, "started", started)
    assert turn(wake.SWEEP) == "idle"
    assert len(calls) == 2 and Kick.objects.get(task=wake.SWEEP.task).enqueued_at is None


@pytest.mark.django_db
def test_a_task_whose_listener_cannot_connect_does_what_is_due_instead_of_failing(monkeypatch):
    import psycopg

    def refused(cls, wake_of):
        raise psycopg.OperationalError("connection failed: server closed the connection unexpectedly")

    monkeypatch.setattr(Listener, "open", classmethod(refused))
    assert turn(DRAIN) == "idle"
