"""`Idempotency-Key` on POST events and POST dpp (issue 14, item 6): the same key and body within
24 hours answers the first result again and creates nothing; the same key with another body is
409 `idempotency_conflict`; a refused request leaves the key free; keys are per caller and route;
concurrent requests with one key create one event (the unique constraint decides)."""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from odal.core.models import AuditEntry, IdempotencyRecord, Passport
from outbox import api as outbox_api
from outbox import tasks
from outbox.models import Delivery, Event
from tests.factories import ConsumerFactory, UserFactory, issue_token

KEY = "order-4711-paid"
EVENT = {"type": "order.paid", "payload": {"total": 3}}
PASSPORT = {"upi": "https://id.example.eu/01/09506000134352/21/IDEM-1", "operatorId": "OP-1"}


def post(token: str, path: str, body: dict, key: str | None = KEY, client: Client | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if key is not None:
        headers["Idempotency-Key"] = key
    return (client or Client()).post(
        f"/vault/api/v1/{path}", body, content_type="application/json", headers=headers
    )


def event_ids() -> list[str]:
    return [str(pk) for pk in Event.objects.values_list("pk", flat=True)]


@pytest.fixture
def token():
    return issue_token("write")


@pytest.fixture
def consumer(db):
    return ConsumerFactory(event_types=["order.*"])


# -- POST events ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_same_key_and_body_answers_the_first_event_again_and_creates_nothing(token, consumer):
    first = post(token, "events", EVENT)
    again = post(token, "events", {"payload": {"total": 3}, "type": "order.paid"})  # key order is no matter

    assert first.status_code == again.status_code == 201, again.content
    assert again.json() == first.json() and first.json()["deliveries"] == 1
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert event_ids() == [first.json()["id"]]
    assert Delivery.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_409_and_creates_nothing(token, consumer):
    first = post(token, "events", EVENT)
    other = post(token, "events", {"type": "order.paid", "payload": {"total": 4}})

    assert other.status_code == 409, other.content
    assert other.json()["code"] == "idempotency_conflict"
    assert "Idempotency-Key" in other.json()["detail"]
    assert event_ids() == [first.json()["id"]]
    assert Delivery.objects.count() == 1


@pytest.mark.django_db
def test_two_callers_with_one_key_each_get_their_own_event(consumer):
    # Both tokens are named "test-write": a key is the token's, not the name's.
    mine, theirs = issue_token("write"), issue_token("write")
    first, second = post(mine, "events", EVENT), post(theirs, "events", EVENT)

    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]
    assert "Idempotent-Replayed" not in second.headers
    assert Event.objects.count() == 2


@pytest.mark.django_db
def test_a_staff_session_has_keys_of_its_own():
    client = Client()
    client.force_login(UserFactory(is_superuser=True))
    first = post("", "events", EVENT, client=client)
    again = post("", "events", EVENT, client=client)
    token_first = post(issue_token("write"), "events", EVENT)

    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert token_first.json()["id"] != first.json()["id"]
    assert Event.objects.count() == 2


@pytest.mark.django_db
def test_one_key_on_two_routes_is_two_requests(token):
    event = post(token, "events", EVENT)
    passport = post(token, "dpp", PASSPORT)

    assert (event.status_code, passport.status_code) == (201, 201), passport.content
    assert "Idempotent-Replayed" not in passport.headers
    assert Event.objects.count() == Passport.objects.count() == 1


@pytest.mark.django_db
def test_a_refused_request_leaves_the_key_free(token, consumer):
    refused = post(token, "events", {"type": "Order Paid", "payload": {"total": 3}})
    fixed = post(token, "events", EVENT)

    assert refused.status_code == 422 and refused.json()["code"] == "invalid_event_type"
    assert fixed.status_code == 201, fixed.content
    assert "Idempotent-Replayed" not in fixed.headers
    assert Event.objects.count() == 1 and Delivery.objects.count() == 1
    assert IdempotencyRecord.objects.get().status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize(
    "age, replayed",
    [
        pytest.param(timedelta(hours=23, minutes=59), True, id="23h59m"),
        pytest.param(timedelta(hours=24, minutes=1), False, id="24h01m"),
    ],
)
def test_a_key_counts_for_24_hours(token, consumer, age, replayed):
    first = post(token, "events", EVENT)
    IdempotencyRecord.objects.update(created_at=timezone.now() - age)
    again = post(token, "events", EVENT)

    assert again.status_code == 201
    assert (again.json()["id"] == first.json()["id"]) is replayed
    assert ("Idempotent-Replayed" in again.headers) is replayed
    assert Event.objects.count() == (1 if replayed else 2)
    assert IdempotencyRecord.objects.count() == 1  # an expired record is replaced, not kept beside


@pytest.mark.django_db
def test_another_body_after_24_hours_is_a_new_request(token, consumer):
    post(token, "events", EVENT)
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=25))
    other = post(token, "events", {"type": "order.paid", "payload": {"total": 4}})

    assert other.status_code == 201, other.content
    assert Event.objects.count() == 2


