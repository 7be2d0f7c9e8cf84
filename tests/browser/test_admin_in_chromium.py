"""An operator's evening in the back office, in a real Chromium."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from odal.core.groups import ensure_groups
from odal.core.models import AuditEntry
from outbox.models import Delivery, DeliveryAttempt
from registry.models import Registration
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    UserFactory,
    backed_off_registration,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests"


def person(group: str):
    ensure_groups()  # live-server tests start from a flushed database
    user = UserFactory(username=group.lower().rstrip("s"))
    user.groups.add(Group.objects.get(name=group))
    return user


def log_in(page, user):
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")


def choose_action(page, row_pk, action: str):
    page.check(f"input[name=_selected_action][value='{row_pk}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def a_busy_day():
    """Enough history that the dashboard shows what a real day looks like."""
    now = timezone.now()
    consumers = [ConsumerFactory(name=n) for n in ("site-builder", "billing", "deployer")]
    for hour in range(24):
        for i, consumer in enumerate(consumers):
            delivery = DeliveryFactory(consumer=consumer, status="delivered", attempts=1)
            at = now - timedelta(hours=hour, minutes=7 * i)
            for outcome in ["delivered"] * (3 + (hour * 7 + i * 5) % 9) + ["failed"] * ((hour + i) % 4 == 0):
                DeliveryAttempt.objects.create(delivery=delivery, number=1, claim_token=delivery.pk,
                                               started_at=at, finished_at=at, outcome=outcome)  # fmt: skip
    for _ in range(3):
        DeliveryFactory(consumer=consumers[0])
    Delivery.objects.filter(status="pending").update(created_at=now - timedelta(minutes=4))
    dead = [
        DeadDeliveryFactory(consumer=consumers[1], last_error="HTTP 503: billing is down") for _ in range(2)
    ]
    DeadDeliveryFactory(consumer=consumers[2], last_error="timed out after 10s")
    for status in ["registered"] * 6 + ["submitted", "rejected"]:
        backed_off_registration(status=status, attempts=1)
    backed_off_registration(attempts=7)  # stalled
    for action, actor, reason in [
        ("passport_published", "token:pim-sync", ""),
        ("consumer_created", "user:ops-lead", ""),
        ("delivery_replayed", "user:ops-lead", "deployer fixed its certificate"),
    ]:
        AuditEntry.objects.record(
            actor=actor, action=action, object_type="odal.passport", object_id="7f3a9c1e", reason=reason
        )
    return dead


def test_operator_replays_a_dead_delivery(page, screenshot):
    dead = a_busy_day()[0]
    operator = person("Operators")
    log_in(page, operator)

    assert page.locator("a.fig", has_text="dead letters").inner_text().startswith("3")
    screenshot(page, "dashboard.png")

    page.click("a.fig:has-text('dead letters')")
    page.wait_for_selector("#result_list")
    choose_action(page, dead.pk, "replay_selected")
    page.wait_for_selector("textarea[name=reason]")
    page.click("input[type=submit].default")  # no reason yet
    assert "A reason is required" in page.locator(".errorlist").inner_text()
    assert Delivery.objects.get(pk=dead.pk).status == "dead"

    page.fill("textarea[name=reason]", "billing is back up")
    page.click("input[type=submit].default")
    assert "Replayed 1 of 1 selected." in page.locator(".messagelist").inner_text()
    assert Delivery.objects.get(pk=dead.pk).status == "pending"
    entry = AuditEntry.objects.get(action="delivery_replayed", object_id=str(dead.pk))
    assert (entry.actor, entry.reason) == (f"user:{operator.username}", "billing is back up")

    page.goto("/admin/odal/auditentry/")
    assert "delivery_replayed" in page.locator("#result_list").inner_text()


def test_operator_abandons_a_registration_the_registry_never_took(page, screenshot, registry_sim):
    reg = backed_off_registration(passport__upi="https://id.example.eu/01/04012345000018/21/REFUSE-0666", attempts=6,
                                  last_error="registry answered HTTP 503")  # fmt: skip
    log_in(page, person("Operators"))

    page.goto("/admin/registry/stalledregistration/")
    choose_action(page, reg.pk, "abandon_selected")
    page.wait_for_selector("textarea[name=reason]")
    assert "holds no submission" in page.locator("#content-main").inner_text()
    screenshot(page, "abandon-confirmation.png")

    page.fill("textarea[name=reason]", "the registry keeps refusing this product")
    page.click("input[type=submit].default")
    assert (
        "Abandoned 1 of 1 selected. The passports stay published" in page.locator(".messagelist").inner_text()
    )
    reg.refresh_from_db()
    assert reg.status == "abandoned" and reg.passport.status == "published"
    assert (
        AuditEntry.objects.get(action="registry_abandoned").reason
        == "the registry keeps refusing this product"
    )


def test_a_viewer_sees_no_action(page):
    DeadDeliveryFactory()
    backed_off_registration(attempts=9)
    PassportFactory()
    log_in(page, person("Viewers"))
    for url in ["/admin/outbox/deadletter/", "/admin/outbox/delivery/", "/admin/registry/registration/",
                "/admin/registry/stalledregistration/"]:  # fmt: skip
        page.goto(url)
        page.wait_for_selector("#result_list")
        assert page.locator("select[name=action]").count() == 0, url
    assert Registration.objects.filter(status="abandoned").count() == 0
