"""Retention: settled rows older than a retention period are deleted, in bounded batches.

What goes (each rule is one Q or queryset below, used both to find candidates and, restated, in
the DELETE that removes them):
- delivered deliveries (no claim) delivered before `delivered_before`, with their attempt lines;
- dead deliveries (no claim) dead-lettered before `dead_before`, with their attempt lines;
- events created before `delivered_before` with no delivery left (or that never had one);
- the registry's attempt lines finished before `delivered_before`, of registrations that are
  settled (registered, rejected, suspended, deactivated, abandoned) and that no claim holds.
Never: pending deliveries, claimed rows, passports, registrations, the audit trail.

Each batch is its own transaction: walk the next `batch` entries of an index (keyset: from
where the last batch stopped, so each run visits an entry at most once and no batch scans a
table); pick those the rule takes, by primary key, `FOR UPDATE SKIP LOCKED` (a row a replay or
resend holds is passed over, never waited on, and left as that writer leaves it); delete them
with a DELETE that restates the rule; delete the attempt lines of the deliveries that went; add
what went to the tally (`outbox.purged`) in the same transaction. So the purge never waits behind
a long lock, no lock of its own outlasts one batch, and the counter moves exactly when the rows
go. Deletes are single SQL statements (`_raw_delete`), never Django's Python-side collector,
which would load every row it deletes. On SQLite (`make run`) the locks are simply absent: its
transactions take the database's one write lock at their start.

The walks, each over the rows that may hold candidates (the rule is checked when picking):
- delivered: `delivery_listing_idx` (-created_at, -id) read backward, created_at below the cutoff
  (delivered_at >= created_at, so delivered before the cutoff implies created before it);
- dead: `delivery_dead_idx` (dead_at, partial on status='dead');
- events: the index on Event.created_at;
- registry attempt lines: `regattempt_finished_idx` (finished_at, id).
"""

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, Exists, F, Func, OuterRef, Q, QuerySet
from django.utils import timezone

from odal import tally
from outbox.models import Delivery, DeliveryAttempt, Event

log = logging.getLogger(__name__)

PURGED = "outbox.purged"
# Registrations whose attempt log is history: no work is owed on them (the registry's statuses
# live in registry.models; read by name so that the outbox imports nothing of the registry).
SETTLED_REGISTRATIONS = ("registered", "rejected", "suspended", "deactivated", "abandoned")
SCHEDULED_SECONDS = 50.0  # a scheduled run stops between batches after this (django-q2 kills at 90 s)
IDLE_WORKERS = timedelta(days=7)
# After each batch the purge rests this many times as long as the batch took, so it keeps a CPU
# busy at most half the time. Measured on two CPUs (docs/runbook.md, Retention): a no-op sweep
# kept about 45% of its passes next to a purge that never rested, 90% or more next to this one.
REST = 1.0


@dataclass
class PurgeReport:
    deliveries: int = 0
    attempts: int = 0
    events: int = 0
    registry_attempts: int = 0
    batches: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    finished: bool = True  # False when max_seconds stopped it with candidates left

    @property
    def rows(self) -> int:
        return self.deliveries + self.attempts + self.events + self.registry_attempts

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        text = (
            f"{verb} {_count(self.deliveries, 'delivery', 'deliveries')} with "
            f"{_count(self.attempts, 'attempt line')}, {_count(self.events, 'event')} and "
            f"{_count(self.registry_attempts, 'registry attempt line')} "
            f"in {_count(self.batches, 'batch', 'batches')} ({self.seconds:.1f} s)"
        )
        return text if self.finished else text + "; stopped at its time limit, the rest goes next run"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


# -- the rules ------------------------------------------------------------------------------------


def delivered_rule(before: datetime) -> Q:
    return Q(status=Delivery.Status.DELIVERED, claim_token__isnull=True, delivered_at__lt=before)


def dead_rule(before: datetime) -> Q:
    return Q(status=Delivery.Status.DEAD, claim_token__isnull=True, dead_at__lt=before)


def old_events(before: datetime) -> QuerySet:
    return Event.objects.filter(created_at__lt=before)


