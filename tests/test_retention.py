"""Issue 13.1: retention. Settled rows older than their period go, in bounded batches, each its
own transaction with its tally; pending and claimed rows, passports, registrations and the
audit trail stay; counters never go down. Issue 23.6: the registry's evidence has its own
period, and retention always makes progress (each walk resumes where it stopped, with its own
share of a run's time)."""

import io
import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.test import Client
from django.utils import timezone
from django_q.models import Schedule

from odal.core import tally
from odal.core.cli import Progress
from odal.core.models import AuditEntry, Heartbeat, Passport, RetentionPosition
from outbox import retention, tasks
from outbox.models import Delivery, DeliveryAttempt, Event
from outbox.service import outbox_counts
from registry.models import Registration, RegistrationAttempt
from tests.factories import ConsumerFactory, DeliveryFactory, EventFactory, RegistrationFactory
from tests.test_settings import refusal

pytestmark = pytest.mark.django_db

NOW = timezone.now()
DELIVERED_BEFORE = NOW - timedelta(days=30)
DEAD_BEFORE = NOW - timedelta(days=90)
OLD = NOW - timedelta(days=40)  # past the delivered period, within the dead one
ANCIENT = NOW - timedelta(days=100)  # past both
YOUNG = NOW - timedelta(days=1)
EVIDENCE_BEFORE = NOW - timedelta(days=3650)
FORGOTTEN = NOW - timedelta(days=3660)  # past the evidence period too
ORDINARY = ["registered", "rejected"]
EVIDENCE = ["abandoned", "suspended", "deactivated"]


def purge(**options) -> retention.PurgeReport:
    cutoffs = {
        "delivered_before": DELIVERED_BEFORE,
        "dead_before": DEAD_BEFORE,
        "evidence_before": EVIDENCE_BEFORE,
    }
    return retention.purge(**{**cutoffs, **options})


def delivered(at=OLD, *, created=None, lines=1, **fields) -> Delivery:
    """A delivered delivery (delivered at `at`, created just before) with `lines` attempt lines."""
    created = created or at - timedelta(minutes=5)
    row = DeliveryFactory(
        **{"status": "delivered", "delivered_at": at, "created_at": created, "attempts": lines, **fields},
        event=EventFactory(created_at=created),
    )
    add_lines(row, lines, at)
    return row


def dead(at=ANCIENT, *, created=None, lines=3, **fields) -> Delivery:
    created = created or at - timedelta(hours=2)
    row = DeliveryFactory(
        **{"status": "dead", "dead_at": at, "created_at": created, "attempts": lines, **fields},
        last_error="HTTP 500",
        event=EventFactory(created_at=created),
    )
    add_lines(row, lines, at, outcome="failed")
    return row


def pending(*, created=ANCIENT, lines=1, **fields) -> Delivery:
    row = DeliveryFactory(
        created_at=created, attempts=lines, event=EventFactory(created_at=created), **fields
    )
    add_lines(row, lines, created, outcome="failed")
    return row


def add_lines(row: Delivery, n: int, at, outcome="delivered") -> None:
    for number in range(1, n + 1):
        DeliveryAttempt.objects.create(
            delivery=row,
            number=number,
            claim_token=uuid.uuid4(),
            started_at=at - timedelta(seconds=1),
            finished_at=at,
            outcome=outcome if number == n else "failed",
        )


def registry_lines(status: str, at=OLD, n: int = 2, **fields) -> Registration:
    """A registration with `n` attempt lines that finished at `at`, of the work it owes (or owed)
    now: queued an hour before."""
    reg = RegistrationFactory(**{"status": status, "queued_at": at - timedelta(hours=1), **fields})
    add_registry_lines(reg, at, n)
    return reg


def add_registry_lines(reg: Registration, at, n: int = 2) -> set:
    made = set()
    for number in range(1, n + 1):
        made.add(
            RegistrationAttempt.objects.create(
                registration=reg,
                number=number,
                claim_token=uuid.uuid4(),
                operation="register",
                started_at=at - timedelta(seconds=1),
                finished_at=at,
                outcome="submitted",
            ).pk
        )
    return made


def exists(row) -> bool:
    return type(row).objects.filter(pk=row.pk).exists()


def lines_of(row: Delivery) -> int:
    return DeliveryAttempt.objects.filter(delivery=row).count()


# -- delivered deliveries -------------------------------------------------------------------------


def test_delivered_deliveries_past_the_period_go_with_their_attempt_lines_and_events():
    old = delivered(OLD, lines=2)
    report = purge()
    assert not exists(old) and lines_of(old) == 0
    assert not exists(old.event)
    assert (report.deliveries, report.attempts, report.events, report.registry_attempts) == (1, 2, 1, 0)


def test_the_delivered_rule_keeps_young_pending_and_claimed_rows_and_their_lines():
    young = delivered(YOUNG)
    late = delivered(YOUNG, created=OLD)  # created long ago, delivered only yesterday
    resent = delivered(OLD, status="pending")  # delivered once, due again (a resend)
    waiting = pending()  # never delivered, however old
    claimed = pending(claim_token=uuid.uuid4(), next_attempt_at=NOW + timedelta(minutes=5))
    held = delivered(OLD, claim_token=uuid.uuid4())  # no writer leaves one, but a claim is a claim
    purge()
    for row in (young, late, resent, waiting, claimed, held):
        assert exists(row), row.status
        assert lines_of(row) == 1
        assert exists(row.event)


