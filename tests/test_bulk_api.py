"""`POST dpp/bulk` (issue 16, item 1) through the real URLconf: up to 1,000 passports, each created
(and published) meaning exactly what `POST dpp` and `POST dpp/{id}/publish` mean for it, a result
per item in order, a bad item failing alone, idempotency, the boundary's refusals, the route's own
body limit, and a batch the database refuses."""

import json
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, TestCase
from django_q.models import OrmQ

from odal.core.models import AuditEntry, IdempotencyRecord, Passport
from outbox.models import Delivery, Event
from registry.models import Registration
from tests.factories import ConsumerFactory, PassportFactory, UserFactory, issue_token

pytestmark = pytest.mark.django_db

UPI = "https://id.example.eu/01/09506000134352/21/BULK-{}"


def item(n, **extra) -> dict:
    return {"upi": UPI.format(n), "operatorId": "OP-1", **extra}


def results(response) -> list[dict]:
    assert response.status_code == 200, response.content[:1000]
    return response.json()["results"]


def trail(passport_id) -> list[tuple]:
    return list(
        AuditEntry.objects.filter(object_id=str(passport_id))
        .order_by("id")
        .values_list("actor", "action", "object_type", "reason", "details")
    )


def test_bulk_publish_means_for_each_passport_what_post_dpp_then_publish_means(api_as):
    ConsumerFactory(name="billing", event_types=["passport.*"])
    ConsumerFactory(name="sites", event_types=["passport.published"], paused=True)
    ConsumerFactory(name="other", event_types=["order.*"])
    api = api_as("write")
    fields = {"facilityId": "FAC-7", "commodityCode": "8507 60", "data": {"capacityKwh": 75}}
    one = api.post("dpp", item(1, **fields)).json()["id"]
    assert api.post(f"dpp/{one}/publish").status_code == 200
    [created] = results(api.post("dpp/bulk", {"items": [item(2, **fields)], "publish": True}))
    bulk = created["id"]
    assert created == {"index": 0, "id": bulk}

    def shape(pk):
        passport = Passport.objects.get(pk=pk)
        reg = Registration.objects.get(passport_id=pk)
        event = Event.objects.get(payload__dppId=str(pk))
        return {
            "passport": (passport.status, passport.operator_id, passport.facility_id, passport.commodity_code,
                         passport.data, passport.suspended_at, passport.published_at == passport.updated_at),
            "registration": (reg.status, reg.operation, reg.attempts, reg.claim_token, reg.correlation_id,
                             reg.handle, reg.last_error, reg.note, reg.next_attempt_at <= reg.queued_at),
            "audit": [(action, object_type, reason, details) for _, action, object_type, reason, details in trail(pk)],
            "event": (event.type, {k: v for k, v in event.payload.items() if k not in ("dppId", "upi")}),
            "deliveries": sorted(event.deliveries.values_list("consumer__name", "status", "attempts", "max_attempts",
                                                              "next_attempt_at")),
            "api": {k: v for k, v in api.get(f"dpp/{pk}").json().items()
                    if k not in ("id", "upi", "createdAt", "updatedAt", "publishedAt", "registration")},
        }  # fmt: skip

    first, second = shape(one), shape(bulk)
    assert {k: v for k, v in first.items() if k != "deliveries"} == {
        k: v for k, v in second.items() if k != "deliveries"
    }
    assert (
        [d[:4] for d in first["deliveries"]]
        == [d[:4] for d in second["deliveries"]]
        == [
            ("billing", "pending", 0, 3),
            ("sites", "paused", 0, 3),
        ]
    )
    assert second["audit"] == [
        ("passport_created", "odal.passport", "", {}),
        ("passport_published", "odal.passport", "", {"registry": "registration queued"}),
    ]
    event = Event.objects.get(payload__dppId=bulk)
    assert event.payload == {"dppId": bulk, "upi": UPI.format(2), "operatorId": "OP-1", "status": "published"}
    assert all(d[4] == event.created_at for d in second["deliveries"])
    assert {a for a, *_ in trail(bulk)} == {a for a, *_ in trail(one)} == {"token:test-write"}


