"""Issue 16's drain figures for `make bench` (bench/run.py calls `run` and `report`):

- drain throughput, registering and checking (each registration a register and a check, each a
  request to the simulator at 50 ms ± 20 % latency), with 1 and 2 `odal registry drain` processes
  at BENCH_CONCURRENCY requests in flight each, and the same with one request in flight;
- the rate the simulator saw with ODAL_REGISTRY_RATE_PER_SECOND=100 (most requests within any
  10 s, over 10 s), and with a simulator that admits only 50/s, so that it answers 429s: how
  many, and how many requests arrived while a Retry-After ran (unheeded);
- django-q2 tasks enqueued per 10,000 publishes (each its own commit), with `odal qcluster` on
  its default configuration draining and sweeping meanwhile.

Each drain measurement starts its processes first, waits for them to be up, then makes the
registrations due in one commit that wakes them: the time is from that commit to the last one
registered, so it leaves out the processes' start-up.
"""

import socket
import threading
import time

BENCH_CONCURRENCY = 32  # requests in flight per drain process in the concurrent rows
LATENCY_MS = 50
LIMIT = 100  # ODAL_REGISTRY_RATE_PER_SECOND of the rate rows
STARTUP_SECONDS = 3.0  # a drain process is up and listening by then
TARGETS = {
    "two": 200,  # registrations/s with 2 processes at 50 ms
    "ratio": 10,  # ...and that many times one drain with one request in flight
    "rate": 105,  # the most the simulator may see over any 10 s with a limit of 100/s
    "kicks": 100,  # django-q2 tasks per 10,000 publishes (one each before: 10,000)
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Simulator:
    """`odal registry simulate` in a process of its own, on a free port."""

    def __init__(self, spawn, stop, env: dict, *args: str):
        self.port = free_port()
        self.stop_all = stop
        self.proc = spawn(["-m", "odal", "registry", "simulate", "--port", str(self.port), *args], env)
        self.url = f"http://127.0.0.1:{self.port}"
        import httpx

        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{self.url}/_faults", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("benchmark broken: the registry simulator did not start") from None
                time.sleep(0.1)

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/_stats", timeout=60).json()

    def close(self) -> None:
        self.stop_all([self.proc])


def empty_registry_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE registry_registrationattempt, registry_registration, odal_passport CASCADE")


def queue_registrations(count: int) -> None:
    """`count` published passports, each owing a registration due now, by plain SQL, in one
    commit that NOTIFYs the drain (the listening one wakes; others look within a second). (The
    tables are emptied before the drains start: a TRUNCATE beside their claims could deadlock.)"""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO odal_passport (id, upi, operator_id, facility_id, commodity_code, data, status, "
            "created_at, updated_at, published_at) SELECT gen_random_uuid(), 'https://id.example.eu/bench/' || g, "
            "'op', 'fac', '7208', '{}', 'published', now(), now(), now() FROM generate_series(1, %s) g",
            [count],
        )
        cursor.execute(
            "INSERT INTO registry_registration (id, passport_id, status, operation, attempts, next_attempt_at, "
            "correlation_id, handle, last_error, note, created_at, queued_at) SELECT odal_uuid7(), id, "
            "'pending', 'register', 0, now(), '', '', '', '', now(), now() FROM odal_passport"
        )
        cursor.execute("SELECT pg_notify('odal_registry', '')")


def drain_run(spawn, stop, env: dict, sim: Simulator, *, registrations: int, processes: int,
              concurrency: int, batch: int = 100, **extra: str) -> float:  # fmt: skip
    """Registrations/s of `processes` drain processes over `registrations` due at once."""
    from registry.models import Registration, RegistryPace

    RegistryPace.objects.all().delete()  # no pause or booked slots left over from a run before
    empty_registry_tables()
    drain_env = {**env, "ODAL_REGISTRY_URL": sim.url, "ODAL_REGISTRY_TOKEN": env["ODAL_REGISTRY_TOKEN"],
                 "ODAL_REGISTRY_CHECK_SECONDS": "0", "ODAL_REGISTRY_CONCURRENCY": str(concurrency),
                 **extra}  # fmt: skip
    drains = [
        spawn(["-m", "odal", "registry", "drain", "--batch", str(batch)], drain_env) for _ in range(processes)
    ]
    try:
        time.sleep(STARTUP_SECONDS)
        queue_registrations(registrations)
        started = time.monotonic()
        unfinished = Registration.objects.exclude(status="registered")
        while unfinished.exists():
            if any(p.poll() is not None for p in drains):
                raise SystemExit("benchmark broken: a drain process exited")
            time.sleep(0.05)
        return registrations / (time.monotonic() - started)
    finally:
        stop(drains)


def kicks(spawn, stop, env: dict, publishes: int) -> dict:
    """django-q2 tasks enqueued while `publishes` passports are published, each in its own commit
    (two threads, as two web processes), with `odal qcluster` (2 workers, ORM broker) running the
    drain against a simulator and the sweep (a no-op consumer subscribes)."""
    from django.conf import settings
    from django.db import connection, connections

    from odal.core.models import Passport
    from odal.surfaces import lifecycle

    sim = Simulator(spawn, stop, env)
    cluster_env = {**env, "ODAL_KICK_SWEEP": "true", "ODAL_REGISTRY_URL": sim.url, "ODAL_Q_WORKERS": "2"}
    empty_registry_tables()
    Passport.objects.bulk_create(
        Passport(upi=f"https://id.example.eu/kicks/{i}", operator_id="op") for i in range(publishes)
    )
    ids = list(Passport.objects.values_list("pk", flat=True))

    def enqueued() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT coalesce(pg_sequence_last_value('django_q_ormq_id_seq'::regclass), 0)")
            return cursor.fetchone()[0]

    cluster = spawn(["-m", "odal", "qcluster"], cluster_env)
    saved = settings.ODAL_KICK_SWEEP
    settings.ODAL_KICK_SWEEP = True
    try:
        time.sleep(STARTUP_SECONDS)
        before = enqueued()
        started = time.monotonic()

        def publish(part: list) -> None:
            try:
                for pk in part:
                    lifecycle.publish(pk, actor="bench")
            finally:
                connections.close_all()

        threads = [threading.Thread(target=publish, args=(ids[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
        time.sleep(2)  # kicks of the last commits
        tasks = enqueued() - before
    finally:
        settings.ODAL_KICK_SWEEP = saved
        stop([cluster])
        sim.close()
    return {"publishes": publishes, "tasks": tasks, "per_10000": tasks * 10_000 / publishes,
            "publishes_per_s": publishes / seconds, "seconds": seconds}  # fmt: skip


def run(spawn, stop, env: dict, *, registrations: int, slow_registrations: int, rate_registrations: int,
        publishes: int) -> dict:  # fmt: skip
    """Every figure of issue 16's drain part."""
    env = {**env, "ODAL_REGISTRY_TOKEN": "bench-token"}
    r: dict = {"registrations": registrations, "slow_registrations": slow_registrations}
    sim = Simulator(spawn, stop, env, "--latency-ms", str(LATENCY_MS))
    try:
        for p in (1, 2):
            print(f"measuring the drain, {p} process(es), {BENCH_CONCURRENCY} in flight each, "
                  f"{LATENCY_MS} ms latency, {registrations:,} registrations…", flush=True)  # fmt: skip
            r[f"drain_{p}"] = drain_run(spawn, stop, env, sim, registrations=registrations, processes=p,
                                        concurrency=BENCH_CONCURRENCY)  # fmt: skip
        for p in (1, 2):
            print(f"measuring the drain, {p} process(es), one request in flight each, "
                  f"{slow_registrations:,} registrations…", flush=True)  # fmt: skip
            r[f"drain_{p}_c1"] = drain_run(spawn, stop, env, sim, registrations=slow_registrations, processes=p,
                                           concurrency=1)  # fmt: skip
    finally:
        sim.close()
    for name, admits in (("rate", None), ("rate_429", LIMIT // 2)):
        print(f"measuring the rate the simulator sees, limit {LIMIT}/s, simulator admitting "
              f"{f'{admits}/s' if admits else 'all'}, {rate_registrations:,} registrations…", flush=True)  # fmt: skip
        limit = ["--rate-limit", f"{admits}/s"] if admits else []
        sim = Simulator(spawn, stop, env, "--latency-ms", str(LATENCY_MS), *limit)
        try:
            drain_run(spawn, stop, env, sim, registrations=rate_registrations, processes=2,
                      concurrency=BENCH_CONCURRENCY, ODAL_REGISTRY_RATE_PER_SECOND=str(LIMIT))  # fmt: skip
            r[name] = sim.stats()
        finally:
            sim.close()
    print(f"measuring django-q2 tasks enqueued over {publishes:,} publishes (odal qcluster)…", flush=True)
    r["kicks"] = kicks(spawn, stop, env, publishes)
    return r


def report(r: dict) -> tuple[list, list, str]:
    """Issue 16's drain rows, targets and section of docs/performance.md."""
    two, one_c1 = r["drain_2"], r["drain_1_c1"]
    rate, limited, k = r["rate"], r["rate_429"], r["kicks"]
    rows = [
        (f"registry drain, {LATENCY_MS} ms latency, 1 process, {BENCH_CONCURRENCY} in flight (register + check)",
         f"{r['drain_1']:,.0f} registrations/s"),
        (f"registry drain, {LATENCY_MS} ms latency, 2 processes, {BENCH_CONCURRENCY} in flight each",
         f"{two:,.0f} registrations/s"),
        (f"registry drain, {LATENCY_MS} ms latency, 1 process, 1 in flight", f"{one_c1:,.1f} registrations/s"),
        (f"registry drain, {LATENCY_MS} ms latency, 2 processes, 1 in flight each",
         f"{r['drain_2_c1']:,.1f} registrations/s"),
        ("2 processes concurrent / 1 process with 1 in flight", f"{two / one_c1:.1f}×"),
        (f"rate seen by the simulator, ODAL_REGISTRY_RATE_PER_SECOND={LIMIT}, most in any 10 s",
         f"{rate['maxRatePerSecond']:,.1f}/s ({rate['requests']:,} requests, {rate['refused']} × 429, "
         f"{rate['unheeded']} unheeded)"),
        (f"the same, the simulator admitting {LIMIT // 2}/s (429 past it)",
         f"{limited['maxRatePerSecond']:,.1f}/s ({limited['requests']:,} requests, {limited['refused']} × 429, "
         f"{limited['unheeded']} unheeded)"),
        (f"django-q2 tasks enqueued per 10,000 publishes ({k['publishes']:,} published at "
         f"{k['publishes_per_s']:,.0f}/s, one commit each, odal qcluster)",
         f"{k['per_10000']:,.0f} ({k['tasks']} in {k['seconds']:.0f} s)"),
    ]  # fmt: skip
    unheeded = rate["unheeded"] + limited["unheeded"]
    targets = [
        (f"drain: ≥ {TARGETS['two']} registrations/s with 2 processes at {LATENCY_MS} ms", two >= TARGETS["two"]),
        (f"drain: ≥ {TARGETS['ratio']}× one drain with one request in flight", two >= TARGETS["ratio"] * one_c1),
        (f"rate: ≤ {TARGETS['rate']}/s over any 10 s with a limit of {LIMIT}/s",
         rate["maxRatePerSecond"] <= TARGETS["rate"]),
        ("rate: no 429 unheeded", unheeded == 0 and limited["refused"] > 0),
        (f"kicks: ≤ {TARGETS['kicks']} django-q2 tasks per 10,000 publishes", k["per_10000"] <= TARGETS["kicks"]),
    ]  # fmt: skip
    doc = (
        "## The concurrent, rate-limited drain and debounced kicks (issue 16)\n\n"
        f"Drain rows: `odal registry drain --batch 100` processes against `odal registry simulate "
        f"--latency-ms {LATENCY_MS}` (each answer {LATENCY_MS} ms ± 20 %), ODAL_REGISTRY_CHECK_SECONDS=0 (a "
        "registration's check is due as soon as its register is written); a registration is two requests, "
        f"register and check. {r['registrations']:,} registrations per concurrent row "
        f"(ODAL_REGISTRY_CONCURRENCY={BENCH_CONCURRENCY}), {r['slow_registrations']:,} per row with one in "
        "flight; timed from the commit that makes them due (the processes already up) to the last registered.\n\n"
        f"Rate rows: two drain processes, ODAL_REGISTRY_RATE_PER_SECOND={LIMIT}, the simulator counting every "
        f"request that arrives (admitted or not); in the second it admits {LIMIT // 2} in any second and "
        "answers the rest 429 with Retry-After: 1, at once. A request is unheeded when it "
        "arrives while a Retry-After runs, more than 0.25 s after the 429 (requests already on their way may "
        "arrive that late).\n\n"
        "Kicks: passports published one commit each by two threads of the bench process, while `odal qcluster` "
        "(2 workers, ORM broker) drains and sweeps; the count is of rows inserted into django-q2's queue table "
        "(its id sequence), schedules included. Before issue 16 every publish enqueued its own drain task; "
        "now a burst enqueues one per worker kind, and a steady stream about one per kind every 10 s turn "
        "(the relays of the listening drain and sweep), so the figure falls as the publishing rate rises.\n"
    )
    return rows, targets, doc
