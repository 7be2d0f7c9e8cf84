"""A lost database, close up: the loops' connections are cut with pg_terminate_backend (what a
restart does to them; tests/test_db_restart.py restarts a whole server under real processes) in
the middle of a pass, while a webhook or the registry is being asked, or while a sweep listens.

Each loop must carry on by itself, write nothing more for the claim whose outcome it could not
write (that claim's rows are due again after the hold), listen and lead again, and log the loss
and the recovery once each."""

import socket
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from django.db import DataError, IntegrityError, OperationalError, connection, connections, transaction
from django_q.models import OrmQ

from odal.core import reconnect
from odal.work import wake
from odal.work.wake import SWEEP, Listener
from outbox import sweep_pass, tasks
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_listening, sweep_until_idle
from registry import drain
from registry import tasks as registry_tasks
from registry.models import Registration
from tests import consumers
from tests.factories import ConsumerFactory, DeliveryFactory, PublishedPassportFactory, WebhookConsumerFactory
from tests.waiting import wait_for
from tests.webhook_server import WebhookServer

# The backend holding the listener lock (a session advisory lock on a bigint: classid is its high
# half, objid its low half, objsubid 1).
LEADER_SQL = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
    "AND classid = %s AND objid = %s "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
LEADER_PARAMS = [SWEEP.lock >> 32, SWEEP.lock & 0xFFFFFFFF]


def leader() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(LEADER_SQL, LEADER_PARAMS)
        row = cursor.fetchone()
    return row[0] if row else None


# The application_name of the connections a Loop's thread opens (its own, its listener's): the
# database may also hold others (an autovacuum worker, a backend of an earlier test's still exiting).
LOOP = "odal-test-loop"


def loop_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [LOOP],
        )
        return cursor.fetchone()[0]


def cut_connections() -> list[str]:
    """pg_terminate_backend every other connection to the test database: the loops' own, their
    listeners' and their Python-consumer threads'. This test's connection stays. Returns the
    application_name of each connection cut."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [name for name, _ in cursor.fetchall()]


class Loop(threading.Thread):
    """A worker loop on a thread of its own, with its own connections, as in a process: `run`
    gets should_stop; `stop()` ends it (a NOTIFY wakes a listening sweep)."""

    def __init__(self, loop):
        super().__init__(daemon=True)
        self.loop, self.stopping = loop, threading.Event()
        self.report, self.error = None, None

    def run(self):
        # This thread's connections, its listener's too (from get_connection_params), say LOOP.
        options = {**connection.settings_dict.get("OPTIONS", {}), "application_name": LOOP}
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
        try:
            self.report = self.loop(should_stop=self.stopping.is_set)
        except BaseException as exc:  # the test says what escaped
            self.error = exc
        finally:
            connections.close_all()

    def stop(self, timeout: float = 10) -> None:
        self.stopping.set()
        if not self.is_alive():
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('odal_outbox', '')")
        self.join(timeout)
        assert not self.is_alive(), "the loop did not stop"
        assert self.error is None, f"the loop ended with {self.error!r}"


@pytest.fixture
def start():
    """Start a Loop; every one still running when the test ends is stopped."""
    started = []

    def start(loop) -> Loop:
        thread = Loop(loop)
        started.append(thread)
        thread.start()
        return thread

    yield start
    for thread in started:
        thread.stopping.set()
    for thread in started:
        thread.join(10)


def outage_lines(caplog, what: str) -> list[str]:
    return [
        r.getMessage().split(" (")[0].split(" after ")[0]
        for r in caplog.records
        if r.name == "odal.core.reconnect" and r.getMessage().startswith(what)
    ]


LOST_AND_BACK = ["{} lost the database", "{}: the database answers again"]


def a_refused_connection() -> Exception:
    """A real libpq error: a connection to a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        psycopg.connect(host="127.0.0.1", port=port, connect_timeout=2)
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError("something listens on a free port")


