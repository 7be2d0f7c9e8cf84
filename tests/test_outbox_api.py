import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from odal.core.models import AuditEntry
from outbox.models import Consumer, Delivery
from tests.factories import ConsumerFactory, DeadDeliveryFactory, DeliveryFactory, WebhookConsumerFactory

pytestmark = pytest.mark.django_db

BAD_REASONS = [
    pytest.param({}, id="missing"),
    pytest.param({"reason": ""}, id="empty"),
    pytest.param({"reason": "   "}, id="blank"),
    pytest.param({"reason": "x" * 501}, id="too-long"),
    pytest.param({"reason": "line one\nline two"}, id="newline"),
    pytest.param({"reason": "bell\x07"}, id="control"),
    pytest.param({"reason": 42}, id="not-text"),
]


def test_post_event_fans_out(api_as):
    ConsumerFactory(event_types=["order.*"])
    ConsumerFactory(event_types=["passport.*"])
    response = api_as("write").post("events", {"type": "order.paid", "payload": {"total": 3}})
    assert response.status_code == 201
    body = response.json()
    assert body["type"] == "order.paid" and body["deliveries"] == 1


@pytest.mark.parametrize("event_type", ["", "Order.Paid", "order..paid", "order paid", "x" * 101])
def test_post_event_refuses_a_bad_type(api_as, event_type):
    response = api_as("write").post("events", {"type": event_type, "payload": {}})
    assert response.status_code == 422
    assert Delivery.objects.count() == 0


def test_post_consumer_shows_the_secret_once(api_as):
    response = api_as("admin").post(
        "outbox/consumers",
        {
            "name": "site-builder",
            "kind": "webhook",
            "url": "https://hooks.example.eu/odal",
            "eventTypes": ["passport.*"],
        },
    )
    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    assert secret.startswith("whsec_")
    assert Consumer.objects.get(name="site-builder").secret == secret
    assert secret not in api_as("admin").get("outbox").content.decode()
    assert AuditEntry.objects.filter(action="consumer_created").count() == 1


@pytest.mark.parametrize(
    "body, code",
    [
        ({"name": "x", "kind": "webhook"}, "invalid_consumer"),
        ({"name": "x", "kind": "webhook", "url": "ftp://files.example.eu/"}, "invalid_url"),
        # (urlparse's own refusals: an unclosed bracket, a name NFKC makes a URL of its own)
        ({"name": "x", "kind": "webhook", "url": "http://[::1/"}, "invalid_url"),
        ({"name": "x", "kind": "webhook", "url": "http://a]b/"}, "invalid_url"),
        ({"name": "x", "kind": "webhook", "url": "http://exa\u2100mple.com/"}, "invalid_url"),
        ({"name": "x", "kind": "python", "target": "tests.consumers.no_such_func"}, "invalid_target"),
        ({"name": "x", "kind": "python", "target": "no.such.module.func"}, "invalid_target"),
        ({"name": "x", "kind": "carrier-pigeon", "url": "https://a.example.eu"}, "invalid_request"),
        ({"name": "bad name!", "kind": "webhook", "url": "https://a.example.eu"}, "invalid_request"),
        (
            {"name": "x", "kind": "webhook", "url": "https://a.example.eu", "maxAttempts": 0},
            "invalid_request",
        ),
        (
            {"name": "x", "kind": "webhook", "url": "https://a.example.eu", "eventTypes": ["Bad Type"]},
            "invalid_event_type",
        ),
    ],
)
def test_post_consumer_refuses_bad_input(api_as, body, code):
    response = api_as("admin").post("outbox/consumers", body)
    assert response.status_code == 422, response.content
    assert response.json()["code"] == code
    assert not Consumer.objects.exists()


def test_duplicate_consumer_name_is_409(api_as):
    ConsumerFactory(name="dup")
    response = api_as("admin").post(
        "outbox/consumers", {"name": "dup", "kind": "python", "target": "tests.consumers.accept"}
    )
    assert response.status_code == 409


def test_private_webhook_targets_are_refused_in_production_mode(api_as, settings):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    for url in [
        "http://127.0.0.1:8200/hooks",
        "http://10.1.2.3/",
        "http://169.254.169.254/latest",
        "http://localhost/",
    ]:
        response = api_as("admin").post("outbox/consumers", {"name": "x", "kind": "webhook", "url": url})
        assert response.status_code == 422, url
        assert response.json()["code"] == "private_webhook_target"


def test_consumers_need_admin_scope(api_as):
    response = api_as("write").post(
        "outbox/consumers", {"name": "x", "kind": "python", "target": "tests.consumers.accept"}
    )
    assert response.status_code == 403


