"""The registry drain: claim due registrations (the outbox's claim mechanism), ask the registry,
and end each attempt with a guarded write and a line in the attempt log.

Due pending rows register (or deactivate); due submitted rows are checked. Every write is
guarded by the drain's claim and the status it expects, so nothing the drain writes can touch a
row that a person abandoned, or that another attempt settled, while it was asking.

The pass is registry.drain_pass, what each operation owes registry.operations, its calls
registry.calls, their endings registry.settling. A drain process holds one database connection
(and the listener's), however many calls it has in flight.
"""

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings

from odal.core import tally
from odal.work.claims import database_now
from odal.work.loops import Work
from odal.work.wake import DRAIN
from registry import adapters
from registry.drain_pass import DrainPass, DrainReport
from registry.models import Registration
from registry.pace import Pace


@contextmanager
def drainer(adapter=None):
    """What a run of passes shares: the registry adapter (a run's own is closed with it), the
    pace (registry.pace) and the pool its requests go out on."""
    own = adapter is None
    adapter = adapter or adapters.get_adapter()
    try:
        with ThreadPoolExecutor(settings.ODAL_REGISTRY_CONCURRENCY, thread_name_prefix="odal-drain") as pool:
            yield {"adapter": adapter, "pace": Pace(), "pool": pool}
    finally:
        if own:
            adapter.close()


def drain_once(
    *, batch: int = 50, adapter=None, pace: Pace | None = None, pool: ThreadPoolExecutor | None = None
) -> DrainReport:
    """One pass: claim up to `batch` due registrations and do what each owes, up to
    ODAL_REGISTRY_CONCURRENCY requests at once. While the registry's pause holds (a 429), it
    claims nothing."""
    report = DrainReport(passes=1)
    if settings.ODAL_REGISTRY_ADAPTER == "none" and adapter is None:
        return report  # no registry queues on this node
    if pace is None or pool is None:  # a pass on its own
        with drainer(adapter) as shared:
            return drain_once(batch=batch, **shared)
    if pace.paused_for():
        return report
    claim = Registration.objects.claim(limit=batch, select_related=("passport",))
    report.claimed = len(claim.rows)
    if claim.rows:
        DrainPass(claim, report, adapter, pace, pool).run()
    tally.beat(tally.DRAIN)
    return report


class Drain(Work):
    """The drain's runs (odal.work.loops): each pass is drain_once, with the adapter, the pace and
    the pool a run shares. A run until idle waits for rows falling due within 10 s (a submitted
    row's next check, a short backoff), so a registration goes through in one run, and for a
    pause the registry asked for."""

    name, wake, Report, rows, batch = "registry drain", DRAIN, DrainReport, Registration.objects, 50
    linger_seconds = 10.0

    def tools(self):
        return drainer()

    def one_pass(self, *, batch: int, **shared) -> DrainReport:
        return drain_once(batch=batch, **shared)

    def paused_for(self, tools: dict) -> float:
        return tools["pace"].paused_for()

    def owed(self) -> bool:
        # The schedule's period: a row due later waits for it as well.
        return Registration.objects.due(database_now() + RELAY_HORIZON).exists()


RELAY_HORIZON = timedelta(seconds=60)  # a leading drain hands over while rows fall due this soon
DRAINING = Drain()
drain_until_idle, drain_listening, drain_forever = DRAINING.until_idle, DRAINING.listening, DRAINING.forever
