"""Small helpers shared by odal's management commands."""

import argparse
import json
import time
import uuid

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from odal.core import rules, stopping
from odal.core.errors import Refused


class UsageParser(CommandParser):
    """A subcommand's parser: a usage error exits 2 on the command line (argparse prints the
    usage and the sentence) and is a CommandError with returncode 2 under call_command, as the
    rules' refusals in a command's own code are."""

    def error(self, message):
        if self.called_from_command_line:
            super().error(message)
        raise CommandError(f"Error: {message}", returncode=2)


def subcommands(parser, dest: str = "action"):
    """Required argparse subcommands. Django's CommandParser passes on how it was called, so a
    usage error exits 2 on the command line and raises CommandError (returncode 2) under
    call_command."""
    return parser.add_subparsers(dest=dest, required=True, parser_class=UsageParser)


def argument(rule, *args):
    """An argparse type that checks a command-line value with an input rule (odal.core.rules): a value
    the rule refuses is a usage error whose sentence names the value and the rule."""

    def check(text: str):
        try:
            return rule(text, *args)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{rules.shown(text)} {exc}.") from None

    check.__name__ = rule.__name__  # what argparse calls the type in its own messages
    return check


def usage_error(option: str, value, exc: ValueError) -> CommandError:
    """A value refused by a rule in a command's own code: the same sentence, exit 2."""
    return CommandError(f"{option} {rules.shown(value)} {exc}.", returncode=2)


def refused(exc: Refused) -> CommandError:
    """A refusal as the command's error: its sentence on stderr, its exit code (1, or 3 to retry)."""
    return CommandError(exc.detail, returncode=exc.exit_code)


def cli_actor(name: str | None) -> str:
    """Who did it, for the audit trail: `cli`, or `cli:<name>` when --actor named someone."""
    return f"cli:{name}" if name else "cli"


def dumps(value) -> str:
    """A command's --json output: indented, with dates and times as ISO 8601."""
    return json.dumps(value, cls=DjangoJSONEncoder, indent=2)


def run_until_signalled(forever, **options):
    """Run a worker loop (`forever(should_stop=…, **options)`) until SIGINT or SIGTERM: its pass
    starts nothing more, gives back what it did not start and ends, and the loop returns what it
    did; the process has exited within ODAL_STOP_SECONDS in any case (odal.core.stopping)."""
    stopping.on_signals()
    return forever(should_stop=stopping.requested, **options)


class AreaCommand(BaseCommand):
    """A command whose subcommands live in modules by area (`odal outbox`, `odal registry`): each
    module's `add_arguments(sub)` adds its subcommands, each naming its handler; a refusal
    becomes the command's error and exit code."""

    areas: tuple = ()  # in the order --help lists their subcommands

    def add_arguments(self, parser):
        sub = subcommands(parser)
        for area in self.areas:
            area.add_arguments(sub)

    def handle(self, *args, action, handler, **options):
        try:
            handler(self, **options)
        except Refused as exc:
            raise refused(exc) from None


def add_work_subcommand(sub, work, name: str, *, help: str, batch: int, done: str, doing: str) -> None:
    """The subcommand that runs a kind of claimed work (odal.work.loops.Work): `--once` makes
    passes until nothing is due now, else passes run until SIGINT or SIGTERM. `done` and `doing`
    are its verb in its output ("Swept once: …", "Sweeping until interrupted …")."""
    parser = sub.add_parser(name, help=help)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument(
        "--batch", type=argument(rules.batch_size), default=batch, help="rows per pass (1 to 10,000)"
    )

    def handle(command, *, once: bool, batch: int, **_):
        if once:
            report = work.until_idle(batch=batch, max_seconds=0, linger_seconds=0)
            command.stdout.write(f"{done} once: {report.summary()}.")
            return
        command.stdout.write(
            f"{doing} until interrupted (Ctrl-C or SIGTERM: no new attempts, stopped within "
            f"{settings.ODAL_STOP_SECONDS}s)…"
        )
        report = run_until_signalled(work.forever, batch=batch)
        command.stdout.write(f"Stopped after {report.passes} passes: {report.summary()}.")

    parser.set_defaults(handler=handle)


def parse_uuid(value, what: str = "passport id") -> uuid.UUID:
    """An id typed on the command line (odal.core.rules.uuid_id); a malformed one is a usage error
    (exit 2) on every command."""
    try:
        return rules.uuid_id(value, what)
    except ValueError as exc:
        raise CommandError(f"{rules.shown(value)} {exc}.", returncode=2) from None


class Progress:
    """How far a long command has got, on one line of a terminal redrawn in place (`\\r`): a bar
    when the total is known, else the count and the rate. Silent when the stream is not a
    terminal (a pipe, a log file, a test), so only the command's summary line reaches those.
    Call it with the number done so far; `close()` (or leaving the `with`) ends the line."""

    WIDTH = 30  # characters of the bar
    EVERY = 0.1  # seconds between redraws

    def __init__(self, stream, *, total: int | None = None, what: str = "rows"):
        # A command's OutputWrapper would end every write with a line break: write to its stream.
        self.stream = getattr(stream, "_out", stream)
        self.shown = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total, self.what = total, what
        self.started = time.monotonic()
        self.drawn_at = float("-inf")
        self.width = 0  # of the last line drawn, to blank it out

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.shown or (now - self.drawn_at < self.EVERY and done != self.total):
            return
        self.drawn_at = now
        rate = done / max(now - self.started, 1e-9)
        if self.total:
            filled = min(self.WIDTH, self.WIDTH * done // self.total)
            line = (
                f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {min(100, 100 * done // self.total):3d}%  "
                f"{done:,} of {self.total:,} {self.what}  {rate:,.0f}/s"
            )
        else:
            line = f"{done:,} {self.what}  {rate:,.0f}/s"
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def close(self) -> None:
        """Blank the line out, so the summary that follows starts clean."""
        if self.shown and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
        self.width = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Batches:
    """The `progress` of a bulk write (replay, resend, resume, remove): counts the batches it
    committed and shows the rows done on the command's Progress line."""

    def __init__(self, progress: Progress):
        self.progress, self.count = progress, 0

    def __call__(self, batches: int, total: int) -> None:
        self.count = batches
        self.progress(total)

    def said(self) -> str:
        """For the summary line: nothing for one batch or none, else how many."""
        return f" in {self.count:,} batches" if self.count > 1 else ""


def serving(make_server, port: int, what: str, option: str = "--port"):
    """`make_server()`, or a refusal (exit 1) saying why `what` cannot listen on `port` (a port
    in use, or one this user may not open); `option` is how the command chooses another."""
    try:
        return make_server()
    except OSError as exc:
        raise CommandError(
            f"The {what} cannot listen on port {port}: {exc.strerror or exc}. "
            f"Stop what is using it, or choose another {option}.",
            returncode=1,
        ) from None
