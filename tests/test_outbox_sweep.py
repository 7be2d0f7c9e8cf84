import json
import threading
import time

import pytest
from django.db import connections, transaction
from standardwebhooks import Webhook

from odal.surfaces import lifecycle
from outbox.events import emit
from outbox.models import Delivery, DeliveryAttempt, Event
from outbox.sweep import sweep_once
from tests import consumers
from tests.factories import ConsumerFactory, DeliveryFactory, PassportFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0  # retries are due at once; the tests sweep by hand


def test_webhook_is_signed_and_a_retry_carries_the_same_webhook_id():
    with WebhookServer(script=[500, 204]) as server:
        consumer = WebhookConsumerFactory(url=server.url, max_attempts=3)
        event, fanned_out = emit("passport.published", {"dppId": "abc", "upi": "https://id.example.eu/1"})
        assert fanned_out == 1

        first = sweep_once()
        second = sweep_once()

    assert (first.failed, second.delivered) == (1, 1)
    assert len(server.received) == 2
    verifier = Webhook(consumer.secret)  # the standardwebhooks package checks our signature
    for request in server.received:
        message = verifier.verify(request.body, request.headers)
        assert message == {
            "type": "passport.published",
            "timestamp": event.created_at.isoformat(),
            "data": {"dppId": "abc", "upi": "https://id.example.eu/1"},
        }
    delivery = Delivery.objects.get(event=event)
    assert (
        server.received[0].headers["webhook-id"]
        == server.received[1].headers["webhook-id"]
        == str(delivery.pk)
    )
    assert delivery.status == "delivered" and delivery.attempts == 2
    log = list(delivery.attempt_log.values_list("number", "outcome", "http_status", "error", "late"))
    assert log == [(1, "failed", 500, "HTTP 500: upstream exploded", False), (2, "delivered", 204, "", False)]


def test_a_signature_made_with_another_secret_is_refused():
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        emit("passport.published", {})
        sweep_once()
    other = Webhook("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=")
    with pytest.raises(Exception, match="signature"):
        other.verify(server.received[0].body, server.received[0].headers)


def test_webhook_timeout_fails_the_attempt():
    with WebhookServer(script=[("stall", 2, 204)]) as server:
        WebhookConsumerFactory(url=server.url, timeout_seconds=1)
        emit("passport.published", {})
        report = sweep_once()
    assert report.failed == 1
    assert Delivery.objects.get().last_error == "timed out after 1s"


def test_unreachable_webhook_fails_the_attempt():
    WebhookConsumerFactory(url="http://127.0.0.1:9/hooks")
    emit("passport.published", {})
    sweep_once()
    assert Delivery.objects.get().last_error.startswith("connection error: ConnectError")


def test_python_consumer_gets_the_event_and_delivery_id():
    consumers.calls.clear()
    ConsumerFactory(target="tests.consumers.accept")
    event, _ = emit("passport.suspended", {"dppId": "x"})
    sweep_once()
    delivery = Delivery.objects.get()
    assert consumers.calls == [("passport.suspended", str(delivery.pk))]
    assert delivery.status == "delivered"


def test_python_consumer_that_raises_fails_until_dead():
    ConsumerFactory(target="tests.consumers.explode", max_attempts=2)
    emit("passport.published", {})
    sweep_once()
    sweep_once()
    delivery = Delivery.objects.get()
    assert delivery.status == "dead" and delivery.attempts == 2
    assert delivery.last_error == "ValueError: boom"
    assert sweep_once().claimed == 0


def test_emit_fans_out_to_subscribed_consumers_and_parks_a_paused_ones():
    everything = ConsumerFactory(event_types=[])
    passports = ConsumerFactory(event_types=["passport.*"])
    exact = ConsumerFactory(event_types=["passport.suspended"])
    paused = ConsumerFactory(event_types=["passport.published"], paused=True)
    event, n = emit("passport.published", {})
    assert n == 3
    statuses = dict(Delivery.objects.filter(event=event).values_list("consumer", "status"))
    assert statuses == {everything.pk: "pending", passports.pk: "pending", paused.pk: "paused"}
    assert not exact.deliveries.exists()


def test_rolled_back_change_leaves_no_event_or_delivery():
    ConsumerFactory()
    passport = PassportFactory()
    with pytest.raises(RuntimeError), transaction.atomic():
        lifecycle.publish(passport.pk, actor="test")
        raise RuntimeError("the business write failed after the event was emitted")
    assert not Event.objects.exists() and not Delivery.objects.exists()
    passport.refresh_from_db()
    assert passport.status == "draft"


def test_publish_and_suspend_emit_their_events():
    ConsumerFactory()
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    lifecycle.publish(passport.pk, actor="test")  # no change, no event
    lifecycle.suspend(passport.pk, actor="test")
    events = list(Event.objects.order_by("created_at").values_list("type", "payload"))
    assert [t for t, _ in events] == ["passport.published", "passport.suspended"]
    assert events[0][1]["dppId"] == str(passport.pk) and events[0][1]["upi"] == passport.upi


