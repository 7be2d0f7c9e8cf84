"""Outbox figures for /metrics, read from the database at scrape time."""

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class OutboxCollector:
    def collect(self):
        from outbox.models import Delivery, DeliveryAttempt

        deliveries = GaugeMetricFamily(
            "outbox_deliveries", "Deliveries by status and consumer.", labels=["status", "consumer"]
        )
        for row in Delivery.objects.values("status", "consumer__name").annotate(n=Count("pk")).order_by():
            deliveries.add_metric([row["status"], row["consumer__name"]], row["n"])
        yield deliveries

        attempts = CounterMetricFamily(
            "outbox_attempts", "Delivery attempts that reported, by outcome.", labels=["outcome"]
        )
        late = CounterMetricFamily(
            "outbox_late_writes",
            "Attempts whose outcome arrived after their claim was superseded: refused, kept only in the log.",
            labels=["outcome"],
        )
        counts = {(o, False): 0 for o in ("delivered", "failed")} | {
            (o, True): 0 for o in ("delivered", "failed")
        }
        for row in DeliveryAttempt.objects.values("outcome", "late").annotate(n=Count("pk")).order_by():
            counts[(row["outcome"], row["late"])] = row["n"]
        for outcome in ("delivered", "failed"):
            attempts.add_metric([outcome], counts[(outcome, False)] + counts[(outcome, True)])
            late.add_metric([outcome], counts[(outcome, True)])
        yield attempts
        yield late
        yield CounterMetricFamily(
            "outbox_write_errors",
            "Attempt outcomes the database refused to store (the row kept its claim until the hold ran out).",
            value=sum(
                n for (outcome, _), n in counts.items() if outcome == DeliveryAttempt.Outcome.WRITE_ERROR
            ),
        )
