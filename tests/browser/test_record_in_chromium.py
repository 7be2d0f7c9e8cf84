"""Issue 38, item 5, in a real Chromium: every changelist fits its box at 1366x768 with Django's
sidebar shown, the action bar stays clear of the filters at 1024 px, no header breaks inside a
word at 390 px, and a shortened id is whole a hover or a click away."""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from odal.core.models import ApiToken, AuditEntry
from outbox.models import Delivery, DeliveryAttempt
from tests.factories import (
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    RegistrationFactory,
    UserFactory,
    WebhookConsumerFactory,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = (
    Path(os.environ["ODAL_RECORD_SHOTS"]) if os.environ.get("ODAL_RECORD_SHOTS") else None
)  # (a folder of your own)

LISTS = {
    "passports": "/admin/odal/passport/",
    "registrations": "/admin/registry/registration/",
    "deliveries": "/admin/outbox/delivery/",
    "dead-letters": "/admin/outbox/deadletter/",
    "consumers": "/admin/outbox/consumer/",
    "audit-trail": "/admin/odal/auditentry/",
    "tokens": "/admin/odal/apitoken/",
}
LONG_ERROR = (
    "HTTP 503: upstream billing-service.internal.example-manufacturer.eu answered Service Unavailable "
    "(maintenance window until 22:00 UTC)"
)


def realistic_rows():
    """Rows as long as a real node's: full UPIs, long webhook URLs and errors, every id whole."""
    now = timezone.now()
    consumers = [
        WebhookConsumerFactory(
            name=name,
            url=f"https://hooks.{name}.example-manufacturer.eu/odal/v1/webhooks/passport-events?tenant=acme-industrial",
            event_types=["passport.published", "passport.suspended", "passport.registration_rejected"],
        )
        for name in ("billing-reconciliation", "site-builder-production", "erp-connector")
    ]
    for n in range(12):
        passport = PassportFactory(
            upi=f"https://id.example-manufacturer.eu/01/09506000134352/21/BATTERY-PACK-2026-{n:06d}",
            operator_id=f"EU-OPERATOR-DE-{n:010d}",
            status="published",
            published_at=now,
        )
        RegistrationFactory(
            passport=passport,
            status=["pending", "submitted", "registered", "rejected"][n % 4],
            attempts=n,
            last_error=LONG_ERROR,
            note="the registry answered DUPLICATE_UPI with a requestId we did not send; checked by hand",
            correlation_id=f"req-{n:04d}-5f1c2a9e-7b3d-4e8f-9a1b-2c3d4e5f6a7b",
        )
        consumer = consumers[n % 3]
        delivery = DeliveryFactory(
            consumer=consumer,
            event__type="passport.registration_rejected",
            event__payload={"dppId": str(passport.pk), "upi": passport.upi},
            status=["pending", "delivered", "dead"][n % 3],
            attempts=3,
            last_error=LONG_ERROR,
            claim_token="5f1c2a9e-7b3d-4e8f-9a1b-2c3d4e5f6a7b",
        )
        DeliveryAttempt.objects.create(delivery=delivery, number=1, claim_token=delivery.pk, started_at=now,
                                       finished_at=now, outcome="failed", error=LONG_ERROR, http_status=503)  # fmt: skip
        AuditEntry.objects.record(
            actor="user:operations-lead-on-call", action="delivery_replayed", obj=delivery,
            reason="billing-reconciliation fixed its certificate chain; replaying the night's dead letters",
        )  # fmt: skip
        AuditEntry.objects.record(
            actor="token:pim-sync-production", action="passport_published", obj=passport
        )
    for consumer in consumers:
        AuditEntry.objects.record(actor="user:operations-lead-on-call", action="consumer_paused", obj=consumer,
                                  reason="upgrade tonight")  # fmt: skip
    for n in range(4):
        ApiToken.objects.issue(
            name=f"pim-sync-production-eu-central-{n}", scope=["read", "write", "admin"][n % 3]
        )
    DeadDeliveryFactory(consumer=consumers[0], last_error=LONG_ERROR, dead_at=now - timedelta(hours=1))
    return consumers


def log_in(page):
    user = UserFactory(username="ops-lead", is_superuser=True)
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "pw-for-tests")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")


def shoot(page, name):
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / name), full_page=True)


WIDTHS = """() => {
  const table = document.querySelector('#result_list');
  const box = table.parentElement;
  return {table: table.scrollWidth, box: box.clientWidth, sidebar: !!document.querySelector('#nav-sidebar')
          && getComputedStyle(document.querySelector('#nav-sidebar')).display !== 'none'};
}"""


def test_every_list_fits_its_box_at_1366_with_the_sidebar_shown(page):
    realistic_rows()
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page)
    too_wide = {}
    for name, url in LISTS.items():
        page.goto(url)
        widths = page.evaluate(WIDTHS)
        assert widths["sidebar"], f"{name}: Django's sidebar is not shown"
        if widths["table"] > widths["box"]:
            too_wide[name] = f"{widths['table']} px in a {widths['box']} px box"
        shoot(page, f"{name}-1366.png")
    assert not too_wide, too_wide