def events_to_purge(before: datetime, *, going: Q | None = None) -> QuerySet:
    """Events created before `before` with no delivery left. With `going` (the dry run), the
    deliveries it matches count as gone already."""
    left = Delivery.objects.filter(event=OuterRef("pk"))
    if going is not None:
        left = left.exclude(going)
    return old_events(before).filter(~Exists(left))


def old_registry_attempts(before: datetime) -> QuerySet:
    RegistrationAttempt = apps.get_model("registry", "RegistrationAttempt")
    return RegistrationAttempt.objects.filter(finished_at__lt=before)


def registry_attempts_to_purge(before: datetime) -> QuerySet:
    return old_registry_attempts(before).filter(
        registration__status__in=SETTLED_REGISTRATIONS,
        registration__claim_token__isnull=True,
    )


# -- the walk -------------------------------------------------------------------------------------


class AmongIds(Func):
    """`field IN (ids)`, with the ids as one array parameter on PostgreSQL: a thousand
    placeholders cost more to build and parse than the statement takes to run (measured here:
    a third of the purge's time). Elsewhere, an ordinary IN. Never given an empty list."""

    output_field = BooleanField()

    def __init__(self, field: str, ids):
        super().__init__(F(field))
        self.ids = list(ids)

    def as_sql(self, compiler, connection, **extra_context):
        column, params = compiler.compile(self.source_expressions[0])
        field = self.source_expressions[0].output_field
        values = [field.get_db_prep_value(value, connection) for value in self.ids]
        if connection.vendor == "postgresql":
            return f"{column} = ANY(%s::{field.db_type(connection)}[])", [*params, values]
        return f"{column} IN ({', '.join(['%s'] * len(values))})", [*params, *values]


def _walk_step(index_range: QuerySet, key: str, after: tuple | None, size: int) -> list:
    """The next `size` (key, pk) of `index_range` after `after`, in (key, pk) order: one bounded
    stretch of the index on `key`, never a scan from its start, whatever the rows turn out to be."""
    rows = index_range
    if after is not None:
        # The first condition is the index range; the second drops the ties already seen.
        rows = rows.filter(**{f"{key}__gte": after[0]}).filter(
            Q(**{f"{key}__gt": after[0]}) | Q(pk__gt=after[1])
        )
    return list(rows.order_by(key, "pk").values_list(key, "pk")[:size])


def _pick(candidates: QuerySet, walked: list, *, lock: bool) -> list:
    """The walked rows the rule takes (by primary key), locked; rows another transaction holds
    are skipped, never waited on."""
    rows = candidates.filter(AmongIds("pk", walked))
    if lock:
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return list(rows.order_by().values_list("pk", flat=True))


class _Purge:
    def __init__(self, *, batch: int, dry_run: bool, progress, max_seconds: float | None):
        self.report = PurgeReport(dry_run=dry_run)
        self.batch, self.dry_run, self.progress = batch, dry_run, progress
        self.started = time.monotonic()
        self.deadline = None if max_seconds is None else self.started + max_seconds

    def walk(self, index_range: QuerySet, key: str, take: Callable[[list], dict[str, int]]) -> None:
        """Walk `index_range` a batch at a time to its end (or until the time is up). `take(ids)`
        picks the rows of a batch the rule takes, deletes (or counts) them and returns
        {what: n}; each batch is one transaction, with its tally."""
        after = None
        while self.report.finished:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.report.finished = False
                return
            began = time.monotonic()
            walked = _walk_step(index_range, key, after, self.batch)
            if not walked:
                return
            with nullcontext() if self.dry_run else transaction.atomic():
                counts = take([pk for _, pk in walked])
                if not self.dry_run:
                    tally.bump(PURGED, counts)  # commits with the deletion, or not at all
            if counts:
                for what, n in counts.items():
                    setattr(self.report, what, getattr(self.report, what) + n)
                self.report.batches += 1
            if self.progress is not None:
                self.progress(self.report.rows)
            if len(walked) < self.batch:
                return
            after = walked[-1]
            time.sleep(REST * (time.monotonic() - began))

    def deliveries(self, rule: Q) -> Callable[[list], dict[str, int]]:
        def take(walked: list) -> dict[str, int]:
            ids = _pick(Delivery.objects.filter(rule), walked, lock=not self.dry_run)
            if not ids:
                return {}
            if self.dry_run:
                return {
                    "deliveries": len(ids),
                    "attempts": DeliveryAttempt.objects.filter(AmongIds("delivery_id", ids)).count(),
                }
            # The rule restated: a row that changed since it was picked is kept.
            rows = Delivery.objects.filter(rule, AmongIds("pk", ids))
            deleted = rows._raw_delete(rows.db)
            # Only the lines of the rows that went (their foreign key is checked at commit).
            left = Delivery.objects.filter(AmongIds("pk", ids)).order_by().values_list("pk", flat=True)
            gone = set(ids) - set(left)
            lines = DeliveryAttempt.objects.filter(AmongIds("delivery_id", gone))
            return {"deliveries": deleted, "attempts": lines._raw_delete(lines.db) if gone else 0}

        return take

    def rows(self, candidates: QuerySet, what: str) -> Callable[[list], dict[str, int]]:
        def take(walked: list) -> dict[str, int]:
            ids = _pick(candidates, walked, lock=not self.dry_run)
            if not ids:
                return {}
            if self.dry_run:
                return {what: len(ids)}
            rows = candidates.filter(AmongIds("pk", ids))  # the rule restated, as above
            return {what: rows._raw_delete(rows.db)}

        return take


