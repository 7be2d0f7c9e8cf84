"""A database restart under real processes: PostgreSQL goes away during a sweep and a drain,
and every odal process carries on by itself.

One throwaway PostgreSQL cluster (tests/pg.py's Cluster), migrated, with its schedules pushed a
day ahead (nothing below is helped by the minute's schedule). Against it: a real `odal
qcluster`, `odal outbox sweep` and `odal registry drain`, a local webhook receiver and the
registry simulator, and a publisher process publishing a passport every 0.1 s. In the middle
the server is restarted with `pg_ctl restart`; later every odal connection is terminated with
pg_terminate_backend; last, the server is stopped for 3 s (every connection refused) and
started again. Then: the same processes still run, everything published before, during and
after is delivered and registered, nothing was settled twice (the guarded writes' attempt log
has one current success per row), the listening sweep listens and leads again, and the figures
(printed; `pytest -s` shows them) say how long deliveries paused.
"""

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from odal.work.wake import SWEEP
from tests.pg import Cluster, ClusterUnavailable
from tests.webhook_server import WebhookServer

ROOT = Path(__file__).resolve().parent.parent
HOLD = 3  # ODAL_CLAIM_HOLD_SECONDS of the processes: an outcome lost with the database is due again after it
PROCESSES = ("qcluster", "sweep", "drain")
DOWN_SECONDS = 3
OUTAGES = ("pg_ctl restart", "pg_terminate_backend", f"pg_ctl stop, {DOWN_SECONDS} s, start")
LEADERS = ("odal-sweep", "odal-qcluster")  # the application_name of the listener lock's holder
LEADER_SQL = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid = %s AND l.objid = %s "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
LEADER_PARAMS = [SWEEP.lock >> 32, SWEEP.lock & 0xFFFFFFFF]
FIGURES: list[str] = []  # what the run measured, for the end of the test run's output


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up after {seconds} s waiting for {what}")


