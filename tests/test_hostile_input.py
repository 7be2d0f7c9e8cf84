"""Hostile input at the surfaces: strings PostgreSQL cannot store (NUL, lone surrogates), absurd
nesting and numbers JSON cannot carry are refused with a 4xx before any handler runs, in the API
and in the admin forms; an unexpected error is a JSON 500 with an errorId, never a traceback."""

import json
import logging
import uuid

import pytest
from django.contrib.admin import helpers

from odal.core.models import AuditEntry, Passport
from outbox.models import Consumer, Delivery, Event
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    PassportFactory,
    backed_off_registration,
)

pytestmark = pytest.mark.django_db

NUL, SURROGATE = "\u0000", "\ud800"
UPI = "https://id.example.eu/01/09506000134352/21/SER-1"


def refused(response, field: str):
    """The response is the boundary's 422 and names `field`."""
    assert response.status_code == 422, response.content[:500]
    body = response.json()
    assert body["code"] == "invalid_request"
    assert f"{field}:" in body["detail"] and "cannot be stored" in body["detail"], body["detail"]
    return body


# -- the two observations of the issue ------------------------------------------------------------

EVENT_PAYLOADS = {
    "nul in a value": ({"note": NUL}, "payload.note"),
    "surrogate in a value": ({"note": f"a{SURROGATE}b"}, "payload.note"),
    "nul in a key": ({f"k{NUL}": 1}, "payload.k\ufffd"),
    "surrogate in a key": ({SURROGATE: 1}, "payload.\ufffd"),
    "nul nested in a list": ({"items": [{"ok": "x"}, {"name": ["y", NUL]}]}, "payload.items[1].name[1]"),
    "surrogate nested in a key": ({"a": {"b": {f"{SURROGATE}c": True}}}, "payload.a.b.\ufffdc"),
}


@pytest.mark.parametrize("payload, field", EVENT_PAYLOADS.values(), ids=EVENT_PAYLOADS.keys())
def test_post_events_with_an_unstorable_character_anywhere_in_the_payload_is_422(admin_api, payload, field):
    ConsumerFactory(event_types=[])
    refused(admin_api.post("events", {"type": "passport.published", "payload": payload}), field)
    assert not Event.objects.exists() and not Delivery.objects.exists()


@pytest.mark.parametrize("char", [NUL, SURROGATE], ids=["nul", "surrogate"])
def test_post_dpp_with_an_unstorable_character_in_upi_is_422(admin_api, char):
    refused(admin_api.post("dpp", {"upi": UPI + char, "operatorId": "OP-1"}), "upi")
    assert not Passport.objects.exists()


# -- the boundary ---------------------------------------------------------------------------------


def test_unstorable_input_is_refused_before_the_handler_runs(admin_api, monkeypatch):
    def handler_ran(*args, **kwargs):
        raise AssertionError("the handler ran")

    monkeypatch.setattr("outbox.api.emit", handler_ran)
    refused(admin_api.post("events", {"type": f"a{NUL}", "payload": {}}), "type")


def test_unstorable_input_in_a_body_is_refused_for_every_body_route(admin_api):
    reg = backed_off_registration()
    for path in [
        "dpp",
        f"dpp/{reg.passport_id}/registry/abandon",
        f"dpp/{reg.passport_id}/registry/handle",
        "outbox/consumers",
        "outbox/replay",
        f"outbox/deliveries/{DeadDeliveryFactory().pk}/replay",
    ]:
        refused(admin_api.post(path, {"reason": f"fine{NUL}"}), "reason")
    assert not AuditEntry.objects.exists()


def test_a_query_parameter_with_nul_is_422(admin_api):
    refused(admin_api.get("outbox/deliveries", consumer=NUL), "consumer")
    refused(admin_api.get("outbox/deliveries", **{f"x{NUL}": "1"}), "x\ufffd")


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "production"])
def test_too_many_query_parameters_is_a_json_400_not_a_traceback(admin_api, settings, debug):
    settings.DEBUG = debug
    response = admin_api.get("outbox/deliveries", **{f"p{n}": "1" for n in range(1200)})
    assert (response.status_code, response.json()["code"]) == (400, "bad_request")


def test_a_path_with_nul_is_422(admin_api):
    refused(admin_api.get(f"outbox/deliveries/{NUL}"), "path")


def test_a_json_string_body_with_nul_is_422(admin_api):
    refused(admin_api.post("events", json.dumps(NUL)), "body")


