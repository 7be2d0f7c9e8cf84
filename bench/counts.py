"""Issue 13's part of `make bench`, run by bench/run.py in the same run: what the outbox's counts
cost over a table of 10,000 and of 10,000,000 delivered rows, and retention.

- fill_history: N events, N delivered deliveries (4 consumers, delivered over the past 60 days,
  so a purge at 30 days has about half to delete), one attempt line each, and a few hundred
  pending and dead rows, by plain SQL in chunks. The tally's triggers count them as they go in;
  the fill checks the tally agrees with the rows, then lays the tally's buckets out as 60 days
  of sweeps would have left them (see age_tally).
- surfaces: the admin dashboard, /metrics, GET outbox and `odal outbox status`, each timed the
  way a user meets it (the test client through the whole middleware stack, the command
  in-process), median and p95 of 20 calls after 3 warm-ups.
- count_plans: EXPLAIN ANALYZE of the statements outbox_counts() runs.
- timed_purge: retention's purge (outbox.retention.purge) at 30 days over the big table, rows/s.
- sweep_beside_purge: then no-op deliveries/s of one running `odal outbox sweep` over a fresh
  backlog in what is left of the big table, alone and while `odal outbox purge` (at a day: most
  of what is left) runs in another process.
"""

import io
import os
import re
import signal
import socket
import statistics
import time
import uuid
from datetime import timedelta

HISTORY_DAYS = 60
CONSUMERS = 4
PENDING = 300  # the small sets: the same few hundred at any table size
DEAD = 300
CHUNK = 1_000_000  # rows per INSERT: the statement-level triggers' transition tables stay bounded
TAG = "bench.history"
RARE_TAG = "bench.history.rare"  # 1 % of the events (the reads filter by it: bench/reads.py)
# The purge beside the sweep runs after the timed purge (30 days): it takes what that left, less a day.
BESIDE_PURGE = ["--older-than", "1d", "--dead-older-than", "90d"]


def log(message: str) -> None:
    print(f"  {message}", flush=True)


def history_consumers() -> list[int]:
    from outbox.models import Consumer

    ids = []
    for i in range(1, CONSUMERS + 1):
        c, _ = Consumer.objects.update_or_create(
            name=f"history-{i}", defaults={"kind": "python", "target": "bench.noop.consume", "paused": False}
        )
        ids.append(c.pk)
    return ids


def _insert_chunk(cursor, *, first: int, last: int, consumers: str, at: str, extra: str = "") -> None:
    """bench_chunk: the ids, consumer and creation time (`at`, SQL over g) of the events and
    deliveries of generate_series(first, last), with `extra` columns; then the events."""
    cursor.execute("DROP TABLE IF EXISTS bench_chunk")
    cursor.execute(
        "CREATE TEMP TABLE bench_chunk AS SELECT g, odal_uuid7() AS event_id, "
        f"odal_uuid7() AS delivery_id, ({consumers})[1 + g %% {CONSUMERS}] AS consumer_id, "
        f"{at} AS at, CASE WHEN g %% 100 = 0 THEN %s ELSE %s END AS type{extra} FROM generate_series(%s, %s) g",
        [RARE_TAG, TAG, first, last],
    )
    cursor.execute(
        "INSERT INTO outbox_event (id, type, payload, created_at) SELECT event_id, type, "
        "jsonb_build_object('n', g, 'dppId', md5('e' || g)::uuid, 'upi', 'https://id.example.eu/bench/' || g), at "
        "FROM bench_chunk"
    )


