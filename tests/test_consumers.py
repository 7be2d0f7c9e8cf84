"""Consumers as operators manage them (issue 14): pause and resume, automatic pause, secret
rotation with overlap, consumers through the API, resend and test events. Real sweeps, real
HTTP for webhooks, signatures checked with the standardwebhooks package."""

import uuid
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from standardwebhooks import Webhook

from odal.core.models import AuditEntry
from outbox import service
from outbox.events import emit
from outbox.models import Consumer, Delivery, DeliveryAttempt, Event, Failure
from outbox.sweep import sweep_once
from tests import consumers as recorder
from tests.factories import ConsumerFactory, DeliveryFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _calls():
    recorder.calls.clear()
    yield
    recorder.calls.clear()


def statuses(consumer) -> dict:
    return dict(Delivery.objects.filter(consumer=consumer).values_list("pk", "status"))


# -- pause and resume -------------------------------------------------------------------------------


def test_a_paused_consumer_gets_deliveries_made_but_none_claimed_none_spent_none_dead(admin_api):
    consumer = ConsumerFactory(name="erp", max_attempts=1)
    waiting = DeliveryFactory(consumer=consumer)
    answer = admin_api.post("outbox/consumers/erp/pause", {"reason": "ERP maintenance tonight"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["paused"], body["pausedReason"]) == (True, "ERP maintenance tonight")
    assert body["pausedBy"].startswith("token:")
    emit("passport.published", {"n": 1})  # made while paused
    spent = DeliveryFactory(consumer=consumer, attempts=1)  # its attempt never reported; now due

    report = sweep_once()

    assert report.claimed == 0 and report.dead_lettered == 0
    rows = Delivery.objects.filter(consumer=consumer)
    assert set(rows.values_list("status", flat=True)) == {"paused"}
    assert rows.count() == 3
    assert Delivery.objects.get(pk=waiting.pk).attempts == 0
    assert Delivery.objects.get(pk=spent.pk).status == "paused"
    assert recorder.calls == []
    entry = AuditEntry.objects.get(action="consumer_paused")
    assert (entry.actor, entry.reason, entry.object_id) == (
        body["pausedBy"],
        "ERP maintenance tonight",
        str(consumer.pk),
    )


def test_on_resume_the_waiting_deliveries_flow_in_creation_order(admin_api):
    """Resumed rows are due from when they were made: ahead of each other in that order, and
    ahead of a row that fell due after them (another consumer's, due 5 minutes ago), not behind
    it as rows due from the resume would be."""
    consumer = ConsumerFactory(name="erp")
    admin_api.post("outbox/consumers/erp/pause", {"reason": "maintenance"})
    now = timezone.now()
    later = Event.objects.create(type="passport.published", payload={"m": 5})
    Delivery.objects.create(
        event=later, consumer=ConsumerFactory(name="crm"), created_at=now - timedelta(minutes=5),
        next_attempt_at=now - timedelta(minutes=5), id=uuid.UUID(int=5),
    )  # fmt: skip
    made = []
    for minutes in (30, 10, 20):  # made out of order of their creation times
        event = Event.objects.create(type="passport.published", payload={"m": minutes})
        made.append(
            Delivery.objects.create(
                event=event,
                consumer=consumer,
                status="paused",
                created_at=now - timedelta(minutes=minutes),
                id=uuid.UUID(int=minutes),  # (ids sort the other way: an order by id is caught)
            )
        )
    spent = made[0]
    Delivery.objects.filter(pk=spent.pk).update(attempts=F("max_attempts"))  # its budget used up

    answer = admin_api.post("outbox/consumers/erp/resume", {"reason": "maintenance over"})
    assert answer.status_code == 200 and answer.json()["paused"] is False
    assert set(statuses(consumer).values()) == {"pending"}
    spent.refresh_from_db()
    assert spent.attempts == spent.max_attempts - 1  # one attempt left

    sweep_once()
    assert [payload_minutes for _, payload_minutes in _order(recorder.calls)] == [30, 20, 10, 5]
    assert set(statuses(consumer).values()) == {"delivered"}
    assert AuditEntry.objects.filter(action="consumer_resumed", reason="maintenance over").exists()


def _order(calls):
    by_id = {str(d.pk): d.event.payload["m"] for d in Delivery.objects.select_related("event")}
    return [(delivery_id, by_id[delivery_id]) for _, delivery_id in calls]


def test_pausing_twice_or_resuming_an_active_consumer_changes_nothing(admin_api):
    ConsumerFactory(name="erp")
    assert admin_api.post("outbox/consumers/erp/resume", {"reason": "why not"}).status_code == 200
    admin_api.post("outbox/consumers/erp/pause", {"reason": "first"})
    again = admin_api.post("outbox/consumers/erp/pause", {"reason": "second"})
    assert again.json()["pausedReason"] == "first"
    assert AuditEntry.objects.filter(action="consumer_paused").count() == 1
    assert not AuditEntry.objects.filter(action="consumer_resumed").exists()


def test_pause_needs_a_reason_and_a_known_consumer(admin_api):
    ConsumerFactory(name="erp")
    assert admin_api.post("outbox/consumers/erp/pause", {}).status_code == 422
    assert admin_api.post("outbox/consumers/erp/pause", {"reason": "  "}).status_code == 422
    missing = admin_api.post("outbox/consumers/nope/pause", {"reason": "x"})
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert not Consumer.objects.get(name="erp").paused


def test_an_attempt_failing_after_its_consumer_paused_is_parked_not_dead_lettered():
    consumer = ConsumerFactory(max_attempts=1)
    d = DeliveryFactory(consumer=consumer)
    claim = Delivery.objects.claim(limit=1, hold_seconds=300)
    service.pause(consumer, actor="ops", reason="maintenance")
    assert Delivery.objects.get(pk=d.pk).status == "pending"  # held by a live claim: left to it
    now = timezone.now()
    failure = Failure(d.pk, "HTTP 503", retry_at=now, at=now)
    assert Delivery.objects.mark_attempts_failed_each(token=claim.token, failures=[failure]) == {d.pk}
    row = Delivery.objects.get(pk=d.pk)
    assert (row.status, row.dead_at, row.attempts) == ("paused", None, 1)


# -- automatic pause --------------------------------------------------------------------------------


def test_a_consumer_failing_for_a_day_is_paused_by_odal_and_the_others_are_told(settings):
    settings.ODAL_AUTO_PAUSE_AFTER = 24 * 3600
    broken = ConsumerFactory(name="broken", target="tests.consumers.explode", max_attempts=8)
    other = ConsumerFactory(name="other", target="tests.consumers.accept", event_types=["consumer.*"])
    Consumer.objects.filter(pk=broken.pk).update(
        failing_since=timezone.now() - timedelta(hours=25), failures=service.AUTO_PAUSE_MIN_FAILURES
    )
    rows = DeliveryFactory.create_batch(3, consumer=broken)

    report = sweep_once(batch=1)  # one attempt fails: the streak is long enough

    assert report.failed == 1
    broken.refresh_from_db()
    assert (broken.paused, broken.paused_by) == (True, "odal")
    assert "every attempt failed for 1 day" in broken.paused_reason and "boom" in broken.paused_reason
    assert AuditEntry.objects.filter(action="consumer_paused", actor="odal", details__automatic=True).exists()
    told = Delivery.objects.get(consumer=other, event__type="consumer.paused")
    assert told.event.payload["consumer"] == "broken"
    assert not Delivery.objects.filter(consumer=broken, event__type="consumer.paused").exists()
    assert set(statuses(broken).values()) == {"paused"}
    assert not Delivery.objects.filter(pk__in=[r.pk for r in rows], status="dead").exists()


def test_a_young_streak_or_a_short_one_does_not_pause(settings):
    settings.ODAL_AUTO_PAUSE_AFTER = 24 * 3600
    broken = ConsumerFactory(target="tests.consumers.explode", max_attempts=8)
    Consumer.objects.filter(pk=broken.pk).update(
        failing_since=timezone.now() - timedelta(hours=2), failures=50
    )
    DeliveryFactory(consumer=broken)
    sweep_once()
    broken.refresh_from_db()
    assert not broken.paused and broken.failures == 51
    Consumer.objects.filter(pk=broken.pk).update(failing_since=timezone.now() - timedelta(days=3), failures=2)
    DeliveryFactory(consumer=broken)
    Delivery.objects.filter(consumer=broken).update(next_attempt_at=timezone.now())
    sweep_once()
    broken.refresh_from_db()
    assert not broken.paused


def test_the_automatic_pause_rereads_the_streak(settings):
    """A caller's reading may be stale (another sweep's success ended the streak meanwhile): the
    pause itself checks the streak in the database."""
    settings.ODAL_AUTO_PAUSE_AFTER = 24 * 3600
    consumer = ConsumerFactory()
    Consumer.objects.filter(pk=consumer.pk).update(
        failing_since=timezone.now() - timedelta(hours=2), failures=99
    )
    consumer.failing_since = timezone.now() - timedelta(days=2)  # what a stale reading says
    assert not service.auto_pause(consumer, ["HTTP 503"])
    assert not Consumer.objects.get(pk=consumer.pk).paused


def test_a_success_ends_the_failure_streak():
    consumer = ConsumerFactory(target="tests.consumers.accept")
    Consumer.objects.filter(pk=consumer.pk).update(
        failing_since=timezone.now() - timedelta(hours=3), failures=7
    )
    DeliveryFactory(consumer=consumer)
    sweep_once()
    consumer.refresh_from_db()
    assert (consumer.failing_since, consumer.failures) == (None, 0)


def test_auto_pause_off_never_pauses(settings):
    settings.ODAL_AUTO_PAUSE_AFTER = None
    stale = ConsumerFactory()
    Consumer.objects.filter(pk=stale.pk).update(
        failing_since=timezone.now() - timedelta(days=9), failures=500
    )
    assert not service.auto_pause(Consumer.objects.get(pk=stale.pk), ["HTTP 503"])
    broken = ConsumerFactory(target="tests.consumers.explode", max_attempts=8)
    Consumer.objects.filter(pk=broken.pk).update(
        failing_since=timezone.now() - timedelta(days=9), failures=500
    )
    DeliveryFactory(consumer=broken)
    sweep_once()
    broken.refresh_from_db()
    assert not broken.paused


# -- rotation -----------------------------------------------------------------------------------------


def test_during_the_grace_every_request_carries_both_signatures_each_verifiable(admin_api):
    with WebhookServer(script=[204]) as server:
        consumer = WebhookConsumerFactory(name="hook", url=server.url)
        old = consumer.secret
        answer = admin_api.post("outbox/consumers/hook/rotate-secret", {"reason": "yearly rotation"})
        assert answer.status_code == 200, answer.content
        new = answer.json()["secret"]
        assert new.startswith("whsec_") and new != old
        assert answer.json()["previousSecretExpiresAt"] is not None
        emit("passport.published", {"n": 1})
        sweep_once()
    request = server.received[0]
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):  # a consumer that knows either secret accepts the request
        assert Webhook(secret).verify(request.body, request.headers)["data"] == {"n": 1}
    entry = AuditEntry.objects.get(action="consumer_secret_rotated")
    assert new not in str(entry.details) and old not in str(entry.details)
    assert old not in answer.content.decode()


