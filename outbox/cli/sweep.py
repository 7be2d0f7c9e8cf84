"""odal outbox sweep: claim due deliveries and run them, once or until a signal."""

from django.conf import settings

from odal import rules
from odal.cli import argument, run_until_signalled
from outbox.sweep import sweep_forever, sweep_until_idle


def add_arguments(sub) -> None:
    sweep = sub.add_parser("sweep", help="claim due deliveries and run them")
    sweep.add_argument("--once", action="store_true", help="one pass, then exit")
    sweep.add_argument(
        "--batch", type=argument(rules.batch_size), default=100, help="rows per pass (1 to 10,000)"
    )
    sweep.set_defaults(handler=handle)


def handle(command, *, once, batch, **_):
    if once:
        report = sweep_until_idle(batch=batch, max_seconds=0)
        command.stdout.write(f"Swept once: {report.summary()}.")
        return
    command.stdout.write(
        f"Sweeping until interrupted (Ctrl-C or SIGTERM: no new attempts, stopped within "
        f"{settings.ODAL_STOP_SECONDS}s)…"
    )
    report = run_until_signalled(sweep_forever, batch=batch)
    command.stdout.write(f"Stopped after {report.passes} passes: {report.summary()}.")