def fill_history(n: int, consumer_ids: list[int], *, sessions_per_hour: int, chunk: int = CHUNK) -> dict:
    """The big table (see the module's docstring): rows go in in the order they were made (oldest
    first, evenly over HISTORY_DAYS), as a running system writes them, so a table's pages and its
    time order agree as they would. Returns how long it took and how big the result is."""
    from django.db import connection

    from outbox.service import outbox_counts

    started = time.monotonic()
    consumers = "ARRAY[" + ",".join(str(int(i)) for i in consumer_ids) + "]::bigint[]"
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_deliveryattempt, outbox_delivery, outbox_event")
        cursor.execute("DELETE FROM odal_tally WHERE metric LIKE 'outbox.%'")
        for first in range(1, n + 1, chunk):
            last = min(n, first + chunk - 1)
            _insert_chunk(
                cursor, first=first, last=last, consumers=consumers,
                at=f"now() - interval '1 minute' - ({n} - g)::float8 / {n} * interval '{HISTORY_DAYS} days'",
            )  # fmt: skip
            cursor.execute(
                "INSERT INTO outbox_delivery (id, event_id, event_type, consumer_id, status, attempts, max_attempts, "
                "next_attempt_at, claim_token, last_error, delivered_at, dead_at, created_at) "
                "SELECT delivery_id, event_id, type, consumer_id, 'delivered', 1, 8, at, NULL, '', "
                "at + interval '0.2 s', NULL, at FROM bench_chunk"
            )
            cursor.execute(
                "INSERT INTO outbox_deliveryattempt (delivery_id, number, claim_token, started_at, finished_at, "
                "outcome, error, http_status, duration_ms, late, consumer_id) SELECT delivery_id, 1, gen_random_uuid(), "
                "at + interval '0.1 s', at + interval '0.2 s', 'delivered', '', NULL, 100, false, consumer_id "
                "FROM bench_chunk"
            )
            if last < n:
                log(f"{last:,} of {n:,} delivered rows in ({time.monotonic() - started:.0f} s)")
        # Pending: retrying, due in 1 to 6 hours (so no sweep of the other measurements takes them).
        _insert_chunk(
            cursor, first=1, last=PENDING, consumers=consumers,
            at="now() - interval '10 minutes' - random() * interval '2 hours'", extra=", 1 + g %% 3 AS tries",
        )  # fmt: skip
        cursor.execute(
            "INSERT INTO outbox_delivery (id, event_id, event_type, consumer_id, status, attempts, max_attempts, "
            "next_attempt_at, claim_token, last_error, delivered_at, dead_at, created_at) "
            "SELECT delivery_id, event_id, type, consumer_id, 'pending', tries, 8, "
            "now() + interval '1 hour' + random() * interval '5 hours', NULL, 'HTTP 503: Service Unavailable', "
            "NULL, NULL, at FROM bench_chunk"
        )
        cursor.execute(
            "INSERT INTO outbox_deliveryattempt (delivery_id, number, claim_token, started_at, finished_at, "
            "outcome, error, http_status, duration_ms, late, consumer_id) SELECT delivery_id, k, gen_random_uuid(), "
            "at + k * interval '1 minute', at + k * interval '1 minute' + interval '0.1 s', 'failed', "
            "'HTTP 503: Service Unavailable', 503, 100, false, consumer_id FROM bench_chunk, generate_series(1, tries) k"
        )
        # Dead: spent their 8 attempts, dead 1 to 121 days ago (a purge at 90 days takes a quarter).
        _insert_chunk(
            cursor, first=1, last=DEAD, consumers=consumers,
            at="now() - interval '2 days' - random() * interval '120 days'",
        )  # fmt: skip
        cursor.execute(
            "INSERT INTO outbox_delivery (id, event_id, event_type, consumer_id, status, attempts, max_attempts, "
            "next_attempt_at, claim_token, last_error, delivered_at, dead_at, created_at) "
            "SELECT delivery_id, event_id, type, consumer_id, 'dead', 8, 8, at + interval '1 day', NULL, "
            "'HTTP 500: Internal Server Error', NULL, at + interval '1 day', at FROM bench_chunk"
        )
        cursor.execute(
            "INSERT INTO outbox_deliveryattempt (delivery_id, number, claim_token, started_at, finished_at, "
            "outcome, error, http_status, duration_ms, late, consumer_id) SELECT delivery_id, k, gen_random_uuid(), "
            "at + k * interval '2 hours', at + k * interval '2 hours' + interval '0.1 s', 'failed', "
            "'HTTP 500: Internal Server Error', 500, 100, false, consumer_id FROM bench_chunk, generate_series(1, 8) k"
        )
        cursor.execute("DROP TABLE bench_chunk")
        filled = time.monotonic() - started
        for table in ("outbox_event", "outbox_delivery", "outbox_deliveryattempt", "odal_tally"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    counts = outbox_counts()
    found = (counts["delivered"], counts["pending"], counts["dead"])
    if found != (n, PENDING, DEAD):
        raise SystemExit(
            f"benchmark broken: after the fill the counts say delivered/pending/dead {found}, the rows "
            f"{(n, PENDING, DEAD)}: the tally's triggers did not count the inserts"
        )
    buckets = age_tally(sessions_per_hour)
    counts = outbox_counts()
    if (counts["delivered"], counts["pending"], counts["dead"]) != (n, PENDING, DEAD):
        raise SystemExit("benchmark broken: laying out the tally's buckets changed its sums")
    rewrite_tally()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        size = cursor.fetchone()[0]
    return {"fill_seconds": filled, "total_seconds": time.monotonic() - started, "tally_rows": buckets,
            "database_bytes": size}  # fmt: skip


def age_tally(sessions_per_hour: int) -> int:
    """The fill's few statements leave the tally a handful of rows; 60 days of sweeping leave one
    row per (figure, key, hour, session that wrote in that hour): a trigger writes to its
    session's own shard (its backend pid), and a sweep renews its connection every
    ODAL_DB_CONN_MAX_AGE (60 s). So the delivered and attempt figures are laid out again by the
    hour each row was delivered / its attempt finished, and `sessions_per_hour` sessions an hour
    (120: two sweep processes, a new connection a minute each), keeping every sum. Nothing is
    compacted unless the code schedules odal.core.tally.compact (see compaction_scheduled)."""
    from django.db import connection, transaction

    hour = "date_trunc('hour', {col} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    shard = f"1 + (floor(extract(epoch FROM {{col}}) * {int(sessions_per_hour)} / 3600)::bigint % {int(sessions_per_hour)})"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM odal_tally WHERE metric IN ('outbox.delivered', 'outbox.attempts')")
        cursor.execute(
            "INSERT INTO odal_tally (metric, key, hour, shard, value) "
            f"SELECT 'outbox.delivered', consumer_id::text, {hour.format(col='delivered_at')}, "
            f"{shard.format(col='delivered_at')}, count(*) FROM outbox_delivery WHERE status = 'delivered' "
            "GROUP BY 2, 3, 4"
        )
        cursor.execute(
            "INSERT INTO odal_tally (metric, key, hour, shard, value) "
            "SELECT 'outbox.attempts', outcome || CASE WHEN late THEN ':late' ELSE '' END, "
            f"{hour.format(col='finished_at')}, {shard.format(col='finished_at')}, count(*) "
            "FROM outbox_deliveryattempt GROUP BY 2, 3, 4"
        )
        cursor.execute("SELECT count(*) FROM odal_tally")
        return cursor.fetchone()[0]


