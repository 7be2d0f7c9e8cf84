"""Issue 16's bulk intake row of `make bench`, run by bench/run.py in the same run (or on its own:
`python bench/bulk.py [--passports 20000] [--quick]`, DATABASE_URL naming PostgreSQL; it makes and
drops a database of its own).

`odal passport import FILE --publish --json` in a process of its own, as an operator runs it, over
a JSON lines file of N passports (battery passports with a few fields of data): each passport
created and published, its registration queued, its `passport.published` event fanned out to the
consumers, its two audit entries, a transaction per batch of 1,000. The figure is published
passports per second of the import (the command's own clock, from opening the file to its last
batch committed; the wall clock of the whole process, start-up included, beside it). Then the
database is checked: N published passports, N pending registrations, N events, N × consumers
deliveries, 2N audit entries, and django-q2 tasks enqueued (kicks on, as in production) at most
one drain kick and one sweep kick per batch. The same file imported again creates nothing and
reports every row as existing; its rate is the second figure.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 2000  # published passports/s (issue 16)
BATCH = 1000  # the import's default batch


def write_file(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "upi": f"https://id.example.eu/01/09506000134352/21/BULK-{i:07d}",
                        "operatorId": "OP-BENCH",
                        "facilityId": "FAC-7",
                        "commodityCode": "8507 60",
                        "data": {
                            "chemistry": "LFP",
                            "capacityKwh": 75 + i % 25,
                            "cells": 96,
                            "recycled": 0.12,
                        },
                    }
                )
                + "\n"
            )


def clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE registry_registrationattempt, registry_registration, outbox_deliveryattempt, "
            "outbox_delivery, outbox_event, odal_passport, django_q_ormq CASCADE"
        )


def enqueued() -> dict:
    from django_q.models import OrmQ

    funcs: dict = {}
    for task in OrmQ.objects.all():
        funcs[task.func()] = funcs.get(task.func(), 0) + 1
    return funcs


def import_file(env: dict, path: Path) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "odal", "passport", "import", str(path), "--publish", "--json"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"benchmark broken: the import exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def run(env: dict, *, passports: int) -> dict:
    """Import `passports` published passports, check what it wrote, import them again."""
    from django.db.models import Count

    from odal.core.models import AuditEntry, Passport
    from outbox.models import Consumer, Delivery, Event
    from registry.models import Registration

    clear()
    consumers = sum(1 for c in Consumer.objects.all() if c.wants("passport.published"))
    audit_before = AuditEntry.objects.count()
    import_env = {**env, "ODAL_KICK_SWEEP": "true", "ODAL_REGISTRY_ADAPTER": "http"}
    with tempfile.TemporaryDirectory(prefix="odal-bench-bulk-") as tmp:
        path = Path(tmp) / "passports.jsonl"
        write_file(path, passports)
        size = path.stat().st_size
        first, wall = import_file(import_env, path)
        kicks = enqueued()
        checks = {
            "published passports": (Passport.objects.filter(status="published").count(), passports),
            "pending registrations": (Registration.objects.filter(status="pending").count(), passports),
            "passport.published events": (Event.objects.filter(type="passport.published").count(), passports),
            "deliveries": (Delivery.objects.count(), passports * consumers),
            "audit entries": (AuditEntry.objects.count() - audit_before, 2 * passports),
        }
        wrong = {what: got for what, (got, want) in checks.items() if got != want}
        if first["published"] != passports or wrong:
            raise SystemExit(f"benchmark broken: {first['published']} of {passports} published; {wrong}")
        statuses = dict(Delivery.objects.values_list("status").annotate(n=Count("id")))
        again, again_wall = import_file(import_env, path)
        if again["existing"] != passports or again["created"] or Passport.objects.count() != passports:
            raise SystemExit(f"benchmark broken: the rerun {again}")
    batches = -(-passports // BATCH)
    out = {
        "passports": passports,
        "bytes": size,
        "seconds": first["seconds"],
        "per_second": first["published"] / first["seconds"],
        "wall_seconds": wall,
        "wall_per_second": passports / wall,
        "consumers": consumers,
        "deliveries": statuses,
        "batches": batches,
        "drain_kicks": kicks.get("registry.tasks.drain", 0),
        "sweep_kicks": kicks.get("outbox.tasks.sweep", 0),
        "other_tasks": {
            k: v for k, v in kicks.items() if k not in ("registry.tasks.drain", "outbox.tasks.sweep")
        },
        "rerun_seconds": again["seconds"],
        "rerun_per_second": passports / again["seconds"],
        "rerun_wall_seconds": again_wall,
    }
    clear()
    print(
        f"  {passports:,} passports: {out['per_second']:,.0f} published/s ({out['seconds']:.1f} s; "
        f"{out['wall_seconds']:.1f} s with start-up); {out['drain_kicks']} drain and {out['sweep_kicks']} sweep "
        f"kicks for {batches} batches; the rerun {out['rerun_per_second']:,.0f} rows/s, all existing",
        flush=True,
    )
    return out


def report(b: dict) -> tuple[list, list, str]:
    """Issue 16's bulk rows, targets and section of docs/performance.md."""
    n = b["passports"]
    one_kick = b["drain_kicks"] <= b["batches"] and b["sweep_kicks"] <= b["batches"]
    rows = [
        (f"`odal passport import --publish`, {n:,} passports (JSON lines, {b['bytes'] / 2**20:.1f} MiB), "
         f"registrations queued, {b['consumers']} consumer(s)", f"{b['per_second']:,.0f} published passports/s"),
        ("the same, wall clock of the process (start-up included)",
         f"{b['wall_per_second']:,.0f}/s ({b['wall_seconds']:.1f} s)"),
        (f"django-q2 tasks it enqueued ({b['batches']} batches of {BATCH:,})",
         f"{b['drain_kicks']} drain, {b['sweep_kicks']} sweep"),
        ("the same file again (every row reported as existing, nothing created)", f"{b['rerun_per_second']:,.0f} rows/s"),
    ]  # fmt: skip
    targets = [
        (f"bulk import: ≥ {TARGET:,} published passports/s", b["per_second"] >= TARGET),
        ("bulk import: at most one drain kick and one sweep kick per batch", one_kick),
    ]
    deliveries = ", ".join(f"{count:,} {status}" for status, count in sorted(b["deliveries"].items()))
    doc = (
        "\n## Bulk intake (issue 16)\n\n"
        f"`odal passport import FILE --publish --json` in a process of its own over a JSON lines file of {n:,} "
        "battery passports (UPI, operator, facility, commodity code and four fields of data), the default batch "
        f"of {BATCH:,} passports per transaction, kicks on as in production (no cluster runs, so each enqueued "
        "task stays in django-q2's queue to be counted). The rate is the command's own clock, from opening the file "
        "to its last batch committed. The bench then checks the database: every passport published, one "
        f"pending registration each, one `passport.published` event each and its deliveries ({deliveries}), two "
        "audit entries each. The same file imported again creates nothing and reports every row as existing.\n"
    )
    return rows, targets, doc


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passports", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 passports")
    parser.add_argument("--database", default=f"odal_bench_bulk_{os.getpid()}")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("the benchmark needs DATABASE_URL naming PostgreSQL (tests/pg.py finds one)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.torture import database_url, drop_database, recreate_database

    recreate_database(args.database)
    env = {**os.environ, "DATABASE_URL": database_url(args.database), "ODAL_LOG_LEVEL": "ERROR",
           "ODAL_PYTHON_CONSUMERS": "outbox.receiver.*,bench.noop.*"}  # (its no-op consumer)  # fmt: skip
    try:
        subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
        os.environ.update(env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
        import django

        django.setup()
        from django.db import connection

        from odal.core import database

        database.role = database.UNBOUNDED  # the bench's own fills and counts; its odal processes keep theirs

        from outbox.models import Consumer

        Consumer.objects.update_or_create(
            name="bench-noop", defaults={"kind": "python", "target": "bench.noop.consume"}
        )
        b = run(env, passports=2000 if args.quick else args.passports)
        connection.close()
    finally:
        drop_database(args.database)
    rows, targets, _ = report(b)
    print("\n".join(f"| {a} | {v} |" for a, v in rows))
    print("\n".join(f"| {a} | {'yes' if ok else '**NO**'} |" for a, ok in targets))
    return 0 if all(ok for _, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