def test_json_nested_deeper_than_64_levels_is_422(admin_api):
    payload = {"a": 1}
    for _ in range(70):
        payload = {"a": payload}
    response = admin_api.post("events", {"type": "passport.published", "payload": payload})
    assert response.status_code == 422
    assert "nested more than 64 levels deep" in response.json()["detail"]
    assert not Event.objects.exists()


def test_json_nested_100k_levels_deep_is_422_not_a_500(admin_api):
    body = '{"type": "x", "payload": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = admin_api.post("events", body)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_request"
    assert "nested" in response.json()["detail"]


def test_json_nested_at_64_levels_is_accepted(admin_api):
    payload = {}
    for _ in range(63):  # the body itself and `payload` are the two outer levels
        payload = {"a": payload}
    response = admin_api.post("events", {"type": "passport.published", "payload": payload})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_numbers_json_cannot_carry_are_422(admin_api, number):
    body = '{"type": "passport.published", "payload": {"n": ' + number + "}}"
    response = admin_api.post("events", body)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_request"
    assert not Event.objects.exists()


def test_a_body_that_is_not_json_is_still_400_malformed_body(admin_api):
    for body in ['{"type": ', "\xff\xfe not json", "{'single': 'quotes'}"]:
        response = admin_api.post("events", body)
        assert (response.status_code, response.json()["code"]) == (400, "malformed_body")


def test_a_1_mb_string_in_a_body_is_413(admin_api):
    response = admin_api.post("events", {"type": "passport.published", "payload": {"s": "x" * 1_000_000}})
    assert (response.status_code, response.json()["code"]) == (413, "body_too_large")


def test_the_boundary_lets_ordinary_unicode_through(admin_api):
    payload = {"name": "Ünïcødé ✓ 😀 \ufffd", "nested": [{"ключ": "значение"}]}
    response = admin_api.post("events", {"type": "passport.published", "payload": payload})
    assert response.status_code == 201
    assert Event.objects.get().payload == payload


