"""The partition run (`make partition`; a short form runs inside `make test` when it can).

Several worker hosts, each a Linux network namespace (odp-h1, odp-h2, …) with two links to this
machine, each a veth pair of its own /30: a database link (10.213.N.0/30) to a throwaway
PostgreSQL, and a service link (10.213.N.4/30) to a throwaway Redis (the django-q2 broker), the
webhook receiver and the registry simulator. Those listen on 10.213.0.2 (the database) and
10.213.0.1 (the services), addresses of a bridge with no ports (odp-core) that each namespace
reaches through its own link, so every host uses the same DATABASE_URL, broker and consumer
URL, and cutting one host's link (setting the veth down) cuts that host alone. A namespace has
routes to its two /30s and those two addresses, and nothing else: the run sends nothing beyond
loopback and the addresses it made.

Every host runs `odal qcluster` (Redis broker) and `odal outbox sweep`. Meanwhile this driver,
with a seed:
- cuts one host's database link or service link at a time, waiting first until that host has
  a webhook request in flight (mid-attempt), for longer than the claim hold (every few cuts a
  long one, past the keepalive time, during which the host's backends must end), then heals it;
- SIGKILLs a host's sweep, its whole django-q2 cluster, or one process of a cluster (worker,
  monitor or pusher, which the cluster replaces), and restarts what it killed; a process that
  exits on its own is restarted too (as a supervisor would) and counted;
- publishes passports, suspends and publishes them again, replays dead deliveries, abandons
  registrations and records handles, as people would;
- makes happen what it must show (tests/invariants.py's Scenarios): a delivery that dies and is
  replayed, a registration abandoned, and with --late-landings (invariants.LATE_LANDINGS says
  whether by default; the first register of some passports then reaches the registry seconds
  after its drain gave up on it, and now and then the gateway in front of the registry answers a
  register itself, 520, 524 or an HTML 500, while the request lands later) an abandon and a
  suspend made while such a register is on its way; it goes on (at most SCENARIO_GRACE seconds)
  until they happened.
Then it heals everything, lets the hosts settle, stops them and checks the torture run's
invariants (tests/invariants.py) and its own: the backends of a host cut off for long ended.
Prints the figures, every invariant's result and `partition: N violations (seed S)`; exit 1
on any violation (or when the run made fewer partitions or kills than asked for, or missed a
scenario).

Needs root, `ip netns`, PostgreSQL's initdb/pg_ctl (run as the postgres user) and
redis-server. One run at a time on a machine (a lock file); leftovers of a killed run (names
odp-…, folders /tmp/odal_partition-…) are removed at the start.

Usage: python tests/partition.py [--hosts 3] [--seconds 240] [--settle 30] [--seed N] [--no-late-landings]
"""

import argparse
import fcntl
import glob
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as `python tests/partition.py`: odal and tests.* importable

from tests import invariants  # noqa: E402
from tests.pg import find_binary, free_port  # noqa: E402

HOLD = 2  # seconds of a claim's hold; every cut outlasts it
MAX_ATTEMPTS = 3
# odal.settings gives a dead peer up after 11 s (keepalives: idle 5 s, then 3 probes 2 s apart;
# or 10 s of data unacknowledged): a long cut outlasts that, so a cut-off host's backends must end.
LONG_CUT = 16.0
RESTART_SECONDS = 1.0  # a supervisor's pause before it starts again a process that ended
PREFIX = "odp-"  # every namespace and link of the run
FOLDER_PREFIX = "odal_partition-"  # its folders under the temporary directory
LOCK_FILE = Path(tempfile.gettempdir()) / "odal_partition.lock"
SERVICE_ADDR = "10.213.0.1"  # Redis, the webhook receiver, the registry simulator
DATABASE_ADDR = "10.213.0.2"  # PostgreSQL
NET = "10.213."
DATABASE = "odal_partition"
TOKEN = "partition"


class Refusal(Exception):
    """The run cannot start here; the sentence says why."""


def ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


# -- the network -------------------------------------------------------------------------------------


