"""Two operators editing one consumer (issue 24): a change made from a stale reading never undoes
another's. The API's PATCH takes If-Match with GET's ETag (412 precondition_failed on a stale
one); the admin saves only the fields changed and refuses, with a form error, a form older than
the row; the admin's removal is the guarded, audited one of the API and the command line."""

import re

import pytest
from django.contrib.admin import helpers

from odal.core.models import AuditEntry
from outbox import service
from outbox.models import Consumer
from tests.factories import DeliveryFactory, WebhookConsumerFactory

pytestmark = pytest.mark.django_db


# -- the guarded write --------------------------------------------------------------------------------


def test_a_change_from_a_stale_reading_takes_nothing_and_leaves_the_others_change():
    consumer = WebhookConsumerFactory(name="hook", timeout_seconds=5, max_attempts=3)
    first, second = Consumer.objects.get(pk=consumer.pk), Consumer.objects.get(pk=consumer.pk)
    service.change_consumer(first, actor="alice", timeout_seconds=9)
    with pytest.raises(service.Refused) as refused:
        service.change_consumer(second, actor="bob", timeout_seconds=5, max_attempts=4)
    assert refused.value.code == "consumer_changed"
    consumer.refresh_from_db()
    assert (consumer.timeout_seconds, consumer.max_attempts) == (9, 3)
    entries = AuditEntry.objects.filter(action="consumer_changed")
    assert [e.details for e in entries] == [{"timeoutSeconds": {"was": 5, "now": 9}}]


def test_every_write_of_what_get_shows_counts_a_version():
    consumer = WebhookConsumerFactory(name="hook")
    seen = [Consumer.objects.get(pk=consumer.pk).version]
    service.change_consumer(Consumer.objects.get(pk=consumer.pk), actor="a", timeout_seconds=7)
    service.pause(Consumer.objects.get(pk=consumer.pk), actor="a", reason="r")
    service.resume(Consumer.objects.get(pk=consumer.pk), actor="a", reason="r")
    service.rotate_secret(Consumer.objects.get(pk=consumer.pk), actor="a", reason="r")
    seen.append(Consumer.objects.get(pk=consumer.pk).version)
    assert seen[1] == seen[0] + 4


# -- the API ------------------------------------------------------------------------------------------


def test_patch_with_the_etag_of_get_takes_and_answers_the_new_etag(admin_api):
    WebhookConsumerFactory(name="hook", timeout_seconds=5)
    read = admin_api.get("outbox/consumers/hook")
    etag = read.headers["ETag"]
    answer = admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 8}, headers={"If-Match": etag})
    assert answer.status_code == 200, answer.content
    assert answer.headers["ETag"] != etag
    assert answer.headers["ETag"] == admin_api.get("outbox/consumers/hook").headers["ETag"]


@pytest.mark.parametrize("change", ["patch", "pause"])
def test_patch_with_a_stale_etag_is_412_and_writes_nothing(admin_api, change):
    consumer = WebhookConsumerFactory(name="hook", timeout_seconds=5)
    stale = admin_api.get("outbox/consumers/hook").headers["ETag"]
    if change == "patch":
        assert admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 9}).status_code == 200
    else:
        assert admin_api.post("outbox/consumers/hook/pause", {"reason": "upgrade"}).status_code == 200
    before = Consumer.objects.get(pk=consumer.pk)
    answer = admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 6}, headers={"If-Match": stale})
    assert answer.status_code == 412, answer.content
    assert answer.json()["code"] == "precondition_failed" and answer.json()["detail"]
    after = Consumer.objects.get(pk=consumer.pk)
    assert (after.timeout_seconds, after.version) == (before.timeout_seconds, before.version)
    assert AuditEntry.objects.filter(action="consumer_changed").count() == (1 if change == "patch" else 0)


@pytest.mark.parametrize("header", ['W/"1"', "1", "garbage", '"999"'])
def test_an_if_match_that_is_not_the_etag_is_412(admin_api, header):
    WebhookConsumerFactory(name="hook", timeout_seconds=5)
    answer = admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 6}, headers={"If-Match": header})
    assert answer.status_code == 412 and answer.json()["code"] == "precondition_failed"
    assert Consumer.objects.get(name="hook").timeout_seconds == 5


def test_if_match_star_and_no_if_match_still_change(admin_api):
    WebhookConsumerFactory(name="hook", timeout_seconds=5)
    assert (
        admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 6}, headers={"If-Match": "*"}).status_code
        == 200
    )
    assert admin_api.patch("outbox/consumers/hook", {"timeoutSeconds": 7}).status_code == 200
    assert Consumer.objects.get(name="hook").timeout_seconds == 7


