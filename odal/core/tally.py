"""Figures that cost the same at ten thousand and ten million rows.

Counts of settled work come from odal_tally (see odal.core.models.Tally): the writes add to it, in
their own transaction, through triggers installed by migration odal/0005, so no caller can
forget to. The figures:

- ``outbox.delivered``, key the consumer's id: deliveries that became delivered.
- ``outbox.attempts``, key the outcome (``delivered``, ``failed``, ``write_error``), with
  ``:late`` for attempts whose outcome was refused as late; bucketed by the hour the attempt
  finished, so the dashboard's 24-hour chart reads them too.
- ``registry.status``, key the status: registrations in that status now (a gauge: a move
  subtracts from the old status and adds to the new).
- ``registry.late`` and ``registry.protocol_errors``, key the operation;
  ``registry.write_errors``.
- ``outbox.purged``, key what (``deliveries``, ``events``, ``attempts``,
  ``registry_attempts``): rows retention deleted. Added by odal.core.tally.bump.
- ``outbox.python_timeouts`` and ``outbox.python_blocked``, key the consumer's id: attempts of
  a Python consumer that ran past its timeout, and times a sweep process stopped taking its
  rows because its overrunning threads reached the bound. Added by the sweep process
  (outbox.python_consumers.count_overrun), which alone sees its threads.

Small sets (pending and dead deliveries, stalled registrations) are counted directly from their
partial indexes; see outbox.service.outbox_counts and registry.service.registry_counts.

Heartbeats: every pass of the sweep and of the drain calls ``beat(role)``, which writes the
worker's own row at most once a second; ``last_pass(role)`` is the newest of them. A sweep
process that takes none of a Python consumer's rows (its overrunning threads piled up) also
keeps a heartbeat of role ``outbox.held:<consumer id>`` while it does
(outbox.python_consumers.Overruns.report).
"""

import os
import socket
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Max, OuterRef, Subquery, Sum
from django.utils import timezone

from odal.core.models import Heartbeat, Tally

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the hour of a compacted row
KEEP_HOURLY = timedelta(hours=48)  # buckets younger than this stay hourly (the chart reads 24 h)

SWEEP = "outbox.sweep"
DRAIN = "registry.drain"


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _shard() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


UPSERT = (
    "INSERT INTO {table} (metric, key, hour, shard, value) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (metric, key, hour, shard) DO UPDATE SET value = {table}.value + excluded.value"
)


def _add(cursor, metric: str, key: str, hour: datetime, shard: int, n: int) -> None:
    cursor.execute(
        UPSERT.format(table=Tally._meta.db_table),
        [metric, key, connection.ops.adapt_datetimefield_value(hour), shard, n],
    )


def bump(metric: str, counts: dict[str, int], *, at: datetime | None = None) -> None:
    """Add `counts` ({key: n}) to `metric`, in the caller's transaction. For what no trigger
    sees (rows purged); the triggers count everything else."""
    counts = {key: n for key, n in counts.items() if n}
    if not counts:
        return
    hour, shard = hour_of(at or timezone.now()), _shard()
    with transaction.atomic(), connection.cursor() as cursor:
        for key in sorted(counts):  # one order for every writer: no deadlock between two bumps
            _add(cursor, metric, key, hour, shard, counts[key])


def totals(*metrics: str) -> dict[str, dict[str, int]]:
    """{metric: {key: sum}} for the given metrics, in one query over the tally (a few hundred
    rows whatever the size of the tables it counts)."""
    found: dict[str, dict[str, int]] = {m: {} for m in metrics}
    rows = (
        Tally.objects.filter(metric__in=metrics).values("metric", "key").annotate(n=Sum("value")).order_by()
    )
    for row in rows:
        found[row["metric"]][row["key"]] = int(row["n"] or 0)
    return found


def hourly(metric: str, since: datetime) -> dict[tuple[datetime, str], int]:
    """{(hour, key): sum} of `metric`'s buckets from `since` on (hours younger than KEEP_HOURLY)."""
    rows = (
        Tally.objects.filter(metric=metric, hour__gte=hour_of(since))
        .values("hour", "key")
        .annotate(n=Sum("value"))
        .order_by()
    )
    found: dict[tuple[datetime, str], int] = defaultdict(int)
    for row in rows:
        found[(row["hour"], row["key"])] += int(row["n"] or 0)
    return found


def compact(*, now: datetime | None = None) -> int:
    """Fold the tally, in one transaction (the sums stay the same to any reader): each hour
    before the current one into one row per (metric, key, hour), whatever the sessions that
    added to it (connections come and go: each new one adds rows of its own); and every hour
    older than KEEP_HOURLY into one row per (metric, key) at EPOCH. Run by the retention schedule
    (every 10 minutes), it keeps the tally at a few rows per figure and hour. Returns how many rows it
    folded."""
    now = now or timezone.now()
    cutoff, this_hour = hour_of(now - KEEP_HOURLY), hour_of(now)
    table = Tally._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH gone AS (
                DELETE FROM {table}
                WHERE hour > %(epoch)s AND (hour < %(cutoff)s OR (hour < %(this_hour)s AND shard <> 0))
                RETURNING metric, key, hour, value
            ), folded AS (
                INSERT INTO {table} (metric, key, hour, shard, value)
                SELECT metric, key, CASE WHEN hour < %(cutoff)s THEN %(epoch)s ELSE hour END, 0, SUM(value)
                FROM gone GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
                ON CONFLICT (metric, key, hour, shard) DO UPDATE SET value = {table}.value + EXCLUDED.value
            )
            SELECT count(*) FROM gone
            """,
            {"epoch": EPOCH, "cutoff": cutoff, "this_hour": this_hour},
        )
        return cursor.fetchone()[0]


# -- heartbeats ---------------------------------------------------------------------------------

BEAT_EVERY = 1.0  # seconds: a worker writes its heartbeat at most this often
_last_beat: dict[tuple[int, str], float] = {}
_beat_lock = threading.Lock()


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


def beat(role: str, *, force: bool = False) -> bool:
    """Say that this worker finished a pass of `role` now. Written at most once per BEAT_EVERY
    per process (unless `force`); a failure to write it never stops the pass. Returns whether
    it wrote."""
    key = (os.getpid(), role)
    now = time.monotonic()
    with _beat_lock:
        if not force and now - _last_beat.get(key, float("-inf")) < BEAT_EVERY:
            return False
        _last_beat[key] = now
    Heartbeat.objects.bulk_create(
        [Heartbeat(role=role, worker=worker_name(), at=timezone.now())],
        update_conflicts=True,
        unique_fields=["role", "worker"],
        update_fields=["at"],
    )
    return True


def last_pass(role: str) -> datetime | None:
    return Heartbeat.objects.filter(role=role).aggregate(at=Max("at"))["at"]


def forget_idle_workers(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Drop heartbeats of workers gone for `older_than` (each process adds a row of its own),
    keeping each role's newest, so the last pass stays known however long ago it was."""
    cutoff = (now or timezone.now()) - older_than
    newest = Heartbeat.objects.filter(role=OuterRef("role")).order_by("-at", "-pk").values("pk")[:1]
    deleted, _ = Heartbeat.objects.filter(at__lt=cutoff).exclude(pk=Subquery(newest)).delete()
    return deleted
