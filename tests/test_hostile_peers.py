"""Hostile peers: webhook endpoints and a registry answering with NUL bytes, invalid UTF-8, huge
or trickled bodies, redirects, resets and malformed JSON, over real HTTP against PostgreSQL.
Whatever one peer answers, the pass finishes, the other rows of its batch are settled as if it
had answered well, and its own row's error is readable."""

import httpx
import pytest
from django.core.management import CommandError, call_command

from odal.surfaces import lifecycle
from outbox import consumers
from outbox.events import emit
from outbox.models import Delivery, Event
from outbox.sweep import sweep_once
from registry.drain import drain_once
from registry.models import Registration
from tests.factories import PassportFactory, WebhookConsumerFactory, backed_off_registration
from tests.webhook_server import Answer, WebhookServer

pytestmark = pytest.mark.django_db

TEN_MB = 10_000_000


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0


def assert_readable(text: str, *parts: str) -> None:
    """An error a person can read: printable (no NUL, no control characters), bounded, and
    naming what happened."""
    assert text and text.isprintable() and len(text) <= 600, repr(text)
    for part in parts:
        assert part in text


# -- webhooks ---------------------------------------------------------------------------------


def test_a_webhook_500_with_a_nul_byte_in_its_body_fails_only_its_own_delivery():
    """The issue's first observation: this answer stopped the sweep with DataError in its flush."""
    with WebhookServer([Answer(500, b"upstream\x00exploded")]) as hostile, WebhookServer() as healthy:
        WebhookConsumerFactory(name="hostile", url=hostile.url)
        WebhookConsumerFactory(name="healthy", url=healthy.url)
        emit("passport.published", {})
        report = sweep_once()
    assert (report.delivered, report.failed) == (1, 1)
    assert Delivery.objects.get(consumer__name="healthy").status == "delivered"
    bad = Delivery.objects.get(consumer__name="hostile")
    assert bad.status == "pending" and bad.last_error == "HTTP 500: upstream\ufffdexploded"
    assert list(bad.attempt_log.values_list("error", flat=True)) == [bad.last_error]


def test_a_webhook_answer_is_made_storable_where_it_is_read():
    """Storable where call_webhook writes the error, not only where a model stores it."""
    with (
        WebhookServer([Answer(500, b"upstream\x00exploded \xff")]) as server,
        consumers.webhook_client() as client,
    ):
        consumer = WebhookConsumerFactory(url=server.url)
        event, _ = emit("passport.published", {})
        outcome = consumers.call(consumer, Delivery.objects.get().pk, event, client)
    assert outcome.error == "HTTP 500: upstream\ufffdexploded \ufffd"


JSON = [("content-type", "application/json")]
WEBHOOK_ANSWERS = {
    # name: (answer, delivered?, http status logged, what the error says)
    "nul": (Answer(500, b"upstream\x00exploded"), False, 500, "HTTP 500: upstream\ufffdexploded"),
    "invalid_utf8": (Answer(500, b"bad \xff\xfe bytes"), False, 500, "HTTP 500: bad \ufffd\ufffd bytes"),
    # a megabyte every 0.2 s: read to the end, it would outlast the timeout
    "huge_2xx": (Answer(200, b"x" * TEN_MB, trickle=0.2, chunk=2**20), True, 200, ""),
    "huge_5xx": (Answer(500, b"y" * TEN_MB), False, 500, "HTTP 500: " + "y" * 199 + "…"),
    "trickle": (
        Answer(200, b"x" * 100, trickle=0.05), False, 200,
        "timed out after 1s while reading the body of an HTTP 200 answer",
    ),
    "redirect": (
        Answer(302, headers=[("location", "https://elsewhere.example/hooks")]), False, 302,
        "HTTP 302 redirect to https://elsewhere.example/hooks (not followed)",
    ),
    "reset": (
        Answer(200, b"x" * 1000, reset_after=100), False, 200,
        ("connection error: ReadError: ", "reset", "while reading the body of an HTTP 200 answer"),
    ),
    "malformed_json_5xx": (Answer(500, b'{"error": "oops', JSON), False, 500, 'HTTP 500: {"error": "oops'),
    "malformed_json_2xx": (Answer(200, b'{"ok": tru', JSON), True, 200, ""),
}  # fmt: skip


