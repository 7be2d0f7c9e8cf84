"""Registry figures for /metrics: registry_outbox_<status> gauges (and _stalled), late answers,
protocol errors, write errors and the drain's heartbeat, all from what stays small at any table
size (the tally the writes keep, the pending rows, the heartbeats)."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from odal.core import tally
from registry.adapters import MAX_ID
from registry.service import registry_counts

OPERATIONS = ("check", "deactivate", "find", "register")  # find: a deactivation that first finds


class RegistryCollector:
    def collect(self):
        for status, n in registry_counts().items():
            help_text = (
                "Pending registrations that need a person (many attempts, or owed for over a day)."
                if status == "stalled"
                else f"Registrations whose status is {status}."
            )
            yield GaugeMetricFamily(f"registry_outbox_{status}", help_text, value=n)
        figures = tally.totals("registry.late", "registry.protocol_errors", "registry.write_errors")
        late = CounterMetricFamily(
            "registry_late_writes",
            "Registry answers that arrived after their claim was superseded or the row settled: kept only in the log.",
            labels=["operation"],
        )
        for operation in OPERATIONS:
            late.add_metric([operation], figures["registry.late"].get(operation, 0))
        yield late
        protocol = CounterMetricFamily(
            "registry_protocol_errors",
            "Registry answers that broke the wire protocol (not JSON, values of the wrong shape, ids longer "
            f"than {MAX_ID} characters, ...): each failed its attempt, saying why in the attempt log.",
            labels=["operation"],
        )
        for operation in OPERATIONS:
            protocol.add_metric([operation], figures["registry.protocol_errors"].get(operation, 0))
        yield protocol
        yield CounterMetricFamily(
            "registry_write_errors",
            "Registry answers the database refused to store (the row kept its claim until the hold ran out).",
            value=figures["registry.write_errors"].get("", 0),
        )
        last = tally.last_pass(tally.DRAIN)
        yield GaugeMetricFamily(
            "registry_last_pass_timestamp_seconds",
            "When a registry drain last finished a pass (Unix time; 0 if none ever did).",
            value=last.timestamp() if last else 0,
        )
