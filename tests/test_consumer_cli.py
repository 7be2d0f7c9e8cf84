"""`odal outbox consumer …` and `odal outbox resend`: the same operations as the API (outbox.service),
with sentences for people and --json for scripts."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import AuditEntry
from outbox.models import Consumer, Delivery
from tests.factories import ConsumerFactory, DeliveryFactory, WebhookConsumerFactory

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_list_and_show_with_and_without_json():
    WebhookConsumerFactory(name="hook", url="https://hooks.example.eu/a")
    ConsumerFactory(name="erp")
    text = run("consumer", "list")
    assert "hook" in text and "https://hooks.example.eu/a" in text and "(active)" in text
    listed = json.loads(run("consumer", "list", "--json"))
    assert [c["name"] for c in listed] == ["erp", "hook"] and "secret" not in listed[0]
    shown = json.loads(run("consumer", "show", "hook", "--json"))
    assert shown["url"] == "https://hooks.example.eu/a" and shown["paused"] is False


def test_pause_resume_and_again_from_the_command_line():
    consumer = ConsumerFactory(name="erp")
    DeliveryFactory(consumer=consumer)
    assert "Paused erp" in run("consumer", "pause", "erp", "--reason", "ERP upgrade", "--actor", "alice")
    assert Delivery.objects.get(consumer=consumer).status == "paused"
    assert "Already paused (by cli:alice: ERP upgrade)" in run(
        "consumer", "pause", "erp", "--reason", "again"
    )
    assert "1 waiting deliveries are due again" in run("consumer", "resume", "erp", "--reason", "done")
    assert "was not paused" in run("consumer", "resume", "erp", "--reason", "done")
    assert Delivery.objects.get(consumer=consumer).status == "pending"
    assert AuditEntry.objects.filter(action="consumer_paused", actor="cli:alice").count() == 1


def test_rotate_secret_prints_the_new_secret_once_and_the_grace():
    consumer = ConsumerFactory(name="erp")
    text = run("consumer", "rotate-secret", "erp", "--reason", "yearly", "--grace", "2h")
    consumer.refresh_from_db()
    assert f"(shown once): {consumer.secret}" in text and "signs beside it until" in text
    assert consumer.previous_secret and consumer.previous_secret not in text
    text = run("consumer", "rotate-secret", "erp", "--reason", "leaked", "--grace", "0s")
    assert "no longer signs" in text
    consumer.refresh_from_db()
    assert consumer.previous_secret == ""


def test_change_and_remove():
    ConsumerFactory(name="erp")
    changed = json.loads(
        run("consumer", "change", "erp", "--timeout", "9", "--events", "passport.*", "--json")
    )
    assert (changed["timeoutSeconds"], changed["eventTypes"]) == (9, ["passport.*"])
    owed = DeliveryFactory(consumer=Consumer.objects.get(name="erp"))
    with pytest.raises(CommandError, match="still has 1 deliveries pending or paused"):
        run("consumer", "remove", "erp", "--reason", "gone")
    Delivery.objects.filter(pk=owed.pk).update(status="delivered")
    assert "Removed erp with 1 settled deliveries" in run("consumer", "remove", "erp", "--reason", "gone")
    assert not Consumer.objects.filter(name="erp").exists()


def test_resend_by_ids_and_by_filter():
    erp = ConsumerFactory(name="erp")
    delivered = DeliveryFactory(consumer=erp, status="delivered")
    pending = DeliveryFactory(consumer=erp)
    with pytest.raises(CommandError, match="1 were pending or paused"):
        run("resend", str(delivered.pk), str(pending.pk), "--reason", "lost")
    assert Delivery.objects.get(pk=delivered.pk).status == "pending"
    DeliveryFactory.create_batch(2, consumer=erp, status="dead")
    assert "Would resend 2 deliveries." in run("resend", "--consumer", "erp", "--reason", "r", "--dry-run")
    assert "Resent 2 deliveries." in run("resend", "--consumer", "erp", "--status", "dead", "--reason", "r")
    assert not Delivery.objects.filter(consumer=erp, status="dead").exists()


def test_a_test_event_from_the_command_line():
    ConsumerFactory(name="erp")
    text = run("consumer", "test-event", "erp")
    assert "Test event sent to erp: delivery" in text
    assert Delivery.objects.get(consumer__name="erp").event.type == "odal.test"


def test_status_shows_what_waits_for_a_paused_consumer():
    consumer = ConsumerFactory(name="erp")
    DeliveryFactory.create_batch(2, consumer=consumer)
    run("consumer", "pause", "erp", "--reason", "ERP upgrade")
    text = run("status")
    assert "paused 2" in text and "(paused by cli: ERP upgrade)" in text
