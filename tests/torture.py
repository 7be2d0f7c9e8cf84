"""The torture run (`make torture`; a short form runs inside `make test`).

Phase 1: several real `odal outbox sweep` processes deliver thousands of deliveries to a local
webhook server that at random answers fast, fails, or stalls past the claim hold, while this
driver SIGKILLs and restarts sweeps and replays dead rows.
Phase 2: `odal registry drain` processes work against the registry simulator with faults on
(lost replies, a slow task list read newest first), while the driver races abandon and
record-handle against them (and keeps killing drains).

A database-side history (triggers installed in the torture database only) records every UPDATE
of a delivery or registration. At the end the driver checks, and prints, that nothing was lost,
no late writer changed a settled row, every row's attempts equal the claims made on it (less the
claims given back unstarted) and stay within budget, every abandoned registration stayed
abandoned and is held by the registry under no request, and the audit trail has exactly
one entry per person's write that took a row. Exit 1 on any violation.

Usage: python tests/torture.py [--seconds 60] [--registry-seconds 40] [--events 1000]
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
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
HOLD = 1  # seconds: stalls of 2.5 s outlive it
MAX_ATTEMPTS = 3

HISTORY_SQL = """
CREATE TABLE IF NOT EXISTS torture_history (
    id bigserial PRIMARY KEY, tbl text, row_id uuid, at timestamptz DEFAULT clock_timestamp(),
    old_status text, new_status text, old_attempts int, new_attempts int,
    old_token uuid, new_token uuid, note text
);
CREATE OR REPLACE FUNCTION torture_record_delivery() RETURNS trigger AS $$
BEGIN
    INSERT INTO torture_history (tbl, row_id, old_status, new_status, old_attempts, new_attempts,
                                 old_token, new_token, note)
    VALUES (TG_TABLE_NAME, NEW.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts,
            OLD.claim_token, NEW.claim_token, right(NEW.last_error, 60));
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION torture_record_registration() RETURNS trigger AS $$
BEGIN
    INSERT INTO torture_history (tbl, row_id, old_status, new_status, old_attempts, new_attempts,
                                 old_token, new_token, note)
    VALUES (TG_TABLE_NAME, NEW.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts,
            OLD.claim_token, NEW.claim_token, left(NEW.note, 60));
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER torture_delivery AFTER UPDATE ON outbox_delivery
    FOR EACH ROW EXECUTE FUNCTION torture_record_delivery();
CREATE TRIGGER torture_registration AFTER UPDATE ON registry_registration
    FOR EACH ROW EXECUTE FUNCTION torture_record_registration();
