"""Admin lists count at most CappedPaginator.CAP rows: a list over ten million delivered rows
must open as fast as one over ten thousand, so no page view counts a whole table."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from odal.core.admin import CappedPaginator
from tests.factories import ConsumerFactory, DeliveryFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(CappedPaginator, "CAP", 3)


def test_a_list_longer_than_the_cap_says_more_than_and_counts_no_further(admin_client, small_cap):
    consumer = ConsumerFactory()
    DeliveryFactory.create_batch(5, consumer=consumer, status="delivered")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:outbox_delivery_changelist"), {"status__exact": "delivered"})
    assert page.status_code == 200
    text = page.content.decode()
    assert "more than 3 deliveries" in text
    counts = [q["sql"] for q in queries.captured_queries if re.search(r"COUNT\(", q["sql"], re.I)]
    assert counts, "the list counted nothing?"
    for sql in counts:
        assert re.search(r"LIMIT 4\b", sql), f"an unbounded count: {sql}"


def test_a_list_within_the_cap_says_how_many(admin_client, small_cap):
    consumer = ConsumerFactory()
    DeliveryFactory.create_batch(2, consumer=consumer)
    page = admin_client.get(reverse("admin:outbox_delivery_changelist"))
    text = page.content.decode()
    assert "2 deliveries" in text
    assert "more than" not in text


def test_the_event_type_filter_lists_each_type_without_reading_every_event(admin_client):
    consumer = ConsumerFactory()
    for event_type in ("passport.published", "passport.registered", "passport.published", "zeta.z"):
        DeliveryFactory(consumer=consumer, event__type=event_type)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:outbox_delivery_changelist"))
    text = page.content.decode()
    for event_type in ("passport.published", "passport.registered", "zeta.z"):
        assert f"?event_type={event_type}" in text
    assert not [q for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]

    only = admin_client.get(reverse("admin:outbox_delivery_changelist"), {"event_type": "passport.published"})
    assert "2 deliveries" in only.content.decode()
    events = admin_client.get(reverse("admin:outbox_event_changelist"), {"type": "zeta.z"})
    assert "1 event" in events.content.decode()


def test_a_lists_count_asks_for_no_order(admin_client, small_cap):
    # Any CAP + 1 rows count the same as the first CAP + 1; with the list's ORDER BY, a filter
    # its index does not serve (an event type) reads and sorts every row it matches to count them.
    DeliveryFactory.create_batch(5, consumer=ConsumerFactory())
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(reverse("admin:outbox_delivery_changelist"), {"event_type": "passport.published"})
    counts = [q["sql"] for q in queries.captured_queries if re.search(r"COUNT\(", q["sql"], re.I)]
    assert counts and not [sql for sql in counts if "ORDER BY" in sql.upper()], counts


# -- the deliveries admin's search (issue 26) ---------------------------------------------------------


@pytest.fixture
def searchable():
    from odal.core.models import Passport
    from outbox.events import emit
    from outbox.models import Delivery
    from tests.factories import PassportFactory

    billing, sites = ConsumerFactory(name="billing-eu"), ConsumerFactory(name="sites")
    passport = PassportFactory(upi="https://id.example.eu/01/09506000134352/21/SER-77")
    other = PassportFactory()
    event, _ = emit("passport.published", {"dppId": str(passport.pk), "upi": passport.upi})
    emit("passport.published", {"dppId": str(other.pk), "upi": other.upi})
    emit("order.shipped", {"order": 7}, only=billing)
    assert Passport.objects.count() == 2
    return {
        "passport": passport,
        "event": event,
        "deliveries": {(d.event_id, d.consumer.name): d for d in Delivery.objects.select_related("consumer")},
        "billing": billing,
        "sites": sites,
    }


def found_by(admin_client, term: str) -> set:
    page = admin_client.get(reverse("admin:outbox_delivery_changelist"), {"q": term})
    assert page.status_code == 200
    return {d.pk for d in page.context["cl"].result_list}


def test_the_deliveries_search_finds_by_each_id_a_upi_a_consumer_and_a_type(admin_client, searchable):
    s, every = searchable, searchable["deliveries"]
    of_event = {d.pk for (event_id, _), d in every.items() if event_id == s["event"].pk}
    assert len(of_event) == 2 and len(every) == 5
    one = every[(s["event"].pk, "sites")]
    assert found_by(admin_client, str(one.pk)) == {one.pk}
    assert found_by(admin_client, str(s["event"].pk)) == of_event
    assert found_by(admin_client, str(s["passport"].pk)) == of_event
    assert found_by(admin_client, str(s["passport"].pk).upper()) == of_event  # (a UUID however typed)
    assert found_by(admin_client, s["passport"].upi) == of_event
    assert found_by(admin_client, f"  {s['passport'].upi}  ") == of_event
    assert (
        found_by(admin_client, "HTTPS://ID.EXAMPLE.EU/01/09506000134352/21/SER-77") == of_event
    )  # (canonical)
    assert found_by(admin_client, "billing") == {
        d.pk for (_, name), d in every.items() if name == "billing-eu"
    }
    assert found_by(admin_client, "ORDER.SHIP") == {
        d.pk for d in every.values() if d.event.type == "order.shipped"
    }
    for nothing in ("not-a-uuid", str(s["billing"].pk) + "0", "https://id.example.eu/nope"):
        assert found_by(admin_client, nothing) == set()


def test_the_deliveries_search_reads_no_table_with_like(admin_client, searchable):
    # Django's own search ORs LIKE '%term%' over the deliveries, their events and payloads: no
    # index answers it. The consumers (a few rows) are the one table matched by a part.
    for term in (str(searchable["passport"].pk), searchable["passport"].upi, "billing"):
        with CaptureQueriesContext(connection) as queries:
            found_by(admin_client, term)
        likes = [q["sql"] for q in queries.captured_queries if " LIKE " in q["sql"].upper()]
        assert all("outbox_consumer" in sql and "outbox_delivery" not in sql for sql in likes), likes


def test_the_dead_letters_search_is_the_deliveries_search(admin_client, searchable):
    from outbox.models import Delivery

    Delivery.objects.filter(consumer=searchable["sites"]).update(status="dead")
    page = admin_client.get(reverse("admin:outbox_deadletter_changelist"), {"q": searchable["passport"].upi})
    assert {d.pk for d in page.context["cl"].result_list} == {
        d.pk
        for (e, name), d in searchable["deliveries"].items()
        if e == searchable["event"].pk and name == "sites"
    }


# -- the audit trail admin's filters and date drill-down (issue 26) -----------------------------------


def audit_at(*moments, action="passport_created", actor="cli"):
    from odal.core.models import AuditEntry

    for at in moments:
        AuditEntry.objects.create(
            at=at, action=action, actor=actor, object_type="odal.passport", object_id="x"
        )


def test_the_audit_filters_list_each_action_and_actor_without_reading_every_entry(admin_client):
    from datetime import UTC, datetime

    now = datetime(2026, 11, 3, 12, tzinfo=UTC)
    audit_at(now, now, action="passport_created", actor="cli:importer")
    audit_at(now, action="consumer_paused", actor="admin:alice")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:odal_auditentry_changelist"))
    text = page.content.decode()
    for value in (
        "action=passport_created",
        "action=consumer_paused",
        "actor=cli%3Aimporter",
        "actor=admin%3Aalice",
    ):
        assert f"?{value}" in text, value
    assert not [q for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    only = admin_client.get(reverse("admin:odal_auditentry_changelist"), {"actor": "admin:alice"})
    assert [e.action for e in only.context["cl"].result_list] == ["consumer_paused"]


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Pacific/Chatham"])
@pytest.mark.parametrize("kind", ["year", "month", "day"])
def test_the_audit_dates_by_hops_are_djangos_dates(kind, zone):
    # Django's datetimes() groups every entry; AuditEntryQuerySet's hops one index probe per
    # period. The same answer, in any time zone, across a clock change and a year's end.
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    from django.db.models import QuerySet

    from odal.core.models import AuditEntry

    start = datetime(2025, 10, 25, 22, 30, tzinfo=UTC)
    audit_at(*(start + timedelta(hours=7 * k) for k in range(12)))
    audit_at(datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, tzinfo=UTC))
    audit_at(datetime(2027, 3, 28, 0, 30, tzinfo=UTC), action="consumer_paused")
    tz = ZoneInfo(zone)
    for rows in (AuditEntry.objects.all(), AuditEntry.objects.filter(action="passport_created")):
        for order in ("ASC", "DESC"):
            ours = list(rows.datetimes("at", kind, order, tzinfo=tz))
            djangos = list(QuerySet.datetimes(rows, "at", kind, order, tzinfo=tz))
            assert ours == djangos and ours, (kind, zone, order)


def test_the_audit_date_drill_down_reads_no_entry_twice(admin_client):
    from datetime import UTC, datetime

    audit_at(
        datetime(2026, 10, 30, 9, tzinfo=UTC),
        datetime(2026, 11, 2, 9, tzinfo=UTC),
        datetime(2026, 11, 4, 9, tzinfo=UTC),
    )
    changelist = reverse("admin:odal_auditentry_changelist")
    for query, links in (
        ({}, ["at__month=10", "at__month=11"]),
        ({"at__year": "2026"}, ["at__month=10", "at__month=11"]),
        ({"at__year": "2026", "at__month": "11"}, ["at__day=2", "at__day=4"]),
    ):
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(changelist, query)
        text = page.content.decode()
        assert all(link in text for link in links), (query, links)
        grouped = [q["sql"] for q in queries.captured_queries if re.search(r"DISTINCT|TRUNC", q["sql"], re.I)]
        assert not grouped, grouped


def test_the_event_type_filter_and_search_read_the_deliverys_own_copy(admin_client, searchable):
    # delivery_type_idx (the delivery's event_type) serves them; filtering on the joined event's
    # type reads every delivery of a rare type's list, or the whole table.
    changelist = reverse("admin:outbox_delivery_changelist")
    for query in ({"event_type": "order.shipped"}, {"q": "order.ship"}):
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(changelist, query)
        assert {d.event.type for d in page.context["cl"].result_list} == {"order.shipped"}, query
        listed = [q["sql"] for q in queries.captured_queries if "outbox_delivery" in q["sql"]]
        assert any('"outbox_delivery"."event_type"' in sql for sql in listed), query
        assert not [sql for sql in listed if re.search(r'"outbox_event"\."type" (=|IN)', sql)], query


def test_the_audit_dates_reach_year_9999_as_djangos_do(admin_client):
    # (the review's: the period after year 9999's cannot be made; the hops stop there)
    from datetime import UTC, datetime

    from django.db.models import QuerySet

    from odal.core.models import AuditEntry

    audit_at(datetime(9999, 12, 31, 12, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    rows = AuditEntry.objects.all()
    for kind in ("year", "month", "day"):
        assert rows.datetimes("at", kind) == list(QuerySet.datetimes(rows, "at", kind)), kind
    assert admin_client.get(reverse("admin:odal_auditentry_changelist")).status_code == 200


@pytest.mark.parametrize(
    "period, listed",
    [
        ({"at__year": "9999"}, ["9999-01-01", "9999-12-30", "9999-12-31"]),
        ({"at__year": "9999", "at__month": "12"}, ["9999-12-30", "9999-12-31"]),
        ({"at__year": "9999", "at__month": "12", "at__day": "31"}, ["9999-12-31"]),
        ({"at__year": "9998", "at__month": "12", "at__day": "31"}, ["9998-12-31"]),
    ],
)
def test_the_audit_drill_down_opens_the_last_periods_there_are(admin_client, period, listed):
    # Django bounds a period by the next one's start: year 9999's (its December, its last day)
    # has none, and its list was a 500. The links the drill-down shows must all open.
    from datetime import UTC, datetime

    audit_at(
        *(
            datetime(*day, 12, tzinfo=UTC)
            for day in ((9998, 12, 31), (9999, 1, 1), (9999, 12, 30), (9999, 12, 31))
        )
    )
    page = admin_client.get(reverse("admin:odal_auditentry_changelist"), period)
    assert page.status_code == 200
    assert sorted(e.at.date().isoformat() for e in page.context["cl"].result_list) == listed


@pytest.mark.parametrize(
    "period",
    [
        {"at__year": "10000"},
        {"at__year": "1" * 30},
        {"at__year": "2026", "at__month": "1" * 30},
        {"at__year": "2026", "at__month": "13"},
    ],
)
def test_an_audit_period_that_cannot_be_is_a_wrong_lookup_not_a_500(admin_client, period):
    page = admin_client.get(reverse("admin:odal_auditentry_changelist"), period)
    assert page.status_code == 302 and page.url.endswith("?e=1")


# -- URLs a person types: a list or a wrong lookup, never a 500 ----------------------------------

EVERY_LIST = [
    "admin:odal_passport_changelist",
    "admin:odal_auditentry_changelist",
    "admin:outbox_delivery_changelist",
    "admin:registry_registration_changelist",
    "admin:auth_user_changelist",  # (Django's own admin, made a checked one: odal.core.apps)
    "admin:django_q_schedule_changelist",  # (django-q2's)
]


@pytest.mark.parametrize("changelist", EVERY_LIST)
@pytest.mark.parametrize("lookup", ["id__regex", "id__iregex", "pk__range", "id__range"])
def test_no_list_takes_a_regular_expression_or_a_range(admin_client, changelist, lookup):
    # `(` is a DataError of PostgreSQL's, x{1000}{1000} one too complex, and a range is read a
    # character per bound ("999": three bounds): each a 500. No list offers them: a 400.
    for value in ("(", "x{1000}{1000}", "999", ""):
        assert admin_client.get(reverse(changelist), {lookup: value}).status_code == 400, value


def test_no_action_runs_on_a_list_filtered_by_a_refused_lookup(admin_client):
    delivery = DeliveryFactory(status="dead")
    page = admin_client.post(
        reverse("admin:outbox_delivery_changelist") + "?last_error__regex=(",
        {
            "action": "replay_selected",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(delivery.pk)],
        },
    )
    assert page.status_code == 400
    delivery.refresh_from_db()
    assert delivery.status == "dead"


@pytest.mark.parametrize(
    "changelist, query",
    [
        ("admin:odal_passport_changelist", {"created_at__year": "-1"}),
        ("admin:odal_passport_changelist", {"created_at__year": "0"}),
        ("admin:odal_passport_changelist", {"created_at__year": "10000"}),
        ("admin:outbox_delivery_changelist", {"dead_at__year": str(10**23)}),
        ("admin:outbox_delivery_changelist", {"next_attempt_at__year": "0"}),
        ("admin:odal_auditentry_changelist", {"at__iso_year": "-1"}),
        ("admin:odal_auditentry_changelist", {"at__year__gte": "0"}),
        ("admin:odal_auditentry_changelist", {"at__year__gt": str(10**30)}),
        # the drill-down's last period with a year that cannot be beside it
        ("admin:odal_auditentry_changelist", {"at__year": ["-1", "9999"], "at__month": "12"}),
        ("admin:odal_auditentry_changelist", {"at__year": [str(10**23), "9999"]}),
        ("admin:auth_user_changelist", {"date_joined__year": "-1"}),
    ],
)
def test_a_year_no_query_can_be_made_of_is_a_wrong_lookup(admin_client, changelist, query):
    page = admin_client.get(reverse(changelist), query)
    assert page.status_code == 302 and page.url.endswith("?e=1")


def test_a_list_of_nothing_is_a_list(admin_client, monkeypatch):
    # An admin that shows some people nothing (get_queryset: .none()): its query cannot be made
    # (no SQL asks for nothing), which says the list is empty, not that the lookup is wrong.
    from django.contrib import admin

    from outbox.models import Delivery

    DeliveryFactory()
    model_admin = admin.site.get_model_admin(Delivery)
    monkeypatch.setattr(model_admin, "get_queryset", lambda request: Delivery.objects.none())
    page = admin_client.get(reverse("admin:outbox_delivery_changelist"))
    assert page.status_code == 200 and list(page.context["cl"].result_list) == []


@pytest.mark.parametrize("object_id", ["abc", "1" * 40, "00000000-0000-0000-0000-00000000000g"])
def test_view_on_site_with_an_id_of_the_wrong_form_is_not_found(admin_client, object_id):
    from django.contrib.contenttypes.models import ContentType

    from outbox.models import Delivery

    kind = ContentType.objects.get_for_model(Delivery)
    assert admin_client.get(f"/admin/r/{kind.pk}/{object_id}/").status_code == 404


def test_view_on_site_is_behind_the_admin_login(client):
    from django.contrib.contenttypes.models import ContentType

    from outbox.models import Delivery

    kind = ContentType.objects.get_for_model(Delivery)
    page = client.get(f"/admin/r/{kind.pk}/abc/")
    assert page.status_code == 302 and "/admin/login/" in page.url


def test_no_list_counts_its_facets(admin_client):
    # "Show counts" (?_facets=1) counts every row each filter choice matches, uncapped.
    DeliveryFactory.create_batch(3, consumer=ConsumerFactory())
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:outbox_delivery_changelist"), {"_facets": "1"})
    assert page.status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if re.search(r"COUNT\(", q["sql"], re.I)]
    assert counts and all(re.search(r"LIMIT \d+", sql) for sql in counts), counts
