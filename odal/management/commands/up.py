import fcntl
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from odal import rules, stopping
from odal.cli import usage_error
from odal.database import embedded


class Command(BaseCommand):
    help = (
        "Start the web server, the django-q2 worker (sweeps and drains), the demo webhook receiver and the registry simulator together "
        "(what `make run` runs); Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="HOST:PORT of the web server")

    def processes(self, addr: str) -> list[tuple[str, list[str]]]:
        python = sys.executable
        return [
            ("web", [python, "-m", "odal", "runserver", addr, "--noreload"]),
            ("worker", [python, "-m", "odal", "qcluster"]),
            ("receiver", [python, "-m", "odal", "outbox", "receive", "--port", "8200"]),
            (
                "registry simulator",
                [
                    python,
                    "-m",
                    "odal",
                    "registry",
                    "simulate",
                    "--port",
                    "8100",
                    "--fault",
                    "refuse_upi_containing=REFUSE",
                    "--fault",
                    "checks_until_registered=2",
                ],
            ),  # fmt: skip
        ]

    def handle(self, *args, addr, **options):
        try:  # checked here, not by argparse, so that call_command too sees a usage error (exit 2)
            addr = rules.address(addr)
        except ValueError as exc:
            raise usage_error("--addr", addr, exc) from None
        children = []
        owns_database = self.own_the_embedded_database()
        stopping.on_signals()  # (past ODAL_STOP_SECONDS it ends the children that are left, and itself)
        env = {**os.environ, "ODAL_STOP_SECONDS": str(child_stop_seconds())}
        for name, argv in self.processes(addr):
            self.stdout.write(f"starting {name}: {' '.join(argv[2:])}")
            children.append((name, subprocess.Popen(argv, env=env, start_new_session=True)))
        self.stdout.write(
            f"odal is up: http://{addr}/admin/ and http://{addr}/vault/api/v1/docs — Ctrl-C stops."
        )
        try:
            while not stopping.requested():
                for name, child in children:
                    if child.poll() is not None and not stopping.requested():
                        self.stderr.write(f"{name} exited with {child.returncode}; stopping the rest.")
                        stopping.ask(signal.SIGTERM)
                time.sleep(0.3)
        finally:
            for _, child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            # Each child stops within its own (shorter) ODAL_STOP_SECONDS; one that has not is
            # ended with its processes, before this process's own clock runs out.
            deadline = time.monotonic() + (stopping.remaining() or 0) - 0.5
            for name, child in children:
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.stderr.write(f"{name} did not stop in time; ending it.")
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
            if owns_database:
                embedded.Server(settings.ODAL_EMBEDDED_DATABASE).stop()
                self.stdout.write(f"stopped the embedded PostgreSQL in {settings.ODAL_EMBEDDED_DATABASE}.")
            self.stdout.write("stopped.")

    def own_the_embedded_database(self) -> bool:
        """DATABASE_URL unset: this `odal up` stops the embedded server as it stops (odal's command
        line started it, or found it running), unless another `odal up` uses it: the first holds
        var/pg/up.lock for its life."""
        if settings.ODAL_EMBEDDED_DATABASE is None:
            return False
        # (held open, with its lock, for the life of this command)
        self.up_lock = open(embedded.Server(settings.ODAL_EMBEDDED_DATABASE).root / "up.lock", "a")  # noqa: SIM115
        try:
            fcntl.flock(self.up_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.stderr.write(
                "another `odal up` uses the embedded PostgreSQL: it stays running after this one."
            )
            return False
        return True


def child_stop_seconds() -> int:
    """Each child's ODAL_STOP_SECONDS: short enough that it has stopped, or been ended, before
    this process must have."""
    return max(1, settings.ODAL_STOP_SECONDS - 2)
