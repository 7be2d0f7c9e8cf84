import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import AuditEntry
from outbox.models import Consumer, Delivery
from tests.factories import ConsumerFactory, DeadDeliveryFactory, DeliveryFactory

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_replay_by_id_with_actor():
    dead = DeadDeliveryFactory()
    assert "Replayed 1 of 1 selected." in run("replay", str(dead.pk), "--reason", "fixed", "--actor", "alice")
    assert Delivery.objects.get().status == "pending"
    assert AuditEntry.objects.get().actor == "cli:alice"


def test_replay_of_a_non_dead_row_exits_1():
    delivery = DeliveryFactory(status="delivered")
    with pytest.raises(CommandError, match="not dead") as refused:
        run("replay", str(delivery.pk), "--reason", "again")
    assert refused.value.returncode == 1
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("reason", ["", "  ", "two\nlines", "x" * 600])
def test_replay_refuses_a_bad_reason(reason):
    dead = DeadDeliveryFactory()
    with pytest.raises(CommandError) as refused:
        run("replay", str(dead.pk), "--reason", reason)
    assert refused.value.returncode == 1
    assert Delivery.objects.get().status == "dead"


def test_bulk_replay_dry_run_then_for_real():
    billing = ConsumerFactory(name="billing")
    DeadDeliveryFactory(consumer=billing)
    DeadDeliveryFactory()
    assert "Would replay 1" in run("replay", "--dead", "--consumer", "billing", "--reason", "x", "--dry-run")
    assert "Replayed 1 of" in run("replay", "--dead", "--consumer", "billing", "--reason", "billing fixed")
    assert Delivery.objects.filter(status="dead").count() == 1


def test_replay_usage_errors_exit_2():
    with pytest.raises(CommandError) as both:
        run("replay", "--reason", "x")
    assert both.value.returncode == 2
    with pytest.raises(CommandError) as bad_since:
        run("replay", "--dead", "--since", "yesterday", "--reason", "x")
    assert bad_since.value.returncode == 2
    with pytest.raises(CommandError) as bad_id:
        run("replay", "nope", "--reason", "x")
    assert bad_id.value.returncode == 2


def test_status_json():
    DeadDeliveryFactory(consumer=ConsumerFactory(name="a"))
    body = json.loads(run("status", "--json"))
    assert body["dead"] == 1 and body["consumers"][0]["name"] == "a"
    assert "dead 1" in run("status")


def test_consumer_add_prints_the_secret_once():
    out = run(
        "consumer",
        "add",
        "deployer",
        "--url",
        "https://deploy.example.eu/h",
        "--events",
        "passport.*",
        "--max-attempts",
        "4",
    )
    consumer = Consumer.objects.get(name="deployer")
    assert consumer.secret in out
    assert (consumer.event_types, consumer.max_attempts) == (["passport.*"], 4)


def test_consumer_add_refuses_a_bad_url():
    with pytest.raises(CommandError, match="http"):
        run("consumer", "add", "x", "--url", "gopher://old.example.eu")
    assert not Consumer.objects.exists()


def test_sweep_once():
    ConsumerFactory()
    from outbox.events import emit

    emit("passport.published", {})
    assert "1 delivered" in run("sweep", "--once")
    assert Delivery.objects.get().status == "delivered"
