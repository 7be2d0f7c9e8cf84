"""The back office: the dashboard, the focused lists, the passport page, the two-pass lifecycle
actions, and who may do what (Operators, Viewers, plain staff)."""

from datetime import timedelta

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Group
from django.utils import timezone

from odal.core.models import AuditEntry, Passport
from odal.surfaces import lifecycle
from outbox.events import emit
from outbox.models import Delivery, DeliveryAttempt
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    UserFactory,
    backed_off_registration,
)

pytestmark = pytest.mark.django_db


def member_of(client, group):
    user = UserFactory()
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return user


def test_dashboard_shows_the_figures_with_links(admin_client):
    billing = ConsumerFactory(name="billing")
    DeadDeliveryFactory(consumer=billing)
    old = DeliveryFactory(consumer=billing)
    Delivery.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=3))
    backed_off_registration(attempts=9)  # stalled
    backed_off_registration(status="abandoned")
    now = timezone.now()
    for outcome in ("delivered", "failed", "failed"):
        DeliveryAttempt.objects.create(delivery=old, number=1, claim_token=old.pk, started_at=now,
                                       finished_at=now, outcome=outcome)  # fmt: skip
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/outbox/deadletter/"><b>1</b><span>dead letters</span>' in page
    assert "<b>3 h</b><span>oldest pending</span>" in page
    assert f"consumer__id__exact={billing.pk}" in page
    assert 'href="/admin/registry/stalledregistration/"><b>1</b><span>stalled</span>' in page
    assert (
        'href="/admin/registry/registration/?status__exact=abandoned"><b>1</b><span>abandoned</span>' in page
    )
    assert "<svg" in page and "delivered (1)" in page and "failed (2)" in page
    assert "<script" not in page.split('id="content-main"')[1].split("</svg>")[0]


def test_every_dashboard_link_opens(admin_client):
    DeadDeliveryFactory()
    backed_off_registration(attempts=9)
    page = admin_client.get("/admin/").content.decode()
    links = {
        part.split('"')[0].replace("&amp;", "&")
        for part in page.split('class="fig')[1:]
        for part in [part.split('href="')[1]]
    }
    assert len(links) >= 10
    for link in links:
        assert admin_client.get(link).status_code == 200, link


def test_dead_letters_list_filters_by_error_kind_and_replays(admin_client):
    timeout = DeadDeliveryFactory(last_error="timed out after 10s")
    http = DeadDeliveryFactory(last_error="HTTP 503: busy")
    DeliveryFactory()  # pending: not a dead letter
    page = admin_client.get("/admin/outbox/deadletter/").content.decode()
    assert str(timeout.pk) in page and str(http.pk) in page and "2 dead letters" in page
    filtered = admin_client.get("/admin/outbox/deadletter/", {"error_kind": "timeout"}).content.decode()
    assert str(timeout.pk) in filtered and str(http.pk) not in filtered
    admin_client.post("/admin/outbox/deadletter/", {"action": "replay_selected", "post": "yes", "reason": "fixed",
                                                    helpers.ACTION_CHECKBOX_NAME: [str(timeout.pk)]})  # fmt: skip
    assert Delivery.objects.get(pk=timeout.pk).status == "pending"


def test_dead_letters_can_be_found_by_passport_id_and_event_id(admin_client):
    passport = PassportFactory()
    ConsumerFactory(name="billing", max_attempts=1)
    event, _ = emit("passport.published", {"dppId": str(passport.pk), "upi": passport.upi})
    Delivery.objects.update(status="dead")
    for term in (str(passport.pk), str(event.pk), passport.upi, "billing", "not-a-uuid"):
        response = admin_client.get("/admin/outbox/deadletter/", {"q": term})
        assert response.status_code == 200
        if term != "not-a-uuid":
            assert "1 dead letter" in response.content.decode(), term


def test_stalled_registrations_list(admin_client):
    stalled = backed_off_registration(attempts=9)
    calm = backed_off_registration(attempts=1)
    page = admin_client.get("/admin/registry/stalledregistration/").content.decode()
    assert stalled.passport.upi in page and calm.passport.upi not in page
    found = admin_client.get("/admin/registry/stalledregistration/", {"q": str(stalled.passport_id)})
    assert stalled.passport.upi in found.content.decode()


