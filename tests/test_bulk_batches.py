"""Bulk writes in batches (issue 23): replay, resend, unpark and a consumer's removal take at most
BULK_BATCH rows per transaction, each batch with its own audit entries.

"Per transaction" is read from PostgreSQL itself, not from the code: every row version carries
the id of the transaction that wrote it (`xmin`), so the rows a replay wrote, grouped by xmin,
are its transactions; the audit entries grouped the same way say they were written in the same
transaction as the rows they record. Nothing here depends on time."""

from collections import Counter

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry
from outbox import service
from outbox.models import BULK_BATCH, Consumer, Delivery, DeliveryAttempt, Event
from tests.factories import ConsumerFactory, DeadDeliveryFactory, DeliveryFactory


def rows_per_transaction(model, **filters) -> Counter:
    """{transaction id: rows of `model` it wrote}, from each row's xmin."""
    ids = [str(pk) for pk in model.objects.filter(**filters).values_list("pk", flat=True)]
    pk = model._meta.pk.column
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT xmin::text, count(*) FROM {model._meta.db_table} WHERE {pk}::text = ANY(%s) GROUP BY 1",
            [ids],
        )
        return Counter(dict(cursor.fetchall()))


def audit_per_transaction(action: str) -> Counter:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT xmin::text, count(*) FROM {AuditEntry._meta.db_table} WHERE action = %s GROUP BY 1",
            [action],
        )
        return Counter(dict(cursor.fetchall()))


