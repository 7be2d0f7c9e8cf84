"""Issue 23's retention row of `make bench` (bench/run.py calls `run` and `report`): retention's
progress per scheduled run over a table whose oldest rows must all be kept.

The table: N deliveries made over the past 60 days, oldest first, each with its own event; the
oldest K are parked (their consumer was paused 60 days ago: status paused, kept however old, and
so are their events), the rest were delivered 0.2 s after they were made, with one attempt line,
so those older than 30 days may go. Filled by SQL in chunks of a million rows, then VACUUM
ANALYZE. Then runs of `outbox.retention.purge` as the schedule makes them (30 / 90 days, evidence
at 3650, at most `seconds` each; `outbox.retention.SCHEDULED_SECONDS` is 50), one after another
in this process, starting with no stored position (a node's first run): what each deleted and how
many index entries it walked. Before this change every run walked both kept fronts from their
oldest entry again (and a walk out of time ended the run): with K beyond what a run can walk, no
run deleted anything.

The runs go on until two runs after the first that deleted rows, at most `max_runs`. Between two
runs ANALYZE, where the server runs no autovacuum (a CI configuration), as autovacuum would in
the 10 minutes the schedule leaves between them.
"""

import time
from datetime import timedelta

CHUNK = 1_000_000
HISTORY_DAYS = 60
AFTER_FIRST = 2  # runs measured after the first that deleted rows
TABLES = ("outbox_event", "outbox_delivery", "outbox_deliveryattempt")


def log(message: str) -> None:
    print(f"  {message}", flush=True)


def consumers() -> tuple[int, int]:
    """(a consumer whose deliveries were delivered, a consumer paused since the first of them)."""
    from django.utils import timezone

    from outbox.models import Consumer

    history, _ = Consumer.objects.update_or_create(
        name="retention-history", defaults={"kind": "python", "target": "bench.noop.consume", "paused": False}
    )
    parked, _ = Consumer.objects.update_or_create(
        name="retention-parked",
        defaults={"kind": "python", "target": "bench.noop.consume", "paused": True, "paused_by": "bench",
                  "paused_reason": "kept at the front", "paused_at": timezone.now() - timedelta(days=HISTORY_DAYS)},
    )  # fmt: skip
    return history.pk, parked.pk


def fill(n: int, kept: int) -> float:
    """The table (see the module's docstring); seconds it took."""
    from django.db import connection

    from odal.core.models import RetentionPosition

    history, parked = consumers()
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_deliveryattempt, outbox_delivery, outbox_event")
        for first in range(1, n + 1, CHUNK):
            last = min(n, first + CHUNK - 1)
            cursor.execute("DROP TABLE IF EXISTS bench_chunk")
            cursor.execute(
                "CREATE TEMP TABLE bench_chunk AS SELECT g, g <= %s AS kept, odal_uuid7() AS event_id, "
                "odal_uuid7() AS delivery_id, now() - interval '1 minute' - (%s - g)::float8 / %s "
                f"* interval '{HISTORY_DAYS} days' AS at FROM generate_series(%s, %s) g",
                [kept, n, n, first, last],
            )
            cursor.execute(
                "INSERT INTO outbox_event (id, type, payload, created_at) SELECT event_id, 'bench.retention', "
                "jsonb_build_object('n', g), at FROM bench_chunk"
            )
            cursor.execute(
                "INSERT INTO outbox_delivery (id, event_id, event_type, consumer_id, status, attempts, "
                "max_attempts, next_attempt_at, claim_token, last_error, delivered_at, dead_at, created_at) "
                "SELECT delivery_id, event_id, 'bench.retention', CASE WHEN kept THEN %s ELSE %s END, "
                "CASE WHEN kept THEN 'paused' ELSE 'delivered' END, CASE WHEN kept THEN 0 ELSE 1 END, 8, at, "
                "NULL, '', CASE WHEN kept THEN NULL ELSE at + interval '0.2 s' END, NULL, at FROM bench_chunk",
                [parked, history],
            )
            cursor.execute(
                "INSERT INTO outbox_deliveryattempt (delivery_id, number, claim_token, started_at, finished_at, "
                "outcome, error, http_status, duration_ms, late) SELECT delivery_id, 1, gen_random_uuid(), "
                "at + interval '0.1 s', at + interval '0.2 s', 'delivered', '', NULL, 100, false "
                "FROM bench_chunk WHERE NOT kept"
            )
            if last < n:
                log(f"{last:,} of {n:,} deliveries in ({time.monotonic() - started:.0f} s)")
        cursor.execute("DROP TABLE bench_chunk")
        for table in TABLES:
            cursor.execute(f"VACUUM ANALYZE {table}")
    RetentionPosition.objects.all().delete()  # a node's first run
    return time.monotonic() - started


def autovacuum() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0] == "on"


def days_ago(position, now) -> float | None:
    """How long before `now` the entry a walk stopped at was made (None: at the start)."""
    return None if position is None else (now - position[0]).total_seconds() / 86400


def at(days: float | None) -> str:
    return "start" if days is None else f"{days:.1f} d ago"


