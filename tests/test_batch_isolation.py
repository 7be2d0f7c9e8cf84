"""One row the database refuses must not cost any other row its outcome, nor end a sweep, a drain
or a django-q2 task (issue 11). The refusal is real: a PostgreSQL trigger raises for one row's
terminal write, in the middle of a batch."""

import time

import pytest
from django.db import connection
from django.test import Client

from odal.surfaces import lifecycle
from outbox import tasks as outbox_tasks
from outbox.events import emit
from outbox.models import Delivery, DeliveryAttempt, Event
from outbox.sweep import sweep_once, sweep_until_idle
from registry.drain import drain_once
from registry.models import Registration, RegistrationAttempt
from tests import consumers
from tests.factories import ConsumerFactory, PassportFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    consumers.calls.clear()


def refuse_terminal_writes(table: str, row_id) -> None:
    """Make PostgreSQL refuse (SQLSTATE 22000, a DataError) any update of one row that clears its
    claim token: the claim still takes the row, every outcome written for it fails. Dropped with
    the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION odal_test_refuse() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused by the test''s trigger' USING ERRCODE = '22000'; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER odal_test_refuse BEFORE UPDATE ON {table} FOR EACH ROW "
            f"WHEN (NEW.id = %s AND NEW.claim_token IS NULL) EXECUTE FUNCTION odal_test_refuse()",
            [str(row_id)],
        )


def allow_writes_again(table: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER odal_test_refuse ON {table}")


def five_deliveries(target="tests.consumers.accept"):
    consumer = ConsumerFactory(target=target, max_attempts=3)
    for n in range(5):
        emit("passport.published", {"n": n})
    rows = list(Delivery.objects.filter(consumer=consumer).order_by("pk"))
    assert len(rows) == 5
    return rows


def metric(name: str) -> float:
    for line in Client().get("/metrics").content.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_an_unwritable_success_mid_batch_leaves_the_others_delivered_and_the_sweep_going():
    rows = five_deliveries()
    bad = rows[2]  # the claim reads rows by primary key: the middle of the batch
    refuse_terminal_writes("outbox_delivery", bad.pk)

    report = sweep_once()

    assert (report.claimed, report.delivered, report.write_errors, report.late) == (5, 4, 1, 0)
    settled = dict(Delivery.objects.values_list("pk", "status"))
    assert [settled[r.pk] for r in rows] == ["delivered", "delivered", "pending", "delivered", "delivered"]
    bad.refresh_from_db()
    assert bad.claim_token is not None and bad.attempts == 1  # keeps its claim until the hold runs out
    line = DeliveryAttempt.objects.get(delivery=bad)
    assert line.outcome == "write_error" and not line.late
    assert line.error.startswith("the attempt delivered, but its outcome could not be written: DataError")
    assert "refused by the test's trigger" in line.error
    assert metric("outbox_write_errors_total") == 1.0


def test_an_unwritable_failure_mid_batch_leaves_the_other_failures_backed_off():
    rows = five_deliveries(target="tests.consumers.explode")
    refuse_terminal_writes("outbox_delivery", rows[1].pk)

    report = sweep_once()

    assert (report.failed, report.write_errors) == (4, 1)
    for row in rows:
        row.refresh_from_db()
    assert [r.last_error for r in rows] == ["ValueError: boom", "", *["ValueError: boom"] * 3]
    assert [r.claim_token is None for r in rows] == [True, False, True, True, True]
    assert DeliveryAttempt.objects.get(delivery=rows[1]).error.startswith(
        "the attempt failed (ValueError: boom), but its outcome could not be written"
    )


def test_the_unwritable_row_is_attempted_again_once_its_hold_runs_out(settings):
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    rows = five_deliveries()
    refuse_terminal_writes("outbox_delivery", rows[0].pk)
    sweep_once()
    allow_writes_again("outbox_delivery")

    assert sweep_once().claimed == 0  # still held
    time.sleep(1.1)
    again = sweep_once()

    assert (again.claimed, again.delivered) == (1, 1)
    rows[0].refresh_from_db()
    assert rows[0].status == "delivered" and rows[0].attempts == 2
    assert list(rows[0].attempt_log.values_list("outcome", flat=True)) == ["write_error", "delivered"]


def test_a_run_of_passes_and_the_django_q2_task_go_on_past_an_unwritable_row(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 1}  # the task's plain run of passes
    rows = five_deliveries()
    refuse_terminal_writes("outbox_delivery", rows[4].pk)

    assert sweep_until_idle(max_seconds=5).write_errors == 1
    emit("passport.published", {"n": "after"})  # work that arrives later still flows
    summary = outbox_tasks.sweep()

    assert "1 delivered" in summary
    assert Delivery.objects.filter(status="delivered").count() == 5


def test_an_unwritable_registry_answer_leaves_the_drain_going(registry_sim):
    passports = [PassportFactory() for _ in range(3)]
    for passport in passports:
        lifecycle.publish(passport.pk, actor="test")
    regs = sorted(Registration.objects.all(), key=lambda r: r.pk)
    bad = regs[1]
    refuse_terminal_writes("registry_registration", bad.pk)

    report = drain_once()

    assert (report.claimed, report.submitted, report.write_errors) == (3, 2, 1)
    statuses = dict(Registration.objects.values_list("pk", "status"))
    assert [statuses[r.pk] for r in regs] == ["submitted", "pending", "submitted"]
    bad.refresh_from_db()
    assert bad.claim_token is not None
    line = RegistrationAttempt.objects.get(registration=bad)
    assert line.outcome == "write_error"
    assert line.answer.startswith("the registry answered submitted (requestId req-")
    assert "could not be written: DataError" in line.answer
    assert metric("registry_write_errors_total") == 1.0


def test_the_events_of_a_set_one_of_whose_writes_the_database_refuses_are_emitted_once_each(registry_sim):
    # The set is written again one by one: the two that take their row emit their event once
    # (the set's emit went with its transaction), the refused one none (its row stays claimed).
    registry_sim.faults["reject_upi_containing"] = "BAD"
    passports = [
        PassportFactory(upi=f"https://id.example.eu/01/09506000134352/21/BAD-{n:05d}") for n in range(3)
    ]
    for passport in passports:
        lifecycle.publish(passport.pk, actor="test")
    regs = sorted(Registration.objects.all(), key=lambda r: r.pk)
    refuse_terminal_writes("registry_registration", regs[1].pk)

    report = drain_once()

    assert (report.claimed, report.rejected, report.write_errors, report.late) == (3, 2, 1, 0)
    rejected = Event.objects.filter(type="passport.registration_rejected")
    assert sorted(e.payload["dppId"] for e in rejected) == sorted(str(regs[n].passport_id) for n in (0, 2))
    assert [line.outcome for line in RegistrationAttempt.objects.filter(registration=regs[1])] == [
        "write_error"
    ]
