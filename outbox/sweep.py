"""The delivery sweep: claim due rows, call their consumers, end each attempt with a guarded write
and log it; between passes, the outbox's housekeeping services (outbox.housekeeping.SWEEP).

Any number of sweeps may run at once, on any number of machines: the claim decides which sweep
owns which row, and the terminal writes refuse whoever no longer owns it.
"""

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from odal.core import reconnect, stopping, tally
from odal.core.lookups import Ids
from odal.core.text import error_text, storable
from odal.work import deadline
from odal.work.claims import backoff_delay
from odal.work.loops import Report, Work
from odal.work.passes import AttemptFuture, Pass, write_in_sets
from odal.work.services import Due
from odal.work.wake import SWEEP
from outbox import consumers, housekeeping, python_consumers, service
from outbox.models import Consumer, Delivery, DeliveryAttempt, Event, Failure
from outbox.python_consumers import OVERRUNS
from outbox.webhook_client import WebhookClient

log = logging.getLogger(__name__)


@dataclass
class SweepReport(Report):
    dead_lettered: int = 0
    delivered: int = 0
    failed: int = 0

    def summary(self) -> str:
        text = (
            f"{self.claimed} claimed, {self.delivered} delivered, {self.failed} failed, "
            f"{self.late} late, {self.dead_lettered} dead-lettered (never reported)"
        )
        if self.not_started:
            why = "given back: the task's time was up" if self.out_of_time else "hold ran out"
            text += f", {self.not_started} not started ({why})"
        if self.write_errors:
            text += f", {self.write_errors} not written (database refused; see the attempt log)"
        return text


FLUSH_ROWS = 500  # outcomes written together, in one transaction (a claim of 500 that ends at once: one)
FLUSH_SECONDS = 1.0  # ...or sooner (a quarter of the hold if that is less), so a slow consumer
# does not hold finished outcomes back
SWEEP_IN_FLIGHT = 64  # webhook requests in flight per sweep process, all consumers together
REFRESH_SECONDS = 0.5  # a pass re-reads its consumers' pause and secrets at most this often


# What a pass reads of the rows it claimed (read_claimed): no timestamp of the delivery (each costs
# a parse in Python), the whole event (a Python consumer gets it, a webhook's body is made of it).
CLAIMED = (
    "pk", "event_id", "consumer_id", "attempts", "attempts_before", "event__type", "event__payload",
    "event__created_at",
)  # fmt: skip
EVENT_READ = ("id", "type", "payload", "created_at")  # (in the model's order, as Model.from_db takes them)


class Claimed:
    """A claimed delivery as a pass sees it: its id, consumer and event, and the number of this
    attempt. Not a model instance (making one cost the sweep more than the rest of its read):
    nothing of it is read again or saved, and a field a pass does not read is not there at all,
    so using one fails at once instead of costing a query a row."""

    __slots__ = ("pk", "event_id", "consumer_id", "attempts", "number", "event")

    def __init__(self, pk, event_id, consumer_id, attempts, event, number=None):
        self.pk, self.event_id, self.consumer_id, self.attempts, self.event = (
            pk, event_id, consumer_id, attempts, event,
        )  # fmt: skip
        # Its number in the attempt log: on across replays (attempts counts the budget only).
        self.number = attempts if number is None else number

    def __repr__(self) -> str:
        return f"<Claimed delivery {self.pk} attempt {self.attempts}>"


def read_claimed(taken) -> dict:
    """The rows a pass claimed, by primary key (Claimed, each with its event whole), made from
    one joined read of plain rows: Django's select_related, two model instances and three
    timestamps a row, cost more than the rest of the sweep's own work per delivery."""
    rows, db = {}, taken.db
    for pk, event_id, consumer_id, attempts, before, *event in taken.values_list(*CLAIMED):
        event = Event.from_db(db, EVENT_READ, (event_id, *event))
        rows[pk] = Claimed(pk, event_id, consumer_id, attempts, event, number=before + attempts)
    return rows


@dataclass
class Finished:
    delivery: "Claimed"
    outcome: consumers.Outcome
    started_at: object
    finished_at: object


ATTEMPT_COLUMNS = (
    "delivery_id", "number", "claim_token", "started_at", "finished_at", "outcome", "error",
    "http_status", "duration_ms", "late", "answer", "content_type", "consumer_id",
)  # fmt: skip


