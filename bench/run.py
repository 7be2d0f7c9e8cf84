"""odal's benchmark (`make bench`): measures, in one run against PostgreSQL, odal's sweep next to
the same machine's reference figures, and writes docs/performance.md.

- the one-commit-per-row ceiling: a guarded single-row UPDATE with its own commit, psycopg loop,
  1 and 2 clients;
- django-q2: no-op tasks/s through its ORM broker with 2 workers;
- odal: deliveries/s with a no-op Python consumer for 1, 2 and 4 `odal outbox sweep` processes
  over a backlog (attempt log included), and SQL statements per delivery.

Usage: python bench/run.py [--backlog 100000] [--processes 1,2,4] [--tasks 3000] [--seconds 5]
(DATABASE_URL must name a PostgreSQL server; `make bench` finds one.)
"""

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.torture import database_url, drop_database, recreate_database  # noqa: E402

DATABASE = "odal_bench"


def ceiling(url: str, clients: int, seconds: float) -> float:
    """Guarded single-row UPDATEs, each its own transaction: what one commit per row allows."""
    import psycopg

    rows = 200_000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_ceiling")
        conn.execute("CREATE TABLE bench_ceiling (id int PRIMARY KEY, status text NOT NULL, token uuid)")
        conn.execute(
            "INSERT INTO bench_ceiling SELECT g, 'pending', NULL FROM generate_series(1, %s) g", (rows,)
        )
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            n = 0
            row = 1 + i
            while time.monotonic() < stop:
                conn.execute(
                    "UPDATE bench_ceiling SET status = 'done', token = %s WHERE id = %s AND status = 'pending'",
                    (uuid.uuid4(), row),
                )
                n += 1
                row += clients
            done[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def django_q_rate(env: dict, tasks: int) -> float:
    """No-op tasks through django-q2's ORM broker, 2 workers, from enqueue to drained."""
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    cluster = subprocess.Popen([sys.executable, "-m", "odal", "qcluster"], env={**env, "ODAL_Q_WORKERS": "2"},
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(3)  # let the cluster start
        started = time.monotonic()
        for _ in range(tasks):
            async_task("bench.noop.task", q_options={"save": False})
        while OrmQ.objects.exists():
            time.sleep(0.05)
        return tasks / (time.monotonic() - started)
    finally:
        cluster.send_signal(2)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            cluster.kill()


def fill_backlog(backlog: int) -> None:
    from django.db import connection

    from outbox.models import Consumer

    consumer, _ = Consumer.objects.get_or_create(
        name="noop", defaults={"kind": "python", "target": "bench.noop.consume", "max_attempts": 3}
    )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_deliveryattempt, outbox_delivery, outbox_event")
        cursor.execute(
            "INSERT INTO outbox_event (id, type, payload, created_at) "
            "SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('n', g), now() FROM generate_series(1, %s) g",
            [backlog],
        )
        cursor.execute(
            "INSERT INTO outbox_delivery (id, event_id, consumer_id, status, attempts, max_attempts, next_attempt_at, "
            "last_error, created_at) SELECT gen_random_uuid(), id, %s, 'pending', 0, 3, now(), '', now() "
            "FROM outbox_event",
            [consumer.pk],
        )
        cursor.execute("ANALYZE outbox_delivery")


def sweep_rate(env: dict, processes: int, backlog: int) -> float:
    """Deliveries/s of `processes` sweep processes draining a backlog of no-op deliveries."""
    from outbox.models import Delivery

    fill_backlog(backlog)
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "odal", "outbox", "sweep", "--batch", "500"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(processes)
    ]
    try:
        while Delivery.objects.filter(status="pending").exists():
            time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        for proc in procs:
            proc.send_signal(15)
        for proc in procs:
            proc.wait(timeout=30)
    delivered = Delivery.objects.filter(status="delivered").count()
    if delivered != backlog:
        raise SystemExit(f"benchmark broken: {delivered} of {backlog} delivered")
    return backlog / elapsed


def statements_per_delivery(sample: int) -> float:
    from django.db import connection

    from outbox.sweep import sweep_until_idle

    fill_backlog(sample)
    count = [0]

    def counter(execute, sql, params, many, context):
        count[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counter):
        sweep_until_idle(batch=500, max_seconds=600)
    return count[0] / sample


def chart(rows: list[tuple[str, float]]) -> str:
    """A horizontal bar chart as SVG text (no script, no CDN)."""
    width, bar_h, gap, label_w = 720, 22, 8, 260
    peak = max(v for _, v in rows) or 1
    height = len(rows) * (bar_h + gap) + 10
    parts = []
    for i, (label, value) in enumerate(rows):
        y = 5 + i * (bar_h + gap)
        w = (width - label_w - 90) * value / peak
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" font-size="12">{label}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#417690"/>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{value:,.0f}/s</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" font-family="sans-serif">'
            + "".join(parts) + "</svg>\n")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print(
            "the benchmark needs DATABASE_URL naming PostgreSQL (run it through make bench)", file=sys.stderr
        )
        return 2
    recreate_database(DATABASE)
    url = database_url(DATABASE)
    env = {**os.environ, "DATABASE_URL": url, "ODAL_KICK_SWEEP": "false", "ODAL_LOG_LEVEL": "ERROR"}
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
    import django

    django.setup()
    from django.db import connection

    psql_url = url.replace("postgres://", "postgresql://", 1)
    results: dict[str, float] = {}
    print("measuring the one-commit-per-row ceiling…", flush=True)
    results["ceiling_1"] = ceiling(psql_url, 1, args.seconds)
    results["ceiling_2"] = ceiling(psql_url, 2, args.seconds)
    print("measuring django-q2 (ORM broker, 2 workers)…", flush=True)
    results["django_q"] = django_q_rate(env, args.tasks)
    processes = [int(p) for p in args.processes.split(",")]
    for p in processes:
        print(f"measuring odal with {p} sweep process(es) over {args.backlog:,} deliveries…", flush=True)
        results[f"odal_{p}"] = sweep_rate(env, p, args.backlog)
    results["statements"] = statements_per_delivery(min(args.backlog, 5000))
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
        cursor.execute("SHOW fsync")
        fsync = cursor.fetchone()[0]
    connection.close()
    drop_database(DATABASE)

    two = results.get("odal_2", results[f"odal_{processes[0]}"])
    lines = [
        "| what | rate | odal (2 sweeps) / this |",
        "|---|---:|---:|",
        f"| guarded single-row UPDATE, commit per row, 1 client | {results['ceiling_1']:,.0f}/s | "
        f"{two / results['ceiling_1']:.2f}× |",
        f"| guarded single-row UPDATE, commit per row, 2 clients | {results['ceiling_2']:,.0f}/s | "
        f"{two / results['ceiling_2']:.2f}× |",
        f"| django-q2 no-op tasks, ORM broker, 2 workers | {results['django_q']:,.0f}/s | {two / results['django_q']:.1f}× |",
    ]
    for p in processes:
        lines.append(f"| odal sweep, no-op Python consumer, {p} process(es), {args.backlog:,} backlog | "
                     f"{results[f'odal_{p}']:,.0f}/s | |")  # fmt: skip
    lines.append(f"| SQL statements per delivery (batch 500) | {results['statements']:.3f} | |")
    table = "\n".join(lines)
    print(table)
    svg = chart(
        [("ceiling, 1 client", results["ceiling_1"]), ("ceiling, 2 clients", results["ceiling_2"]),
         ("django-q2, 2 workers", results["django_q"])]
        + [(f"odal, {p} sweep process(es)", results[f"odal_{p}"]) for p in processes]
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    chart_path = Path(args.out).with_name("performance.svg")
    chart_path.write_text(svg)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    Path(args.out).write_text(
        f"# Performance\n\nMeasured by `make bench` ({when}) on {platform.machine()}, {os.cpu_count()} cores, "
        f"PostgreSQL {server} (fsync {fsync}), all in one run on the same machine.\n\n{table}\n\n"
        f"![rates](performance.svg)\n\n"
        "The sweep claims up to 500 due rows at once (SKIP LOCKED), runs them, and writes outcomes in batches "
        "(every 200 attempts or every second): successes in one guarded UPDATE, the attempt log in one INSERT. "
        "The one-commit-per-row rows show what a sweep writing each outcome on its own could reach at most.\n\n"
        "Still to measure (issue 7): a webhook consumer against a local server, the registry drain, publish-to-"
        "webhook latency at 50 events/s, and how claim time and a sweep's RSS change from 10,000 to 1,000,000 "
        "rows.\n"
    )
    print(f"wrote {args.out} and {chart_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