"""


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


def webhook_server(rng: random.Random, stall: float):
    lock = threading.Lock()
    seen = Counter()
    first_attempts: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                roll = rng.random()
                first = self.headers.get("webhook-id") not in first_attempts
                first_attempts.add(self.headers.get("webhook-id"))
            # Only a first attempt stalls: its hold runs out, another sweep delivers the row, and
            # the stalled attempt then reports late (retries do not stall again).
            if first and roll < 0.10:
                seen["stalled past the hold"] += 1
                time.sleep(stall)
                status = 204
            elif roll < 0.40:
                seen["failed"] += 1
                status = 500
            else:
                seen["fast"] += 1
                status = 204
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


def phase_deliveries(args, env, rng, figures):
    from django.db import transaction

    from outbox.events import emit
    from outbox.models import Consumer, Delivery

    server, seen = webhook_server(rng, stall=HOLD + 2.0)
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    for name in ("site-builder", "billing", "deployer"):
        Consumer.objects.create(name=name, url=url, max_attempts=MAX_ATTEMPTS, timeout_seconds=10)
    for start in range(0, args.events, 250):
        with transaction.atomic():
            for i in range(start, min(args.events, start + 250)):
                emit("passport.published", {"dppId": f"torture-{i}"})
    created = Delivery.objects.count()
    sweeps = Workers("sweep", ["outbox", "sweep", "--batch", "5"], env, args.sweeps)
    replayed = 0
    deadline = time.monotonic() + args.seconds
    next_kill = next_replay = time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_kill:
            sweeps.kill_one(rng)
            next_kill = now + rng.uniform(1.0, 3.0)
        if now >= next_replay:
            dead = list(Delivery.objects.filter(status="dead").values_list("pk", flat=True)[:15])
            if dead:
                replayed += Delivery.objects.filter(pk__in=dead).replay(
                    actor="torture:driver", reason="torture replay"
                )
            next_replay = now + rng.uniform(1.0, 3.0)
        time.sleep(0.1)
    # Let the survivors settle what is due (still replaying dead rows, no more kills), then stop.
    settle = time.monotonic() + args.settle
    while time.monotonic() < settle and Delivery.objects.filter(status__in=["pending", "dead"]).exists():
        dead = list(Delivery.objects.filter(status="dead").values_list("pk", flat=True)[:15])
        if dead:
            replayed += Delivery.objects.filter(pk__in=dead).replay(
                actor="torture:driver", reason="torture replay"
            )
        time.sleep(0.5)
    sweeps.stop()
    server.shutdown()
    figures.update(
        deliveries_created=created, sweep_processes=args.sweeps, sweep_kills=sweeps.kills, replayed=replayed,
        webhook_answers=dict(seen),
    )  # fmt: skip


# -- phase 2: registrations -------------------------------------------------------------------------


def phase_registry(args, env, rng, figures):
    from django.conf import settings

    from odal import lifecycle
    from odal.errors import Refused
    from odal.models import Passport
    from registry import service
    from registry.models import Registration
    from registry.simulator import make_server

    # A slow task list read newest first: a register whose reply is lost during an abandon's
    # lookup lands on a page the lookup has read already (the race abandon's guard closes).
    sim = make_server(port=0, token="torture", faults={"latency": 0.05, "refuse_upi_containing": "REFUSE",
                                                        "checks_until_registered": 3, "page_size": 20,
                                                        "task_list_newest_first": True,
                                                        "task_list_latency": 0.02})  # fmt: skip
    threading.Thread(target=sim.serve_forever, daemon=True).start()
    sim_url = f"http://127.0.0.1:{sim.server_address[1]}"
    settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN = sim_url, "torture"
    drain_env = {**env, "ODAL_REGISTRY_URL": sim_url, "ODAL_REGISTRY_TOKEN": "torture",
                 "ODAL_BACKOFF_BASE_SECONDS": "1", "ODAL_REGISTRY_CHECK_SECONDS": "0"}  # fmt: skip
    for i in range(args.passports):
        kind = "REFUSE" if i % 3 == 0 else "OK"
        passport = Passport.objects.create(
            upi=f"https://id.example.eu/01/1/21/{kind}-{i}", operator_id="OP-T"
        )
        lifecycle.publish(passport.pk, actor="torture:driver")
    drains = Workers("drain", ["registry", "drain", "--batch", "10"], drain_env, args.drains)
    outcomes = Counter()
    deadline = time.monotonic() + args.registry_seconds
    next_kill = time.monotonic()
    while time.monotonic() < deadline:
        if time.monotonic() >= next_kill:
            drains.kill_one(rng)
            next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
        roll = rng.random()
        if roll < 0.1:
            sim.state.faults.update(lost_reply=rng.randint(0, 2), register_5xx=rng.randint(0, 3))
        regs = list(Registration.objects.values_list("passport_id", "status"))
        pid, status = rng.choice(regs)
        try:
            if status == "submitted" and rng.random() < 0.3:
                service.record_handle(pid, handle=f"reg-hand-{rng.randrange(10**6)}", actor="torture:person",
                                      reason="read off the registry portal")  # fmt: skip
                outcomes["handle recorded"] += 1
            else:
                result = service.abandon(pid, actor="torture:person", reason="the registry keeps refusing it")
                outcomes["already abandoned" if result.already_abandoned else "abandoned"] += 1
        except Refused as exc:
            outcomes[f"refused {exc.code}"] += 1
        time.sleep(0.02)
    drains.stop()
    sim.shutdown()
    # What the registry holds, for the check that no abandoned registration is held there.
    figures["registry_holds"] = sorted(
        {r["upi"] for r in sim.state.requests.values() if r["status"] != "rejected"}
    )
    figures.update(
        registrations=Registration.objects.count(), drain_processes=args.drains, drain_kills=drains.kills,
        person_writes=dict(sorted(outcomes.items())),
    )  # fmt: skip


# -- the checks ---------------------------------------------------------------------------------------


def check(figures) -> list[str]:
    from django.db import connection
    from django.db.models import Count

    from odal.models import AuditEntry
    from outbox.models import Consumer, Delivery, DeliveryAttempt, Event
    from registry.models import Registration, RegistrationAttempt

    violations = []
    counts = dict(Delivery.objects.values_list("status").annotate(n=Count("pk")).order_by())
    figures["deliveries"] = {s: counts.get(s, 0) for s in ("delivered", "dead", "pending")}
    owed = Event.objects.count() * Consumer.objects.count()  # every consumer subscribes to everything here
    figures["deliveries_owed"] = owed
    if sum(figures["deliveries"].values()) != owed or sum(counts.values()) != owed:
        violations.append(f"deliveries lost: {owed} owed (events x consumers), found {counts}")

    with connection.cursor() as cursor:
        cursor.execute("SELECT tbl, row_id, old_status, new_status, old_attempts, new_attempts, old_token, "
                       "new_token, note FROM torture_history ORDER BY id")  # fmt: skip
        history = cursor.fetchall()
    figures["history_rows"] = len(history)

    # A settled delivery never changes again, except dead -> pending by a replay.
    claims = Counter()
    releases = Counter()  # claimed rows a pass never started, their attempt given back
    attempts_now = defaultdict(int)
    terminal = set()  # (row, token) of every write that ended an attempt
    dead_to_pending = 0
    for tbl, row, old_s, new_s, old_a, new_a, old_t, new_t, note in history:
        if tbl != "outbox_delivery":
            continue
        if old_s == "delivered":
            violations.append(f"delivery {row} changed after it was delivered ({old_s} -> {new_s})")
        if old_s == "dead":
            if new_s != "pending" or new_a != 0:
                violations.append(
                    f"dead delivery {row} changed other than by replay ({new_s}, attempts {new_a})"
                )
            dead_to_pending += 1
            attempts_now[row] = 0
            continue
        if new_a > MAX_ATTEMPTS:
            violations.append(f"delivery {row} ran past its budget: {new_a} attempts")
        if new_t is not None and new_t != old_t:  # a claim
            claims[row] += 1
            attempts_now[row] += 1
            if new_a != old_a + 1:
                violations.append(f"claim of {row} did not count exactly one attempt ({old_a} -> {new_a})")
        elif old_t is not None and new_t is None and new_a == old_a - 1:  # a release: never started
            releases[row] += 1
            attempts_now[row] -= 1
            if old_s != "pending" or new_s != "pending":
                violations.append(f"release of {row} changed its status ({old_s} -> {new_s})")
        elif (
            old_t is not None
            and new_t is None
            and not (note or "").endswith("never reported (its claim expired)")
        ):
            terminal.add((row, old_t))
    final = dict(Delivery.objects.values_list("pk", "attempts"))
    mismatched = [row for row, n in attempts_now.items() if final.get(row) != n]
    if mismatched:
        violations.append(f"{len(mismatched)} deliveries whose attempts differ from the claims made on them")
    log = list(DeliveryAttempt.objects.values_list("delivery_id", "claim_token", "late"))
    current = {(d, t) for d, t, late in log if not late}
    late = {(d, t) for d, t, late in log if late}
    if current != terminal:
        violations.append(
            f"attempt log and history disagree: {len(current - terminal)} logged writes not in history, "
            f"{len(terminal - current)} history writes not logged"
        )
    if late & terminal:
        violations.append(f"{len(late & terminal)} late writes changed a row")
    figures["claims"] = sum(claims.values())
    figures["claims_released_unstarted"] = sum(releases.values())
    figures["attempts_logged"] = len(log)
    figures["late_writes_refused"] = len(late)

    # Registrations: abandoned means the registry holds nothing for the passport.
    held = set(figures.pop("registry_holds", []))
    abandoned_upis = set(
        Registration.objects.filter(status="abandoned").values_list("passport__upi", flat=True)
    )
    figures["abandoned_while_the_registry_holds_it"] = len(abandoned_upis & held)
    for upi in sorted(abandoned_upis & held):
        violations.append(f"registration of {upi} abandoned while the registry holds a submission for it")

    # Registrations: abandoned stays abandoned; people's writes audited once each.
    for tbl, row, old_s, new_s, *_rest in history:
        if tbl == "registry_registration" and old_s == "abandoned":
            violations.append(f"abandoned registration {row} changed to {new_s}")
    abandoned_by_history = sum(1 for h in history if h[0] == "registry_registration" and h[3] == "abandoned"
                               and h[2] != "abandoned")  # fmt: skip
    handles_by_history = sum(1 for h in history if h[0] == "registry_registration" and h[2] == "submitted"
                             and h[3] == "registered" and (h[8] or "").startswith("handle recorded by"))  # fmt: skip
    audit = Counter(AuditEntry.objects.values_list("action", flat=True))
    people = figures.get("person_writes", {})
    expected = {
        "delivery_replayed": figures["replayed"],
        "registry_abandoned": people.get("abandoned", 0),
        "registry_handle_recorded": people.get("handle recorded", 0),
    }
    for action, n in expected.items():
        if audit.get(action, 0) != n:
            violations.append(
                f"audit trail has {audit.get(action, 0)} {action} entries for {n} writes that took"
            )
    if dead_to_pending != figures["replayed"]:
        violations.append(f"{dead_to_pending} dead -> pending changes for {figures['replayed']} replays")
    if abandoned_by_history != expected["registry_abandoned"]:
        violations.append(
            f"{abandoned_by_history} rows abandoned for {expected['registry_abandoned']} abandons"
        )
    if handles_by_history != expected["registry_handle_recorded"]:
        violations.append(
            f"{handles_by_history} handles in history for {expected['registry_handle_recorded']} recorded"
        )
    figures["registrations_by_status"] = dict(
        Registration.objects.values_list("status").annotate(n=Count("pk")).order_by()
    )
    figures["registry_late_writes_refused"] = RegistrationAttempt.objects.filter(late=True).count()
    figures["audit_entries"] = {k: audit[k] for k in expected}

    # The counts the writes keep (odal.tally) must equal the rows they count, after every kill
    # and every refused late write (nothing is purged here, and no delivered row moves again).
    from odal import tally

    kept = tally.totals("outbox.delivered", "outbox.attempts", "registry.status")
    rows = {
        "outbox.delivered": {
            str(c): n
            for c, n in Delivery.objects.filter(status="delivered")
            .values_list("consumer_id")
            .annotate(n=Count("pk"))
            .order_by()
        },
        "outbox.attempts": {
            outcome + (":late" if late else ""): n
            for outcome, late, n in DeliveryAttempt.objects.values_list("outcome", "late")
            .annotate(n=Count("pk"))
            .order_by()
        },
        "registry.status": dict(figures["registrations_by_status"]),
    }
    for metric, expected_rows in rows.items():
        found = {k: n for k, n in kept[metric].items() if n}
        if found != expected_rows:
            violations.append(f"tally {metric} says {found}, the rows say {expected_rows}")
    figures["tally_checked"] = sorted(rows)
    figures["violations"] = len(violations)
    return violations


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
    parser.add_argument("--database", default="odal_torture")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("torture needs DATABASE_URL naming PostgreSQL (run it through make torture)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    recreate_database(args.database)
    url = database_url(args.database)
    env = {**os.environ, "DATABASE_URL": url, "ODAL_CLAIM_HOLD_SECONDS": str(HOLD), "ODAL_BACKOFF_BASE_SECONDS": "0",
           "ODAL_KICK_SWEEP": "false", "ODAL_LOG_LEVEL": "ERROR"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(HISTORY_SQL)
    figures = {"seed": seed}
    started = time.monotonic()
    try:
        phase_deliveries(args, env, rng, figures)
        phase_registry(args, env, rng, figures)
        violations = check(figures)
    finally:
        connection.close()
    figures["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures, indent=2, default=str))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)  # var/ is not there in a fresh clone
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    for line in violations:
        print(f"VIOLATION: {line}")
    print(f"torture: {len(violations)} violations (seed {seed})")
    if not violations:
        drop_database(args.database)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
