"""The state machines of docs/architecture.md ("State machines") against the code.

Each table row is from | event | to | written by. For every method a table names, a driver makes
one row in each state of its model (a claim's token through the real claim, the row then set to
the state, as another writer would leave it), calls the method on that row alone, and the moves
it makes must be exactly the table's: the from-states listed move to their to-state, a row in any
other state is left as it was and the method reports it took nothing. And every QuerySet method
that writes a status (or the Consumer's `paused`) must be in a table.
"""

import ast
import inspect
import re
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.utils import timezone

from outbox.models import Failure
from registry.models import UNSEARCHABLE
from tests.factories import ConsumerFactory, DeliveryFactory, PassportFactory, RegistrationFactory

pytestmark = pytest.mark.django_db

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"

# The field a machine's states are values of, when it is not `status`, and their names.
FLAGS = {"outbox.Consumer": ("paused", {"running": False, "paused": True})}


# Test-only writers issue 40 deletes (the product uses the _each forms): not in the tables.
def machines() -> dict:
    """{model label: [(from states, to state or "same", QuerySet name, method)]} from the doc."""
    text = DOC.read_text().split("\n## State machines\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for part in text.split("\n### ")[1:]:
        label = re.search(r"`(\w+\.\w+)`", part.splitlines()[0]).group(1)
        rows = found.setdefault(label, [])
        for line in part.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 4 or cells[0] in ("from", "---"):
                continue
            plain = re.sub(r"\([^)]*\)", "", cells[0])
            froms = {s.strip() for s in plain.split(",")}
            to = re.sub(r"\([^)]*\)", "", cells[2]).strip()
            queryset, method = cells[3].strip("`").split(".")
            rows.append((froms, to, queryset, method))
    return found


def states(label: str) -> dict:
    """{state name: value of the field} of a machine's model."""
    if label in FLAGS:
        return FLAGS[label][1]
    return {value: value for value in apps.get_model(label).Status.values}


def field(label: str) -> str:
    return FLAGS.get(label, ("status",))[0]


# -- drivers: how to make a row for each method and call it ---------------------------------------
# make: the row's fields (each dict a variant: the union of their moves is what the table lists);
# held: claim it first; call(queryset of the row, the row, the claim's token) -> what it returns.

NOW = timezone.now


def later():
    return timezone.now() + timedelta(minutes=5)


def failure(row, **_):
    return [Failure(delivery_id=row.pk, error="HTTP 500", retry_at=later(), at=NOW())]


DELIVERY = {
    "claim": {"call": lambda rows, row, token: rows.claim(limit=1).rows},
    "release": {"held": True, "call": lambda rows, row, token: rows.release(token=token)},
    "mark_delivered_each": {
        "held": True,
        "call": lambda rows, row, token: row.pk in rows.mark_delivered_each(token=token, at=NOW()),
    },
    "mark_attempts_failed_each": {
        "held": True,
        # attempts left; its consumer paused while the attempt ran; its last attempt (3 of 3)
        "make": [{}, {"then": {"consumer__paused": True}}, {"attempts": 2, "max_attempts": 3}],
        "call": lambda rows, row, token: (
            row.pk in rows.mark_attempts_failed_each(token=token, failures=failure(row))
        ),
    },
    "dead_letter_exhausted": {
        "make": [{"attempts": 3, "max_attempts": 3}],
        "call": lambda rows, row, token: rows.dead_letter_exhausted(),
    },
    "park_paused": {
        "make": [{"consumer__paused": True}],
        "call": lambda rows, row, token: rows.park_paused(),
    },
    "unpark": {"call": lambda rows, row, token: rows.unpark(consumer_id=row.consumer_id)},
    "replay": {"call": lambda rows, row, token: rows.replay(actor="test", reason="state tables")},
    "resend": {"call": lambda rows, row, token: rows.resend(actor="test", reason="state tables")},
}

REGISTER = {"operation": "register"}
DEACTIVATE = {"operation": "deactivate", "handle": "reg-1"}
FINDING = {"operation": "deactivate", "handle": ""}

REGISTRATION = {
    "claim": {"call": lambda rows, row, token: rows.claim(limit=1).rows},
    "release": {"held": True, "call": lambda rows, row, token: rows.release(token=token)},
    "mark_submitted": {
        "held": True,
        "make": [REGISTER],
        "call": lambda rows, row, token: rows.mark_submitted(
            token=token, correlation_id="r", next_check_at=later()
        ),
    },
    "mark_submitted_noting": {
        "held": True,
        "make": [REGISTER],
        "call": lambda rows, row, token: rows.mark_submitted_noting(
            token=token, correlation_id="r", note="adopted", next_check_at=later()
        ),
    },
    "mark_registered": {
        "held": True,
        "call": lambda rows, row, token: rows.mark_registered(token=token, handle="h"),
    },
    "mark_checked": {
        "held": True,
        "call": lambda rows, row, token: rows.mark_checked(token=token, next_check_at=later()),
    },
    "mark_rejected": {
        "held": True,
        "make": [REGISTER],
        "call": lambda rows, row, token: rows.mark_rejected(token=token, errors="422"),
    },
    "mark_rate_limited": {
        "held": True,
        "call": lambda rows, row, token: rows.mark_rate_limited(token=token, error="429", retry_at=later()),
    },
    "mark_attempt_failed": {
        "held": True,
        "call": lambda rows, row, token: rows.mark_attempt_failed(token=token, error="503", retry_at=later()),
    },
    "mark_withdrawn": {
        "held": True,
        "make": [REGISTER],
        "call": lambda rows, row, token: rows.mark_withdrawn(token=token),
    },
    "find_and_deactivate": {
        "make": [REGISTER],
        "call": lambda rows, row, token: rows.find_and_deactivate(now=NOW()),
    },
    "mark_deactivated": {
        "held": True,
        "make": [DEACTIVATE],
        "call": lambda rows, row, token: rows.mark_deactivated(token=token),
    },
    "mark_found_deactivated": {
        "held": True,
        "make": [FINDING],
        "call": lambda rows, row, token: rows.mark_found_deactivated(token=token, handle="h", now=NOW()),
    },
    "mark_found_absent": {
        "held": True,
        "make": [FINDING],
        "call": lambda rows, row, token: rows.mark_found_absent(token=token, now=NOW(), note="absent"),
    },
    "mark_finding_waits": {
        "held": True,
        "make": [FINDING],
        "call": lambda rows, row, token: rows.mark_finding_waits(token=token, retry_at=later()),
    },
    "abandon": {
        "make": [{**REGISTER, "attempts": 2, "next_attempt_at": later()}],
        "call": lambda rows, row, token: rows.abandon(actor="test", reason="r", now=NOW(), seen=row),
    },
    "record_handle": {
        "make": [{"correlation_id": "r"}],
        "call": lambda rows, row, token: rows.record_handle(
            handle="h", actor="test", reason="r", now=NOW(), seen=row
        ),
    },
    "record_finding_handle": {
        "make": [{**FINDING, "attempts": 1, "last_error": UNSEARCHABLE}],
        "call": lambda rows, row, token: rows.record_finding_handle(
            handle="h", actor="test", reason="r", now=NOW(), seen=row
        ),
    },
    "requeue": {"call": lambda rows, row, token: rows.requeue(now=NOW())},
    "cancel_deactivation": {
        "make": [DEACTIVATE],
        "call": lambda rows, row, token: rows.cancel_deactivation(),
    },
    "reregister": {
        "make": [{**DEACTIVATE, "attempts": 1}],
        "call": lambda rows, row, token: rows.reregister(now=NOW()),
    },
    "withdraw_unsent": {"make": [REGISTER], "call": lambda rows, row, token: rows.withdraw_unsent(now=NOW())},
    "queue_deactivation": {"call": lambda rows, row, token: rows.queue_deactivation(now=NOW())},
}

PASSPORT = {
    "mark_published": {"call": lambda rows, row, token: rows.mark_published()},
    "mark_suspended": {"call": lambda rows, row, token: rows.mark_suspended()},
}

ALLOWED = ("tests.consumers.*",)
CONSUMER = {
    "pause": {"call": lambda rows, row, token: rows.pause(by="test", reason="r", at=NOW())},
    "auto_pause": {
        "make": [{"failures": 5, "failing_since": NOW() - timedelta(hours=1)}],
        "call": lambda rows, row, token: rows.auto_pause(
            reason="r", at=NOW(), after=timedelta(minutes=1), min_failures=5, by="odal"
        ),
    },
    "pause_outside": {
        "make": [{"target": "elsewhere.handler"}],
        "call": lambda rows, row, token: rows.pause_outside(ALLOWED, by="odal", reason="r", now=NOW()),
    },
    "resume": {"call": lambda rows, row, token: rows.resume(allowed=ALLOWED)},
}

DRIVERS = {
    "outbox.Delivery": (DeliveryFactory, DELIVERY),
    "registry.Registration": (RegistrationFactory, REGISTRATION),
    "odal.Passport": (PassportFactory, PASSPORT),
    "outbox.Consumer": (ConsumerFactory, CONSUMER),
}


def took(answer) -> bool:
    """Whether a method's answer says it took the row (a bool, a count, the claim's rows or ids
    taken, {id: target} taken)."""
    return answer == 1 if type(answer) is int else bool(answer)


def make(label: str, state: str, fields: dict, held: bool):
    """A row in `state`; when `held`, claimed first through the real claim and then set to
    `state` (as another writer would leave it), keeping the claim's token. Returns (row, token)."""
    factory, _ = DRIVERS[label]
    model = apps.get_model(label)
    name, values = field(label), states(label)
    fields = dict(fields)
    then = fields.pop("then", {})
    if not held:
        return factory(**{name: values[state]}, **fields), None
    claimable = model.objects.all().claimable_statuses
    row = factory(**{name: state if state in claimable else claimable[0]}, **fields)
    token = model.objects.filter(pk=row.pk).claim(limit=1).token
    assert model.objects.filter(pk=row.pk, claim_token=token).exists(), "the claim took the row"
    model.objects.filter(pk=row.pk).update(**{name: values[state]})
    for key, value in then.items():  # (what changed while the attempt ran: consumer__paused)
        relation, attribute = key.split("__")
        type(getattr(row, relation)).objects.filter(pk=getattr(row, f"{relation}_id")).update(
            **{attribute: value}
        )
    return model.objects.get(pk=row.pk), token


def moves(label: str, method: str) -> set:
    """The (from, to) moves `method` makes, driven against a row in every state of each variant;
    asserts that a row it did not take is unchanged and its answer says so."""
    _, drivers = DRIVERS[label]
    model = apps.get_model(label)
    driver = drivers[method]
    names = {value: state for state, value in states(label).items()}
    seen = set()
    for fields in driver.get("make", [{}]):
        for state in states(label):
            row, token = make(label, state, fields, driver.get("held", False))
            rows = model.objects.filter(pk=row.pk)
            before = rows.values().get()
            answer = driver["call"](rows, row, token)
            after = rows.values().get()
            if took(answer):
                seen.add((state, names[after[field(label)]]))
            else:
                assert after == before, f"{method} took nothing from a {state} row but changed it"
    return seen


def table_moves(rows) -> set:
    return {(start, start if to == "same" else to) for froms, to, _, _ in rows for start in froms}


def test_the_doc_has_a_table_for_each_machine():
    assert set(machines()) == set(DRIVERS)


@pytest.mark.parametrize("label", sorted(DRIVERS))
def test_each_method_named_exists_on_its_queryset_and_has_a_driver(label):
    queryset = type(apps.get_model(label).objects.all())
    rows = machines()[label]
    for froms, to, name, method in rows:
        assert name == queryset.__name__, f"{name}.{method}: {label}'s QuerySet is {queryset.__name__}"
        assert callable(getattr(queryset, method, None)), f"{name}.{method} does not exist"
        assert froms | {to} <= set(states(label)) | {"same"}, (
            f"{name}.{method}: no such state in {froms | {to}}"
        )
    assert {method for *_, method in rows} == set(DRIVERS[label][1]), "each method in the table has a driver"


def cases():
    return [(label, method) for label, (_, drivers) in sorted(DRIVERS.items()) for method in drivers]


@pytest.mark.parametrize(("label", "method"), cases())
def test_each_method_moves_exactly_what_its_table_says(label, method):
    listed = table_moves([row for row in machines()[label] if row[3] == method])
    assert moves(label, method) == listed


# -- every status write is in a table -------------------------------------------------------------


def writes(node, fields: set, helpers: set) -> bool:
    """Whether a method's body writes one of `fields`: an update's keyword, a dict's key, a helper
    that returns such a dict, or raw SQL's `field = `."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            callee = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", "")
            if callee in helpers:
                return True
            if callee.startswith("update") and any(k.arg in fields for k in sub.keywords):
                return True
        if isinstance(sub, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value in fields for k in sub.keys
        ):
            return True
        text = sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else ""
        if any(re.search(rf"\b{f} = ", text) for f in fields):
            return True
    return False


def querysets() -> dict:
    """{QuerySet class: fields whose write is a move} of every model of odal, outbox and registry."""
    found = {}
    for app in ("odal", "outbox", "registry"):
        for model in apps.get_app_config(app).get_models():
            label = model._meta.label
            for cls in type(model._default_manager.all()).__mro__:
                if cls.__module__.startswith(("odal", "outbox", "registry")):
                    found.setdefault(cls, {"status"}).add(field(label))
    return found


def test_every_queryset_method_that_writes_a_status_is_in_a_table():
    listed = {f"{name}.{method}" for rows in machines().values() for *_, name, method in rows}
    missing = set()
    for cls, fields in querysets().items():
        module = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        helpers = {f.name for f in module.body if isinstance(f, ast.FunctionDef) and writes(f, fields, set())}
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        methods = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        writers = {name for name, f in methods.items() if writes(f, fields, helpers)}
        # A private writer is covered by the listed methods that call it (through other helpers).
        covered = {name for name in methods if f"{cls.__name__}.{name}" in listed}
        while True:
            called = {
                sub.attr
                for name in covered
                for sub in ast.walk(methods[name])
                if isinstance(sub, ast.Attribute)
            }
            more = {name for name in methods if name.startswith("_") and name in called} - covered
            if not more:
                break
            covered |= more
        missing |= {f"{cls.__name__}.{name}" for name in writers - covered}
    assert missing == set(), "status writes no table in docs/architecture.md names"
