"""The counts the writes keep (odal_tally) and the workers' heartbeats.

Each figure is checked against the rows it counts after real writes (the sweep's guarded
writes, the registry's status moves), then against deleting those rows (a figure never goes
down), and two sessions are made to count at once to show that no counter row is hot.
"""

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count
from django.utils import timezone

from odal.core import tally
from odal.core.models import Heartbeat, Tally
from outbox.models import Delivery, DeliveryAttempt
from outbox.service import outbox_counts
from outbox.sweep import sweep_once
from registry.models import Registration, RegistrationAttempt
from registry.service import registry_counts
from tests.factories import ConsumerFactory, DeliveryFactory, EventFactory, RegistrationFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


def delivered_figure() -> int:
    return sum(tally.totals("outbox.delivered")["outbox.delivered"].values())


def attempt_figures() -> dict:
    return tally.totals("outbox.attempts")["outbox.attempts"]


def attempt_rows() -> dict:
    rows = DeliveryAttempt.objects.values("outcome", "late").annotate(n=Count("pk")).order_by()
    return {r["outcome"] + (":late" if r["late"] else ""): r["n"] for r in rows}


# -- deliveries -------------------------------------------------------------------------------------


def test_a_delivery_is_counted_once_when_it_becomes_delivered_and_never_again():
    consumer = ConsumerFactory()
    d = DeliveryFactory(consumer=consumer)
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    assert delivered_figure() == 0

    assert Delivery.objects.filter(pk=d.pk).mark_delivered_each(token=claim.token, at=timezone.now())
    assert delivered_figure() == 1
    # Later writes to the delivered row (an admin edit, the late writer's refused write) add nothing.
    Delivery.objects.filter(pk=d.pk).update(last_error="note", status="delivered")
    assert not Delivery.objects.filter(pk=d.pk).mark_delivered_each(token=claim.token, at=timezone.now())
    assert delivered_figure() == 1
    assert outbox_counts()["delivered"] == 1
    assert outbox_counts()["consumers"][0]["delivered"] == 1


def trigger_plans(write) -> list[str]:
    """The plans of the statements the triggers of `write()` run (auto_explain, sent to this
    session as notices)."""
    plans: list[str] = []
    connection.ensure_connection()
    handler = lambda notice: plans.append(notice.message_primary)  # noqa: E731
    connection.connection.add_notice_handler(handler)
    try:
        with connection.cursor() as cursor:
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_nested_statements = on", "SET client_min_messages = log"):  # fmt: skip
                cursor.execute(setting)
        write()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET client_min_messages")
            cursor.execute("RESET auto_explain.log_min_duration")
        connection.connection.remove_notice_handler(handler)
    return [p for p in plans if "INSERT INTO odal_tally" in p]


def test_the_update_triggers_do_not_join_their_transition_tables():
    """PostgreSQL plans a trigger's query knowing nothing of a transition table's size: a join of
    old and new rows became a nested loop, n² for a statement of n rows (250,000 comparisons in a
    settle of 500). The triggers pair old and new versions without a join."""
    consumer = ConsumerFactory()
    rows = DeliveryFactory.create_batch(20, consumer=consumer)
    claim = Delivery.objects.claim(limit=20, hold_seconds=300)
    settled = trigger_plans(
        lambda: Delivery.objects.filter(pk__in=[r.pk for r in rows]).mark_delivered_each(
            token=claim.token, at=timezone.now()
        )
    )
    regs = RegistrationFactory.create_batch(20)
    moved = trigger_plans(
        lambda: Registration.objects.filter(pk__in=[r.pk for r in regs]).update(status="submitted")
    )
    assert delivered_figure() == 20 and registry_counts()["submitted"] == 20
    assert len(settled) == 1 and len(moved) == 1, (settled, moved)
    for plan in settled + moved:
        assert "Join" not in plan and "Nested Loop" not in plan, plan


def test_a_row_created_delivered_is_counted():
    consumer = ConsumerFactory()
    DeliveryFactory.create_batch(3, consumer=consumer, status="delivered")
    DeliveryFactory(consumer=consumer)
    counts = outbox_counts()
    assert (counts["pending"], counts["delivered"], counts["dead"]) == (1, 3, 0)


def test_the_sweep_keeps_the_figures_equal_to_the_rows():
    ok = ConsumerFactory(target="tests.consumers.accept")
    bad = ConsumerFactory(target="tests.consumers.explode", max_attempts=1)
    DeliveryFactory.create_batch(5, consumer=ok)
    DeliveryFactory.create_batch(4, consumer=bad)
    report = sweep_once(batch=100)
    assert (report.delivered, report.failed) == (5, 4)

    assert attempt_figures() == attempt_rows() == {"delivered": 5, "failed": 4}
    counts = outbox_counts()
    assert (counts["delivered"], counts["dead"], counts["pending"]) == (5, 4, 0)
    by_name = {c["name"]: c for c in counts["consumers"]}
    assert (by_name[ok.name]["delivered"], by_name[bad.name]["dead"]) == (5, 4)