def test_each_item_gets_its_result_in_order_and_a_bad_one_fails_alone(api_as):
    existing = PassportFactory(upi=UPI.format("OLD"))
    items = [
        item(0),
        {"upi": "http://id.example.eu/01/1", "operatorId": "OP-1"},
        item(2, operatorId="  "),
        "not an object",
        {
            "upi": UPI.format("OLD").replace("https://id.", "HTTPS://ID."),
            "operatorId": "OP-1",
        },  # another spelling
        {
            "upi": UPI.format(0).replace("id.example.eu", "id.example.eu:443"),
            "operatorId": "OP-2",
        },  # item 0 again
        item(6, data={"mass": 3}),
    ]
    got = results(api_as("write").post("dpp/bulk", {"items": items}))

    assert [r["index"] for r in got] == list(range(7))
    made = {r["index"]: r["id"] for r in got if "id" in r}
    assert sorted(made) == [0, 6] and all("error" not in got[i] for i in made)
    errors = {r["index"]: r["error"] for r in got if "error" in r}
    assert {i: e["code"] for i, e in errors.items()} == {
        1: "invalid_request",
        2: "invalid_request",
        3: "invalid_request",
        4: "upi_taken",
        5: "upi_repeated",
    }
    # The API's own 422 for the same input: the same code and errors, the detail naming the field.
    alone = api_as("write").post("dpp", items[1]).json()
    assert errors[1]["errors"] == alone["errors"] and errors[1]["detail"].endswith(
        alone["detail"].split(". ", 1)[1]
    )
    assert errors[2]["detail"] == "This passport is not valid. operatorId: must not be blank."
    assert "JSON object" in errors[3]["detail"]
    assert errors[4]["dppId"] == str(existing.pk) and str(existing.pk) in errors[4]["detail"]
    assert api_as("write").post("dpp", items[4]).json()["code"] == errors[4]["code"]
    assert errors[5]["dppId"] == made[0] and "item 0" in errors[5]["detail"]
    assert set(Passport.objects.values_list("upi", flat=True)) == {
        UPI.format("OLD"),
        UPI.format(0),
        UPI.format(6),
    }
    assert Passport.objects.get(pk=made[6]).data == {"mass": 3}
    assert Passport.objects.get(pk=made[0]).status == "draft"  # publish not asked
    assert AuditEntry.objects.filter(action="passport_created").count() == 2
    assert not Registration.objects.exists() and not Event.objects.exists()


def test_up_to_1000_items_and_no_more(api_as):
    api = api_as("write")
    too_many = api.post("dpp/bulk", {"items": [item(n) for n in range(1001)]})
    assert too_many.status_code == 422, too_many.content[:300]
    assert too_many.json()["code"] == "invalid_request"
    assert "items: holds 1,001 passports, and a request holds at most 1,000" in too_many.json()["detail"]
    assert not Passport.objects.exists()

    got = results(api.post("dpp/bulk", {"items": [item(n) for n in range(1000)]}))
    assert len(got) == 1000 and all("id" in r for r in got)
    assert Passport.objects.count() == 1000


def test_a_repeat_with_the_same_idempotency_key_creates_nothing(api_as):
    token = issue_token("write")
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "line-7-batch-1"}
    body = {"items": [item(1), item(2), {"upi": "nope"}], "publish": True}

    def post(b):
        return Client().post("/vault/api/v1/dpp/bulk", b, content_type="application/json", headers=headers)

    first, again = post(body), post({"publish": True, "items": body["items"]})
    assert results(first) == results(again)
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert Passport.objects.count() == Registration.objects.count() == Event.objects.count() == 2
    other = post({**body, "publish": False})
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert Passport.objects.count() == 2