def rewrite_tally() -> None:
    """Write the tally's live rows into a fresh file (copy, TRUNCATE, copy back) and ANALYZE it:
    laying it out and compacting it leave dead rows behind by the hundred thousand, which a
    running system's hourly compactions never pile up, and which VACUUM FULL keeps while any
    older snapshot might still see them."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE bench_tally ON COMMIT DROP AS SELECT * FROM odal_tally")
        cursor.execute("TRUNCATE odal_tally")
        cursor.execute("INSERT INTO odal_tally SELECT * FROM bench_tally")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE odal_tally")


def compaction_scheduled() -> bool:
    """Whether the hourly retention task is scheduled (a django-q2 Schedule of outbox.tasks.purge):
    it folds the tally's old buckets (odal.core.tally.compact) after purging."""
    from django_q.models import Schedule

    return Schedule.objects.filter(func="outbox.tasks.purge").exists()


# -- the surfaces -----------------------------------------------------------------------------------


def surfaces(expected_delivered: int, *, warmups: int = 3, calls: int = 20) -> dict:
    """{surface: {"median", "p95", "ms": [...]}}: each called as a user meets it, DEBUG off."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings

    from odal.core.models import ApiToken

    user_model = get_user_model()
    admin = user_model.objects.filter(username="bench-admin").first() or user_model.objects.create_superuser(
        "bench-admin", "bench@example.com", uuid.uuid4().hex
    )
    _, token = ApiToken.objects.issue(name="bench-read", scope="read")
    browser = Client(SERVER_NAME="localhost")
    browser.force_login(admin)
    api = Client(SERVER_NAME="localhost")
    scraper = Client(SERVER_NAME="localhost")
    metrics_headers = (
        {"Authorization": f"Bearer {settings.ODAL_METRICS_TOKEN}"} if settings.ODAL_METRICS_TOKEN else {}
    )

    def dashboard():
        r = browser.get("/admin/")
        assert r.status_code == 200 and b"odal-dash" in r.content, r.status_code
        assert f"{expected_delivered}".encode() in r.content, (
            "the dashboard does not show the delivered count"
        )

    def metrics():
        r = scraper.get("/metrics", headers=metrics_headers)
        assert r.status_code == 200 and b"outbox_deliveries" in r.content, r.status_code

    def get_outbox():
        r = api.get("/vault/api/v1/outbox", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.status_code
        assert r.json()["delivered"] == expected_delivered, r.json()

    def status():
        out = io.StringIO()
        call_command("outbox", "status", stdout=out)
        assert f"delivered {expected_delivered}" in out.getvalue(), out.getvalue()

    found = {}
    with override_settings(DEBUG=False):
        for name, call in (("dashboard", dashboard), ("metrics", metrics), ("outbox", get_outbox),
                           ("status", status)):  # fmt: skip
            times = timed_calls(call, warmups=warmups, calls=calls)
            timer = StatementTimer()  # one more call, to see where its time goes
            with connection.execute_wrapper(timer):
                started = time.perf_counter()
                call()
                wall = (time.perf_counter() - started) * 1000
            found[name] = {
                **times,
                "sql_ms": sum(t for t, _, _ in timer.slowest(top=1000)),
                "statements": sum(n for _, n, _ in timer.slowest(top=1000)),
                "wall_ms": wall,
                "slowest": timer.slowest(top=3),
            }
    return found


def timed_calls(call, *, warmups: int, calls: int) -> dict:
    """`call()` `warmups` times, then `calls` times timed: {"median", "p95", "ms": [...]} (ms)."""
    for _ in range(warmups):
        call()
    ms = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        ms.append((time.perf_counter() - started) * 1000)
    ordered = sorted(ms)
    return {
        "median": statistics.median(ms),
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "ms": ms,
    }


def queries_of(call) -> list[tuple[str, tuple]]:
    """The SQL statements (with their parameters) that `call()` runs on the default connection."""
    from django.db import connection

    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        call()
    return seen


def count_plans() -> dict:
    """EXPLAIN (ANALYZE) of each statement outbox_counts() runs, keyed by what it reads:
    pending, dead, tally (and consumers)."""
    from django.db import connection

    from outbox.service import outbox_counts

    plans = {}
    for sql, params in queries_of(outbox_counts):
        if "'pending'" in sql or "pending" in params:
            what = "pending"
        elif "'dead'" in sql or "dead" in params:
            what = "dead"
        elif "odal_tally" in sql:
            what = "tally"
        else:
            what = "consumers"
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plans[what] = "\n".join(row[0] for row in cursor.fetchall())
    return plans


# -- retention ---------------------------------------------------------------------------------------


class StatementTimer:
    """Sums the time of every statement on the default connection by its shape (IN lists and
    table prefixes folded): [(total ms, calls, shape)], slowest first."""

    def __init__(self):
        self.spent: dict[str, list] = {}

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            shape = re.sub(r"(%s, )+%s", "…", sql)
            shape = re.sub(r'"[a-z_]+"\."([a-z_]+)"', r"\1", shape)
            entry = self.spent.setdefault(shape, [0.0, 0])
            entry[0] += (time.perf_counter() - started) * 1000
            entry[1] += 1

    def slowest(self, top: int = 8) -> list[tuple[float, int, str]]:
        return sorted(((ms, n, shape) for shape, (ms, n) in self.spent.items()), reverse=True)[:top]


class AutoAnalyze:
    """A stand-in for autovacuum's analyze, for a server that runs with autovacuum off (a CI
    configuration; production runs it): called after each purge batch (the purge's `progress`),
    at most once per autovacuum_naptime it ANALYZEs each outbox table changed by more than
    autovacuum_analyze_threshold + autovacuum_analyze_scale_factor × its rows since its last
    analyze, which is when autovacuum would. Does nothing when autovacuum is on."""

    TABLES = ("outbox_delivery", "outbox_deliveryattempt", "outbox_event")

    def __init__(self):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('autovacuum') = 'on', "
                "extract(epoch FROM current_setting('autovacuum_naptime')::interval)::float8, "
                "current_setting('autovacuum_analyze_threshold')::float8, "
                "current_setting('autovacuum_analyze_scale_factor')::float8"
            )
            self.server_autovacuum, self.naptime, self.threshold, self.scale = cursor.fetchone()
        self.next_at = time.monotonic() + self.naptime
        self.done: list[tuple[float, str]] = []  # (seconds into the purge, table)
        self.started = time.monotonic()

    def __call__(self, rows: int) -> None:
        from django.db import connection

        if self.server_autovacuum or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.naptime
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                "WHERE s.relname = ANY(%s) AND s.n_mod_since_analyze > %s + %s * greatest(c.reltuples, 0)",
                [list(self.TABLES), self.threshold, self.scale],
            )
            for (table,) in cursor.fetchall():
                cursor.execute(f"ANALYZE {table}")
                self.done.append((time.monotonic() - self.started, table))


def timed_purge(*, delivered_days: int = 30, dead_days: int = 90) -> dict:
    """outbox.retention.purge over the big table, in this process: rows deleted per second, and
    where the time went (its statements, timed: a few microseconds each, against milliseconds)."""
    from django.db import connection
    from django.utils import timezone

    from outbox.retention import purge
    from outbox.service import outbox_counts

    before = outbox_counts()["delivered"]
    now = timezone.now()
    timer = StatementTimer()
    analyzer = AutoAnalyze()
    started = time.monotonic()
    with connection.execute_wrapper(timer):
        report = purge(
            delivered_before=now - timedelta(days=delivered_days),
            dead_before=now - timedelta(days=dead_days),
            evidence_before=now - timedelta(days=3650),
            progress=analyzer,
        )
    seconds = time.monotonic() - started
    after = outbox_counts()["delivered"]
    if after != before:
        raise SystemExit(f"benchmark broken: the purge moved the delivered count from {before} to {after}")
    rows = report.deliveries + report.attempts + report.events + report.registry_attempts
    return {
        "seconds": seconds,
        "deliveries": report.deliveries,
        "attempts": report.attempts,
        "events": report.events,
        "registry_attempts": report.registry_attempts,
        "batches": report.batches,
        "rows": rows,
        "deliveries_per_s": report.deliveries / seconds if seconds else 0.0,
        "rows_per_s": rows / seconds if seconds else 0.0,
        "statements": timer.slowest(),
        "autovacuum": analyzer.server_autovacuum,
        "analyzed": analyzer.done,
    }


def start_sweep(spawn, env: dict):
    """A running `odal outbox sweep` (batch 500), once it has finished its first pass (its
    heartbeat is there): the measurements then leave out its start-up."""
    from odal.core import tally
    from odal.core.models import Heartbeat

    proc = spawn(["-m", "odal", "outbox", "sweep", "--batch", "500"], env)
    worker = f"{socket.gethostname()}:{proc.pid}"[:200]
    deadline = time.monotonic() + 60
    while not Heartbeat.objects.filter(role=tally.SWEEP, worker=worker).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("benchmark broken: `odal outbox sweep` did not start")
        time.sleep(0.1)
    return proc


def warm_sweep_rate(consumer_id: int, backlog: int, sweep) -> float:
    """Deliveries/s of the running `sweep` over `backlog` fresh no-op deliveries in the big table:
    from the commit that creates them (and wakes the sweep) to the last one delivered."""
    from django.db import connection, transaction

    from odal.work.wake import SWEEP
    from outbox.models import Delivery

    tag = f"bench.beside.{uuid.uuid4().hex[:8]}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "WITH ev AS (INSERT INTO outbox_event (id, type, payload, created_at) SELECT odal_uuid7(), %s, "
            "jsonb_build_object('n', g), now() FROM generate_series(1, %s) g RETURNING id) "
            "INSERT INTO outbox_delivery (id, event_id, event_type, consumer_id, status, attempts, max_attempts, "
            "next_attempt_at, claim_token, last_error, delivered_at, dead_at, created_at) "
            "SELECT odal_uuid7(), id, %s, %s, 'pending', 0, 8, now(), NULL, '', NULL, NULL, now() FROM ev",
            [tag, backlog, tag, consumer_id],
        )
        cursor.execute("SELECT pg_notify(%s, '')", [SWEEP.channel])
    started = time.monotonic()
    pending = Delivery.objects.filter(consumer_id=consumer_id, status=Delivery.Status.PENDING)
    deadline = started + 600
    while pending.exists():
        if sweep.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("benchmark broken: the sweep stopped (or stalled) with deliveries pending")
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    delivered = Delivery.objects.filter(event__type=tag, status=Delivery.Status.DELIVERED).count()
    if delivered != backlog:
        raise SystemExit(f"benchmark broken: {delivered} of {backlog} delivered beside the big table")
    return backlog / elapsed


def purged_so_far() -> int:
    from odal.core import tally

    return sum(tally.totals("outbox.purged")["outbox.purged"].values())


def wait_for_purge_to_delete(proc, before: int, *, timeout: float = 300) -> float:
    """Seconds until the purge process has committed its first deletions (the tally's
    outbox.purged figure moves past `before`), so the measurement beside it starts with it at work."""
    started = time.monotonic()
    while purged_so_far() <= before:
        if proc.poll() is not None:
            raise SystemExit(
                f"benchmark broken: `odal outbox purge` exited ({proc.returncode}) before deleting"
            )
        if time.monotonic() - started > timeout:
            raise SystemExit("benchmark broken: `odal outbox purge` deleted nothing in 5 minutes")
        time.sleep(0.05)
    return time.monotonic() - started


def vacuum_after_purge() -> None:
    """VACUUM ANALYZE of the outbox's tables, as autovacuum does after a purge deleted half of
    them (this server may run without it), so what the sweep meets next is a table in its usual
    state, not five million dead index entries."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ("outbox_delivery", "outbox_deliveryattempt", "outbox_event", "odal_tally"):
            cursor.execute(f"VACUUM ANALYZE {table}")


class CpuWindow:
    """CPU use over a stretch of time, from /proc: the machine's busy share (both cores), and the
    share of one core used by each named process (a pid; None when it is gone)."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.start = self._sample()

    @staticmethod
    def _jiffies(pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def _sample(self):
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
        return (
            time.monotonic(),
            sum(values),
            values[3] + values[4],
            {n: self._jiffies(p) for n, p in self.pids.items()},
        )

    def stop(self) -> dict:
        (t0, total0, idle0, per0), (t1, total1, idle1, per1) = self.start, self._sample()
        tick, wall = os.sysconf("SC_CLK_TCK"), max(1e-9, t1 - t0)
        out = {"machine": 1 - (idle1 - idle0) / max(1, total1 - total0), "load": os.getloadavg()[0]}
        for name in self.pids:
            a, b = per0.get(name), per1.get(name)
            out[name] = None if a is None or b is None else (b - a) / tick / wall
        return out


def backend_pids() -> list[int]:
    """The other sessions on this database (the sweep's and the purge's backends)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return [row[0] for row in cursor.fetchall()]


def cpu_text(cpu: dict) -> str:
    def share(v):
        return "gone" if v is None else f"{v:.0%}"

    parts = [f"machine {cpu['machine']:.0%} busy (load {cpu['load']:.1f})"]
    parts += [f"{name} {share(v)}" for name, v in cpu.items() if name not in ("machine", "load")]
    return ", ".join(parts)


def mean_cpu(windows: list[dict]) -> dict:
    keys = {k for w in windows for k in w}
    out = {}
    for k in sorted(keys, key=lambda k: (k not in ("machine", "load"), k)):
        values = [w[k] for w in windows if w.get(k) is not None]
        out[k] = sum(values) / len(values) if values else None
    return out


def sweep_beside_purge(spawn, stop, env: dict, consumer_id: int, backlog: int, repeats: int,
                       purge_argv: list[str]) -> dict:  # fmt: skip
    """The sweep's no-op rate alone and while `odal outbox purge` runs in a process of its own,
    `repeats` times each, interleaved (alone, beside, beside, alone, …: the machine's other load
    drifts, and this way it weighs on both alike). The purge runs from before the first
    measurement to after the last; for the measurements alone it is paused (SIGSTOP, then
    SIGCONT), between two of its statements or in one, which then waits for it. Medians, and the
    CPU each process used meanwhile (shares of one core; the machine's of both)."""
    sweep = start_sweep(spawn, env)
    purge = None
    try:
        before, purged = set(backend_pids()), purged_so_far()
        purge = spawn(["-m", "odal", "outbox", "purge", *purge_argv], env)
        waited = wait_for_purge_to_delete(purge, purged)
        pids = {"sweep": sweep.pid, "purge": purge.pid,
                **{f"backend {p}{' (purge)' if p not in before else ''}": p for p in backend_pids()}}  # fmt: skip
        found: dict[bool, list] = {False: [], True: []}
        cpu: dict[bool, list] = {False: [], True: []}
        overlapped = True
        order = [(k // 2 + k) % 2 == 1 for k in range(2 * repeats)]  # alone, beside, beside, alone, …
        for beside in order:
            purge.send_signal(signal.SIGCONT if beside else signal.SIGSTOP)
            window = CpuWindow(pids)
            found[beside].append(warm_sweep_rate(consumer_id, backlog, sweep))
            cpu[beside].append(window.stop())
            overlapped = overlapped and purge.poll() is None
        purge.send_signal(signal.SIGCONT)
        cpu_alone, cpu_beside = mean_cpu(cpu[False]), mean_cpu(cpu[True])
        log(
            f"alone (purge paused): {', '.join(f'{r:,.0f}/s' for r in found[False])}; CPU: {cpu_text(cpu_alone)}"
        )
        log(f"beside the purge: {', '.join(f'{r:,.0f}/s' for r in found[True])}"
            f"{'' if overlapped else ' (THE PURGE FINISHED BEFORE THE MEASUREMENTS DID)'}; "
            f"CPU: {cpu_text(cpu_beside)}")  # fmt: skip
    finally:
        if purge is not None and purge.poll() is None:
            purge.send_signal(signal.SIGCONT)
        stop([p for p in (sweep, purge) if p is not None and p.poll() is None], 2)
    return {
        "alone": statistics.median(found[False]),
        "beside": statistics.median(found[True]),
        "alone_all": found[False],
        "beside_all": found[True],
        "overlapped": overlapped,
        "purge_started_after": waited,
        "cpu_alone": cpu_alone,
        "cpu_beside": cpu_beside,
    }


def run(spawn, stop, env: dict, *, sizes: list[int], sessions_per_hour: int, backlog: int,
        repeats: int, noop_consumer, reads=None, only_reads: bool = False) -> dict:  # fmt: skip
    """Everything of issue 13's part, in order: per size, fill and time the surfaces (and
    `reads(size)`, issue 26's reads over the same tables, under "reads"); on the largest, the
    plans, the timed purge, then the sweep alone and beside a running purge. `only_reads`: the
    fills and the reads, nothing else."""
    out: dict = {"sizes": sizes, "compaction": compaction_scheduled(), "sessions_per_hour": sessions_per_hour}
    ids = history_consumers()
    for size in sizes:
        print(f"  filling {size:,} delivered rows…", flush=True)
        fill = fill_history(size, ids, sessions_per_hour=sessions_per_hour)
        fill["tally_rows_laid_out"] = fill["tally_rows"]
        if out["compaction"]:
            from odal.core import tally
            from odal.core.models import Tally

            tally.compact()
            rewrite_tally()
            fill["tally_rows"] = Tally.objects.count()
        log(f"filled in {fill['fill_seconds']:.0f} s (with VACUUM ANALYZE, {fill['total_seconds']:.0f} s); "
            f"tally rows {fill['tally_rows_laid_out']:,}, {fill['tally_rows']:,} after compaction; database {fill['database_bytes'] / 2**30:.1f} GiB")  # fmt: skip
        load = os.getloadavg()[0]
        out[size] = {"fill": fill, "load": load}
        if not only_reads:
            timed = out[size]["surfaces"] = surfaces(size)
            log(", ".join(f"{k} {v['median']:.1f} ms (p95 {v['p95']:.1f})" for k, v in timed.items()))
        if reads is not None:
            out[size]["reads"] = reads(size)
    if only_reads:
        return out
    big = sizes[-1]
    out["plans"] = count_plans()
    for what, plan in out["plans"].items():
        print(
            f"  plan of the {what} count at {big:,} rows:\n"
            + "\n".join("    " + line for line in plan.splitlines())
        )
    for name, t in out[big]["surfaces"].items():
        log(
            f"{name} at {big:,}: {t['statements']} statements, {t['sql_ms']:.1f} ms of SQL in a {t['wall_ms']:.1f} ms call"
        )
        for ms, n, shape in t["slowest"]:
            log(f"  {ms:6.1f} ms ×{n} {shape[:140]}")
    print(f"  purging the {big:,}-row table at 30 days (dead at 90 days)…", flush=True)
    out["purge"] = p = timed_purge()
    if not p["autovacuum"]:
        log(
            "autovacuum is off on this server; the bench analyzed as it would have: "
            + (", ".join(f"{t} at {at:.0f} s" for at, t in p["analyzed"]) or "nothing")
        )
    for ms, n, shape in p["statements"]:
        log(f"  {ms / 1000:7.1f} s in {n:,} calls: {shape[:150]}")
    log(f"{p['deliveries']:,} deliveries, {p['attempts']:,} attempts, {p['events']:,} events in {p['seconds']:.1f} s: "
        f"{p['deliveries_per_s']:,.0f} deliveries/s, {p['rows_per_s']:,.0f} rows/s")  # fmt: skip
    started = time.monotonic()
    vacuum_after_purge()
    log(
        f"VACUUM ANALYZE after the purge (what autovacuum does after one): {time.monotonic() - started:.0f} s"
    )
    noop = noop_consumer()
    print(
        f"  the no-op sweep (1 process, {backlog:,} deliveries) alone and beside `odal outbox purge "
        f"{' '.join(BESIDE_PURGE)}` (what the timed purge left, less a day)…",
        flush=True,
    )
    out["beside"] = sweep_beside_purge(spawn, stop, env, noop, backlog, repeats, BESIDE_PURGE)
    return out
