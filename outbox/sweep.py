"""The delivery sweep: claim due rows, call their consumers, end each attempt with a guarded write
and log it; between passes, the outbox's housekeeping services (outbox.housekeeping.SWEEP).

Any number of sweeps may run at once, on any number of machines: the claim decides which sweep
owns which row, and the terminal writes refuse whoever no longer owns it.

The pass is outbox.sweep_pass, its attempts outbox.attempts, their write outbox.settling.
"""

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

from django.db import connections

from odal.core import tally
from odal.work.loops import Work
from odal.work.services import Due
from odal.work.wake import SWEEP
from outbox import consumers, housekeeping
from outbox.claimed import read_claimed
from outbox.models import Delivery
from outbox.python_consumers import OVERRUNS
from outbox.sweep_pass import SweepPass, SweepReport
from outbox.webhook_client import WebhookClient

SWEEP_IN_FLIGHT = 64  # webhook requests in flight per sweep process, all consumers together


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
