"""A delivery's attempt: calling its consumer, a webhook on the client's loop or a Python
consumer on the process's runner thread. Nothing here writes but a late outcome (settle), written
on the runner's thread by the runner when its consumer overran."""

import asyncio
import logging
from collections import deque

from django.conf import settings
from django.utils import timezone

from odal.core import stopping
from odal.core.text import error_text, storable
from odal.work import deadline
from odal.work.passes import AttemptFuture
from odal.work.settle import settle
from outbox import consumers, python_consumers
from outbox.claimed import Claimed
from outbox.python_consumers import OVERRUNS
from outbox.settling import DeliverySettling, Ending
from outbox.webhook_client import WebhookClient

log = logging.getLogger("outbox.sweep")  # (the sweep's lines, wherever written, are the sweep's)


def attempt(consumer, delivery: Claimed, client: WebhookClient, claim) -> Ending | None:
    """Call the consumer for one delivery, unless the claim's hold has run out by the time its
    turn comes: then the row is due again and may be another sweep's, and None says it was not
    started (so it is when the process is stopping). Writes nothing, so it may run on a thread
    of its own (the Python consumers'); a webhook's is attempt_webhook."""
    if not _may_start(claim):
        return None
    started_at = timezone.now()
    try:
        outcome = consumers.call(consumer, delivery.pk, delivery.event, client)
    except Exception as exc:  # a bug of ours must fail the attempt, not kill the sweep
        outcome = _our_bug(consumer, delivery, claim, exc)
    return _ending(consumer, delivery, claim, outcome, started_at)


async def run_webhooks(consumer, rows: deque, client: WebhookClient, claim, paused: set) -> None:
    """The attempts of one consumer's rows of a pass, `(row, future)` each, on the client's loop:
    at most ODAL_WEBHOOK_CONCURRENCY at once (the next starts as one ends, without the pass's
    thread), each when a slot of the client is free too (all consumers together)."""

    async def one_at_a_time() -> None:
        while rows:
            delivery, future = rows.popleft()
            async with client.slots:
                await attempt_webhook(consumer, delivery, client, claim, future, paused)

    await asyncio.gather(*(one_at_a_time() for _ in range(min(settings.ODAL_WEBHOOK_CONCURRENCY, len(rows)))))


async def attempt_webhook(
    consumer, delivery: Claimed, client: WebhookClient, claim, future: AttemptFuture, paused=frozenset()
):
    """attempt() for a webhook, on the client's loop: its future (the pass waits for it) gets
    the Ending, or None if it never started. A future the pass cancelled meanwhile (its
    consumer paused, or the process stopping: its row given back) starts nothing."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        if not _may_start(claim):
            future.set_result(None)
            return
        started_at = timezone.now()

        def may_start() -> bool:  # (asked again once its host is looked up: a lookup may take long)
            return _may_start(claim) and consumer.pk not in paused

        try:
            outcome = await consumers.deliver_webhook(
                consumer, delivery.pk, delivery.event, client, may_start
            )
        except Exception as exc:  # a bug of ours must fail the attempt, not kill the sweep
            outcome = _our_bug(consumer, delivery, claim, exc)
        future.set_result(
            None if outcome is None else _ending(consumer, delivery, claim, outcome, started_at)
        )
    except BaseException as exc:  # (cancelled: the client closed under a pass that ended early)
        future.set_exception(exc)
        raise


def _may_start(claim) -> bool:
    return claim.holds() and deadline.now() < claim.start_by and not stopping.requested()


def _ids(consumer, delivery: Claimed, claim) -> dict:
    return {"delivery": delivery.pk, "event": delivery.event_id, "consumer": consumer.name, "claim": claim.token,
            "attempt": delivery.attempts}  # fmt: skip


def _our_bug(consumer, delivery: Claimed, claim, exc: Exception) -> consumers.Outcome:
    log.error(
        "calling consumer %s failed", consumer.name, exc_info=exc, extra=_ids(consumer, delivery, claim)
    )
    return consumers.Outcome(False, error_text(exc))


def _ending(consumer, delivery: Claimed, claim, outcome: consumers.Outcome, started_at) -> Ending:
    if not outcome.ok:  # logged here, where the consumer is known; a late outcome gets a line of its own
        log.warning(
            "delivery %s attempt %s (claim %s) to consumer %s failed: %s",
            delivery.pk, delivery.attempts, claim.token, consumer.name, storable(outcome.error, 200),
            extra=_ids(consumer, delivery, claim),
        )  # fmt: skip
    return Ending(delivery, outcome, started_at, timezone.now())


def run_python_consumers(jobs: list, client: WebhookClient, claim, run=None) -> None:
    """Python consumers of one claim, `(consumer, delivery, future)` each, in turn on the process's
    Python runner thread (outbox.python_consumers.run_each), each within its consumer's
    timeoutSeconds: past it the attempt fails ("timed out after Ns", written by the pass), and
    what the consumer returns later is settled on the runner's thread, as late. Not started
    (None) if its consumer was paused meanwhile (`run` reads pauses again) or its threads piled
    up during this pass."""

    def skip(consumer) -> bool:
        if run is not None and consumer.pk in run.paused:
            return True
        return OVERRUNS.full(consumer.pk)  # its threads piled up during this pass: given back

    def timed_out(consumer, delivery: Claimed, started_at) -> Ending:
        error = f"timed out after {consumer.timeout_seconds}s (the Python consumer still runs; what it returns is late)"
        log.warning(
            "delivery %s attempt %s (claim %s) to Python consumer %s: %s",
            delivery.pk, delivery.attempts, claim.token, consumer.name, error,
            extra={"delivery": delivery.pk, "consumer": consumer.name, "claim": claim.token},
        )  # fmt: skip
        outcome = consumers.Outcome(False, error, duration_ms=consumer.timeout_seconds * 1000)
        return Ending(delivery, outcome, started_at, timezone.now())

    python_consumers.run_each(
        python_consumers.Jobs(
            jobs,
            call=lambda consumer, delivery: attempt(consumer, delivery, client, claim),
            skip=skip,
            late=lambda ending: settle(DeliverySettling(claim.token), [ending] if ending else []),
            timed_out=timed_out,
        )
    )
