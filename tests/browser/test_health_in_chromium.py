"""Issue 38, items 3, 4 and 7, in a real Chromium: a consumer's page leads with its health and its
links lead to its filtered lists; a passport's page tells its story, in order, each line a link.

With ODAL_HEALTH_SHOTS set to a folder, the pages are also photographed there at 1366 and 390 px."""

import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from odal.core.models import AuditEntry
from outbox.models import DeliveryAttempt
from registry.models import RegistrationAttempt
from tests.browser.test_admin_in_chromium import log_in, person
from tests.factories import (
    DeadDeliveryFactory,
    DeliveryFactory,
    EventFactory,
    PublishedPassportFactory,
    RegistrationFactory,
    WebhookConsumerFactory,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("ODAL_HEALTH_SHOTS")


def shots(page, name: str):
    if not SHOTS:
        return
    folder = Path(SHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    for width, height in ((1366, 768), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=str(folder / f"{name}-{width}.png"), full_page=True)
        if width == 390:  # (a phone's first screens, each readable on its own)
            for i in range(3):
                clip = {"x": 0, "y": i * height, "width": width, "height": height}
                page.screenshot(
                    path=str(folder / f"{name}-{width}-screen{i + 1}.png"), full_page=True, clip=clip
                )
    page.set_viewport_size({"width": 1280, "height": 900})


def a_day_of(consumer):
    """A day of a webhook consumer's attempts: mostly delivered, a bad hour of 503s, one 422."""
    now = timezone.now()
    for hour in range(24):
        for k in range(2 + (hour * 5) % 7):
            d = DeliveryFactory(consumer=consumer, status="delivered", attempts=1, event__payload={
                "dppId": str(uuid.uuid4()), "upi": f"https://id.example.eu/01/0950600013435/21/SER-{hour:02d}{k}"})  # fmt: skip
            at = now - timedelta(hours=hour, minutes=3 + 7 * k)
            failing = hour in (5, 6) and k % 2 == 0
            ms = 40 + (hour * 37 + k * 11) % 160 + (900 if failing else 0)
            DeliveryAttempt.objects.create(
                delivery=d, consumer=consumer, number=1, claim_token=uuid.uuid4(),
                started_at=at - timedelta(milliseconds=ms), finished_at=at, duration_ms=ms,
                outcome="failed" if failing else "delivered", http_status=503 if failing else 204,
                error="HTTP 503: Service Unavailable" if failing else "",
                answer='{"error":"overloaded","retryAfter":30}' if failing else '{"ok":true}',
                content_type="application/json",
            )  # fmt: skip
    pending = DeliveryFactory(consumer=consumer, attempts=1, event__payload={"dppId": "x"})
    DeliveryAttempt.objects.create(
        delivery=pending, consumer=consumer, number=1, claim_token=uuid.uuid4(), started_at=now,
        finished_at=now, duration_ms=12, outcome="failed", http_status=422,
        error="HTTP 422: Unprocessable Entity", answer='{"errors":[{"field":"upi","message":"unknown product"}]}',
        content_type="application/json",
    )  # fmt: skip
    DeadDeliveryFactory(consumer=consumer, last_error="HTTP 500: upstream exploded")
    DeadDeliveryFactory(consumer=consumer, last_error="HTTP 500: upstream exploded")


def test_a_consumers_page_shows_its_health_and_leads_to_its_pending_and_dead_deliveries(page, screenshot):
    consumer = WebhookConsumerFactory(
        name="site-builder", url="https://hooks:s3cr3t@builder.example.net/in?t=abc"
    )
    a_day_of(consumer)
    log_in(page, person("Viewers"))
    page.goto(f"/admin/outbox/consumer/{consumer.pk}/change/")
    panel = page.locator(f"#consumer-health-{consumer.pk}[data-live='consumer-health']")
    panel.wait_for()
    rate = panel.locator("b.rate").inner_text()
    assert rate.endswith("%") and 80 < float(rate[:-1]) < 100
    assert panel.locator("svg g.bar").count() == 24
    assert panel.locator("figcaption").inner_text().startswith("Attempts per hour (UTC)")
    assert "HTTP 422" in panel.locator("dd.last-failure").inner_text()
    assert "s3cr3t" not in page.content() and "https://***@builder.example.net/in?t=***" in page.content()

    first = panel.locator("li.attempt").first
    first.locator("summary").click()
    assert first.locator(".request pre.head").inner_text().startswith("POST https://***@builder.example.net")
    assert '"field": "upi"' in first.locator(".answer pre.json").inner_text()
    shots(page, "consumer")
    screenshot(page, "consumer-health.png")  # (README's, with ODAL_SCREENSHOTS=docs)

    panel.locator("#consumer-pending-link").click()
    page.wait_for_selector("#result_list")
    assert "status__exact=pending" in page.url and f"consumer__id__exact={consumer.pk}" in page.url
    assert page.locator("#result_list tbody tr").count() == 1

    page.go_back()
    page.locator("#consumer-dead-link").click()
    page.wait_for_selector("#result_list")
    assert "/admin/outbox/deadletter/" in page.url and f"consumer__id__exact={consumer.pk}" in page.url
    assert page.locator("#result_list tbody tr").count() == 2


def test_a_passports_page_tells_its_story_in_order_each_line_a_link(page, screenshot):
    now = timezone.now()
    p = PublishedPassportFactory(created_at=now - timedelta(hours=30), published_at=now - timedelta(hours=29))
    AuditEntry.objects.create(at=p.published_at, actor="user:ops-lead", action="passport_published",
                              object_type="odal.passport", object_id=str(p.pk), reason="approved by QA")  # fmt: skip
    reg = RegistrationFactory(passport=p, created_at=p.published_at, status="registered", handle="REG-77")
    for n, (outcome, answer, hours) in enumerate(
        [("failed", "HTTP 503 from the registry", 28), ("unknown", "", 27), ("submitted", "202 checking", 26),
         ("registered", "registrationId REG-77", 25)], start=1,
    ):  # fmt: skip
        RegistrationAttempt.objects.create(
            registration=reg, number=n, claim_token=uuid.uuid4(), operation="register" if n < 4 else "check",
            started_at=now - timedelta(hours=hours, seconds=2), finished_at=now - timedelta(hours=hours),
            outcome=outcome, answer=answer,
        )  # fmt: skip
    consumer = WebhookConsumerFactory(name="billing")
    event = EventFactory(type="passport.published", payload={"dppId": str(p.pk)}, created_at=p.published_at)
    d = DeadDeliveryFactory(event=event, consumer=consumer, created_at=event.created_at,
                            dead_at=now - timedelta(hours=3))  # fmt: skip
    AuditEntry.objects.create(at=now - timedelta(hours=1), actor="user:ops-lead", action="delivery_replayed",
                              object_type="outbox.delivery", object_id=str(d.pk), reason="billing fixed")  # fmt: skip
    log_in(page, person("Viewers"))
    page.goto(f"/admin/odal/passport/{p.pk}/change/")
    story = page.locator(f"#passport-story-{p.pk}[data-live='passport-story']")
    story.wait_for()
    times = story.locator("li.line time").evaluate_all("els => els.map(e => e.getAttribute('datetime'))")
    assert times == sorted(times, reverse=True) and len(times) == 10
    kinds = story.locator("li.line").evaluate_all("els => els.map(e => e.dataset.kind)")
    assert set(kinds) == {"lifecycle", "registry", "event", "delivery", "audit"}
    unknown = story.locator("li.line.unknown")
    assert unknown.count() == 1 and "outcome unknown" in unknown.inner_text()
    assert "may have reached the registry" in unknown.inner_text()
    shots(page, "passport")
    screenshot(page, "passport-story.png")  # (README's, with ODAL_SCREENSHOTS=docs)

    story.locator("li.line.delivery a").click()
    page.wait_for_url(f"**/admin/outbox/delivery/{d.pk}/change/")
    page.go_back()
    story.locator("li.line.unknown a").click()
    page.wait_for_url(f"**/admin/registry/registration/{reg.pk}/change/")
    page.go_back()
    page.locator("#story-deliveries-link").click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
