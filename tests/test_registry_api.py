"""DESIGN.md's abandon table over HTTP, row by row, and the handle route."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from odal.core.models import AuditEntry
from registry.models import Registration
from tests.factories import PassportFactory, backed_off_registration

pytestmark = pytest.mark.django_db


def abandon(client, reg_or_id, body=None):
    dpp_id = getattr(reg_or_id, "passport_id", reg_or_id)
    return client.post(
        f"dpp/{dpp_id}/registry/abandon", {"reason": "registry refuses it"} if body is None else body
    )


def snapshot(reg):
    row = Registration.objects.filter(pk=reg.pk).values().get()
    return row, AuditEntry.objects.count()


def registry_asked(sim) -> bool:
    return any(path == "/dpp-registration-requests" and method == "GET" for method, path in sim.calls)


def test_abandon_when_the_registry_provably_holds_nothing(admin_api, registry_sim):
    reg = backed_off_registration()
    response = abandon(admin_api, reg)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body == {
        "dppId": str(reg.passport_id),
        "status": "abandoned",
        "alreadyAbandoned": False,
        "attempts": 2,
        "passportStatus": "published",
        "detail": body["detail"],
    }
    assert "stays published" in body["detail"]
    reg.refresh_from_db()
    assert reg.status == "abandoned"
    assert reg.note == "abandoned by token:test-admin: registry refuses it"
    assert reg.passport.status == "published"
    entry = AuditEntry.objects.get(action="registry_abandoned")
    assert (entry.actor, entry.reason) == ("token:test-admin", "registry refuses it")
    assert entry.details["attempts"] == 2 and entry.details["lastError"] == "registry answered HTTP 503"
    assert registry_asked(registry_sim)


def test_no_passport_and_no_registration_are_404_without_asking(admin_api, registry_sim):
    assert abandon(admin_api, uuid.uuid4()).status_code == 404
    draft = PassportFactory()
    response = abandon(admin_api, draft.pk)
    assert response.status_code == 404 and response.json()["code"] == "no_registration"
    assert registry_sim.calls == []


def test_already_abandoned_is_200_and_asks_and_writes_nothing(admin_api, registry_sim):
    reg = backed_off_registration(status="abandoned", note="abandoned by user:a: first time")
    before = snapshot(reg)
    response = abandon(admin_api, reg, {"reason": ""})  # even a blank retry succeeds: it asks nothing
    assert response.status_code == 200
    assert response.json()["alreadyAbandoned"] is True
    assert snapshot(reg) == before
    assert registry_sim.calls == []


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"status": "submitted"}, "not_pending"),
        ({"status": "registered"}, "not_pending"),
        ({"status": "rejected"}, "not_pending"),
        ({"operation": "deactivate"}, "owes_deactivation"),
        ({"attempts": 0}, "never_attempted"),
        ({"next_attempt_at": "past"}, "due_now"),
        ({"claim_token": "live"}, "attempt_in_flight"),
        ({"claim_token": "live", "next_attempt_at": "past"}, "due_now"),  # its hold ran out: due again
    ],
)
def test_states_abandon_does_not_end_are_409_without_asking(admin_api, registry_sim, fields, code):
    fields = dict(fields)
    if fields.get("next_attempt_at") == "past":
        fields["next_attempt_at"] = timezone.now() - timedelta(seconds=1)
    if fields.get("claim_token") == "live":
        fields["claim_token"] = uuid.uuid4()
    reg = backed_off_registration(**fields)
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 409
    assert response.json()["code"] == code
    assert snapshot(reg) == before
    assert registry_sim.calls == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": ""},
        {"reason": "   "},
        {"reason": "x" * 501},
        {"reason": "a\nb"},
        {"reason": "esc\x1b[31m"},
    ],
    ids=["missing", "empty", "blank", "too-long", "newline", "control"],
)
def test_bad_reason_is_422_without_asking(admin_api, registry_sim, body):
    reg = backed_off_registration()
    before = snapshot(reg)
    response = abandon(admin_api, reg, body)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_reason"
    assert snapshot(reg) == before
    assert registry_sim.calls == []


def test_no_registry_queues_is_501(admin_api, settings):
    settings.ODAL_REGISTRY_ADAPTER = "none"
    reg = backed_off_registration()
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 501 and response.json()["code"] == "no_registry"
    assert snapshot(reg) == before


def test_unreadable_registry_is_502(admin_api, registry_sim):
    registry_sim.faults.update(task_list_5xx=True, page_size=1)
    for i in range(2):
        registry_sim.hold(f"https://other.example.eu/{i}", f"req-{i}", status="registered")
    reg = backed_off_registration()
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 502
    assert response.json()["code"] == "registry_unreadable" and "retry" in response.json()["detail"]
    assert snapshot(reg) == before


def test_unreachable_registry_is_502(admin_api, registry_sim, settings):
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"
    reg = backed_off_registration()
    assert abandon(admin_api, reg).status_code == 502


def test_found_is_409_naming_the_correlation_id(admin_api, registry_sim):
    reg = backed_off_registration()
    registry_sim.hold(reg.passport.upi, "req-lost-reply")
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "registry_holds_submission" and body["correlationId"] == "req-lost-reply"
    assert "req-lost-reply" in body["detail"]
    assert snapshot(reg) == before


def test_ambiguous_is_409_naming_the_candidates(admin_api, registry_sim):
    reg = backed_off_registration()
    registry_sim.hold(reg.passport.upi, "req-a")
    registry_sim.hold(reg.passport.upi, "req-b", status="registered")
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 409
    assert response.json()["candidates"] == ["req-a", "req-b"]
    assert snapshot(reg) == before


def test_a_rejected_request_does_not_count_as_held(admin_api, registry_sim):
    reg = backed_off_registration()
    registry_sim.hold(reg.passport.upi, "req-old", status="rejected")
    assert abandon(admin_api, reg).status_code == 200


@pytest.mark.parametrize(
    "faults, code",
    [({"partial_task_list": True}, "absence_not_proven"), ({"unsearchable": True}, "registry_unsearchable")],
)
def test_absence_not_proven_is_422(admin_api, registry_sim, faults, code):
    registry_sim.faults.update(faults)
    reg = backed_off_registration()
    before = snapshot(reg)
    response = abandon(admin_api, reg)
    assert response.status_code == 422 and response.json()["code"] == code
    assert snapshot(reg) == before


def test_abandon_needs_admin_scope(api_as, registry_sim):
    reg = backed_off_registration()
    assert abandon(api_as("write"), reg).status_code == 403
    assert abandon(api_as(None), reg).status_code == 401
    assert Registration.objects.get(pk=reg.pk).status == "pending"


def test_abandon_then_retry_after_a_lost_response_succeeds(admin_api, registry_sim):
    reg = backed_off_registration()
    assert abandon(admin_api, reg).status_code == 200
    again = abandon(admin_api, reg)
    assert again.status_code == 200 and again.json()["alreadyAbandoned"] is True
    assert AuditEntry.objects.filter(action="registry_abandoned").count() == 1


# -- record a handle -------------------------------------------------------------------------------


def test_record_handle_registers_a_submitted_row(admin_api):
    reg = backed_off_registration(status="submitted", correlation_id="req-9")
    response = admin_api.post(
        f"dpp/{reg.passport_id}/registry/handle", {"handle": "reg-77", "reason": "read it off the portal"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "registered" and response.json()["handle"] == "reg-77"
    entry = AuditEntry.objects.get(action="registry_handle_recorded")
    assert entry.reason == "read it off the portal" and entry.details["handle"] == "reg-77"


def test_record_handle_on_an_abandoned_row_is_409_saying_so(admin_api):
    reg = backed_off_registration(status="abandoned")
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/handle", {"handle": "reg-1", "reason": "x"})
    assert response.status_code == 409
    assert response.json()["code"] == "registration_abandoned" and "abandoned" in response.json()["detail"]
    assert Registration.objects.get(pk=reg.pk).status == "abandoned"
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "status, body, code",
    [
        ("pending", {"handle": "reg-1", "reason": "x"}, "not_submitted"),
        ("registered", {"handle": "reg-1", "reason": "x"}, "not_submitted"),
        ("submitted", {"handle": "", "reason": "x"}, "invalid_handle"),
        ("submitted", {"handle": "has space", "reason": "x"}, "invalid_handle"),
        ("submitted", {"handle": "reg-1", "reason": " "}, "invalid_reason"),
    ],
)
def test_record_handle_refusals(admin_api, status, body, code):
    reg = backed_off_registration(status=status)
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/handle", body)
    assert response.json()["code"] == code
    assert response.status_code in (409, 422)
    assert Registration.objects.get(pk=reg.pk).status == status


@pytest.mark.django_db
@pytest.mark.parametrize("handle", ["H\udcff", "reg-\ud800"])
def test_a_handle_postgresql_cannot_store_is_refused_and_nothing_written(handle):
    # A byte not UTF-8 on a command line (`odal registry handle <id> $'H\xff'`) comes as a lone
    # surrogate; the API's boundary refuses one before it gets here, the command did not.
    from odal.core.errors import Refused
    from registry import service

    reg = backed_off_registration(status="submitted")
    with pytest.raises(Refused) as refused:
        service.record_handle(reg.passport_id, handle=handle, actor="cli", reason="typed by hand")
    assert refused.value.code == "invalid_handle"
    assert Registration.objects.get(pk=reg.pk).status == "submitted"
    assert not AuditEntry.objects.exists()


def test_record_handle_needs_admin_scope(api_as):
    reg = backed_off_registration(status="submitted")
    assert (
        api_as("write")
        .post(f"dpp/{reg.passport_id}/registry/handle", {"handle": "h", "reason": "x"})
        .status_code
        == 403
    )


# -- reading ---------------------------------------------------------------------------------------


def test_registration_and_counts(api_as, registry_sim):
    reg = backed_off_registration(correlation_id="req-5")
    backed_off_registration(status="abandoned")
    client = api_as("read")
    body = client.get(f"dpp/{reg.passport_id}/registry").json()
    assert body["status"] == "pending" and body["attempts"] == 2 and body["correlationId"] == "req-5"
    assert client.get(f"dpp/{reg.passport_id}").json()["registration"]["status"] == "pending"
    counts = client.get("registry").json()
    assert counts == {"pending": 1, "submitted": 0, "registered": 0, "rejected": 0, "suspended": 0,
                      "deactivated": 0, "abandoned": 1, "stalled": 0}  # fmt: skip


@pytest.mark.parametrize("status", Registration.Status.values)
def test_a_registration_shows_when_it_is_due_only_while_the_drain_owes_it_work(api_as, status):
    reg = backed_off_registration(status=status)
    client = api_as("read")
    owed = status in ("pending", "submitted")
    due = reg.next_attempt_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for shown in (
        client.get(f"dpp/{reg.passport_id}/registry").json(),
        client.get(f"dpp/{reg.passport_id}").json()["registration"],
    ):
        assert shown["nextAttemptAt"] == (due if owed else None)


def test_a_registration_not_yet_known_to_the_registry_shows_null_ids(api_as):
    reg = backed_off_registration()  # correlation_id and handle "": nothing the registry gave yet
    client = api_as("read")
    summary = client.get(f"dpp/{reg.passport_id}").json()["registration"]
    whole = client.get(f"dpp/{reg.passport_id}/registry").json()
    assert (
        (summary["correlationId"], summary["handle"])
        == (whole["correlationId"], whole["handle"])
        == (None, None)
    )
    assert summary == {key: value for key, value in whole.items() if key != "attemptLog"}


def test_metrics_show_registry_gauges(client):
    backed_off_registration(status="abandoned")
    backed_off_registration(attempts=9)
    text = client.get("/metrics").content.decode()
    assert "registry_outbox_abandoned 1.0" in text
    assert "registry_outbox_pending 1.0" in text
    assert "registry_outbox_stalled 1.0" in text
