"""odal outbox sweep: claim due deliveries and run them, once or until a signal."""

from odal.core.cli import add_work_subcommand
from outbox.sweep import SWEEPING


def add_arguments(sub) -> None:
    add_work_subcommand(
        sub, SWEEPING, "sweep", help="claim due deliveries and run them", batch=100, done="Swept",
        doing="Sweeping",
    )  # fmt: skip