OVERLAP = """() => {
  const filters = document.querySelector('#changelist-filter');
  const bar = document.querySelector('#changelist .actions');
  if (!filters || !bar) return null;
  const f = filters.getBoundingClientRect();
  const parts = [bar, ...bar.querySelectorAll('*')].filter(e => e.getClientRects().length);
  return {filtersLeft: f.left, right: Math.max(...parts.map(e => e.getBoundingClientRect().right))};
}"""


def test_the_action_bar_is_clear_of_the_filters_at_1024(page):
    realistic_rows()
    page.set_viewport_size({"width": 1024, "height": 768})
    log_in(page)
    checked = 0
    for name, url in LISTS.items():
        page.goto(url)
        found = page.evaluate(OVERLAP)
        if found is None:
            continue
        checked += 1
        assert found["right"] <= found["filtersLeft"], f"{name}: the action bar reaches {found} (px)"
        shoot(page, f"{name}-1024.png")
    assert checked >= 5


BROKEN_HEADERS = """() => {
  const broken = [];
  for (const th of document.querySelectorAll('#result_list thead th')) {
    const style = getComputedStyle(th);
    if (style.wordBreak !== 'normal' || style.overflowWrap !== 'normal' || style.hyphens === 'auto')
      broken.push(`${th.textContent.trim()}: word-break ${style.wordBreak}, overflow-wrap ${style.overflowWrap}, hyphens ${style.hyphens}`);
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /\\S+/g; let m;
      while ((m = re.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(`"${m[0]}" broken over ${lines.size} lines`);
      }
    }
  }
  return broken;
}"""


def test_no_header_breaks_inside_a_word_at_390(page):
    realistic_rows()
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page)
    for name, url in LISTS.items():
        page.goto(url)
        assert page.evaluate(BROKEN_HEADERS) == [], name
        shoot(page, f"{name}-390.png")


def test_a_shortened_id_is_whole_a_hover_and_a_click_away(page):
    realistic_rows()
    delivery = Delivery.objects.order_by("created_at").first()
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page)
    page.goto("/admin/outbox/delivery/")
    whole = str(delivery.pk)
    cell = page.locator(f"#result_list .odal-id[title='{whole}']")
    assert cell.inner_text() == f"{whole[:8]}…"
    cell.hover()
    assert cell.get_attribute("title") == whole
    cell.click()
    page.wait_for_url(f"**/admin/outbox/delivery/{whole}/change/")
    assert whole in page.locator(".field-id").inner_text()

    page.goto("/admin/odal/auditentry/")
    link = page.locator(f"#result_list a[title$='{whole}']").first
    assert "delivery passport.registration_rejected → " in link.inner_text()
    link.click()
    page.wait_for_url(f"**/admin/outbox/delivery/{whole}/change/")


def test_a_delivery_page_reads_its_replay_as_a_line_of_its_log(page, settings):
    """Three failed attempts, a replay (who, why), the fourth attempt delivered: in that order,
    numbered on, the payload and the answer as JSON."""
    from outbox.events import emit
    from outbox.models import Consumer
    from outbox.sweep import sweep_once

    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    consumer = WebhookConsumerFactory(name="billing-reconciliation", kind="python", url="",
                                      target="tests.consumers.explode", max_attempts=3)  # fmt: skip
    emit(
        "passport.published",
        {"dppId": "0190f0c2-5b7e-7c1a-9d3e-2f4a6b8c0d1e", "upi": "https://id.example.eu/01/1/21/X"},
    )
    for _ in range(3):
        sweep_once()
    delivery = Delivery.objects.get(consumer=consumer)
    Consumer.objects.filter(pk=consumer.pk).update(target="tests.consumers.accept")
    Delivery.objects.filter(pk=delivery.pk).replay(
        actor="user:ops-lead", reason="billing fixed its certificate"
    )
    sweep_once()
    for size, name in (
        ((1366, 768), "delivery-with-replay-1366.png"),
        ((390, 844), "delivery-with-replay-390.png"),
    ):
        page.set_viewport_size({"width": size[0], "height": size[1]})
        if size[0] == 1366:
            log_in(page)
        page.goto(f"/admin/outbox/delivery/{delivery.pk}/change/")
        log = page.locator(".field-attempt_log_shown table.odal-log")
        rows = [" ".join(text.split()) for text in log.locator("tbody tr").all_inner_texts()]
        lines = [row.split(" UTC ", 1)[1].split()[:3] for row in rows]  # (after the time)
        assert [line[:2] for line in lines] == [
            ["1", "failed"], ["2", "failed"], ["3", "failed"], ["replayed", "by"], ["4", "delivered"],
        ], rows  # fmt: skip
        assert lines[3][2] == "user:ops-lead", rows
        assert "billing fixed its certificate" in rows[3]
        assert '"dppId": "0190f0c2' in page.locator(".field-payload pre").inner_text()
        shoot(page, name)
