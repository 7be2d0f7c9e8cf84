"""Consumers in the back office, in a real Chromium: pause and resume, rotate the secret, send a
test event, resend a delivery (issue 14)."""

import pytest

from odal.core.models import AuditEntry
from outbox.models import Consumer, Delivery
from tests.browser.test_admin_in_chromium import PASSWORD, choose_action, log_in, person
from tests.factories import ConsumerFactory, DeliveryFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def superuser():
    return UserFactory(username="admin-lead", is_superuser=True, is_staff=True)


def test_operator_pauses_and_resumes_a_consumer(page, screenshot):
    consumer = ConsumerFactory(name="billing")
    waiting = DeliveryFactory(consumer=consumer)
    operator = person("Operators")
    log_in(page, operator)

    page.goto("/admin/outbox/consumer/")
    choose_action(page, consumer.pk, "pause_selected")
    page.wait_for_selector("textarea[name=reason]")
    page.click("input[type=submit].default")  # no reason yet
    assert "A reason is required" in page.locator(".errorlist").inner_text()
    assert not Consumer.objects.get(pk=consumer.pk).paused

    page.fill("textarea[name=reason]", "billing upgrade tonight")
    page.click("input[type=submit].default")
    assert "Paused: billing." in page.locator(".messagelist").inner_text()
    consumer.refresh_from_db()
    assert (consumer.paused, consumer.paused_by) == (True, f"user:{operator.username}")
    assert Delivery.objects.get(pk=waiting.pk).status == "paused"

    page.goto("/admin/")
    assert "paused by user:" in page.locator("#content-main").inner_text()
    screenshot(page, "dashboard-paused-consumer.png")

    page.goto("/admin/outbox/consumer/")
    choose_action(page, consumer.pk, "resume_selected")
    page.wait_for_selector("textarea[name=reason]")
    page.fill("textarea[name=reason]", "upgrade done")
    page.click("input[type=submit].default")
    assert "Resumed: billing." in page.locator(".messagelist").inner_text()
    assert Delivery.objects.get(pk=waiting.pk).status == "pending"
    assert AuditEntry.objects.filter(action="consumer_resumed", reason="upgrade done").exists()


def test_an_operator_may_not_rotate_a_secret_an_admin_may(page, screenshot):
    consumer = ConsumerFactory(name="billing")
    old = consumer.secret
    log_in(page, person("Operators"))
    page.goto("/admin/outbox/consumer/")
    options = page.locator("select[name=action] option").all_inner_texts()
    assert not any("Rotate" in o for o in options)
    page.context.clear_cookies()

    admin_user = superuser()
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")
    page.goto("/admin/outbox/consumer/")
    choose_action(page, consumer.pk, "rotate_secret")
    page.wait_for_selector("textarea[name=reason]")
    page.fill("textarea[name=reason]", "yearly rotation")
    page.fill("input[name=grace]", "soon")
    page.click("input[type=submit].default")
    assert "must be a duration" in page.locator(".errorlist").inner_text()
    assert Consumer.objects.get(pk=consumer.pk).secret == old

    page.fill("input[name=grace]", "2h")
    page.click("input[type=submit].default")
    shown = page.locator("#secret-once").input_value()  # on a page of its own, never a message
    consumer.refresh_from_db()
    assert consumer.secret != old and shown == consumer.secret
    assert "The old secret signs beside it until" in page.locator("#content-main").inner_text()
    assert consumer.previous_secret == old
    assert all(consumer.secret not in c["value"] for c in page.context.cookies())
    page.click("text=I have copied it: back to the list")
    page.wait_for_selector("select[name=action]")

    choose_action(page, consumer.pk, "send_test_event")
    assert "Test event sent to billing" in page.locator(".messagelist").inner_text()
    assert Delivery.objects.get(consumer=consumer).event.type == "odal.test"


def test_operator_resends_a_delivered_delivery(page):
    delivered = DeliveryFactory(consumer=ConsumerFactory(name="billing"), status="delivered")
    log_in(page, person("Operators"))
    page.goto("/admin/outbox/delivery/")
    choose_action(page, delivered.pk, "resend_selected")
    page.wait_for_selector("textarea[name=reason]")
    assert "same webhook-id" in page.locator("#content-main").inner_text()
    page.fill("textarea[name=reason]", "billing lost its copy")
    page.click("input[type=submit].default")
    assert "Resent 1 of 1 selected." in page.locator(".messagelist").inner_text()
    assert Delivery.objects.get(pk=delivered.pk).status == "pending"
    assert AuditEntry.objects.get(action="delivery_resent").reason == "billing lost its copy"