def purge(
    *,
    delivered_before: datetime,
    dead_before: datetime,
    batch: int = 1000,
    dry_run: bool = False,
    progress=None,
    max_seconds: float | None = None,
) -> PurgeReport:
    """Delete what the retention rules say may go (see the module's docstring), walking `batch`
    rows of an index per transaction; with `dry_run`, count it and delete nothing.
    `progress(rows)` is called after each batch with the rows done so far; `max_seconds` stops
    it between batches."""
    run = _Purge(batch=batch, dry_run=dry_run, progress=progress, max_seconds=max_seconds)
    delivered, dead = delivered_rule(delivered_before), dead_rule(dead_before)
    # delivery_listing_idx: a delivery delivered before the cutoff was created before it.
    run.walk(
        Delivery.objects.filter(created_at__lt=delivered_before), "created_at", run.deliveries(delivered)
    )
    # delivery_dead_idx: the rule holds its condition (status='dead') and its key.
    run.walk(Delivery.objects.filter(dead), "dead_at", run.deliveries(dead))
    events = events_to_purge(delivered_before, going=(delivered | dead) if dry_run else None)
    run.walk(old_events(delivered_before), "created_at", run.rows(events, "events"))
    lines = registry_attempts_to_purge(delivered_before)
    run.walk(old_registry_attempts(delivered_before), "finished_at", run.rows(lines, "registry_attempts"))
    run.report.seconds = time.monotonic() - run.started
    return run.report


def scheduled_purge() -> str:
    """The scheduled task (every 10 minutes): purge with the configured periods (at most SCHEDULED_SECONDS per run),
    fold old tally buckets, forget workers gone a week and idempotency keys past their 24 hours;
    one log line saying what went."""
    from odal.models import IdempotencyRecord

    now = timezone.now()
    delivered_before = now - timedelta(days=settings.ODAL_RETENTION_DAYS)
    dead_before = now - timedelta(days=settings.ODAL_DEAD_RETENTION_DAYS)
    report = purge(delivered_before=delivered_before, dead_before=dead_before, max_seconds=SCHEDULED_SECONDS)
    folded = tally.compact(now=now)
    forgotten = tally.forget_idle_workers(older_than=IDLE_WORKERS, now=now)
    keys = IdempotencyRecord.objects.forget_expired(now=now)  # a small table: one DELETE
    log.info(
        "%s (delivered before %s, dead before %s); deleted %d expired idempotency keys; "
        "folded %d tally buckets, forgot %d idle workers",
        report.summary(),
        f"{delivered_before:%Y-%m-%d %H:%M:%S}Z",
        f"{dead_before:%Y-%m-%d %H:%M:%S}Z",
        keys,
        folded,
        forgotten,
    )
    return report.summary()
