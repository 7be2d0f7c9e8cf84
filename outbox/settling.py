"""The sweep's endings and their write (odal.work.settle): successes in one guarded UPDATE,
failures in another, a late success noted on its row, and one COPY of the attempt-log lines."""

import logging
from dataclasses import dataclass

from django.utils import timezone

from odal.core.lookups import Ids
from odal.core.text import error_text, storable
from odal.work.claims import backoff_delay
from odal.work.settle import Settling
from outbox import consumers
from outbox.attempt_log import log_attempts
from outbox.claimed import Claimed
from outbox.models import Delivery, DeliveryAttempt, Failure

log = logging.getLogger("outbox.sweep")  # (the sweep's lines, wherever written, are the sweep's)


@dataclass
class Ending:
    """The outcome of one delivery attempt, waiting to be written."""

    delivery: Claimed
    outcome: consumers.Outcome
    started_at: object
    finished_at: object


class DeliverySettling(Settling):
    """The endings of one claim (`token`). A late success's note (lateSuccessAt: the consumer has
    it, whatever the row says) is written with its attempt-log line; a late failure writes nothing."""

    log = log

    def __init__(self, token):
        self.token = token

    def write(self, endings: list[Ending]) -> list[bool]:
        """Successes in one guarded UPDATE (mark_delivered_each), failures in another, each with its
        own error and backoff (mark_attempts_failed_each), and a late success's note."""
        token, now = self.token, timezone.now()
        delivered = [f.delivery.pk for f in endings if f.outcome.ok]
        taken = (
            Delivery.objects.filter(pk__any=Ids(delivered)).mark_delivered_each(token=token, at=now)
            if delivered
            else set()
        )
        failures = [
            Failure(
                f.delivery.pk,
                f.outcome.error,
                f.finished_at + backoff_delay(f.delivery.attempts),
                f.finished_at,
            )
            for f in endings
            if not f.outcome.ok
        ]
        taken |= Delivery.objects.mark_attempts_failed_each(token=token, failures=failures)
        answered_late = [f for f in endings if f.outcome.ok and f.delivery.pk not in taken]
        for f in sorted(answered_late, key=lambda f: f.delivery.pk):  # (rows locked in one order)
            Delivery.objects.filter(pk=f.delivery.pk).note_late_success(at=f.finished_at)
        return [f.delivery.pk in taken for f in endings]

    def log_attempts(self, endings: list[Ending], taken: list[bool]) -> None:
        log_attempts([self.line(f, late=not took) for f, took in zip(endings, taken, strict=True)])

    def line(self, f: Ending, *, late: bool, outcome: str | None = None, error: str | None = None) -> tuple:
        """Its attempt-log line (outbox.attempt_log.ATTEMPT_COLUMNS)."""
        if outcome is None:
            outcome = DeliveryAttempt.Outcome.DELIVERED if f.outcome.ok else DeliveryAttempt.Outcome.FAILED
        return (
            f.delivery.pk,
            f.delivery.number,
            self.token,
            f.started_at,
            f.finished_at,
            outcome,
            storable(f.outcome.error if error is None else error),
            f.outcome.http_status,
            f.outcome.duration_ms,
            late,
            f.outcome.answer,  # storable and bounded where it was read (outbox.consumers)
            f.outcome.content_type,
            f.delivery.consumer_id,
        )

    def was_late(self, f: Ending) -> None:
        log.warning(
            "late %s of delivery %s attempt %s (claim %s): its claim was superseded; %s",
            "success" if f.outcome.ok else "failure",
            f.delivery.pk,
            f.delivery.attempts,
            self.token,
            "noted as its lateSuccessAt, nothing else written" if f.outcome.ok else "nothing written",
            extra=self.named(f)[1],
        )

    def named(self, f: Ending) -> tuple[str, dict]:
        ids = {"delivery": f.delivery.pk, "event": f.delivery.event_id, "claim": self.token,
               "attempt": f.delivery.attempts}  # fmt: skip
        return f"delivery {f.delivery.pk} attempt {f.delivery.attempts}", ids

    def refused_error(self, f: Ending, exc: Exception) -> str:
        what = "delivered" if f.outcome.ok else f"failed ({f.outcome.error})"
        return f"the attempt {what}, but its outcome could not be written: {error_text(exc)}"

    def log_refused(self, f: Ending, error: str) -> None:
        log_attempts([self.line(f, late=False, outcome=DeliveryAttempt.Outcome.WRITE_ERROR, error=error)])
