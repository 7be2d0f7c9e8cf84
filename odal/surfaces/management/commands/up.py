import fcntl
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from odal.core import rules, stopping
from odal.core.cli import argument, usage_error
from odal.core.database import embedded


class Command(BaseCommand):
    help = (
        "Start the web server, the django-q2 worker (sweeps and drains), the demo webhook receiver and the registry simulator together "
        "(what `make run` runs); Ctrl-C stops all. If one of them exits, the others are stopped and "
        "`odal up` exits 1, naming it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="HOST:PORT of the web server")
        parser.add_argument(
            "--receiver-port",
            type=argument(rules.port),
            default=8200,
            help="port of the demo webhook receiver",
        )
        parser.add_argument(
            "--registry-port", type=argument(rules.port), default=8100, help="port of the registry simulator"
        )

    def processes(
        self, addr: str, receiver_port: int = 8200, registry_port: int = 8100
    ) -> list[tuple[str, list[str]]]:
        # Each with --skip-checks: this command ran the system checks as it started, and printed
        # what they found once (odal.W001), not once more per process.
        python = sys.executable
        return [
            ("web", [python, "-m", "odal", "runserver", addr, "--noreload", "--skip-checks"]),
            ("worker", [python, "-m", "odal", "qcluster", "--skip-checks"]),
            (
                "receiver",
                [python, "-m", "odal", "outbox", "--skip-checks", "receive", "--port", str(receiver_port)],
            ),
            (
                "registry simulator",
                [
                    python,
                    "-m",
                    "odal",
                    "registry",
                    "--skip-checks",
                    "simulate",
                    "--port",
                    str(registry_port),
                    "--fault",
                    "reject_upi_containing=REFUSE",
                    "--fault",
                    "refuse_upi_containing=OUTAGE",
                    "--fault",
                    "checks_until_registered=2",
                ],
            ),  # fmt: skip
        ]

    def handle(self, *args, addr, receiver_port=8200, registry_port=8100, **options):
        try:  # checked here, not by argparse, so that call_command too sees a usage error (exit 2)
            addr = rules.address(addr)
        except ValueError as exc:
            raise usage_error("--addr", addr, exc) from None
        children = []
        died = []  # (name, how) of the children that exited on their own
        owns_database = self.own_the_embedded_database()
        # The embedded server this `odal up` stops is one of its processes: one that dies (the OOM
        # killer, a kill -9) is named and stops the others, as a child does. Else the web side
        # answered 503 and the worker waited for a database that nothing would start again.
        postmaster = embedded.Server(settings.ODAL_EMBEDDED_DATABASE).postmaster() if owns_database else None
        # (past ODAL_STOP_SECONDS it ends the children that are left, and itself). A terminal that
        # hangs up (SIGHUP: an ssh session dropped) or Ctrl-\ (SIGQUIT) reaches this process alone
        # (its children have sessions of their own): they stop it too, else they ended it at once
        # and left its processes running, ports and all.
        stopping.on_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))
        env = {**os.environ, "ODAL_STOP_SECONDS": str(child_stop_seconds())}
        for name, argv in self.processes(addr, receiver_port, registry_port):
            self.stdout.write(f"starting {name}: {' '.join(argv[2:])}")
            children.append((name, subprocess.Popen(argv, env=env, start_new_session=True)))
        self.stdout.write(
            f"odal is up: http://{addr}/admin/ and http://{addr}/vault/api/v1/docs — Ctrl-C stops."
        )
        try:
            while not stopping.requested():
                died = [
                    (name, exited(child.returncode)) for name, child in children if child.poll() is not None
                ]
                if postmaster is not None and not postmaster.is_running():
                    died.append(
                        (
                            "embedded PostgreSQL",
                            f"pid {postmaster.pid} gone; the next start recovers its data",
                        )
                    )
                if died:
                    for name, how in died:
                        self.stderr.write(f"{name} exited ({how}); stopping the others.")
                    stopping.ask(signal.SIGTERM)
                    break
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
        if died:
            named = ", ".join(f"the {name} ({how})" for name, how in died)
            own = "its own" if len(died) == 1 else "their own"
            raise CommandError(f"{named} exited on {own}; odal up stopped the others.", returncode=1)

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


def exited(returncode: int) -> str:
    """How a child ended, in words: its exit code, or the signal that ended it."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def child_stop_seconds() -> int:
    """Each child's ODAL_STOP_SECONDS: short enough that it has stopped, or been ended, before
    this process must have."""
    return max(1, settings.ODAL_STOP_SECONDS - 2)