# -- the admin -----------------------------------------------------------------------------------------


def change_page(client, consumer) -> dict:
    """What the change form shows now, as the browser would post it back unchanged."""
    page = client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content.decode()
    version = re.search(r'name="opened_at_version" value="(\d+)"', page)
    assert version, "the change form carries the version it was opened on"
    return {
        "url": consumer.url, "target": "", "event_types": "[]", "max_attempts": consumer.max_attempts,
        "timeout_seconds": consumer.timeout_seconds, "opened_at_version": version.group(1),
    }  # fmt: skip


def test_a_form_older_than_the_row_is_refused_with_a_form_error_and_changes_nothing(admin_client):
    consumer = WebhookConsumerFactory(name="hook", timeout_seconds=5, max_attempts=3)
    alice = change_page(admin_client, consumer)
    bob = change_page(admin_client, consumer)
    took = admin_client.post(f"/admin/outbox/consumer/{consumer.pk}/change/", {**alice, "timeout_seconds": 9})
    assert took.status_code == 302, took.content[:3000]
    refused = admin_client.post(f"/admin/outbox/consumer/{consumer.pk}/change/", {**bob, "max_attempts": 4})
    assert refused.status_code == 200
    assert b"Someone else changed this consumer since you opened this form" in refused.content
    consumer.refresh_from_db()
    assert (consumer.timeout_seconds, consumer.max_attempts) == (9, 3)  # Alice's change stands
    assert [e.details for e in AuditEntry.objects.filter(action="consumer_changed")] == [
        {"timeoutSeconds": {"was": 5, "now": 9}}
    ]


def test_the_admin_writes_only_the_fields_changed(admin_client):
    consumer = WebhookConsumerFactory(name="hook", timeout_seconds=5, max_attempts=3)
    form = change_page(admin_client, consumer)
    response = admin_client.post(f"/admin/outbox/consumer/{consumer.pk}/change/", {**form, "max_attempts": 6})
    assert response.status_code == 302, response.content[:3000]
    entry = AuditEntry.objects.get(action="consumer_changed")
    assert entry.details == {"maxAttempts": {"was": 3, "now": 6}}


def test_the_admin_delete_page_of_one_consumer_is_refused(admin_client):
    consumer = WebhookConsumerFactory(name="hook")
    for method in ("get", "post"):
        response = getattr(admin_client, method)(
            f"/admin/outbox/consumer/{consumer.pk}/delete/", {"post": "yes"}
        )
        assert response.status_code == 403
    assert Consumer.objects.filter(pk=consumer.pk).exists()
    assert b"/delete/" not in admin_client.get(f"/admin/outbox/consumer/{consumer.pk}/change/").content


def remove(client, consumer, **extra):
    return client.post(
        "/admin/outbox/consumer/",
        {"action": "delete_selected", helpers.ACTION_CHECKBOX_NAME: [consumer.pk], **extra},
        follow="post" in extra,
    )


def test_the_admin_removal_asks_a_reason_and_is_the_audited_one(admin_client):
    consumer = WebhookConsumerFactory(name="hook")
    DeliveryFactory(consumer=consumer, status="delivered")
    first = remove(admin_client, consumer)
    assert first.status_code == 200 and b'name="reason"' in first.content
    assert remove(admin_client, consumer, post="yes", reason="").status_code == 200
    assert Consumer.objects.filter(pk=consumer.pk).exists()
    done = remove(admin_client, consumer, post="yes", reason="migrated to the new deployer")
    assert b"Removed 1 of 1 selected" in done.content
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    entry = AuditEntry.objects.get(action="consumer_removed")
    assert entry.reason == "migrated to the new deployer" and entry.details["deliveriesRemoved"] == 1
    assert AuditEntry.objects.filter(action="delivery_removed").count() == 1


def test_the_admin_removal_of_a_consumer_with_a_delivery_owed_is_refused_not_a_500(admin_client):
    consumer = WebhookConsumerFactory(name="hook")
    DeliveryFactory(consumer=consumer)  # pending: owed
    done = remove(admin_client, consumer, post="yes", reason="gone")
    assert done.status_code == 200 and b"still has 1 deliveries pending or paused" in done.content
    assert Consumer.objects.filter(pk=consumer.pk).exists()
    assert not AuditEntry.objects.filter(action="consumer_removed").exists()