@pytest.mark.parametrize(
    "answer, delivered, http_status, error", WEBHOOK_ANSWERS.values(), ids=WEBHOOK_ANSWERS
)
def test_a_hostile_webhook_answer_touches_only_its_own_deliveries(answer, delivered, http_status, error):
    with WebhookServer([answer]) as hostile, WebhookServer() as healthy:
        WebhookConsumerFactory(name="hostile", url=hostile.url, timeout_seconds=1)
        WebhookConsumerFactory(name="healthy", url=healthy.url, timeout_seconds=1)
        for n in range(3):
            emit("passport.published", {"n": n})
        report = sweep_once()

    assert report.claimed == 6 and report.write_errors == 0
    assert hostile.received[0].headers["accept-encoding"] == "identity"  # nothing to inflate
    for good in Delivery.objects.filter(consumer__name="healthy"):  # as if the other had answered well
        assert (good.status, good.attempts, good.last_error) == ("delivered", 1, "")
        assert list(good.attempt_log.values_list("outcome", "http_status", "error")) == [
            ("delivered", 204, "")
        ]
    for bad in Delivery.objects.filter(consumer__name="hostile"):
        log = list(bad.attempt_log.values_list("outcome", "http_status", "error"))
        if delivered:
            assert (bad.status, bad.last_error) == ("delivered", "")
            assert log == [("delivered", http_status, "")]
            continue
        assert bad.status == "pending"
        assert log == [("failed", http_status, bad.last_error)]
        if isinstance(error, str):
            assert bad.last_error == error
        assert_readable(bad.last_error, *error if isinstance(error, tuple) else ())


# -- the registry -----------------------------------------------------------------------------


@pytest.fixture
def registry_sim(registry_sim, settings):
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1  # a trickled answer fails after a second
    return registry_sim


HOSTILE = "https://id.example.eu/01/HOSTILE"


def published(upi: str):
    passport = PassportFactory(upi=upi)
    lifecycle.publish(passport.pk, actor="test")
    return passport


def registration(passport) -> Registration:
    return Registration.objects.get(passport=passport)


# what the hostile row's error says, whichever answer (register or check) was spoiled
REGISTRY_ANSWERS = {
    "nul": ("with an unusable ", "\\x00"),
    "invalid_utf8": ("with malformed JSON (not UTF-8): ",),
    "huge": ("with a body over 1,048,576 bytes",),
    "trickle": ("registry timed out after 1s",),
    "redirect": ("registry answered HTTP 307 redirect to https://registry.invalid/elsewhere (not followed)",),
    "reset": ("registry connection broke while reading the body of an HTTP 20", "ReadError: ", "reset"),
    "malformed_json": ("with malformed JSON: {",),
    "wrong_content_type": ("with content type text/html, not JSON",),
    "wrong_shape": ("with an unusable requestId: a JSON number",),
    "deep_json": ("with malformed JSON: [[[[",),
}
CHECK_ANSWERS = {
    **REGISTRY_ANSWERS,
    "nul": ("with an unknown status: 'registered\\x00'",),
    "wrong_shape": ("with an unknown status: a JSON number",),
}


@pytest.mark.parametrize("kind, error", REGISTRY_ANSWERS.items(), ids=REGISTRY_ANSWERS)
def test_a_hostile_register_answer_fails_only_its_own_registration(registry_sim, kind, error):
    registry_sim.faults.update(hostile_answer=kind, hostile_on="register", hostile_upi_containing="HOSTILE")
    bad = published(HOSTILE)
    others = [published(f"https://id.example.eu/01/{n}") for n in range(3)]

    report = drain_once()

    # The registry did its work; only its answer was spoiled: the outcome is unknown (the row
    # remembers it), not a failure.
    assert (report.claimed, report.submitted, report.unknown, report.write_errors) == (4, 3, 1, 0)
    for passport in others:
        reg = registration(passport)
        assert reg.status == "submitted" and reg.correlation_id.startswith("req-") and not reg.last_error
        assert list(reg.attempt_log.values_list("outcome", flat=True)) == ["submitted"]
    reg = registration(bad)
    assert reg.status == "pending" and reg.correlation_id == "" and reg.claim_token is None
    assert list(reg.attempt_log.values_list("outcome", "answer")) == [("unknown", reg.last_error)]
    assert reg.last_unknown_at is not None
    assert_readable(reg.last_error, *error)