def a_serialization_failure() -> Exception:
    """40001, which psycopg counts an OperationalError: a repeatable-read transaction updates a
    row another connection changed since it began. The connection is fine; the caller retries."""
    params = connection.get_connection_params()
    with psycopg.connect(**params) as first, psycopg.connect(**params, autocommit=True) as second:
        first.execute("CREATE TABLE IF NOT EXISTS odal_test_serial (n int)")
        first.execute("DELETE FROM odal_test_serial")
        first.execute("INSERT INTO odal_test_serial VALUES (1)")
        first.commit()
        first.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        first.execute("SELECT n FROM odal_test_serial").fetchall()
        second.execute("UPDATE odal_test_serial SET n = 2")
        try:
            first.execute("UPDATE odal_test_serial SET n = 3")
        except psycopg.OperationalError as exc:
            assert exc.sqlstate == "40001", exc
            return exc
        finally:
            first.rollback()
            first.execute("DROP TABLE odal_test_serial")
            first.commit()
    raise AssertionError("the second update was not refused")


@pytest.mark.django_db(transaction=True)
def test_what_counts_as_a_lost_database():
    """A terminated backend or a refused connection is lost, and so is a statement or a lock that
    ran past its bound (odal.core.database: a database too slow to answer is treated as one that does
    not); a refused statement and a broken constraint are the caller's to handle."""
    errors = {"refused connection": a_refused_connection()}
    victim = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    cut_connections()
    try:
        victim.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        errors["terminated backend"] = exc
    try:
        victim.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        errors["closed connection"] = exc
    refused = {}
    for name, statements in [
        ("statement timeout", ["SET LOCAL statement_timeout = 1", "SELECT pg_sleep(1)"]),
        ("bad value", ["SELECT 'x'::int"]),
        ("constraint", ["INSERT INTO outbox_consumer (id) VALUES (NULL)"]),
    ]:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                for sql in statements:
                    cursor.execute(sql)
        except (DataError, IntegrityError, OperationalError) as exc:
            refused[name] = exc
    with psycopg.connect(**connection.get_connection_params()) as holder:
        holder.execute("LOCK TABLE outbox_delivery")  # held until this block ends
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = 50")
                cursor.execute("LOCK TABLE outbox_delivery")
        except OperationalError as exc:
            refused["lock timeout"] = exc
    refused["serialization failure"] = a_serialization_failure()  # an OperationalError, and no loss
    assert sorted(errors) == ["closed connection", "refused connection", "terminated backend"]
    assert all(reconnect.is_lost(exc) for exc in errors.values()), errors
    assert sorted(refused) == [
        "bad value",
        "constraint",
        "lock timeout",
        "serialization failure",
        "statement timeout",
    ]
    timed_out = {name: refused.pop(name) for name in ("lock timeout", "statement timeout")}
    assert all(reconnect.is_lost(exc) for exc in timed_out.values()), timed_out
    assert not any(reconnect.is_lost(exc) for exc in refused.values()), refused
    assert reconnect.is_lost(reconnect.DatabaseLost(errors["terminated backend"]))


