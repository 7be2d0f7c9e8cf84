"""Housekeeping services: small named jobs beside the claimed work, each with its cadence and one
job (River's maintenance services, Oban's plugins). Each app names its own (outbox.housekeeping,
registry.retention); a run of passes runs its services between passes, the scheduled purge task
(outbox.tasks.purge) the slow ones. docs/architecture.md, "Housekeeping services"."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from odal.core import tally
from odal.core.models import IdempotencyRecord

SCHEDULED_SECONDS = 600.0  # the slow services' cadence: the purge schedule's (migration outbox/0007)
IDLE_WORKERS = timedelta(days=7)


@dataclass(frozen=True)
class Service:
    name: str
    seconds: float  # its cadence: due again this long after it last began
    run: Callable[[], object]  # does its job; returns what it did (a count, or a report)


class Due:
    """Runs `services`, in their order, each when due: the first time, then once its cadence has
    gone by since it last began. One that raised is due again at once."""

    def __init__(self, services: tuple[Service, ...]):
        self.services, self.last = services, {}

    @property
    def begun(self) -> bool:
        """Whether each service has run once."""
        return len(self.last) == len(self.services)

    def run(self) -> dict[str, object]:
        """What each service that was due did, by its name."""
        done = {}
        for service in self.services:
            began = time.monotonic()
            if began - self.last.get(service.name, float("-inf")) >= service.seconds:
                done[service.name] = service.run()
                self.last[service.name] = began
        return done


# The foundation's own tables (odal.core.models): written by every kind of work, kept small here.
TALLY_COMPACTION = Service("tally compaction", SCHEDULED_SECONDS, tally.compact)
HEARTBEATS = Service(
    "heartbeats", SCHEDULED_SECONDS, lambda: tally.forget_idle_workers(older_than=IDLE_WORKERS)
)
IDEMPOTENCY_KEYS = Service(  # (a small table: one DELETE)
    "idempotency keys", SCHEDULED_SECONDS, lambda: IdempotencyRecord.objects.forget_expired()
)