@pytest.mark.django_db
def test_without_a_key_every_request_creates(token, consumer):
    first, second = post(token, "events", EVENT, key=None), post(token, "events", EVENT, key=None)

    assert first.json()["id"] != second.json()["id"]
    assert Event.objects.count() == 2 and not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key, problem",
    [
        pytest.param("", "is empty", id="empty"),
        pytest.param("k" * 201, "is longer than 200 characters", id="201-chars"),
        pytest.param("clé-1", "printable ASCII", id="non-ascii"),
        pytest.param("a\x07b", "printable ASCII", id="bell"),
        pytest.param("a\tb", "printable ASCII", id="tab"),
        pytest.param("a\x7fb", "printable ASCII", id="delete"),
    ],
)
def test_a_bad_key_is_422_naming_the_header(token, consumer, key, problem):
    response = post(token, "events", EVENT, key=key)

    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "invalid_request"
    assert body["detail"].startswith("The request is not valid. Idempotency-Key header: ")
    assert problem in body["detail"]
    assert body["errors"][0]["field"] == "Idempotency-Key"
    assert not Event.objects.exists() and not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_a_key_of_200_printable_characters_is_taken(token):
    key = ("~ !" * 67)[:200]
    first, again = post(token, "events", EVENT, key=key), post(token, "events", EVENT, key=key)

    assert first.status_code == 201, first.content
    assert again.json()["id"] == first.json()["id"]


# -- POST dpp ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_same_key_and_body_answers_the_first_passport_again(token):
    first = post(token, "dpp", PASSPORT)
    again = post(token, "dpp", PASSPORT)

    assert first.status_code == again.status_code == 201, again.content
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert [str(pk) for pk in Passport.objects.values_list("pk", flat=True)] == [first.json()["id"]]
    assert AuditEntry.objects.filter(action="passport_created").count() == 1


@pytest.mark.django_db
def test_a_passport_with_another_body_under_the_same_key_is_409(token):
    post(token, "dpp", PASSPORT)
    other = post(token, "dpp", {**PASSPORT, "operatorId": "OP-2"})

    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert Passport.objects.get().operator_id == "OP-1"


@pytest.mark.django_db
def test_a_refused_passport_leaves_the_key_free(token):
    post(token, "dpp", PASSPORT, key=None)
    taken = post(token, "dpp", PASSPORT)  # the upi is taken: 409, nothing kept
    fixed = post(token, "dpp", {**PASSPORT, "upi": PASSPORT["upi"] + "-B"})

    assert taken.status_code == 409 and taken.json()["code"] == "upi_taken"
    assert fixed.status_code == 201, fixed.content
    assert Passport.objects.count() == 2


# -- two requests with one key at once -----------------------------------------------------------


def blocked_by(pid: int) -> bool:
    """Whether another session waits for `pid`. (Inside a transaction PostgreSQL keeps one view of
    pg_stat_activity until it ends; clearing it lets a session that connected since be seen.)"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid])
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)  # each request runs on its own thread and connection
def test_two_requests_with_one_key_at_once_create_one_event(monkeypatch):
    """The first request is held inside its transaction, its record inserted and its event not
    yet emitted, until the second request's INSERT waits on it. Then the first commits; the
    second finds its record and answers it. One event, one delivery, both answers name it."""
    ConsumerFactory(event_types=["order.*"])
    token = issue_token("write")
    real_emit, seen = outbox_api.emit, {"waited": False, "emits": 0}
    inside, answers = threading.Event(), {}

    def held_emit(*args, **kwargs):
        seen["emits"] += 1
        if seen["emits"] == 1:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid = cursor.fetchone()[0]
            inside.set()
            deadline = time.monotonic() + 5
            while not seen["waited"] and time.monotonic() < deadline:
                seen["waited"] = blocked_by(pid)
                time.sleep(0.005)  # polling for the waiter, not waiting for time to pass
        return real_emit(*args, **kwargs)

    monkeypatch.setattr(outbox_api, "emit", held_emit)

    def request(name: str) -> None:
        try:
            answers[name] = post(token, "events", EVENT)
        finally:
            connections.close_all()

    first = threading.Thread(target=request, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=request, args=("second",))
    second.start()
    first.join(20)
    second.join(20)

    assert seen["waited"], "the second request's INSERT did not wait for the first transaction"
    assert answers["first"].status_code == answers["second"].status_code == 201
    assert answers["second"].json() == answers["first"].json()
    assert answers["second"].headers["Idempotent-Replayed"] == "true"
    assert event_ids() == [answers["first"].json()["id"]]
    assert Delivery.objects.count() == 1 and seen["emits"] == 1


# -- retention -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_scheduled_purge_forgets_keys_older_than_24_hours(caplog):
    now = timezone.now()
    for n, age in enumerate([timedelta(hours=25), timedelta(hours=24, seconds=1), timedelta(hours=23)]):
        IdempotencyRecord.objects.create(
            caller="token:abcd1234",
            route="POST events",
            key=f"k{n}",
            request_hash="0" * 64,
            status_code=201,
            response={},
            created_at=now - age,
        )

    with caplog.at_level(logging.INFO, logger="outbox.retention"):
        tasks.purge()

    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["k2"]
    [logged] = [r.getMessage() for r in caplog.records if r.name == "outbox.retention"]
    assert "deleted 2 expired idempotency keys" in logged
