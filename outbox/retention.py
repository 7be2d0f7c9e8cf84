"""Retention: settled rows older than a retention period are deleted, in bounded batches.

What goes (each rule is one Q or queryset below, used both to find candidates and, restated, in
the DELETE that removes them):
- delivered deliveries (no claim) delivered before `delivered_before`, with their attempt lines;
- dead deliveries (no claim) dead-lettered before `dead_before`, with their attempt lines;
- events created before `delivered_before` with no delivery left (or that never had one);
- what other apps' walks take (add_walk): the registry's attempt lines (registry.retention).
Never: pending deliveries, claimed rows, the attempt lines of pending or submitted
registrations, passports, registrations, the audit trail.

Each batch is its own transaction: walk the next `batch` entries of an index (keyset: from
where the last batch stopped, so each run visits an entry at most once and no batch scans a
table); pick those the rule takes, by primary key, `FOR UPDATE SKIP LOCKED` (a row a replay or
resend holds is passed over, never waited on, and left as that writer leaves it); delete them
with a DELETE that restates the rule; delete the attempt lines of the deliveries that went; add
what went to the tally (`outbox.purged`) in the same transaction. So the purge never waits behind
a long lock, no lock of its own outlasts one batch, and the counter moves exactly when the rows
go. Deletes are single SQL statements (`_raw_delete`), never Django's Python-side collector,
which would load every row it deletes.

The walks, each over the rows that may hold candidates (the rule is checked when picking):
- delivered: `delivery_listing_idx` (-created_at, -id) read backward, created_at below the cutoff
  (delivered_at >= created_at, so delivered before the cutoff implies created before it);
- dead: `delivery_dead_idx` (dead_at, partial on status='dead');
- events: the index on Event.created_at;
- registry attempt lines: `regattempt_finished_idx` (finished_at, id), registry.retention's.

Each walk resumes where it stopped, so that rows retention must keep at the front of an index
(young dead letters and long-parked rows among the oldest deliveries, their events) are walked
past once a lap, not at every run:
- Its position, the last (key, id) it walked, is a row of odal.core.models.RetentionPosition: it
  survives restarts, and every process resumes from it. A run starts after it, walks to the end
  of the range, goes back to the start and on to where it began, unless its time runs out first:
  a run walks each entry at most once, and one with time enough (`odal outbox purge`) walks them
  all. A position past the end of the range (the cutoff differs, the rows went) simply wraps.
- A batch claims its stretch by moving the position on from where the walk was, in the lap it
  was in (one guarded UPDATE, RetentionPositionQuerySet.advance; going back to the start begins
  the next lap), in the transaction that deletes what the stretch holds: a batch that fails
  leaves its stretch unclaimed, and a purge that finds the position moved by another purge
  running at the same time takes nothing of that stretch and goes on from where the other left
  the walk (done if that is all the way round). Purges at once thus share the walks, never both
  walking a stretch; one may pass an event before the other deleted its last delivery: it goes
  next lap.
- No row moves behind a position: the keys never change once written (created_at, finished_at;
  dead_at is set when a delivery becomes dead, and a replayed one that dies again is a new entry)
  and rows are written at about now, ahead of every position, which is behind a cutoff. A row
  that becomes purgeable behind a position (the last delivery of its event went, a dead letter
  aged past its period) goes when the walk comes round.
- With a time limit, each walk has its own share: the time left divided among the walks not yet
  done, in turn and round after round. A walk with more to do than its share stops there, the
  others still have theirs, and what a walk does not need goes to those after it.
"""

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, Exists, F, Func, OuterRef, Q, QuerySet
from django.utils import timezone

from odal.core import tally
from odal.core.models import RetentionPosition
from outbox.models import Delivery, DeliveryAttempt, Event

PURGED = "outbox.purged"
SCHEDULED_SECONDS = 50.0  # a scheduled run stops between batches after this (django-q2 kills at 90 s)
# After each batch the purge rests this many times as long as the batch took, so it keeps a CPU
# busy at most half the time. Measured on two CPUs (docs/runbook.md, Retention): a no-op sweep
# kept about 45% of its passes next to a purge that never rested, 90% or more next to this one.
REST = 1.0