def log_attempts(lines: list[tuple]) -> None:
    """Append attempt-log lines (tuples in ATTEMPT_COLUMNS order). One COPY of all
    the lines, whatever their number (the driver writes the rows in C; an INSERT … SELECT FROM
    unnest had each array element quoted in Python): the log costs one statement per flush, not
    one model object per attempt. The COPY goes through the connection's execute wrappers, so
    what counts or logs statements sees it."""
    if not lines:
        return
    statement = f"COPY {DeliveryAttempt._meta.db_table} ({', '.join(ATTEMPT_COLUMNS)}) FROM STDIN"

    def copy(sql, rows, many, context):
        with connection.wrap_database_errors, context["cursor"].cursor.copy(sql) as writing:
            for row in rows:
                writing.write_row(row)

    with connection.cursor() as cursor:
        cursor._execute_with_wrappers(statement, lines, many=False, executor=copy)


def _settle(token, finished: list[Finished]) -> set:
    """Write a run of outcomes in the caller's transaction: successes in one guarded UPDATE
    (mark_delivered_each), failures in another, each with its own error and backoff
    (mark_attempts_failed_each),
    a late success's note on its row (note_late_success: the consumer has it, whatever the row
    says), and one attempt-log line per attempt. Returns the ids whose write took."""
    now = timezone.now()
    delivered = [f.delivery.pk for f in finished if f.outcome.ok]
    taken = (
        Delivery.objects.filter(pk__any=Ids(delivered)).mark_delivered_each(token=token, at=now)
        if delivered
        else set()
    )
    failures = [
        Failure(
            f.delivery.pk, f.outcome.error, f.finished_at + backoff_delay(f.delivery.attempts), f.finished_at
        )
        for f in finished
        if not f.outcome.ok
    ]
    taken |= Delivery.objects.mark_attempts_failed_each(token=token, failures=failures)
    answered_late = [f for f in finished if f.outcome.ok and f.delivery.pk not in taken]
    for f in sorted(answered_late, key=lambda f: f.delivery.pk):  # (rows locked in one order)
        Delivery.objects.filter(pk=f.delivery.pk).note_late_success(at=f.finished_at)
    log_attempts([_attempt_line(token, f, late=f.delivery.pk not in taken) for f in finished])
    return taken