class Deployment:
    """The cluster, the processes and what the test reads from them."""

    def __init__(self, cluster: Cluster, folder: Path, receiver: WebhookServer, simulator):
        self.cluster, self.folder, self.receiver, self.simulator = cluster, folder, receiver, simulator
        self.procs: dict[str, subprocess.Popen] = {}

    def env(self, role: str, **extra) -> dict:
        return {
            **os.environ,
            "DATABASE_URL": f"{self.cluster.url('odal')}?application_name=odal-{role}",
            "ODAL_CLAIM_HOLD_SECONDS": str(HOLD),
            "ODAL_BACKOFF_BASE_SECONDS": "0",
            "ODAL_REGISTRY_URL": f"http://127.0.0.1:{self.simulator.server_address[1]}",
            "ODAL_REGISTRY_TOKEN": "sim-token",
            "ODAL_REGISTRY_CHECK_SECONDS": "0",
            "ODAL_Q_WORKERS": "2",
            "ODAL_LOG_FORMAT": "text",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def odal(self, role: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "odal", *argv], env=self.env(role), cwd=ROOT, capture_output=True, text=True,
            check=True, timeout=120,
        )  # fmt: skip

    def start(self, role: str, argv: list[str], **env) -> subprocess.Popen:
        with open(self.folder / f"{role}.log", "w") as log:
            proc = subprocess.Popen(
                argv, env=self.env(role, **env), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs[role] = proc
        return proc

    def log(self, role: str) -> str:
        return (self.folder / f"{role}.log").read_text(errors="replace")

    def sql(self, query: str, params=None) -> list[tuple]:
        with psycopg.connect(self.cluster.url("odal"), autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def leader(self) -> str | None:
        rows = self.sql(LEADER_SQL, LEADER_PARAMS)
        return rows[0][0] if rows else None

    def stop(self) -> None:
        """SIGTERM (the sweep and the drain finish their pass; the cluster's sentinel stops its
        workers), and SIGKILL for what has not ended within a few seconds (a django-q2 worker
        may be in a drain task that lingers, or a listening turn)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def deployment(registry_simulator, tmp_path_factory):
    try:
        cluster = Cluster(prefix="odal-restart-")
    except ClusterUnavailable as exc:
        pytest.skip(f"skipped because a throwaway PostgreSQL cannot be started here: {exc}")
    registry_simulator.state.reset()
    with cluster, WebhookServer() as receiver:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE odal")
        world = Deployment(cluster, tmp_path_factory.mktemp("odal-restart"), receiver, registry_simulator)
        world.odal("setup", "migrate", "--noinput")
        world.odal(
            "setup", "outbox", "consumer", "add", "hooks", "--url", receiver.url, "--events", "passport.*"
        )
        world.sql("UPDATE django_q_schedule SET next_run = now() + interval '1 day'")  # no schedule helps
        try:
            world.start("sweep", [sys.executable, "-m", "odal", "outbox", "sweep"])  # first: it leads
            wait_for(lambda: world.leader() == "odal-sweep", 30, "odal outbox sweep to lead")
            world.start("drain", [sys.executable, "-m", "odal", "registry", "drain"])
            world.start("qcluster", [sys.executable, "-m", "odal", "qcluster"])
            yield world
        finally:
            world.stop()
            world.simulator.state.reset()


def pause_across(times: list[float], moment: float, until: float) -> float:
    """How long deliveries paused across `moment`: the longest stretch with none of `times`,
    from the last one before `moment` to `until` (the next outage, or the publisher's end)."""
    before = [t for t in times if t <= moment]
    points = sorted({max(before, default=moment), *(t for t in times if moment < t <= until)})
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=float("inf"))


def recovered(log: str) -> list[tuple[float, int]]:
    """(seconds, tries) of each "the database answers again" line of a process's log."""
    found = re.findall(r"the database answers again after ([\d.]+) s \((\d+) tr", log)
    return [(float(seconds), int(tries)) for seconds, tries in found]


def published(log: str) -> list[tuple[str, float]]:
    """The publisher's lines: (passport id, unix time it committed)."""
    return [(pk, float(at)) for pk, at in re.findall(r"^(\S{36}) ([\d.]+)$", log, re.MULTILINE)]


def lose_the_database(world: Deployment, name: str) -> dict:
    """One outage; returns once deliveries flow again, a sweep leads, and 4 s have passed."""
    began, began_wall, cut = time.monotonic(), time.time(), None
    if name == "pg_terminate_backend":
        (cut,) = world.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'odal-%' AND pid <> pg_backend_pid()"
        )[0]
    else:  # returns once the server accepts connections again
        world.cluster.restart(down_seconds=DOWN_SECONDS if "stop" in name else 0)
    down = time.monotonic() - began
    seen = len(world.receiver.received)
    wait_for(lambda: len(world.receiver.received) >= seen + 20, 60, f"deliveries to flow again after {name}")
    wait_for(lambda: world.leader() in LEADERS, 30, f"a sweep to lead after {name}")
    time.sleep(max(0.0, began + 4 - time.monotonic()))  # publishing goes on a while
    # ... and for more than ten publishes since the outage began, however slowly a loaded machine
    # publishes (the test counts them per phase: after a 3-s stop, 4 s can hold fewer).
    wait_for(
        lambda: sum(at >= began_wall for _, at in published(world.log("publisher"))) > 10,
        60,
        f"publishing to go on after {name}",
    )
    return {"name": name, "began": began, "began_wall": began_wall, "down": down, "cut": cut}


@pytest.mark.slow
def test_every_process_rides_out_a_database_restart_and_terminated_connections(deployment):
    world = deployment
    received = world.receiver.received
    publisher = world.start("publisher", [sys.executable, "tests/restart_publisher.py", "R"])
    wait_for(lambda: len(received) >= 30, 60, "deliveries to flow")
    outages = [lose_the_database(world, name) for name in OUTAGES]
    stopped, stopped_wall = time.monotonic(), time.time()
    publisher.send_signal(signal.SIGTERM)
    publisher.wait(timeout=30)
    # A commit that wakes nothing (no NOTIFY, no django-q2 kick; the schedules are a day away):
    # only sweeps and drains that carried on by themselves see it.
    probe = [sys.executable, "tests/restart_publisher.py", "P", "--count", "1"]
    world.start("probe", probe, ODAL_KICK_SWEEP="0").wait(timeout=60)
    passports = published(world.log("publisher")) + published(world.log("probe"))
    ids = [pk for pk, _ in passports]
    phases = Counter(sum(at >= outage["began_wall"] for outage in outages) for _, at in passports)
    assert len(phases) == len(outages) + 1 and min(phases.values()) > 10, phases  # before, between, after

    def settled():
        return world.sql(
            "SELECT (SELECT count(*) FROM outbox_delivery WHERE status <> 'delivered') = 0 "
            "AND (SELECT count(*) FROM registry_registration WHERE status <> 'registered') = 0 "
            "AND (SELECT count(*) FROM outbox_event) = (SELECT count(*) FROM outbox_delivery) "
            "AND (SELECT count(*) FROM outbox_event WHERE type = 'passport.registered') = %s",
            [len(ids)],
        )[0][0]

    wait_for(settled, 60, "every delivery delivered and every passport registered")
    running = {role: world.procs[role].poll() is None for role in PROCESSES}
    leader = world.leader()
    world.stop()

    # The same processes ran throughout: none ended, none was started again.
    assert running == dict.fromkeys(PROCESSES, True), {role: world.log(role)[-3000:] for role in PROCESSES}
    assert leader in LEADERS

    # Nothing lost: every passport published (before, during, after) is registered, its two
    # events (published, registered) were delivered, and the receiver got every delivery.
    rows = world.sql(
        "SELECT p.id::text, r.status, (SELECT count(*) FROM outbox_event e WHERE e.payload->>'dppId' = p.id::text) "
        "FROM odal_passport p JOIN registry_registration r ON r.passport_id = p.id"
    )
    assert sorted(pk for pk, *_ in rows) == sorted(ids)
    assert {(status, events) for _, status, events in rows} == {("registered", 2)}
    deliveries = world.sql(
        "SELECT d.id::text, d.attempts, count(a.id), "
        "count(a.id) FILTER (WHERE a.outcome = 'delivered' AND NOT a.late), "
        "count(a.id) FILTER (WHERE a.outcome = 'write_error'), count(a.id) FILTER (WHERE a.late) "
        "FROM outbox_delivery d LEFT JOIN outbox_deliveryattempt a ON a.delivery_id = d.id GROUP BY d.id"
    )
    receipts = Counter(r.headers["webhook-id"] for r in received)
    assert len(deliveries) == 2 * len(ids) and set(receipts) == {pk for pk, *_ in deliveries}
    # Nothing settled twice: one current success per delivery in the attempt log and no write
    # error (an outcome lost with the database is neither), no more requests or lines than claims.
    assert {(current, errors) for _, _, _, current, errors, _ in deliveries} == {(1, 0)}
    assert all(receipts[pk] <= attempts and lines <= attempts for pk, attempts, lines, *_ in deliveries)
    registrations = world.sql(
        "SELECT count(a.id) FILTER (WHERE a.outcome = 'registered' AND NOT a.late), "
        "count(a.id) FILTER (WHERE a.outcome = 'write_error') FROM registry_registration r "
        "LEFT JOIN registry_registrationattempt a ON a.registration_id = r.id GROUP BY r.id"
    )
    assert set(registrations) == {(1, 0)}
    held = Counter(request["upi"] for request in world.simulator.state.requests.values())
    assert len(held) == len(ids) and set(held.values()) == {1}  # one request per passport at the registry
    assert len(world.simulator.state.registrations) == len(ids)

    # Each long-lived loop logged each loss once and its recovery once (a drain resting between
    # passes may get a new connection without meeting the loss), backed off while nothing
    # answered (a busy loop would try hundreds of times in 3 s), and the sweep listens again.
    sweep_log, drain_log = world.log("sweep"), world.log("drain")
    assert sweep_log.count("outbox sweep lost the database") == len(recovered(sweep_log)) == len(outages)
    assert sweep_log.count("listening again") == len(outages)
    losses = drain_log.count("registry drain lost the database")
    assert 1 <= losses == len(recovered(drain_log)) <= len(outages)
    assert not re.search(r"^\S+ \S+ (ERROR|CRITICAL) ", sweep_log + drain_log, re.MULTILINE), (
        sweep_log + drain_log
    )
    assert max(tries for _, tries in recovered(sweep_log) + recovered(drain_log)) <= 10

    registered_at = [
        at.timestamp()
        for (at,) in world.sql(
            "SELECT finished_at FROM registry_registrationattempt WHERE outcome = 'registered'"
        )
    ]
    figures = ["database restart figures (tests/test_db_restart.py):"]
    for outage, following in zip(outages, [*outages[1:], None], strict=True):
        until = following["began"] if following else stopped  # (then the publisher stopped)
        until_wall = following["began_wall"] if following else stopped_wall
        cut = f" ({outage['cut']} connections cut)" if outage["cut"] is not None else ""
        figures.append(
            f"  {outage['name']}: the database was away {outage['down']:.2f} s{cut}; deliveries paused "
            f"{pause_across([r.at for r in received], outage['began'], until):.2f} s, registrations "
            f"{pause_across(registered_at, outage['began_wall'], until_wall):.2f} s"
        )
    for what, log in (("outbox sweep", sweep_log), ("registry drain", drain_log)):
        backs = ", ".join(
            f"{seconds:.1f} s ({tries} {'try' if tries == 1 else 'tries'})"
            for seconds, tries in recovered(log)
        )
        losses = len(recovered(log))
        figures.append(
            f"  {what} logged {losses} {'loss' if losses == 1 else 'losses'}, answered again after {backs}"
        )
    figures.append(
        f"  {len(ids)} passports published ({', '.join(str(phases[n]) for n in sorted(phases))} before, between"
        f" and after the outages, the last waking nothing), {len(deliveries)} deliveries, all delivered:"
        f" {len(received)} webhook requests ({len(received) - len(deliveries)} sent again after an outcome lost"
        f" with the database), {sum(d[5] for d in deliveries)} late outcomes refused; {len(ids)} registered,"
        " one registry request each"
    )
    FIGURES[:] = figures  # the terminal summary prints them (tests/conftest.py)
    print("\n" + "\n".join(figures))
