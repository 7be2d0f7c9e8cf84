"""odal registry drain: claim due registrations and do what each owes, once or until a signal."""

from odal.core.cli import add_work_subcommand
from registry.drain import DRAINING


def add_arguments(sub) -> None:
    add_work_subcommand(
        sub, DRAINING, "drain", help="claim due registrations and do what each owes", batch=50, done="Drained",
        doing="Draining",
    )  # fmt: skip
