"""A sweep pass: the attempts of one claim of deliveries (odal.work.passes), and what it counts."""

import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from odal.core import reconnect
from odal.work.loops import Report
from odal.work.passes import AttemptFuture, Pass
from odal.work.settle import settle
from outbox import service
from outbox.attempts import run_python_consumers, run_webhooks
from outbox.models import Consumer, Delivery
from outbox.settling import DeliverySettling, Ending
from outbox.webhook_client import WebhookClient

log = logging.getLogger("outbox.sweep")  # (the sweep's lines, wherever written, are the sweep's)


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
        text += self.given_back()
        if self.write_errors:
            text += f", {self.write_errors} not written (database refused; see the attempt log)"
        return text


FLUSH_ROWS = 500  # outcomes written together, in one transaction (a claim of 500 that ends at once: one)
FLUSH_SECONDS = 1.0  # ...or sooner (a quarter of the hold if that is less), so a slow consumer
# does not hold finished outcomes back
REFRESH_SECONDS = 0.5  # a pass re-reads its consumers' pause and secrets at most this often


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

    def ended(self, delivery, job, ending: Ending | None) -> None:
        if ending is None:
            self.not_started.append(delivery.pk)
        else:
            self.pending.append(ending)

    def write(self, endings: list[Ending]) -> None:
        written = settle(DeliverySettling(self.claim.token), endings)
        self.report.write_errors += len(written.refused)
        self.report.late += len(written.late)
        for ending in written.taken:
            if ending.outcome.ok:
                self.report.delivered += 1
            else:
                self.report.failed += 1
        self.check_health(endings)

    def check_health(self, endings: list[Ending]) -> None:
        """Tell each consumer's failure streak what this flush saw (outbox.service.record_health):
        a consumer failing long enough is paused, and its rows not started yet are given back."""
        seen: dict[int, dict] = {}
        for f in endings:
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