@pytest.mark.django_db(transaction=True)
def test_an_outage_backs_off_while_the_database_does_not_answer_and_logs_the_loss_and_the_recovery_once(
    monkeypatch, caplog
):
    real_port = connection.settings_dict["PORT"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there
    pauses = []

    def sleep(seconds):  # the database answers again after the seventh pause
        pauses.append(seconds)
        if len(pauses) == 7:
            connection.settings_dict["PORT"] = real_port

    monkeypatch.setattr(reconnect.time, "sleep", sleep)
    monkeypatch.setitem(connection.settings_dict, "PORT", closed)
    connection.close()
    try:
        assert reconnect.Outage("test loop").wait(OperationalError("lost"))
    finally:
        connection.settings_dict["PORT"] = real_port
    assert len(pauses) == 7  # one try at once, then one after each pause: no busy loop
    # Each pause is the doubled one (from FIRST_PAUSE, at most LONGEST_PAUSE), jittered down by
    # up to half.
    expected = [min(reconnect.FIRST_PAUSE * 2**n, reconnect.LONGEST_PAUSE) for n in range(7)]
    assert all(e / 2 <= p <= e for p, e in zip(pauses, expected, strict=True)), (pauses, expected)
    assert outage_lines(caplog, "test loop") == [line.format("test loop") for line in LOST_AND_BACK]
    assert "(8 tries)" in caplog.records[-1].getMessage()
    with connection.cursor() as cursor:  # the loop's connection works again
        cursor.execute("SELECT 1")


@pytest.mark.django_db(transaction=True)
def test_an_outage_gives_up_at_its_deadline_and_when_told_to_stop(monkeypatch):
    monkeypatch.setattr(reconnect, "check_database", lambda: (_ for _ in ()).throw(a_refused_connection()))
    monkeypatch.setattr(reconnect.time, "sleep", lambda seconds: None)
    assert not reconnect.Outage("test loop", deadline=time.monotonic() + 0.05).wait(OperationalError("lost"))
    assert not reconnect.Outage("test loop", should_stop=lambda: True).wait(OperationalError("lost"))


@pytest.mark.django_db(transaction=True)
def test_a_listening_sweep_whose_connections_are_cut_listens_and_leads_again(start, settings, caplog):
    """Only a NOTIFY can wake it in time (it polls every 60 s): a commit after the cut is
    delivered at once, and no django-q2 task was enqueued, because it leads again."""
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory()

    def listening(should_stop):
        with Listener.open() as listener:
            assert listener.try_lead()
            return sweep_listening(listener, poll_seconds=60, should_stop=should_stop)

    sweep = start(listening)
    assert wait_for(lambda: leader() is not None and loop_connections() == 2, 5)
    before = leader()
    assert cut_connections().count(LOOP) == 2  # its own connection and its listener's
    assert wait_for(lambda: leader() not in (None, before), 5), "the sweep did not take the lead again"
    with transaction.atomic():
        emit("passport.published", {"n": 1})
    assert wait_for(lambda: Delivery.objects.filter(status="delivered").exists(), 5)
    assert not OrmQ.objects.exists()  # it leads: the commit enqueued no sweep task
    sweep.stop()
    assert sweep.report.delivered == 1
    assert outage_lines(caplog, "outbox sweep") == [line.format("outbox sweep") for line in LOST_AND_BACK]


@pytest.mark.parametrize("loop", ["odal outbox sweep", "the django-q2 sweep task"])
@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_loses_the_database_during_an_attempt_writes_nothing_of_that_claim(
    loop, start, settings, caplog, monkeypatch
):
    """The connection is cut while the webhook answers: the outcome cannot be written, and is not
    written later either (not by the pass's last flush, not one by one, not as a write error),
    and the loop carries on. The row is due again after its hold: `odal outbox sweep` delivers
    it with the next claim (the receiver sees the same webhook-id twice, the attempt log one
    attempt, counted once); the task, idle once the row is held, returns."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    # The pass re-reads its consumers every REFRESH_SECONDS while the webhook answers: that read,
    # not the flush, would meet the cut first whenever it came before the answer (on a fast
    # machine, always), and the flush this test is about would never run.
    monkeypatch.setattr(sweep_pass, "REFRESH_SECONDS", 60)
    with WebhookServer(script=[("stall", 0.5, 204), 204]) as server:
        delivery = DeliveryFactory(consumer=WebhookConsumerFactory(url=server.url))
        if loop == "odal outbox sweep":
            sweep = start(
                lambda should_stop: sweep_listening(None, poll_seconds=0.1, should_stop=should_stop)
            )
        else:
            sweep = start(lambda should_stop: sweep_until_idle(max_seconds=50))
        assert wait_for(lambda: server.received, 5)
        cut_connections()  # while the first request is being answered
        if loop == "odal outbox sweep":
            assert wait_for(lambda: Delivery.objects.get(pk=delivery.pk).status == "delivered", 10)
            sweep.stop()
        else:
            sweep.join(15)
            assert sweep.error is None and sweep.report is not None, sweep.error
    row = Delivery.objects.get(pk=delivery.pk)
    lines = list(row.attempt_log.values_list("number", "outcome", "late"))
    report = sweep.report
    if loop == "odal outbox sweep":
        assert [r.headers["webhook-id"] for r in server.received] == [str(delivery.pk)] * 2
        assert lines == [(2, "delivered", False)], lines
        assert (report.delivered, report.failed, report.late, report.write_errors) == (1, 0, 0, 0)
    else:
        assert (row.status, row.attempts, lines) == ("pending", 1, [])  # held: due again after the hold
        assert (report.delivered, report.failed, report.late, report.write_errors) == (0, 0, 0, 0)
    assert outage_lines(caplog, "outbox sweep") == [line.format("outbox sweep") for line in LOST_AND_BACK]
    assert "one by one" not in caplog.text  # (an outcome lost with the database is not tried again)


@pytest.mark.django_db(transaction=True)
def test_a_python_consumer_gets_a_working_connection_after_the_database_was_lost(start, monkeypatch):
    """Python consumers run on the runner's thread, with a connection of its own, while the
    pass's thread reads their consumers again (a pause, a rotated secret) on its own: a cut one
    is replaced on each before the next pass's consumers run."""
    monkeypatch.setattr(sweep_pass, "REFRESH_SECONDS", 0)  # the pass reads at every look
    consumers.calls.clear()
    consumer = ConsumerFactory(target="tests.consumers.reads_the_database")
    sweep = start(lambda should_stop: sweep_listening(None, poll_seconds=0.05, should_stop=should_stop))
    DeliveryFactory(consumer=consumer)
    assert wait_for(lambda: len(consumers.calls) == 1, 5)
    cut_connections()
    second = DeliveryFactory(consumer=consumer)
    assert wait_for(lambda: Delivery.objects.get(pk=second.pk).status != "pending", 5)
    sweep.stop()
    assert Delivery.objects.get(pk=second.pk).status == "delivered", Delivery.objects.get(
        pk=second.pk
    ).last_error


@contextmanager
def connection_cut_at_first(statement: str, table: str):
    """The first `statement` (UPDATE, INSERT…) on `table` terminates its own backend, as a
    restart would at that moment (a sequence counts: it survives the transaction's end)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE odal_test_cut")
        cursor.execute(
            "CREATE FUNCTION odal_test_cut() RETURNS trigger AS $$ BEGIN "
            "IF nextval('odal_test_cut') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); "
            "PERFORM pg_sleep(5); END IF; RETURN NULL; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER odal_test_cut BEFORE {statement} ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION odal_test_cut()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER odal_test_cut ON {table}")
            cursor.execute("DROP FUNCTION odal_test_cut()")
            cursor.execute("DROP SEQUENCE odal_test_cut")


@pytest.mark.django_db(transaction=True)
def test_a_sweep_losing_the_database_in_its_bookkeeping_keeps_the_outcome_and_logs_no_error(start, caplog):
    """A consumer's failure streak is written after the flush that wrote the outcomes. If the
    database goes right then, the outcome stays written, the pass ends, and the loss is its
    loop's to ride out: no error from the bookkeeping, no traceback."""
    with WebhookServer(script=[500]) as server, connection_cut_at_first("UPDATE", "outbox_consumer"):
        delivery = DeliveryFactory(consumer=WebhookConsumerFactory(url=server.url))
        sweep = start(lambda should_stop: sweep_listening(None, poll_seconds=0.05, should_stop=should_stop))
        assert wait_for(lambda: Delivery.objects.get(pk=delivery.pk).attempt_log.exists(), 5)
        assert wait_for(lambda: len(outage_lines(caplog, "outbox sweep")) == 2, 5)
        sweep.stop()
    lines = list(Delivery.objects.get(pk=delivery.pk).attempt_log.values_list("number", "outcome", "late"))
    assert lines == [(1, "failed", False)]  # (the next attempt is half a minute away)
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info], caplog.text
    assert outage_lines(caplog, "outbox sweep") == [line.format("outbox sweep") for line in LOST_AND_BACK]


