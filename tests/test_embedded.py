"""Issue 39: DATABASE_URL unset means an embedded PostgreSQL (odal.core.database.embedded), in a folder
of its own (ODAL_PG_DIR here, var/pg for `make run`), started by odal's command line: it comes up
on an empty folder, claims skip locked rows there, keeps its data between runs, reuses a server
that runs, and recovers from a killed server's lock. A SQLite URL is refused.

Each test drives real `odal` commands against a real embedded server (no DATABASE_URL)."""

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from odal.core import stopping
from odal.core.database import embedded
from tests.pg import free_port
from tests.test_up import listening
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def odal(folder: Path, *args: str, **changes) -> subprocess.CompletedProcess:
    """`odal …` with DATABASE_URL unset and the embedded server's folder `folder`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ODAL_TEST_DATABASE")}
    env.update(ODAL_PG_DIR=str(folder), ODAL_KICK_SWEEP="false", **changes)
    return subprocess.run(
        [sys.executable, "-m", "odal", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def shell(folder: Path, code: str) -> subprocess.CompletedProcess:
    return odal(folder, "shell", "--no-imports", "-c", code)


def postmaster_pid(folder: Path) -> int:
    return int((folder / "data" / "postmaster.pid").read_text().split("\n", 1)[0])


def sql(folder: Path, statement: str):
    with psycopg.connect(embedded.url(folder)) as connection:
        return connection.execute(statement).fetchall()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An empty folder, the embedded server's; migrated by the first test's `odal migrate`."""
    where = tmp_path_factory.mktemp("embedded") / "pg"
    yield where
    embedded.Server(where).stop()


