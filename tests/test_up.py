"""`odal up` for real (issue 37, item 9d): a child that dies stops the others, is named, and makes
`odal up` exit non-zero; the system checks' warnings are printed once per start, not by every child."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from odal.core import stopping
from tests.factories import WebhookConsumerFactory
from tests.pg import free_port
from tests.test_bounds import MARGIN
from tests.test_django_q import database_url
from tests.waiting import wait_for


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def gone(pid: int) -> bool:
    """Ended (a zombie not yet reaped by init counts as ended)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # its worker and web server use the test database
def test_odal_up_names_a_child_that_died_stops_the_others_and_exits_1(tmp_path):
    stop_seconds = 10
    web, receiver, registry = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_STOP_SECONDS": str(stop_seconds),
        "ODAL_KICK_SWEEP": "false",
        # A claim hold not longer than a registry request: odal.W001, from the settings alone.
        "ODAL_CLAIM_HOLD_SECONDS": "10",
        "ODAL_REGISTRY_TIMEOUT_SECONDS": "10",
        "ODAL_REGISTRY_LOOKUP_SECONDS": "5",
        "ODAL_REGISTRY_URL": f"http://127.0.0.1:{registry}",
        "ODAL_Q_LOG_LEVEL": "INFO",  # (its "running" line says the worker is up)
    }
    WebhookConsumerFactory(name="demo-receiver", url=f"http://127.0.0.1:{receiver}/hooks")  # (its secret)
    argv = [sys.executable, "-m", "odal", "up", "--addr", f"127.0.0.1:{web}"]
    argv += ["--receiver-port", str(receiver), "--registry-port", str(registry)]

    def up_and_running() -> bool:  # (the worker's cluster forks once its checks have run)
        worker = [pid for pid in stopping.descendants(up.pid) if " qcluster" in command_line(pid)]
        return all(map(listening, (web, receiver, registry))) and len(worker) > 1

    with (tmp_path / "up.log").open("w+") as log:
        up = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        children = []
        try:
            assert wait_for(up_and_running, 90), (tmp_path / "up.log").read_text()[-3000:]
            children = stopping.descendants(up.pid)
            (killed,) = [pid for pid in children if " receive " in command_line(pid)]
            os.kill(killed, signal.SIGKILL)
            died = time.monotonic()
            code = up.wait(timeout=stop_seconds + 10)
            seconds = time.monotonic() - died
        finally:
            if up.poll() is None:  # (its processes each have a session of their own: ended one by one)
                for pid in children or stopping.descendants(up.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        said = (tmp_path / "up.log").read_text()
    assert code == 1, (code, said[-3000:])
    assert "receiver exited (killed by SIGKILL); stopping the others" in said, said[-3000:]
    assert seconds <= stop_seconds + MARGIN, (seconds, said[-3000:])
    assert all(gone(pid) for pid in children), [command_line(pid) for pid in children if not gone(pid)]
    assert said.count("odal.W001") == 1, said[-5000:]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_odal_up_stops_its_processes_when_its_terminal_hangs_up_or_quits(tmp_path, signum):
    """A terminal closed (an ssh session dropped: SIGHUP) or Ctrl-\\ (SIGQUIT) reaches `odal up`
    alone (its processes have sessions of their own): it stops them as for SIGTERM and exits.
    Before: it died at once and left them all running (the web server still answering on its
    port, the worker still claiming), so the next `make run` found its ports taken."""
    stop_seconds = 10
    web, receiver, registry = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_STOP_SECONDS": str(stop_seconds),
        "ODAL_KICK_SWEEP": "false",
        "ODAL_REGISTRY_URL": f"http://127.0.0.1:{registry}",
    }
    WebhookConsumerFactory(name="demo-receiver", url=f"http://127.0.0.1:{receiver}/hooks")
    argv = [sys.executable, "-m", "odal", "up", "--addr", f"127.0.0.1:{web}"]
    argv += ["--receiver-port", str(receiver), "--registry-port", str(registry)]

    def up_and_running() -> bool:
        worker = [pid for pid in stopping.descendants(up.pid) if " qcluster" in command_line(pid)]
        return all(map(listening, (web, receiver, registry))) and len(worker) > 1

    with (tmp_path / "up.log").open("w+") as log:
        up = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        children = []
        try:
            assert wait_for(up_and_running, 90), (tmp_path / "up.log").read_text()[-3000:]
            children = stopping.descendants(up.pid)
            os.kill(up.pid, signum)
            up.wait(timeout=stop_seconds + 10)
            assert wait_for(lambda: all(gone(pid) for pid in children), 5), [
                command_line(pid) for pid in children if not gone(pid)
            ]
        finally:
            for pid in children:  # (each has a session of its own: ended one by one)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        said = (tmp_path / "up.log").read_text()
    assert "stopped." in said, said[-3000:]
    assert not listening(web)
