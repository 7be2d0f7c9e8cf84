"""The delivery sweep: dead-letter spent rows, claim due ones, call their consumers, end each
attempt with a guarded write and log it.

Any number of sweeps may run at once, on any number of machines: the claim decides which sweep
owns which row, and the terminal writes refuse whoever no longer owns it.

The pass is outbox.sweep_pass, its attempts outbox.attempts, their write outbox.settling.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

from django.db import connections
from django.utils import timezone

from odal import tally
from odal.work.loops import Work
from odal.work.wake import SWEEP
from outbox import consumers, service
from outbox.claimed import read_claimed
from outbox.models import Delivery
from outbox.python_consumers import OVERRUNS
from outbox.sweep_pass import SweepPass, SweepReport
from outbox.webhook_client import WebhookClient

SWEEP_IN_FLIGHT = 64  # webhook requests in flight per sweep process, all consumers together
HOUSEKEEPING_SECONDS = 1.0  # a run of passes parks and unparks paused consumers' rows this often


def housekeep() -> int:
    """Park and unpark rows of paused and resumed consumers, and dead-letter spent rows (returns
    how many). A run of passes does it about once a second (Every): the first time before its
    first claim, then after a pass, so that no commit's webhook waits for it (issue 26, item 7:
    at 50 events/s the event after each second's turn waited its four statements)."""
    now = timezone.now()
    # Parking only keeps paused rows out of the due index (no claim or dead-lettering takes
    # a paused consumer's row anyway); unparking is the net under a resume (see the models).
    # A Python consumer whose target ODAL_PYTHON_CONSUMERS does not allow is paused before any
    # of its rows can be claimed: on the first pass of every run, so at every start.
    service.pause_python_consumers_outside_allow_list(now=now)
    # "No live claim holds it" and "due" by the database's clock (odal.work.claims).
    Delivery.objects.park_paused()  # (one statement; takes nothing while none is paused)
    for consumer_id in Delivery.objects.resumed_consumers_with_parked_rows():  # (one statement)
        Delivery.objects.unpark(consumer_id=consumer_id)
    # A spent row is never claimed (the claim's filter), so dead-lettering it can wait for
    # the run's housekeeping: one statement less in every other pass (issue 26, item 7: a
    # pass of one webhook is mostly fixed cost, and at 50 events/s the next commit waits it).
    return Delivery.objects.dead_letter_exhausted()


class Every:
    """Whether `seconds` have gone by since it last said so (and the first time it is asked):
    how often a run of passes does its housekeeping (parking and unparking cost two statements;
    a busy sweep makes several passes a second)."""

    def __init__(self, seconds: float):
        self.seconds, self.last = seconds, float("-inf")

    def elapsed(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


def sweep_once(
    *,
    batch: int = 100,
    client: WebhookClient | None = None,
    python: ThreadPoolExecutor | None = None,
    housekeeping: bool = True,
) -> SweepReport:
    """One pass: with `housekeeping`, first park or unpark rows of paused or resumed consumers
    and dead-letter spent rows (housekeep: a run of passes does it about once a second, after
    its passes but the first); then claim up to `batch` due deliveries, and run them."""
    report = SweepReport(passes=1)
    if housekeeping:
        report.dead_lettered = housekeep()
    # The hold runs from the claim's own clock reading, not from before the dead-lettering.
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
    """The sweep's runs (odal.work.loops): each pass is sweep_once, with the client, the webhook
    pool and the Python thread a run shares, and housekeeping about once a second."""

    name, wake, Report, rows, batch = "outbox sweep", SWEEP, SweepReport, Delivery.objects, 100

    @contextmanager
    def tools(self):
        with sweeper() as shared:
            yield {**shared, "chores": Every(HOUSEKEEPING_SECONDS)}

    def one_pass(self, *, batch: int, chores: Every, **shared) -> SweepReport:
        if chores.last == float("-inf"):  # until the run's first housekeeping is done: before the claim
            report = sweep_once(batch=batch, housekeeping=True, **shared)
            chores.elapsed()  # (not reached if the pass raised: the next one does it first again)
            return report
        report = sweep_once(batch=batch, housekeeping=False, **shared)
        if chores.elapsed():
            report.dead_lettered += housekeep()
        return report

    def owed(self) -> bool:
        return Delivery.objects.filter(status=Delivery.Status.PENDING).exists()


SWEEPING = Sweep()
sweep_until_idle, sweep_listening, sweep_forever = SWEEPING.until_idle, SWEEPING.listening, SWEEPING.forever
