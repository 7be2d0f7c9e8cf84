"""The pipeline ceiling of `make bench` (bench/pipeline.py) runs odal's per-batch SQL as one
procedure: it must do what a sweep's no-op batch does to the same rows, or the ratio against it
means nothing."""

import psycopg
import pytest
from django.db import connection

from bench import pipeline
from outbox.models import Delivery, DeliveryAttempt
from tests.factories import ConsumerFactory, DeliveryFactory


def call(size: int) -> int:
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        conn.execute(pipeline.PROCEDURE)
        return conn.execute("CALL odal_bench_batch(%s)", [size]).fetchone()[0]


@pytest.mark.django_db(transaction=True)  # the procedure commits on its own connection
def test_the_ceiling_procedure_claims_settles_and_logs_a_batch_as_the_sweep_does():
    active, paused = ConsumerFactory(), ConsumerFactory(paused=True)
    due = [DeliveryFactory(consumer=active, attempts=n) for n in (0, 0, 2)]
    spent = DeliveryFactory(consumer=active, attempts=8, max_attempts=8)
    parked = DeliveryFactory(consumer=paused)

    assert call(2) == 2  # at most the batch's size
    assert call(500) == 1
    assert call(500) == 0

    rows = {d.pk: d for d in Delivery.objects.all()}
    assert all(rows[d.pk].status == "delivered" and rows[d.pk].claim_token is None for d in due)
    assert rows[spent.pk].status == "pending" and rows[parked.pk].status == "pending"
    attempts = sorted(
        DeliveryAttempt.objects.values_list("delivery_id", "number", "outcome", "late", "consumer_id")
    )
    assert attempts == sorted((d.pk, d.attempts + 1, "delivered", False, active.pk) for d in due)
    assert all(rows[d.pk].attempts == d.attempts + 1 for d in due)


@pytest.mark.django_db(transaction=True)  # (its own connections, its own table)
def test_the_one_commit_per_row_ceiling_counts_its_commits():
    # bench.run.ceiling summed its clients' counts before timing them (a division's left operand
    # goes first): always 0, and make bench ended in a ZeroDivisionError at its report.
    from bench import run

    params = connection.get_connection_params()
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    try:
        assert run.ceiling(url, 2, 0.3) > 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_ceiling")
