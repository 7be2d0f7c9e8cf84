"""Issue 17.5: every `odal` subcommand, given malformed arguments, says what is wrong in a sentence
and exits non-zero: no traceback, and no worker loop or server started on a bad value.

Each case runs as a process of its own (`python -m odal …`, forked by tests/odal_forks.py from
one that has set Django up already) against the test database. The cases run once per module (a
fixture), and each is then checked as its own test; none may write a row. The table must
name every subcommand the commands define (their argparse subparsers are discovered), so a new
subcommand without malformed cases fails test_every_subcommand_has_malformed_cases."""

import argparse
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class
from django.db import connection

from odal.core.models import ApiToken, AuditEntry, Passport
from outbox.models import Consumer, Delivery, Event
from registry.models import Registration

# All of the module marked, not only the test that reads the database: the mark is what makes
# pytest-django set up the database the cases run against, and pytest-django runs marked tests
# apart from unmarked ones, which split the module and ran the fixture (every case) twice.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
OUR_APPS = {"odal.surfaces", "outbox", "registry"}
TIMEOUT = 30  # seconds: a malformed argument must fail long before this
ID = str(uuid.UUID(int=17))  # well-formed, names nothing
UPI = "https://id.example.eu/01/09506000134352/21/MALFORMED-1"
LONG = "x" * 300
TARGET = "tests.consumers.accept"

# subcommand -> malformed argument lists (after the subcommand's own words). Each case costs a
# process (a fork, some hundredths of a second); the wider table of bad values per rule is
# tests/test_input_rules.py, in-process. The worker loops and servers (sweep, drain, receive,
# simulate, up, serve) are given only bad values, without --once: they must refuse at once rather
# than start.
MALFORMED = {
    ("outbox", "sweep"): [["--batch", "-1"], ["--batch", "0"]],
    ("outbox", "status"): [["--bogus"]],
    ("outbox", "show"): [[], ["not-a-uuid"], [ID], [ID, "--bogus"]],
    ("outbox", "replay"): [
        ["not-a-uuid", "--reason", "r"],
        ["--dead", "--since", "0001-01-01T00:00:00+14:00", "--reason", "r"],
        ["--dead", "--reason", "r", "--actor", LONG],
    ],
    ("outbox", "purge"): [
        ["--older-than", "0d"],
        ["--dead-older-than", "90"],
        ["--evidence-older-than", "10y"],
        ["--batch", "0"],
    ],
    ("outbox", "receive"): [["--port", "0"]],
    ("outbox", "resend"): [
        ["--reason", "r"],
        [ID, "--consumer", "c", "--reason", "r"],
        ["42", "--reason", "r"],
        ["--consumer", "c", "--status", "pending", "--reason", "r"],
        ["--consumer", "c", "--since", "yesterday", "--reason", "r"],
        [ID, "--reason", "  "],
    ],
    ("outbox", "consumer", "list"): [["--bogus"]],
    ("outbox", "consumer", "show"): [["no-such-consumer"], ["bad name"]],
    ("outbox", "consumer", "change"): [
        ["no-such-consumer", "--timeout", "5"],
        ["c", "--timeout", "0"],
        ["c", "--max-attempts", "1001"],
        ["c", "--events", "bad type"],
        ["c", "--url", "http://[::1/"],
        ["c", "--events", ",,,"],
    ],
    ("outbox", "consumer", "pause"): [["no-such-consumer", "--reason", "r"], ["c"], ["c", "--reason", ""]],
    ("outbox", "consumer", "resume"): [["no-such-consumer", "--reason", "r"], ["c", "--reason", "a\nb"]],
    ("outbox", "consumer", "remove"): [["no-such-consumer", "--reason", "r"], ["c"]],
    ("outbox", "consumer", "rotate-secret"): [
        ["no-such-consumer", "--reason", "r"],
        ["c", "--reason", "r", "--grace", "31d"],
        ["c", "--reason", "r", "--grace", "24"],
    ],
    ("outbox", "consumer", "test-event"): [["no-such-consumer"], ["c", "--bogus"]],
    ("outbox", "consumer", "add"): [
        ["bad name", "--target", TARGET],
        ["c-attempts", "--target", TARGET, "--max-attempts", "0"],
        ["c-timeout", "--target", TARGET, "--timeout", "99999999999"],
        ["c-url", "--url", "http://[::1/"],
        ["c-events", "--target", TARGET, "--events", " , "],
    ],
    ("registry", "drain"): [["--batch", "0"], ["--batch", "1e3"]],
    ("registry", "status"): [["--bogus"]],
    ("registry", "show"): [[], ["not-a-uuid"], [ID], [ID, "--bogus"]],
    ("registry", "abandon"): [["42", "--reason", "r"], [ID]],
    ("registry", "handle"): [[ID, "h", "--reason", "r", "--actor", "a\nb"]],
    ("registry", "simulate"): [
        ["--port", "99999"],
        ["--port", "0"],
        ["--latency-ms", "-1"],
        ["--rate-limit", "100/m"],
        ["--rate-limit", "0/s"],
        ["--fault", "latency_jitter=2"],
    ],
    ("passport", "create"): [
        ["--upi", UPI, "--operator", "OP", "--facility", LONG],
        ["--upi", "ftp://id.example.eu/01/1", "--operator", "OP"],
    ],
    ("passport", "publish"): [["42"]],
    ("passport", "suspend"): [[ID, "--actor", "\x1b[2J"]],
    ("passport", "show"): [[]],
    ("passport", "canonicalise"): [["--bogus"]],
    ("passport", "import"): [["/nonexistent/passports.jsonl"], ["rows.csv", "--batch", "1001"]],
    ("token", "create"): [["--name", "ci\x07", "--scope", "read"]],
    ("token", "revoke"): [["abcdefgh", "--actor", LONG], ["ab\udcffcdef"], ["odal_abcdef12_rest"]],
    ("token", "list"): [["--bogus"]],
    ("user", "reset-2fa"): [
        ["nobody-here", "--reason", "r"],
        ["nobody-here"],
        ["nobody-here", "--reason", "  "],
        ["a\nb", "--reason", "r"],
        ["nobody-here", "--reason", "r", "--actor", LONG],
    ],
    ("demo",): [["--bogus"]],
    # (odal's migrate: Django's, under an advisory lock)
    ("migrate",): [["noapp"], ["odal", "9999_nonexistent"], ["--bogus"]],
    ("up",): [["--addr", "nonsense"], ["--addr", "127.0.0.1:99999"]],
    ("serve",): [
        ["--bind", "nonsense"],
        ["--bind", "127.0.0.1:0"],
        ["--bind", "...:8000"],  # an empty label: the resolver raised UnicodeError (a traceback)
        ["--bind", "::1:8000"],  # IPv6 without brackets: gunicorn took `::1` apart
        ["--workers", "0"],
        ["--workers", "2.5"],
    ],
}


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def our_commands() -> list[str]:
    return sorted(name for name, app in get_commands().items() if app in OUR_APPS)


