"""odal registry drain: claim due registrations and do what each owes, once or until a signal."""

from django.conf import settings

from odal import rules
from odal.cli import argument, run_until_signalled
from registry.drain import drain_forever, drain_until_idle


def add_arguments(sub) -> None:
    drain = sub.add_parser("drain", help="claim due registrations and do what each owes")
    drain.add_argument("--once", action="store_true", help="one pass, then exit")
    drain.add_argument(
        "--batch", type=argument(rules.batch_size), default=50, help="rows per pass (1 to 10,000)"
    )
    drain.set_defaults(handler=handle)


def handle(command, *, once, batch, **_):
    if once:
        report = drain_until_idle(batch=batch, max_seconds=0, linger_seconds=0)
        command.stdout.write(f"Drained once: {report.summary()}.")
        return
    command.stdout.write(
        f"Draining until interrupted (Ctrl-C or SIGTERM: no new attempts, stopped within "
        f"{settings.ODAL_STOP_SECONDS}s)…"
    )
    report = run_until_signalled(drain_forever, batch=batch)
    command.stdout.write(f"Stopped after {report.passes} passes: {report.summary()}.")
