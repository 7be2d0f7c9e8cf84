"""Issue 37, item 8: claims, holds and "due" read the database's clock, not the process's. Each
test runs a process whose clock is wrong by ten minutes (django.utils.timezone.now patched, as
every reading of it in odal goes through it) beside the right one: a claim made by a worker whose
clock lagged by more than the hold wrote a hold already over, so another worker took the row
while it was still being sent; a worker whose clock ran ahead took rows others still held, counted
its own live hold as over, and dead-lettered spent rows whose last attempt was still running."""

from datetime import timedelta

import pytest
from django.utils import timezone

from odal.work.services import Due
from outbox import housekeeping, service
from outbox.models import Delivery
from outbox.sweep import SWEEPING, sweep_once
from registry import drain
from registry.models import Registration
from tests.factories import ConsumerFactory, DeliveryFactory, RegistrationFactory

pytestmark = pytest.mark.django_db

SKEW = timedelta(minutes=10)  # more than the hold (300 s)
ROWS = {
    "delivery": (Delivery, DeliveryFactory),
    "registration": (Registration, RegistrationFactory),
}


class Clock:
    """This process's wall clock, off the real one by `off` (timezone.now patched)."""

    def __init__(self, monkeypatch, off: timedelta = timedelta(0)):
        self.off, real = off, timezone.now
        monkeypatch.setattr(timezone, "now", lambda: real() + self.off)


@pytest.mark.parametrize("kind", ROWS)
def test_a_claim_made_by_a_process_whose_clock_lags_holds_the_row_for_every_other(kind, monkeypatch):
    model, factory = ROWS[kind]
    row = factory(next_attempt_at=timezone.now() - 2 * SKEW)  # (due by either clock)
    clock = Clock(monkeypatch, -SKEW)
    mine = model.objects.claim(limit=1, hold_seconds=300)
    clock.off = timedelta(0)  # another process, its clock right
    theirs = model.objects.claim(limit=1, hold_seconds=300)
    assert [r.pk for r in mine.rows] == [row.pk]
    assert theirs.rows == [], "another process took a row the lagging one still holds"
    assert mine.holds()


@pytest.mark.parametrize("kind", ROWS)
def test_a_process_whose_clock_runs_ahead_takes_no_row_another_claim_holds(kind, monkeypatch):
    model, factory = ROWS[kind]
    row = factory()
    mine = model.objects.claim(limit=1, hold_seconds=300)
    clock = Clock(monkeypatch, +SKEW)
    theirs = model.objects.claim(limit=1, hold_seconds=300)
    assert [r.pk for r in mine.rows] == [row.pk]
    assert theirs.rows == [], "a process whose clock runs ahead took a row another claim holds"
    clock.off = timedelta(0)
    assert model.objects.get(pk=row.pk).claim_token == mine.token


@pytest.mark.parametrize("kind", ROWS)
def test_a_claim_knows_its_hold_by_the_databases_time_whatever_the_process_clock(kind, monkeypatch):
    """The claim's UPDATE answers its own instant (no statement more): `at` and `held_until` are
    what the database wrote, not this process's reading of its clock."""
    model, factory = ROWS[kind]
    row = factory()
    Clock(monkeypatch, +SKEW)
    claim = model.objects.claim(limit=1, hold_seconds=300)
    assert claim.held_until == model.objects.get(pk=row.pk).next_attempt_at
    assert claim.held_until - claim.at == timedelta(seconds=300)


def test_a_hold_still_holds_when_the_process_clock_steps_ahead(monkeypatch):
    DeliveryFactory()
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    Clock(monkeypatch, +SKEW)  # (an NTP step, or a clock set by hand)
    assert claim.holds(), "a live hold read as over: the pass would start none of its attempts"


