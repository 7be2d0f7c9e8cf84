"""The read routes: passports a page at a time (GET dpp), one event with its deliveries
(GET events/{id}) and the delivery list filtered by event (GET outbox/deliveries?eventId=)."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from odal.core.models import Passport
from odal.surfaces.api import with_registration
from outbox.events import emit
from tests.factories import (
    ConsumerFactory,
    DeliveryFactory,
    EventFactory,
    PassportFactory,
    RegistrationFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def staff_with(*perms) -> Client:
    user = UserFactory()
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


def read_all(client, path, **params) -> list[dict]:
    """Every item of a paged list, following nextCursor to the end."""
    items, cursor = [], None
    for _ in range(100):
        page = client.get(path, **params, **({"cursor": cursor} if cursor else {})).json()
        items += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return items
    raise AssertionError("the cursor never ran out")


def queries_of(client, path, **params) -> int:
    """How many statements one read of `path` runs (the caller's token already seen once, so its
    first-use bookkeeping is not counted)."""
    with CaptureQueriesContext(connection) as seen:
        assert client.get(path, **params).status_code == 200
    return len(seen)


def newest_first(passports) -> list[str]:
    return [str(p.pk) for p in sorted(passports, key=lambda p: (p.created_at, p.pk), reverse=True)]


# -- GET dpp --------------------------------------------------------------------------------------


def test_passports_page_newest_first_without_duplicates_or_gaps(api_as):
    now = timezone.now()
    spread = [PassportFactory(created_at=now - timedelta(seconds=i)) for i in range(5)]
    # Created in the same microsecond: only the id tells them apart, and pages may split them.
    tied = [PassportFactory(created_at=now - timedelta(seconds=2, microseconds=1)) for _ in range(5)]
    expected = newest_first(spread + tied)

    for limit in (1, 2, 3, 4, 10):
        seen = [item["id"] for item in read_all(api_as("read"), "dpp", limit=limit)]
        assert seen == expected, f"limit={limit}"

    whole = api_as("read").get("dpp").json()  # the default limit (50) holds them all
    assert [item["id"] for item in whole["items"]] == expected and whole["nextCursor"] is None


def test_a_listed_passport_has_the_shape_of_get_dpp(api_as):
    passport = PassportFactory(data={"mass": 3})
    [item] = api_as("read").get("dpp").json()["items"]
    assert item == api_as("read").get(f"dpp/{passport.pk}").json()


@pytest.mark.parametrize("status", Passport.Status.values)
def test_passports_filter_by_status_across_pages(api_as, status):
    now = timezone.now()
    passports = [
        PassportFactory(status=s, created_at=now - timedelta(seconds=i))
        for i, s in enumerate(Passport.Status.values * 3)
    ]
    items = read_all(api_as("read"), "dpp", status=status, limit=2)
    assert [item["id"] for item in items] == newest_first(p for p in passports if p.status == status)
    assert {item["status"] for item in items} == {status}


@pytest.mark.parametrize(
    "params, code",
    [
        ({"status": "lost"}, "invalid_status"),
        ({"status": "DRAFT"}, "invalid_status"),
        ({"cursor": "garbage!"}, "invalid_cursor"),
        ({"cursor": "MjAyNi0xMi0wMVQwMDowMDowMHxub3QtYS11dWlk"}, "invalid_cursor"),  # a time, then no uuid
        ({"limit": 0}, "invalid_request"),
        ({"limit": 201}, "invalid_request"),
        ({"limit": "ten"}, "invalid_request"),
    ],
)
def test_bad_passport_list_parameters_are_422_with_a_sentence(api_as, params, code):
    PassportFactory()
    response = api_as("read").get("dpp", **params)
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == code and body["detail"].endswith(".")


def test_the_largest_page_is_200(api_as):
    assert api_as("read").get("dpp", limit=200).status_code == 200


def test_listing_passports_needs_credentials_and_the_view_permission(api_as):
    PassportFactory()
    assert api_as(None).get("dpp").status_code == 401
    assert Client().get("/vault/api/v1/dpp", headers={"Authorization": "Bearer odal_nope"}).status_code == 401
    refused = staff_with("outbox.view_delivery").get("/vault/api/v1/dpp")
    assert refused.status_code == 403 and refused.json()["requiredPermission"] == "odal.view_passport"
    allowed = staff_with("odal.view_passport").get("/vault/api/v1/dpp")
    assert allowed.status_code == 200 and len(allowed.json()["items"]) == 1
    for scope in ("read", "write", "admin"):
        assert api_as(scope).get("dpp").status_code == 200


def test_a_page_of_passports_is_as_many_queries_for_one_as_for_many(api_as):
    for _ in range(25):
        RegistrationFactory()  # a published passport with its registration, which the answer shows
    client = api_as("read")
    client.get("dpp")
    assert queries_of(client, "dpp", limit=1) == queries_of(client, "dpp", limit=25)


def test_the_passport_list_is_served_by_its_index():
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        rows = with_registration(Passport.objects).order_by("-created_at", "-id")  # as GET dpp reads them
        query, params = rows[:51].query.sql_with_params()
        cursor.execute(f"EXPLAIN {query}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "passport_listing_idx" in plan and "Sort" not in plan, plan


# -- GET events/{id} --------------------------------------------------------------------------------


def test_an_event_is_shown_with_its_deliveries(api_as):
    ConsumerFactory(name="billing")
    ConsumerFactory(name="archive")
    ConsumerFactory(name="other", event_types=["order.*"])
    event, _ = emit("passport.published", {"upi": "https://id.example.eu/1"})
    emit("passport.published", {"upi": "https://id.example.eu/2"})  # another event's deliveries

    response = api_as("read").get(f"events/{event.pk}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert {k: body[k] for k in ("id", "type", "payload")} == {
        "id": str(event.pk),
        "type": "passport.published",
        "payload": {"upi": "https://id.example.eu/1"},
    }
    assert body["createdAt"].startswith(event.created_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert [d["consumer"] for d in body["deliveries"]] == ["archive", "billing"]
    # the shape of the delivery list, item for item
    listed = api_as("read").get("outbox/deliveries", eventId=str(event.pk)).json()["items"]
    assert sorted(body["deliveries"], key=lambda d: d["id"]) == sorted(listed, key=lambda d: d["id"])


def test_an_event_is_as_many_queries_with_one_delivery_as_with_many(api_as):
    one, many = EventFactory(), EventFactory()
    DeliveryFactory(event=one)
    for _ in range(25):
        DeliveryFactory(event=many)  # each to a consumer of its own
    client = api_as("read")
    client.get(f"events/{one.pk}")
    assert queries_of(client, f"events/{one.pk}") == queries_of(client, f"events/{many.pk}")


def test_a_page_of_deliveries_is_as_many_queries_for_one_as_for_many(api_as):
    for _ in range(25):
        DeliveryFactory()  # each of an event and to a consumer of its own
    client = api_as("read")
    client.get("outbox/deliveries")
    assert queries_of(client, "outbox/deliveries", limit=1) == queries_of(
        client, "outbox/deliveries", limit=25
    )


def test_an_event_without_deliveries_is_shown_with_none(api_as):
    event = EventFactory()
    body = api_as("read").get(f"events/{event.pk}").json()
    assert body["id"] == str(event.pk) and body["deliveries"] == []


def test_an_unknown_event_is_404(api_as):
    EventFactory()
    response = api_as("read").get(f"events/{uuid.uuid4()}")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_showing_an_event_needs_credentials_and_the_view_permission(api_as):
    event = EventFactory()
    path = f"/vault/api/v1/events/{event.pk}"
    assert api_as(None).get(f"events/{event.pk}").status_code == 401
    refused = staff_with("odal.view_passport").get(path)
    assert refused.status_code == 403 and refused.json()["requiredPermission"] == "outbox.view_delivery"
    assert staff_with("outbox.view_delivery").get(path).status_code == 200
    assert api_as("read").get(f"events/{event.pk}").status_code == 200


# -- GET outbox/deliveries?eventId= -----------------------------------------------------------------


def test_deliveries_filter_by_event(api_as):
    mine, other = EventFactory(), EventFactory()
    wanted = {str(DeliveryFactory(event=mine).pk) for _ in range(3)}
    DeliveryFactory(event=other)
    items = read_all(api_as("read"), "outbox/deliveries", eventId=str(mine.pk), limit=2)
    assert {item["id"] for item in items} == wanted and len(items) == 3
    assert {item["eventId"] for item in items} == {str(mine.pk)}
    assert api_as("read").get("outbox/deliveries", eventId=str(uuid.uuid4())).json()["items"] == []


@pytest.mark.parametrize("event_id", ["not-a-uuid", "1234", "' OR 1=1 --"])
def test_a_bad_event_id_filter_is_422_with_a_sentence(api_as, event_id):
    DeliveryFactory()
    response = api_as("read").get("outbox/deliveries", eventId=event_id)
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "invalid_request" and "eventId" in body["detail"]
    assert body["detail"].endswith(".")


# -- GET outbox/deliveries?eventType=: the delivery's own copy of its event's type (issue 26) ---------


def test_every_delivery_carries_its_events_type_however_it_was_made(api_as):
    from outbox.events import emit_many
    from outbox.models import Delivery

    ConsumerFactory(name="billing")
    ConsumerFactory(name="archive", paused=True)
    emit("passport.published", {"n": 1})
    emit_many("passport.imported", [{"n": 2}, {"n": 3}])
    rows = list(Delivery.objects.select_related("event"))
    assert len(rows) == 6
    assert all(d.event_type == d.event.type for d in rows), [(d.event_type, d.event.type) for d in rows]


def test_deliveries_filter_by_event_type_across_pages(api_as):
    ConsumerFactory(name="billing")
    ConsumerFactory(name="archive")
    for n in range(4):
        emit("passport.published" if n % 2 else "order.shipped", {"n": n})
    items = read_all(api_as("read"), "outbox/deliveries", eventType="order.shipped", limit=3)
    assert len(items) == 4 and {i["eventType"] for i in items} == {"order.shipped"}


def test_the_event_type_filter_is_served_by_its_index(api_as):
    # The page as GET outbox/deliveries?eventType= reads it: a walk of delivery_type_idx, newest
    # first, no event joined to filter and no sort (a rare type read the whole table).
    DeliveryFactory(event__type="order.shipped")
    client = api_as("read")
    with CaptureQueriesContext(connection) as queries:
        assert client.get("outbox/deliveries", eventType="order.shipped").status_code == 200
    (page,) = [
        q["sql"] for q in queries.captured_queries if "LIMIT" in q["sql"] and "outbox_delivery" in q["sql"]
    ]
    with connection.cursor() as cursor:
        # (a plan for the big table, whatever the few rows here: bitmaps and sorts win at 1 row)
        cursor.execute(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off"
        )
        cursor.execute(f"EXPLAIN {page}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "delivery_type_idx" in plan and "Sort" not in plan, plan


def test_the_migration_copies_each_older_deliverys_event_type():
    # Deliveries made before 0016 carry '' (its column default): it fills them in batches.
    import importlib

    from outbox.models import Delivery

    migration = importlib.import_module("outbox.migrations.0016_delivery_event_type")
    for n in range(5):
        DeliveryFactory(event__type=f"passport.t{n}")
    Delivery.objects.update(event_type="")
    assert Delivery.objects.filter(event_type="").count() == 5
    original = migration.BATCH
    migration.BATCH = 2  # (three batches and an empty one)
    try:
        with connection.schema_editor() as editor:
            migration.copy_event_types(None, editor)
    finally:
        migration.BATCH = original
    assert sorted(Delivery.objects.values_list("event_type", flat=True)) == [
        f"passport.t{n}" for n in range(5)
    ]


def test_the_migration_ends_when_an_events_type_is_empty():
    # (the review's: '' written again each batch read as work done, for ever)
    import importlib

    from outbox.models import Delivery, Event

    migration = importlib.import_module("outbox.migrations.0016_delivery_event_type")
    odd = DeliveryFactory(event=Event.objects.create(type="", payload={}))
    fine = [DeliveryFactory(event__type="passport.published") for _ in range(3)]
    Delivery.objects.update(event_type="")
    original = migration.BATCH
    migration.BATCH = 1
    try:
        with connection.schema_editor() as editor:
            migration.copy_event_types(None, editor)
    finally:
        migration.BATCH = original
    assert Delivery.objects.get(pk=odd.pk).event_type == ""
    assert {Delivery.objects.get(pk=d.pk).event_type for d in fine} == {"passport.published"}


def test_deliveries_made_without_their_type_get_it_from_the_retention_task():
    # A process of the release before 0016, still running after it (a rolling deploy), makes
    # deliveries with the column's default: the retention task gives them their type.
    from outbox import tasks
    from outbox.models import Delivery

    made = [DeliveryFactory(event__type=f"passport.t{n}") for n in range(5)]
    Delivery.objects.filter(pk__in=[d.pk for d in made[:4]]).update(event_type="")
    assert Delivery.objects.copy_event_types(batch=2, max_batches=1) == 2  # (bounded per call)
    tasks.purge()
    assert sorted(Delivery.objects.values_list("event_type", flat=True)) == [
        f"passport.t{n}" for n in range(5)
    ]
    assert Delivery.objects.copy_event_types() == 0