def _attempt_line(token, f: Finished, *, late: bool, outcome: str | None = None, error: str | None = None):
    if outcome is None:
        outcome = DeliveryAttempt.Outcome.DELIVERED if f.outcome.ok else DeliveryAttempt.Outcome.FAILED
    return (
        f.delivery.pk,
        f.delivery.number,
        token,
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


@dataclass
class Settled:
    taken: set = field(default_factory=set)  # outcomes written
    unwritten: set = field(default_factory=set)  # outcomes the database refused; their rows stay claimed


def finish_attempts(token, finished: list[Finished]) -> Settled:
    """End a run of attempts of one claim, written in sets (odal.work.passes.write_in_sets): a
    row the database cannot store keeps its claim until the hold runs out (then it is due again,
    its attempt counted) and gets an attempt-log line saying why (outcome write_error).
    Outcomes not taken are logged as late and change nothing but a late success's note
    (lateSuccessAt), written with its attempt-log line."""
    settled = Settled()

    def write(some: list[Finished]) -> list[bool]:
        taken = _settle(token, some)
        return [f.delivery.pk in taken for f in some]

    for f, took in zip(
        finished,
        write_in_sets(finished, write, lambda f, exc: record_write_error(token, f, exc)),
        strict=True,
    ):
        if took is None:
            settled.unwritten.add(f.delivery.pk)
        elif took:
            settled.taken.add(f.delivery.pk)
    for f in finished:
        if f.delivery.pk not in settled.taken and f.delivery.pk not in settled.unwritten:
            log.warning(
                "late %s of delivery %s attempt %s (claim %s): its claim was superseded; %s",
                "success" if f.outcome.ok else "failure",
                f.delivery.pk,
                f.delivery.attempts,
                token,
                "noted as its lateSuccessAt, nothing else written" if f.outcome.ok else "nothing written",
                extra={"delivery": f.delivery.pk, "event": f.delivery.event_id, "claim": token,
                       "attempt": f.delivery.attempts},
            )  # fmt: skip
    return settled


def record_write_error(token, f: Finished, exc: Exception) -> None:
    """The database refused this outcome: say so in the attempt log (counted as
    outbox_write_errors_total) and in the process log, and go on."""
    what = "delivered" if f.outcome.ok else f"failed ({f.outcome.error})"
    error = f"the attempt {what}, but its outcome could not be written: {error_text(exc)}"
    ids = {"delivery": f.delivery.pk, "event": f.delivery.event_id, "claim": token,
           "attempt": f.delivery.attempts}  # fmt: skip
    log.error("delivery %s attempt %s: %s", f.delivery.pk, f.delivery.attempts, storable(error), extra=ids)
    try:
        with transaction.atomic():
            log_attempts(
                [
                    _attempt_line(
                        token, f, late=False, outcome=DeliveryAttempt.Outcome.WRITE_ERROR, error=error
                    )
                ]
            )
    except Exception as exc:
        reconnect.raise_if_lost(exc)
        log.exception("delivery %s: not even the attempt-log line could be written", f.delivery.pk, extra=ids)


def attempt(consumer, delivery: "Claimed", client: WebhookClient, claim) -> Finished | None:
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
    return _finished(consumer, delivery, claim, outcome, started_at)


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
    consumer, delivery: "Claimed", client: WebhookClient, claim, future: AttemptFuture, paused=frozenset()
):
    """attempt() for a webhook, on the client's loop: its future (the pass waits for it) gets
    the Finished, or None if it never started. A future the pass cancelled meanwhile (its
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
            None if outcome is None else _finished(consumer, delivery, claim, outcome, started_at)
        )
    except BaseException as exc:  # (cancelled: the client closed under a pass that ended early)
        future.set_exception(exc)
        raise


def _may_start(claim) -> bool:
    return claim.holds() and deadline.now() < claim.start_by and not stopping.requested()


def _ids(consumer, delivery: "Claimed", claim) -> dict:
    return {"delivery": delivery.pk, "event": delivery.event_id, "consumer": consumer.name, "claim": claim.token,
            "attempt": delivery.attempts}  # fmt: skip


def _our_bug(consumer, delivery: "Claimed", claim, exc: Exception) -> consumers.Outcome:
    log.error(
        "calling consumer %s failed", consumer.name, exc_info=exc, extra=_ids(consumer, delivery, claim)
    )
    return consumers.Outcome(False, error_text(exc))


def _finished(consumer, delivery: "Claimed", claim, outcome: consumers.Outcome, started_at) -> Finished:
    if not outcome.ok:  # logged here, where the consumer is known; a late outcome gets a line of its own
        log.warning(
            "delivery %s attempt %s (claim %s) to consumer %s failed: %s",
            delivery.pk, delivery.attempts, claim.token, consumer.name, storable(outcome.error, 200),
            extra=_ids(consumer, delivery, claim),
        )  # fmt: skip
    return Finished(delivery, outcome, started_at, timezone.now())


def run_python_consumers(jobs: list, client: WebhookClient, claim, run=None) -> None:
    """Python consumers of one claim, `(consumer, delivery, future)` each, one after another on
    the process's Python runner thread (they may use the database, through that thread's own
    connection), watched from the sweep's Python thread (outbox.python_consumers.run_each). Each
    future gets its result, so the sweep's thread writes outcomes of webhooks while these run.

    Each runs within its consumer's timeoutSeconds as a webhook's request does. Past it the
    attempt is failed ("timed out after Ns", written by the pass like any failure); what the
    consumer returns later is written then, as a late write: guarded by the claim like every
    outcome, so once the timeout's failure is written it takes nothing and goes to the attempt
    log as late (a late success noted as lateSuccessAt), as a late webhook answer does. Not
    started (None) if its consumer was paused meanwhile (`run`, the Pass, reads pauses again) or
    its threads piled up during this pass."""

    def skip(consumer) -> bool:
        if run is not None and consumer.pk in run.paused:
            return True
        return OVERRUNS.full(consumer.pk)  # its threads piled up during this pass: given back

    def timed_out(consumer, delivery: "Claimed", started_at) -> Finished:
        error = f"timed out after {consumer.timeout_seconds}s (the Python consumer still runs; what it returns is late)"
        log.warning(
            "delivery %s attempt %s (claim %s) to Python consumer %s: %s",
            delivery.pk, delivery.attempts, claim.token, consumer.name, error,
            extra={"delivery": delivery.pk, "consumer": consumer.name, "claim": claim.token},
        )  # fmt: skip
        outcome = consumers.Outcome(False, error, duration_ms=consumer.timeout_seconds * 1000)
        return Finished(delivery, outcome, started_at, timezone.now())

    python_consumers.run_each(
        python_consumers.Jobs(
            jobs,
            call=lambda consumer, delivery: attempt(consumer, delivery, client, claim),
            skip=skip,
            late=lambda f: finish_attempts(claim.token, [f] if f else []),
            timed_out=timed_out,
        )
    )


class SweepPass(Pass):
    """The work of one claim. Webhooks run on the client's loop, at most ODAL_WEBHOOK_CONCURRENCY at
    once per consumer; Python consumers one after another on a thread of their own. Only this thread
    writes (odal.work.passes), so no outcome waits behind a slow consumer of another kind. No
    attempt starts after the claim's hold has run out, nor one of a consumer paused meanwhile."""

    rows, flush_rows, flush_seconds = Delivery.objects, FLUSH_ROWS, FLUSH_SECONDS
    look_seconds = FLUSH_SECONDS  # (see __init__)
    not_started_line = (
        "%s claimed deliveries not started: the claim's hold ran out first, their consumer was paused, "
        "this process is stopping, or its task's time is up"
    )

    def __init__(self, claim, report: SweepReport, client: WebhookClient, python: ThreadPoolExecutor):
        super().__init__(claim, report)
        # While Python consumers run, the pass's thread reads pauses again (look) this often.
        self.look_seconds = min(self.flush_seconds, max(REFRESH_SECONDS, 0.05))
        self.client, self.python = client, python
        self.consumers = Consumer.objects.in_bulk({d.consumer_id for d in claim.rows})
        self.refreshed = time.monotonic()  # (just read)
        self.paused: set = set()  # consumers paused during this pass (by a person or by odal)
        self.streaks_ended: set = set()  # consumers whose failure streak a success of this pass ended
        self.webhooks: dict[int, list] = {}  # webhook rows by consumer, as (row, its future)
        self.python_jobs = []
        for d in claim.rows:
            if self.consumers[d.consumer_id].kind == Consumer.Kind.WEBHOOK:
                self.webhooks.setdefault(d.consumer_id, []).append((d, AttemptFuture()))
            else:
                self.python_jobs.append((self.consumers[d.consumer_id], d, AttemptFuture()))
        self.handed: dict[int, list] = {}  # those handed to the client's loop, not all ended

    def longest_attempt(self) -> float:
        return max(consumer.timeout_seconds for consumer in self.consumers.values())

    def refresh(self) -> None:
        """Re-read what a person may change under a running pass, at most every REFRESH_SECONDS:
        a consumer paused meanwhile starts no more attempts (its rows not started are given
        back; a Python consumer's are skipped by the runner, which reads `paused`), and a
        rotated secret signs the next request (a leaked one, dropped with no grace, no longer
        does). On the pass's own thread only, with its connection."""
        now = time.monotonic()
        if now - self.refreshed < REFRESH_SECONDS:
            return
        self.refreshed = now
        fields = ("pk", "paused", "secret", "previous_secret", "previous_secret_expires_at")
        for row in Consumer.objects.filter(pk__in=list(self.consumers)).values(*fields):
            consumer = self.consumers[row["pk"]]
            consumer.secret, consumer.previous_secret = row["secret"], row["previous_secret"]
            consumer.previous_secret_expires_at = row["previous_secret_expires_at"]
            if row["paused"]:
                self.paused.add(row["pk"])

    def start_more(self) -> None:
        if self.python_jobs:  # (all of them at once, on the Python thread, which starts each in turn)
            jobs, self.python_jobs = self.python_jobs, []
            for _, d, future in jobs:
                self.track(future, d, quiet=True)
            self.python.submit(run_python_consumers, jobs, self.client, self.claim, self)
        if self.webhooks:  # (all of them, once: the loop starts each when one of its consumer's ends)
            runs, self.handed, self.webhooks = [], self.webhooks, {}
            for consumer_id, rows in self.handed.items():
                for d, future in rows:
                    self.track(future, d, quiet=True)
                runs.append(
                    run_webhooks(
                        self.consumers[consumer_id], deque(rows), self.client, self.claim, self.paused
                    )
                )
            self.client.submit(runs)  # (one hand-over to the loop)
        for consumer_id in self.paused.intersection(self.handed):
            # No more attempts: those not started are given back (a stop: Pass.run gave them back).
            for d, future in self.handed.pop(consumer_id):
                if future.cancel():
                    del self.in_flight[future]
                    self.not_started.append(d.pk)

    def look(self) -> None:
        self.refresh()

    def ended(self, delivery, job, finished: Finished | None) -> None:
        if finished is None:
            self.not_started.append(delivery.pk)
        else:
            self.pending.append(finished)

    def write(self, finished: list[Finished]) -> None:
        settled = finish_attempts(self.claim.token, finished)
        for f in finished:
            if f.delivery.pk in settled.unwritten:
                self.report.write_errors += 1
            elif f.delivery.pk not in settled.taken:
                self.report.late += 1
            elif f.outcome.ok:
                self.report.delivered += 1
            else:
                self.report.failed += 1
        self.check_health(finished)

    def check_health(self, finished: list[Finished]) -> None:
        """Tell each consumer's failure streak what this flush saw (outbox.service.record_health):
        a consumer failing long enough is paused, and its rows not started yet are given back."""
        seen: dict[int, dict] = {}
        for f in finished:
            s = seen.setdefault(
                f.delivery.consumer_id, {"successes": 0, "failures": 0, "first": None, "errors": []}
            )
            if f.outcome.ok:
                s["successes"] += 1
            else:
                s["failures"] += 1
                s["first"] = min(s["first"] or f.started_at, f.started_at)
                s["errors"].append(f.outcome.error)
        for consumer_id, s in seen.items():
            consumer = self.consumers.get(consumer_id)
            if consumer is None or (s["successes"] and consumer_id in self.streaks_ended):
                continue  # one success a pass ends a streak: the next flushes need not say it again
            if s["successes"]:
                self.streaks_ended.add(consumer_id)
            try:
                if service.record_health(
                    consumer,
                    successes=s["successes"],
                    failures=s["failures"],
                    first_failure_at=s["first"],
                    errors=s["errors"],
                ):
                    self.paused.add(consumer_id)
            except Exception as exc:  # bookkeeping: it never costs a pass its outcomes
                if reconnect.is_lost(exc):
                    raise  # (they are written: the pass ends, and its loop waits for the database)
                log.exception("recording the health of consumer %s failed", consumer.name)


