"""Registry figures for /metrics: registry_outbox_<status> gauges (and _stalled), late answers."""

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class RegistryCollector:
    def collect(self):
        from registry.models import RegistrationAttempt
        from registry.service import registry_counts

        for status, n in registry_counts().items():
            help_text = (
                "Pending registrations that need a person (many attempts, or owed for over a day)."
                if status == "stalled"
                else f"Registrations whose status is {status}."
            )
            yield GaugeMetricFamily(f"registry_outbox_{status}", help_text, value=n)
        late = CounterMetricFamily(
            "registry_late_writes",
            "Registry answers that arrived after their claim was superseded or the row settled: kept only in the log.",
            labels=["operation"],
        )
        rows = (
            RegistrationAttempt.objects.filter(late=True)
            .values("operation")
            .annotate(n=Count("pk"))
            .order_by()
        )
        counts = {"register": 0, "check": 0, "deactivate": 0} | {r["operation"]: r["n"] for r in rows}
        for operation, n in sorted(counts.items()):
            late.add_metric([operation], n)
        yield late
        yield CounterMetricFamily(
            "registry_write_errors",
            "Registry answers the database refused to store (the row kept its claim until the hold ran out).",
            value=RegistrationAttempt.objects.filter(outcome=RegistrationAttempt.WRITE_ERROR).count(),
        )