@pytest.mark.parametrize("loop", ["odal registry drain", "the django-q2 drain task"])
@pytest.mark.django_db(transaction=True)
def test_a_drain_that_loses_the_database_while_the_registry_answers_writes_nothing_of_that_claim(
    loop, start, registry_sim, settings, caplog
):
    """The connection is cut while the registry accepts the registration: that answer cannot
    be written, and nothing else is written in its place (no failed attempt, no write error).
    The row is due again after its hold; the registry answers that it holds the request already,
    which is adopted, and the registration goes through, held once by the registry."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    registry_sim.faults["latency"] = 0.5
    passport = PublishedPassportFactory()
    registration = Registration.objects.create(passport=passport)
    if loop == "odal registry drain":
        worker = start(lambda should_stop: drain.drain_forever(idle_sleep=0.05, should_stop=should_stop))
    else:  # (one that does not listen: on a one-worker cluster, or while another drain leads)
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 1}
        worker = start(lambda should_stop: registry_tasks.drain())
    assert wait_for(lambda: registry_sim.calls, 5)
    cut_connections()  # while the registry takes its time to answer
    assert wait_for(lambda: Registration.objects.get(pk=registration.pk).status == "registered", 15)
    if loop == "odal registry drain":
        worker.stop()
    else:
        worker.join(30)
        assert worker.error is None and worker.report is not None
    lines = list(
        Registration.objects.get(pk=registration.pk)
        .attempt_log.order_by("started_at")
        .values_list("number", "operation", "outcome", "late")
    )
    # Nothing of attempt 1 (not failed, not a write error); attempt 2 finds the registry holding
    # the request attempt 1 made, and adopts it; the check (its own count) finds it registered.
    assert lines == [(2, "register", "duplicate", False), (1, "check", "registered", False)], lines
    assert [request["upi"] for request in registry_sim.requests.values()] == [passport.upi]
    assert outage_lines(caplog, "registry drain") == [line.format("registry drain") for line in LOST_AND_BACK]
    # (nor is the lost outcome reported as one the database refused)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_drain_that_loses_the_database_while_writing_an_outcome_writes_nothing_in_its_place(
    start, registry_sim, settings, caplog
):
    """The concurrent drain writes a run of outcomes in one transaction: the connection is cut
    in the middle of it (at the attempt log's INSERT, after the outcome's UPDATE). Nothing of that
    run lands, nothing is written in its place (no write error, no error logged), and the row,
    due again after its hold, goes through with the registry's DUPLICATE_UPI."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    passport = PublishedPassportFactory()
    registration = Registration.objects.create(passport=passport)
    with connection_cut_at_first("INSERT", "registry_registrationattempt"):
        worker = start(lambda should_stop: drain.drain_forever(idle_sleep=0.05, should_stop=should_stop))
        assert wait_for(lambda: Registration.objects.get(pk=registration.pk).status == "registered", 15)
        worker.stop()
    lines = list(
        Registration.objects.get(pk=registration.pk)
        .attempt_log.order_by("started_at")
        .values_list("number", "operation", "outcome", "late")
    )
    assert lines == [(2, "register", "duplicate", False), (1, "check", "registered", False)], lines
    assert outage_lines(caplog, "registry drain") == [line.format("registry drain") for line in LOST_AND_BACK]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_relay_turn_that_loses_the_database_leads_again_and_still_hands_over(
    start, settings, caplog, monkeypatch
):
    """The django-q2 task path: a leading turn whose connections are cut waits for the database
    within its turn, leads again, and at the end of the turn still enqueues its successor, so
    the relay goes on."""
    settings.ODAL_KICK_SWEEP = True
    # A turn long enough that, on a busy machine, the cut and the lead taken again land inside it
    # (the waits below end as soon as what they wait for happens: they cost nothing on a fast one).
    monkeypatch.setattr(wake, "TURN_SECONDS", 12.0)
    DeliveryFactory(consumer=ConsumerFactory(), next_attempt_at=time_from_now(hours=1))  # pending work

    relay = start(lambda should_stop: tasks.sweep())
    assert wait_for(lambda: leader() is not None and loop_connections() == 2, 30)
    before = leader()
    cut_connections()
    assert wait_for(lambda: leader() not in (None, before), 30), "the turn did not take the lead again"
    relay.join(45)
    assert relay.error is None, relay.error
    (queued,) = OrmQ.objects.all()
    assert queued.task["func"] == "outbox.tasks.sweep" and queued.task["kwargs"] == {"relay": True}
    assert outage_lines(caplog, "outbox sweep") == [line.format("outbox sweep") for line in LOST_AND_BACK]


