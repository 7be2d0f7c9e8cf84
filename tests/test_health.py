"""Issue 38, items 3, 4 and 7: a consumer's page says how it is doing (outbox.health), a
passport's page tells its story (odal.surfaces.story), with figures checked against known rows."""

import json
import re
import statistics
import uuid
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from odal.core.models import AuditEntry
from outbox.health import consumer_health
from outbox.models import DeliveryAttempt
from registry.models import RegistrationAttempt
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    EventFactory,
    PublishedPassportFactory,
    RegistrationFactory,
    UserFactory,
    WebhookConsumerFactory,
)

pytestmark = pytest.mark.django_db

SECRET_URL = "https://hooks:s3cr3t-pass@example.net/in?token=tok-123"


def attempt(
    delivery, *, at, outcome="delivered", ms=100, status=200, error="", number=1, answer="", late=False
):
    return DeliveryAttempt.objects.create(
        delivery=delivery, consumer_id=delivery.consumer_id, number=number, claim_token=uuid.uuid4(),
        started_at=at - timedelta(milliseconds=ms), finished_at=at, outcome=outcome, error=error,
        http_status=status, duration_ms=ms, answer=answer, late=late,
    )  # fmt: skip


def known_set(consumer, now):
    """7 delivered and 3 failed attempts in the last 24 hours with known durations, hours and
    statuses; 4 older ones (25 to 40 hours ago) that must not count; another consumer's."""
    delivered_ms = [40, 50, 60, 70, 80, 90, 1000]
    failed = [(2, 500, 300, "HTTP 500: upstream exploded"), (5, 503, 200, "HTTP 503: Service Unavailable"),
              (1, 502, 900, "HTTP 502: Bad Gateway")]  # fmt: skip
    for i, ms in enumerate(delivered_ms):
        d = DeliveryFactory(consumer=consumer, status="delivered")
        attempt(d, at=now - timedelta(hours=3 + i, minutes=10), ms=ms)
    for hours_ago, status, ms, error in failed:
        d = DeliveryFactory(consumer=consumer, status="pending", attempts=1)
        attempt(d, at=now - timedelta(hours=hours_ago, minutes=20), outcome="failed", ms=ms, status=status,
                error=error)  # fmt: skip
    for hours in (25, 30, 33, 40):  # older than the window: not counted
        d = DeliveryFactory(consumer=consumer, status="delivered")
        attempt(d, at=now - timedelta(hours=hours), ms=5000, outcome="failed" if hours == 30 else "delivered")
    other = ConsumerFactory()
    attempt(
        DeliveryFactory(consumer=other), at=now - timedelta(hours=1), outcome="failed", ms=9999, status=500
    )
    return delivered_ms, failed


def test_consumer_health_figures_match_the_known_attempts():
    now = timezone.now()
    consumer = ConsumerFactory()
    delivered_ms, failed = known_set(consumer, now)
    h = consumer_health(consumer, whole_urls=True, now=now)

    assert h.counts == {"delivered": 7, "failed": 3, "write_error": 0}
    assert h.rate_shown == "70.0%"
    durations = sorted(delivered_ms + [ms for _, _, ms, _ in failed])
    p50, p95 = statistics.quantiles(durations, n=100, method="inclusive")[49], None
    p95 = statistics.quantiles(durations, n=100, method="inclusive")[94]
    assert h.p50_ms == pytest.approx(p50) and h.p50_ms == pytest.approx(85.0)
    assert h.p95_ms == pytest.approx(p95) and h.p95_ms == pytest.approx(955.0)

    # Hourly buckets: 24, oldest first, the current hour last; each attempt in its hour.
    assert len(h.hours) == 24 and h.hours[-1].start == now.replace(minute=0, second=0, microsecond=0)
    expected = {}
    for i in range(7):
        start = (now - timedelta(hours=3 + i, minutes=10)).replace(minute=0, second=0, microsecond=0)
        expected.setdefault(start, [0, 0])[0] += 1
    for hours_ago, *_ in failed:
        start = (now - timedelta(hours=hours_ago, minutes=20)).replace(minute=0, second=0, microsecond=0)
        expected.setdefault(start, [0, 0])[1] += 1
    assert {hr.start: [hr.delivered, hr.failed] for hr in h.hours if hr.total} == expected
    assert sum(hr.total for hr in h.hours) == 10

    assert h.last_success.finished_at == now - timedelta(hours=3, minutes=10)
    assert h.last_failure.finished_at == now - timedelta(hours=1, minutes=20)
    assert (h.last_failure.http_status, h.last_failure.error) == (502, "HTTP 502: Bad Gateway")
    assert (h.pending, h.dead) == (3, 0)
    assert len(h.recent) == 14  # (every line of its own, older ones included; not the other consumer's)
    assert [a.line.finished_at for a in h.recent] == sorted(
        (a.line.finished_at for a in h.recent), reverse=True
    )