def test_counts_overall_and_per_consumer(api_as):
    a, b = ConsumerFactory(name="a"), ConsumerFactory(name="b")
    DeliveryFactory(consumer=a)
    DeadDeliveryFactory(consumer=a)
    DeliveryFactory(consumer=b, status="delivered")
    body = api_as("read").get("outbox").json()
    assert (body["pending"], body["delivered"], body["dead"]) == (1, 1, 1)
    rows = [
        {k: c[k] for k in ("name", "isPaused", "pending", "delivered", "dead")} for c in body["consumers"]
    ]
    assert rows == [
        {"name": "a", "isPaused": False, "pending": 1, "delivered": 0, "dead": 1},
        {"name": "b", "isPaused": False, "pending": 0, "delivered": 1, "dead": 0},
    ]
    assert body["oldestPendingAt"] is not None
    assert body["consumers"][0]["oldestPendingAt"] == body["oldestPendingAt"]
    assert body["consumers"][1]["oldestPendingAt"] is None


def test_dead_letter_list_pages_with_a_cursor(api_as):
    consumer = ConsumerFactory(name="billing")
    now = timezone.now()
    dead = [DeadDeliveryFactory(consumer=consumer, created_at=now - timedelta(minutes=i)) for i in range(5)]
    DeliveryFactory(consumer=consumer)
    client = api_as("read")
    first = client.get("outbox/deliveries", status="dead", limit=2).json()
    second = client.get("outbox/deliveries", status="dead", limit=2, cursor=first["nextCursor"]).json()
    third = client.get("outbox/deliveries", status="dead", limit=2, cursor=second["nextCursor"]).json()
    seen = [item["id"] for page in (first, second, third) for item in page["items"]]
    assert seen == [str(d.pk) for d in dead]
    assert third["nextCursor"] is None
    assert first["items"][0]["consumer"] == "billing" and first["items"][0]["status"] == "dead"


@pytest.mark.parametrize("query", [{"status": "lost"}, {"cursor": "garbage!"}, {"limit": 0}, {"limit": 1000}])
def test_bad_list_parameters_are_422(api_as, query):
    assert api_as("read").get("outbox/deliveries", **query).status_code == 422


def test_list_filters_by_consumer_and_event_type(api_as):
    a = ConsumerFactory(name="a")
    DeliveryFactory(consumer=a, event__type="passport.published")
    DeliveryFactory(consumer=a, event__type="passport.suspended")
    DeliveryFactory(event__type="passport.published")
    items = (
        api_as("read").get("outbox/deliveries", consumer="a", eventType="passport.published").json()["items"]
    )
    assert len(items) == 1 and items[0]["eventType"] == "passport.published"


def test_delivery_detail_has_the_attempt_log(api_as):
    from outbox.sweep import sweep_once

    WebhookConsumerFactory(url="http://127.0.0.1:9/hooks")
    from outbox.events import emit

    emit("passport.published", {})
    sweep_once()
    delivery = Delivery.objects.get()
    body = api_as("read").get(f"outbox/deliveries/{delivery.pk}").json()
    assert body["attempts"] == 1 and body["status"] == "pending"
    [attempt] = body["attemptLog"]
    assert attempt["number"] == 1 and attempt["outcome"] == "failed" and attempt["late"] is False
    assert attempt["error"].startswith("connection error")


def test_unknown_delivery_is_404(api_as):
    assert api_as("read").get(f"outbox/deliveries/{uuid.uuid4()}").status_code == 404


def test_replay_a_dead_delivery(api_as):
    delivery = DeadDeliveryFactory()
    response = api_as("admin").post(
        f"outbox/deliveries/{delivery.pk}/replay", {"reason": "consumer fixed its TLS"}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["attempts"]) == ("pending", 0)
    delivery.refresh_from_db()
    assert (
        delivery.status == "pending"
        and delivery.next_attempt_at <= timezone.now()
        and delivery.dead_at is None
    )
    entry = AuditEntry.objects.get(action="delivery_replayed")
    assert entry.actor == "token:test-admin"
    assert entry.reason == "consumer fixed its TLS"
    assert entry.object_id == str(delivery.pk)
    assert entry.details["previousAttempts"] == 3
    assert entry.details["lastError"] == "HTTP 500: upstream exploded"