def test_after_the_grace_or_with_none_only_the_new_secret_signs(admin_api):
    with WebhookServer(script=[204]) as server:
        consumer = WebhookConsumerFactory(name="hook", url=server.url)
        old = consumer.secret
        new = admin_api.post(
            "outbox/consumers/hook/rotate-secret", {"reason": "leaked", "graceSeconds": 0}
        ).json()["secret"]
        emit("passport.published", {"n": 1})
        sweep_once()
    request = server.received[0]
    assert len(request.headers["webhook-signature"].split(" ")) == 1
    assert Webhook(new).verify(request.body, request.headers)
    with pytest.raises(Exception):  # noqa: B017 - the old secret no longer verifies
        Webhook(old).verify(request.body, request.headers)
    consumer.refresh_from_db()
    Consumer.objects.filter(pk=consumer.pk).update(
        previous_secret=old, previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    consumer.refresh_from_db()
    from outbox.consumers import signing_secrets

    assert signing_secrets(consumer) == [new]


def test_two_rotations_from_the_same_reading_cannot_both_take():
    consumer = ConsumerFactory()
    stale = Consumer.objects.get(pk=consumer.pk)
    service.rotate_secret(consumer, actor="a", reason="first")
    with pytest.raises(service.Refused) as refused:
        service.rotate_secret(stale, actor="b", reason="second")
    assert refused.value.code == "rotation_conflict"
    assert AuditEntry.objects.filter(action="consumer_secret_rotated").count() == 1


def test_rotation_grace_is_bounded(admin_api):
    ConsumerFactory(name="hook")
    for grace in (-1, 31 * 86400, "soon"):
        answer = admin_api.post("outbox/consumers/hook/rotate-secret", {"reason": "x", "graceSeconds": grace})
        assert answer.status_code == 422, grace


# -- consumers through the API ------------------------------------------------------------------------


def test_list_get_and_change_a_consumer_audited(admin_api, api_as):
    ConsumerFactory(name="b-erp", kind="python", target="tests.consumers.accept")
    WebhookConsumerFactory(name="a-hook")
    listed = api_as("read").get("outbox/consumers").json()["items"]
    assert [c["name"] for c in listed] == ["a-hook", "b-erp"]
    assert "secret" not in listed[0] and set(listed[0]) >= {
        "eventTypes",
        "maxAttempts",
        "timeoutSeconds",
        "paused",
    }
    one = api_as("read").get("outbox/consumers/a-hook")
    assert one.status_code == 200 and one.json()["kind"] == "webhook"

    changed = admin_api.patch(
        "outbox/consumers/a-hook",
        {
            "url": "https://hooks.example.eu/new",
            "eventTypes": ["passport.*"],
            "timeoutSeconds": 7,
            "maxAttempts": 4,
        },
    )
    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert (body["url"], body["eventTypes"], body["timeoutSeconds"], body["maxAttempts"]) == (
        "https://hooks.example.eu/new", ["passport.*"], 7, 4,
    )  # fmt: skip
    entry = AuditEntry.objects.get(action="consumer_changed")
    assert entry.details["timeoutSeconds"] == {"was": 2, "now": 7}
    assert admin_api.patch("outbox/consumers/a-hook", {"timeoutSeconds": 7}).status_code == 200
    assert AuditEntry.objects.filter(action="consumer_changed").count() == 1  # nothing differed


@pytest.mark.parametrize(
    "body",
    [
        {"url": "ftp://x"},
        {"eventTypes": ["bad type"]},
        {"timeoutSeconds": 0},
        {"maxAttempts": 1001},
        {"target": "x.y"},
    ],
)
def test_a_bad_change_is_refused_and_changes_nothing(admin_api, body):
    WebhookConsumerFactory(name="hook", url="https://hooks.example.eu/a")
    answer = admin_api.patch("outbox/consumers/hook", body)
    assert answer.status_code == 422, answer.content
    assert Consumer.objects.get(name="hook").url == "https://hooks.example.eu/a"
    assert not AuditEntry.objects.filter(action="consumer_changed").exists()


def test_remove_is_refused_while_deliveries_are_owed_then_takes_the_settled_ones(admin_api):
    consumer = ConsumerFactory(name="old")
    pending = DeliveryFactory(consumer=consumer)
    DeliveryFactory(consumer=consumer, status="delivered")
    refused = admin_api.delete("outbox/consumers/old", {"reason": "decommissioned"})
    assert refused.status_code == 409 and refused.json()["code"] == "deliveries_pending"
    assert Consumer.objects.filter(name="old").exists()

    Delivery.objects.filter(pk=pending.pk).update(status="dead")
    removed = admin_api.delete("outbox/consumers/old", {"reason": "decommissioned"})
    assert removed.status_code == 200 and removed.json() == {"name": "old", "deliveriesRemoved": 2}
    assert not Consumer.objects.filter(name="old").exists()
    assert AuditEntry.objects.get(action="consumer_removed").details["deliveriesRemoved"] == 2
    assert admin_api.delete("outbox/consumers/old", {"reason": "again"}).status_code == 404


def test_a_read_token_cannot_change_pause_or_rotate(api_as):
    ConsumerFactory(name="erp")
    reader = api_as("read")
    assert reader.post("outbox/consumers/erp/pause", {"reason": "x"}).status_code == 403
    assert reader.post("outbox/consumers/erp/rotate-secret", {"reason": "x"}).status_code == 403
    assert reader.patch("outbox/consumers/erp", {"timeoutSeconds": 5}).status_code == 403
    assert not Consumer.objects.get(name="erp").paused


# -- resend and test events ------------------------------------------------------------------------


def test_resend_sends_a_delivered_delivery_again_with_the_same_id(admin_api):
    consumer = ConsumerFactory(name="erp")
    d = DeliveryFactory(consumer=consumer)
    sweep_once()
    assert Delivery.objects.get(pk=d.pk).status == "delivered"
    answer = admin_api.post(f"outbox/deliveries/{d.pk}/resend", {"reason": "the ERP lost its copy"})
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "pending"
    sweep_once()
    assert [delivery_id for _, delivery_id in recorder.calls] == [str(d.pk), str(d.pk)]
    entry = AuditEntry.objects.get(action="delivery_resent")
    assert entry.details["previousStatus"] == "delivered"
    assert DeliveryAttempt.objects.filter(delivery=d).count() == 2


def test_resend_refuses_a_pending_delivery(admin_api):
    d = DeliveryFactory(consumer=ConsumerFactory())
    answer = admin_api.post(f"outbox/deliveries/{d.pk}/resend", {"reason": "x"})
    assert answer.status_code == 409 and answer.json()["code"] == "not_settled"
    assert not AuditEntry.objects.filter(action="delivery_resent").exists()


def test_bulk_resend_by_filter_with_a_dry_run(admin_api):
    erp, other = ConsumerFactory(name="erp"), ConsumerFactory(name="other")
    DeliveryFactory.create_batch(2, consumer=erp, status="delivered")
    DeliveryFactory(consumer=erp, status="dead")
    DeliveryFactory(consumer=erp)  # pending: not taken
    DeliveryFactory(consumer=other, status="delivered")
    dry = admin_api.post("outbox/resend", {"reason": "replaying a day", "consumer": "erp", "dryRun": True})
    assert dry.json() == {"resent": None, "wouldResend": 3, "lateSuccesses": 0, "warning": None}
    assert Delivery.objects.filter(status="pending").count() == 1
    only_dead = admin_api.post(
        "outbox/resend", {"reason": "r", "consumer": "erp", "status": "dead", "dryRun": True}
    )
    assert only_dead.json()["wouldResend"] == 1
    done = admin_api.post("outbox/resend", {"reason": "replaying a day", "consumer": "erp"})
    assert done.json()["resent"] == 3
    assert Delivery.objects.filter(consumer=erp, status="pending").count() == 4
    assert Delivery.objects.get(consumer=other).status == "delivered"
    bad = admin_api.post("outbox/resend", {"reason": "r", "status": "pending"})
    assert bad.status_code == 422


def test_a_test_event_goes_to_that_consumer_alone(admin_api):
    ConsumerFactory(name="erp", event_types=["passport.*"])
    ConsumerFactory(name="everything", event_types=[])
    answer = admin_api.post("outbox/consumers/erp/test-event")
    assert answer.status_code == 201, answer.content
    delivery = Delivery.objects.get(pk=answer.json()["deliveryId"])
    assert (delivery.consumer.name, delivery.event.type) == ("erp", "odal.test")
    assert Delivery.objects.filter(event=delivery.event).count() == 1
    sweep_once()
    assert recorder.calls == [("odal.test", str(delivery.pk))]


def test_no_claim_takes_a_paused_consumers_row_even_before_it_is_parked():
    consumer = ConsumerFactory()
    service.pause(consumer, actor="ops", reason="maintenance")
    row = DeliveryFactory(consumer=consumer)  # pending: made between a pass's parking and its claim
    assert Delivery.objects.claim(limit=10).rows == []
    assert Delivery.objects.get(pk=row.pk).attempts == 0


def test_a_paused_consumers_spent_row_is_not_dead_lettered_even_before_it_is_parked():
    consumer = ConsumerFactory(max_attempts=1)
    service.pause(consumer, actor="ops", reason="maintenance")
    DeliveryFactory(consumer=consumer, attempts=1, next_attempt_at=timezone.now() - timedelta(minutes=1))
    assert Delivery.objects.dead_letter_exhausted(now=timezone.now()) == 0
    assert Delivery.objects.park_paused(now=timezone.now()) == 1


def test_unpark_takes_nothing_of_a_consumer_paused_again():
    consumer = ConsumerFactory()
    service.pause(consumer, actor="ops", reason="maintenance")
    DeliveryFactory(consumer=consumer, status="paused")
    assert Delivery.objects.unpark(consumer_id=consumer.pk) == 0
    assert Delivery.objects.get(consumer=consumer).status == "paused"


@pytest.mark.parametrize("value", ["24", "0m", "5s", "366d", "soon", "-1h", "1e3h"])
def test_a_bad_odal_auto_pause_after_stops_start_up_naming_the_variable(value):
    from tests.test_settings import refusal

    assert refusal(ODAL_AUTO_PAUSE_AFTER=value).startswith("ODAL_AUTO_PAUSE_AFTER must be")


@pytest.mark.parametrize(
    "value, seconds", [("24h", 86400), ("90m", 5400), ("7d", 604800), ("off", None), ("", 86400)]
)
def test_odal_auto_pause_after_is_read_from_the_environment(value, seconds):
    from tests.test_settings import read_settings

    assert read_settings(ODAL_AUTO_PAUSE_AFTER=value)["ODAL_AUTO_PAUSE_AFTER"] == seconds
