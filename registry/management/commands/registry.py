import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.core.serializers.json import DjangoJSONEncoder

from odal.cli import parse_uuid, refused, run_until_signalled, subcommands
from odal.errors import Refused
from registry import service
from registry.drain import drain_forever, drain_until_idle
from registry.simulator import DEFAULT_FAULTS, HOSTILE_ANSWERS, fault_problem, make_server


class Command(BaseCommand):
    help = "The registry outbox: drain, status, abandon, record a handle, run the simulator."

    def add_arguments(self, parser):
        sub = subcommands(parser)

        drain = sub.add_parser("drain", help="claim due registrations and do what each owes")
        drain.add_argument("--once", action="store_true", help="one pass, then exit")
        drain.add_argument("--batch", type=int, default=50)

        status = sub.add_parser("status", help="registrations per status, stalled and abandoned apart")
        status.add_argument("--json", action="store_true")

        abandon = sub.add_parser(
            "abandon", help="give up a registration the registry provably never accepted"
        )
        abandon.add_argument("passport_id")
        abandon.add_argument("--reason", required=True)
        abandon.add_argument("--actor", default="")
        abandon.add_argument("--json", action="store_true")

        handle = sub.add_parser("handle", help="record the registry handle of a submitted registration")
        handle.add_argument("passport_id")
        handle.add_argument("handle")
        handle.add_argument("--reason", required=True)
        handle.add_argument("--actor", default="")

        simulate = sub.add_parser("simulate", help="run the registry simulator")
        simulate.add_argument("--port", type=int, default=8100)
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
        self.stdout.write("Draining until interrupted (Ctrl-C stops after the current pass)…")
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

    def do_abandon(self, *, passport_id, reason, actor, json, **_):
        actor = f"cli:{actor}" if actor else "cli"
        result = service.abandon(parse_uuid(passport_id), actor=actor, reason=reason)
        if json:
            self.stdout.write(_dumps(result.as_json()))
            return
        self.stdout.write(f"{passport_id}: {result.detail}")

    def do_handle(self, *, passport_id, handle, reason, actor, **_):
        actor = f"cli:{actor}" if actor else "cli"
        reg = service.record_handle(parse_uuid(passport_id), handle=handle, actor=actor, reason=reason)
        self.stdout.write(f"{passport_id}: registered with handle {reg.handle}.")

    def do_simulate(self, *, port, fault, **_):
        faults = {}
        for item in fault:
            name, sep, value = item.partition("=")
            if not sep or name not in DEFAULT_FAULTS:
                raise CommandError(
                    f"--fault {item!r}: use NAME=VALUE with NAME one of {', '.join(DEFAULT_FAULTS)}."
                )
            kind = type(DEFAULT_FAULTS[name])
            try:
                faults[name] = value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value)
            except ValueError:
                raise CommandError(f"--fault {item!r}: {name} takes a {kind.__name__}.") from None
            if problem := fault_problem(name, faults[name]):
                raise CommandError(f"--fault {item!r}: {problem}.")
        server = make_server(port=port, token=settings.ODAL_REGISTRY_TOKEN, faults=faults)
        self.stdout.write(f"Registry simulator on http://127.0.0.1:{port} (faults: {faults or 'none'})")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def _dumps(value) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, indent=2)