def test_late_attempts_are_counted_apart():
    consumer = ConsumerFactory()
    d = DeliveryFactory(consumer=consumer)
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    now = timezone.now()
    DeliveryAttempt.objects.create(
        delivery=d, number=1, claim_token=claim.token, started_at=now, finished_at=now,
        outcome="delivered", late=True,
    )  # fmt: skip
    assert attempt_figures() == {"delivered:late": 1}


def test_deleting_counted_rows_never_lowers_a_figure(client, settings):
    settings.ODAL_METRICS_TOKEN = ""
    consumer = ConsumerFactory()
    DeliveryFactory.create_batch(3, consumer=consumer)
    sweep_once()
    series = f'outbox_deliveries{{consumer="{consumer.name}",status="delivered"}} 3.0'
    before = client.get("/metrics").content.decode()
    assert series in before
    assert 'outbox_attempts_total{outcome="delivered"} 3.0' in before

    DeliveryAttempt.objects.all().delete()
    Delivery.objects.all().delete()

    after = client.get("/metrics").content.decode()
    assert series in after
    assert 'outbox_attempts_total{outcome="delivered"} 3.0' in after
    assert outbox_counts()["delivered"] == 3


def test_the_chart_reads_hourly_buckets():
    from odal.surfaces.dashboard import hourly_attempts

    consumer = ConsumerFactory()
    d = DeliveryFactory(consumer=consumer)
    now = timezone.now()
    two_hours_ago = now - timedelta(hours=2)
    for when, outcome in ((now, "delivered"), (two_hours_ago, "failed"), (two_hours_ago, "failed")):
        DeliveryAttempt.objects.create(
            delivery=d, number=1, claim_token=d.pk, started_at=when, finished_at=when, outcome=outcome
        )
    series = {hour: (ok, failed) for hour, ok, failed in hourly_attempts(now)}
    assert series[tally.hour_of(now)] == (1, 0)
    assert series[tally.hour_of(two_hours_ago)] == (0, 2)
    assert sum(ok + failed for ok, failed in series.values()) == 3


# -- registrations ----------------------------------------------------------------------------------


def registration_rows() -> dict:
    counts = dict.fromkeys(Registration.Status.values, 0)
    for row in Registration.objects.values("status").annotate(n=Count("pk")).order_by():
        counts[row["status"]] = row["n"]
    return counts


def test_registration_status_figures_follow_every_move():
    regs = RegistrationFactory.create_batch(6)
    Registration.objects.filter(pk__in=[r.pk for r in regs[:4]]).update(status="submitted")
    Registration.objects.filter(pk__in=[r.pk for r in regs[:2]]).update(status="registered")
    Registration.objects.filter(pk=regs[0].pk).update(status="registered")  # no move: no change
    Registration.objects.filter(pk=regs[5].pk).update(status="abandoned", note="x")
    Registration.objects.filter(pk=regs[4].pk).delete()
    counts = registry_counts()
    assert {s: counts[s] for s in Registration.Status.values} == registration_rows()
    assert (counts["registered"], counts["submitted"], counts["pending"], counts["abandoned"]) == (2, 2, 0, 1)


def test_registry_attempt_lines_count_late_answers_protocol_errors_and_write_errors():
    reg = RegistrationFactory()
    now = timezone.now()

    def line(**fields):
        RegistrationAttempt.objects.create(
            registration=reg, number=1, claim_token=reg.pk, started_at=now, finished_at=now,
            **{"operation": "register", "outcome": "submitted", **fields},
        )  # fmt: skip

    line(late=True)
    line(operation="check", outcome="failed", answer="protocol error: not JSON")
    line(outcome="failed", answer="HTTP 503")
    line(outcome="write_error", answer="refused")
    found = tally.totals("registry.late", "registry.protocol_errors", "registry.write_errors")
    assert found == {
        "registry.late": {"register": 1},
        "registry.protocol_errors": {"check": 1},
        "registry.write_errors": {"": 1},
    }


