"""Pages that refresh themselves (issue 38, item 2): the stamps they poll, one query each, and
who may read them. The browser side is tests/browser/test_live_in_chromium.py."""

import json

import pytest
from django.contrib.auth.models import Group

from odal.core.groups import ensure_groups
from odal.surfaces import lifecycle, live
from outbox.models import Delivery
from outbox.sweep import sweep_once
from registry.drain import drain_once
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    UserFactory,
    backed_off_registration,
)

pytestmark = pytest.mark.django_db


def viewer():
    ensure_groups()
    user = UserFactory(username="viewer")
    user.groups.add(Group.objects.get(name="Viewers"))
    return user


def objects():
    reg = backed_off_registration(attempts=2)
    delivery = DeliveryFactory()
    return {
        "dashboard": None,
        "deliveries": None,
        "registrations": None,
        "passport": reg.passport_id,
        "registration": reg.pk,
        "delivery": delivery.pk,
        "consumer": delivery.consumer_id,
    }


def url(kind, pk=None):
    return live.url_of(kind, pk)


def test_every_stamp_is_one_query(django_assert_num_queries):
    for kind, pk in objects().items():
        with django_assert_num_queries(1):
            answer = live.read(kind, pk)
        assert answer["kind"] == kind and len(answer["stamp"]) == 20, answer


def test_a_viewer_reads_each_stamp_as_json(client):
    pks = objects()
    client.force_login(viewer())
    for kind, pk in pks.items():
        response = client.get(url(kind, pk))
        assert response.status_code == 200, (kind, response.content[:200])
        assert response["Content-Type"] == "application/json"
        body = response.json()
        assert set(body) == {"kind", "stamp", "busy", "pollSeconds", "state"}
        assert body["busy"] is True and body["pollSeconds"] == live.BUSY_SECONDS, (kind, body)
    state = client.get(url("registration", pks["registration"])).json()["state"]
    assert (state["status"], state["attempts"], state["passportStatus"]) == ("pending", 2, "published")
    assert "claimToken" not in state  # (staff other than superusers never see a claim token)


def test_anonymous_is_sent_to_sign_in(client):
    pks = objects()
    for kind, pk in pks.items():
        response = client.get(url(kind, pk))
        assert response.status_code == 302 and "/admin/login/" in response["Location"], kind


def test_staff_without_the_view_permission_get_403(client):
    pks = objects()
    client.force_login(UserFactory(username="bare-staff"))
    for kind in ("passport", "delivery", "consumer", "registration", "deliveries", "registrations"):
        response = client.get(url(kind, pks[kind]))
        assert response.status_code == 403, kind
        assert response.json()["code"] == "permission_denied"
    assert client.get(url("dashboard")).status_code == 200  # (its page shows every staff member)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/odal/live/passport/7f3a9c1e-0000-4000-8000-000000000000/",  # no such passport
        "/admin/odal/live/passport/not-a-uuid/",
        "/admin/odal/live/consumer/999999/",
        "/admin/odal/live/consumer/abc/",
        "/admin/odal/live/consumer/99999999999999999999999999/",  # (past a bigint)
        "/admin/odal/live/consumer/-1/",
        "/admin/odal/live/nothing/",
        "/admin/odal/live/passport/",  # (a kind of one object, without its id)
        "/admin/odal/live/dashboard/1/",
    ],
)
def test_what_names_nothing_is_404(client, path):
    objects()
    client.force_login(viewer())
    response = client.get(path)
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_a_registration_stamp_moves_with_the_drain_and_rests_when_settled(registry_sim):
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="user:test")
    first = live.read("passport", passport.pk)
    assert first["busy"] and first["state"]["registrationStatus"] == "pending"
    drain_once()  # register: submitted
    second = live.read("passport", passport.pk)
    assert second["stamp"] != first["stamp"] and second["state"]["registrationStatus"] == "submitted"
    assert live.read("passport", passport.pk)["stamp"] == second["stamp"]  # (nothing moved: the same)
    drain_once()  # check: registered
    third = live.read("passport", passport.pk)
    assert third["state"]["registrationStatus"] == "registered"
    assert not third["busy"] and third["pollSeconds"] == live.REST_SECONDS


def test_a_delivery_stamp_moves_when_it_is_delivered():
    delivery = DeliveryFactory(consumer=ConsumerFactory(name="billing"))
    before = live.read("delivery", delivery.pk)
    consumer_before = live.read("consumer", delivery.consumer_id)
    dashboard_before = live.read("dashboard")
    sweep_once()
    assert Delivery.objects.get(pk=delivery.pk).status == "delivered"
    after = live.read("delivery", delivery.pk)
    assert after["stamp"] != before["stamp"] and not after["busy"]
    assert live.read("consumer", delivery.consumer_id)["stamp"] != consumer_before["stamp"]
    dashboard = live.read("dashboard")
    assert dashboard["stamp"] != dashboard_before["stamp"]
    assert (dashboard["state"]["pending"], dashboard["state"]["delivered"]) == (0, 1)


def test_a_new_dead_letter_changes_the_lists_stamp():
    DeliveryFactory()
    before = live.read("deliveries")
    DeadDeliveryFactory()
    assert live.read("deliveries")["stamp"] != before["stamp"]


def test_live_pages_carry_their_stamp_and_live_js(admin_client):
    pks = objects()
    pages = {
        "/admin/": "dashboard",
        f"/admin/odal/passport/{pks['passport']}/change/": "passport",
        f"/admin/registry/registration/{pks['registration']}/change/": "registration",
        f"/admin/outbox/delivery/{pks['delivery']}/change/": "delivery",
        f"/admin/outbox/consumer/{pks['consumer']}/change/": "consumer",
        "/admin/outbox/delivery/?status__exact=pending": "deliveries",
        "/admin/outbox/deadletter/": "deliveries",
        "/admin/registry/registration/?status__exact=pending": "registrations",
        "/admin/registry/stalledregistration/": "registrations",
    }
    for path, kind in pages.items():
        response = admin_client.get(path)
        html = response.content.decode()
        assert response.status_code == 200 and "odal/live.js" in html, path
        config = json.loads(html.split('id="odal-live" type="application/json">')[1].split("</script>")[0])
        assert config["url"] == url(kind, pks.get(kind)), path
        assert config["stamp"] == live.read(kind, pks.get(kind))["stamp"], path
    dashboard = admin_client.get("/admin/").content.decode()
    assert 'id="live-dashboard" data-live="dashboard"' in dashboard


def test_a_page_that_is_not_live_gets_the_script_and_no_config(admin_client):
    html = admin_client.get("/admin/odal/auditentry/").content.decode()
    assert "odal/live.js" in html and 'id="odal-live"' not in html


def test_a_page_reads_its_stamp_before_what_it_shows(admin_client):
    """A change landing between the two reads makes the page newer than its stamp (one refetch too
    many), never older (a page that would sit stale, its stamp already the new one)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    reg = objects()["registration"]
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(f"/admin/registry/registration/{reg}/change/")
    sqls = [q["sql"] for q in queries.captured_queries]
    stamp = next(i for i, sql in enumerate(sqls) if '"lastAttempt"' in sql)
    shown = next(i for i, sql in enumerate(sqls) if 'FROM "registry_registration"' in sql and i != stamp)
    assert stamp < shown, sqls
