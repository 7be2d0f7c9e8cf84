"""The seed's three consequences (../shared/seeds/000), driven for real: real claims on PostgreSQL,
a hold that really expires, and a late writer holding an old token."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from outbox.models import Delivery
from tests.factories import ConsumerFactory, DeliveryFactory, EventFactory

pytestmark = pytest.mark.django_db

HOLD = 1  # seconds: short enough to outlive for real


def claim_one(hold=HOLD):
    claim = Delivery.objects.claim(limit=10, hold_seconds=hold)
    assert len(claim.rows) == 1, "expected to claim exactly one due delivery"
    return claim.token, claim.rows[0]


def outlive_hold():
    time.sleep(HOLD + 0.1)


def rows(delivery):
    return Delivery.objects.filter(pk=delivery.pk)


def test_late_failure_does_not_resurrect_delivered(fail):
    delivery = DeliveryFactory()
    slow_token, _ = claim_one()  # attempt A starts and stalls
    outlive_hold()
    fast_token, _ = claim_one()  # the hold expired: attempt B claims the row
    assert fast_token != slow_token
    assert rows(delivery).mark_delivered_each(token=fast_token, at=timezone.now())

    late = fail(
        delivery, token=slow_token, error="A finally threw", retry_at=timezone.now(), at=timezone.now()
    )

    assert late is False
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert delivery.last_error == ""
    assert delivery.claim_token is None
    # ...and no sweep will claim it again
    assert Delivery.objects.claim(limit=10).rows == []


def test_late_success_does_not_bury_dead(fail):
    delivery = DeliveryFactory(max_attempts=2)
    slow_token, _ = claim_one()
    outlive_hold()
    fast_token, row = claim_one()
    assert row.attempts == 2
    assert fail(delivery, token=fast_token, error="HTTP 500", retry_at=timezone.now(), at=timezone.now())
    delivery.refresh_from_db()
    assert delivery.status == "dead"

    late = rows(delivery).mark_delivered_each(token=slow_token, at=timezone.now())

    assert late == set()
    delivery.refresh_from_db()
    assert delivery.status == "dead"
    assert delivery.delivered_at is None
    assert Delivery.objects.filter(status="dead").count() == 1


@pytest.mark.slow
def test_overlapping_attempts_count_twice_so_the_bound_holds():
    delivery = DeliveryFactory(max_attempts=3)
    tokens = []
    for _ in range(3):  # every attempt outlives its hold
        token, row = claim_one()
        tokens.append(token)
        outlive_hold()
    delivery.refresh_from_db()
    assert delivery.attempts == 3
    assert len(set(tokens)) == 3

    # Spent: the sweep dead-letters it rather than claiming a fourth attempt.
    assert Delivery.objects.claim(limit=10).rows == []
    assert Delivery.objects.dead_letter_exhausted(now=timezone.now()) == 1
    delivery.refresh_from_db()
    assert delivery.status == "dead"
    assert delivery.last_error == "attempt 3 never reported (its claim expired)"
    # The three stale attempts reporting now change nothing.
    for token in tokens:
        assert not rows(delivery).mark_delivered_each(token=token, at=timezone.now())
    delivery.refresh_from_db()
    assert delivery.status == "dead" and delivery.attempts == 3


def test_a_superseded_claim_cannot_end_the_current_attempt(fail):
    delivery = DeliveryFactory(max_attempts=5)
    old_token, _ = claim_one()
    outlive_hold()
    current_token, _ = claim_one(hold=300)  # attempt 2 is in flight
    assert not rows(delivery).mark_delivered_each(token=old_token, at=timezone.now())
    assert not fail(delivery, token=old_token, error="stale", retry_at=timezone.now(), at=timezone.now())
    delivery.refresh_from_db()
    assert (delivery.status, delivery.claim_token, delivery.last_error) == ("pending", current_token, "")
    assert rows(delivery).mark_delivered_each(token=current_token, at=timezone.now())


def test_the_bulk_delivered_write_takes_exactly_the_rows_still_held():
    consumer = ConsumerFactory()
    held = [DeliveryFactory(consumer=consumer) for _ in range(3)]
    stale = DeliveryFactory(consumer=consumer)
    token = Delivery.objects.claim(limit=10, hold_seconds=300).token
    Delivery.objects.filter(pk=stale.pk).update(claim_token=uuid.uuid4())  # another claim holds it now
    Delivery.objects.filter(pk=held[0].pk).update(status="dead")  # settled meanwhile
    ids = [d.pk for d in [*held, stale]]
    taken = Delivery.objects.filter(pk__in=ids).mark_delivered_each(token=token, at=timezone.now())
    assert taken == {held[1].pk, held[2].pk}
    statuses = dict(Delivery.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert statuses == {
        held[0].pk: "dead",
        held[1].pk: "delivered",
        held[2].pk: "delivered",
        stale.pk: "pending",
    }


def test_a_spent_row_in_flight_is_not_dead_lettered_before_its_hold_expires():
    delivery = DeliveryFactory(max_attempts=1)
    claim_one(hold=300)  # the last attempt is running
    assert Delivery.objects.dead_letter_exhausted(now=timezone.now()) == 0
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"


def test_a_failure_by_the_current_claim_backs_off_and_counts_once(fail):
    delivery = DeliveryFactory(max_attempts=5)
    token, row = claim_one(hold=300)
    before = timezone.now()
    retry_at = before + timedelta(seconds=30)
    assert fail(delivery, token=token, error="HTTP 502", retry_at=retry_at, at=before)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.claim_token) == ("pending", 1, None)
    assert delivery.next_attempt_at == retry_at
    assert delivery.last_error == "HTTP 502"
    assert Delivery.objects.claim(limit=10).rows == []  # backed off: not due


def test_a_claimed_row_is_not_due_until_its_hold_expires():
    DeliveryFactory()
    claim_one(hold=300)
    assert Delivery.objects.claim(limit=10).rows == []
    assert Delivery.objects.due().count() == 0


def test_terminal_writes_need_the_expected_status_even_with_the_token(fail):
    delivery = DeliveryFactory()
    token, _ = claim_one(hold=300)
    # A settled row that somehow still carries the token: the status guard alone must hold.
    rows(delivery).update(status="delivered")
    assert not fail(delivery, token=token, error="x", retry_at=timezone.now(), at=timezone.now())
    rows(delivery).update(status="dead")
    assert not rows(delivery).mark_delivered_each(token=token, at=timezone.now())
    delivery.refresh_from_db()
    assert delivery.status == "dead" and delivery.last_error == ""


def test_the_last_attempt_failing_dead_letters(fail):
    delivery = DeliveryFactory(max_attempts=1)
    token, _ = claim_one()
    assert fail(delivery, token=token, error="HTTP 500", retry_at=timezone.now(), at=timezone.now())
    delivery.refresh_from_db()
    assert delivery.status == "dead" and delivery.dead_at is not None


def test_dead_lettering_leaves_rows_with_attempts_left():
    spent = DeliveryFactory(max_attempts=1, attempts=1)
    fresh = DeliveryFactory(max_attempts=3, attempts=1)
    assert Delivery.objects.dead_letter_exhausted(now=timezone.now()) == 1
    assert Delivery.objects.get(pk=spent.pk).status == "dead"
    assert Delivery.objects.get(pk=fresh.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_rows_another_claimer_has_locked():
    consumer = ConsumerFactory()
    locked, free = DeliveryFactory(consumer=consumer), DeliveryFactory(consumer=consumer)
    holding, release = threading.Event(), threading.Event()

    def other_claimer():
        with transaction.atomic():
            list(Delivery.objects.filter(pk=locked.pk).select_for_update())
            holding.set()
            release.wait(10)
        connections.close_all()

    thread = threading.Thread(target=other_claimer)
    thread.start()
    try:
        assert holding.wait(10)
        with connection.cursor() as cursor:  # without SKIP LOCKED the claim would wait, then fail
            cursor.execute("SET lock_timeout = '2s'")
        claim = Delivery.objects.claim(limit=10)
        assert [row.pk for row in claim.rows] == [free.pk]
    finally:
        release.set()
        thread.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_share_a_row():
    consumer = ConsumerFactory()
    for _ in range(60):
        DeliveryFactory(consumer=consumer)
    taken: list[list] = [[], [], []]
    start = threading.Barrier(3)

    def claimer(i):
        start.wait()
        while True:
            claim = Delivery.objects.claim(limit=7, hold_seconds=300)
            if not claim.rows:
                break
            taken[i].extend(row.pk for row in claim.rows)
        connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = taken[0] + taken[1] + taken[2]
    assert len(everything) == 60 and len(set(everything)) == 60
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_a_claim_never_takes_more_than_its_limit_while_others_claim():
    """Six claimers at once over 300 due rows, five rows each at most. (A single-statement
    UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED) breaks this under
    concurrency: PostgreSQL may evaluate the subquery more than once.)"""
    consumer = ConsumerFactory()
    Delivery.objects.bulk_create(Delivery(event=EventFactory(), consumer=consumer) for _ in range(300))
    sizes: list[int] = []
    start = threading.Barrier(6)

    def claimer():
        start.wait()
        while True:
            claim = Delivery.objects.claim(limit=5, hold_seconds=300)
            if not claim.rows:
                break
            sizes.append(len(claim.rows))
        connections.close_all()

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(sizes) == 300
    assert max(sizes) <= 5, f"a claim took {max(sizes)} rows"