# The walks, by the name of their position, and what a person calls them: the outbox's, then
# those other apps add (add_walk), each made for a run by OTHER_WALKS[name].
WALKS = {"delivered": "delivered deliveries", "dead": "dead letters", "events": "events"}
OTHER_WALKS: dict[str, Callable] = {}


def add_walk(name: str, called: str, walk: Callable) -> None:
    """Add another app's walk to every purge, after the outbox's: `walk(run, delivered_before=,
    evidence_before=)` gives its (index range, key, take)."""
    WALKS[name] = called
    OTHER_WALKS[name] = walk


@dataclass
class PurgeReport:
    deliveries: int = 0
    attempts: int = 0
    events: int = 0
    registry_attempts: int = 0
    batches: int = 0
    walked: int = 0  # index entries walked
    seconds: float = 0.0
    dry_run: bool = False
    stopped: list[str] = field(default_factory=list)  # walks max_seconds stopped before their lap ended
    shared: list[str] = field(default_factory=list)  # walks another purge running at once moved on too
    cutoffs: tuple = ()  # delivered_before, dead_before, evidence_before

    @property
    def rows(self) -> int:
        return self.deliveries + self.attempts + self.events + self.registry_attempts

    @property
    def finished(self) -> bool:
        return not self.stopped

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        text = (
            f"{verb} {_count(self.deliveries, 'delivery', 'deliveries')} with "
            f"{_count(self.attempts, 'attempt line')}, {_count(self.events, 'event')} and "
            f"{_count(self.registry_attempts, 'registry attempt line')} "
            f"in {_count(self.batches, 'batch', 'batches')} ({self.seconds:.1f} s)"
        )
        if self.shared:
            text += f"; shared {_walks(self.shared)} with another purge running at the same time"
        if self.stopped:
            text += f"; stopped at its time limit in {_walks(self.stopped)}, the rest goes next run"
        return text


def _walks(names: list[str]) -> str:
    return " and ".join(", ".join(WALKS[n] for n in names).rsplit(", ", 1))


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


# -- the walk -------------------------------------------------------------------------------------


class AmongIds(Func):
    """`field IN (ids)`, with the ids as one array parameter on PostgreSQL: a thousand
    placeholders cost more to build and parse than the statement takes to run (measured here:
    a third of the purge's time). Never given an empty list."""

    output_field = BooleanField()

    def __init__(self, field: str, ids):
        super().__init__(F(field))
        self.ids = list(ids)

    def as_sql(self, compiler, connection, **extra_context):
        column, params = compiler.compile(self.source_expressions[0])
        field = self.source_expressions[0].output_field
        values = [field.get_db_prep_value(value, connection) for value in self.ids]
        return f"{column} = ANY(%s::{field.db_type(connection)}[])", [*params, values]


def _walk_step(
    index_range: QuerySet, key: str, after: tuple | None, size: int, upto: tuple | None = None
) -> list:
    """The next `size` (key, pk) of `index_range` after `after` (and up to `upto`, included), in
    (key, pk) order: one bounded stretch of the index on `key`, never a scan from its start,
    whatever the rows turn out to be."""
    rows = index_range
    if after is not None:
        # The first condition is the index range; the second drops the ties already seen.
        rows = rows.filter(**{f"{key}__gte": after[0]}).filter(
            Q(**{f"{key}__gt": after[0]}) | Q(pk__gt=after[1])
        )
    if upto is not None:  # a lap's end, where it began
        rows = rows.filter(**{f"{key}__lte": upto[0]}).filter(
            Q(**{f"{key}__lt": upto[0]}) | Q(pk__lte=upto[1])
        )
    return list(rows.order_by(key, "pk").values_list(key, "pk")[:size])