def run(*, rows: int, kept: int, seconds: float, max_runs: int) -> dict:
    from django.db import connection
    from django.utils import timezone

    from odal.core.models import RetentionPosition
    from outbox.models import Delivery
    from outbox.retention import purge

    log(f"filling {rows:,} deliveries, the oldest {kept:,} parked…")
    filled = fill(rows, kept)
    now = timezone.now()
    purgeable = Delivery.objects.filter(status="delivered", delivered_at__lt=now - timedelta(days=30)).count()
    log(f"filled in {filled:.0f} s; {purgeable:,} deliveries older than 30 days behind the kept ones")
    vacuums = autovacuum()
    runs, first_deleting = [], None
    while len(runs) < max_runs and (first_deleting is None or len(runs) < first_deleting + 1 + AFTER_FIRST):
        now = timezone.now()
        report = purge(
            delivered_before=now - timedelta(days=30),
            dead_before=now - timedelta(days=90),
            evidence_before=now - timedelta(days=3650),
            max_seconds=seconds,
        )
        where = RetentionPosition.objects.where(["delivered", "events"])
        runs.append({"rows": report.rows, "deliveries": report.deliveries, "walked": report.walked,
                     "seconds": report.seconds, "stopped": report.stopped,
                     "deliveries_at": days_ago(where["delivered"][1], now),
                     "events_at": days_ago(where["events"][1], now)})  # fmt: skip
        log(f"run {len(runs)}: {report.summary()}; walked {report.walked:,} index entries; the deliveries' walk "
            f"at {at(runs[-1]['deliveries_at'])}, the events' at {at(runs[-1]['events_at'])}")  # fmt: skip
        if first_deleting is None and report.rows:
            first_deleting = len(runs) - 1
        if not vacuums:
            with connection.cursor() as cursor:
                for table in TABLES:
                    cursor.execute(f"ANALYZE {table}")
    return {"rows": rows, "kept": kept, "seconds": seconds, "purgeable": purgeable, "fill_seconds": filled,
            "runs": runs, "first_deleting": first_deleting, "autovacuum": vacuums}  # fmt: skip


def report(r: dict) -> tuple[list, list, str]:
    """Issue 23's retention rows, targets and section of docs/performance.md."""
    runs, first = r["runs"], r["first_deleting"]
    size = f"{r['rows']:,} deliveries, the oldest {r['kept']:,} kept"
    per_run = ", ".join(f"{x['rows']:,}" for x in runs)
    walked = ", ".join(f"{x['walked']:,}" for x in runs)
    rows = [
        (f"retention, {size}: rows deleted per scheduled run of {r['seconds']:g} s, runs 1–{len(runs)}", per_run),
        ("the same runs: index entries walked", walked),
        ("runs before the first that deleted rows (each walked on from where the last stopped)",
         "none deleted any" if first is None else f"{first}"),
    ]  # fmt: skip
    after = runs[first:] if first is not None else []
    targets = [
        (f"retention: rows deleted within {len(runs)} runs over {size}", first is not None),
        ("retention: every run from the first that deleted rows deleted rows", bool(after) and all(x["rows"] for x in after)),
        ("retention: no walk starved (each run walked entries)", all(x["walked"] for x in runs)),
    ]  # fmt: skip
    lines = "\n".join(
        f"| {i} | {x['rows']:,} | {x['deliveries']:,} | {x['walked']:,} | {at(x['deliveries_at'])} | "
        f"{at(x['events_at'])} | {x['seconds']:.1f} s | {', '.join(x['stopped']) or '—'} |"
        for i, x in enumerate(runs, 1)
    )  # fmt: skip
    doc = (
        "## Retention's progress per run with kept rows at the front (issue 23)\n\n"
        f"{r['rows']:,} deliveries made over the past {HISTORY_DAYS} days, oldest first, each with its event; the "
        f"oldest {r['kept']:,} parked (their consumer paused {HISTORY_DAYS} days ago: kept, and their events with "
        f"them), the rest delivered, with one attempt line each, {r['purgeable']:,} of them older than 30 days "
        f"(filled by SQL in {r['fill_seconds']:.0f} s, then VACUUM ANALYZE). Then runs of `outbox.retention.purge` "
        f"as the schedule makes them (30 / 90 days, at most {r['seconds']:g} s each), one after another in the "
        "bench's process, from no stored position (a node's first run)"
        + ("" if r["autovacuum"] else ", with ANALYZE between two runs (this server runs no autovacuum)")
        + f". The kept rows were made {HISTORY_DAYS} to {HISTORY_DAYS * (1 - r['kept'] / r['rows']):.0f} days ago; "
        "a walk's range ends at 30 days ago. Each walk resumes where the last run stopped, with its share of the run's time; before, every run "
        "walked the kept rows of the deliveries and of the events from the oldest entry again, and a walk out of "
        "time ended the run, so a front longer than a run can walk meant no run ever deleted anything.\n\n"
        "| run | rows deleted | deliveries | index entries walked | the deliveries' walk at (made) | the events' "
        "walk at | took | walks stopped at their share |\n|---:|---:|---:|---:|---:|---:|---:|---|\n"
        f"{lines}\n"
    )
    return rows, targets, doc
