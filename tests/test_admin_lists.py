"""Admin lists count at most CappedPaginator.CAP rows: a list over ten million delivered rows
must open as fast as one over ten thousand, so no page view counts a whole table."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from odal.admin import CappedPaginator
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