def _pick(candidates: QuerySet, walked: list, *, lock: bool) -> list:
    """The walked rows the rule takes (by primary key), locked; rows another transaction holds
    are skipped, never waited on."""
    rows = candidates.filter(AmongIds("pk", walked))
    if lock:
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return list(rows.order_by().values_list("pk", flat=True))


class _Walk:
    """One walk through a run. It starts at its stored position (`cursor` in `lap`) and is done
    when the walk has come all the way round to there, a lap later (`origin` in `last_lap`),
    whether this run walked it all or a purge running at the same time walked part of it.
    Positions are (key, pk), None at the start of a lap."""

    def __init__(self, name: str, index_range: QuerySet, key: str, take: Callable, stored: tuple):
        self.name, self.index_range, self.key, self.take = name, index_range, key, take
        self.pk = index_range.model._meta.pk
        self.lap, self.cursor = self.read(stored)
        self.origin, self.last_lap = self.cursor, self.lap + 1
        self.done = False

    def read(self, stored: tuple) -> tuple:
        lap, at = stored
        return lap, None if at is None else (at[0], self.pk.to_python(at[1]))

    @staticmethod
    def stored(position: tuple | None) -> tuple | None:
        return None if position is None else (position[0], str(position[1]))

    @property
    def upto(self) -> tuple | None:
        """Where the lap this run walks ends, once it went back to the start: where it began."""
        return self.origin if self.lap == self.last_lap else None

    def moved(self, lap: int, cursor: tuple | None) -> None:
        """The walk is at `cursor` in `lap`: moved there by this run, or found there."""
        if _order(lap, cursor) < _order(self.lap, self.cursor):  # reset: begin again from there
            self.origin, self.last_lap = cursor, lap + 1
        self.lap, self.cursor = lap, cursor
        back = self.origin is None or (cursor is not None and cursor >= self.origin)
        self.done = lap > self.last_lap or (lap == self.last_lap and back)


def _order(lap: int, cursor: tuple | None) -> tuple:
    """Positions in the order a walk goes through them: by lap, the start of each lap first."""
    return (lap, cursor is not None, cursor or ())


