"""The outbox's operations that every surface shares (the API, the admin, the dashboard, the
command line and /metrics call these, never their own copies).

Counts cost the same at ten thousand and at ten million deliveries: pending and dead rows are
counted from their partial indexes (sets that stay small while the outbox is healthy), and
delivered rows from the tally the writes keep (odal.tally), which retention never lowers.
"""

from datetime import datetime

from django.db.models import Count, Min
from django.utils import timezone

from odal import tally
from outbox.models import Consumer, Delivery

STATUSES = tuple(Delivery.Status.values)


def outbox_counts() -> dict:
    """Deliveries per status, overall and per consumer, with the oldest pending delivery:

    ``{pending, delivered, dead, paused, oldestPendingAt, consumers: [{name, isPaused,
    pausedReason, pausedBy, pending, delivered, dead, paused, oldestPendingAt}]}``. Each status
    is a count (``paused``: deliveries parked while their consumer is paused); ``isPaused`` says
    whether the consumer is. ``delivered`` counts deliveries ever delivered (it includes those
    retention has since deleted); the others count the rows there now, from partial indexes."""
    consumers = {c.pk: c for c in Consumer.objects.all()}
    rows = {pk: {**dict.fromkeys(STATUSES, 0), "oldestPendingAt": None} for pk in consumers}
    for row in (
        Delivery.objects.filter(status=Delivery.Status.PENDING)
        .values("consumer_id")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
        .order_by()
    ):
        rows[row["consumer_id"]].update(pending=row["n"], oldestPendingAt=row["oldest"])
    for status in (Delivery.Status.DEAD, Delivery.Status.PAUSED):
        for row in (
            Delivery.objects.filter(status=status).values("consumer_id").annotate(n=Count("pk")).order_by()
        ):
            rows[row["consumer_id"]][status] = row["n"]
    delivered = tally.totals("outbox.delivered")["outbox.delivered"]
    for key, n in delivered.items():
        if key.isdigit() and int(key) in rows:
            rows[int(key)]["delivered"] = n
    total = {status: sum(r[status] for r in rows.values()) for status in STATUSES}
    total["delivered"] = sum(delivered.values())  # a removed consumer's deliveries still happened
    oldest = min((r["oldestPendingAt"] for r in rows.values() if r["oldestPendingAt"]), default=None)
    return {
        **total,
        "oldestPendingAt": oldest,
        "consumers": [
            {
                "name": consumers[pk].name,
                "isPaused": consumers[pk].paused,
                "pausedReason": consumers[pk].paused_reason,
                "pausedBy": consumers[pk].paused_by,
                **rows[pk],
            }
            for pk in sorted(rows, key=lambda pk: consumers[pk].name)
        ],
    }


def oldest_pending_seconds(counts: dict, *, now: datetime | None = None) -> dict[str, float]:
    """{consumer name: age in seconds of its oldest pending delivery, 0 when it has none}."""
    now = now or timezone.now()
    return {
        c["name"]: max(0.0, (now - c["oldestPendingAt"]).total_seconds()) if c["oldestPendingAt"] else 0.0
        for c in counts["consumers"]
    }
