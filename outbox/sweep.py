"""The delivery sweep: dead-letter spent rows, claim due ones, call their consumers, end each
attempt with a guarded write and log it.

Any number of sweeps may run at once, on any number of machines: the claim decides which sweep
owns which row, and the terminal writes refuse whoever no longer owns it.
"""

import logging
import time
from dataclasses import dataclass, field

import httpx
from django.db import close_old_connections, transaction
from django.utils import timezone

from outbox import consumers
from outbox.claims import backoff_delay
from outbox.models import Delivery, DeliveryAttempt

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    dead_lettered: int = 0
    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    late: int = 0
    passes: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: "SweepReport") -> None:
        for name in ("dead_lettered", "claimed", "delivered", "failed", "late", "passes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        return (
            f"{self.claimed} claimed, {self.delivered} delivered, {self.failed} failed, "
            f"{self.late} late, {self.dead_lettered} dead-lettered (never reported)"
        )


def finish_attempt(delivery: Delivery, token, outcome: consumers.Outcome, started_at) -> bool:
    """End one attempt: the guarded terminal write and its line in the attempt log, together.
    Returns whether the write took the row; if not, the outcome is logged as late and nothing
    else changes."""
    finished_at = timezone.now()
    with transaction.atomic():
        rows = Delivery.objects.filter(pk=delivery.pk)
        if outcome.ok:
            took = rows.mark_delivered(token=token, at=finished_at)
        else:
            retry_at = finished_at + backoff_delay(delivery.attempts)
            took = rows.mark_attempt_failed(
                token=token, error=outcome.error, retry_at=retry_at, at=finished_at
            )
        DeliveryAttempt.objects.create(
            delivery_id=delivery.pk,
            number=delivery.attempts,
            claim_token=token,
            started_at=started_at,
            finished_at=finished_at,
            outcome=DeliveryAttempt.Outcome.DELIVERED if outcome.ok else DeliveryAttempt.Outcome.FAILED,
            error=outcome.error[:2000],
            http_status=outcome.http_status,
            duration_ms=outcome.duration_ms,
            late=not took,
        )
    if not took:
        log.warning(
            "late %s of delivery %s attempt %s: its claim was superseded; nothing written",
            "success" if outcome.ok else "failure",
            delivery.pk,
            delivery.attempts,
        )
    return took


def sweep_once(*, batch: int = 100, client: httpx.Client | None = None) -> SweepReport:
    """One pass: dead-letter spent rows, claim up to `batch` due deliveries, run them."""
    report = SweepReport(passes=1)
    now = timezone.now()
    report.dead_lettered = Delivery.objects.dead_letter_exhausted(now=now)
    claim = Delivery.objects.claim(limit=batch, now=now, select_related=("event", "consumer"))
    report.claimed = len(claim.rows)
    own_client = client is None
    client = client or httpx.Client(follow_redirects=False)
    try:
        for delivery in claim.rows:
            started_at = timezone.now()
            try:
                outcome = consumers.call(delivery.consumer, delivery.pk, delivery.event, client)
            except Exception as exc:  # a bug of ours must fail the attempt, not kill the sweep
                log.exception("calling consumer %s failed", delivery.consumer.name)
                outcome = consumers.Outcome(False, f"{type(exc).__name__}: {exc}"[:500])
            took = finish_attempt(delivery, claim.token, outcome, started_at)
            if not took:
                report.late += 1
            elif outcome.ok:
                report.delivered += 1
            else:
                report.failed += 1
    finally:
        if own_client:
            client.close()
    return report


def sweep_until_idle(*, batch: int = 100, max_seconds: float = 50.0) -> SweepReport:
    """Passes until a pass claims nothing or `max_seconds` have gone by."""
    report = SweepReport()
    deadline = time.monotonic() + max_seconds
    with httpx.Client(follow_redirects=False) as client:
        while True:
            one = sweep_once(batch=batch, client=client)
            report.add(one)
            if one.claimed == 0 or time.monotonic() >= deadline:
                return report


def sweep_forever(*, batch: int = 100, idle_sleep: float = 1.0, should_stop=lambda: False) -> SweepReport:
    """What `odal outbox sweep` runs: passes until told to stop, resting when idle."""
    report = SweepReport()
    with httpx.Client(follow_redirects=False) as client:
        while not should_stop():
            close_old_connections()
            one = sweep_once(batch=batch, client=client)
            report.add(one)
            if one.claimed == 0 and not should_stop():
                time.sleep(idle_sleep)
    return report