def run_pass(
    *, batch: int = 100, client: WebhookClient | None = None, python: ThreadPoolExecutor | None = None
) -> SweepReport:
    """One pass: claim up to `batch` due deliveries, and run them."""
    report = SweepReport(passes=1)
    claim = Delivery.objects.claim(limit=batch, read=read_claimed, skip=OVERRUNS.skip())
    report.claimed = len(claim.rows)
    if claim.rows:
        with ExitStack() as stack:
            if client is None or python is None:  # a pass on its own
                shared = stack.enter_context(sweeper())
                client, python = client or shared["client"], python or shared["python"]
            SweepPass(claim, report, client, python).run()
    tally.beat(tally.SWEEP)
    OVERRUNS.report()  # (no statement unless it holds a consumer back, or did)
    return report


def sweep_once(
    *, batch: int = 100, client: WebhookClient | None = None, python: ThreadPoolExecutor | None = None
) -> SweepReport:
    """A pass on its own: the sweep's housekeeping services first (park or unpark rows of paused or
    resumed consumers, dead-letter spent rows), then a pass (run_pass)."""
    done = Due(housekeeping.SWEEP).run()
    report = run_pass(batch=batch, client=client, python=python)
    report.dead_lettered = done[housekeeping.DEAD_LETTER.name]
    return report


