"""The torture run (`make torture`; a short form runs inside `make test`).

Phase 1: several real `odal outbox sweep` processes deliver thousands of deliveries to a local
webhook server that at random answers fast, fails, or stalls past the claim hold, while this
driver SIGKILLs and restarts sweeps and replays dead rows.
Phase 2: `odal registry drain` processes work against the registry simulator with faults on
(lost replies, a slow task list read newest first), while the driver races abandon,
record-handle, suspend and publish-again against them (and keeps killing drains). With
--late-landings (tests/invariants.py: LATE_LANDINGS says whether by default), the first register
of some passports reaches the registry seconds after the drain gave up on it, and now and then a
register is answered by the gateway in front of the registry (Cloudflare's 520 or 524, an HTML
500: registry.simulator.gateway_faults) and reaches the registry seconds later all the same.

What the run must show it makes happen (tests/invariants.py, and the STRAGGLER below): a
delivery that dies and is replayed, a late write refused, a registration abandoned, and with late
landings an abandon and a suspend made while such a register is on its way, and a register a
gateway answered. Each phase goes on
past its time (killing nothing, at most SCENARIO_GRACE seconds) until they happened; a run that
still misses one says NOT EXERCISED and fails.

A database-side history (tests/invariants.py: triggers installed in the torture database only)
records every UPDATE of a delivery or registration. At the end the driver checks (the same
invariants.check as make partition), and prints, that nothing was lost,
no late writer changed a settled row, every row's attempts equal the claims made on it (less the
claims given back unstarted) and stay within budget, every abandoned registration stayed
abandoned and is held by the registry under no request, no registration ended abandoned or
suspended while the registry holds an unrevoked submission for it (once every late register
landed; without late landings this is only reported), and the audit trail has exactly
one entry per person's write that took a row. Exit 1 on any violation.

Usage: python tests/torture.py [--seconds 60] [--registry-seconds 40] [--events 1000] [--no-late-landings]
(DATABASE_URL must name a PostgreSQL server; tests/pg.py finds one.)
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse, urlunparse

try:  # run as `python tests/torture.py`
    import invariants
except ModuleNotFoundError:  # imported as tests.torture (bench/run.py takes its database helpers)
    from tests import invariants

ROOT = Path(__file__).resolve().parent.parent
HOLD = 1  # seconds: stalls outlive it
STRAGGLER = "straggler"  # in an event's payload: its deliveries' first attempts all stall...
STRAGGLER_STALL = 8.0  # ...until another attempt delivered their row, or this long (consumers: 10 s)
REGISTRY_HOLD = 2  # seconds: the drains' hold, past the registry's timeout (invariants.REGISTRY_TIMEOUT)
MAX_ATTEMPTS = 3


def database_url(name: str) -> str:
    base = urlparse(os.environ["DATABASE_URL"])
    return urlunparse(base._replace(path=f"/{name}"))


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Workers:
    """Worker processes of one kind, killed and restarted at random."""

    def __init__(self, name: str, argv: list[str], env: dict, count: int):
        self.name, self.argv, self.env = name, argv, env
        self.procs = [self.start() for _ in range(count)]
        self.kills = 0

    def start(self):
        return subprocess.Popen(
            [sys.executable, "-m", "odal", *self.argv], env=self.env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.procs))
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        self.kills += 1
        self.procs[i] = self.start()

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def webhook_server(rng: random.Random, stall: float, straggler_stall: float):
    lock = threading.Lock()
    seen = Counter()
    first_attempts: set[str] = set()
    delivered: dict[str, threading.Event] = {}  # webhook-id: answered 2xx by an attempt that did not stall
    doomed = invariants.Doomed(MAX_ATTEMPTS)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            webhook_id = self.headers.get("webhook-id")
            with lock:
                roll = rng.random()
                first = webhook_id not in first_attempts
                first_attempts.add(webhook_id)
                answered = delivered.setdefault(webhook_id, threading.Event())
            # Only a first attempt stalls (a tenth of them, and every one of a STRAGGLER event's
            # deliveries): its hold runs out, another attempt delivers the row, and only then (or
            # after `stall` seconds, `straggler_stall` for a straggler) is the stalled one
            # answered, so it reports late. Retries do not stall again.
            if doomed.fails(webhook_id, body):
                seen["failed (doomed until replayed)"] += 1
                status = 500
            elif first and invariants.payload_says(body, STRAGGLER):
                seen["straggler: stalled until another attempt delivered it"] += 1
                answered.wait(straggler_stall)
                status = 204
            elif first and roll < 0.10:
                seen["stalled past the hold"] += 1
                answered.wait(stall)
                status = 204
            elif roll < 0.40:
                seen["failed"] += 1
                status = 500
            else:
                seen["fast"] += 1
                status = 204
                answered.set()
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


# -- phase 1: deliveries ----------------------------------------------------------------------------


def emit_in_waves(numbers: range, deadline: float, size: int = 5) -> None:
    """Emit events `numbers`, `size` at a time, each wave once every delivery made so far has been
    attempted (the rest at once at `deadline`)."""
    from django.db import connection, transaction

    from outbox.events import emit
    from outbox.models import Delivery

    try:
        for start in range(numbers.start, numbers.stop, size):
            while Delivery.objects.filter(attempts=0).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            with transaction.atomic():
                for i in range(start, min(numbers.stop, start + size)):
                    emit("passport.published", {"dppId": f"torture-{i}"})
            time.sleep(0.3)
    finally:
        connection.close()


def phase_deliveries(args, env, rng, figures):
    from django.db import transaction

    from outbox.events import emit
    from outbox.models import Consumer, Delivery, DeliveryAttempt

    server, seen = webhook_server(rng, stall=HOLD + 2.0, straggler_stall=STRAGGLER_STALL)
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    for name in ("site-builder", "billing", "deployer"):
        Consumer.objects.create(name=name, url=url, max_attempts=MAX_ATTEMPTS, timeout_seconds=10)
    # Half the events at once: a backlog the sweeps claim from together. A first attempt that
    # stalls in it is not reported late: its row, due again after the hold, waits behind the
    # backlog (claims take the oldest due rows first) until the stalled attempt has finished.
    # The other half comes in waves once the backlog is gone, so that rows whose first attempt
    # stalls are claimed again while it stalls and it reports late (a handful of late writes in
    # the short form, not 0 to 3 depending on how fast the machine drains the backlog).
    burst = args.events // 2
    invariants.Doomed.emit()  # dies for sure: the run replays it
    for start in range(0, burst, 250):
        with transaction.atomic():
            for i in range(start, min(burst, start + 250)):
                emit("passport.published", {"dppId": f"torture-{i}"})
    waves = threading.Thread(
        target=emit_in_waves, args=(range(burst, args.events), time.monotonic() + args.seconds)
    )
    sweeps = Workers("sweep", ["outbox", "sweep", "--batch", "5"], env, args.sweeps)
    waves.start()
    replayed = 0
    deadline = time.monotonic() + args.seconds
    next_kill = next_replay = time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_kill:
            sweeps.kill_one(rng)
            next_kill = now + rng.uniform(1.0, 3.0)
        if now >= next_replay:
            replayed += invariants.replay_dead(actor="torture:driver", reason="torture replay")
            next_replay = now + rng.uniform(1.0, 3.0)
        time.sleep(0.1)
    waves.join()
    created = Delivery.objects.count()
    # Let the survivors settle what is due (still replaying dead rows, no more kills), then stop;
    # not before what the run must show happened (at most SCENARIO_GRACE seconds more): the doomed
    # deliveries dead and replayed, and a late write refused. A machine so busy that no stalled
    # attempt's row was claimed again in time (or each stalled sweep was killed) had none: then,
    # once nothing else is due, a STRAGGLER event, whose first attempts are answered only once
    # another attempt delivered their row.
    settle = time.monotonic() + args.settle
    grace = time.monotonic() + invariants.SCENARIO_GRACE
    stragglers = 0
    next_straggler = time.monotonic()
    while (
        time.monotonic() < settle and Delivery.objects.filter(status__in=["pending", "dead"]).exists()
    ) or (not (replayed and DeliveryAttempt.objects.filter(late=True).exists()) and time.monotonic() < grace):
        replayed += invariants.replay_dead(actor="torture:driver", reason="torture replay")
        if (
            time.monotonic() >= next_straggler
            and not DeliveryAttempt.objects.filter(late=True).exists()
            and not Delivery.objects.due().exists()
        ):
            with transaction.atomic():
                emit("passport.published", {"dppId": f"straggler-{stragglers}", STRAGGLER: True})
            stragglers += 1
            next_straggler = time.monotonic() + STRAGGLER_STALL + HOLD
        time.sleep(0.5)
    sweeps.stop()
    server.shutdown()
    figures.update(
        deliveries_created=created, sweep_processes=args.sweeps, sweep_kills=sweeps.kills, replayed=replayed,
        webhook_answers=dict(seen), straggler_events=stragglers,
    )  # fmt: skip


# -- phase 2: registrations -------------------------------------------------------------------------


def phase_registry(args, env, rng, figures):
    from django.conf import settings

    from odal.core.models import Passport
    from odal.surfaces import lifecycle
    from registry.models import Registration
    from registry.simulator import gateway_faults, make_server

    late = args.late_landings
    sim = make_server(port=0, token="torture", faults=invariants.simulator_faults(late_landings=late))
    threading.Thread(target=sim.serve_forever, daemon=True).start()
    sim_url = f"http://127.0.0.1:{sim.server_address[1]}"
    settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN = sim_url, "torture"
    # The registry's timeout (invariants.REGISTRY_ENV, in env) below the drains' hold, as in production.
    drain_env = {**env, "ODAL_REGISTRY_URL": sim_url, "ODAL_REGISTRY_TOKEN": "torture",
                 "ODAL_BACKOFF_BASE_SECONDS": "1", "ODAL_REGISTRY_CHECK_SECONDS": "0",
                 "ODAL_CLAIM_HOLD_SECONDS": str(REGISTRY_HOLD)}  # fmt: skip
    for i in range(args.passports):
        passport = Passport.objects.create(upi=invariants.run_upi(i, late_landings=late), operator_id="OP-T")
        lifecycle.publish(passport.pk, actor="torture:driver")
    outcomes = Counter()
    scenarios = invariants.Scenarios(sim, outcomes, actor="torture:person", late_landings=late)
    drains = Workers("drain", ["registry", "drain", "--batch", "10"], drain_env, args.drains)
    deadline = time.monotonic() + args.registry_seconds
    next_kill = time.monotonic()
    while time.monotonic() < deadline:
        if time.monotonic() >= next_kill:
            drains.kill_one(rng)
            next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
        roll = rng.random()
        if roll < 0.1:
            sim.state.faults.update(lost_reply=rng.randint(0, 2), register_5xx=rng.randint(0, 3))
            if late:  # the next registers answered by a gateway (520, 524, an HTML 500), landing later
                sim.state.faults.update(gateway_faults(rng))
        elif roll < 0.15:
            invariants.person_lifecycle_write(rng, outcomes, actor="torture:person")
        invariants.person_registry_write(rng, outcomes, actor="torture:person")
        scenarios.tick()
        time.sleep(0.02)
    # No more kills, faults or people. What the run must show and has not yet (a machine so busy
    # that killed drains were still starting when killed again) is made to happen now, then the
    # drains settle what they still owe (a late register on its way, a deactivation, a submission
    # being checked) and stop.
    sim.state.faults.update(lost_reply=0, register_5xx=0, late_landing=0, gateway_answer="")
    past = time.monotonic()
    while not scenarios.done() and time.monotonic() < past + invariants.SCENARIO_GRACE:
        scenarios.tick()
        time.sleep(0.02)
    figures["registry_seconds_past_their_time"] = round(time.monotonic() - past, 1)
    settle = time.monotonic() + args.settle + invariants.SETTLING
    while time.monotonic() < settle and not invariants.registry_settled(sim):
        time.sleep(0.2)
    drains.stop()
    sim.state.land_pending()  # what is still on its way lands now: nothing else happens any more
    sim.shutdown()
    # What the registry holds, for the checks that no abandoned (or suspended) registration is held there.
    figures["registry_holds"] = invariants.registry_holds(sim)
    figures["registry_unrevoked"] = invariants.registry_unrevoked(sim)
    figures.update(
        registrations=Registration.objects.count(), drain_processes=args.drains, drain_kills=drains.kills,
        person_writes=dict(sorted(outcomes.items())), late_landings=late, scenarios=scenarios.figures(),
        registry_settled=invariants.registry_settled(sim),
        gateway_answers_landing_later=dict(sim.state.gateway_answered),
    )  # fmt: skip
    shortfalls = scenarios.shortfalls()
    if late and not sim.state.gateway_answered:
        shortfalls.append(
            "a register answered by a gateway (520, 524, an HTML 500) and landing later: none was"
        )
    return shortfalls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--registry-seconds", type=float, default=40)
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--events", type=int, default=1000, help="events; three consumers each")
    parser.add_argument("--passports", type=int, default=150)
    parser.add_argument("--sweeps", type=int, default=4)
    parser.add_argument("--drains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--database",
        default=f"{os.environ['ODAL_TEST_DATABASE']}_torture"
        if os.environ.get("ODAL_TEST_DATABASE")
        else "odal_torture",
        help="the run's own database, made afresh (default: ODAL_TEST_DATABASE's name + _torture, else odal_torture)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--late-landings", action=argparse.BooleanOptionalAction, default=invariants.LATE_LANDINGS,
        help="registers that reach the registry after the drain gave up on them, and the invariant that no "
        "registration ends abandoned or suspended while the registry holds it enforced (without: reported)",
    )  # fmt: skip
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("torture needs DATABASE_URL naming PostgreSQL (run it through make torture)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    recreate_database(args.database)
    url = database_url(args.database)
    env = {**os.environ, "DATABASE_URL": url, "ODAL_CLAIM_HOLD_SECONDS": str(HOLD), "ODAL_BACKOFF_BASE_SECONDS": "0",
           "ODAL_KICK_SWEEP": "false", "ODAL_LOG_LEVEL": "ERROR", **invariants.REGISTRY_ENV}  # fmt: skip
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    invariants.install_history()
    figures = {"seed": seed}
    started = time.monotonic()
    try:
        phase_deliveries(args, env, rng, figures)
        shortfalls = phase_registry(args, env, rng, figures)
        violations = invariants.check(
            figures, max_attempts=MAX_ATTEMPTS, withdrawn_enforced=args.late_landings
        )
    finally:
        connection.close()
    if not figures["replayed"]:
        shortfalls.append("a dead delivery replayed: none was")
    if not figures["late_writes_refused"]:
        shortfalls.append("a late delivery write refused: none was")
    figures["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures, indent=2, default=str))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)  # var/ is not there in a fresh clone
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    for line in violations.unenforced:
        print(f"NOT ENFORCED (--no-late-landings): {line}")
    for line in violations:
        print(f"VIOLATION: {line}")
    for line in shortfalls:
        print(f"NOT EXERCISED: {line}")
    print(f"torture: {len(violations)} violations (seed {seed})")
    if not violations and not shortfalls:
        drop_database(args.database)
    return 1 if violations or shortfalls else 0


if __name__ == "__main__":
    sys.exit(main())
