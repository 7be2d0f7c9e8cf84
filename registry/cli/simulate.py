"""odal registry simulate: the registry simulator (registry/simulator.py), with faults switched
on from the command line."""

from django.conf import settings
from django.core.management.base import CommandError

from odal.core import rules
from odal.core.cli import argument, serving
from registry.simulator import DEFAULT_FAULTS, HOSTILE_ANSWERS, fault_problem, make_server

LATENCY_JITTER = 0.2  # --latency-ms: each wait 80 % to 120 % of it


def add_arguments(sub) -> None:
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
    simulate.set_defaults(handler=handle)


def handle(command, *, port, fault, latency_ms, rate_limit, **_):
    faults = _faults(fault, latency_ms, rate_limit)
    server = serving(
        lambda: make_server(port=port, token=settings.ODAL_REGISTRY_TOKEN, faults=faults),
        port,
        "registry simulator",
    )
    command.stdout.write(f"Registry simulator on http://127.0.0.1:{port} (faults: {faults or 'none'})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _faults(items: list[str], latency_ms, rate_limit) -> dict:
    """The faults to start with: --latency-ms and --rate-limit, then each --fault NAME=VALUE; a
    name the simulator does not know or a value it cannot take is a usage error (exit 2)."""
    faults = {}
    if latency_ms is not None:
        faults.update(latency=latency_ms / 1000, latency_jitter=LATENCY_JITTER)
    if rate_limit is not None:
        faults["rate_limit"] = rate_limit
    for item in items:
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
    return faults


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