def test_the_sweep_dead_letters_a_row_whose_last_attempt_never_reported():
    delivery = DeliveryFactory(max_attempts=2, attempts=2)
    report = sweep_once()
    assert report.dead_lettered == 1 and report.claimed == 0
    delivery.refresh_from_db()
    assert delivery.status == "dead"


@pytest.mark.django_db(transaction=True)
def test_a_slow_sweep_cannot_undo_what_a_faster_one_settled(settings):
    """Two real sweeps: A's attempt stalls past the hold, B claims the row and delivers it, then
    A's consumer fails. A's failure is logged as late and the delivery stays delivered."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    with WebhookServer(script=[("stall", 1.6, 500), 204]) as server:
        WebhookConsumerFactory(url=server.url, timeout_seconds=5, max_attempts=5)
        emit("passport.published", {})
        reports = {}

        def sweep_a():
            reports["a"] = sweep_once()
            connections.close_all()

        a = threading.Thread(target=sweep_a)
        a.start()
        time.sleep(1.2)  # A's hold has expired; A is still waiting on the consumer
        reports["b"] = sweep_once()
        a.join()

    assert reports["b"].delivered == 1
    assert reports["a"].late == 1 and reports["a"].failed == 0
    delivery = Delivery.objects.get()
    assert delivery.status == "delivered" and delivery.attempts == 2 and delivery.last_error == ""
    log = list(DeliveryAttempt.objects.order_by("finished_at").values_list("number", "outcome", "late"))
    assert log == [(2, "delivered", False), (1, "failed", True)]
    assert sweep_once().claimed == 0  # nothing left to deliver a third time


def test_webhook_body_is_the_exact_json_the_signature_covers():
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        emit("passport.published", {"b": 2, "a": [1, "é"]})
        sweep_once()
    body = server.received[0].body
    assert json.loads(body)["data"] == {"a": [1, "é"], "b": 2}
    assert server.received[0].headers["content-type"] == "application/json"


def test_webhooks_are_called_concurrently_but_at_most_the_bound_at_once_per_consumer(settings):
    """A sweep keeps several requests in flight, never more than ODAL_WEBHOOK_CONCURRENCY to one
    consumer; each consumer has its own bound."""
    settings.ODAL_WEBHOOK_CONCURRENCY = 3
    with (
        WebhookServer(script=[("stall", 0.2, 204)]) as one,
        WebhookServer(script=[("stall", 0.2, 204)]) as two,
    ):
        WebhookConsumerFactory(name="one", url=one.url)
        WebhookConsumerFactory(name="two", url=two.url)
        for n in range(12):
            emit("passport.published", {"n": n})
        report = sweep_once(batch=100)
    assert report.claimed == 24 and report.delivered == 24
    assert one.max_in_flight == 3 and two.max_in_flight == 3
    assert len(one.received) == len(two.received) == 12
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert DeliveryAttempt.objects.filter(outcome="delivered", late=False, http_status=204).count() == 24


def test_a_pass_starts_no_attempt_after_its_claims_hold_ran_out(settings):
    """Two deliveries to one consumer, one request at a time: the first stalls past the hold, so
    the second's turn comes when it is already due again for any claimer. It is not started by
    this pass, gets its counted attempt back, and the next pass attempts it."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    settings.ODAL_WEBHOOK_CONCURRENCY = 1
    with WebhookServer(script=[("stall", 1.3, 204), 204]) as server:
        WebhookConsumerFactory(url=server.url)
        emit("passport.published", {"n": 1})
        emit("passport.published", {"n": 2})
        first = sweep_once()
        assert len(server.received) == 1
        assert (first.claimed, first.delivered, first.not_started) == (2, 1, 1)
        assert "1 not started (hold ran out)" in first.summary()
        second = sweep_once()
    assert (second.claimed, second.delivered) == (1, 1)
    assert len(server.received) == 2
    assert sorted(Delivery.objects.values_list("status", "attempts")) == [("delivered", 1), ("delivered", 1)]


@pytest.mark.django_db(transaction=True)  # (the Python runner's thread reads what this one committed)
def test_a_pass_reads_only_what_it_claimed_no_field_of_a_claimed_row_is_loaded_again(monkeypatch):
    """The claim reads the fields a pass uses and each row's event whole (outbox.sweep.read_claimed):
    a field of the event left out would be loaded again by Django, one query per row, on
    whichever thread touched it (a webhook's body, a Python consumer's argument). Successes and
    failures, Python consumers and webhooks, written and logged: none is."""
    loaded = []
    for model in (Delivery, Event):
        original = model.refresh_from_db

        def recording(self, *args, _original=original, **kwargs):
            loaded.append((type(self).__name__, kwargs.get("fields")))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(model, "refresh_from_db", recording)
    with WebhookServer(script=[204, 500]) as server:
        WebhookConsumerFactory(url=server.url, max_attempts=3)
        ConsumerFactory(target="tests.consumers.accept")
        ConsumerFactory(target="tests.consumers.explode")
        emit("passport.published", {"n": 1})
        emit("passport.published", {"n": 2})

        report = sweep_once(batch=100)

    assert (report.claimed, report.delivered, report.failed) == (6, 3, 3)
    assert loaded == []
