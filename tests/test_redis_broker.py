"""The Redis broker for real: two django-q2 clusters with ODAL_BROKER_URL pointing at the Redis of
127.0.0.1:6379 (through a proxy the test can take down) deliver and register what is published,
run each task once between them, and lose nothing when Redis goes away: publishes still commit,
the clusters come back on their own, and the schedule delivers what the lost kicks would have.

One expensive setup (two clusters) serves the whole story, told in order by one test. Without a
Redis on 127.0.0.1:6379 that test is skipped, saying so."""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from datetime import timedelta
from functools import partial

import pytest
import redis
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from odal.core.env import redis_url_with_timeouts
from odal.surfaces import lifecycle
from odal.work import wake as kick
from odal.work.wake import DRAIN, SWEEP
from outbox.models import Delivery
from registry.models import Registration
from tests.factories import PassportFactory, WebhookConsumerFactory
from tests.tcp_proxy import TcpProxy
from tests.test_django_q import database_url
from tests.webhook_server import WebhookServer

REDIS = ("127.0.0.1", 6379)
LIST_KEY = f"django_q:{Conf.CLUSTER_NAME}:q"  # the list django-q2's Redis broker queues tasks in
KICKS_LOST = [
    f"could not enqueue {task}; this process enqueues no kick for {kick.BROKER_REST_SECONDS:g} s"
    for task in ("outbox.tasks.sweep", "registry.tasks.drain")
]