def test_passport_page_follows_the_passport_end_to_end(admin_client, registry_sim):
    from registry.drain import drain_once

    ConsumerFactory(name="site-builder")
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    drain_once()
    page = admin_client.get(f"/admin/odal/passport/{passport.pk}/change/").content.decode()
    assert "submitted (the registry is checking)" in page
    assert "requestId req-" in page  # the registry's answer
    assert "passport.published" in page and "site-builder" in page


def test_publish_action_is_two_pass_with_an_optional_reason(admin_client, settings):
    settings.ODAL_REGISTRY_ADAPTER = "none"  # so the published one truly needs no change
    draft, done = PassportFactory(), PassportFactory(status="published")
    data = {"action": "publish_selected", helpers.ACTION_CHECKBOX_NAME: [str(draft.pk), str(done.pk)]}
    first = admin_client.post("/admin/odal/passport/", data)
    assert b"Publish passports" in first.content and b'name="reason"' in first.content
    assert Passport.objects.get(pk=draft.pk).status == "draft"
    bad = admin_client.post("/admin/odal/passport/", {**data, "post": "yes", "reason": "a\x07b"})
    assert b"control characters" in bad.content
    second = admin_client.post(
        "/admin/odal/passport/", {**data, "post": "yes", "reason": "launch day"}, follow=True
    )
    assert b"Published 1 of 2 selected; 1 needed no change." in second.content
    assert Passport.objects.get(pk=draft.pk).status == "published"
    assert AuditEntry.objects.get(action="passport_published").reason == "launch day"


def test_suspend_action_reports_refusals(admin_client):
    draft = PassportFactory()
    data = {
        "action": "suspend_selected",
        "post": "yes",
        "reason": "",
        helpers.ACTION_CHECKBOX_NAME: [str(draft.pk)],
    }
    response = admin_client.post("/admin/odal/passport/", data, follow=True)
    assert b"Suspended 0 of 1 selected; 1 refused." in response.content
    assert b"only a published passport can be suspended" in response.content


ACTIONS = {
    "/admin/outbox/delivery/": "replay_selected",
    "/admin/outbox/deadletter/": "replay_selected",
    "/admin/registry/registration/": "abandon_selected",
    "/admin/registry/stalledregistration/": "abandon_selected",
}


@pytest.mark.parametrize("url, action", ACTIONS.items())
def test_operators_get_the_actions_and_viewers_do_not(client, url, action):
    DeadDeliveryFactory()
    backed_off_registration(attempts=9)  # the admin shows no actions on an empty list
    member_of(client, "Operators")
    assert action in client.get(url).content.decode()
    member_of(client, "Viewers")
    page = client.get(url)
    assert page.status_code == 200 and action not in page.content.decode()


def test_plain_staff_see_nothing(client):
    client.force_login(UserFactory())
    for url in [*ACTIONS, "/admin/odal/auditentry/"]:
        assert client.get(url).status_code == 403


def test_a_viewer_cannot_replay_by_posting_the_action(client):
    member_of(client, "Viewers")
    dead = DeadDeliveryFactory()
    client.post("/admin/outbox/deadletter/", {"action": "replay_selected", "post": "yes", "reason": "sneaky",
                                               helpers.ACTION_CHECKBOX_NAME: [str(dead.pk)]})  # fmt: skip
    assert Delivery.objects.get(pk=dead.pk).status == "dead"
    assert not AuditEntry.objects.exists()


def test_audit_trail_filters_and_links_to_objects(admin_client):
    dead = DeadDeliveryFactory()
    Delivery.objects.filter(pk=dead.pk).replay(actor="user:ops", reason="fixed")
    page = admin_client.get("/admin/odal/auditentry/", {"action": "delivery_replayed", "actor": "user:ops"})
    assert f"/admin/outbox/delivery/{dead.pk}/change/" in page.content.decode()