def test_a_consumer_without_attempts_reads_so():
    h = consumer_health(ConsumerFactory(), whole_urls=True)
    assert (h.rate_shown, h.p50_ms, h.p95_ms, h.last_success, h.last_failure) == ("—", None, None, None, None)
    assert h.attempts == 0 and len(h.hours) == 24


def test_consumer_page_shows_its_health_with_links_to_its_filtered_lists(admin_client):
    now = timezone.now()
    consumer = WebhookConsumerFactory(name="billing")
    known_set(consumer, now)
    DeadDeliveryFactory(consumer=consumer)
    html = admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    root = re.search(
        r'<section class="odal-health" id="consumer-health-(\d+)" data-live="consumer-health"', html
    )
    assert root and root.group(1) == str(consumer.pk)
    assert '<b class="rate">70.0%</b>' in html
    assert '<b class="p50">85 ms</b>' in html and '<b class="p95">955 ms</b>' in html
    assert "HTTP 502: Bad Gateway" in html and "Not paused" in html
    assert "The hours as a table" in html  # the chart's text alternative
    pending = re.search(r'href="([^"]+)" id="consumer-pending-link"', html).group(1).replace("&amp;", "&")
    dead = re.search(r'href="([^"]+)" id="consumer-dead-link"', html).group(1).replace("&amp;", "&")
    assert urlsplit(pending).path == "/admin/outbox/delivery/"
    assert parse_qs(urlsplit(pending).query) == {
        "consumer__id__exact": [str(consumer.pk)],
        "status__exact": ["pending"],
    }
    assert urlsplit(dead).path == "/admin/outbox/deadletter/"
    assert parse_qs(urlsplit(dead).query) == {"consumer__id__exact": [str(consumer.pk)]}
    # The lists they lead to hold exactly its pending / dead deliveries.
    assert admin_client.get(pending).context["cl"].result_count == 3
    assert admin_client.get(dead).context["cl"].result_count == 1


def test_a_paused_consumer_says_by_whom_and_why(admin_client):
    consumer = ConsumerFactory(paused=True, paused_by="admin:alice", paused_reason="answering 500s since the deploy",
                               paused_at=timezone.now())  # fmt: skip
    html = admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    assert "<b>Paused</b> by admin:alice" in html and "answering 500s since the deploy" in html


def test_recent_attempts_show_the_request_and_the_answer_as_pretty_json(admin_client):
    consumer = WebhookConsumerFactory()
    event = EventFactory(
        type="passport.published", payload={"dppId": "abc", "upi": "https://id.example.eu/1"}
    )
    d = DeliveryFactory(consumer=consumer, event=event)
    attempt(d, at=timezone.now(), outcome="failed", status=422, answer='{"error":"bad","fields":["upi"]}',
            error="HTTP 422: Unprocessable Entity")  # fmt: skip
    html = admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    assert f"webhook-id: {d.pk}" in html and "POST http://127.0.0.1:9/hooks" in html
    assert (
        "&quot;dppId&quot;: &quot;abc&quot;" in html
        and "\n  &quot;type&quot;: &quot;passport.published&quot;" in html
    )
    assert "&quot;error&quot;: &quot;bad&quot;,\n  &quot;fields&quot;: [" in html  # the answer, indented


def member_of(client, group):
    user = UserFactory()
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return user


