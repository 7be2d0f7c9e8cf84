"""API fuzzing, short form (make fuzz is the long one): schemathesis generates requests for every
operation of the served OpenAPI and sends them through the real WSGI app with an admin token and
the registry simulator up. No 5xx (other than the documented 502), every response matching its
schema, every error JSON `{detail, code}` (a 405 with `Allow`).

To what schemathesis generates, hooks add hostile input: a NUL, a lone surrogate, a 1 MB string
or JSON nested past odal's bound, put at a random place of a generated body (as a value or a
key) or query. A last test sends what cannot be generated as a Python value (100,000 levels of
nesting, NaN, bytes that are not UTF-8) to every operation."""

import json
import os
import uuid
from collections import Counter

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from odal.core.text import find_unstorable
from odal.wsgi import application
from tests.factories import issue_token

schema = schemathesis.openapi.from_wsgi("/vault/api/v1/openapi.json", application)
# make test runs a short form; `make fuzz` sets ODAL_FUZZ_EXAMPLES=100 (15 operations: 1,500 requests).
EXAMPLES = int(os.environ.get("ODAL_FUZZ_EXAMPLES", "12"))
SENT: Counter = Counter()  # requests by (operation, status): the run's summary (tests/conftest.py)

MEGABYTE = "x" * 1_000_000
URL_TEXT = ["\x00", "a\x00b", MEGABYTE]  # a URL has no way to carry a lone surrogate
BODY_TEXT = [*URL_TEXT, "\ud800", "x\udfffy", "\udc00\ud800"]


def nested(depth: int):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_VALUES = st.sampled_from(BODY_TEXT) | st.sampled_from([65, 500]).map(nested)


def places(value, path=()):
    """The path of every value inside `value`, itself included."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from places(inner, (*path, key))


def put(value, path, new):
    """A copy of `value` with what is at `path` replaced by `new`."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = put(value[path[0]], path[1:], new)
    return copy


@st.composite
def spoiled(draw, value):
    """`value` with one hostile value, or a hostile key, put somewhere in it."""
    path = draw(st.sampled_from(list(places(value))))
    target = value
    for key in path:
        target = target[key]
    if isinstance(target, dict) and draw(st.booleans()):
        return put(value, path, {**target, draw(st.sampled_from(BODY_TEXT)): "x"})
    return put(value, path, draw(HOSTILE_VALUES))


@schema.hook
def flatmap_body(context, body):
    return st.one_of(st.just(body), spoiled(body))


@schema.hook
def flatmap_query(context, query):
    query = query or {}
    hostile_value = st.tuples(st.sampled_from(sorted(query) or ["x"]), st.sampled_from(URL_TEXT))
    hostile_name = st.tuples(st.sampled_from(URL_TEXT), st.just("1"))
    return st.one_of(
        st.just(query), (hostile_value | hostile_name).map(lambda pair: {**query, pair[0]: pair[1]})
    )


@pytest.fixture
def admin_token(db, registry_sim):
    # In-process WSGI calls would close the test's connection at the end of each request, as
    # Django does between real requests; the test client avoids that the same way.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield issue_token("admin", name="fuzzer")
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def errors_are_json(ctx, response, case):
    """Every error under the API root is the contract's `{detail, code}`, 404 and 405 included."""
    if response.status_code >= 400:
        body = response.json()  # raises unless the body is JSON
        assert isinstance(body.get("detail"), str) and isinstance(body.get("code"), str), (
            response.status_code,
            response.text[:300],
        )
        assert response.status_code != 405 or response.headers.get("allow"), "a 405 without Allow"


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.django_db
def test_api_survives_generated_requests(case, admin_token):
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"},
        checks=[not_a_server_error, response_schema_conformance, status_code_conformance, errors_are_json],
    )
    SENT[(case.operation.label, response.status_code)] += 1
    SENT["hostile"] += carries_hostile_input(case)


def carries_hostile_input(case) -> bool:
    sent = {"body": case.body if isinstance(case.body, dict | list | str) else None, "query": case.query}
    return find_unstorable(sent) is not None or MEGABYTE in json.dumps(sent)


OPERATIONS = [result.ok() for result in schema.get_all_operations()]
RAW_BODIES = [
    b'{"reason": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # Python's json raises RecursionError
    b'{"reason": NaN, "payload": {"n": Infinity}}',
    b'{"reason": "x", "payload": {"n": 1e400}}',
    b'{"reason": "\xff\xfe not UTF-8"}',
]


@pytest.mark.django_db
@pytest.mark.slow
def test_every_operation_answers_hostile_input_it_cannot_generate_without_a_5xx(admin_token):
    headers = {"Authorization": f"Bearer {admin_token}"}
    for operation in OPERATIONS:
        ids = {p.name: str(uuid.uuid4()) for p in operation.path_parameters}
        sent = []  # (what was sent, must it be refused, the response)
        if operation.body:
            for raw in RAW_BODIES:
                case = operation.Case(path_parameters=ids, media_type="application/json")
                sent.append((raw[:40], True, case.call(headers=headers, data=raw)))
        for parameter in [*operation.query, *operation.path_parameters]:
            for text in URL_TEXT:
                case = operation.Case(path_parameters=dict(ids), query={})
                where = case.path_parameters if parameter.location == "path" else case.query
                where[parameter.name] = text
                # A 1 MB filter value is a fine query; only the NULs must be refused.
                sent.append((f"{parameter.name}={text[:5]!r}", "\x00" in text, case.call(headers=headers)))
        for what, refused, response in sent:
            SENT[(operation.label, response.status_code)] += 1
            SENT["hostile"] += 1
            assert response.status_code < 500, (
                operation.label,
                what,
                response.status_code,
                response.text[:300],
            )
            if refused:
                assert response.status_code in (400, 413, 422), (operation.label, what, response.text[:300])
            errors_are_json(None, response, None)
