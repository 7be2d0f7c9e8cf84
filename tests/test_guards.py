"""Guards of the outbox writes that no other test pins down on its own (issue 12, item 8): each
test here fails when tests/mutations.py removes the guard it names.

Some guards only matter when two connections interleave: the test then holds another
connection's write open, uncommitted, until this connection's statement waits for it, and
commits it then (HeldWrite). A few writes restate in their UPDATE what their locked read found
(a second line, should a lock not hold): those tests switch the row locks off on this connection
only, so the guard under test is the only thing between the interleaving and a wrong write."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from outbox.models import Consumer, Delivery, Failure
from registry.models import Registration
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    RegistrationFactory,
)


class HeldWrite:
    """`write` made by another connection and held uncommitted, its row locks with it, until a
    statement of this connection waits for that connection; then it commits. Use as a context
    manager around the statement that should wait."""

    def __init__(self, write, timeout: float = 10.0):
        self.write, self.timeout = write, timeout
        self.ready, self.waited_for, self.error = threading.Event(), False, None
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.write()
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    pid = cursor.fetchone()[0]
                    self.ready.set()
                    deadline = time.monotonic() + self.timeout
                    while not self.waited_for and time.monotonic() < deadline:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                            [pid],
                        )
                        self.waited_for = cursor.fetchone()[0] > 0
                        if not self.waited_for:
                            time.sleep(0.005)  # polling for the waiter, not waiting for time to pass
        except Exception as exc:  # reported by __exit__
            self.error = exc
        finally:
            self.ready.set()
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(self.timeout)
        if self.error:
            raise self.error
        return self

    def __exit__(self, *exc_info) -> None:
        self.thread.join(self.timeout)
        if self.error:
            raise self.error


@pytest.fixture
def without_row_locks(monkeypatch):
    """This connection without row locks: Django leaves out FOR UPDATE (and SKIP LOCKED). Other
    connections keep theirs."""
    monkeypatch.setattr(connection.features, "has_select_for_update", False)


def rows_of(*objects):
    return Delivery.objects.filter(pk__in=[o.pk for o in objects])


# -- mark_delivered_each: the lock and the UPDATE's own guard --------------------------------------


def claimed_pair():
    consumer = ConsumerFactory()
    first, second = DeliveryFactory(consumer=consumer), DeliveryFactory(consumer=consumer)
    claim = Delivery.objects.claim(limit=10, hold_seconds=300)
    assert {row.pk for row in claim.rows} == {first.pk, second.pk}
    return claim.token, first, second


@pytest.mark.django_db(transaction=True)
def test_the_bulk_delivered_write_reports_exactly_what_it_wrote_while_another_claim_takes_a_row():
    """Another sweep claims one of the rows (this claim's hold ran out) while the bulk write runs.
    The ids it returns are the rows it marked delivered: the other is reported late, not as
    delivered. (It reads the rows under lock; a plain read would count the row the UPDATE then
    skips.)"""
    token, first, second = claimed_pair()
    other = uuid.uuid4()

    with HeldWrite(lambda: Delivery.objects.filter(pk=second.pk).update(claim_token=other)) as held:
        taken = rows_of(first, second).mark_delivered_each(token=token, at=timezone.now())

    assert held.waited_for
    assert taken == {first.pk}
    statuses = dict(rows_of(first, second).values_list("pk", "status"))
    assert statuses == {first.pk: "delivered", second.pk: "pending"}
    assert Delivery.objects.get(pk=second.pk).claim_token == other


# -- mark_attempts_failed_each: a batch's failures in one statement, each row under the guard ------


@pytest.mark.django_db(transaction=True)
def test_the_bulk_failed_write_leaves_a_row_another_writer_settled_while_it_waited():
    """Another writer settles one of the rows and holds its lock while the batch's failures are
    written; the write waits for it, then checks the guard again on the row as it now is: the
    settled row is left as that writer left it, and reported as not taken."""
    token, first, second = claimed_pair()
    now = timezone.now()
    failures = [
        Failure(row.pk, f"HTTP 50{n}", now + timedelta(seconds=30), now)
        for n, row in enumerate([first, second])
    ]

    with HeldWrite(
        lambda: Delivery.objects.filter(pk=second.pk).mark_delivered_each(token=token, at=now)
    ) as held:
        taken = Delivery.objects.mark_attempts_failed_each(token=token, failures=failures)

    assert held.waited_for
    assert taken == {first.pk}
    rows = {row.pk: row for row in rows_of(first, second)}
    assert (rows[first.pk].status, rows[first.pk].last_error) == ("pending", "HTTP 500")
    assert (rows[second.pk].status, rows[second.pk].last_error) == ("delivered", "")


@pytest.mark.django_db
def test_a_batch_of_failures_settles_each_row_as_its_own_write_would():
    """Each row with its own error, retry time and end: one with attempts left backs off, a spent
    one dies, a paused consumer's row is parked; a row another claim holds and a settled row are
    not taken. (Each row's own values: a write that mixed them up would show here.)"""
    active, paused = ConsumerFactory(), ConsumerFactory()
    retrying = DeliveryFactory(consumer=active, max_attempts=5)
    spent = DeliveryFactory(consumer=active, max_attempts=1)
    parked = DeliveryFactory(consumer=paused, max_attempts=1)
    superseded = DeliveryFactory(consumer=active, max_attempts=5)
    settled = DeliveryFactory(consumer=active, max_attempts=5)
    claim = Delivery.objects.claim(limit=10, hold_seconds=300)
    assert len(claim.rows) == 5
    Consumer.objects.filter(pk=paused.pk).update(paused=True)
    Delivery.objects.filter(pk=superseded.pk).update(claim_token=uuid.uuid4())
    Delivery.objects.filter(pk=settled.pk).update(status="delivered", claim_token=None)
    now = timezone.now()
    rows = [retrying, spent, parked, superseded, settled]
    failures = [
        Failure(row.pk, f"error {n}", now + timedelta(minutes=n + 1), now - timedelta(seconds=n))
        for n, row in enumerate(rows)
    ]

    taken = Delivery.objects.mark_attempts_failed_each(token=claim.token, failures=failures)

    assert taken == {retrying.pk, spent.pk, parked.pk}
    after = {row.pk: row for row in Delivery.objects.all()}
    got = [
        (after[r.pk].status, after[r.pk].last_error, after[r.pk].next_attempt_at, after[r.pk].dead_at)
        for r in rows
    ]
    assert got[0] == ("pending", "error 0", now + timedelta(minutes=1), None)
    assert got[1] == ("dead", "error 1", now + timedelta(minutes=2), now - timedelta(seconds=1))
    assert got[2] == ("paused", "error 2", now + timedelta(minutes=3), None)
    assert got[3][:2] == ("pending", "") and got[4][:2] == ("delivered", "")
    assert all(after[r.pk].claim_token is None for r in rows[:3])


@pytest.mark.django_db
def test_a_batch_of_failures_is_written_in_as_many_statements_whatever_its_size():
    """The sweep's settle of a batch of failed attempts: its statements do not grow with the
    batch (one UPDATE for the failures, one INSERT for their attempt-log lines)."""
    from django.test.utils import CaptureQueriesContext

    from outbox.consumers import Outcome
    from outbox.sweep import Finished, finish_attempts

    def statements(size: int) -> int:
        consumer = ConsumerFactory(max_attempts=5)
        for _ in range(size):
            DeliveryFactory(consumer=consumer)
        claim = Delivery.objects.claim(limit=size, hold_seconds=300)
        now = timezone.now()
        finished = [
            Finished(row, Outcome(ok=False, error="HTTP 500", http_status=500), now, now)
            for row in claim.rows
        ]
        with CaptureQueriesContext(connection) as queries:
            settled = finish_attempts(claim.token, finished)
        assert len(settled.taken) == size
        return len(queries)

    few, many = statements(2), statements(100)
    assert few == many, (few, many)
    assert many / 100 <= 0.05  # (issue 26: at most 0.05 statements per failed delivery)


@pytest.mark.django_db
def test_a_batch_of_failures_keeps_to_its_queryset_whatever_the_filter():
    """The queryset's own filter is part of the guard: a row it leaves out is not taken, a
    filter that reads another table in a subquery is no join, and one that can match nothing
    takes nothing (not an error). Ids may come as text."""
    token, first, second = claimed_pair()
    now = timezone.now()
    failures = [Failure(str(row.pk), "HTTP 500", now, now) for row in (first, second)]

    assert Delivery.objects.none().mark_attempts_failed_each(token=token, failures=failures) == set()
    assert (
        Delivery.objects.filter(pk__in=[]).mark_attempts_failed_each(token=token, failures=failures) == set()
    )
    others = Delivery.objects.exclude(pk=second.pk).exclude(
        consumer_id__in=Consumer.objects.filter(paused=True)
    )
    assert others.mark_attempts_failed_each(token=token, failures=failures) == {first.pk}
    assert dict(rows_of(first, second).values_list("pk", "last_error")) == {
        first.pk: "HTTP 500",
        second.pk: "",
    }
    with pytest.raises(ValueError, match="without joins"):
        Delivery.objects.filter(consumer__paused=False).mark_attempts_failed_each(
            token=token, failures=failures
        )


# -- replay without row locks: the UPDATE's status check and the conflict refusal ------------------


@pytest.mark.django_db(transaction=True)
def test_without_row_locks_a_replay_racing_another_replay_refuses_and_writes_nothing(without_row_locks):
    """A bulk replay of two dead rows while someone replays one of them by id. Without row locks
    the bulk replay reads both as dead; its UPDATE finds one no longer dead, so it refuses
    (replay_conflict) and writes nothing: no second reset of the row the other replayed, no
    audit entry for a row it did not replay."""
    consumer = ConsumerFactory()
    first, second = DeadDeliveryFactory(consumer=consumer), DeadDeliveryFactory(consumer=consumer)

    def replay_second():
        Delivery.objects.filter(pk=second.pk).replay(actor="user:other", reason="replayed by id")
        Delivery.objects.filter(pk=second.pk).update(attempts=F("attempts") + 1)  # and a sweep claimed it

    with HeldWrite(replay_second) as held, pytest.raises(Refused) as refused:
        rows_of(first, second).replay(actor="user:bulk", reason="replay the consumer's dead letters")

    assert held.waited_for
    assert refused.value.code == "replay_conflict"
    assert Delivery.objects.get(pk=first.pk).status == "dead"
    assert Delivery.objects.get(pk=second.pk).attempts == 1  # not reset by the bulk replay
    assert list(AuditEntry.objects.values_list("actor", "object_id")) == [("user:other", str(second.pk))]


# -- the claim's UPDATE re-check -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_without_row_locks_two_claims_never_take_the_same_row(without_row_locks):
    """Another sweep claims the due row between this claim's read and its UPDATE (without row
    locks, SKIP LOCKED skips nothing). The UPDATE restates "still claimable", so this claim
    takes nothing: the row is counted once and held by one claim."""
    delivery = DeliveryFactory()
    others: list = []

    with HeldWrite(lambda: others.append(Delivery.objects.claim(limit=10, hold_seconds=300))) as held:
        mine = Delivery.objects.claim(limit=10, hold_seconds=300)

    assert held.waited_for
    assert [row.pk for row in others[0].rows] == [delivery.pk]
    assert mine.rows == []
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.claim_token) == (1, others[0].token)


# -- a write that ends an attempt leaves the row unclaimed ------------------------------------------


def _delivered_each(rows, token):
    return bool(rows.mark_delivered_each(token=token, at=timezone.now()))


def _failed_each(rows, token):
    failures = [
        Failure(row.pk, "HTTP 503", timezone.now() + timedelta(minutes=5), timezone.now()) for row in rows
    ]
    return bool(rows.mark_attempts_failed_each(token=token, failures=failures))


def _dead_lettered(rows, token):
    rows.update(next_attempt_at=timezone.now() - timedelta(seconds=1))  # the last attempt's hold ran out
    return rows.dead_letter_exhausted(now=timezone.now()) == 1


OUTBOX_ENDINGS = {
    "mark_delivered_each": _delivered_each,
    "mark_attempts_failed_each": _failed_each,
    "dead_letter_exhausted": _dead_lettered,
}


@pytest.mark.django_db
@pytest.mark.parametrize("ending", list(OUTBOX_ENDINGS))
def test_a_delivery_write_that_ends_the_attempt_leaves_the_row_unclaimed(ending):
    """Whatever ends the attempt clears its claim: the row shows no attempt in flight, and a
    second outcome reported by the same claim takes nothing."""
    delivery = DeliveryFactory(max_attempts=1 if ending == "dead_letter_exhausted" else 3)
    token = Delivery.objects.claim(limit=10, hold_seconds=300).token
    rows = rows_of(delivery)

    assert OUTBOX_ENDINGS[ending](rows, token)

    delivery.refresh_from_db()
    assert delivery.claim_token is None
    status = delivery.status
    assert not rows.mark_delivered_each(token=token, at=timezone.now())
    assert Delivery.objects.get(pk=delivery.pk).status == status


@pytest.mark.django_db
def test_a_replayed_delivery_is_not_the_late_attempts_even_if_the_dead_row_kept_its_token():
    """A replay starts the row afresh with no claim: an attempt of the claim it died under
    (reporting late) cannot end the replayed row's first attempt."""
    old_token = uuid.uuid4()
    delivery = DeadDeliveryFactory(claim_token=old_token)

    assert rows_of(delivery).replay(actor="user:ops", reason="consumer fixed") == 1

    delivery.refresh_from_db()
    assert (delivery.status, delivery.claim_token) == ("pending", None)
    assert not rows_of(delivery).mark_delivered_each(token=old_token, at=timezone.now())
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"


# -- the registry drain's writes -------------------------------------------------------------------

# write, the row it expects (status, operation, attempts), and the write with the claim's token
DRAIN_ENDINGS = {
    "mark_submitted": (
        ("pending", "register", 1),
        lambda rows, t: rows.mark_submitted(token=t, correlation_id="req-1", next_check_at=timezone.now()),
    ),
    "mark_submitted_noting": (
        ("pending", "register", 1),
        lambda rows, t: rows.mark_submitted_noting(
            token=t, correlation_id="req-1", note="adopted", next_check_at=timezone.now()
        ),
    ),
    "mark_registered": (
        ("submitted", "register", 1),
        lambda rows, t: rows.mark_registered(token=t, handle="reg-1"),
    ),
    "mark_rejected": (
        ("pending", "register", 1),
        lambda rows, t: rows.mark_rejected(token=t, errors="bad UPI"),
    ),
    "mark_deactivated": (("pending", "deactivate", 1), lambda rows, t: rows.mark_deactivated(token=t)),
    "mark_withdrawn": (("pending", "register", 1), lambda rows, t: rows.mark_withdrawn(token=t)),
    "mark_checked": (
        ("submitted", "register", 1),
        lambda rows, t: rows.mark_checked(token=t, next_check_at=timezone.now() + timedelta(minutes=1)),
    ),
    "mark_attempt_failed": (
        ("pending", "register", 1),
        lambda rows, t: rows.mark_attempt_failed(
            token=t, error="HTTP 503", retry_at=timezone.now() + timedelta(minutes=5)
        ),
    ),
    "cancel_deactivation": (
        ("pending", "deactivate", 1),
        lambda rows, t: rows.cancel_deactivation(token=t) == 1,
    ),
    "reregister": (
        ("pending", "deactivate", 2),
        lambda rows, t: rows.reregister(token=t, now=timezone.now()) == 1,
    ),
}


def held_registration(status, operation, attempts, **fields):
    return RegistrationFactory(
        status=status,
        operation=operation,
        attempts=attempts,
        claim_token=uuid.uuid4(),
        next_attempt_at=timezone.now() + timedelta(minutes=5),
        **fields,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("write", list(DRAIN_ENDINGS))
def test_every_drain_write_that_takes_its_row_leaves_it_unclaimed(write):
    """The drain's writes end the attempt: the row shows no attempt in flight afterwards (a
    failed register can be abandoned or withdrawn; a settled row is not held by anyone)."""
    expected, end = DRAIN_ENDINGS[write]
    reg = held_registration(*expected, handle="reg-1" if expected[1] == "deactivate" else "")

    assert end(Registration.objects.filter(pk=reg.pk), reg.claim_token) is True

    assert Registration.objects.get(pk=reg.pk).claim_token is None


@pytest.mark.django_db
def test_a_register_that_failed_is_found_before_a_suspend_ends_it():
    """The failed attempt gave its claim back, so suspending acts now instead of leaving it to a
    drain attempt; but the attempt was made (its request may have reached the registry), so the
    row owes a deactivation that first finds what the registry holds, due now: not suspended."""
    reg = held_registration("pending", "register", 1)
    rows = Registration.objects.filter(pk=reg.pk)
    assert rows.mark_attempt_failed(token=reg.claim_token, error="HTTP 503", retry_at=timezone.now())

    result = lifecycle.suspend(reg.passport_id, actor="user:ops")

    assert "deactivation queued" in result.detail
    after = Registration.objects.get(pk=reg.pk)
    assert (after.status, after.operation, after.handle, after.attempts, after.claim_token) == (
        "pending", "deactivate", "", 0, None
    )  # fmt: skip
    assert after.next_attempt_at <= timezone.now()


@pytest.mark.django_db
def test_a_register_never_attempted_is_withdrawn_by_a_suspend_at_once():
    """No attempt was ever claimed (or each was given back unsent): the registry cannot hold it."""
    reg = RegistrationFactory(status="pending", operation="register", attempts=0)

    result = lifecycle.suspend(reg.passport_id, actor="user:ops")

    assert "withdrawn" in result.detail
    assert Registration.objects.get(pk=reg.pk).status == "suspended"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "write, operation",
    [
        ("mark_submitted", "deactivate"),
        ("mark_submitted_noting", "deactivate"),
        ("mark_withdrawn", "deactivate"),
        ("mark_deactivated", "register"),
    ],
)
def test_a_drain_write_for_one_operation_never_takes_a_row_owing_the_other(write, operation):
    """A register's answer cannot turn an owed deactivation into a submission (or withdraw it),
    and a deactivation's answer cannot deactivate a registration that is owed, even from the
    claim that holds the row."""
    (status, _, attempts), end = DRAIN_ENDINGS[write]
    reg = held_registration(status, operation, attempts, handle="reg-1")
    before = Registration.objects.filter(pk=reg.pk).values().get()

    assert end(Registration.objects.filter(pk=reg.pk), reg.claim_token) is False

    assert Registration.objects.filter(pk=reg.pk).values().get() == before


# -- the lifecycle's writes on registrations -------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("caller", ["publish", "drain"])
def test_cancelling_a_deactivation_takes_no_row_another_claim_holds(caller):
    """Publishing cancels only a deactivation no claim holds; the drain only the one its own
    claim holds. Another claim's attempt is that attempt's to settle."""
    reg = held_registration("pending", "deactivate", 0 if caller == "publish" else 1, handle="reg-1")
    rows = Registration.objects.filter(pk=reg.pk)

    taken = (
        rows.cancel_deactivation() if caller == "publish" else rows.cancel_deactivation(token=uuid.uuid4())
    )

    assert taken == 0
    reg.refresh_from_db()
    assert (reg.status, reg.operation) == ("pending", "deactivate")


@pytest.mark.django_db
def test_suspending_while_an_attempt_holds_the_register_leaves_it_to_that_attempt():
    """The register may be on its way to the registry: the suspend does not withdraw it under
    the attempt's feet (the attempt's answer would then bounce off a suspended row, and the
    registry would hold a registration nobody deactivates); the attempt's own write settles it."""
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    claim = Registration.objects.claim(limit=1, hold_seconds=300)
    rows = Registration.objects.filter(passport=passport)

    lifecycle.suspend(passport.pk, actor="test")

    reg = rows.get()
    assert (reg.status, reg.claim_token) == ("pending", claim.token)
    assert rows.mark_submitted(token=claim.token, correlation_id="req-1", next_check_at=timezone.now())
    assert rows.get().status == "submitted"