# -- no traceback leaves the API ------------------------------------------------------------------


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "production"])
def test_an_unexpected_error_is_a_json_500_with_an_error_id_in_the_log(
    admin_api, monkeypatch, settings, caplog, debug
):
    settings.DEBUG = debug

    def explode():
        raise RuntimeError("secret internals")

    monkeypatch.setattr("outbox.api.outbox_counts", explode)
    admin_api.client.raise_request_exception = False
    with caplog.at_level(logging.ERROR):
        response = admin_api.get("outbox")
    text = response.content.decode()
    assert "Traceback" not in text and "secret internals" not in text, text[:200]
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json"), text[:200]
    body = response.json()
    assert body["code"] == "internal_error" and body["errorId"]
    assert body["errorId"] in body["detail"]
    logged = [r for r in caplog.records if body["errorId"] in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[1].args == ("secret internals",)


# -- admin forms ----------------------------------------------------------------------------------


def passport_form(**fields):
    return {
        "upi": UPI,
        "operator_id": "OP-1",
        "facility_id": "",
        "commodity_code": "",
        "data": "{}",
        **fields,
    }


@pytest.mark.parametrize(
    "data, shown",
    [
        ('{"a": "\\u0000"}', "data.a contains the NUL character"),
        ('{"\\ud800": 1}', "data.\ufffd has a key that contains a lone surrogate"),
        ('{"a": [{"b": "x\\udfff"}]}', "data.a[0].b contains a lone surrogate"),
        ("[" * 70 + "]" * 70, "nested more than 64 levels deep"),
        ("[" * 100_000 + "]" * 100_000, "Nested more than 64 levels deep"),
    ],
    ids=["nul", "surrogate key", "nested surrogate", "deep", "too deep for python"],
)
def test_admin_passport_add_refuses_unstorable_json_in_data(admin_client, data, shown):
    response = admin_client.post("/admin/odal/passport/add/", passport_form(data=data))
    assert response.status_code == 200
    assert shown in response.content.decode()
    assert not Passport.objects.exists()


def test_admin_passport_change_refuses_unstorable_json_in_data(admin_client):
    passport = PassportFactory(data={"ok": 1})
    response = admin_client.post(
        f"/admin/odal/passport/{passport.pk}/change/", passport_form(data='{"ok": "\\u0000"}')
    )
    assert response.status_code == 200 and "data.ok contains the NUL character" in response.content.decode()
    passport.refresh_from_db()
    assert passport.data == {"ok": 1}


def test_admin_passport_add_refuses_nul_in_text_fields(admin_client):
    response = admin_client.post("/admin/odal/passport/add/", passport_form(operator_id=f"OP{NUL}1"))
    assert response.status_code == 200 and b"Null characters are not allowed" in response.content
    assert not Passport.objects.exists()


def consumer_form(**fields):
    return {
        "name": "billing", "kind": "python", "url": "", "target": "tests.consumers.accept", "event_types": "[]",
        "max_attempts": "3", "timeout_seconds": "5", **fields,
    }  # fmt: skip


@pytest.mark.parametrize("event_types", ['["passport.\\u0000"]', '["\\ud800"]', '{"a\\u0000": 1}'])
def test_admin_consumer_add_refuses_unstorable_event_types(admin_client, event_types):
    response = admin_client.post("/admin/outbox/consumer/add/", consumer_form(event_types=event_types))
    assert response.status_code == 200 and b"errornote" in response.content
    assert not Consumer.objects.exists()


def test_admin_consumer_change_refuses_unstorable_event_types(admin_client):
    consumer = ConsumerFactory(event_types=["passport.*"])
    response = admin_client.post(
        f"/admin/outbox/consumer/{consumer.pk}/change/", consumer_form(event_types='["\\udc00"]')
    )
    assert response.status_code == 200 and b"cannot be stored" in response.content
    consumer.refresh_from_db()
    assert consumer.event_types == ["passport.*"]


def test_admin_reason_forms_refuse_nul(admin_client):
    passport = PassportFactory()
    data = {"action": "publish_selected", helpers.ACTION_CHECKBOX_NAME: [str(passport.pk)], "post": "yes"}
    response = admin_client.post("/admin/odal/passport/", {**data, "reason": f"ok{NUL}"})
    assert response.status_code == 200 and b"Null characters are not allowed" in response.content
    assert Passport.objects.get().status == "draft"

    dead = DeadDeliveryFactory()
    data = {"action": "replay_selected", helpers.ACTION_CHECKBOX_NAME: [str(dead.pk)], "post": "yes"}
    response = admin_client.post("/admin/outbox/delivery/", {**data, "reason": f"ok{NUL}"})
    assert response.status_code == 200 and b"Null characters are not allowed" in response.content
    assert Delivery.objects.get().status == "dead"

    reg = backed_off_registration(status="submitted", correlation_id="req-1")
    data = {"action": "record_handle_selected", helpers.ACTION_CHECKBOX_NAME: [str(reg.pk)], "post": "yes"}
    response = admin_client.post(
        "/admin/registry/registration/", {**data, "handle": f"reg{NUL}", "reason": "read off the portal"}
    )
    assert response.status_code == 200 and b"Null characters are not allowed" in response.content
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "changelist, action",
    [
        ("/admin/odal/passport/", "publish_selected"),
        ("/admin/outbox/delivery/", "replay_selected"),
        ("/admin/outbox/deadletter/", "replay_selected"),
        ("/admin/registry/registration/", "abandon_selected"),
        ("/admin/registry/stalledregistration/", "abandon_selected"),
        ("/admin/outbox/consumer/", "delete_selected"),
        ("/admin/odal/apitoken/", "revoke_selected"),
    ],
)
@pytest.mark.parametrize("selected", ["not-a-uuid", NUL, "99999999999999999999999"])
def test_admin_action_with_a_selected_id_that_is_not_one_is_refused_not_a_500(
    admin_client, changelist, action, selected
):
    data = {"action": action, helpers.ACTION_CHECKBOX_NAME: [selected, str(uuid.uuid4())], "post": "yes"}
    response = admin_client.post(changelist, {**data, "reason": "fine"}, follow=True)
    assert response.status_code == 200
    assert b"not one of the rows" in response.content
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "changelist",
    [
        "/admin/odal/passport/",
        "/admin/outbox/delivery/",
        "/admin/registry/registration/",
        "/admin/odal/auditentry/",
    ],
)
def test_admin_search_with_nul_is_not_a_500(admin_client, changelist):
    # A 400 from the boundary (UnstorableInputMiddleware), as for a NUL in any admin address.
    assert admin_client.get(changelist, {"q": f"x{NUL}"}).status_code == 400


def test_the_api_reads_the_body_the_boundary_parsed_and_checked(admin_api, monkeypatch):
    def second_parse(self, request):
        raise AssertionError("the body was parsed a second time")

    monkeypatch.setattr("ninja.parser.Parser.parse_body", second_parse)
    response = admin_api.post("events", {"type": "passport.published", "payload": {"n": 1}})
    assert response.status_code == 201