def make_dead_deliveries(consumer: Consumer, n: int) -> None:
    """`n` dead deliveries of `consumer`, each with its event, in two INSERT … SELECT statements."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Event._meta.db_table} (id, type, payload, created_at) "
            "SELECT gen_random_uuid(), 'passport.published', jsonb_build_object('n', i), now() "
            "FROM generate_series(1, %s) AS i",
            [n],
        )
        cursor.execute(
            f"INSERT INTO {Delivery._meta.db_table} (id, event_id, consumer_id, status, attempts, "
            "max_attempts, next_attempt_at, last_error, dead_at, created_at) "
            "SELECT gen_random_uuid(), e.id, %s, 'dead', 3, 3, now(), 'HTTP 500', now(), now() "
            f"FROM {Event._meta.db_table} e",
            [consumer.pk],
        )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_bulk_replay_of_20000_rows_is_many_bounded_transactions():
    """A bulk replay took every matching row in one transaction: at 200,000 rows, one lock set
    of 200,000 rows and 200,000 audit entries committed at once (at a million, longer than any
    web timeout). Now no transaction writes more than BULK_BATCH of them, and each batch's
    audit entries commit with its rows. (20 times BULK_BATCH rows show it as 200 times did,
    in a tenth of the suite's time.)"""
    rows = 20 * BULK_BATCH
    consumer = ConsumerFactory(name="erp")
    make_dead_deliveries(consumer, rows)

    replayed = Delivery.objects.matching(consumer="erp").replay(actor="ops", reason="ERP is back")

    assert replayed == rows
    assert Delivery.objects.filter(status="pending").count() == rows
    written = rows_per_transaction(Delivery, consumer=consumer)
    largest = max(written.values())
    print(f"{rows:,} rows replayed in {len(written)} transactions, the largest writing {largest:,}")
    assert len(written) >= 20 and largest <= BULK_BATCH, f"one transaction wrote {largest:,} rows"
    assert audit_per_transaction("delivery_replayed") == written, "audit entries outside their batch"


@pytest.mark.django_db(transaction=True)
def test_a_bulk_replay_audits_each_batch_in_its_own_transaction():
    consumer = ConsumerFactory(name="erp")
    dead = DeadDeliveryFactory.create_batch(5, consumer=consumer)
    done = []

    replayed = Delivery.objects.filter(consumer=consumer).replay(
        actor="ops",
        reason="ERP is back",
        batch=2,
        progress=lambda batches, total: done.append((batches, total)),
    )

    assert replayed == 5 and done == [(1, 2), (2, 4), (3, 5)]
    written = rows_per_transaction(Delivery, pk__in=[d.pk for d in dead])
    assert sorted(written.values()) == [1, 2, 2]
    assert audit_per_transaction("delivery_replayed") == written


@pytest.mark.django_db(transaction=True)
def test_a_bulk_resend_goes_on_from_where_it_stopped_and_takes_no_row_twice():
    """Each batch picks in primary-key order after the last one: a row sent again by an earlier
    batch and dead again before the next (a consumer that fails at once) is not sent twice."""
    consumer = ConsumerFactory(name="erp")
    DeadDeliveryFactory.create_batch(5, consumer=consumer)
    done = []

    def dead_again(batches, total):
        done.append(total)
        if batches == 1:  # the first batch's rows die again at once
            Delivery.objects.filter(consumer=consumer, status="pending").update(
                status="dead", dead_at=timezone.now()
            )

    resent = Delivery.objects.filter(consumer=consumer).resend(
        actor="ops", reason="lost", batch=2, progress=dead_again
    )

    assert resent == 5 and done == [2, 4, 5]
    entries = Counter(AuditEntry.objects.filter(action="delivery_resent").values_list("object_id", flat=True))
    assert len(entries) == 5 and set(entries.values()) == {1}, entries


@pytest.mark.django_db(transaction=True)
def test_resume_unparks_in_batches():
    consumer = ConsumerFactory(name="erp", paused=True, paused_by="ops", paused_reason="maintenance")
    parked = DeliveryFactory.create_batch(3, consumer=consumer, status="paused")
    done = []

    resumed = service.resume(
        consumer, actor="ops", reason="back", progress=lambda batches, total: done.append(total)
    )

    assert resumed == 3 and done == [3]
    assert max(rows_per_transaction(Delivery, pk__in=[d.pk for d in parked]).values()) <= BULK_BATCH


@pytest.mark.django_db(transaction=True)
def test_a_removal_refused_half_way_leaves_an_audit_entry_for_every_row_it_deleted(monkeypatch):
    """A removal deletes the settled rows in batches and is refused at its last step when a
    delivery was made meanwhile: the rows it had deleted were gone with no trail of them (dead
    letters, the evidence of what was never delivered, included). Now each batch audits every
    row it deletes, in the transaction that deletes it."""
    consumer = ConsumerFactory(name="erp")
    delivered = DeliveryFactory.create_batch(
        2, consumer=consumer, status="delivered", delivered_at=timezone.now()
    )
    dead = DeadDeliveryFactory.create_batch(2, consumer=consumer)
    raw_delete = QuerySet._raw_delete

    def publish_meanwhile(self, using):
        if self.model is DeliveryAttempt and not Delivery.objects.filter(consumer=consumer, status="pending"):
            DeliveryFactory(consumer=consumer)  # a publish fanning out to it, committed with the batch
        return raw_delete(self, using)

    monkeypatch.setattr(QuerySet, "_raw_delete", publish_meanwhile)
    with pytest.raises(Refused) as refused:
        service.remove_consumer(Consumer.objects.get(pk=consumer.pk), actor="ops", reason="gone")
    monkeypatch.undo()

    assert refused.value.code == "deliveries_pending"
    assert Consumer.objects.filter(pk=consumer.pk).exists()
    gone = {str(d.pk) for d in delivered + dead}
    assert not Delivery.objects.filter(pk__in=gone).exists()
    trail = {e.object_id: e for e in AuditEntry.objects.filter(action="delivery_removed")}
    assert set(trail) == gone, "rows deleted without an audit entry"
    assert {trail[str(d.pk)].details["status"] for d in dead} == {"dead"}
    assert all(
        e.reason == "gone" and e.actor == "ops" and e.details["consumer"] == "erp" for e in trail.values()
    )


@pytest.mark.django_db(transaction=True)
def test_the_command_line_and_the_admin_say_how_many_batches(monkeypatch, client):
    from tests.test_outbox_admin import operator, replay_post
    from tests.test_outbox_cli import run

    monkeypatch.setattr("outbox.models.BULK_BATCH", 2)
    consumer = ConsumerFactory(name="erp")
    dead = DeadDeliveryFactory.create_batch(5, consumer=consumer)

    said = run("replay", "--dead", "--consumer", "erp", "--reason", "ERP is back")
    assert "Replayed 5 of 5 selected in 3 batches." in said

    Delivery.objects.filter(consumer=consumer).update(status="dead")
    operator(client)
    done = replay_post(client, dead, post="yes", reason="ERP is back")
    assert b"Replayed 5 of 5 selected in 3 batches." in done.content