# -- no hot row ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_sessions_count_deliveries_of_one_consumer_at_once_without_waiting():
    """Session A marks a row delivered and keeps its transaction open; session B marks another
    row of the same consumer delivered meanwhile. If both added to one counter row, B would wait
    for A's commit (here: fail on its lock_timeout). Each session adds to rows of its own."""
    consumer = ConsumerFactory()
    first, second = DeliveryFactory(consumer=consumer), DeliveryFactory(consumer=consumer)
    a_wrote, b_done = threading.Event(), threading.Event()
    errors: list = []

    def session_a():
        try:
            with transaction.atomic():
                Delivery.objects.filter(pk=first.pk).update(status="delivered")
                a_wrote.set()
                b_done.wait(10)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=session_a)
    thread.start()
    assert a_wrote.wait(10)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            Delivery.objects.filter(pk=second.pk).update(status="delivered")
    finally:
        b_done.set()
        thread.join(10)
    assert not errors
    assert outbox_counts()["delivered"] == 2
    assert Tally.objects.filter(metric="outbox.delivered").count() == 2  # a row per session


# -- compaction -----------------------------------------------------------------------------------


def test_compaction_folds_old_buckets_and_keeps_every_sum():
    now = timezone.now().replace(minute=30)
    for hours_ago, shard, n in (
        (100, 1, 5),
        (80, 2, 7),
        (60, 1, 1),
        (3, 1, 2),
        (3, 2, 6),
        (0, 1, 4),
        (0, 2, 1),
    ):
        Tally.objects.create(
            metric="outbox.attempts", key="delivered", hour=tally.hour_of(now - timedelta(hours=hours_ago)),
            shard=shard, value=n,
        )  # fmt: skip
    Tally.objects.create(metric="outbox.delivered", key="1", hour=tally.EPOCH, shard=0, value=10)
    Tally.objects.create(
        metric="outbox.delivered", key="1", hour=tally.hour_of(now - timedelta(days=5)), value=3
    )
    before = tally.totals("outbox.attempts", "outbox.delivered")
    chart_before = tally.hourly("outbox.attempts", now - timedelta(hours=24))

    assert tally.compact(now=now) == 6
    assert tally.totals("outbox.attempts", "outbox.delivered") == before
    assert tally.hourly("outbox.attempts", now - timedelta(hours=24)) == chart_before
    assert Tally.objects.filter(hour=tally.EPOCH).count() == 2  # one row per (metric, key)
    assert Tally.objects.get(metric="outbox.attempts", hour=tally.EPOCH).value == 13
    assert Tally.objects.get(metric="outbox.delivered", hour=tally.EPOCH).value == 13
    # A past hour within the last 48 is one row (its sessions folded) and stays hourly for the chart;
    # the current hour is left to the sessions still adding to it.
    three_ago = Tally.objects.get(metric="outbox.attempts", hour=tally.hour_of(now - timedelta(hours=3)))
    assert (three_ago.shard, three_ago.value) == (0, 8)
    assert Tally.objects.filter(metric="outbox.attempts", hour=tally.hour_of(now)).count() == 2
    assert tally.compact(now=now) == 0


def test_bump_adds_to_the_figure():
    tally.bump("outbox.purged", {"deliveries": 3, "events": 0})
    tally.bump("outbox.purged", {"deliveries": 2, "attempts": 4})
    assert tally.totals("outbox.purged") == {"outbox.purged": {"deliveries": 5, "attempts": 4}}


# -- heartbeats -----------------------------------------------------------------------------------


def test_every_pass_beats_at_most_once_a_second(monkeypatch):
    monkeypatch.setattr(tally, "_last_beat", {})
    assert tally.last_pass(tally.SWEEP) is None
    sweep_once()  # nothing to do: an idle pass beats too
    first = tally.last_pass(tally.SWEEP)
    assert first is not None
    sweep_once()
    assert tally.last_pass(tally.SWEEP) == first  # within the second: not written again
    assert tally.beat(tally.SWEEP, force=True)
    assert tally.last_pass(tally.SWEEP) > first
    assert Heartbeat.objects.filter(role=tally.SWEEP).count() == 1  # one row per worker


def test_forgetting_idle_workers_keeps_each_roles_newest():
    now = timezone.now()
    for worker, days in (("a:1", 30), ("b:2", 20), ("c:3", 0)):
        Heartbeat.objects.create(role=tally.SWEEP, worker=worker, at=now - timedelta(days=days))
    Heartbeat.objects.create(role=tally.DRAIN, worker="a:1", at=now - timedelta(days=40))
    assert tally.forget_idle_workers(older_than=timedelta(days=7), now=now) == 2
    assert set(Heartbeat.objects.values_list("role", "worker")) == {
        (tally.SWEEP, "c:3"),
        (tally.DRAIN, "a:1"),
    }
    assert tally.last_pass(tally.DRAIN) == now - timedelta(days=40)


def test_an_event_without_deliveries_changes_no_figure():
    EventFactory()
    assert outbox_counts()["delivered"] == 0
    assert not Tally.objects.exists()
