"""The concurrent drain against the registry simulator over real HTTP: up to
ODAL_REGISTRY_CONCURRENCY requests in flight, every outcome still written by the guarded write of
its own claim, no request after a claim's hold, and the registry's pace (a rate limit and the
pauses a 429 asks for) shared through the database by every drain process, two real ones here.

The drain's request threads only speak HTTP (its pass's own thread reads and writes), so a pass
runs concurrently inside a test's transaction too; the tests that commit are those where another
thread or process must see the pass's rows."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from odal.surfaces import lifecycle
from registry import adapters, pace
from registry.drain import drain_once
from registry.models import Registration, RegistrationAttempt, RegistryPace
from tests.factories import PassportFactory
from tests.waiting import wait_for


def published():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.get(passport=passport)


def our_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_a_drain_has_its_concurrency_in_flight_and_one_connection(db, registry_sim, settings):
    settings.ODAL_REGISTRY_CONCURRENCY = 4
    registry_sim.faults["latency"] = 0.3
    passports = [published() for _ in range(10)]
    before = our_connections()

    report = drain_once(batch=10)

    assert (report.claimed, report.submitted, report.late, report.not_started) == (10, 10, 0, 0)
    assert registry_sim.most_in_flight == 4  # never more, and it got there
    regs = list(Registration.objects.filter(passport__in=passports))
    assert {r.status for r in regs} == {"submitted"}
    assert {r.correlation_id for r in regs} == set(registry_sim.requests)  # ten of them, each its own
    lines = RegistrationAttempt.objects.filter(registration__in=regs)
    assert (
        sorted(lines.values_list("operation", "outcome", "late")) == [("register", "submitted", False)] * 10
    )
    assert our_connections() == before  # the request threads opened no database connection


@pytest.mark.django_db(transaction=True)
def test_late_answers_of_a_concurrent_pass_write_nothing_over_another_claim_or_an_abandon(
    registry_sim, settings
):
    """Pass A has three registers in flight when its hold runs out; B claims two of the rows; one
    of them fails and a person abandons it. A's answers then land: the two rows B took get
    nothing (late), the third, which nobody took, is still A's and is written. (B taking over
    A's claims records outcomes unknown; the settle window is 0 here so the abandon may proceed.)"""
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 0
    settings.ODAL_REGISTRY_CONCURRENCY = 3
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    registry_sim.faults["latency"] = 1.6  # (the registry_sim's timeout is 2 s)
    taken, abandoned, untouched = published(), published(), published()
    reports = []

    def pass_a():
        try:
            reports.append(drain_once(batch=3))
        finally:
            connections.close_all()

    slow = threading.Thread(target=pass_a)
    slow.start()
    try:
        assert wait_for(lambda: registry_sim.in_flight == 3, 5)
        held_until = reg_of(taken).next_attempt_at
        time.sleep(max(0.0, (held_until - timezone.now()).total_seconds()) + 0.05)
        other = Registration.objects.filter(passport__in=[taken, abandoned]).claim(limit=2)
        assert len(other.rows) == 2
        rows = Registration.objects.filter(passport=abandoned)
        assert rows.mark_attempt_failed(
            token=other.token, error="HTTP 503", retry_at=timezone.now() + timedelta(minutes=5)
        )
        assert rows.abandon(actor="user:ops", reason="gone", now=timezone.now(), seen=rows.get())
        assert registry_sim.in_flight == 3  # all this while A's requests were still out
    finally:
        slow.join()

    (report,) = reports
    assert (report.submitted, report.late) == (1, 2)
    assert (reg_of(taken).status, reg_of(taken).claim_token, reg_of(taken).correlation_id) == (
        "pending", other.token, ""
    )  # fmt: skip
    assert (reg_of(abandoned).status, reg_of(abandoned).correlation_id) == ("abandoned", "")
    assert reg_of(untouched).status == "submitted"
    late = RegistrationAttempt.objects.filter(late=True)
    assert sorted(late.values_list("registration__passport", flat=True)) == sorted([taken.pk, abandoned.pk])


def test_a_concurrent_pass_starts_nothing_after_its_hold_ran_out(db, registry_sim, settings):
    """Two threads, three rows, a 1 s hold and a registry that takes 1.2 s: the third row's turn
    comes after the hold ran out. No request goes out for it; it is given back, due now."""
    settings.ODAL_REGISTRY_CONCURRENCY = 2
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    registry_sim.faults["latency"] = 1.2
    passports = [published() for _ in range(3)]

    report = drain_once(batch=3)

    assert (report.claimed, report.submitted, report.not_started) == (3, 2, 1)
    assert [c for c in registry_sim.calls if c[0] == "POST"] == [("POST", "/dpp-registration-requests")] * 2
    (waiting,) = [r for r in map(reg_of, passports) if r.status == "pending"]
    assert (waiting.attempts, waiting.claim_token) == (0, None)
    assert waiting.next_attempt_at <= timezone.now() and not waiting.attempt_log.exists()