@pytest.mark.parametrize("status", ["pending", "delivered"])
def test_replay_of_a_live_or_delivered_row_is_409(api_as, status):
    delivery = DeliveryFactory(status=status, attempts=1)
    response = api_as("admin").post(f"outbox/deliveries/{delivery.pk}/replay", {"reason": "try it"})
    assert response.status_code == 409
    assert response.json()["code"] == "not_dead"
    assert status in response.json()["detail"]
    delivery.refresh_from_db()
    assert delivery.status == status and delivery.attempts == 1
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("body", BAD_REASONS)
def test_replay_refuses_a_bad_reason_and_changes_nothing(api_as, body):
    delivery = DeadDeliveryFactory()
    response = api_as("admin").post(f"outbox/deliveries/{delivery.pk}/replay", body)
    assert response.status_code == 422
    assert response.json()["code"] in {"invalid_reason", "invalid_request"}
    delivery.refresh_from_db()
    assert delivery.status == "dead" and delivery.attempts == 3
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("body", BAD_REASONS)
def test_the_replay_write_itself_refuses_a_bad_reason_and_changes_nothing(body):
    """The API's schema refuses a bad reason before the route runs; the admin and the command
    line reach the write itself, which checks it again (odal.core.reasons.clean_reason)."""
    from odal.core.errors import Refused

    delivery = DeadDeliveryFactory()
    with pytest.raises(Refused) as refused:
        Delivery.objects.filter(pk=delivery.pk).replay(actor="user:ops", reason=body.get("reason"))
    assert refused.value.code == "invalid_reason"
    delivery.refresh_from_db()
    assert delivery.status == "dead" and delivery.attempts == 3
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("body", BAD_REASONS)
def test_every_route_that_takes_a_reason_refuses_a_bad_one_alike(api_as, body):
    delivery = DeadDeliveryFactory()
    client = api_as("admin")
    answers = [
        client.post(f"outbox/deliveries/{delivery.pk}/replay", body),
        client.post(f"outbox/deliveries/{delivery.pk}/resend", body),
        client.post(f"outbox/consumers/{delivery.consumer.name}/pause", body),
    ]
    assert [a.status_code for a in answers] == [422, 422, 422]
    assert answers[0].json()["code"] == "invalid_request" and "reason" in answers[0].json()["detail"]
    assert answers[0].json() == answers[1].json() == answers[2].json()
    delivery.refresh_from_db()
    assert delivery.status == "dead" and not AuditEntry.objects.exists()


def test_replay_needs_admin_scope(api_as):
    delivery = DeadDeliveryFactory()
    response = api_as("write").post(f"outbox/deliveries/{delivery.pk}/replay", {"reason": "x"})
    assert response.status_code == 403
    assert Delivery.objects.get(pk=delivery.pk).status == "dead"


def test_bulk_replay_by_filter_with_dry_run(api_as):
    billing, other = ConsumerFactory(name="billing"), ConsumerFactory(name="other")
    old = DeadDeliveryFactory(consumer=billing, dead_at=timezone.now() - timedelta(days=3))
    recent = [DeadDeliveryFactory(consumer=billing) for _ in range(2)]
    DeadDeliveryFactory(consumer=other)
    DeliveryFactory(consumer=billing)
    since = (timezone.now() - timedelta(days=1)).isoformat()
    client = api_as("admin")
    dry = client.post("outbox/replay", {"consumer": "billing", "deadSince": since, "dryRun": True})
    assert dry.json() == {"replayed": None, "wouldReplay": 2, "lateSuccesses": 0, "warning": None}
    assert Delivery.objects.filter(status="dead").count() == 4

    done = client.post(
        "outbox/replay", {"consumer": "billing", "deadSince": since, "reason": "billing is back"}
    )
    assert done.json()["replayed"] == 2
    assert set(Delivery.objects.filter(status="dead").values_list("pk", flat=True)) == {
        old.pk,
        *Delivery.objects.filter(consumer=other).values_list("pk", flat=True),
    }
    assert AuditEntry.objects.filter(action="delivery_replayed").count() == 2
    assert {e.object_id for e in AuditEntry.objects.all()} == {str(d.pk) for d in recent}


def test_bulk_replay_refuses_an_unknown_consumer_and_a_missing_reason(api_as):
    DeadDeliveryFactory()
    client = api_as("admin")
    assert client.post("outbox/replay", {"consumer": "nobody", "reason": "x"}).status_code == 422
    assert client.post("outbox/replay", {}).status_code == 422
    assert Delivery.objects.get().status == "dead"


def test_metrics_show_deliveries_attempts_and_late_writes(client):
    from outbox.models import DeliveryAttempt

    delivery = DeadDeliveryFactory(consumer=ConsumerFactory(name="billing"))
    now = timezone.now()
    for late in (False, True):
        DeliveryAttempt.objects.create(
            delivery=delivery,
            number=1,
            claim_token=uuid.uuid4(),
            started_at=now,
            finished_at=now,
            outcome="failed",
            late=late,
        )
    text = client.get("/metrics").content.decode()
    assert 'outbox_deliveries{consumer="billing",status="dead"} 1.0' in text
    assert 'outbox_attempts_total{outcome="failed"} 2.0' in text
    assert 'outbox_late_writes_total{outcome="failed"} 1.0' in text


def test_a_consumers_event_types_are_kept_once_each(api_as):
    # (20,000 repeats of one type were stored as they came: a list each delivery walks)
    api = api_as("admin")
    body = {"name": "once", "kind": "webhook", "url": "https://hooks.example.eu/odal"}
    repeated = ["passport.*", "order.shipped"] * 500 + ["passport.*"]
    assert api.post("outbox/consumers", {**body, "eventTypes": repeated}).status_code == 201
    assert Consumer.objects.get(name="once").event_types == ["passport.*", "order.shipped"]
    changed = api.patch("outbox/consumers/once", {"eventTypes": ["order.*", "order.*", "passport.*"]})
    assert changed.status_code == 200, changed.content
    assert Consumer.objects.get(name="once").event_types == ["order.*", "passport.*"]