class _Purge:
    def __init__(self, *, batch: int, dry_run: bool, progress, max_seconds: float | None):
        self.report = PurgeReport(dry_run=dry_run)
        self.batch, self.dry_run, self.progress = batch, dry_run, progress
        self.started = time.monotonic()
        self.deadline = None if max_seconds is None else self.started + max_seconds

    def run(self, walks: list[tuple[str, QuerySet, str, Callable]]) -> None:
        """Each walk from its stored position until its lap is done or its share of the time is
        up (the time left divided among the walks not done yet), round after round."""
        names = [name for name, *_ in walks]
        if not self.dry_run:
            RetentionPosition.objects.open(names, now=timezone.now())
        where = RetentionPosition.objects.where(names)
        walks = [_Walk(*walk, stored=where[walk[0]]) for walk in walks]
        while not all(walk.done for walk in walks):
            left = [walk for walk in walks if not walk.done]
            for i, walk in enumerate(left):
                share_ends = None
                if self.deadline is not None:
                    now = time.monotonic()
                    if now >= self.deadline:
                        break
                    share_ends = now + (self.deadline - now) / (len(left) - i)
                self.walk(walk, until=share_ends)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                break
        self.report.stopped = [walk.name for walk in walks if not walk.done]

    def walk(self, walk: _Walk, *, until: float | None) -> None:
        """Batches of `walk` until its lap is done (or `until`). Each walks the next stretch of
        its index, claims it (moves the stored position past it) and deletes what the rule takes
        there, in one transaction with its tally."""
        while not walk.done:
            if until is not None and time.monotonic() >= until:
                return
            began = time.monotonic()
            stretch = _walk_step(walk.index_range, walk.key, walk.cursor, self.batch, upto=walk.upto)
            end = len(stretch) < self.batch  # the range ends here (or the lap, where it began)
            # At the end of the range the walk goes back to the start, a new lap; at the end of its
            # last lap, it stays where it began.
            to = walk.upto if end else stretch[-1]
            with nullcontext() if self.dry_run else transaction.atomic():
                if not self.dry_run and not RetentionPosition.objects.advance(
                    walk.name,
                    lap=walk.lap,
                    at=walk.stored(walk.cursor),
                    to=walk.stored(to),
                    now=timezone.now(),
                ):
                    self.rejoin(walk)
                    continue
                counts = walk.take([pk for _, pk in stretch]) if stretch else {}
                if not self.dry_run:
                    tally.bump(PURGED, counts)  # commits with the deletion, or not at all
            self.report.walked += len(stretch)
            if counts:
                for what, n in counts.items():
                    setattr(self.report, what, getattr(self.report, what) + n)
                self.report.batches += 1
            if stretch and self.progress is not None:
                self.progress(self.report.rows)
            walk.moved(walk.lap + (to is None), to)
            if not walk.done:
                time.sleep(REST * (time.monotonic() - began))

    def rejoin(self, walk: _Walk) -> None:
        """A claim took nothing: another purge moved the walk on (the stretch is its), or a person
        reset it (deleted its row: it starts again). Go on from where the walk is now."""
        RetentionPosition.objects.open([walk.name], now=timezone.now())
        found = walk.read(RetentionPosition.objects.where([walk.name])[walk.name])
        if found == (walk.lap, walk.cursor):
            walk.done = True  # nothing moved it, yet the claim took nothing: never spin on it
            return
        walk.moved(*found)
        if walk.name not in self.report.shared:
            self.report.shared.append(walk.name)

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
    evidence_before: datetime,
    batch: int = 1000,
    dry_run: bool = False,
    progress=None,
    max_seconds: float | None = None,
) -> PurgeReport:
    """Delete what the retention rules say may go (see the module's docstring), walking `batch`
    rows of an index per transaction, each walk from where it stopped; with `dry_run`, count it
    and delete nothing (and move no walk). `progress(rows)` is called after each batch with the
    rows done so far; `max_seconds` stops it between batches, each walk at its share."""
    run = _Purge(batch=batch, dry_run=dry_run, progress=progress, max_seconds=max_seconds)
    delivered, dead = delivered_rule(delivered_before), dead_rule(dead_before)
    events = events_to_purge(delivered_before, going=(delivered | dead) if dry_run else None)
    run.run(
        [
            # delivery_listing_idx: a delivery delivered before the cutoff was created before it.
            (
                "delivered",
                Delivery.objects.filter(created_at__lt=delivered_before),
                "created_at",
                run.deliveries(delivered),
            ),
            # delivery_dead_idx: the rule holds its condition (status='dead') and its key.
            ("dead", Delivery.objects.filter(dead), "dead_at", run.deliveries(dead)),
            ("events", old_events(delivered_before), "created_at", run.rows(events, "events")),
            *(
                (name, *walk(run, delivered_before=delivered_before, evidence_before=evidence_before))
                for name, walk in OTHER_WALKS.items()
            ),
        ]
    )
    run.report.cutoffs = (delivered_before, dead_before, evidence_before)
    run.report.seconds = time.monotonic() - run.started
    return run.report


def scheduled() -> PurgeReport:
    """The retention service (outbox.housekeeping.RETENTION): purge with the configured periods,
    at most SCHEDULED_SECONDS."""
    now = timezone.now()
    # (Evidence goes never before the ordinary lines: the walk stops at delivered_before anyway.)
    evidence_days = max(settings.ODAL_EVIDENCE_RETENTION_DAYS, settings.ODAL_RETENTION_DAYS)
    return purge(
        delivered_before=now - timedelta(days=settings.ODAL_RETENTION_DAYS),
        dead_before=now - timedelta(days=settings.ODAL_DEAD_RETENTION_DAYS),
        evidence_before=now - timedelta(days=evidence_days),
        max_seconds=SCHEDULED_SECONDS,
    )
