"""Issue 38 attacked at 390 px in a real Chromium: no page staff can reach is wider than the
window (a table scrolling inside its own box is fine), whatever its object is called: a real
UPI, a consumer's name of 100 characters, a UPI of 200. Each object page, each list, the reason
page behind each button, a delete page and a history page."""

import uuid

import pytest
from django.utils import timezone

from odal.core.models import Passport
from outbox.models import Consumer, Delivery, DeliveryAttempt
from registry.models import Registration
from tests.browser.test_record_in_chromium import log_in, realistic_rows
from tests.factories import DeadDeliveryFactory, PassportFactory, WebhookConsumerFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = "() => [document.scrollingElement.scrollWidth, window.innerWidth]"
LISTS = [
    "/admin/", "/admin/odal/passport/", "/admin/registry/registration/", "/admin/outbox/delivery/",
    "/admin/outbox/deadletter/", "/admin/outbox/consumer/", "/admin/odal/auditentry/", "/admin/odal/apitoken/",
    "/admin/outbox/event/", "/admin/outbox/consumer/add/", "/admin/odal/passport/add/",
]  # fmt: skip


def hostile_rows():
    """Names as long as the rules let them be, in one word."""
    now = timezone.now()
    consumer = WebhookConsumerFactory(name="n" * 100, url="https://hooks.example.com/" + "p" * 1500)
    dead = DeadDeliveryFactory(consumer=consumer, last_error="A" * 300)
    DeliveryAttempt.objects.create(
        delivery=dead, consumer=consumer, number=1, claim_token=uuid.uuid4(), started_at=now, finished_at=now,
        outcome="failed", error="E" * 1900, http_status=500, answer='{"k": "' + "x" * 1900 + '"}',
    )  # fmt: skip
    draft = PassportFactory(upi="https://id.example.eu/01/09506000134352/21/" + "S" * 200)
    return consumer, dead, draft


def test_no_page_is_wider_than_the_window_at_390(page):
    realistic_rows()
    consumer, dead, draft = hostile_rows()
    real_passport = Passport.objects.filter(status="published").exclude(upi=draft.upi).first()
    real_consumer = Consumer.objects.get(name="billing-reconciliation")
    log_in(page)
    page.set_viewport_size({"width": 390, "height": 844})
    wide = []

    def measure(what):
        width, window = page.evaluate(WIDTH)
        if width > window + 1:
            wide.append((what, width))

    pages = list(LISTS)
    for model in (Passport, Registration, Delivery, Consumer):
        for obj in model.objects.all()[:3]:
            pages.append(f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/change/")
    pages += [
        f"/admin/outbox/consumer/{consumer.pk}/change/", f"/admin/outbox/delivery/{dead.pk}/change/",
        f"/admin/odal/passport/{draft.pk}/change/", f"/admin/odal/passport/{draft.pk}/delete/",
        f"/admin/outbox/consumer/{consumer.pk}/history/",
    ]  # fmt: skip
    for url in pages:
        page.goto(url)
        measure(url)
    for obj, label in [
        (real_passport, "Suspend…"), (real_consumer, "Pause…"), (real_consumer, "Rotate the signing secret…"),
        (consumer, "Pause…"), (consumer, "Rotate the signing secret…"), (consumer, "Remove…"),
        (dead, "Replay…"), (dead, "Resend…"), (draft, "Publish…"),
    ]:  # fmt: skip
        page.goto(f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/change/")
        page.get_by_role("button", name=label).click()
        page.wait_for_selector("#content-main")
        measure(f"{label} on {obj._meta.model_name} {str(obj)[:20]}")
    assert wide == []