def test_a_delivery_exactly_at_the_cutoff_stays():
    at_cutoff = delivered(DELIVERED_BEFORE)
    assert purge().deliveries == 0
    assert exists(at_cutoff)


# -- dead deliveries ------------------------------------------------------------------------------


def test_dead_deliveries_go_after_their_own_longer_period():
    ancient = dead(ANCIENT)
    old = dead(OLD)  # past the delivered period but not the dead one: a person may still need it
    report = purge()
    assert not exists(ancient) and lines_of(ancient) == 0 and not exists(ancient.event)
    assert exists(old) and lines_of(old) == 3 and exists(old.event)
    assert (report.deliveries, report.attempts, report.events) == (1, 3, 1)


def test_the_dead_rule_keeps_replayed_and_claimed_rows():
    replayed = dead(ANCIENT, status="pending")  # dead once, pending again (a resend keeps dead_at)
    claimed = dead(ANCIENT, claim_token=uuid.uuid4())
    purge()
    for row in (replayed, claimed):
        assert exists(row) and lines_of(row) == 3 and exists(row.event)


# -- events ---------------------------------------------------------------------------------------


def test_old_events_without_deliveries_go_young_ones_and_ones_with_deliveries_stay():
    bare = EventFactory(created_at=OLD)  # never had a delivery (no consumer wanted it)
    young_bare = EventFactory(created_at=YOUNG)
    shared = EventFactory(created_at=OLD)  # one delivery goes, the other is still pending
    consumers = ConsumerFactory.create_batch(2)
    gone = DeliveryFactory(
        event=shared, consumer=consumers[0], status="delivered", delivered_at=OLD, created_at=OLD
    )
    left = DeliveryFactory(event=shared, consumer=consumers[1], created_at=OLD)
    report = purge()
    assert not exists(bare) and not exists(gone)
    assert exists(young_bare) and exists(shared) and exists(left)
    assert report.events == 1


# -- the registry's attempt lines -----------------------------------------------------------------


@pytest.mark.parametrize("status", ORDINARY)
def test_old_attempt_lines_of_registered_or_rejected_registrations_go_the_registrations_stay(status):
    reg = registry_lines(status, OLD)
    young = registry_lines(status, YOUNG)
    report = purge()
    assert report.registry_attempts == 2
    assert not reg.attempt_log.exists()
    assert young.attempt_log.count() == 2
    assert Registration.objects.filter(pk__in=[reg.pk, young.pk]).count() == 2
    assert Passport.objects.filter(pk__in=[reg.passport_id, young.passport_id]).count() == 2


@pytest.mark.parametrize("status", ["pending", "submitted"])
def test_attempt_lines_of_registrations_that_owe_work_stay(status):
    reg = registry_lines(status, ANCIENT)
    assert purge().registry_attempts == 0
    assert reg.attempt_log.count() == 2


def test_attempt_lines_of_a_claimed_registration_stay():
    reg = registry_lines("registered", ANCIENT, claim_token=uuid.uuid4())
    assert purge().registry_attempts == 0
    assert reg.attempt_log.count() == 2


@pytest.mark.parametrize("status", EVIDENCE)
def test_attempt_lines_of_registrations_that_ended_without_a_registration_are_kept_as_evidence(status):
    kept = [registry_lines(status, at) for at in (OLD, ANCIENT, EVIDENCE_BEFORE)]  # the last at the cutoff
    forgotten = registry_lines(status, FORGOTTEN)
    assert purge().registry_attempts == 2
    assert all(reg.attempt_log.count() == 2 for reg in kept)
    assert not forgotten.attempt_log.exists() and exists(forgotten)


@pytest.mark.parametrize("status", ORDINARY)
def test_lines_of_earlier_work_stay_as_evidence_when_a_registration_was_queued_again(status):
    """Abandoned, say, then published again (queued afresh) and now registered or rejected: its
    status no longer says how the earlier work ended, so the lines of that work are evidence."""
    reg = registry_lines(status, ANCIENT)  # the earlier work
    earlier = set(reg.attempt_log.values_list("pk", flat=True))
    Registration.objects.filter(pk=reg.pk).update(queued_at=OLD - timedelta(hours=1))
    add_registry_lines(reg, OLD)  # the current work's
    assert purge().registry_attempts == 2
    assert set(reg.attempt_log.values_list("pk", flat=True)) == earlier
    assert purge(evidence_before=OLD).registry_attempts == 2  # past the evidence period: they go too
    assert not reg.attempt_log.exists()


def test_evidence_is_never_kept_shorter_than_ordinary_lines():
    young = registry_lines("abandoned", NOW - timedelta(days=20))
    old = registry_lines("abandoned", OLD)
    assert purge(evidence_before=NOW - timedelta(days=10)).registry_attempts == 2
    assert young.attempt_log.count() == 2 and not old.attempt_log.exists()


def test_passports_registrations_and_the_audit_trail_are_never_deleted():
    reg = registry_lines("registered", ANCIENT)
    AuditEntry.objects.record(actor="system", action="delivery_replayed", object_id="x")
    delivered(ANCIENT)
    dead(ANCIENT)
    before = (Passport.objects.count(), Registration.objects.count(), AuditEntry.objects.count())
    everything = NOW + timedelta(days=1)  # every settled row is past this cutoff
    report = retention.purge(delivered_before=everything, dead_before=everything, evidence_before=everything)
    assert (report.deliveries, report.registry_attempts) == (2, 2)
    assert (Passport.objects.count(), Registration.objects.count(), AuditEntry.objects.count()) == before
    assert exists(reg) and exists(reg.passport)


