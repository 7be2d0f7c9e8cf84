"""Issue 23's statement-bounds row of `make bench`, run by bench/run.py (also `--only bounds`):
the no-op sweep's deliveries/s with 2 `odal outbox sweep` processes over the same backlog, with
the database statement bounds off (ODAL_DB_STATEMENT_SECONDS=0) and on (unset: the role's
default), after one warm-up measurement not counted, `repeats` times each, interleaved (off, on,
on, off, off, on, …: the machine's other load drifts, and this way it weighs on both alike).
The figure is the ratio on/off of the best of each (the machine's other load only ever slows a
measurement down; the medians are reported too); the target is at least 0.95. The measurement
itself is run.py's sweep_rate, passed in.
"""

import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIABLE = "ODAL_DB_STATEMENT_SECONDS"
PROCESSES = 2
TARGET = 0.95


def log(message: str) -> None:
    print(f"  {message}", flush=True)


def run(sweep_rate, env: dict, *, consumer_id: int, backlog: int, repeats: int) -> dict:
    """{"off", "on": the best rates, "off_median", "on_median", "off_all", "on_all": every rate in
    order, "ratio" (of the best), "warm_up"}."""
    off = {**env, VARIABLE: "0"}
    on = {k: v for k, v in env.items() if k != VARIABLE}
    warm_up = sweep_rate(off, PROCESSES, backlog, consumer_id)  # caches, the first start of the processes
    log(f"warm-up (not counted): {warm_up:,.0f} deliveries/s")
    found: dict[bool, list[float]] = {False: [], True: []}
    order = [(k // 2 + k) % 2 == 1 for k in range(2 * repeats)]  # off, on, on, off, off, on, …
    for bounded in order:
        rate = sweep_rate(on if bounded else off, PROCESSES, backlog, consumer_id)
        found[bounded].append(rate)
        log(f"statement bounds {'on ' if bounded else 'off'}: {rate:,.0f} deliveries/s")
    return {
        "off": max(found[False]),
        "on": max(found[True]),
        "off_median": statistics.median(found[False]),
        "on_median": statistics.median(found[True]),
        "off_all": found[False],
        "on_all": found[True],
        "ratio": max(found[True]) / max(found[False]),
        "warm_up": warm_up,
        "backlog": backlog,
        "repeats": repeats,
    }


def report(r: dict) -> tuple[list, list, str]:
    """The bounds rows, target and section of docs/performance.md."""
    what = f"no-op sweep, {PROCESSES} processes, {r['backlog']:,} deliveries"
    rows = [
        (f"{what}: statement bounds off ({VARIABLE}=0), best of {r['repeats']}", f"{r['off']:,.0f}/s"),
        (f"{what}: statement bounds on ({VARIABLE} unset), best of {r['repeats']}", f"{r['on']:,.0f}/s"),
        (
            "the sweep with statement bounds on, over off (best of each; of the medians)",
            f"{r['ratio']:.3f} ({r['on_median'] / r['off_median']:.3f})",
        ),
    ]
    targets = [(f"sweep with statement bounds on: ≥ {TARGET} of its throughput off", r["ratio"] >= TARGET)]
    rates = ", ".join(f"{x:,.0f}" for x in r["off_all"]), ", ".join(f"{x:,.0f}" for x in r["on_all"])
    doc = (
        "## The sweep with statement bounds on (issue 23)\n\n"
        f"{PROCESSES} `odal outbox sweep` processes drain {r['backlog']:,} due deliveries to the no-op Python "
        "consumer (filled by SQL before each measurement, as in the sweep rows above; timed from the processes' "
        f"start to the last delivery), after one warm-up measurement not counted ({r['warm_up']:,.0f}/s), "
        f"{r['repeats']} times with "
        f"`{VARIABLE}=0` (the bounds off: no statement_timeout, lock_timeout or "
        "idle_in_transaction_session_timeout, no client-side bound on waits) and "
        f"{r['repeats']} times with it unset (on, at the role's default), interleaved (off, on, on, off, …: the "
        "machine's other load drifts, and this way it weighs on both alike). Off: "
        f"{rates[0]}/s; on: {rates[1]}/s. The best of each: {r['off']:,.0f} and {r['on']:,.0f}/s, ratio "
        f"{r['ratio']:.3f} (target ≥ {TARGET}; the machine's other load only ever slows a measurement down); the "
        f"medians: {r['off_median']:,.0f} and {r['on_median']:,.0f}/s, ratio "
        f"{r['on_median'] / r['off_median']:.3f}. On: each connection carries `statement_timeout`, "
        "`lock_timeout` and `idle_in_transaction_session_timeout` to the server, and each wait in the client "
        "is bounded (odal.core.database).\n"
    )
    return rows, targets, doc