@pytest.mark.parametrize("kind, error", CHECK_ANSWERS.items(), ids=CHECK_ANSWERS)
def test_a_hostile_check_answer_fails_only_its_own_registration(registry_sim, kind, error):
    bad = published(HOSTILE)
    others = [published(f"https://id.example.eu/01/{n}") for n in range(3)]
    assert drain_once().submitted == 4
    registry_sim.faults.update(hostile_answer=kind, hostile_on="check", hostile_upi_containing="HOSTILE")

    report = drain_once()

    # A check cut off after it was sent (trickle, reset), or answered with something that is not the
    # registry's JSON (issue 37: another content type, malformed, too deep or too big, a redirect),
    # has no answer of the registry's own: unknown. The registry's JSON with values that break the
    # protocol (nul, wrong_shape) is its answer: failed.
    unknown = kind not in ("nul", "wrong_shape")
    assert (report.claimed, report.registered, report.failed + report.unknown, report.unknown) == (
        4,
        3,
        1,
        unknown,
    )
    assert report.write_errors == 0
    for passport in others:
        reg = registration(passport)
        assert reg.status == "registered" and reg.handle.startswith("reg-") and not reg.last_error
    reg = registration(bad)
    assert reg.status == "submitted" and reg.handle == "" and reg.claim_token is None
    outcome = "unknown" if unknown else "failed"
    assert reg.attempt_log.last().outcome == outcome and reg.attempt_log.last().answer == reg.last_error
    assert_readable(reg.last_error, "registry ", *error)


@pytest.mark.parametrize("kind", REGISTRY_ANSWERS)
def test_abandon_against_a_hostile_task_list_is_a_clean_refusal(registry_sim, admin_api, kind):
    registry_sim.hold("https://other.example.eu/1", "req-1")
    registry_sim.faults.update(hostile_answer=kind, hostile_on="task_list")
    reg = backed_off_registration()
    before = Registration.objects.filter(pk=reg.pk).values().get()

    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", {"reason": "registry refuses it"})

    assert response.status_code == 502, response.content
    body = response.json()
    assert body["code"] == "registry_unreadable"
    assert_readable(body["detail"], "task list")
    assert Registration.objects.filter(pk=reg.pk).values().get() == before


def test_an_empty_task_list_of_the_wrong_shape_is_no_proof_of_absence(registry_sim, admin_api):
    """An empty items list sent as an object: iterated as it is, it would show nothing held."""
    registry_sim.faults.update(hostile_answer="wrong_shape", hostile_on="task_list")
    reg = backed_off_registration()
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", {"reason": "registry refuses it"})
    assert response.status_code == 502, response.content
    assert_readable(response.json()["detail"], "items is a JSON object")
    assert registration(reg.passport).status == "pending"


def test_a_rejection_whose_reasons_hold_nul_is_stored_readably(registry_sim):
    registry_sim.faults.update(
        hostile_answer="nul",
        hostile_on="register",
        hostile_upi_containing="HOSTILE",
        reject_upi_containing="HOSTILE",
    )
    bad, good = published(HOSTILE), published("https://id.example.eu/01/1")
    report = drain_once()
    assert (report.submitted, report.rejected, report.write_errors) == (1, 1, 0)
    assert registration(good).status == "submitted"
    reg = registration(bad)
    assert reg.status == "rejected"
    assert reg.last_error == f"VALIDATION_FAILED\ufffd: upi {HOSTILE} fails validation\ufffd"
    assert Event.objects.get(type="passport.registration_rejected").payload["errors"] == reg.last_error


def test_a_registration_recovers_once_the_registry_answers_well(registry_sim):
    """hostile_count: only the next N answers are spoiled. The registry kept the request whose
    answer was lost, so the retry meets DUPLICATE_UPI and adopts it."""
    registry_sim.faults.update(hostile_answer="malformed_json", hostile_count=1)
    passport = published(HOSTILE)
    assert drain_once().unknown == 1
    assert registry_sim.faults["hostile_answer"] == ""
    assert drain_once().submitted == 1
    reg = registration(passport)
    assert reg.status == "submitted" and reg.correlation_id.startswith("req-")
    assert list(reg.attempt_log.values_list("outcome", flat=True)) == ["unknown", "duplicate"]


def test_the_simulator_refuses_an_unknown_hostile_answer(registry_sim, settings):
    answer = httpx.post(f"{settings.ODAL_REGISTRY_URL}/_faults", json={"hostile_answer": "gremlins"})
    assert answer.status_code == 422 and "hostile_answer is one of nul" in answer.text
    assert registry_sim.faults["hostile_answer"] == ""
    with pytest.raises(CommandError, match="hostile_answer is one of nul"):
        call_command("registry", "simulate", "--fault", "hostile_answer=gremlins")
