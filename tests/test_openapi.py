import json
import re
from pathlib import Path

from odal.surfaces.api import api

CHECKED_IN = Path(__file__).resolve().parent.parent / "docs" / "api" / "openapi.json"
DOCS = CHECKED_IN.parent / "README.md"


def test_checked_in_openapi_is_current():
    current = json.loads(json.dumps(api.get_openapi_schema(), sort_keys=True, default=str))
    assert json.loads(CHECKED_IN.read_text()) == current, "docs/api/openapi.json is stale: run `make openapi`"


# Every operation's operationId: what a client generated from docs/api/openapi.json names its
# functions after (issue 37). They are public names now, as CONTRACT.md's are: add to this list,
# never rename in it (docs/api/README.md lists them for clients).
OPERATION_IDS = {
    "GET /vault/api/v1/dpp": "listPassports",
    "POST /vault/api/v1/dpp": "createPassport",
    "POST /vault/api/v1/dpp/bulk": "createPassports",
    "GET /vault/api/v1/dpp/{dppId}": "getPassport",
    "POST /vault/api/v1/dpp/{dppId}/publish": "publishPassport",
    "POST /vault/api/v1/dpp/{dppId}/suspend": "suspendPassport",
    "GET /vault/api/v1/dpp/{dppId}/registry": "getRegistration",
    "POST /vault/api/v1/dpp/{dppId}/registry/abandon": "abandonRegistration",
    "POST /vault/api/v1/dpp/{dppId}/registry/handle": "recordHandle",
    "GET /vault/api/v1/registry": "getRegistryCounts",
    "POST /vault/api/v1/events": "createEvent",
    "GET /vault/api/v1/events/{eventId}": "getEvent",
    "GET /vault/api/v1/outbox": "getOutboxCounts",
    "GET /vault/api/v1/outbox/consumers": "listConsumers",
    "POST /vault/api/v1/outbox/consumers": "createConsumer",
    "GET /vault/api/v1/outbox/consumers/{name}": "getConsumer",
    "PATCH /vault/api/v1/outbox/consumers/{name}": "changeConsumer",
    "DELETE /vault/api/v1/outbox/consumers/{name}": "removeConsumer",
    "POST /vault/api/v1/outbox/consumers/{name}/pause": "pauseConsumer",
    "POST /vault/api/v1/outbox/consumers/{name}/resume": "resumeConsumer",
    "POST /vault/api/v1/outbox/consumers/{name}/rotate-secret": "rotateConsumerSecret",
    "POST /vault/api/v1/outbox/consumers/{name}/test-event": "sendTestEvent",
    "GET /vault/api/v1/outbox/deliveries": "listDeliveries",
    "GET /vault/api/v1/outbox/deliveries/{deliveryId}": "getDelivery",
    "POST /vault/api/v1/outbox/deliveries/{deliveryId}/replay": "replayDelivery",
    "POST /vault/api/v1/outbox/deliveries/{deliveryId}/resend": "resendDelivery",
    "POST /vault/api/v1/outbox/replay": "replayDeliveries",
    "POST /vault/api/v1/outbox/resend": "resendDeliveries",
}
LOWER_CAMEL_CASE = re.compile(r"[a-z]+(?:[A-Z][a-z0-9]*)*")


def operations() -> dict[str, dict]:
    schema = api.get_openapi_schema()
    return {
        f"{method.upper()} {path}": op for path, ops in schema["paths"].items() for method, op in ops.items()
    }


def test_every_operation_has_its_fixed_operation_id():
    """A rename fails here, as does a new route without its name in the list above."""
    assert {key: op.get("operationId") for key, op in operations().items()} == OPERATION_IDS


def test_every_operation_id_is_explicit_unique_and_lower_camel_case():
    explicit = [
        (operation.view_func.__name__, operation.operation_id)
        for _prefix, router in api._routers
        for path_view in router.path_operations.values()
        for operation in path_view.operations
    ]
    assert all(given for _name, given in explicit), [name for name, given in explicit if not given]
    ids = [given for _name, given in explicit]
    assert len(ids) == len(set(ids)) == len(OPERATION_IDS)
    assert all(LOWER_CAMEL_CASE.fullmatch(given) for given in ids), ids


def test_the_checked_in_document_and_the_docs_name_the_same_operation_ids():
    checked_in = json.loads(CHECKED_IN.read_text())["paths"]
    assert {
        f"{m.upper()} {p}": op["operationId"] for p, ops in checked_in.items() for m, op in ops.items()
    } == (OPERATION_IDS)
    listed = DOCS.read_text()
    for key, operation_id in OPERATION_IDS.items():
        method, path = key.split(" ")
        assert f"| `{operation_id}` | `{method} {path.removeprefix('/vault/api/v1/')}` |" in listed, (
            operation_id
        )
