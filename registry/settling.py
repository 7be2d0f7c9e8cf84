"""The drain's endings and their write (odal.work.settle): each ending's guarded write (and what
follows it on the row), the attempt-log lines in one INSERT, and the events of those that took."""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from odal.core.text import error_text, storable
from odal.work.claims import backoff_delay
from odal.work.settle import Settling
from outbox.events import emit_many
from registry import adapters
from registry.models import Registration, RegistrationAttempt

log = logging.getLogger("registry.drain")  # (the drain's lines, wherever written, are the drain's)

Outcome = RegistrationAttempt.Outcome


@dataclass
class Ending:
    """The outcome of one registration attempt, waiting to be written: its guarded write, what
    follows if it takes the row (`on_taken`, an event) or not (`on_late`), the report's count it
    adds to, and its line in the attempt log."""

    attempt: "Attempt"
    operation: str
    outcome: Outcome
    answer: str
    write: Callable[[], bool]
    on_taken: Callable[[], object] | None = None
    on_late: Callable[[], object] | None = None  # in the same transaction, if the write took nothing
    counts: str | None = None
    event: tuple[str, dict] | None = None  # (type, payload), emitted with the set's others
    finished_at: datetime = field(default_factory=timezone.now)  # when the answer came

    def take(self) -> bool:
        took = self.write()
        if took and self.on_taken:
            self.on_taken()
        elif not took and self.on_late:
            self.on_late()
        return took

    def line(self, *, late: bool) -> RegistrationAttempt:
        attempt = self.attempt
        return RegistrationAttempt(
            registration_id=attempt.reg.pk,
            number=attempt.reg.attempts,
            claim_token=attempt.token,
            operation=self.operation,
            started_at=attempt.started_at,
            finished_at=self.finished_at,
            outcome=self.outcome,
            answer=storable(self.answer),
            late=late,
        )


class RegistrationSettling(Settling):
    """The drain's endings (of any claim: each knows its attempt's)."""

    log = log

    def write(self, endings: list[Ending]) -> list[bool]:
        return [ending.take() for ending in endings]

    def log_attempts(self, endings: list[Ending], taken: list[bool]) -> None:
        RegistrationAttempt.objects.bulk_create(
            ending.line(late=not took) for ending, took in zip(endings, taken, strict=True)
        )

    def followed(self, taken: list[Ending]) -> None:
        """The events of the endings that took their row: one emit_many per event type."""
        events: dict[str, list[dict]] = {}
        for ending in taken:
            if ending.event:
                events.setdefault(ending.event[0], []).append(ending.event[1])
        for event_type, payloads in events.items():
            emit_many(event_type, payloads)

    def was_late(self, ending: Ending) -> None:
        attempt = ending.attempt
        log.warning(
            "late %s answer (%s) for registration %s attempt %s (claim %s): its claim was superseded "
            "or the row settled; nothing written",
            ending.operation,
            ending.outcome,
            attempt.reg.pk,
            attempt.reg.attempts,
            attempt.token,
            extra=attempt.ids(),
        )

    def named(self, ending: Ending) -> tuple[str, dict]:
        return f"registration {ending.attempt.reg.pk} {ending.operation}", ending.attempt.ids()

    def refused_error(self, ending: Ending, exc: Exception) -> str:
        return (
            f"the registry answered {ending.outcome} ({ending.answer}), but it could not be written: "
            f"{error_text(exc)}"
        )

    def log_refused(self, ending: Ending, error: str) -> None:
        Ending(ending.attempt, ending.operation, Outcome.WRITE_ERROR, error, lambda: False).line(
            late=False
        ).save()


REGISTRATIONS = RegistrationSettling()


class Attempt:
    """One claimed row's attempt: what it asked ends in an Ending, added to the pass's `endings`
    (written a set at a time)."""

    def __init__(self, reg: Registration, token, endings: list):
        self.reg, self.token, self.endings = reg, token, endings
        self.started_at = timezone.now()
        self.rows = Registration.objects.filter(pk=reg.pk)

    def ids(self) -> dict:
        return {"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts}

    def finish(
        self,
        operation: str,
        outcome: Outcome,
        answer: str,
        write,
        *,
        on_taken=None,
        on_late=None,
        counts=None,
        event=None,
        finished_at: datetime | None = None,
    ) -> None:
        """End the attempt: `write` (a guarded write, True if it took the row) and the log line
        together, then, in the same transaction, `on_taken` and the `event` (registration_event)
        if it took the row, `on_late` if not, and the report's `counts` plus one."""
        self.endings.append(
            Ending(
                self,
                operation,
                outcome,
                answer,
                write,
                on_taken,
                on_late,
                counts,
                event,
                finished_at or timezone.now(),
            )  # fmt: skip
        )

    def failed(self, operation: str, error: str) -> None:
        # Every failed attempt, taken or late (a late one gets a line of its own when written).
        log.warning(
            "registration %s %s attempt %s (claim %s) failed: %s",
            self.reg.pk, operation, self.reg.attempts, self.token, storable(error, 200),
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )  # fmt: skip
        retry_at = timezone.now() + backoff_delay(self.reg.attempts)
        self.finish(
            operation, Outcome.FAILED, error,
            lambda: self.rows.mark_attempt_failed(token=self.token, error=error, retry_at=retry_at),
            counts="failed",
        )  # fmt: skip

    def unknown(self, operation: str, error: str) -> None:
        """No answer of the registry's own came back, and the request may have reached it (a
        timeout or a broken connection after sending, a gateway's status, an answer that is not the
        registry's own JSON, whatever its status): it fails and backs off as any failure, and the row remembers when it ended
        (last_unknown_at), so no abandon or suspend takes the task list's silence for proof until
        ODAL_REGISTRY_SETTLE_SECONDS after. A late one (its claim superseded) writes no outcome
        but is remembered all the same: its request may land too."""
        log.warning(
            "registration %s %s attempt %s (claim %s): outcome unknown: %s",
            self.reg.pk, operation, self.reg.attempts, self.token, storable(error, 200),
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )  # fmt: skip
        ended = timezone.now()
        retry_at = ended + backoff_delay(self.reg.attempts)
        self.finish(
            operation, Outcome.UNKNOWN, error,
            lambda: self.rows.mark_attempt_failed(token=self.token, error=error, retry_at=retry_at, unknown_at=ended),
            on_late=lambda: self.rows.note_unknown_outcome(at=ended),
            counts="unknown", finished_at=ended,
        )  # fmt: skip

    def rate_limited(self, operation: str, exc: adapters.RateLimited) -> None:
        """The registry answered 429: it acted on nothing, so this attempt does not count against
        the row (it is given back: a rate limit is the registry's state, not the row's; counting
        it would back the row off and call it stalled for no fault of its own). The row is due
        when the pause ends; the attempt log keeps a rate_limited line."""
        retry_at = timezone.now() + timedelta(seconds=exc.retry_after)
        error = storable(exc)
        self.finish(
            operation, Outcome.RATE_LIMITED, error,
            lambda: self.rows.mark_rate_limited(token=self.token, error=error, retry_at=retry_at),
            counts="rate_limited",
        )  # fmt: skip
