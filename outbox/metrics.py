"""Outbox figures for /metrics, read at scrape time from what stays small at any table size:
the tally the writes keep (odal.core.tally), the pending and dead rows (partial indexes) and the
sweep's heartbeats. Counters here never go down: retention deletes rows, not figures."""

from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from odal.core import tally
from odal.core.models import Heartbeat
from outbox.models import Consumer
from outbox.python_consumers import HELD_BACK, PYTHON_BLOCKED, PYTHON_TIMEOUTS
from outbox.service import oldest_pending_seconds, outbox_counts

PURGED = ("deliveries", "attempts", "events", "registry_attempts")


class OutboxCollector:
    def collect(self):
        now = timezone.now()
        counts = outbox_counts()
        deliveries = GaugeMetricFamily(
            "outbox_deliveries",
            "Deliveries by status and consumer: pending and dead rows now; delivered counts every delivery "
            "ever delivered (rows retention deleted included).",
            labels=["status", "consumer"],
        )
        oldest = GaugeMetricFamily(
            "outbox_oldest_pending_seconds",
            "Age of each consumer's oldest pending delivery, in seconds (0 when none is pending).",
            labels=["consumer"],
        )
        ages = oldest_pending_seconds(counts, now=now)
        for c in counts["consumers"]:
            for status in ("pending", "delivered", "dead", "paused"):
                deliveries.add_metric([status, c["name"]], c[status])
            oldest.add_metric([c["name"]], ages[c["name"]])
        yield deliveries
        yield oldest
        yield GaugeMetricFamily(
            "outbox_consumers_paused",
            "Consumers paused now (by a person, or by odal after sustained failure): their deliveries wait.",
            value=sum(1 for c in counts["consumers"] if c["isPaused"]),
        )

        figures = tally.totals("outbox.attempts", "outbox.purged")
        attempts = figures["outbox.attempts"]
        counter = CounterMetricFamily(
            "outbox_attempts", "Delivery attempts that reported, by outcome.", labels=["outcome"]
        )
        late = CounterMetricFamily(
            "outbox_late_writes",
            "Attempts whose outcome arrived after their claim was superseded: refused, kept only in the log.",
            labels=["outcome"],
        )
        for outcome in ("delivered", "failed"):
            counter.add_metric([outcome], attempts.get(outcome, 0) + attempts.get(f"{outcome}:late", 0))
            late.add_metric([outcome], attempts.get(f"{outcome}:late", 0))
        yield counter
        yield late
        yield CounterMetricFamily(
            "outbox_write_errors",
            "Attempt outcomes the database refused to store (the row kept its claim until the hold ran out).",
            value=attempts.get("write_error", 0) + attempts.get("write_error:late", 0),
        )
        purged = CounterMetricFamily(
            "outbox_purged",
            "Rows retention deleted, by what they were (deliveries, their attempt lines, events, registry "
            "attempt lines).",
            labels=["what"],
        )
        for what in PURGED:
            purged.add_metric([what], figures["outbox.purged"].get(what, 0))
        yield purged

        yield from python_overruns(tally)

        last = tally.last_pass(tally.SWEEP)
        yield GaugeMetricFamily(
            "outbox_last_pass_timestamp_seconds",
            "When a sweep last finished a pass (Unix time; 0 if none ever did). Every pass writes it, idle "
            "ones included: alert when it stops moving.",
            value=last.timestamp() if last else 0,
        )


def python_overruns(tally):
    """outbox_python_timeouts and outbox_python_consumer_blocked, per consumer: what the sweep
    processes counted in the tally (outbox.python_consumers.count_overrun); and
    outbox_python_consumer_held_back, the sweep processes that take none of a consumer's rows now
    (their heartbeats, outbox.python_consumers.Overruns.report: one not written again within
    ODAL_READYZ_SWEEP_SECONDS is a process gone, or one that no longer sweeps). Every Python consumer
    has the three series, at 0 until it overruns; a consumer since made a webhook keeps what it had."""
    figures = tally.totals(PYTHON_TIMEOUTS, PYTHON_BLOCKED)
    since = timezone.now() - timedelta(seconds=settings.ODAL_READYZ_SWEEP_SECONDS)
    held = Heartbeat.objects.filter(role__startswith=HELD_BACK, at__gte=since).values_list("role", flat=True)
    held_by = Counter(role.removeprefix(HELD_BACK) for role in held)  # (consumer id: processes)
    timeouts = CounterMetricFamily(
        "outbox_python_timeouts",
        "Attempts of a Python consumer that ran past its timeoutSeconds (failed as timed out; the call "
        "was left running on its thread).",
        labels=["consumer"],
    )
    blocked = CounterMetricFamily(
        "outbox_python_consumer_blocked",
        "Times a sweep process stopped taking a Python consumer's deliveries because that many of its "
        "attempts (PYTHON_OVERRUNS_PER_CONSUMER, 4) still ran past their timeout.",
        labels=["consumer"],
    )
    held_back = GaugeMetricFamily(
        "outbox_python_consumer_held_back",
        "Sweep processes that take none of a Python consumer's deliveries now, because that many of its "
        "attempts (PYTHON_OVERRUNS_PER_CONSUMER, 4) still run past their timeout on each of them.",
        labels=["consumer"],
    )
    counted = set(figures[PYTHON_TIMEOUTS]) | set(figures[PYTHON_BLOCKED]) | set(held_by)
    for pk, name, kind in Consumer.objects.order_by("name").values_list("pk", "name", "kind"):
        if kind == Consumer.Kind.PYTHON or str(pk) in counted:
            timeouts.add_metric([name], figures[PYTHON_TIMEOUTS].get(str(pk), 0))
            blocked.add_metric([name], figures[PYTHON_BLOCKED].get(str(pk), 0))
            held_back.add_metric([name], held_by.get(str(pk), 0))
    yield timeouts
    yield blocked
    yield held_back