def time_from_now(**delta):
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(**delta)


@pytest.mark.django_db(transaction=True)
def test_a_sweep_and_a_drain_started_while_the_database_is_down_wait_for_it(settings, registry_sim):
    """`odal outbox sweep` and `odal registry drain` started while their database refuses
    connections (a host booting before its database, or cut off from it) wait for it instead of
    exiting, then deliver and register what was published meanwhile."""
    import os
    import signal
    import subprocess
    import sys
    from urllib.parse import urlparse

    from odal.surfaces import lifecycle
    from tests.factories import PassportFactory
    from tests.tcp_proxy import TcpProxy
    from tests.test_django_q import database_url

    real = urlparse(database_url())
    proxy = TcpProxy((real.hostname, real.port))
    proxy.refuse()  # the database "is down" before either process starts
    env = {
        **os.environ,
        "DATABASE_URL": real._replace(netloc=f"{real.username}@127.0.0.1:{proxy.port}").geturl(),
        "ODAL_REGISTRY_URL": settings.ODAL_REGISTRY_URL,
        "ODAL_REGISTRY_TOKEN": settings.ODAL_REGISTRY_TOKEN,
        "ODAL_REGISTRY_CHECK_SECONDS": "0",
        "ODAL_KICK_SWEEP": "false",
    }
    argvs = (["outbox", "sweep"], ["registry", "drain"])
    procs = [
        subprocess.Popen([sys.executable, "-m", "odal", *argv], env=env, stderr=subprocess.PIPE, text=True)
        for argv in argvs
    ]
    said = [[], []]  # each process's stderr lines, read as they come
    readers = [threading.Thread(target=lambda p=p, lines=lines: lines.extend(p.stderr), daemon=True)
               for p, lines in zip(procs, said, strict=True)]  # fmt: skip
    for reader in readers:
        reader.start()
    try:
        with WebhookServer() as server:
            WebhookConsumerFactory(url=server.url, event_types=["passport.published"])
            # Each has started and found the database down (however long a busy machine takes to
            # start them), or given up; then a while for one that gives up to have exited.
            wait_for(
                lambda: (
                    all("lost the database" in "".join(lines) for lines in said)
                    or any(p.poll() is not None for p in procs)
                ),
                60,
            )
            time.sleep(2)
            assert [p.poll() for p in procs] == [None, None], "a process exited while the database was down"
            passport = PassportFactory()
            lifecycle.publish(passport.pk, actor="test")
            proxy.restore()

            def done():
                reg = Registration.objects.get(passport=passport)
                return server.received and reg.status == "registered"

            assert wait_for(done, 20), "nothing was delivered and registered after the database came back"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p, reader in zip(procs, readers, strict=True):
            p.wait(timeout=20)
            reader.join(timeout=5)
        logs = ["".join(lines) for lines in said]
        proxy.close()
    for argv, log in zip(argvs, logs, strict=True):
        assert "lost the database" in log and "the database answers again" in log, (argv, log[-2000:])
        assert "Traceback" not in log, (argv, log[-2000:])
