"""Small helpers shared by odal's management commands."""

import signal
import uuid

from django.core.management.base import CommandError

from odal.errors import Refused


def subcommands(parser, dest: str = "action"):
    """Required argparse subcommands. Django's CommandParser passes on how it was called, so a
    usage error exits 2 on the command line and raises CommandError under call_command."""
    return parser.add_subparsers(dest=dest, required=True)


def refused(exc: Refused) -> CommandError:
    """A refusal as the command's error: its sentence on stderr, its exit code (1, or 3 to retry)."""
    return CommandError(exc.detail, returncode=exc.exit_code)


def run_until_signalled(forever, **options):
    """Run a worker loop (`forever(should_stop=…, **options)`) until SIGINT or SIGTERM; the
    current pass finishes first. Returns what the loop returns."""
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return forever(should_stop=lambda: stop["now"], **options)


def parse_uuid(value: str, what: str = "passport id") -> uuid.UUID:
    """An id typed on the command line; a malformed one is a usage error (exit 2) on every command."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise CommandError(f"{value!r} is not a {what} (a UUID).", returncode=2) from None