# -- batches --------------------------------------------------------------------------------------


def world_in_one_instant():
    """Ten delivered and ten dead rows sharing one created_at / dead_at (a batch settles together),
    interleaved with rows that stay."""
    consumers = ConsumerFactory.create_batch(10)
    event = EventFactory(created_at=ANCIENT)
    for consumer in consumers:
        DeliveryFactory(
            event=event, consumer=consumer, status="delivered", delivered_at=OLD, created_at=ANCIENT
        )
    dead_event = EventFactory(created_at=ANCIENT)
    for consumer in consumers:
        DeliveryFactory(
            event=dead_event, consumer=consumer, status="dead", dead_at=ANCIENT, created_at=ANCIENT
        )
    keep = [pending(created=ANCIENT), delivered(YOUNG, created=ANCIENT), dead(OLD)]
    return keep


def test_batches_are_bounded():
    event = EventFactory(created_at=OLD)
    for consumer in ConsumerFactory.create_batch(10):
        DeliveryFactory(event=event, consumer=consumer, status="delivered", delivered_at=OLD, created_at=OLD)
    calls = []
    report = purge(batch=3, progress=calls.append)
    assert (report.deliveries, report.events) == (10, 1)
    assert report.batches == 4 + 1  # the deliveries 3 + 3 + 3 + 1, then the event
    assert calls == [3, 6, 9, 10, 11]


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_any_batch_size_takes_the_same_rows_and_keeps_the_same(batch):
    keep = world_in_one_instant()
    report = purge(batch=batch)
    assert (report.deliveries, report.attempts, report.events) == (20, 0, 2)
    assert set(Delivery.objects.values_list("pk", flat=True)) == {row.pk for row in keep}
    assert set(Event.objects.values_list("pk", flat=True)) == {row.event_id for row in keep}
    assert all(lines_of(row) for row in keep)
    if batch == 1000:
        assert report.batches == 3


def test_the_time_limit_stops_between_batches():
    world_in_one_instant()
    report = purge(batch=3, max_seconds=0)
    assert (report.rows, report.batches, report.finished) == (0, 0, False)
    assert "time limit" in report.summary()