@pytest.mark.parametrize("who", ["Viewers", "Operators", "superuser"])
def test_secrets_never_appear_on_the_consumer_page(client, admin_user, who):
    consumer = WebhookConsumerFactory(url=SECRET_URL)
    consumer.previous_secret, consumer.previous_secret_expires_at = (
        "whsec_" + "B" * 44,
        timezone.now() + timedelta(hours=1),
    )
    consumer.save()
    d = DeliveryFactory(consumer=consumer)
    attempt(d, at=timezone.now(), outcome="failed", status=None,
            error=f"connection refused: {SECRET_URL}")  # fmt: skip
    if who == "superuser":
        client.force_login(admin_user)
    else:
        member_of(client, who)
    html = client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    assert 'data-live="consumer-health"' in html
    assert consumer.secret not in html and consumer.secret[6:] not in html
    assert consumer.previous_secret[6:] not in html
    assert "authorization: Basic ***" in html and "aG9va3M6" not in html  # (base64 of "hooks:")
    assert not re.search(r"webhook-signature: v1,[A-Za-z0-9+/]{8}", html)
    if who != "superuser":  # may not change consumers: the URL's credentials read ***
        assert "s3cr3t-pass" not in html and "tok-123" not in html
        assert "https://***@example.net/in?token=***" in html


def story_passport(now):
    """A passport with a bit of every kind of line, at known times."""
    p = PublishedPassportFactory(created_at=now - timedelta(hours=10), published_at=now - timedelta(hours=9))
    AuditEntry.objects.create(at=now - timedelta(hours=9), actor="admin:alice", action="passport_published",
                              object_type="odal.passport", object_id=str(p.pk), reason="ready for market")  # fmt: skip
    reg = RegistrationFactory(passport=p, created_at=now - timedelta(hours=9), status="submitted")
    for n, (outcome, hours) in enumerate([("failed", 8), ("unknown", 7), ("submitted", 6)], start=1):
        RegistrationAttempt.objects.create(
            registration=reg, number=n, claim_token=uuid.uuid4(), operation="register",
            started_at=now - timedelta(hours=hours, seconds=1), finished_at=now - timedelta(hours=hours),
            outcome=outcome, answer="HTTP 503" if outcome == "failed" else "",
        )  # fmt: skip
    event = EventFactory(
        type="passport.published", payload={"dppId": str(p.pk)}, created_at=now - timedelta(hours=5)
    )
    consumer = ConsumerFactory(name="site-builder")
    d = DeliveryFactory(event=event, consumer=consumer, status="dead", attempts=3, created_at=event.created_at,
                        dead_at=now - timedelta(hours=4), last_error="HTTP 500: upstream exploded")  # fmt: skip
    AuditEntry.objects.create(at=now - timedelta(hours=3), actor="admin:bob", action="delivery_replayed",
                              object_type="outbox.delivery", object_id=str(d.pk), reason="endpoint fixed")  # fmt: skip
    return p, reg, event, d


def test_the_passport_story_is_in_time_order_with_each_kind_linked(admin_client):
    now = timezone.now()
    p, reg, event, d = story_passport(now)
    PublishedPassportFactory()  # (another passport's lines stay out)
    html = admin_client.get(f"/admin/odal/passport/{p.pk}/change/").content.decode()
    assert f'id="passport-story-{p.pk}" data-live="passport-story"' in html
    story = html[html.index('data-live="passport-story"') :]
    lines = re.findall(r'<li class="line (\w+)[^"]*" data-kind="\w+">\s*<time datetime="([^"]+)">'
                       r'.*?<a href="([^"]+)">([^<]+)</a>', story, re.S)  # fmt: skip
    times = [t for _, t, _, _ in lines]
    assert times == sorted(times, reverse=True)  # newest first
    assert [(kind, text) for kind, _, _, text in lines] == [
        ("audit", "Delivery replayed"),
        ("delivery", "passport.published → site-builder"),
        ("event", "Event passport.published"),
        ("registry", "Register attempt 3"),
        ("registry", "Register attempt 2"),
        ("registry", "Register attempt 1"),
        ("lifecycle", "Published"),
        ("registry", "Registration owed to the registry"),
        ("lifecycle", "Created"),
    ]
    links = {text: url for _, _, url, text in lines}
    assert (
        links["Delivery replayed"]
        == links["passport.published → site-builder"]
        == f"/admin/outbox/delivery/{d.pk}/change/"
    )
    assert links["Event passport.published"] == f"/admin/outbox/event/{event.pk}/change/"
    assert links["Register attempt 2"] == f"/admin/registry/registration/{reg.pk}/change/"
    assert links["Published"] == links["Created"] == f"/admin/odal/passport/{p.pk}/change/"
    assert "by admin:alice" in story and "“ready for market”" in story and "“endpoint fixed”" in story
    # The unknown outcome is marked, visibly and in words.
    assert '<span class="outcome unknown">outcome unknown</span>' in story
    assert "the request may have reached the registry; no answer of its own came back" in story
    assert '<span class="outcome dead">dead</span>' in story