def test_a_staff_session_publishes_only_with_the_publish_permission():
    user = UserFactory()
    user.user_permissions.add(Permission.objects.get(codename="add_passport"))
    client = Client()
    client.force_login(user)

    def post(body):
        return client.post("/vault/api/v1/dpp/bulk", body, content_type="application/json")

    refused = post({"items": [item(1)], "publish": True})
    assert refused.status_code == 403 and refused.json()["code"] == "insufficient_permission"
    assert refused.json()["requiredPermission"] == "odal.publish_passport"
    assert not Passport.objects.exists()
    assert results(post({"items": [item(1)]}))[0]["id"]
    assert AuditEntry.objects.get().actor == f"user:{user.username}"


HOSTILE = {
    "NUL in a upi": ([item(0), {"upi": UPI.format("\u0000"), "operatorId": "OP"}], "upi", "cannot be stored"),
    "lone surrogate in a data key": ([item(0, data={"\ud800": 1})], "data.\ufffd", "cannot be stored"),
    "lone surrogate as an item": ([item(0), "\udfff"], "item", "cannot be stored"),
    "JSON 70 levels deep": ([item(0, data=json.loads("[" * 66 + "]" * 66))], "data", "nested more than 64"),
    "NaN in an item's data": ([item(0), item(1, data={"x": float("nan")})], "data.x", "is NaN, which is not"),
    "-Infinity as an item's operatorId": ([item(0, operatorId=float("-inf"))], "operatorId", "is -Infinity"),
}  # fmt: skip


