"""A second rotation inside the first one's grace (issue 24): refused `409 rotation_in_progress`,
so a secret announced valid until its previousSecretExpiresAt keeps signing until then. Checked
as a consumer checks: the standardwebhooks package, over real HTTP from a real sweep."""

import io
from datetime import timedelta

import pytest
from django.contrib.admin import helpers
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from standardwebhooks import Webhook

from odal.core.models import AuditEntry
from outbox import service
from outbox.events import emit
from outbox.models import Consumer
from outbox.sweep import sweep_once
from tests.factories import WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db


def verifies(secret: str, request) -> bool:
    try:
        Webhook(secret).verify(request.body, request.headers)
    except Exception:  # noqa: BLE001 - standardwebhooks raises WebhookVerificationError
        return False
    return True


def test_a_rotation_inside_the_grace_is_refused_and_every_announced_secret_still_verifies(admin_api):
    with WebhookServer(script=[204]) as server:
        consumer = WebhookConsumerFactory(name="hook", url=server.url)
        oldest = consumer.secret
        first = admin_api.post(
            "outbox/consumers/hook/rotate-secret", {"reason": "yearly", "graceSeconds": 3600}
        )
        assert first.status_code == 200, first.content
        announced = first.json()["previousSecretExpiresAt"]
        second = admin_api.post(
            "outbox/consumers/hook/rotate-secret", {"reason": "again", "graceSeconds": 3600}
        )
        assert second.status_code == 409, second.content
        assert second.json()["code"] == "rotation_in_progress"
        assert second.json()["previousSecretExpiresAt"] == announced
        assert AuditEntry.objects.filter(action="consumer_secret_rotated").count() == 1
        emit("passport.published", {"n": 1})
        sweep_once()
    request = server.received[0]
    # A consumer still verifying with the secret it was told stays valid for an hour accepts it,
    # and so does one that already switched to the new one.
    assert verifies(oldest, request) and verifies(first.json()["secret"], request)
    consumer.refresh_from_db()
    assert consumer.secret == first.json()["secret"] and consumer.previous_secret == oldest


def test_a_rotation_without_grace_is_taken_inside_a_grace_and_drops_every_old_secret(admin_api):
    """A leaked secret: the operator must be able to stop it signing at once, grace or not."""
    with WebhookServer(script=[204]) as server:
        consumer = WebhookConsumerFactory(name="hook", url=server.url)
        oldest = consumer.secret
        first = admin_api.post("outbox/consumers/hook/rotate-secret", {"reason": "yearly"}).json()["secret"]
        leaked = admin_api.post(
            "outbox/consumers/hook/rotate-secret", {"reason": "leaked", "graceSeconds": 0}
        )
        assert leaked.status_code == 200, leaked.content
        assert leaked.json()["previousSecretExpiresAt"] is None
        emit("passport.published", {"n": 1})
        sweep_once()
    request = server.received[0]
    assert verifies(leaked.json()["secret"], request)
    assert not verifies(first, request) and not verifies(oldest, request)


def test_once_the_grace_has_run_out_a_rotation_with_grace_is_taken(admin_api):
    consumer = WebhookConsumerFactory(name="hook")
    service.rotate_secret(consumer, actor="a", reason="first", grace=timedelta(hours=1))
    Consumer.objects.filter(pk=consumer.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    answer = admin_api.post("outbox/consumers/hook/rotate-secret", {"reason": "second"})
    assert answer.status_code == 200, answer.content


def test_two_readings_of_one_grace_cannot_both_rotate():
    """The refusal is in the guarded update: a reading taken before the first rotation (no grace
    running then) is refused too, not only a fresh one."""
    consumer = WebhookConsumerFactory(name="hook")
    stale = Consumer.objects.get(pk=consumer.pk)
    service.rotate_secret(consumer, actor="a", reason="first", grace=timedelta(hours=1))
    Consumer.objects.filter(pk=consumer.pk).update(secret=stale.secret)  # as if it were the one read
    consumer.refresh_from_db()
    with pytest.raises(service.Refused) as refused:
        service.rotate_secret(stale, actor="b", reason="second", grace=timedelta(hours=1))
    assert refused.value.code == "rotation_in_progress"
    assert Consumer.objects.get(pk=consumer.pk).previous_secret == consumer.previous_secret


def test_the_command_line_refuses_it_exit_1_and_rotates_nothing():
    consumer = WebhookConsumerFactory(name="hook")
    call_command("outbox", "consumer", "rotate-secret", "hook", "--reason", "yearly", stdout=io.StringIO())
    consumer.refresh_from_db()
    with pytest.raises(CommandError, match="grace runs until"):
        call_command("outbox", "consumer", "rotate-secret", "hook", "--reason", "again", stdout=io.StringIO())
    assert Consumer.objects.get(pk=consumer.pk).secret == consumer.secret


def test_the_admin_action_refuses_it_with_a_message_and_shows_no_secret(admin_client):
    consumer = WebhookConsumerFactory(name="hook")
    service.rotate_secret(consumer, actor="a", reason="first")
    consumer.refresh_from_db()
    response = admin_client.post(
        "/admin/outbox/consumer/",
        {"action": "rotate_secret", helpers.ACTION_CHECKBOX_NAME: [consumer.pk], "post": "yes",
         "reason": "again", "grace": "24h"},
        follow=True,
    )  # fmt: skip
    assert response.status_code == 200 and b"grace runs until" in response.content
    assert Consumer.objects.get(pk=consumer.pk).secret == consumer.secret
    assert AuditEntry.objects.filter(action="consumer_secret_rotated").count() == 1  # the first