def test_a_row_whose_turn_comes_after_the_hold_ran_out_is_not_even_planned(db, registry_sim, settings):
    """One thread, a 1 s hold and a registry that takes 1.2 s: the second row's turn comes after
    the hold. Its passport was withdrawn, so its attempt would send nothing and only write
    (withdrawn), on the pass's thread: it must not, the row may be another drain's by then."""
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    registry_sim.faults["latency"] = 1.2
    first, second = published(), published()
    Registration.objects.filter(passport=second).update(
        next_attempt_at=timezone.now() + timedelta(microseconds=1)
    )
    second.__class__.objects.filter(pk=second.pk).update(status="suspended")  # (behind the drain's back)

    report = drain_once(batch=2)

    assert (report.claimed, report.submitted, report.not_started) == (2, 1, 1)
    assert (reg_of(first).status, reg_of(second).status) == ("submitted", "pending")
    assert (reg_of(second).attempts, reg_of(second).claim_token) == (0, None)
    assert not reg_of(second).attempt_log.exists()


def test_with_a_rate_limit_a_request_whose_slot_comes_after_the_hold_is_not_started(
    db, registry_sim, settings
):
    """One request a second and a 2 s hold: of four rows claimed together, the slots of the third
    and fourth come at or after the hold's end. They are given back, never sent late."""
    settings.ODAL_REGISTRY_CONCURRENCY = 4
    settings.ODAL_CLAIM_HOLD_SECONDS = 2
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 1
    for _ in range(4):
        published()

    report = drain_once(batch=4)

    assert (report.claimed, report.submitted, report.not_started) == (4, 2, 2)
    assert len(registry_sim.arrivals) == 2
    given_back = Registration.objects.filter(status="pending")
    assert sorted(given_back.values_list("attempts", "claim_token")) == [(0, None), (0, None)]


def test_a_429_gives_the_attempt_back_and_pauses_every_drain(db, registry_sim):
    """The registry admits one request a second; the second register of a pass gets 429 with
    Retry-After. Its attempt does not count, the row is due when the pause ends, the pause is in
    the database for every drain, and a drain claims nothing while it holds."""
    registry_sim.faults.update(rate_limit=1, retry_after=3)
    first, second = published(), published()

    report = drain_once(batch=2)

    assert (report.submitted, report.rate_limited, report.failed) == (1, 1, 0)
    assert "1 rate-limited (429; given back)" in report.summary()
    limited = next(r for r in (reg_of(first), reg_of(second)) if r.status == "pending")
    assert (limited.attempts, limited.claim_token) == (0, None)
    assert "HTTP 429" in limited.last_error and "Retry-After: 3" in limited.last_error
    soon = timezone.now() + timedelta(seconds=3)
    assert abs((limited.next_attempt_at - soon).total_seconds()) < 1
    (line,) = limited.attempt_log.all()
    assert (line.number, line.outcome, line.late) == (1, "rate_limited", False)
    assert abs((RegistryPace.objects.schedule()[0] - soon).total_seconds()) < 1

    published()  # due now, but every drain waits for the pause to end
    assert drain_once().claimed == 0
    assert len(registry_sim.arrivals) == 2


def test_a_429_with_an_http_date_pauses_until_that_date(db, registry_sim):
    registry_sim.faults.update(rate_limit=1, retry_after=4, retry_after_http_date=True)
    published(), published()

    assert drain_once(batch=2).rate_limited == 1

    # An HTTP-date has whole seconds: the pause ends 3 to 4 s from now.
    left = (RegistryPace.objects.schedule()[0] - timezone.now()).total_seconds()
    assert 2.5 < left <= 4.1


def test_a_request_waiting_for_its_slot_is_not_sent_once_a_429_pauses_the_drain(db, registry_sim, settings):
    """Two requests a second, a registry that admits one: the first goes through, the second
    meets a 429, and the third, waiting for its slot on its thread, is not sent but given back."""
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 2
    registry_sim.faults.update(rate_limit=1, retry_after=3)
    for _ in range(3):
        published()

    report = drain_once(batch=3)

    assert (report.submitted, report.rate_limited, report.not_started) == (1, 1, 1)
    assert len(registry_sim.arrivals) == 2


def test_a_pass_starts_no_request_once_a_429_pauses_the_drain(db, registry_sim, settings):
    """One request at a time and a rate limit: after the 429, the rows still waiting are given
    back at once, not booked a slot after the pause and held through it."""
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 100
    registry_sim.faults.update(rate_limit=1, retry_after=3)
    for _ in range(4):
        published()

    report = drain_once(batch=4)

    assert (report.submitted, report.rate_limited, report.not_started) == (1, 1, 2)
    assert len(registry_sim.arrivals) == 2