def test_the_broker_url_gets_timeouts_unless_it_names_its_own():
    """redis-py waits for ever by default: see odal.core.env.redis_url_with_timeouts."""
    assert redis.connection.parse_url(redis_url_with_timeouts("redis://cache.internal/0")) == {
        "host": "cache.internal",
        "db": 0,
        "socket_connect_timeout": 2.0,
        "socket_timeout": 5.0,
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "print(settings.Q_CLUSTER['redis'])"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "odal.settings",
             "ODAL_BROKER_URL": "redis://:s%40cret@cache.internal:6380/4?socket_timeout=9"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert redis.connection.parse_url(result.stdout.strip()) == {
        "host": "cache.internal",
        "port": 6380,
        "db": 4,
        "password": "s@cret",
        "socket_connect_timeout": 2.0,
        "socket_timeout": 9.0,
    }


class RedisProxy(TcpProxy):
    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"


@pytest.fixture
def redis_db(transactional_db):
    """A Redis database of this suite's own, empty before and after: its number comes from the
    test database's name, so suites of other names (make fuzz, a colleague's) rarely share it."""
    number = 1 + zlib.crc32(connection.settings_dict["NAME"].encode()) % 15
    host, port = REDIS
    client = redis.from_url(f"redis://{host}:{port}/{number}", socket_connect_timeout=2, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379: skipped the Redis broker tests")
    client.flushdb()
    yield number, client
    client.flushdb()
    client.close()


@pytest.fixture
def proxy():
    proxy = RedisProxy(REDIS)
    yield proxy
    proxy.close()


def wait_for(condition, seconds, what, outputs=()):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            said = "\n".join(f"--- {path}:\n{path.read_text(errors='replace')[-3000:]}" for path in outputs)
            raise AssertionError(f"{what} within {seconds} s; the clusters said:\n{said}")
        time.sleep(0.2)


def runs_of(path):
    """{key: [(cluster pid, sentinel pid), ...]} of the record tasks that ran."""
    runs = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            key, cluster, sentinel = line.split()
            runs[key].append((int(cluster), int(sentinel)))
    return runs


def have_run(keys, path):
    return keys <= set(runs_of(path))


def run_record_tasks(prefix, path, clusters, outputs):
    """Enqueue record tasks through Redis, a batch at a time until both clusters have taken some
    (a cluster whose pusher is quicker may take a whole batch), and wait for all to have run."""
    keys = []
    for _ in range(5):
        batch = [f"{prefix}-{len(keys) + i}" for i in range(20)]
        for key in batch:
            async_task("tests.broker_tasks.record", key, str(path), q_options={"save": False})
        keys += batch
        wait_for(partial(have_run, set(keys), path), 20, f"the {prefix} tasks did not all run", outputs)
        runs = {key: ran for key, ran in runs_of(path).items() if key.startswith(f"{prefix}-")}
        if {cluster for ran in runs.values() for cluster, _ in ran} == {c.pid for c in clusters}:
            break
    return keys, runs


def listener_holds_the_lock(lock=SWEEP.lock):
    """Whether a sweep (or, given DRAIN.lock, a drain) of this database holds its listener lock
    (odal.work.wake): a bigint advisory lock shows in pg_locks as its high and low 32 bits."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = %s AND objid = %s AND objsubid = 1",
            [lock >> 32, lock & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0] > 0


def publish_in_a_thread(passport_pk):
    outcome = {}

    def run():
        try:
            lifecycle.publish(passport_pk, actor="test")
            outcome["published"] = True
        except Exception as exc:  # reported by the test
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def settled(passports):
    """Every one registered, and its passport.published delivered."""
    ids = [str(p.pk) for p in passports]
    registered = Registration.objects.filter(passport__in=ids, status="registered").count()
    delivered = Delivery.objects.filter(event__payload__dppId__in=ids, status="delivered").count()
    return registered == delivered == len(ids)


def stop(clusters):
    for cluster in clusters:
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGTERM)  # the sentinel stops its own workers
    for cluster in clusters:
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()


@pytest.mark.slow
def test_two_redis_broker_clusters_deliver_once_each_and_survive_losing_redis(
    redis_db, proxy, settings, registry_sim, monkeypatch, caplog, tmp_path
):
    number, direct = redis_db
    broker_url = f"{proxy.url}/{number}"
    settings.ODAL_KICK_SWEEP = True
    # This process enqueues as a web process started with ODAL_BROKER_URL does.
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", redis_url_with_timeouts(broker_url))
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_BROKER_URL": broker_url,
        "ODAL_Q_WORKERS": "2",
        "ODAL_REGISTRY_URL": settings.ODAL_REGISTRY_URL,
        "ODAL_REGISTRY_TOKEN": settings.ODAL_REGISTRY_TOKEN,
        "ODAL_REGISTRY_CHECK_SECONDS": "0",
    }
    # The migrations' schedules (a transactional test before may have flushed them), not due for
    # an hour: until the outage, only kicks move work.
    later = timezone.now() + timedelta(hours=1)
    for name, func in (("outbox sweep", "outbox.tasks.sweep"), ("registry drain", "registry.tasks.drain")):
        Schedule.objects.update_or_create(
            name=name,
            defaults={"func": func, "schedule_type": "I", "minutes": 1, "repeats": -1, "next_run": later},
        )
    record_file = tmp_path / "records"
    outputs = [tmp_path / "cluster-a.log", tmp_path / "cluster-b.log"]

    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url, event_types=["passport.published"])

        # 1. A publish's kicks go to Redis: before any cluster runs, they wait in its list.
        first = PassportFactory()
        lifecycle.publish(first.pk, actor="test")
        queued = [SignedPackage.loads(task)["func"] for task in direct.lrange(LIST_KEY, 0, -1)]
        assert sorted(queued) == ["outbox.tasks.sweep", "registry.tasks.drain"]

        logs = [path.open("wb") for path in outputs]
        clusters = [
            subprocess.Popen(
                [sys.executable, "-m", "odal", "qcluster"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group (tests/broker_tasks.py records it)
            )
            for log in logs
        ]
        held_thread = None
        try:
            # ... and the clusters take them from there: delivered and registered.
            wait_for(lambda: settled([first]), 45, "the first publish did not settle", outputs)
            assert direct.llen(LIST_KEY) == 0
            assert str(Delivery.objects.get().pk) in [r.headers["webhook-id"] for r in server.received]
            assert Registration.objects.get(passport=first).handle in registry_sim.registrations

            # 2. Two clusters on one Redis: every task runs exactly once, and both take some.
            keys, runs = run_record_tasks("before", record_file, clusters, outputs)
            assert {key: len(ran) for key, ran in runs.items()} == dict.fromkeys(keys, 1)
            assert {cluster for ran in runs.values() for cluster, _ in ran} == {c.pid for c in clusters}
            sentinels = {sentinel for ran in runs.values() for _, sentinel in ran}

            # 3. Redis goes away. Its port refuses and every connection is cut, as when Redis
            # stops; it comes back empty, as a Redis without persistence restarts: what was queued
            # is lost too.
            proxy.refuse()
            direct.delete(LIST_KEY)
            # A listening sweep or drain may still be in its turn from the work before: a publish
            # would then only NOTIFY it. Their relays cannot be enqueued now, so they stop at the
            # end of their turn; the publishes below find none listening, and kick.
            wait_for(
                lambda: not listener_holds_the_lock() and not listener_holds_the_lock(DRAIN.lock),
                30,
                "the listening sweep and drain did not stop",
                outputs,
            )
            # For a moment it takes connections and never answers (hung, or its network drops the
            # packets). A publish still returns, its kick failing after the broker's timeout; the
            # sentinels' heartbeats caught in it time out the same way (without the timeouts they
            # would wait for ever, and the clusters with them).
            proxy.silence()
            caplog.clear()
            silenced = PassportFactory()
            held_thread, outcome = publish_in_a_thread(silenced.pk)
            # Its kick and the heartbeats of both sentinels are caught in it (the pushers sleep
            # for 10 s after losing their connection).
            wait_for(lambda: len(proxy.held) >= 3, 10, "the kick and the sentinels did not connect", outputs)
            proxy.refuse()  # what it holds stays silent
            # A listening sweep (or drain) works on a NOTIFY without Redis; its relay cannot be
            # enqueued now, so it stops at the end of its turn, and the next publish waits for the
            # schedule.
            wait_for(
                lambda: not listener_holds_the_lock() and not listener_holds_the_lock(DRAIN.lock),
                30,
                "the listening sweep and drain did not stop",
                outputs,
            )
            held_thread.join(timeout=30)
            assert not held_thread.is_alive(), "a publish while Redis did not answer never returned"
            assert outcome == {"published": True}
            warnings = [r.getMessage() for r in caplog.records if r.name == "odal.work.wake"]
            # Its kicks failed (a kick is left out while a listener leads: coalesced, odal.work.wake).
            assert warnings and set(warnings) <= set(KICKS_LOST), warnings
            caplog.clear()
            # After a failed kick this process rests its kicks (odal.work.wake): once the rest is
            # over, both kicks of a publish are tried again, and fail again.
            kick._rest_until = float("-inf")
            monkeypatch.setattr(kick, "BROKER_REST_SECONDS", 0.0)
            refused = PassportFactory()
            lifecycle.publish(refused.pk, actor="test")  # commits; its kicks fail with a warning
            warnings = sorted(r.getMessage() for r in caplog.records if r.name == "odal.work.wake")
            assert warnings == [w.replace("for 10 s", "for 0 s") for w in KICKS_LOST]

            # Nothing has moved the outage's work since (but the listener may have delivered the
            # first of the two publishes).
            lost = [silenced, refused]
            for passport in lost:
                passport.refresh_from_db()
                assert passport.status == "published"
            waiting = Delivery.objects.get(event__payload__dppId=str(refused.pk))
            assert (waiting.status, waiting.attempts) == ("pending", 0)
            assert [(r.status, r.attempts) for r in Registration.objects.filter(passport__in=lost)] == [
                ("pending", 0)
            ] * 2

            # 4. Redis is back, for new connections. Nothing is queued and no sweep listens, so
            # the outage's work waits for the schedules. Their period is a minute: the test makes
            # them due now rather than wait for it; the clusters' schedulers (every ~30 s) enqueue
            # them through Redis and the clusters run them.
            proxy.restore()
            assert direct.llen(LIST_KEY) == 0
            due = timezone.now()
            taken_before = dict(Schedule.objects.values_list("name", "task"))
            Schedule.objects.filter(name__in=["outbox sweep", "registry drain"]).update(next_run=due)
            wait_for(lambda: settled(lost), 50, "the schedules did not deliver what the outage kept", outputs)
            for schedule in Schedule.objects.filter(name__in=["outbox sweep", "registry drain"]):
                assert schedule.next_run > due and schedule.task != taken_before[schedule.name], schedule.name
            assert all(r.status == "delivered" for r in Delivery.objects.all())
            assert listener_holds_the_lock()  # the schedule's sweep listens again: the relay lives on

            # 5. The same clusters (no person restarted them) have reconnected: their pushers were
            # reincarnated and both take new tasks, each once; a publish's drain kick registers it
            # without the schedule.
            keys, runs = run_record_tasks("after", record_file, clusters, outputs)
            drain_task = Schedule.objects.get(name="registry drain").task
            after = PassportFactory()
            lifecycle.publish(after.pk, actor="test")
            wait_for(lambda: settled([after]), 20, "a publish after the outage did not settle", outputs)
            assert Schedule.objects.get(name="registry drain").task == drain_task
            assert {key: len(ran) for key, ran in runs.items()} == dict.fromkeys(keys, 1)
            assert {cluster for ran in runs.values() for cluster, _ in ran} == {c.pid for c in clusters}
            assert {sentinel for ran in runs.values() for _, sentinel in ran} == sentinels
            assert all(c.poll() is None for c in clusters)
            assert OrmQ.objects.count() == 0  # nothing went through the ORM broker
        finally:
            stop(clusters)
            for log in logs:
                log.close()
            proxy.close()  # what it held hangs up, so a thread still waiting on it returns
            if held_thread is not None:
                held_thread.join(timeout=10)
    for path in outputs:
        assert "reincarnated pusher" in path.read_text(errors="replace"), path.name
