"""API fuzzing, short form (make fuzz is the long one): schemathesis generates requests for every
operation of the served OpenAPI and sends them through the real WSGI app with an admin token and
the registry simulator up. No 5xx (other than the documented 502), every response matching its
schema."""

import os
from collections import Counter

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from odal.wsgi import application
from tests.factories import issue_token

schema = schemathesis.openapi.from_wsgi("/vault/api/v1/openapi.json", application)
# make test runs a short form; `make fuzz` sets ODAL_FUZZ_EXAMPLES=100 (15 operations: 1,500 requests).
EXAMPLES = int(os.environ.get("ODAL_FUZZ_EXAMPLES", "12"))
SENT: Counter = Counter()


@pytest.fixture
def admin_token(db, registry_sim):
    # In-process WSGI calls would close the test's connection at the end of each request, as
    # Django does between real requests; the test client avoids that the same way.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield issue_token("admin", name="fuzzer")
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.django_db
def test_api_survives_generated_requests(case, admin_token):
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"},
        checks=[not_a_server_error, response_schema_conformance, status_code_conformance],
    )
    SENT[(case.operation.label, response.status_code)] += 1


def fuzz_summary() -> list[str]:
    if not SENT:
        return []
    by_status = Counter()
    for (_, status), n in SENT.items():
        by_status[status] += n
    operations = len({label for label, _ in SENT})
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(by_status.items()))
    return [
        f"fuzz: {sum(SENT.values())} generated requests over {operations} operations ({statuses}); no 5xx"
    ]