class Network:
    """The hosts' namespaces and links, the bridge holding the two service addresses."""

    LINKS = ("database", "service")

    def __init__(self, hosts: int):
        self.hosts = list(range(1, hosts + 1))

    @staticmethod
    def namespace(host: int) -> str:
        return f"{PREFIX}h{host}"

    @staticmethod
    def veth(host: int, link: str) -> str:  # the veth's end on this machine's side
        return f"{PREFIX}h{host}-{'db' if link == 'database' else 'svc'}"

    @staticmethod
    def client_addr(host: int, link: str) -> str:  # the host's own address on that link
        return f"{NET}{host}.{2 if link == 'database' else 6}"

    def build(self) -> None:
        ip("link", "add", f"{PREFIX}core", "type", "bridge")
        ip("addr", "add", f"{SERVICE_ADDR}/32", "dev", f"{PREFIX}core")
        ip("addr", "add", f"{DATABASE_ADDR}/32", "dev", f"{PREFIX}core")
        ip("link", "set", f"{PREFIX}core", "up")
        for host in self.hosts:
            ns = self.namespace(host)
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            for link, first, inside, target in (("database", 1, "db0", DATABASE_ADDR),
                                                ("service", 5, "svc0", SERVICE_ADDR)):  # fmt: skip
                outside = self.veth(host, link)
                ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns)
                ip("addr", "add", f"{NET}{host}.{first}/30", "dev", outside)
                ip("link", "set", outside, "up")
                ip("-n", ns, "addr", "add", f"{NET}{host}.{first + 1}/30", "dev", inside)
                ip("-n", ns, "link", "set", inside, "up")
                ip("-n", ns, "route", "add", f"{target}/32", "via", f"{NET}{host}.{first}")

    def cut(self, host: int, link: str) -> None:
        ip("link", "set", self.veth(host, link), "down")

    def heal(self, host: int, link: str) -> None:
        ip("link", "set", self.veth(host, link), "up")

    def heal_all(self) -> None:
        for host in self.hosts:
            for link in self.LINKS:
                ip("link", "set", self.veth(host, link), "up", check=False)


