"""Where one sweep process spends its time (issue 26, item 8): cProfile of `sweep_until_idle`
draining a backlog of deliveries in this process (no-op ones, or webhooks to bench/receiver.py
answering 2xx or 500), after a warm-up, printed by own time and by cumulative time, for the
sweep's thread and, with webhooks, the webhook client's loop thread on its own. Time a thread
spends waiting for the other (or for the Python runner) shows as waiting.

    python tests/pg.py -- python bench/profile_sweep.py [--rows 20000] [--top 25] [--consumer webhook]

It makes (and drops) a database of its own, ODAL_BENCH_DATABASE or odal_profile.
"""

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    PYTHON_CONSUMERS,
    consumer,
    database_url,
    drop_database,
    fill_backlog,
    recreate_database,
    start_receiver,
)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--consumer", choices=("noop", "webhook", "failing"), default="noop",
        help="whose deliveries: the no-op Python consumer's, or a webhook's to bench/receiver.py (2xx, or 500)",
    )  # fmt: skip
    parser.add_argument(
        "--sql", action="store_true", help="time each SQL statement of the sweep's thread instead, by kind"
    )
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print(
            "the profile needs DATABASE_URL naming PostgreSQL (run it through tests/pg.py)", file=sys.stderr
        )
        return 2
    name = os.environ.get("ODAL_BENCH_DATABASE", "odal_profile")
    recreate_database(name)
    env = {**os.environ, "DATABASE_URL": database_url(name), "ODAL_KICK_SWEEP": "false",
           "ODAL_LOG_LEVEL": "ERROR", "ODAL_PYTHON_CONSUMERS": PYTHON_CONSUMERS}  # fmt: skip
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env, DJANGO_SETTINGS_MODULE="odal.settings")
    import django

    django.setup()
    from django.db import connection

    from outbox import webhook_client
    from outbox.sweep import sweep_until_idle

    receiver = None
    if args.consumer == "noop":
        target = consumer("python").pk
    else:
        receiver, base = start_receiver()
        target = consumer("webhook", f"{base}/{'hooks' if args.consumer == 'webhook' else 'fail'}").pk
    fill_backlog(min(args.rows, 2_000), target)
    sweep_until_idle(batch=500, max_seconds=600)  # warm-up: imports, caches, the runner thread
    fill_backlog(args.rows, target, attempts=7 if args.consumer == "failing" else 0)
    profile, spent, loop_profile = cProfile.Profile(), {}, cProfile.Profile()

    def profiled_loop(client):  # the webhook client's loop thread, profiled on its own
        loop_profile.enable()
        try:
            client.loop.run_forever()
        finally:
            loop_profile.disable()

    if not args.sql:
        webhook_client.WebhookClient.run = profiled_loop

    def timed(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            kind = " ".join(sql.split()[:8])[:90]
            seconds, count = spent.get(kind, (0.0, 0))
            spent[kind] = (seconds + time.perf_counter() - started, count + 1)

    started = time.monotonic()
    with connection.execute_wrapper(timed) if args.sql else contextlib.nullcontext():
        profile.enable() if not args.sql else None
        report = sweep_until_idle(batch=500, max_seconds=600)
        profile.disable()
    elapsed = time.monotonic() - started
    connection.close()
    drop_database(name)
    if receiver is not None:
        receiver.kill()
    settled = report.delivered + report.failed
    print(f"{settled:,} {args.consumer} deliveries settled in {elapsed:.2f} s, {settled / elapsed:,.0f}/s "
          f"(one process, {'statements timed' if args.sql else 'profiled: slower than unprofiled'})")  # fmt: skip
    if args.sql:
        for kind, (seconds, count) in sorted(spent.items(), key=lambda item: -item[1][0]):
            print(f"{seconds:8.3f} s {count:6,} × {seconds / count * 1000:8.2f} ms  {kind}")
        return 0
    for name, seen in (("the sweep's thread", profile), ("the webhook client's loop thread", loop_profile)):
        if not seen.getstats():
            continue
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(seen, stream=text).strip_dirs().sort_stats(order).print_stats(args.top)
            print(f"-- {name}, by {order}\n{text.getvalue()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