@pytest.mark.django_db(transaction=True)
def test_a_pause_another_process_writes_stops_a_request_waiting_for_its_slot(registry_sim, settings):
    """One request a second: while the second request waits for its slot, another drain process
    (here a thread with its own connection) meets a 429 and writes the pause. The pass reads it
    while it waits, and the request is not sent."""
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 1
    published(), published()

    def another_drain_meets_a_429():
        time.sleep(0.3)
        try:
            RegistryPace.objects.pause(until=timezone.now() + timedelta(seconds=5), reason="429")
        finally:
            connections.close_all()

    other = threading.Thread(target=another_drain_meets_a_429)
    other.start()
    report = drain_once(batch=2)
    other.join()

    assert (report.submitted, report.not_started) == (1, 1)
    assert len(registry_sim.arrivals) == 1


def test_a_slot_not_given_out_in_time_is_dropped_not_used_late(db):
    p = pace.Pace(rate=10)  # a booking: 2 or 3 slots, 0.1 s apart
    first = p.next_slot(time.monotonic() + 60)
    time.sleep(0.5)
    late = p.next_slot(time.monotonic() + 60)
    assert late >= time.monotonic() - pace.SLOT_LATENESS and late > first + 0.4


@pytest.mark.parametrize(
    "header, seconds",
    [
        ("2", 2.0),
        ("0.5", adapters.RETRY_AFTER_DEFAULT),  # at least a second: tests/test_hostile_16.py
        ("1.5", 1.5),
        ("0", adapters.RETRY_AFTER_DEFAULT),
        ("86400", adapters.RETRY_AFTER_CAP),
        (None, adapters.RETRY_AFTER_DEFAULT),
        ("soon", adapters.RETRY_AFTER_DEFAULT),
        ("-5", adapters.RETRY_AFTER_DEFAULT),
        ("inf", adapters.RETRY_AFTER_DEFAULT),
        ("Tue, 01 Dec 2026 12:00:30 GMT", 30.0),
        ("Tue, 01 Dec 2026 11:00:00 GMT", adapters.RETRY_AFTER_DEFAULT),  # a date gone by
        ("Wed, 02 Dec 2026 12:00:00 GMT", adapters.RETRY_AFTER_CAP),
    ],
)
def test_retry_after_is_seconds_or_an_http_date_capped(header, seconds):
    from datetime import UTC, datetime

    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert adapters.retry_after_seconds(header, now=now) == seconds


def test_a_pause_is_only_ever_lengthened(db):
    now = timezone.now()
    assert RegistryPace.objects.pause(until=now + timedelta(seconds=30), reason="429, Retry-After 30")
    assert not RegistryPace.objects.pause(until=now + timedelta(seconds=5), reason="429, Retry-After 5")
    assert RegistryPace.objects.get().pause_reason == "429, Retry-After 30"
    assert RegistryPace.objects.pause(until=now + timedelta(seconds=60), reason="429, Retry-After 60")


def test_bookings_follow_one_another_at_the_rate_and_start_after_a_pause(db):
    now = timezone.now()
    step = timedelta(milliseconds=100)
    first = RegistryPace.objects.book(slots=5, interval=step, now=now)
    second = RegistryPace.objects.book(slots=5, interval=step, now=now)
    assert (first, second) == (now, now + 5 * step)
    RegistryPace.objects.pause(until=now + timedelta(seconds=10), reason="429")
    assert RegistryPace.objects.book(slots=1, interval=step, now=now) == now + timedelta(seconds=10)
    booked = RegistryPace.objects.get().next_slot_at
    # A booking that could not start before a claim's hold ends books nothing.
    assert (
        RegistryPace.objects.book(slots=1, interval=step, now=now, before=now + timedelta(seconds=5)) is None
    )
    assert RegistryPace.objects.book(slots=1, interval=step, now=now, before=booked) is None
    assert RegistryPace.objects.get().next_slot_at == booked
    assert RegistryPace.objects.book(slots=1, interval=step, now=now, before=booked + step) == booked


def test_a_schedule_booked_past_the_hold_is_waited_for_not_pushed_further(db, registry_sim, settings):
    """Other drains booked the rate limit's schedule 100 s ahead (1/s), past a claim's 5 s hold: no
    slot this drain could book would come inside its hold. It must neither book one (each such
    slot, never used, pushes every drain further back: drains claiming again at once, as a pass
    that gave its rows back does, ran the schedule away from the clock) nor claim again and again
    meanwhile; it waits until the schedule comes within a hold."""
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 1
    settings.ODAL_CLAIM_HOLD_SECONDS = 5
    for _ in range(3):
        published()
    RegistryPace.objects.book(slots=100, interval=timedelta(seconds=1), now=timezone.now())
    booked = RegistryPace.objects.get().next_slot_at

    reports = [drain_once(batch=3) for _ in range(5)]

    assert RegistryPace.objects.get().next_slot_at == booked
    assert sum(r.claimed for r in reports) <= 3 and not registry_sim.arrivals
    assert sorted(Registration.objects.values_list("attempts", "claim_token")) == [(0, None)] * 3