def test_the_story_is_bounded_with_links_to_the_whole_lists(admin_client):
    from odal.surfaces import story

    now = timezone.now()
    p = PublishedPassportFactory()
    AuditEntry.objects.bulk_create(
        AuditEntry(at=now - timedelta(minutes=i), actor="cli:x", action="passport_changed",
                   object_type="odal.passport", object_id=str(p.pk))
        for i in range(story.LINES + 5)
    )  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        s = story.passport_story(p)
    assert len(s.lines) == story.LINES and s.more
    assert len(queries) <= 6  # (a fixed number, whatever the passport's history)
    html = admin_client.get(f"/admin/odal/passport/{p.pk}/change/").content.decode()
    assert f'href="/admin/odal/auditentry/?q={p.pk}" id="story-trail-link"' in html
    assert f'href="/admin/outbox/delivery/?q={p.pk}" id="story-deliveries-link"' in html


def test_the_health_reads_are_a_fixed_number_of_indexed_queries():
    consumer = ConsumerFactory()
    known_set(consumer, timezone.now())
    with CaptureQueriesContext(connection) as queries:
        consumer_health(consumer, whole_urls=True)
    assert len(queries) <= 10
    assert all("outbox_deliveryattempt" not in q["sql"] or '"consumer_id"' in q["sql"] for q in queries)


def test_the_sweeps_attempts_count_in_their_consumers_health_and_show_the_request_sent(
    admin_client, settings
):
    """Through the real sweep and a real HTTP server on loopback: each attempt-log line carries
    its consumer, so its health counts it; the request shown is the one the server received,
    less the signature."""
    from outbox.events import emit
    from outbox.sweep import sweep_once
    from tests.webhook_server import WebhookServer

    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    with WebhookServer(script=[500, 204]) as server:
        consumer = WebhookConsumerFactory(url=server.url, max_attempts=3)
        other = WebhookConsumerFactory(url=server.url + "/other", event_types=["nothing.*"])
        emit("passport.published", {"dppId": "abc", "upi": "https://id.example.eu/1"})
        sweep_once()
        sweep_once()
    assert set(DeliveryAttempt.objects.values_list("consumer_id", flat=True)) == {consumer.pk}
    h = consumer_health(consumer, whole_urls=True)
    assert h.counts == {"delivered": 1, "failed": 1, "write_error": 0} and h.rate_shown == "50.0%"
    assert h.last_failure.http_status == 500 and h.last_success.http_status == 204
    assert consumer_health(other, whole_urls=True).attempts == 0
    sent = server.received[-1]
    shown = dict(h.recent[0].headers)
    for name in ("content-type", "user-agent", "webhook-id"):
        assert shown[name] == sent.headers[name]
    assert shown["webhook-signature"].startswith("v1,… ") and sent.headers["webhook-signature"] not in str(
        h.recent
    )
    assert json.loads(h.recent[0].body) == json.loads(sent.body)


def test_the_passport_page_finds_its_events_by_their_index(admin_client):
    """Every lookup of the passport's events reads payload ->> 'dppId' (event_dpp_idx's
    expression): a JSON comparison (payload -> 'dppId' = '"…"') walks every event instead."""
    p, *_ = story_passport(timezone.now())
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(f"/admin/odal/passport/{p.pk}/change/")
    assert page.status_code == 200 and "passport.published → site-builder" in page.content.decode()
    dpp_lookups = [q["sql"] for q in queries if "dppId" in q["sql"]]
    assert len(dpp_lookups) >= 2  # (the story's and the events panel's)
    assert all("->> 'dppId'" in sql and "-> 'dppId'" not in sql for sql in dpp_lookups)
