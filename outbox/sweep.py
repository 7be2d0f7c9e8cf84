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


FLUSH_ROWS = 200  # outcomes written together, in one transaction
FLUSH_SECONDS = 1.0  # ...or sooner, so a slow consumer does not hold finished outcomes back


@dataclass
class Finished:
    delivery: Delivery
    outcome: consumers.Outcome
    started_at: object
    finished_at: object


def finish_attempts(token, finished: list[Finished]) -> set:
    """End a run of attempts of one claim, in one transaction: successes in one guarded UPDATE
    (mark_delivered_each), failures one guarded UPDATE each (their errors and backoff differ),
    and one attempt-log line per attempt. Returns the ids whose write took; the others are
    logged as late and nothing else about them changes."""
    if not finished:
        return set()
    now = timezone.now()
    with transaction.atomic():
        delivered = [f.delivery.pk for f in finished if f.outcome.ok]
        taken = (
            Delivery.objects.filter(pk__in=delivered).mark_delivered_each(token=token, at=now)
            if delivered
            else set()
        )
        for f in finished:
            if not f.outcome.ok:
                retry_at = f.finished_at + backoff_delay(f.delivery.attempts)
                if Delivery.objects.filter(pk=f.delivery.pk).mark_attempt_failed(
                    token=token, error=f.outcome.error, retry_at=retry_at, at=f.finished_at
                ):
                    taken.add(f.delivery.pk)
        DeliveryAttempt.objects.bulk_create(
            DeliveryAttempt(
                delivery_id=f.delivery.pk,
                number=f.delivery.attempts,
                claim_token=token,
                started_at=f.started_at,
                finished_at=f.finished_at,
                outcome=DeliveryAttempt.Outcome.DELIVERED if f.outcome.ok else DeliveryAttempt.Outcome.FAILED,
                error=f.outcome.error[:2000],
                http_status=f.outcome.http_status,
                duration_ms=f.outcome.duration_ms,
                late=f.delivery.pk not in taken,
            )
            for f in finished
        )
    for f in finished:
        if f.delivery.pk not in taken:
            log.warning(
                "late %s of delivery %s attempt %s: its claim was superseded; nothing written",
                "success" if f.outcome.ok else "failure",
                f.delivery.pk,
                f.delivery.attempts,
            )
    return taken


def sweep_once(*, batch: int = 100, client: httpx.Client | None = None) -> SweepReport:
    """One pass: dead-letter spent rows, claim up to `batch` due deliveries, run them."""
    report = SweepReport(passes=1)
    now = timezone.now()
    report.dead_lettered = Delivery.objects.dead_letter_exhausted(now=now)
    claim = Delivery.objects.claim(limit=batch, now=now, select_related=("event", "consumer"))
    report.claimed = len(claim.rows)
    own_client = client is None
    client = client or httpx.Client(follow_redirects=False)
    pending: list[Finished] = []
    last_flush = time.monotonic()

    def flush():
        taken = finish_attempts(claim.token, pending)
        for f in pending:
            if f.delivery.pk not in taken:
                report.late += 1
            elif f.outcome.ok:
                report.delivered += 1
            else:
                report.failed += 1
        pending.clear()

    try:
        for delivery in claim.rows:
            started_at = timezone.now()
            try:
                outcome = consumers.call(delivery.consumer, delivery.pk, delivery.event, client)
            except Exception as exc:  # a bug of ours must fail the attempt, not kill the sweep
                log.exception("calling consumer %s failed", delivery.consumer.name)
                outcome = consumers.Outcome(False, f"{type(exc).__name__}: {exc}"[:500])
            pending.append(Finished(delivery, outcome, started_at, timezone.now()))
            if len(pending) >= FLUSH_ROWS or time.monotonic() - last_flush >= FLUSH_SECONDS:
                flush()
                last_flush = time.monotonic()
        flush()
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
