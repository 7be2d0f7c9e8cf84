"""The sweep pass's futures (issue 40): the no-op sweep's deliveries/s in this process
(`sweep_until_idle`, batches of 500, a no-op Python consumer) with the pass's futures of each
class named, after a warm-up run not counted, `--repeats` times each, interleaved (A, B, B, A, …:
the machine's other load drifts, and this way it weighs on both alike). Prints the rates.

Usage: python tests/pg.py -- python bench/futures.py [--backlog 20000] [--repeats 5]
       [--futures odal.work.passes.AttemptFuture,concurrent.futures.Future]
"""

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.torture import database_url, recreate_database  # noqa: E402

DATABASE = os.environ.get("ODAL_BENCH_DATABASE", "odal_bench_futures")


def named(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--futures", default="odal.work.passes.AttemptFuture,concurrent.futures.Future")
    args = parser.parse_args()
    recreate_database(DATABASE)
    env = {**os.environ, "DATABASE_URL": database_url(DATABASE), "ODAL_KICK_SWEEP": "false",
           "ODAL_LOG_LEVEL": "ERROR", "ODAL_PYTHON_CONSUMERS": "bench.noop.*"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
    import django

    django.setup()
    from bench.run import consumer, fill_backlog
    from odal.core import database
    from outbox import sweep_pass
    from outbox.sweep import sweep_until_idle

    database.role = database.UNBOUNDED
    noop = consumer("python").pk
    a, b = args.futures.split(",")

    def rate(path: str) -> float:
        fill_backlog(args.backlog, noop)
        sweep_pass.AttemptFuture = named(path)  # (what SweepPass makes one of per claimed row)
        started = time.perf_counter()
        report = sweep_until_idle(batch=500, max_seconds=600)
        took = time.perf_counter() - started
        if report.delivered != args.backlog:
            raise SystemExit(f"benchmark broken: {report.delivered} of {args.backlog} delivered")
        return args.backlog / took

    print(f"warm-up (not counted): {rate(a):,.0f} deliveries/s", flush=True)
    found: dict[str, list[float]] = {a: [], b: []}
    for k in range(2 * args.repeats):
        path = b if (k // 2 + k) % 2 else a
        found[path].append(rate(path))
        print(f"{path}: {found[path][-1]:,.0f} deliveries/s", flush=True)
    for path, rates in found.items():
        print(f"{path}: best {max(rates):,.0f}/s, median {statistics.median(rates):,.0f}/s "
              f"({', '.join(f'{r:,.0f}' for r in rates)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
