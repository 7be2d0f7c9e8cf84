import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.core.serializers.json import DjangoJSONEncoder

from odal import rules
from odal.cli import argument, refused, run_until_signalled, serving, subcommands
from odal.errors import Refused
from registry import service
from registry.drain import drain_forever, drain_until_idle
from registry.schemas import AbandonOut, RegistrationOut
from registry.simulator import DEFAULT_FAULTS, HOSTILE_ANSWERS, fault_problem, make_server


class Command(BaseCommand):
    help = "The registry outbox: drain, status, show a registration, abandon, record a handle, run the simulator."

    def add_arguments(self, parser):
        sub = subcommands(parser)

        drain = sub.add_parser("drain", help="claim due registrations and do what each owes")
        drain.add_argument("--once", action="store_true", help="one pass, then exit")
        drain.add_argument(
            "--batch", type=argument(rules.batch_size), default=50, help="rows per pass (1 to 10,000)"
        )

        status = sub.add_parser("status", help="registrations per status, stalled and abandoned apart")
        status.add_argument("--json", action="store_true")

        show = sub.add_parser("show", help="a passport's registration and its attempt log")
        show.add_argument("passport_id", type=argument(rules.passport_id))
        show.add_argument("--json", action="store_true")

        abandon = sub.add_parser(
            "abandon", help="give up a registration the registry provably never accepted"
        )
        abandon.add_argument("passport_id", type=argument(rules.passport_id))
        abandon.add_argument("--reason", required=True)
        abandon.add_argument(
            "--actor", type=argument(rules.actor), help="who abandons it, for the audit trail"
        )
        abandon.add_argument("--json", action="store_true")

        handle = sub.add_parser("handle", help="record the registry handle of a submitted registration")
        handle.add_argument("passport_id", type=argument(rules.passport_id))
        handle.add_argument("handle")
        handle.add_argument("--reason", required=True)
        handle.add_argument("--actor", type=argument(rules.actor), help="who records it, for the audit trail")

        simulate = sub.add_parser("simulate", help="run the registry simulator")
        simulate.add_argument("--port", type=argument(rules.port), default=8100)
        simulate.add_argument(
            "--latency-ms", type=argument(rules.latency_ms), metavar="N",
            help="every answer waits N ms, give or take 20 %% (the faults latency and latency_jitter)",
        )  # fmt: skip
        simulate.add_argument(
            "--rate-limit", type=argument(rules.rate_per_second), metavar="N/s",
            help="past N requests in a second, answer 429 with Retry-After (the fault rate_limit)",
        )  # fmt: skip
        simulate.add_argument(
            "--fault", action="append", default=[], metavar="NAME=VALUE",
            help=f"switch a fault on at start (repeatable); one of: {', '.join(DEFAULT_FAULTS)}. "
            f"hostile_answer is one of {', '.join(HOSTILE_ANSWERS)}; the simulator's docstring "
            "(registry/simulator.py) says what each does",
        )  # fmt: skip

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"do_{action}")(**options)
        except Refused as exc:
            raise refused(exc) from None

    def do_drain(self, *, once, batch, **_):
        if once:
            report = drain_until_idle(batch=batch, max_seconds=0, linger_seconds=0)
            self.stdout.write(f"Drained once: {report.summary()}.")
            return
        self.stdout.write(
            f"Draining until interrupted (Ctrl-C or SIGTERM: no new attempts, stopped within "
            f"{settings.ODAL_STOP_SECONDS}s)…"
        )
        report = run_until_signalled(drain_forever, batch=batch)
        self.stdout.write(f"Stopped after {report.passes} passes: {report.summary()}.")

    def do_status(self, *, json: bool, **_):
        counts = service.registry_counts()
        if json:
            self.stdout.write(_dumps(counts))
            return
        owed = "  ".join(f"{k} {counts[k]}" for k in ("pending", "submitted", "registered", "rejected"))
        rest = "  ".join(f"{k} {counts[k]}" for k in ("suspended", "deactivated"))
        self.stdout.write(f"{owed}  {rest}")
        self.stdout.write(
            f"stalled {counts['stalled']} (pending and needing a person)  abandoned {counts['abandoned']}"
        )

    def do_show(self, *, passport_id, json, **_):
        shown = RegistrationOut.from_orm(service.registration_for(passport_id)).model_dump()
        if json:
            self.stdout.write(_dumps(shown))
            return
        head = f"{passport_id}: {shown['status']} ({shown['operation']}), {shown['attempts']} attempt(s)"
        if shown["correlationId"] or shown["handle"]:
            head += f", request {shown['correlationId'] or '-'}, handle {shown['handle'] or '-'}"
        self.stdout.write(head)
        if shown["settlesAt"]:
            self.stdout.write(
                f"An attempt whose outcome is unknown ended {shown['lastUnknownAt']:%Y-%m-%d %H:%M:%S}; "
                f"absence in the registry's task list proves nothing until {shown['settlesAt']:%Y-%m-%d %H:%M:%S} UTC."
            )
        if shown["lastError"]:
            self.stdout.write(f"last error: {shown['lastError']}")
        for line in shown["attemptLog"]:
            self.stdout.write(
                f"  #{line['number']} {line['operation']} {line['finishedAt']:%Y-%m-%d %H:%M:%S} "
                f"{line['outcome']}{' (late)' if line['late'] else ''}: {line['answer']}"
            )

    def do_abandon(self, *, passport_id, reason, actor, json, **_):
        actor = f"cli:{actor}" if actor else "cli"
        result = service.abandon(passport_id, actor=actor, reason=reason)
        if json:
            self.stdout.write(_dumps(AbandonOut.from_orm(result).model_dump()))
            return
        self.stdout.write(f"{passport_id}: {result.detail}")

    def do_handle(self, *, passport_id, handle, reason, actor, **_):
        actor = f"cli:{actor}" if actor else "cli"
        reg = service.record_handle(passport_id, handle=handle, actor=actor, reason=reason)
        self.stdout.write(f"{passport_id}: registered with handle {reg.handle}.")

    def do_simulate(self, *, port, fault, latency_ms, rate_limit, **_):
        faults = {}
        if latency_ms is not None:
            faults.update(latency=latency_ms / 1000, latency_jitter=LATENCY_JITTER)
        if rate_limit is not None:
            faults["rate_limit"] = rate_limit
        for item in fault:
            name, sep, value = item.partition("=")
            if not sep or name not in DEFAULT_FAULTS:
                raise CommandError(
                    f"--fault {item!r}: use NAME=VALUE with NAME one of {', '.join(DEFAULT_FAULTS)}.",
                    returncode=2,
                )
            try:
                faults[name] = fault_value(name, value)
            except ValueError as exc:
                raise CommandError(f"--fault {item!r}: {name} {exc}.", returncode=2) from None
            if problem := fault_problem(name, faults[name]):
                raise CommandError(f"--fault {item!r}: {problem}.", returncode=2)
        server = serving(
            lambda: make_server(port=port, token=settings.ODAL_REGISTRY_TOKEN, faults=faults),
            port,
            "registry simulator",
        )
        self.stdout.write(f"Registry simulator on http://127.0.0.1:{port} (faults: {faults or 'none'})")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


LATENCY_JITTER = 0.2  # --latency-ms: each wait 80 % to 120 % of it


def fault_value(name: str, value: str):
    """A fault's value typed as its default is: a switch, a count (0 to 1,000,000), seconds (0 to
    3,600), a fraction (latency_jitter, 0 to 1) or text."""
    default = DEFAULT_FAULTS[name]
    if name == "latency_jitter":
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not 0 <= fraction <= 1:  # NaN fails too
            raise ValueError("takes a fraction, from 0 to 1")
        return fraction
    if isinstance(default, bool):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return rules.whole_number(value, 0, 1_000_000)
    if isinstance(default, float):
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= 3600:  # NaN fails too
            raise ValueError("takes seconds, from 0 to 3,600")
        return seconds
    return rules.text(value, max_length=200)


def _dumps(value) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, indent=2)
