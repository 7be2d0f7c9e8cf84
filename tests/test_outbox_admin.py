import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission

from odal.core.models import AuditEntry
from outbox.models import Consumer, Delivery
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    UserFactory,
    WebhookConsumerFactory,
)

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/outbox/delivery/"


def operator(client):
    user = UserFactory()
    user.user_permissions.add(
        Permission.objects.get(codename="view_delivery"), Permission.objects.get(codename="replay_delivery")
    )
    client.force_login(user)
    return user


def replay_post(client, deliveries, **extra):
    data = {
        "action": "replay_selected",
        helpers.ACTION_CHECKBOX_NAME: [str(d.pk) for d in deliveries],
        **extra,
    }
    return client.post(CHANGELIST, data, follow="post" in extra)


def test_replay_is_two_pass_and_reports_what_changed(client):
    user = operator(client)
    dead, alive = DeadDeliveryFactory(), DeliveryFactory(status="delivered")

    first = replay_post(client, [dead, alive])
    assert first.status_code == 200
    assert b'name="reason"' in first.content and b"1 of the 2 selected" in first.content
    assert Delivery.objects.get(pk=dead.pk).status == "dead"  # the first pass changes nothing

    blank = replay_post(client, [dead, alive], post="yes", reason="   ")
    assert b"A reason is required" in blank.content
    assert Delivery.objects.get(pk=dead.pk).status == "dead"
    assert not AuditEntry.objects.exists()

    done = replay_post(client, [dead, alive], post="yes", reason="consumer is back")
    assert b"Replayed 1 of 2 selected; 1 were not dead." in done.content
    assert Delivery.objects.get(pk=dead.pk).status == "pending"
    assert Delivery.objects.get(pk=alive.pk).status == "delivered"
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.reason) == (
        "delivery_replayed",
        f"user:{user.username}",
        "consumer is back",
    )


def test_replay_action_needs_its_permission(client):
    user = UserFactory()
    user.user_permissions.add(Permission.objects.get(codename="view_delivery"))
    client.force_login(user)
    dead = DeadDeliveryFactory()
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    assert b"replay_selected" not in page.content
    replay_post(client, [dead], post="yes", reason="sneaky")
    assert Delivery.objects.get(pk=dead.pk).status == "dead"
    assert not AuditEntry.objects.exists()


def test_delivery_page_shows_the_attempt_log_read_only(admin_client):
    from outbox.events import emit
    from outbox.sweep import sweep_once
    from tests.factories import WebhookConsumerFactory

    WebhookConsumerFactory(url="http://127.0.0.1:9/hooks")
    emit("passport.published", {})
    sweep_once()
    delivery = Delivery.objects.get()
    page = admin_client.get(f"/admin/outbox/delivery/{delivery.pk}/change/")
    assert page.status_code == 200
    assert b"connection error" in page.content
    assert b'name="_save"' not in page.content


def test_filters_by_status_and_consumer(admin_client):
    dead = DeadDeliveryFactory()
    page = admin_client.get(CHANGELIST, {"status__exact": "dead", "consumer__id__exact": dead.consumer_id})
    assert page.status_code == 200 and str(dead.pk).encode() in page.content


def test_adding_a_consumer_in_the_admin_shows_its_secret_once(admin_client):
    response = admin_client.post(
        "/admin/outbox/consumer/add/",
        {
            "name": "deployer",
            "kind": "webhook",
            "url": "https://deploy.example.eu/hook",
            "target": "",
            "event_types": '["passport.*"]',
            "max_attempts": 5,
            "timeout_seconds": 5,
        },
    )
    consumer = Consumer.objects.get(name="deployer")
    assert consumer.secret.encode() in response.content  # the answer to the POST, not a message
    assert (
        consumer.secret.encode()
        not in admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content
    )
    assert AuditEntry.objects.filter(action="consumer_created").count() == 1


@pytest.mark.parametrize(
    "factory, own",
    [
        (WebhookConsumerFactory, {"url": "https://deploy.example.eu/hook", "target": ""}),
        (ConsumerFactory, {"url": "", "target": "tests.consumers.accept"}),
    ],
    ids=["webhook", "python"],
)
def test_changing_a_consumer_in_the_admin_changes_it_and_audits(admin_client, factory, own):
    """The form shows url and target both, the other kind's blank: it was a 500 (change_consumer
    refused the blank one) whatever was changed."""
    consumer = factory(timeout_seconds=5)
    response = admin_client.post(
        f"/admin/outbox/consumer/{consumer.pk}/change/",
        {**own, "event_types": '["passport.*"]', "max_attempts": 3, "timeout_seconds": 7,
         "opened_at_version": consumer.version},
    )  # fmt: skip
    assert response.status_code == 302, response.content[:2000]
    consumer.refresh_from_db()
    assert (consumer.timeout_seconds, consumer.event_types) == (7, ["passport.*"])
    assert consumer.url == own["url"] and consumer.target == own["target"]
    entry = AuditEntry.objects.get(action="consumer_changed")
    assert entry.details["timeoutSeconds"] == {"was": 5, "now": 7}


@pytest.mark.parametrize(
    "factory, other",
    [
        (WebhookConsumerFactory, {"target": "tests.consumers.accept"}),
        (ConsumerFactory, {"url": "https://x.example.eu/"}),
    ],
    ids=["webhook", "python"],
)
def test_what_is_typed_in_the_other_kinds_field_of_the_admin_form_is_not_the_consumers(
    admin_client, factory, other
):
    """The form shows url and target both; only its kind's is passed on (the other was refused by
    change_consumer, "Only a webhook consumer has a url", whatever else was changed)."""
    consumer = factory(timeout_seconds=5)
    form = {"url": consumer.url, "target": consumer.target, **other}
    response = admin_client.post(
        f"/admin/outbox/consumer/{consumer.pk}/change/",
        {**form, "event_types": "[]", "max_attempts": 3, "timeout_seconds": 7, "opened_at_version": consumer.version},
    )  # fmt: skip
    assert response.status_code == 302, response.content[:2000]
    row = Consumer.objects.get(pk=consumer.pk)
    assert (row.timeout_seconds, row.url, row.target) == (7, consumer.url, consumer.target)


def test_admin_refuses_a_consumer_with_a_bad_url(admin_client):
    response = admin_client.post(
        "/admin/outbox/consumer/add/",
        {
            "name": "bad",
            "kind": "webhook",
            "url": "ftp://x.example.eu/",
            "target": "",
            "event_types": "[]",
            "max_attempts": 5,
            "timeout_seconds": 5,
        },
    )
    assert response.status_code == 200
    assert b"errornote" in response.content or b"errorlist" in response.content
    assert not Consumer.objects.exists()