def test_a_drain_claims_again_once_the_schedule_comes_within_a_hold(db, registry_sim, settings):
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 1
    settings.ODAL_CLAIM_HOLD_SECONDS = 2
    published()
    RegistryPace.objects.book(slots=3, interval=timedelta(seconds=1), now=timezone.now())

    assert pace.Pace().paused_for() > 0 and drain_once(batch=1).claimed == 0
    assert wait_for(lambda: pace.Pace().paused_for() == 0, 3)
    report = drain_once(batch=1)
    assert (report.claimed, report.submitted) == (1, 1)


# -- two real drain processes ----------------------------------------------------------------------


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def run_drains(settings, count: int, until, seconds: float, **env) -> list[str]:
    """`count` `odal registry drain` processes on the test database until `until()`; returns what
    each said when stopped."""
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_REGISTRY_URL": settings.ODAL_REGISTRY_URL,
        "ODAL_REGISTRY_TOKEN": settings.ODAL_REGISTRY_TOKEN,
        "ODAL_REGISTRY_CHECK_SECONDS": "0",
        "ODAL_BACKOFF_BASE_SECONDS": "0",
        "ODAL_KICK_SWEEP": "false",
        "ODAL_LOG_LEVEL": "ERROR",
        **env,
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "odal", "registry", "drain", "--batch", "10"],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for _ in range(count)
    ]
    try:
        wait_for(lambda: until() or any(p.poll() is not None for p in procs), seconds)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        said = []
        for p in procs:
            try:
                said.append(p.communicate(timeout=30)[0].decode(errors="replace"))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                said.append(p.communicate()[0].decode(errors="replace"))
    return said


def claimed_by(said: str) -> int:
    """The claimed count of a drain's closing line ("Stopped after N passes: M claimed, …")."""
    return int(said.rpartition("passes: ")[2].split(" claimed")[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_drain_processes_together_keep_to_the_rate_limit(registry_sim, settings):
    """ODAL_REGISTRY_RATE_PER_SECOND=40 for the deployment: two drain processes, each of which
    alone could send hundreds a second, register 60 passports (120 requests) and the registry
    never sees more than 40 a second, give or take what the pace allows (SLOT_LATENESS) and this
    busy machine's scheduling; a limit kept per process would let it see twice as many."""
    registry_sim.faults["latency"] = 0.02
    passports = [published() for _ in range(60)]
    rows = Registration.objects.filter(passport__in=passports)

    said = run_drains(
        settings, 2, lambda: not rows.exclude(status="registered").exists(), 60,
        ODAL_REGISTRY_RATE_PER_SECOND="40", ODAL_REGISTRY_CONCURRENCY="8",
    )  # fmt: skip

    assert not rows.exclude(status="registered").exists(), said
    assert all(claimed_by(s) > 0 for s in said), said  # both drains took part
    seen = registry_sim.rate_seen(window=1.0)
    assert seen["requests"] == 120 and seen["refused"] == 0
    assert seen["mostInWindow"] <= 40 * (1 + pace.SLOT_LATENESS + 0.1) + 1, seen


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_429_makes_every_drain_process_wait_its_retry_after(registry_sim, settings):
    """No rate limit of our own, and a registry that admits 20 requests a second: two drain
    processes with 4 requests in flight each soon meet 429s. After each, no request arrives until
    its Retry-After has run (but those already on their way), the 429s cost no attempt, and
    everything is registered in the end."""
    registry_sim.faults.update(latency=0.02, rate_limit=20, retry_after=1)
    passports = [published() for _ in range(24)]
    rows = Registration.objects.filter(passport__in=passports)

    said = run_drains(
        settings, 2, lambda: not rows.exclude(status="registered").exists(), 60, ODAL_REGISTRY_CONCURRENCY="4"
    )

    assert not rows.exclude(status="registered").exists(), said
    assert all(claimed_by(s) > 0 for s in said), said
    seen = registry_sim.rate_seen(window=1.0)
    assert seen["refused"] >= 1 and seen["unheeded"] == 0, seen
    lines = RegistrationAttempt.objects.filter(registration__in=rows)
    assert lines.filter(outcome="rate_limited").count() == seen["refused"]
    assert not lines.filter(outcome="failed").exists()
