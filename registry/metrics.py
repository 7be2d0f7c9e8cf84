"""Registry figures for /metrics: registry_outbox_<status> gauges (and _stalled), late answers,
protocol errors and write errors."""

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class RegistryCollector:
    def collect(self):
        from registry.adapters import MAX_ID, PROTOCOL_ERROR
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
        protocol = CounterMetricFamily(
            "registry_protocol_errors",
            "Registry answers that broke the wire protocol (not JSON, values of the wrong shape, ids longer "
            f"than {MAX_ID} characters, ...): each failed its attempt, saying why in the attempt log.",
            labels=["operation"],
        )
        rows = (
            RegistrationAttempt.objects.filter(outcome="failed", answer__startswith=PROTOCOL_ERROR)
            .values("operation")
            .annotate(n=Count("pk"))
            .order_by()
        )
        counts = {"register": 0, "check": 0, "deactivate": 0} | {r["operation"]: r["n"] for r in rows}
        for operation, n in sorted(counts.items()):
            protocol.add_metric([operation], n)
        yield protocol
        yield CounterMetricFamily(
            "registry_write_errors",
            "Registry answers the database refused to store (the row kept its claim until the hold ran out).",
            value=RegistrationAttempt.objects.filter(outcome=RegistrationAttempt.WRITE_ERROR).count(),
        )