def test_a_sweep_whose_clock_runs_ahead_does_not_dead_letter_a_row_whose_last_attempt_runs(monkeypatch):
    row = DeliveryFactory(max_attempts=1)
    Delivery.objects.claim(limit=1, hold_seconds=300)  # its last attempt, in flight elsewhere
    Clock(monkeypatch, +SKEW)
    assert Due(housekeeping.SWEEP).run()[housekeeping.DEAD_LETTER.name] == 0
    assert Delivery.objects.get(pk=row.pk).status == "pending"


def test_a_pause_in_a_process_whose_clock_runs_ahead_parks_no_row_a_live_claim_holds(monkeypatch):
    """Parking takes the claim off the row: the attempt running under it could then write nothing."""
    consumer = ConsumerFactory(name="erp")
    row = DeliveryFactory(consumer=consumer)
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    Clock(monkeypatch, +SKEW)
    service.pause(consumer, actor="ops", reason="maintenance")
    assert Due(housekeeping.SWEEP).run()[housekeeping.PARK.name] == 0
    held = Delivery.objects.get(pk=row.pk)
    assert (held.status, held.claim_token) == ("pending", claim.token)


@pytest.mark.parametrize("off", [-SKEW, +SKEW], ids=["lagging", "ahead"])
def test_what_is_due_and_what_falls_due_soon_are_read_by_the_databases_clock(off, monkeypatch):
    """A row due in a second, by the database's clock: not due yet, and a run of passes lingers
    for it (idle_wait), as does a leading drain for a registration (owed): whatever the process's
    clock says."""
    soon = timezone.now() + timedelta(seconds=1)
    row = DeliveryFactory(next_attempt_at=soon)
    RegistrationFactory(next_attempt_at=soon)
    Clock(monkeypatch, off)
    assert not Delivery.objects.due().filter(pk=row.pk).exists()
    wait = SWEEPING.idle_wait({}, linger=10)
    assert wait is not None and 0 < wait <= 1, wait
    assert drain.DRAINING.owed()


def test_a_row_given_back_by_a_process_whose_clock_runs_ahead_is_due_at_once(monkeypatch):
    row = DeliveryFactory()
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    clock = Clock(monkeypatch, +SKEW)
    assert Delivery.objects.release(token=claim.token) == 1
    clock.off = timedelta(0)
    assert [d.pk for d in Delivery.objects.claim(limit=1).rows] == [row.pk]


STEPPING: dict = {"clock": None, "seen": []}  # what steps_the_clock_ahead steps, and what it saw


def steps_the_clock_ahead(event, delivery_id):
    """A Python consumer during whose first call the process's clock steps ten minutes ahead."""
    STEPPING["seen"].append(delivery_id)
    if len(STEPPING["seen"]) == 1:
        STEPPING["clock"].off = SKEW


@pytest.mark.django_db(transaction=True)  # (the consumer runs on a thread of its own)
def test_a_pass_whose_process_clock_steps_ahead_starts_every_attempt_it_holds(settings, monkeypatch):
    settings.ODAL_PYTHON_CONSUMERS = (*settings.ODAL_PYTHON_CONSUMERS, f"{__name__}.steps_the_clock_ahead")
    consumer = ConsumerFactory(target=f"{__name__}.steps_the_clock_ahead")
    for _ in range(3):
        DeliveryFactory(consumer=consumer)
    monkeypatch.setitem(STEPPING, "clock", Clock(monkeypatch))
    monkeypatch.setitem(STEPPING, "seen", [])
    report = sweep_once()
    assert (report.claimed, report.delivered, report.not_started) == (3, 3, 0), report
    assert len(STEPPING["seen"]) == 3


def test_a_drain_pass_whose_process_clock_runs_ahead_sends_what_it_claimed(registry_sim, monkeypatch):
    """The drain times its hold from the claim (monotonic), not by reading the wall clock against
    the database's end of the hold: ahead by more than the hold, it would give every row back."""
    RegistrationFactory()
    Clock(monkeypatch, +SKEW)
    report = drain.drain_once()
    assert (report.claimed, report.not_started) == (1, 0), report
    assert len(registry_sim.requests) == 1