@pytest.fixture(scope="module")
def migrated(folder):
    done = odal(folder, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_odal_on_an_empty_folder_comes_up_on_postgresql(folder, migrated):
    assert "started the embedded PostgreSQL in" in migrated.stderr
    assert (folder / "data" / "PG_VERSION").read_text().strip() == "18"
    assert sql(folder, "SELECT current_setting('listen_addresses')") == [("",)]  # a socket, no TCP port
    assert ("outbox_delivery",) in sql(folder, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    assert "Traceback" not in migrated.stderr


TWO_CLAIMS = """
import json, threading
from django.db import transaction
from outbox.models import Consumer, Delivery, Event
consumer = Consumer.objects.create(name="skip-locked", kind="python", target="outbox.receiver.accept")
for _ in range(4):
    Delivery.objects.create(event=Event.objects.create(type="t"), consumer=consumer)
holding, done, taken = threading.Event(), threading.Event(), {}
def first():
    with transaction.atomic():  # the claim's row locks held until this commits
        taken["first"] = [str(r.pk) for r in Delivery.objects.claim(limit=2, hold_seconds=300).rows]
        holding.set()
        done.wait(60)
thread = threading.Thread(target=first)
thread.start()
holding.wait(60)
taken["second"] = [str(r.pk) for r in Delivery.objects.claim(limit=10, hold_seconds=300).rows]
done.set()
thread.join()
print(json.dumps(taken))
"""


def test_two_claims_on_the_embedded_server_take_different_rows_without_waiting(folder, migrated):
    """One claim holds its two rows' locks (its transaction open) while another claims: the second
    skips the locked rows (SKIP LOCKED) and takes the other two at once."""
    done = shell(folder, TWO_CLAIMS)
    assert done.returncode == 0, done.stderr[-3000:]
    taken = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(taken["first"]) == 2 and len(taken["second"]) == 2, taken
    assert not set(taken["first"]) & set(taken["second"])


def test_a_second_start_reuses_the_running_server_and_a_stopped_one_keeps_its_data(folder, migrated):
    made = shell(
        folder,
        "from outbox.models import Consumer; Consumer.objects.create(name='kept', kind='python', target='outbox.receiver.accept')",
    )
    assert made.returncode == 0, made.stderr[-3000:]
    running = postmaster_pid(folder)
    again = shell(
        folder, "from outbox.models import Consumer; print(Consumer.objects.filter(name='kept').count())"
    )
    assert (again.returncode, again.stdout.strip()) == (0, "1"), again.stderr[-3000:]
    assert "started the embedded PostgreSQL" not in again.stderr  # (it answered: reused)
    assert postmaster_pid(folder) == running

    embedded.Server(folder).stop()
    assert not (folder / "data" / "postmaster.pid").exists()
    cluster_made = (folder / "data" / "PG_VERSION").stat().st_mtime_ns
    after = shell(
        folder, "from outbox.models import Consumer; print(Consumer.objects.filter(name='kept').count())"
    )
    assert (after.returncode, after.stdout.strip()) == (0, "1"), after.stderr[-3000:]
    assert "started the embedded PostgreSQL" in after.stderr
    assert (folder / "data" / "PG_VERSION").stat().st_mtime_ns == cluster_made  # (no second initdb)


def kill_the_server(folder: Path) -> None:
    """SIGKILL the postmaster and wait for it and its processes to go: its postmaster.pid stays."""
    postmaster = psutil.Process(postmaster_pid(folder))
    family = [postmaster, *postmaster.children()]
    os.kill(postmaster.pid, signal.SIGKILL)
    psutil.wait_procs(family, timeout=30)
    assert (folder / "data" / "postmaster.pid").exists()


@pytest.mark.parametrize("left", ["a killed server's", "a pid since reused", "another cluster's server"])
def test_a_lock_left_by_a_killed_server_is_recovered(folder, migrated, left, tmp_path):
    before = shell(
        folder,
        "from outbox.models import Consumer; Consumer.objects.get_or_create(name='survives', kind='python', target='outbox.receiver.accept')",
    )
    assert before.returncode == 0, before.stderr[-3000:]
    kill_the_server(folder)
    lock = folder / "data" / "postmaster.pid"
    if left == "a pid since reused":  # (a container restarted: the pid is now another program's)
        lines = lock.read_text().split("\n")
        # The server's own user's (PostgreSQL takes over a lock whose pid it may not signal).
        sleeper = subprocess.Popen(["sleep", "120"], **embedded.as_user(embedded.server_user()))
        lock.write_text("\n".join([str(sleeper.pid), *lines[1:]]))
    other = embedded.Server(tmp_path / "other")
    if left == "another cluster's server":  # (a second checkout's var/pg, started after a reboot)
        other.start()
        lines = lock.read_text().split("\n")
        lock.write_text("\n".join([str(other.processes()[0].pid), *lines[1:]]))
    try:
        started = time.monotonic()
        after = shell(
            folder,
            "from outbox.models import Consumer; print(Consumer.objects.filter(name='survives').count())",
        )
    finally:
        if left == "a pid since reused":
            sleeper.kill()
            sleeper.wait()
        other.stop()
    assert (after.returncode, after.stdout.strip()) == (0, "1"), after.stderr[-3000:]
    assert "started the embedded PostgreSQL" in after.stderr
    assert time.monotonic() - started < 120


def test_two_migrates_at_once_both_succeed(folder, migrated):
    """Two `odal migrate` at once on a database that lacks a migration (two `make run` started
    together on an empty var/, replicas that each migrate as they start): both read what is
    applied before either writes, here held at that read by a lock on django_migrations until
    both wait, then let go together. Before: both applied sessions.0001, and the second died with a
    traceback (duplicate key value violates unique constraint "pg_type_typname_nsp_index")."""
    with psycopg.connect(embedded.url(folder, "postgres"), autocommit=True) as connection:
        connection.execute("DROP DATABASE IF EXISTS race WITH (FORCE)")
        connection.execute("CREATE DATABASE race")
    race = {"DATABASE_URL": embedded.url(folder, "race")}
    for args in (("migrate", "--noinput"), ("migrate", "--noinput", "sessions", "zero")):
        done = odal(folder, *args, **race)
        assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ODAL_TEST_DATABASE")}
    env.update(ODAL_PG_DIR=str(folder), ODAL_KICK_SWEEP="false", **race)
    with psycopg.connect(race["DATABASE_URL"]) as holder:
        holder.execute("LOCK TABLE django_migrations IN ACCESS EXCLUSIVE MODE")
        both = [
            subprocess.Popen(
                [sys.executable, "-m", "odal", "migrate", "--noinput"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for _ in range(2)
        ]
        deadline = time.monotonic() + 120
        while sql(
            folder,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'race' AND wait_event_type = 'Lock'",
        ) != [(2,)]:
            assert time.monotonic() < deadline and all(p.poll() is None for p in both), [
                p.communicate() for p in both
            ]
            time.sleep(0.05)
        holder.commit()  # (both let go together)
    said = [p.communicate(timeout=120) for p in both]
    assert [p.returncode for p in both] == [0, 0], [err[-3000:] for _, err in said]
    with psycopg.connect(race["DATABASE_URL"]) as connection:
        applied = connection.execute(
            "SELECT count(*) FROM django_migrations WHERE app = 'sessions'"
        ).fetchone()
    assert applied == (1,)


@pytest.mark.parametrize("why", ["read-only", "not a folder"])
def test_a_folder_this_user_cannot_use_is_a_sentence_not_a_traceback(why):
    """A read-only var/ (or one `sudo make run` made another user's), or a file where the folder
    should be: exit 1 and a sentence naming the folder and what to do, not a PermissionError's
    traceback."""
    parent = Path(tempfile.mkdtemp(prefix="odal-ro-"))
    try:
        parent.chmod(0o755)
        as_other = []
        if why == "read-only":
            if os.geteuid() == 0:  # (root writes anywhere: the folder is root's, odal runs as nobody)
                nobody = pwd.getpwnam("nobody")
                as_other = [
                    "setpriv",
                    f"--reuid={nobody.pw_uid}",
                    f"--regid={nobody.pw_gid}",
                    "--clear-groups",
                ]
            else:
                parent.chmod(0o555)
            folder = parent / "pg"
        else:
            (parent / "var").write_text("a file")
            folder = parent / "var" / "pg"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ODAL_TEST_DATABASE")}
        env.update(ODAL_PG_DIR=str(folder), ODAL_KICK_SWEEP="false", HOME=str(parent))
        done = subprocess.run(
            [*as_other, sys.executable, "-m", "odal", "check"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        parent.chmod(0o755)
        shutil.rmtree(parent)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = done.stderr.strip()
    assert said.startswith(f"odal cannot start the embedded PostgreSQL: {folder}"), said
    assert "set ODAL_PG_DIR to another folder, or set DATABASE_URL" in said, said


def test_a_folder_whose_name_pg_ctls_shell_would_read_is_refused_at_once(tmp_path):
    """pg_ctl starts the server through a shell, its data folder and log in double quotes: a `$`
    there is read, not kept. Before: a minute of retries, then "did not start" and an empty log."""
    folder = tmp_path / "d$x" / "pg"
    started = time.monotonic()
    done = odal(folder, "check")
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip() == (
        f"odal cannot start the embedded PostgreSQL: the embedded PostgreSQL's folder {folder} holds $, which "
        "pg_ctl's shell would read, not keep (its data folder and log are passed in double quotes): set "
        "ODAL_PG_DIR to a folder without them"
    )
    assert time.monotonic() - started < 30 and not folder.exists()


def test_a_socket_path_too_long_in_bytes_moves_to_the_temporary_directory(tmp_path):
    """The socket's limit (107 bytes on Linux) is in bytes: 30 CJK characters are 90 of them.
    Before: the folder's path was counted in characters, and PostgreSQL refused to start
    ("Unix-domain socket path … is too long (maximum 107 bytes)") after a minute of retries."""
    root = Path("/tmp") / ("数" * 30) / "pg"  # 37 characters, 103 bytes
    assert len(str(root / ".s.PGSQL.5432")) < embedded.SOCKET_PATH_MAX
    assert embedded.socket_dir(root) != root.resolve()
    assert embedded.socket_dir(tmp_path) == tmp_path.resolve()


def test_a_socket_folder_in_the_temporary_directory_others_may_write_is_refused(tmp_path):
    """A folder whose path is too long for a socket puts it in /tmp/odal-pg-<hash of the path>, a
    name anyone can work out: one made first by someone else (here: writable by all) could hold
    their socket, which odal would take for its server. It is refused, not used."""
    folder = tmp_path / ("long" * 30) / "pg"
    where = embedded.socket_dir(folder)
    assert where != folder.resolve()
    where.mkdir(mode=0o777, exist_ok=True)
    where.chmod(0o777)  # (mkdir's mode is cut by the umask)
    try:
        done = odal(folder, "check")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip() == (
        f"odal cannot start the embedded PostgreSQL: the embedded PostgreSQL's socket folder {where} (its "
        f"folder's path, {folder}, is too long for a socket) is not a folder of this user's that only it may "
        "write; remove it, or set ODAL_PG_DIR to a shorter path"
    )
    assert not (folder / "data").exists()


def test_a_sqlite_url_is_refused_with_a_sentence_naming_the_variable(tmp_path):
    database = tmp_path / "odal.sqlite3"
    done = odal(tmp_path / "pg", "migrate", "--noinput", DATABASE_URL=f"sqlite:///{database}")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "odal cannot start: DATABASE_URL is a SQLite URL, and odal runs on PostgreSQL only: set DATABASE_URL "
        "to a postgres://user@host:port/odal URL, or unset it to use the embedded PostgreSQL under var/pg"
    )
    assert not database.exists() and not (tmp_path / "pg").exists()


def test_make_test_runs_on_the_embedded_server_when_told_even_where_a_server_answers():
    """ODAL_TEST_SERVER=embedded: tests/pg.py starts a throwaway embedded PostgreSQL (18, the
    wheel's) rather than take the server on 127.0.0.1:5432, and names it in DATABASE_URL."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["ODAL_TEST_SERVER"] = "embedded"
    probe = (
        "import os, psycopg; url = os.environ['DATABASE_URL']; "
        "print(url, psycopg.connect(url.rsplit('/', 1)[0] + '/postgres').info.server_version)"
    )
    done = subprocess.run(
        [sys.executable, "tests/pg.py", "--", sys.executable, "-c", probe],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting a throwaway embedded PostgreSQL" in done.stdout
    url, version = done.stdout.strip().splitlines()[-1].split()
    assert url.startswith("postgres://postgres@127.0.0.1:") and ":5432/" not in url
    assert int(version) // 10000 == 18


def test_odal_up_names_its_embedded_server_killed_under_it_and_exits_1(folder, migrated, tmp_path):
    """`odal up` owns the embedded server it stops: one killed under it (the OOM killer, kill -9)
    is named, the others are stopped, and it exits 1, as for any of its processes (issue 37 item
    9d). Before: it ran on, its web side answering 503 and its worker waiting, for ever, for a
    database nothing would start again."""
    made = shell(
        folder,
        "from outbox.models import Consumer; Consumer.objects.get_or_create(name='demo-receiver', kind='webhook', "
        "defaults={'url': 'http://127.0.0.1:9/hooks'})",
    )
    assert made.returncode == 0, made.stderr[-3000:]
    stop_seconds = 10
    web, receiver, registry = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ODAL_TEST_DATABASE")}
    env.update(ODAL_PG_DIR=str(folder), ODAL_KICK_SWEEP="false", ODAL_STOP_SECONDS=str(stop_seconds))
    argv = [sys.executable, "-m", "odal", "up", "--addr", f"127.0.0.1:{web}"]
    argv += ["--receiver-port", str(receiver), "--registry-port", str(registry)]
    with (tmp_path / "up.log").open("w+") as log:
        up = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        children = []
        try:
            assert wait_for(lambda: all(map(listening, (web, receiver, registry))), 90), (
                tmp_path / "up.log"
            ).read_text()[-3000:]
            children = stopping.descendants(up.pid)
            kill_the_server(folder)
            died = time.monotonic()
            code = up.wait(timeout=stop_seconds + 30)
            seconds = time.monotonic() - died
        finally:
            if up.poll() is None:
                for pid in children or stopping.descendants(up.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        said = (tmp_path / "up.log").read_text()
    assert code == 1, (code, said[-3000:])
    assert "embedded PostgreSQL exited (pid " in said and "the next start recovers its data" in said, said[
        -3000:
    ]
    assert seconds <= stop_seconds + 5, (seconds, said[-3000:])