def subcommands() -> set[tuple]:
    """Every leaf of every odal command's argparse tree, e.g. ("outbox", "consumer", "add")."""

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path
            return
        for word, sub in subs[0].choices.items():
            yield from walk(sub, (*path, word))

    found = set()
    for name in our_commands():
        parser = load_command_class(get_commands()[name], name).create_parser("odal", name)
        found.update(walk(parser, (name,)))
    return found


CASES = [(path, args) for path, cases in MALFORMED.items() for args in cases]


def case_id(path, args) -> str:
    shown = " ".join(a if len(a) <= 20 else a[:12] + "…" for a in args)
    return f"{' '.join(path)} {shown}".strip().encode("unicode_escape").decode()


@pytest.fixture(scope="module")
def results(django_db_setup, django_db_blocker):
    """Run every case once, concurrently, against the test database."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_REGISTRY_URL": "http://127.0.0.1:9",  # nothing answers: no case may reach a registry
        "PYTHONWARNINGS": "ignore",
    }

    with django_db_blocker.unblock():
        before = written()
        done = subprocess.run(
            [sys.executable, "-m", "tests.odal_forks", str(TIMEOUT)],
            input=json.dumps([[*path, *args] for path, args in CASES]),
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=TIMEOUT * len(CASES) + 60,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ran = dict(enumerate(json.loads(done.stdout)))
        ran["written"] = (before, written())
    yield ran
    if ran["written"][0] != ran["written"][1]:
        # A case wrongly went through and wrote outside any test's transaction: empty those
        # tables (not a flush, which would take the groups and schedules migrations made).
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(m._meta.db_table for m in WRITABLE)} CASCADE")


WRITABLE = [Passport, AuditEntry, ApiToken, Consumer, Delivery, Event, Registration]


def written() -> dict:
    """How many rows of each kind a malformed command could have written."""
    return {model.__name__: model.objects.count() for model in WRITABLE}


def sentence(stderr: str) -> str | None:
    """What the last line of stderr says after "error:", if it is a sentence of a few words."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if not lines:
        return None
    said = re.split(r"(?i)error: ", lines[-1])[-1]
    return said if len(said.split()) >= 3 else None


def test_every_subcommand_has_malformed_cases():
    assert subcommands() == set(MALFORMED)


def test_no_malformed_command_wrote_anything(results):
    before, after = results["written"]
    assert after == before


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(*case) for case in CASES])
def test_a_malformed_argument_is_a_sentence_and_a_non_zero_exit(results, index):
    returncode, stdout, stderr = results[index]
    assert returncode is not None, f"still running after {TIMEOUT} s: a malformed argument must fail fast"
    assert "Traceback" not in stdout + stderr, stderr[-2000:]
    assert returncode != 0, f"exit 0; stdout: {stdout[-500:]!r}"
    assert returncode in (1, 2), f"exit {returncode}; stderr: {stderr[-500:]!r}"
    assert sentence(stderr), f"no sentence on stderr: {stderr[-500:]!r}"