def remove_leftovers() -> list[str]:
    """Everything of this run's kind that is still there (a killed earlier run's, or ours at the
    end): processes in odp- namespaces, the namespaces, odp- links, throwaway PostgreSQL and Redis
    of /tmp/odal_partition-… folders, the folders. Only run while holding the lock."""
    removed = []
    for line in ip("netns", "list", check=False).splitlines():
        ns = line.split()[0] if line.strip() else ""
        if not ns.startswith(PREFIX):
            continue
        for pid in ip("netns", "pids", ns, check=False).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        ip("netns", "del", ns, check=False)
        removed.append(f"namespace {ns}")
    for line in ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if name.startswith(PREFIX):
            ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), FOLDER_PREFIX + "*")):
        if os.path.exists(os.path.join(folder, "data", "postmaster.pid")):
            Postgres(Path(folder)).stop(mode="immediate")
            removed.append(f"PostgreSQL in {folder}")
        redis_pid = Path(folder, "redis.pid")
        if redis_pid.exists():
            try:
                pid = int(redis_pid.read_text().strip())
                if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
                    removed.append(f"redis-server {pid}")
            except (OSError, ValueError):
                pass
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def refuse_if_taken() -> None:
    """10.213.0.0/16 must be this run's alone."""
    taken = [
        line.strip()
        for line in (ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")).splitlines()
        if NET in line
    ]
    if taken:
        raise Refusal(f"{NET}0.0/16 is in use on this machine ({taken[0]}); the partition run needs it")


# -- the servers ---------------------------------------------------------------------------------------


class Postgres:
    """A throwaway cluster in `folder`/data, run as the postgres user (PostgreSQL refuses root)."""

    def __init__(self, folder: Path):
        self.folder, self.data = folder, folder / "data"
        self.initdb, self.pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = None

    def start(self) -> int:
        shutil.chown(self.folder, "postgres")
        subprocess.run([*self.as_user, self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {NET}0.0/16 trust\n")
        self.port = free_port()
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1,{DATABASE_ADDR} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")  # fmt: skip
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-o", options,
                        "-l", str(self.folder / "postgres.log"), "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        return self.port

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def start_redis(folder: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", SERVICE_ADDR, "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--dir", str(folder),
         "--pidfile", str(folder / "redis.pid"), "--logfile", str(folder / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not answer within 10 s")


class Receiver:
    """The webhook consumers' endpoint, on the service address: answers fast (after a little
    latency), fails with 500, or (on a first attempt only) stalls past the claim hold. Knows each
    host's requests in flight by the address they come from, so a cut can wait for one."""

    def __init__(self, rng: random.Random):
        self.lock = threading.Lock()
        self.in_flight = Counter()  # host -> requests being answered
        self.by_host = Counter()
        self.seen = Counter()
        self.first_attempts: set = set()
        self.doomed = invariants.Doomed(MAX_ATTEMPTS)
        self.armed = False  # the next request is held open until released (Partitions' first cut)
        self.released = threading.Event()
        hosts = {Network.client_addr(h, "service"): h for h in range(1, 10)}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                host = hosts.get(self.client_address[0], 0)
                with receiver.lock:
                    receiver.in_flight[host] += 1
                    receiver.by_host[f"h{host}"] += 1
                    roll, latency = rng.random(), rng.uniform(0.02, 0.2)
                    first = self.headers.get("webhook-id") not in receiver.first_attempts
                    receiver.first_attempts.add(self.headers.get("webhook-id"))
                    held, receiver.armed = receiver.armed, False
                try:
                    if held:  # a cut is on its way to this host: the request is in flight when it lands
                        receiver.released.wait(HOLD + 4.0)
                    if receiver.doomed.fails(self.headers.get("webhook-id"), body):
                        receiver.seen["failed (doomed until replayed)"] += 1
                        status = 500
                    elif first and roll < 0.10:
                        receiver.seen["stalled past the hold"] += 1
                        time.sleep(HOLD + 1.5)
                        status = 204
                    elif roll < 0.35:
                        receiver.seen["failed"] += 1
                        status = 500
                    else:
                        receiver.seen["fast"] += 1
                        time.sleep(latency)
                        status = 204
                finally:
                    with receiver.lock:
                        receiver.in_flight[host] -= 1
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a host cut off or killed mid-request is what this run does

        self.server = Server((SERVICE_ADDR, 0), Handler)
        self.url = f"http://{SERVICE_ADDR}:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True).start()

    def busy(self, host: int) -> bool:
        with self.lock:
            return self.in_flight[host] > 0

    def arm(self) -> None:
        """Hold the next request open until release(): whichever host sends it is mid-attempt
        for as long as a cut needs to land."""
        with self.lock:
            self.released.clear()
            self.armed = True

    def busy_host(self) -> int | None:
        with self.lock:
            return next((host for host, n in self.in_flight.items() if n > 0 and host), None)

    def release(self) -> None:
        with self.lock:
            self.armed = False
        self.released.set()


# -- the hosts' processes ------------------------------------------------------------------------------


class HostProcess:
    """One odal process of one host, in the host's namespace and a session of its own (so a
    kill takes its children with it). Its output goes to a log file of the run."""

    def __init__(self, host: int, kind: str, argv: list[str], env: dict, folder: Path):
        self.host, self.kind, self.argv, self.env = host, kind, argv, env
        self.log_path = folder / f"h{host}-{kind}.log"
        self.proc = None
        self.log_offset = 0
        self.start()

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", Network.namespace(self.host), sys.executable, "-m", "odal", *self.argv],
                env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def children(self) -> list[int]:
        """The cluster's own processes (its sentinel's children: workers, monitor, pusher)."""
        by_parent: dict[int, list[int]] = {}
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            by_parent.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        return [
            grandchild
            for child in by_parent.get(self.proc.pid, [])
            for grandchild in by_parent.get(child, [])
        ]

    def why_it_ended(self) -> str:
        """The last exception it wrote (else its last line), shortened."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                lines = [line.strip() for line in log.read().decode(errors="replace").splitlines()]
        except OSError:
            return "no log"
        errors = [line for line in lines if line.split(":")[0].endswith(("Error", "Exception"))]
        return ((errors or [line for line in lines if line] or ["no output"])[-1])[:160]

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


class Hosts:
    """Every host's qcluster and sweep; kills at random and restarts whatever ended."""

    def __init__(self, network: Network, env: dict, folder: Path):
        self.procs = []
        for host in network.hosts:
            self.procs.append(HostProcess(host, "qcluster", ["qcluster"], env, folder))
            self.procs.append(HostProcess(host, "sweep", ["outbox", "sweep", "--batch", "20"], env, folder))
        self.kills = Counter()
        self.exits = Counter()
        self.exit_reasons = Counter()
        self.ended_at: dict[HostProcess, float] = {}
        self.lock = threading.Lock()

    def kill_one(self, rng: random.Random) -> None:
        roll = rng.random()
        with self.lock:
            if roll < 0.25:
                clusters = [p for p in self.procs if p.kind == "qcluster" and p.proc.poll() is None]
                children = [(p, c) for p in clusters for c in p.children()]
                if children:
                    _, pid = rng.choice(children)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.kills["django-q2 process of a cluster (it starts another)"] += 1
                    except ProcessLookupError:
                        pass
                    return
            kind = "qcluster" if roll < 0.55 else "sweep"
            alive = [p for p in self.procs if p.kind == kind and p.proc.poll() is None]
            if not alive:
                return
            victim = rng.choice(alive)
            victim.kill()
            self.kills[f"{kind} (with its children)" if kind == "qcluster" else kind] += 1
            victim.start()

    def restart_the_ended(self, pause: float = RESTART_SECONDS) -> None:
        """A supervisor's work: a process that ended on its own is counted, and started again
        `pause` seconds later."""
        with self.lock:
            for p in self.procs:
                if p.proc.poll() is None:
                    continue
                if p not in self.ended_at:
                    self.ended_at[p] = time.monotonic()
                    self.exits[p.kind] += 1
                    self.exit_reasons[f"{p.kind}: {p.why_it_ended()}"] += 1
                if time.monotonic() - self.ended_at[p] >= pause:
                    del self.ended_at[p]
                    p.start()

    def stop(self, seconds: float = 5) -> Counter:
        """SIGTERM every process; SIGKILL what has not ended after `seconds`. Returns how many
        of each kind needed the SIGKILL."""
        killed = Counter()
        with self.lock:
            for p in self.procs:
                p.stop()
            deadline = time.monotonic() + seconds
            for p in self.procs:
                try:
                    p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    killed[p.kind] += 1
                p.kill()  # its children too
        return killed


# -- the driver's threads --------------------------------------------------------------------------------


class Partitions(threading.Thread):
    """One cut at a time: a host, a link, wait until the host is mid-attempt, cut for longer
    than the hold (every `long_every`-th cut LONG_CUT seconds), heal, pause, again."""

    def __init__(self, network: Network, receiver: Receiver, rng: random.Random, stop: threading.Event,
                 long_every: int):  # fmt: skip
        super().__init__(daemon=True)
        self.network, self.receiver, self.rng, self.halt = network, receiver, rng, stop
        self.long_every = long_every
        self.cuts = Counter()
        self.mid_attempt = 0
        self.long_cuts = []  # per long database cut: how its host's backends ended
        self.error = None

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.halt.wait(self.rng.uniform(0.5, 2.0)):
                self.one_cut()
        except Exception as exc:  # reported by the driver; the run then fails
            self.error = exc
        finally:
            connection.close()

    def one_cut(self) -> None:
        host, link = self.rng.choice(self.network.hosts), self.rng.choice(Network.LINKS)
        n = sum(self.cuts.values()) + 1
        long = self.long_every and n % self.long_every == 0
        seconds = LONG_CUT if long else self.rng.uniform(HOLD + 1.0, HOLD + 4.0)
        if not self.mid_attempt:
            # Until one cut has landed mid-attempt, the receiver holds the next request open and
            # the cut goes to the host that sent it: the run makes the scenario happen, whatever
            # its seed and the machine's speed.
            self.receiver.arm()
            while (busy := self.receiver.busy_host()) is None and not self.halt.is_set():
                time.sleep(0.02)
            host = busy or host
        else:
            armed = time.monotonic() + 3.0
            while not self.receiver.busy(host) and time.monotonic() < armed and not self.halt.is_set():
                time.sleep(0.02)
        if self.halt.is_set():
            self.receiver.release()
            return
        self.mid_attempt += self.receiver.busy(host)
        before = self.backends(host) if long and link == "database" else None
        self.network.cut(host, link)
        self.receiver.release()
        self.cuts[f"{link}{' (long)' if long else ''}"] += 1
        cut_at = time.monotonic()
        ended_after = None
        while time.monotonic() - cut_at < seconds:
            if before is not None and ended_after is None and self.backends(host)[0] == 0:
                ended_after = round(time.monotonic() - cut_at, 1)
            time.sleep(0.25)
        if before is not None:
            self.long_cuts.append({"host": host, "backends_when_cut": before[0],
                                   "in_a_transaction_when_cut": before[1], "seconds": seconds,
                                   "ended_after_seconds": ended_after})  # fmt: skip
        self.network.heal(host, link)

    def backends(self, host: int) -> tuple[int, int]:
        """The host's backends on the server, and how many of them are inside a transaction."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), count(*) FILTER (WHERE xact_start IS NOT NULL) FROM pg_stat_activity "
                "WHERE client_addr = %s",
                [Network.client_addr(host, "database")],
            )
            return cursor.fetchone()


class Killer(threading.Thread):
    """SIGKILLs a host's process every 1.5–4 s; every 0.3 s restarts what ended on its own."""

    def __init__(self, hosts: Hosts, rng: random.Random, stop: threading.Event):
        super().__init__(daemon=True)
        self.hosts, self.rng, self.halt = hosts, rng, stop
        self.error = None

    def run(self) -> None:
        try:
            next_kill = time.monotonic() + self.rng.uniform(1.5, 4.0)
            while not self.halt.wait(0.3):
                self.hosts.restart_the_ended()
                if time.monotonic() >= next_kill:
                    self.hosts.kill_one(self.rng)
                    next_kill = time.monotonic() + self.rng.uniform(1.5, 4.0)
        except Exception as exc:
            self.error = exc


def people(args, sim, rng: random.Random, figures: dict, until: float) -> "invariants.Scenarios":
    """What people do while the hosts work: publish passports, suspend and publish them again,
    replay dead deliveries, abandon registrations and record handles; the registry's faults come
    and go. Returns the scenarios they make happen as they go (make_happen finishes them)."""
    from odal.core.models import Passport
    from odal.surfaces import lifecycle
    from registry.simulator import gateway_faults

    late = args.late_landings
    outcomes = Counter()
    scenarios = invariants.Scenarios(sim, outcomes, actor="partition:person", late_landings=late)
    invariants.Doomed.emit()  # dies for sure: replayed below
    published = replayed = 0
    next_publish = next_replay = time.monotonic()
    while time.monotonic() < until:
        now = time.monotonic()
        if now >= next_publish:
            passport = Passport.objects.create(
                upi=invariants.run_upi(published, late_landings=late), operator_id="OP-P"
            )
            lifecycle.publish(passport.pk, actor="partition:driver")
            published += 1
            next_publish = now + rng.uniform(0.5, 1.5) / args.publish_rate
        if now >= next_replay:
            replayed += invariants.replay_dead(actor="partition:driver", reason="partition replay")
            next_replay = now + rng.uniform(1.0, 3.0)
        if rng.random() < 0.1:
            sim.state.faults.update(lost_reply=rng.randint(0, 2), register_5xx=rng.randint(0, 3))
            if late:  # the next registers answered by a gateway (520, 524, an HTML 500), landing later
                sim.state.faults.update(gateway_faults(rng))
        if rng.random() < 0.5:
            invariants.person_registry_write(rng, outcomes, actor="partition:person")
        if rng.random() < 0.15:
            invariants.person_lifecycle_write(rng, outcomes, actor="partition:person")
        scenarios.tick()
        time.sleep(0.05)
    sim.state.faults.update(lost_reply=0, register_5xx=0, late_landing=0, gateway_answer="")
    figures.update(publishes=published, replayed=replayed, late_landings=late)
    return scenarios


def make_happen(scenarios: "invariants.Scenarios", hosts: "Hosts", figures: dict) -> None:
    """Healed, nothing killed any more: what the run must show and has not yet (a replay, the
    scenarios: a machine so busy that killed processes were still starting when killed again) is
    made to happen now, for SCENARIO_GRACE seconds at most; processes that end are restarted."""
    started = time.monotonic()
    while (
        not (scenarios.done() and figures["replayed"])
        and time.monotonic() - started < invariants.SCENARIO_GRACE
    ):
        hosts.restart_the_ended()
        figures["replayed"] += invariants.replay_dead(actor="partition:driver", reason="partition replay")
        scenarios.tick()
        time.sleep(0.1)
    figures["people_seconds_past_their_time"] = round(time.monotonic() - started, 1)
    figures["person_writes"] = dict(sorted(scenarios.outcomes.items()))
    if not scenarios.done():  # what the next person needs to see why: who held what, then
        figures["when_scenarios_fell_short"] = stuck()


def stuck() -> dict:
    """The database's view when the scenarios fell short: the sessions, who holds the wakes'
    listener locks, the kicks on their way and the registrations by status."""
    from django.db import connection

    from registry.models import Registration

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.objid::text, a.client_addr::text, a.state, now() - a.state_change "
            "FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted"
        )
        locks = [list(map(str, row)) for row in cursor.fetchall()]
        cursor.execute("SELECT task, now() - enqueued_at FROM outbox_kick")
        kicks = [list(map(str, row)) for row in cursor.fetchall()]
    statuses = Counter(Registration.objects.values_list("status", flat=True))
    return {"sessions": activity(), "advisory_locks": locks, "kicks": kicks, "registrations": dict(statuses)}


def settle(seconds: float, figures: dict, sim) -> None:
    """Everything healed, no more kills: replay what is dead until nothing is pending or dead, and
    let the hosts settle what the registrations still owe (invariants.registry_settled: a late
    register on its way, a deactivation, a submission being checked)."""
    from outbox.models import Delivery

    started = time.monotonic()
    deliveries_settled = False
    while time.monotonic() - started < seconds:
        figures["replayed"] += invariants.replay_dead(actor="partition:driver", reason="partition replay")
        deliveries_settled = not Delivery.objects.filter(status__in=["pending", "dead"]).exists()
        if deliveries_settled and invariants.registry_settled(sim):
            break
        time.sleep(0.5)
    if not deliveries_settled:
        figures["unsettled_database_activity"] = activity()
    figures["registry_settled"] = invariants.registry_settled(sim)
    figures["settle_seconds"] = round(time.monotonic() - started, 1)


def activity() -> list:
    """What every other session of the database is doing (for a run that did not settle)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_addr::text, state, wait_event_type, wait_event, now() - xact_start, "
            "pg_blocking_pids(pid), left(query, 120) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY xact_start"
        )
        return [list(map(str, row)) for row in cursor.fetchall()]


# -- the run -----------------------------------------------------------------------------------------------


def need_namespaces() -> None:
    """Refusal, saying what is missing, unless this process may build network namespaces."""
    if os.geteuid() != 0:
        raise Refusal("root is missing (the partition run builds network namespaces)")
    if not shutil.which("ip"):
        raise Refusal("`ip netns` is missing (iproute2 is not installed)")
    probe = f"{PREFIX}probe-{os.getpid()}"  # can this process add one (a container may forbid it)?
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode:
        raise Refusal(f"`ip netns` is missing (it cannot add a namespace here: {added.stderr.strip()})")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def preconditions() -> None:
    need_namespaces()
    if not (find_binary("initdb") and find_binary("pg_ctl")):
        raise Refusal("PostgreSQL's initdb and pg_ctl are missing")
    if not shutil.which("redis-server"):
        raise Refusal("redis-server is missing")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise Refusal("a 'postgres' user to run PostgreSQL as is missing") from None


@contextmanager
def exclusive():
    """The machine's namespaces odp-… and 10.213.0.0/16 for this process alone: waits for any
    other run to end, removes what a killed one left, and everything of its kind at the end."""
    with open(LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("partition: another partition run is going on; waiting for it to end", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        removed = remove_leftovers()
        if removed:
            print(f"partition: removed what an earlier run left: {', '.join(removed)}", flush=True)
        try:
            refuse_if_taken()
            yield
        finally:
            remove_leftovers()


def report(figures: dict, results: Counter, violations: list, shortfalls: list, seed: int) -> None:
    print(json.dumps(figures, indent=2, default=str))
    cuts = figures["partitions"]
    kills = figures["kills"]
    print(f"\nseed {seed}: {figures['hosts']} hosts, {figures['seconds']} s of partitions and kills, "
          f"{figures['settle_seconds']} s to settle")  # fmt: skip
    print(f"partitions: {sum(cuts.values())} ({', '.join(f'{k} {v}' for k, v in sorted(cuts.items()))}); "
          f"{figures['cuts_mid_attempt']} made while the host had a webhook request in flight")  # fmt: skip
    print(f"process kills: {sum(kills.values())} ({', '.join(f'{k} {v}' for k, v in sorted(kills.items()))}); "
          f"ended on their own and restarted: {dict(figures['exits']) or 'none'}")  # fmt: skip
    people = figures["person_writes"]
    print(f"publishes {figures['publishes']}, replays {figures['replayed']}, abandons {people.get('abandoned', 0)}, "
          f"handles recorded {people.get('handle recorded', 0)}")  # fmt: skip
    print(f"late writes refused: {figures['late_writes_refused']} deliveries, "
          f"{figures['registry_late_writes_refused']} registrations")  # fmt: skip
    print(f"deliveries by status: {figures['deliveries']} (owed {figures['deliveries_owed']}); "
          f"registrations by status: {figures['registrations_by_status']}")  # fmt: skip
    for invariant in (*invariants.INVARIANTS, SETTLED_ALL, BACKENDS_END):
        n, unenforced = results.get(invariant, 0), violations.unenforced_by_invariant.get(invariant, 0)
        said = f"VIOLATED x{n}" if n else f"not enforced x{unenforced}" if unenforced else "ok"
        print(f"  {said:>20}  {invariant}")
    for line in violations.unenforced:
        print(f"NOT ENFORCED (--no-late-landings): {line}")
    for line in violations:
        print(f"VIOLATION: {line}")
    for line in shortfalls:
        print(f"NOT EXERCISED: {line}")
    print(f"partition: {len(violations)} violations (seed {seed})")


BACKENDS_END = "a host cut off from the database for long has no backend left there"
SETTLED_ALL = "once everything healed, every delivery was delivered (replays included) within the settle time"


def unsettled() -> list[str]:
    """The run's own "nothing lost": once every link is healed and nothing is killed any more,
    each delivery reaches delivered (what died is replayed). invariants.check() counts rows, not
    where they ended, so a delivery left pending for good (a claim nobody ends, a sweep that
    stopped sweeping) would pass it; here it is a violation."""
    from django.db.models import Count

    from outbox.models import Delivery

    left = dict(
        Delivery.objects.exclude(status="delivered").values_list("status").annotate(n=Count("pk")).order_by()
    )
    return [f"{n} deliveries still {status} after the settle time" for status, n in sorted(left.items())]


def run(args, seed: int, folder: Path) -> int:
    began = time.monotonic()
    rng = random.Random(seed)
    network = Network(args.hosts)
    network.build()
    postgres = Postgres(folder)
    pg_port = postgres.start()
    redis_proc, redis_port = start_redis(folder)
    try:
        return drive(args, seed, rng, network, folder, pg_port, redis_port, began)
    finally:
        redis_proc.kill()
        redis_proc.wait()
        postgres.stop()


def drive(args, seed, rng, network, folder, pg_port, redis_port, began) -> int:
    import psycopg

    with psycopg.connect(f"postgres://postgres@127.0.0.1:{pg_port}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    receiver = Receiver(random.Random(f"{seed}-receiver"))
    from registry.simulator import make_server

    faults = invariants.simulator_faults(late_landings=args.late_landings)
    sim = make_server(SERVICE_ADDR, 0, token=TOKEN, faults=faults)
    threading.Thread(target=sim.serve_forever, args=(0.1,), daemon=True).start()
    # A short hold and budget, as the torture run has them; the registry's timeout below the hold,
    # as in production (10 s against 300 s). Webhook consumers time out after 8 s, past the hold,
    # so attempts outlive their claims and late writers come back.
    common = {"ODAL_CLAIM_HOLD_SECONDS": str(HOLD), "ODAL_BACKOFF_BASE_SECONDS": "1", "ODAL_REGISTRY_CHECK_SECONDS": "0",
              "ODAL_REGISTRY_URL": f"http://{SERVICE_ADDR}:{sim.server_address[1]}", "ODAL_REGISTRY_TOKEN": TOKEN,
              **invariants.REGISTRY_ENV, "ODAL_Q_WORKERS": "2", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    driver_env = {**os.environ, **common, "ODAL_LOG_LEVEL": "ERROR",
                  "DATABASE_URL": f"postgres://postgres@127.0.0.1:{pg_port}/{DATABASE}",
                  "ODAL_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0"}  # fmt: skip
    host_env = {**os.environ, **common, "ODAL_LOG_LEVEL": "WARNING",
                "DATABASE_URL": f"postgres://postgres@{DATABASE_ADDR}:{pg_port}/{DATABASE}",
                "ODAL_BROKER_URL": f"redis://{SERVICE_ADDR}:{redis_port}/0"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "odal", "migrate", "-v", "0"], env=driver_env, cwd=ROOT, check=True)
    os.environ.update(driver_env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "odal.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    from outbox.models import Consumer

    invariants.install_history()
    for name in ("site-builder", "billing", "deployer"):
        Consumer.objects.create(
            name=name, url=f"{receiver.url}/{name}", max_attempts=MAX_ATTEMPTS, timeout_seconds=8
        )
    figures = {"seed": seed, "hosts": args.hosts, "seconds": args.seconds, "hold_seconds": HOLD}
    halt = threading.Event()
    hosts = Hosts(network, host_env, folder)
    partitions = Partitions(network, receiver, random.Random(f"{seed}-partitions"), halt, args.long_every)
    killer = Killer(hosts, random.Random(f"{seed}-kills"), halt)
    started = time.monotonic()
    figures["setup_seconds"] = round(started - began, 1)
    try:
        partitions.start()
        killer.start()
        scenarios = people(args, sim, rng, figures, until=started + args.seconds)
        halt.set()
        partitions.join()
        killer.join()
        network.heal_all()
        for thread in (partitions, killer):
            if thread.error:
                raise thread.error
        hosts.restart_the_ended(pause=0)
        make_happen(scenarios, hosts, figures)
        settle(args.settle + invariants.SETTLING, figures, sim)
        stopping = time.monotonic()
        figures["not_stopped_by_sigterm"] = dict(hosts.stop())
        figures["stop_seconds"] = round(time.monotonic() - stopping, 1)
    finally:
        halt.set()
        network.heal_all()
        hosts.stop(seconds=0)
    sim.state.land_pending()  # what is still on its way lands now: nothing else happens any more
    sim.shutdown()
    receiver.server.shutdown()
    figures["scenarios"] = scenarios.figures()
    figures.update(
        partitions=dict(partitions.cuts), cuts_mid_attempt=partitions.mid_attempt, long_database_cuts=partitions.long_cuts,
        kills=dict(hosts.kills), exits=dict(hosts.exits), exit_reasons=dict(hosts.exit_reasons.most_common(8)),
        webhook_answers=dict(receiver.seen), webhook_requests_by_host=dict(sorted(receiver.by_host.items())),
        gateway_answers_landing_later=dict(sim.state.gateway_answered),
    )  # fmt: skip
    figures["registry_holds"] = invariants.registry_holds(sim)
    figures["registry_unrevoked"] = invariants.registry_unrevoked(sim)
    violations = invariants.check(figures, max_attempts=MAX_ATTEMPTS, withdrawn_enforced=args.late_landings)
    results = Counter(violations.by_invariant)
    for cut in partitions.long_cuts:
        if cut["ended_after_seconds"] is None and cut["backends_when_cut"]:
            results[BACKENDS_END] += 1
            violations.append(
                f"host {cut['host']} was cut off from the database for {cut['seconds']} s and "
                f"{cut['backends_when_cut']} backends of it were still there: nothing noticed the client was gone"
            )
    for line in unsettled():
        results[SETTLED_ALL] += 1
        violations.append(line)
    figures["violations"] = len(violations)
    figures["wall_seconds"] = round(time.monotonic() - began, 1)
    connection.close()
    shortfalls = []
    if sum(partitions.cuts.values()) < args.require_partitions:
        shortfalls.append(f"{sum(partitions.cuts.values())} partitions, {args.require_partitions} asked for")
    if sum(hosts.kills.values()) < args.require_kills:
        shortfalls.append(f"{sum(hosts.kills.values())} process kills, {args.require_kills} asked for")
    shortfalls += scenarios.shortfalls() + (
        [] if figures["replayed"] else ["a dead delivery replayed: none was"]
    )
    if args.late_landings and not sim.state.gateway_answered:
        shortfalls.append(
            "a register answered by a gateway (520, 524, an HTML 500) and landing later: none was"
        )
    report(figures, results, violations, shortfalls, seed)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    return 1 if violations or shortfalls else 0


def run_bounded(
    argv: list[str], *, timeout: float, grace: float = 60.0, **popen
) -> subprocess.CompletedProcess:
    """`argv` (a partition run) with its output, given `timeout` seconds; past them it is sent
    SIGTERM, which the run turns into its clean-up (namespaces, links, the hosts' processes, its
    PostgreSQL and Redis), and SIGKILL only if that takes longer than `grace`. (subprocess.run's
    own timeout SIGKILLs at once and leaves all of that running until the next run.) Raises
    subprocess.TimeoutExpired, with the output, when the timeout was reached."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            stdout, stderr = process.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def interrupted(signum, frame):
    """SIGTERM ends the run the way Ctrl-C does: through the clean-up."""
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3, choices=(2, 3))
    parser.add_argument("--seconds", type=float, default=240, help="of partitions, kills and people's writes")
    parser.add_argument("--settle", type=float, default=30,
                        help="at most, healed and unkilled, at the end (and the registry's settle window)")  # fmt: skip
    parser.add_argument("--publish-rate", type=float, default=2.0, help="passports published per second")
    parser.add_argument("--long-every", type=int, default=5, help="every Nth cut is a long one (0: none)")
    parser.add_argument("--require-partitions", type=int, default=0)
    parser.add_argument("--require-kills", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--late-landings", action=argparse.BooleanOptionalAction, default=invariants.LATE_LANDINGS,
        help="registers that reach the registry after the drain gave up on them, and the invariant that no "
        "registration ends abandoned or suspended while the registry holds it enforced (without: reported)",
    )  # fmt: skip
    args = parser.parse_args()
    try:
        preconditions()
    except Refusal as exc:
        print(f"partition: {exc}.", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    signal.signal(signal.SIGTERM, interrupted)
    logs = Path(tempfile.gettempdir()) / "odal_partition_logs"
    try:
        with exclusive():
            folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
            try:
                return run(args, seed, folder)
            finally:
                shutil.rmtree(logs, ignore_errors=True)
                shutil.copytree(folder, logs, ignore=shutil.ignore_patterns("data"))
                print(f"partition: the logs of the hosts, PostgreSQL and Redis are in {logs}", flush=True)
    except Refusal as exc:
        print(f"partition: {exc}.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("partition: interrupted; what the run made is removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