def test_each_batch_is_its_own_transaction(monkeypatch):
    rows = sorted((row.created_at, row.pk) for row in [delivered(OLD) for _ in range(5)])
    real, seen = retention._pick, []

    def fails_on_the_third(*args, **kwargs):
        seen.append(1)
        if len(seen) == 3:
            raise RuntimeError("database went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(retention, "_pick", fails_on_the_third)
    with pytest.raises(RuntimeError):
        purge(batch=2)
    assert Delivery.objects.count() == 1  # the first two batches were kept
    assert tally.totals(retention.PURGED)[retention.PURGED]["deliveries"] == 4
    assert position("delivered") == (rows[3][0], str(rows[3][1]))  # the third stretch is unclaimed


def test_the_tally_and_the_deletion_commit_together(monkeypatch):
    row = delivered(OLD)

    def refuse(*args, **kwargs):
        raise RuntimeError("tally refused")

    monkeypatch.setattr(tally, "bump", refuse)
    with pytest.raises(RuntimeError):
        purge()
    assert exists(row) and lines_of(row) == 1


# -- the guarded DELETE: a row that changed after it was picked stays -------------------------------


def change_after_picking(monkeypatch, picked: set, change):
    """Run `change` (in the purge's transaction, which holds the row locks) once a batch has
    picked one of `picked`, before that batch deletes."""
    real, done = retention._pick, []

    def picked_then_changed(*args, **kwargs):
        found = real(*args, **kwargs)
        if not done and picked & set(found):
            change()
            done.append(True)
        return found

    monkeypatch.setattr(retention, "_pick", picked_then_changed)


@pytest.mark.parametrize(
    "make, change",
    [
        (lambda: delivered(OLD), {"status": "pending", "next_attempt_at": NOW}),  # resent
        (lambda: delivered(OLD), {"claim_token": uuid.uuid4()}),
        (lambda: delivered(OLD), {"delivered_at": NOW}),
        (lambda: dead(ANCIENT), {"status": "pending", "attempts": 0, "next_attempt_at": NOW}),  # replayed
        (lambda: dead(ANCIENT), {"claim_token": uuid.uuid4()}),
        (lambda: dead(ANCIENT), {"dead_at": NOW}),
    ],
    ids=[
        "delivered-resent",
        "delivered-claimed",
        "delivered-again",
        "dead-replayed",
        "dead-claimed",
        "dead-again",
    ],
)
def test_a_delivery_that_changed_after_it_was_picked_stays_with_its_lines(monkeypatch, make, change):
    row = make()
    before = lines_of(row)
    change_after_picking(monkeypatch, {row.pk}, lambda: Delivery.objects.filter(pk=row.pk).update(**change))
    report = purge()
    assert exists(row) and lines_of(row) == before
    assert exists(row.event)
    assert (report.deliveries, report.attempts) == (0, 0)
    assert tally.totals(retention.PURGED)[retention.PURGED] == {}


def test_an_event_that_got_a_delivery_after_it_was_picked_stays(monkeypatch):
    event = EventFactory(created_at=OLD)
    change_after_picking(monkeypatch, {event.pk}, lambda: DeliveryFactory(event=event))
    assert purge().events == 0
    assert exists(event)


def test_registry_lines_of_a_registration_queued_again_after_they_were_picked_stay(monkeypatch):
    reg = registry_lines("rejected", OLD)
    lines = set(reg.attempt_log.values_list("pk", flat=True))
    change_after_picking(
        monkeypatch, lines, lambda: Registration.objects.filter(pk=reg.pk).update(status="pending")
    )
    assert purge().registry_attempts == 0
    assert reg.attempt_log.count() == 2


# -- locks ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_row_another_transaction_holds_is_skipped_not_waited_on():
    locked, free = delivered(OLD), delivered(OLD)
    holding, release = threading.Event(), threading.Event()

    def replayer():
        with transaction.atomic():
            list(Delivery.objects.filter(pk=locked.pk).select_for_update())
            holding.set()
            release.wait(10)
        connections.close_all()

    thread = threading.Thread(target=replayer)
    thread.start()
    try:
        assert holding.wait(10)
        with connection.cursor() as cursor:  # without SKIP LOCKED the purge would wait, then fail
            cursor.execute("SET lock_timeout = '2s'")
        started = time.monotonic()
        report = purge()
        assert time.monotonic() - started < 2
    finally:
        release.set()
        thread.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert (report.deliveries, report.events) == (1, 1)
    assert not exists(free)
    assert exists(locked) and lines_of(locked) == 1 and exists(locked.event)
    assert purge().deliveries == 1  # the next run takes it


# -- counters -------------------------------------------------------------------------------------


def scrape() -> dict[str, float]:
    samples = {}
    for line in Client().get("/metrics").content.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_counters_stay_where_they_were_and_purged_goes_up_by_what_went():
    for _ in range(3):
        delivered(OLD, lines=2)
    delivered(YOUNG)
    dead(OLD)  # young for the dead period: the dead count stays too
    registry_lines("registered", OLD)
    before, counts_before = scrape(), outbox_counts()

    report = purge()

    after, counts_after = scrape(), outbox_counts()
    assert (report.deliveries, report.attempts, report.events, report.registry_attempts) == (3, 6, 3, 2)
    assert counts_after == counts_before
    counters = [n for n in before if n.startswith(("outbox_deliveries{", "outbox_attempts_total{"))]
    assert len(counters) == 5 * 4 + 2  # five consumers by four statuses, two outcomes
    assert {n: after[n] for n in counters} == {n: before[n] for n in counters}
    assert sum(before[n] for n in counters if 'status="delivered"' in n) == 4
    purged = {n: after[n] - before[n] for n in after if n.startswith("outbox_purged_total")}
    assert purged == {
        'outbox_purged_total{what="deliveries"}': 3,
        'outbox_purged_total{what="attempts"}': 6,
        'outbox_purged_total{what="events"}': 3,
        'outbox_purged_total{what="registry_attempts"}': 2,
    }


# -- dry run --------------------------------------------------------------------------------------


def test_a_dry_run_counts_what_a_purge_then_deletes_and_deletes_nothing():
    world_in_one_instant()
    for _ in range(3):
        delivered(OLD, lines=2)
    registry_lines("rejected", OLD)
    registry_lines("abandoned", OLD)  # evidence: kept
    registry_lines("pending", OLD)
    rows = (Delivery.objects.count(), DeliveryAttempt.objects.count(), Event.objects.count())
    lines = RegistrationAttempt.objects.count()

    dry = purge(batch=4, dry_run=True)

    assert (Delivery.objects.count(), DeliveryAttempt.objects.count(), Event.objects.count()) == rows
    assert RegistrationAttempt.objects.count() == lines
    assert tally.totals(retention.PURGED)[retention.PURGED] == {}
    assert dry.summary().startswith("would delete")
    real = purge(batch=4)
    assert (dry.deliveries, dry.attempts, dry.events, dry.registry_attempts) == (
        real.deliveries,
        real.attempts,
        real.events,
        real.registry_attempts,
    )
    assert (real.deliveries, real.attempts, real.events, real.registry_attempts) == (23, 6, 5, 2)


# -- the schedule ---------------------------------------------------------------------------------


def test_migrations_schedule_the_purge_every_10_minutes():
    schedule = Schedule.objects.get(name="outbox purge")
    assert (schedule.func, schedule.schedule_type, schedule.minutes, schedule.repeats) == (
        "outbox.tasks.purge",
        Schedule.MINUTES,
        10,
        -1,
    )


def test_the_scheduled_task_reads_the_periods_logs_and_bumps(settings, caplog):
    settings.ODAL_RETENTION_DAYS = 30
    settings.ODAL_DEAD_RETENTION_DAYS = 90
    old, young = delivered(OLD), delivered(YOUNG)
    kept_dead, gone_dead = dead(OLD), dead(ANCIENT)
    Heartbeat.objects.create(role=tally.SWEEP, worker="gone:1", at=NOW - timedelta(days=8))
    Heartbeat.objects.create(role=tally.SWEEP, worker="here:1", at=NOW)

    with caplog.at_level(logging.INFO, logger="outbox.retention"):
        # The cutoffs come from the clock as the task runs, which may be either side of midnight.
        ran = [timezone.now()]
        said = tasks.purge()
        ran.append(timezone.now())

    assert said.startswith("deleted 2 deliveries with 4 attempt lines, 2 events and 0 registry attempt lines")
    [logged] = [r.getMessage() for r in caplog.records if r.name == "outbox.retention"]
    assert any(
        logged.startswith(f"{said} (delivered before {at - timedelta(days=30):%Y-%m-%d}") for at in ran
    )
    assert any(f"dead before {at - timedelta(days=90):%Y-%m-%d}" in logged for at in ran)
    assert logged.endswith("forgot 1 idle workers")
    assert tally.totals(retention.PURGED)[retention.PURGED] == {"deliveries": 2, "attempts": 4, "events": 2}
    assert not exists(old) and not exists(gone_dead)
    assert exists(young) and exists(kept_dead)
    assert list(Heartbeat.objects.values_list("worker", flat=True)) == ["here:1"]


def test_the_periods_come_from_the_settings(settings):
    settings.ODAL_RETENTION_DAYS = 50
    settings.ODAL_DEAD_RETENTION_DAYS = 200
    old, ancient = delivered(OLD), dead(ANCIENT)
    tasks.purge()
    assert exists(old) and exists(ancient)


def test_the_evidence_period_comes_from_its_setting_and_is_logged(settings, caplog):
    settings.ODAL_EVIDENCE_RETENTION_DAYS = 35
    gone, kept = registry_lines("abandoned", OLD), registry_lines("suspended", NOW - timedelta(days=33))
    ordinary = registry_lines("registered", NOW - timedelta(days=33))
    with caplog.at_level(logging.INFO, logger="outbox.retention"):
        ran = [timezone.now()]
        tasks.purge()
        ran.append(timezone.now())
    assert not gone.attempt_log.exists() and not ordinary.attempt_log.exists()
    assert kept.attempt_log.count() == 2
    [logged] = [r.getMessage() for r in caplog.records if r.name == "outbox.retention"]
    assert any(f"registry evidence before {at - timedelta(days=35):%Y-%m-%d}" in logged for at in ran)


def test_an_evidence_period_shorter_than_the_ordinary_one_is_the_ordinary_one(settings, caplog):
    settings.ODAL_EVIDENCE_RETENTION_DAYS = 5
    kept = registry_lines("deactivated", NOW - timedelta(days=20))
    with caplog.at_level(logging.INFO, logger="outbox.retention"):
        ran = [timezone.now()]
        tasks.purge()
        ran.append(timezone.now())
    assert kept.attempt_log.count() == 2
    [logged] = [r.getMessage() for r in caplog.records if r.name == "outbox.retention"]
    assert any(f"registry evidence before {at - timedelta(days=30):%Y-%m-%d}" in logged for at in ran)


# -- the command line -----------------------------------------------------------------------------


def run(*args) -> str:
    out = io.StringIO()
    call_command("outbox", "purge", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_command_purges_and_says_what_went_and_the_cutoffs():
    delivered(OLD, lines=2)
    dead(ANCIENT)
    said = run("--older-than", "30d")
    assert said.startswith(
        "Deleted 2 deliveries with 5 attempt lines, 2 events and 0 registry attempt lines in "
    )
    assert "delivered older than 30d (before " in said and "dead older than 90d (before " in said
    assert Delivery.objects.count() == 0


def test_the_command_dry_run_deletes_nothing():
    delivered(OLD)
    said = run("--older-than", "30d", "--dead-older-than", "90d", "--dry-run", "--batch", "10")
    assert said.startswith(
        "Would delete 1 delivery with 1 attempt line, 1 event and 0 registry attempt lines"
    )
    assert "Nothing was deleted" in said
    assert Delivery.objects.count() == 1


def test_the_command_defaults_to_the_settings(settings):
    settings.ODAL_RETENTION_DAYS = 50
    delivered(OLD)
    assert run().startswith("Deleted 0 deliveries")
    assert "older than 50d" in run()
    assert "registry evidence older than 3650d (before " in run()


def test_the_command_takes_the_evidence_period():
    gone, kept = registry_lines("abandoned", OLD), registry_lines("abandoned", NOW - timedelta(days=33))
    said = run("--evidence-older-than", "35d")
    assert said.startswith("Deleted 0 deliveries with 0 attempt lines, 0 events and 2 registry attempt lines")
    assert "registry evidence older than 35d (before " in said
    assert not gone.attempt_log.exists() and kept.attempt_log.count() == 2
    assert "registry evidence older than 40d (before " in run(
        "--older-than", "40d", "--evidence-older-than", "1d"
    )


@pytest.mark.parametrize(
    "option, value",
    [
        ("--older-than", "0d"),
        ("--older-than", "30"),
        ("--older-than", "-1d"),
        ("--older-than", "36501d"),
        ("--older-than", "soon"),
        ("--dead-older-than", "1.5d"),
        ("--dead-older-than", "30s"),
        ("--evidence-older-than", "10y"),
        ("--evidence-older-than", "3650"),
        ("--batch", "0"),
    ],
)
def test_the_command_refuses_a_bad_duration_with_exit_2(option, value):
    row = delivered(OLD)
    with pytest.raises(CommandError) as refused:
        run(option, value)
    assert refused.value.returncode == 2
    assert "Traceback" not in str(refused.value) and len(str(refused.value).split()) >= 5
    assert exists(row)


# -- progress -------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_one_line_on_a_terminal_and_blanks_it_out():
    screen = Terminal()
    with Progress(screen, total=10, what="rows") as progress:
        progress(10)
    drawn = screen.getvalue()
    assert drawn.startswith("\r[" + "#" * Progress.WIDTH + "] 100%  10 of 10 rows")
    assert drawn.endswith("\r") and "\n" not in drawn


def test_progress_without_a_total_counts_and_is_silent_off_a_terminal():
    screen, pipe = Terminal(), io.StringIO()
    Progress(screen, what="rows deleted")(1234)
    Progress(pipe)(1234)
    assert screen.getvalue().startswith("\r1,234 rows deleted")
    assert pipe.getvalue() == ""


# -- settings -------------------------------------------------------------------------------------


def test_the_periods_default_to_30_and_90_days_and_evidence_to_ten_years():
    assert (django_settings.ODAL_RETENTION_DAYS, django_settings.ODAL_DEAD_RETENTION_DAYS) == (30, 90)
    assert django_settings.ODAL_EVIDENCE_RETENTION_DAYS == 3650


@pytest.mark.parametrize(
    "name, value",
    [
        ("ODAL_RETENTION_DAYS", "0"),
        ("ODAL_RETENTION_DAYS", "-1"),
        ("ODAL_RETENTION_DAYS", "1.5"),
        ("ODAL_DEAD_RETENTION_DAYS", "thirty"),
        ("ODAL_DEAD_RETENTION_DAYS", "36501"),
        ("ODAL_EVIDENCE_RETENTION_DAYS", "0"),
        ("ODAL_EVIDENCE_RETENTION_DAYS", "ten years"),
        ("ODAL_EVIDENCE_RETENTION_DAYS", "36501"),
    ],
)
def test_a_nonsense_period_stops_start_up_naming_the_variable(name, value):
    assert name in refusal(**{name: value})


# -- progress: each walk resumes where it stopped, and has its own share of a run's time ----------


class Clock:
    """retention's clock (time.monotonic, time.sleep) for a test: each stretch of an index the purge
    walks takes one second, and a rest takes what it asks, whatever the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock, real = Clock(), retention._walk_step

    def one_second_a_stretch(*args, **kwargs):
        clock.now += 1.0
        return real(*args, **kwargs)

    monkeypatch.setattr(retention, "time", clock)
    monkeypatch.setattr(retention, "_walk_step", one_second_a_stretch)
    return clock


def kept_front(n: int) -> None:
    """`n` deliveries older than everything else that retention must keep, each with its event:
    dead letters dead only yesterday (young for their period), as a consumer that was broken for
    weeks, then replayed and dead again, leaves them."""
    consumer = ConsumerFactory()
    events = Event.objects.bulk_create(
        Event(type="passport.published", created_at=ANCIENT + timedelta(seconds=i)) for i in range(n)
    )
    Delivery.objects.bulk_create(
        Delivery(
            event=e, consumer=consumer, status="dead", dead_at=YOUNG, attempts=3, created_at=e.created_at
        )
        for e in events
    )


def scheduled_runs(n: int, **options) -> list[retention.PurgeReport]:
    """`n` runs as the schedule makes them (50 s each), over stretches of 10 entries."""
    return [purge(batch=10, max_seconds=retention.SCHEDULED_SECONDS, **options) for _ in range(n)]


def test_retention_makes_progress_over_a_table_whose_oldest_rows_must_all_be_kept(clock):
    kept_front(300)  # 30 stretches at the front of the deliveries' walk and of the events' walk
    behind = [delivered(OLD) for _ in range(5)]
    ancient_dead = dead(ANCIENT)  # the front of the dead letters' walk
    bare = EventFactory(created_at=OLD)
    reg = registry_lines("registered", OLD)

    runs = scheduled_runs(6)  # a run is 25 stretches (each with its rest)

    per_run = [(r.deliveries, r.events, r.registry_attempts) for r in runs]
    said = f"deleted per run (deliveries, events, registry lines): {per_run}"
    # No walk starves: the first run reaches the dead letters and the registry's lines.
    assert (runs[0].deliveries, runs[0].registry_attempts) == (1, 2), said
    assert not exists(ancient_dead) and not reg.attempt_log.exists(), said
    # And each resumes where it stopped: what is behind the kept rows goes in a few runs.
    assert not any(exists(row) or exists(row.event) for row in behind), said
    assert not exists(bare), said
    assert (Delivery.objects.count(), Event.objects.count()) == (300, 300), said
    assert sum(r.deliveries for r in runs) == 6 and sum(r.events for r in runs) == 7, said


@pytest.fixture
def stretches(monkeypatch) -> list:
    """Every stretch the purge walks: (model, key, after, rows walked), in order."""
    walked, real = [], retention._walk_step

    def recorded(index_range, key, after, size, **kwargs):
        rows = real(index_range, key, after, size, **kwargs)
        walked.append((index_range.model, key, after, rows))
        return rows

    monkeypatch.setattr(retention, "_walk_step", recorded)
    return walked


def position(walk: str) -> tuple | None:
    """Where `walk` stopped, as the purge reads it: (key, primary key as text), None at the start."""
    return RetentionPosition.objects.where([walk])[walk][1]


def lap(walk: str) -> int:
    return RetentionPosition.objects.where([walk])[walk][0]


def place(walk: str, row, key: str = "created_at") -> None:
    """Store `walk`'s position at `row`, as a run that stopped there leaves it."""
    RetentionPosition.objects.update_or_create(
        walk=walk, defaults={"after_key": getattr(row, key), "after_id": str(row.pk), "moved_at": NOW}
    )


def test_where_a_walk_stopped_is_kept_in_the_database_and_the_next_run_starts_after_it(clock, stretches):
    kept_front(30)
    purge(batch=10, max_seconds=8)  # about a stretch for each walk
    delivered_walk = [
        (after, rows) for model, key, after, rows in stretches if key == "created_at" and model is Delivery
    ]
    last = delivered_walk[-1][1][-1]  # the last entry walked
    assert len(delivered_walk) < 3  # it stopped at its share, before its end
    assert position("delivered") == (last[0], str(last[1]))

    stretches.clear()
    purge(batch=10, max_seconds=8)  # another run, as another process starts it: only the database tells
    [(after, _), *_] = [
        (after, rows) for model, key, after, rows in stretches if key == "created_at" and model is Delivery
    ]
    assert after == last


def test_a_purge_with_time_enough_takes_everything_wherever_its_walks_stopped(stretches):
    front = [delivered(OLD - timedelta(days=1)) for _ in range(3)]
    back = [delivered(OLD) for _ in range(3)]
    middle = dead(OLD, created=OLD - timedelta(hours=12))  # kept: young for its period
    last = dead(OLD, created=OLD + timedelta(hours=1))  # kept too
    place("delivered", middle)  # a run stopped there, between the two

    report = purge(batch=3)

    assert not any(exists(row) or exists(row.event) for row in front + back)
    assert all(exists(row) and exists(row.event) for row in (middle, last))
    walked = [
        pk for model, key, _, rows in stretches if model is Delivery and key == "created_at" for _, pk in rows
    ]
    assert sorted(walked) == sorted(row.pk for row in [*front, *back, middle, last])  # each entry once
    assert report.walked == 8 + 8  # the deliveries' walk and the events'
    assert position("delivered") == (middle.created_at, str(middle.pk))  # the lap ended where it began


def test_a_row_that_becomes_purgeable_behind_a_walk_goes_when_the_walk_comes_round(clock):
    kept_front(30)
    waiting = pending(created=ANCIENT - timedelta(days=1))  # its event is the events' walk's first entry
    purge(batch=10, max_seconds=8)  # the events' walk goes past it: its delivery is pending
    assert position("events") is not None and exists(waiting.event)
    Delivery.objects.filter(pk=waiting.pk).update(status="delivered", delivered_at=OLD)  # (as time goes by)

    [run] = scheduled_runs(1)  # from where it stopped to the end, then from the start round to there

    assert not exists(waiting) and not exists(waiting.event), run.summary()


def test_a_position_past_the_end_of_its_range_wraps_to_the_start():
    old = delivered(OLD)
    young = delivered(YOUNG)
    place("delivered", young)  # e.g. left by `odal outbox purge --older-than 1h`
    place("events", young.event)
    assert purge().deliveries == 1
    assert not exists(old) and not exists(old.event) and exists(young)


def test_a_purge_that_finds_its_walk_moved_by_another_leaves_it_that_stretch_and_goes_on_after_it(
    monkeypatch,
):
    rows = sorted((delivered(OLD) for _ in range(4)), key=lambda row: (row.created_at, row.pk))
    real, moved = retention._walk_step, []

    def another_purge_claims_it_first(index_range, key, after, size, **kwargs):
        stretch = real(index_range, key, after, size, **kwargs)
        if index_range.model is Delivery and key == "created_at" and not moved:
            # Another process walked the same stretch, and claimed it before this one could.
            moved.append(
                RetentionPosition.objects.advance(
                    "delivered", lap=0, at=None, to=(stretch[-1][0], str(stretch[-1][1])), now=NOW
                )
            )
        return stretch

    monkeypatch.setattr(retention, "_walk_step", another_purge_claims_it_first)
    report = purge(batch=2)

    assert moved == [True]
    assert all(exists(row) for row in rows[:2])  # the other purge's to delete
    assert not any(exists(row) for row in rows[2:]) and report.deliveries == 2
    assert report.shared == ["delivered"]
    assert "shared delivered deliveries with another purge running at the same time" in report.summary()
    assert (lap("delivered"), position("delivered")) == (1, None)  # round to the start, once


def test_a_position_moves_only_from_where_its_writer_read_it():
    """Two purges read the same position; the first claims the stretch after it; the second's claim
    of its own stretch from the same place takes nothing and the position stays the first's."""
    a, b = delivered(OLD), delivered(OLD)
    RetentionPosition.objects.open(["delivered"], now=NOW)
    (lap_a, first), (lap_b, second) = [
        RetentionPosition.objects.where(["delivered"])["delivered"] for _ in range(2)
    ]
    to_a, to_b = (a.created_at, str(a.pk)), (b.created_at, str(b.pk))
    assert RetentionPosition.objects.advance("delivered", lap=lap_a, at=first, to=to_a, now=NOW)
    assert not RetentionPosition.objects.advance("delivered", lap=lap_b, at=second, to=to_b, now=NOW)
    assert position("delivered") == to_a


def test_a_position_read_a_whole_lap_ago_is_not_where_the_walk_is():
    """A purge read a walk at the start; another walked it all round, back to the start: the
    first one's claim from the start takes nothing (it would walk that lap again)."""
    a = delivered(OLD)
    RetentionPosition.objects.open(["delivered"], now=NOW)
    lap_read, read = RetentionPosition.objects.where(["delivered"])["delivered"]
    to_a = (a.created_at, str(a.pk))
    assert RetentionPosition.objects.advance("delivered", lap=lap_read, at=read, to=to_a, now=NOW)
    assert RetentionPosition.objects.advance("delivered", lap=lap_read, at=to_a, to=None, now=NOW)
    assert (lap("delivered"), position("delivered")) == (lap_read + 1, None)
    assert not RetentionPosition.objects.advance("delivered", lap=lap_read, at=read, to=to_a, now=NOW)
    assert (lap("delivered"), position("delivered")) == (lap_read + 1, None)


def test_a_purge_does_not_walk_again_a_lap_another_purge_walked_since_it_began(monkeypatch):
    kept = [dead(OLD, created=OLD - timedelta(hours=i)) for i in range(3)]  # kept: young dead letters
    real, others = retention._walk_step, []

    def another_purge_walks_it_all_first(index_range, key, after, size, **kwargs):
        if index_range.model is Delivery and key == "created_at" and not others:
            others.append(None)
            others[0] = purge(batch=2)  # from start to end and back to the start: lap 0 to lap 1
        return real(index_range, key, after, size, **kwargs)

    monkeypatch.setattr(retention, "_walk_step", another_purge_walks_it_all_first)
    report = purge(batch=2)

    assert others[0].walked == 3 + 3 and not others[0].shared  # the deliveries and their events
    assert report.shared == list(retention.WALKS) and report.walked == 0  # the other walked them all
    assert (lap("delivered"), position("delivered")) == (1, None)
    assert all(exists(row) for row in kept)


def test_a_dry_run_moves_no_walk(clock):
    kept_front(30)
    delivered(OLD)
    purge(batch=10, max_seconds=4)
    before = list(RetentionPosition.objects.order_by("walk").values_list())
    purge(batch=10, max_seconds=4, dry_run=True)
    purge(batch=10, dry_run=True)
    assert list(RetentionPosition.objects.order_by("walk").values_list()) == before


def test_a_dry_run_makes_no_position():
    purge(dry_run=True)
    assert not RetentionPosition.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_purges_at_once_delete_each_row_once_and_wait_for_neither():
    rows = [delivered(OLD) for _ in range(60)]
    kept = [dead(OLD) for _ in range(20)]  # young for their period
    registry_lines("rejected", OLD)
    start, reports, errors = threading.Barrier(2), [], []

    def purge_in_its_own_connection():
        try:
            with connection.cursor() as cursor:  # a wait on the other's batch is one batch at most
                cursor.execute("SET lock_timeout = '5s'")
            start.wait(10)
            reports.append(purge(batch=5))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=purge_in_its_own_connection) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(reports) == 2
    assert not any(exists(row) for row in rows) and all(exists(row) for row in kept)
    # One purge's events' walk may pass an event before the other's walk deleted its delivery:
    # such events go when the walk comes round, at the next run.
    assert [
        sum(getattr(r, what) for r in reports) for what in ("deliveries", "attempts", "registry_attempts")
    ] == [
        60,
        60,
        2,
    ]
    events = sum(r.events for r in reports)
    assert events + purge().events == 60
    assert not any(exists(row.event) for row in rows) and all(exists(row.event) for row in kept)
    went = tally.totals(retention.PURGED)[retention.PURGED]
    assert went == {"deliveries": 60, "attempts": 60, "events": 60, "registry_attempts": 2}


def test_a_walk_reset_by_a_person_while_a_purge_runs_starts_again_from_the_start_and_ends(clock, monkeypatch):
    kept = [dead(OLD, created=OLD - timedelta(hours=i)) for i in range(5)]  # young dead letters
    gone = delivered(OLD)
    RetentionPosition.objects.open(list(retention.WALKS), now=NOW)
    RetentionPosition.objects.filter(walk="delivered").update(laps=3)  # it has been round before
    place("delivered", kept[2])
    real, reset = retention._walk_step, []

    def reset_once(index_range, key, after, size, **kwargs):
        if index_range.model is Delivery and key == "created_at" and not reset:
            reset.append(RetentionPosition.objects.filter(walk="delivered").delete())  # "start again"
        return real(index_range, key, after, size, **kwargs)

    monkeypatch.setattr(retention, "_walk_step", reset_once)
    report = purge(batch=2, max_seconds=600)  # (a run that went round and round would stop here)

    assert report.finished and not exists(gone)
    assert (lap("delivered"), position("delivered")) == (1, None)  # one lap, from the start
    assert report.walked == 6 + 6  # one lap of the deliveries' walk and of the events'


def test_a_claim_that_takes_nothing_with_the_walk_unmoved_never_makes_a_purge_spin(clock, monkeypatch):
    delivered(OLD)
    monkeypatch.setattr(type(RetentionPosition.objects.all()), "advance", lambda *args, **kwargs: False)
    report = purge(batch=2, max_seconds=600)
    assert report.finished and report.walked == 0 and report.rows == 0
    assert clock.now < 10  # one stretch of each walk, each claim refused