@pytest.mark.parametrize("items, field, problem", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("key", [None, "hostile-1"])
def test_an_item_holding_what_postgresql_cannot_store_fails_alone(api_as, items, field, problem, key):
    """The boundary leaves each item to the route, so a NUL in one passport of a thousand costs
    that passport, not the other 999; with an Idempotency-Key too (its hash reads the item)."""
    api = api_as("write")
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    body = json.dumps({"items": [*items, item(7)], "publish": True})
    response = api.post("dpp/bulk", body, **headers)
    assert response.status_code == 200, response.content[:300]
    out = response.json()["results"]
    bad = len(items) - 1
    assert [r["index"] for r in out] == list(range(len(items) + 1))
    error = out[bad]["error"]
    assert error["code"] == "invalid_request" and error["errors"][0]["field"].startswith(field)
    assert problem in error["detail"] and "id" not in out[bad]
    made = [r["id"] for i, r in enumerate(out) if i != bad]
    assert sorted(map(str, Passport.objects.values_list("pk", flat=True))) == sorted(made)
    assert Registration.objects.count() == len(made)
    if key:
        assert api.post("dpp/bulk", body, **headers).json()["results"] == out
        assert Passport.objects.count() == len(made)


def test_the_rest_of_a_bulk_body_is_still_refused_at_the_boundary(api_as):
    response = api_as("write").post("dpp/bulk", json.dumps({"items": [item(0)], "pub\u0000lish": True}))
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    assert not Passport.objects.exists()


def test_a_number_no_float_carries_fails_its_item_alone_and_elsewhere_the_body(api_as):
    api = api_as("write")
    good, bad = (
        json.dumps(item(1)),
        '{"upi": "' + UPI.format(2) + '", "operatorId": "OP", "data": {"x": 1e400}}',
    )
    out = results(api.post("dpp/bulk", '{"items": [' + good + ", " + bad + "]}"))
    assert out[0]["id"] and out[1]["error"]["errors"] == [
        {"field": "data.x", "message": "is the number 1e400, which is too large to store"}
    ]
    assert list(Passport.objects.values_list("upi", flat=True)) == [UPI.format(1)]
    # Outside the items, the boundary refuses the whole body, as for any route.
    response = api.post("dpp/bulk", '{"items": [' + json.dumps(item(3)) + '], "publish": NaN}')
    assert response.status_code == 422 and response.json()["errors"] == [
        {"field": "publish", "message": "is NaN, which is not a number JSON can carry"}
    ]
    assert Passport.objects.count() == 1


def test_the_bulk_route_has_a_body_limit_of_its_own(api_as, settings, client):
    settings.ODAL_MAX_BODY_BYTES = 2048
    settings.ODAL_MAX_BULK_BODY_BYTES = 50_000
    api = api_as("write")
    items = [item(n, data={"note": "x" * 200}) for n in range(40)]  # about 12 kB
    assert len(results(api.post("dpp/bulk", {"items": items}))) == 40
    assert api.post("dpp", item(99, data={"note": "x" * 3000})).status_code == 413
    too_big = api.post("dpp/bulk", {"items": [item(n, data={"note": "x" * 2000}) for n in range(40)]})
    assert too_big.status_code == 413 and "50000 bytes" in too_big.json()["detail"]
    # Past the API, a body over ODAL_MAX_BODY_BYTES is what Django answers past its own limit.
    form = urlencode({"username": "x" * 5000, "password": "y"})
    assert (
        client.post("/admin/login/", form, content_type="application/x-www-form-urlencoded").status_code
        == 400
    )
    assert Passport.objects.count() == 40


REFUSE_UPIS = """
CREATE FUNCTION odal_test_refuse_passport() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'this database refuses %', NEW.upi; END $$;
CREATE TRIGGER odal_test_refuse_passport BEFORE INSERT ON odal_passport
    FOR EACH ROW WHEN (NEW.upi LIKE '%%REFUSED%%') EXECUTE FUNCTION odal_test_refuse_passport();
"""


def refuse_upis(on: bool = True) -> None:
    """The database refuses any passport whose UPI holds REFUSED (a trigger, for this test only)."""
    with connection.cursor() as cursor:
        if on:
            cursor.execute(REFUSE_UPIS)
        else:
            cursor.execute("DROP TRIGGER odal_test_refuse_passport ON odal_passport")


def test_a_batch_the_database_refuses_fails_its_items_and_leaves_the_key_free(api_as):
    refuse_upis()
    token = issue_token("write")
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k-1"}
    body = {"items": [item(0), {"upi": "nope", "operatorId": "OP"}, item("REFUSED")], "publish": True}

    def post():
        return Client().post("/vault/api/v1/dpp/bulk", body, content_type="application/json", headers=headers)

    got = results(post())
    assert [r.get("error", {}).get("code") for r in got] == [
        "batch_failed",
        "invalid_request",
        "batch_failed",
    ]
    assert "The database refused the batch of 2 passports" in got[0]["error"]["detail"]
    assert (
        "this database refuses" in got[0]["error"]["detail"]
        and "Safe to try again" in got[0]["error"]["detail"]
    )
    assert not Passport.objects.exists() and not AuditEntry.objects.exists() and not Event.objects.exists()
    assert not IdempotencyRecord.objects.exists()

    refuse_upis(False)
    again = post()
    assert "Idempotent-Replayed" not in again.headers
    assert [("id" in r) for r in results(again)] == [True, False, True]
    assert Passport.objects.filter(status="published").count() == Registration.objects.count() == 2


def test_one_request_kicks_the_drain_once_and_wakes_the_sweep_once(api_as, settings):
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory(event_types=["passport.*"])
    with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
        got = results(
            api_as("write").post("dpp/bulk", {"items": [item(n) for n in range(300)], "publish": True})
        )
    assert all("id" in r for r in got)
    assert len(callbacks) == 2  # one drain kick, one wake of the sweep
    assert sorted(task.func() for task in OrmQ.objects.all()) == [
        "outbox.tasks.sweep",
        "registry.tasks.drain",
    ]
    assert Delivery.objects.count() == Registration.objects.count() == 300


def test_on_a_node_without_registry_queues_bulk_publish_queues_none(api_as, settings):
    settings.ODAL_REGISTRY_ADAPTER = "none"
    settings.ODAL_KICK_SWEEP = True
    with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
        [made] = results(api_as("write").post("dpp/bulk", {"items": [item(1)], "publish": True}))
    assert Passport.objects.get(pk=made["id"]).status == "published"
    assert not Registration.objects.exists() and not callbacks  # no drain kick (and no consumer to wake)
    assert AuditEntry.objects.get(action="passport_published").details == {
        "registry": "no registry queues on this node"
    }