@contextmanager
def sweeper():
    """The webhook client (its loop thread) and the Python-consumer thread that a run of passes shares."""
    with (
        consumers.webhook_client(in_flight=SWEEP_IN_FLIGHT) as client,
        ThreadPoolExecutor(1, thread_name_prefix="odal-python") as python,
    ):
        try:
            yield {"client": client, "python": python}
        finally:
            python.submit(connections.close_all).result()  # that thread's own connection, if any


class Sweep(Work):
    """The sweep's runs (odal.work.loops): each pass is run_pass, with the client, the webhook
    pool and the Python thread a run shares, and its housekeeping services when due."""

    name, wake, Report, rows, batch = "outbox sweep", SWEEP, SweepReport, Delivery.objects, 100

    @contextmanager
    def tools(self):
        with sweeper() as shared:
            yield {**shared, "chores": Due(housekeeping.SWEEP)}

    def one_pass(self, *, batch: int, chores: Due, **shared) -> SweepReport:
        """The run's services come after its passes, so that no commit's webhook waits for them
        (issue 26, item 7), but until each has run once: before the claim."""
        if not chores.begun:
            done = chores.run()
            report = run_pass(batch=batch, **shared)
        else:
            report = run_pass(batch=batch, **shared)
            done = chores.run()
        report.dead_lettered += done.get(housekeeping.DEAD_LETTER.name, 0)
        return report

    def owed(self) -> bool:
        return Delivery.objects.filter(status=Delivery.Status.PENDING).exists()


SWEEPING = Sweep()
sweep_until_idle, sweep_listening, sweep_forever = SWEEPING.until_idle, SWEEPING.listening, SWEEPING.forever
