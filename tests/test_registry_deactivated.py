"""Decided in issue 37, item 9: deactivated registrations, and findings a person ends.

(a) A deactivated registration is not held: publishing again after a deactivation registers
afresh; a DUPLICATE_UPI naming a request whose registration the registry has deactivated is not
adopted (the row stays pending, says so, and counts as stalled); the simulator no longer answers
DUPLICATE_UPI for one. (b) A deactivation whose finding cannot search the registry can be ended
by a person: "Record handle…" (API, CLI, admin) takes it, audited, and the drain deactivates by
that handle. (c) A finding whose remembered request the registry does not know (404) goes on to
the task list, as one with none. Against the real drain, the http adapter and the simulator."""

import io
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin import helpers
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from outbox.models import Event
from registry import service
from registry.drain import drain_once, drain_until_idle
from registry.models import Registration
from tests.factories import PassportFactory

pytestmark = pytest.mark.django_db


def published():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.select_related("passport").get(passport=passport)


def row(reg) -> dict:
    return Registration.objects.filter(pk=reg.pk).values().get()


def registered_then_deactivated(sim) -> tuple:
    """Published, registered, suspended and deactivated: (passport, its request, its handle)."""
    passport = published()
    assert drain_once().submitted == 1
    assert drain_once().registered == 1
    reg = reg_of(passport)
    lifecycle.suspend(passport.pk, actor="test")
    assert drain_once().deactivated == 1
    assert reg_of(passport).status == "deactivated"
    assert not sim.registrations[reg.handle]["active"]
    return passport, reg.correlation_id, reg.handle


# -- (a) a deactivated registration is not held -----------------------------------------------------------


def test_publishing_again_after_a_deactivation_registers_afresh(registry_sim):
    """The issue: the register met DUPLICATE_UPI naming the old request, odal adopted it, and the
    row ended `registered` with the handle the registry had deactivated."""
    sim = registry_sim
    passport, old_request, old_handle = registered_then_deactivated(sim)

    lifecycle.publish(passport.pk, actor="test")
    drain_until_idle(max_seconds=20, linger_seconds=0)

    reg = reg_of(passport)
    assert reg.status == "registered", (reg.status, reg.last_error)
    assert reg.correlation_id != old_request and reg.handle != old_handle
    assert sim.registrations[reg.handle]["active"]
    assert [line.outcome for line in reg.attempt_log.filter(operation="register")] == [
        "submitted",
        "submitted",
    ]


def test_the_simulator_answers_duplicate_upi_only_for_a_registration_it_still_holds(registry_sim):
    sim = registry_sim
    body = {"upi": "https://id.example.eu/01/1/21/D", "operatorId": "OP-1"}
    status, first = sim.register(body, "key-1")
    assert (status, sim.check(first["requestId"])[1]["status"]) == (202, "registered")
    assert sim.register(body, "key-2") == (409, {"code": "DUPLICATE_UPI", "requestId": first["requestId"]})
    granted = sim.check(first["requestId"])[1]["registrationId"]
    assert sim.deactivate(granted)[0] == 204

    assert sim.check(first["requestId"]) == (
        200,
        {"requestId": first["requestId"], "upi": body["upi"], "status": "registered",
         "registrationId": granted, "deactivated": True},
    )  # fmt: skip
    sim.faults["honour_idempotency_key"] = True  # its key names a deactivated one: not held either
    status, fresh = sim.register(body, "key-1")
    assert status == 202 and fresh["requestId"] != first["requestId"]

    other = {**body, "upi": "https://id.example.eu/01/1/21/E"}
    status, held = sim.register(other, None)
    sim.deactivate(sim.check(held["requestId"])[1]["registrationId"])
    sim.faults["duplicate_deactivated"] = True  # a registry that still holds what it deactivated
    assert sim.register(other, None) == (409, {"code": "DUPLICATE_UPI", "requestId": held["requestId"]})


def test_a_duplicate_upi_naming_a_deactivated_registration_is_not_adopted_and_counts_as_stalled(
    registry_sim, api_as
):
    """A registry that still holds what it deactivated (duplicate_deactivated) answers the fresh
    register DUPLICATE_UPI naming the old request: adopting it would make the row `registered`
    under a handle the registry deactivated."""
    sim = registry_sim
    passport, old_request, old_handle = registered_then_deactivated(sim)
    sim.faults["duplicate_deactivated"] = True

    lifecycle.publish(passport.pk, actor="test")
    report = drain_once()

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.correlation_id, reg.handle) == ("pending", "register", "", "")
    assert (report.submitted, report.failed) == (0, 1)
    assert reg.last_error.startswith("not adopted: the registry answered DUPLICATE_UPI naming request ")
    assert old_request in reg.last_error and old_handle in reg.last_error and "deactivated" in reg.last_error
    line = reg.attempt_log.filter(operation="register").last()
    assert (line.outcome, line.answer) == ("not_adopted", reg.last_error)
    assert reg.attempts == 1  # below ODAL_REGISTRY_STALL_ATTEMPTS, and stalled all the same: for a person
    assert list(Registration.objects.stalled()) == [reg]
    assert api_as("read").get("registry").json()["stalled"] == 1
    # (the first registration's event only: nothing said the old handle stands again)
    assert Event.objects.filter(type="passport.registered", payload__registrationId=old_handle).count() == 1

    sim.faults["duplicate_deactivated"] = False  # the registry lets the UPI go: the next attempt registers
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
    drain_until_idle(max_seconds=20, linger_seconds=0)
    reg = reg_of(passport)
    assert reg.status == "registered" and reg.handle != old_handle and not Registration.objects.stalled()


# -- (b) a person ends a deactivation whose finding cannot search the registry --------------------------


PORTAL = "reg-read-off-the-portal"


def unsearchable_finding(sim, settings) -> Registration:
    """A register attempted (and refused), then the passport suspended: the deactivation finds what
    the registry holds first, and the registry's task list cannot be searched. The registry holds
    the registration PORTAL for it (a person found it in its portal)."""
    settings.ODAL_BACKOFF_BASE_SECONDS = 600
    sim.faults["register_5xx"] = 1
    passport = published()
    assert drain_once().failed == 1
    lifecycle.suspend(passport.pk, actor="test")
    sim.faults.update(unsearchable=True, unsearchable_status=501)
    Registration.objects.filter(passport=passport).update(next_attempt_at=timezone.now())
    assert drain_once().failed == 1
    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.handle, reg.claim_token) == ("pending", "deactivate", "", None)
    assert reg.last_error.startswith("the registry cannot be searched (")
    with sim.lock:
        sim.requests["req-portal"] = {
            "requestId": "req-portal", "upi": passport.upi, "status": "registered", "checks": 1,
            "registrationId": PORTAL,
        }  # fmt: skip
        sim.registrations[PORTAL] = {"requestId": "req-portal", "active": True}
    return reg


def deactivated_by_the_drain(sim, reg, settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    assert drain_once().deactivated == 1
    done = reg_of(reg.passport)
    assert (done.status, done.handle) == ("deactivated", PORTAL)
    assert not sim.registrations[PORTAL]["active"]
    assert Event.objects.filter(type="passport.deregistered", payload__registrationId=PORTAL).count() == 1
    assert ("POST", f"/registrations/{PORTAL}/deactivate") in sim.calls


def test_record_handle_ends_a_deactivation_whose_finding_cannot_search_the_registry(
    registry_sim, settings, admin_api
):
    sim = registry_sim
    reg = unsearchable_finding(sim, settings)

    response = admin_api.post(
        f"dpp/{reg.passport_id}/registry/handle",
        {"handle": PORTAL, "reason": "found it in the registry portal"},
    )

    assert response.status_code == 200, response.json()
    assert (response.json()["status"], response.json()["handle"]) == ("pending", PORTAL)
    after = row(reg)
    assert (after["operation"], after["attempts"], after["claim_token"], after["last_error"]) == (
        "deactivate", 0, None, ""
    )  # fmt: skip
    assert after["next_attempt_at"] <= timezone.now()  # due now: the drain deactivates by the handle
    assert after["note"].startswith("handle recorded by token:")
    assert after["note"].endswith(": found it in the registry portal")
    entry = AuditEntry.objects.get(action="registry_handle_recorded")
    assert (entry.reason, entry.details["handle"], entry.details["operation"]) == (
        "found it in the registry portal", PORTAL, "deactivate"
    )  # fmt: skip
    assert not Event.objects.filter(type="passport.registered").exists()
    deactivated_by_the_drain(sim, reg, settings)


def test_the_cli_records_a_handle_on_such_a_deactivation(registry_sim, settings):
    sim = registry_sim
    reg = unsearchable_finding(sim, settings)
    out = io.StringIO()

    call_command("registry", "handle", str(reg.passport_id), PORTAL, "--reason", "portal", stdout=out)

    assert f"handle {PORTAL} recorded" in out.getvalue() and "deactivates" in out.getvalue()
    assert row(reg)["handle"] == PORTAL
    deactivated_by_the_drain(sim, reg, settings)


def test_the_admin_action_records_a_handle_on_such_a_deactivation(registry_sim, settings, admin_client):
    sim = registry_sim
    reg = unsearchable_finding(sim, settings)
    selected = {"action": "record_handle_selected", helpers.ACTION_CHECKBOX_NAME: [str(reg.pk)]}

    page = admin_client.post("/admin/registry/registration/", selected)
    assert b'name="handle"' in page.content and b"cannot be searched" in page.content
    done = admin_client.post(
        "/admin/registry/registration/", {**selected, "post": "yes", "handle": PORTAL, "reason": "portal"},
        follow=True,
    )  # fmt: skip

    assert f"Recorded handle {PORTAL}".encode() in done.content and b"deactivat" in done.content
    assert row(reg)["handle"] == PORTAL
    assert AuditEntry.objects.filter(action="registry_handle_recorded").count() == 1
    deactivated_by_the_drain(sim, reg, settings)


def test_record_handle_refuses_a_deactivation_whose_finding_can_search_the_registry(registry_sim, settings):
    sim = registry_sim
    reg = unsearchable_finding(sim, settings)
    Registration.objects.filter(pk=reg.pk).update(
        last_error="the registry's task list could not be read: HTTP 503"
    )
    before = row(reg)

    with pytest.raises(Refused) as refused:
        service.record_handle(reg.passport_id, handle=PORTAL, actor="user:ops", reason="portal")

    assert (refused.value.code, refused.value.status) == ("registry_searchable", 409)
    assert row(reg) == before and not AuditEntry.objects.filter(action="registry_handle_recorded").exists()
    assert sim.registrations[PORTAL]["active"]


def test_record_handle_refuses_while_a_register_of_ours_may_still_land(registry_sim, settings):
    """A register whose outcome is unknown may still land: what the portal shows is not all the
    registry will hold (the finding waits out the same window)."""
    reg = unsearchable_finding(registry_sim, settings)
    Registration.objects.filter(pk=reg.pk).update(last_unknown_at=timezone.now())
    before = row(reg)

    with pytest.raises(Refused) as refused:
        service.record_handle(reg.passport_id, handle=PORTAL, actor="user:ops", reason="portal")

    assert refused.value.code == "outcome_unknown" and "retryAfter" in refused.value.extra
    assert row(reg) == before and not AuditEntry.objects.filter(action="registry_handle_recorded").exists()


def test_record_handle_refuses_such_a_deactivation_while_an_attempt_holds_it(registry_sim, settings):
    reg = unsearchable_finding(registry_sim, settings)
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
    assert Registration.objects.claim(limit=1).rows  # a drain holds it
    before = row(reg)

    with pytest.raises(Refused) as refused:
        service.record_handle(reg.passport_id, handle=PORTAL, actor="user:ops", reason="portal")

    assert refused.value.code == "attempt_in_flight"
    assert row(reg) == before and not AuditEntry.objects.filter(action="registry_handle_recorded").exists()


def test_the_write_takes_nothing_if_an_attempt_was_claimed_after_the_row_was_read(registry_sim, settings):
    """The person read the row; a drain claimed it before the write: the write takes nothing."""
    reg = unsearchable_finding(registry_sim, settings)
    seen = Registration.objects.get(pk=reg.pk)
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
    claim = Registration.objects.claim(limit=1)
    Registration.objects.filter(pk=reg.pk).mark_attempt_failed(
        token=claim.token, error=seen.last_error, retry_at=timezone.now() + timedelta(minutes=10)
    )  # the same finding again: only the attempts moved on
    before = row(reg)

    took = Registration.objects.filter(pk=reg.pk).record_finding_handle(
        handle=PORTAL, actor="user:ops", reason="portal", now=timezone.now(), seen=seen
    )

    assert took is False and row(reg) == before


@pytest.mark.parametrize(
    "change",
    [
        {"status": "deactivated"},
        {"operation": "register"},
        {"handle": "reg-known"},
        {"claim_token": uuid.uuid4()},
        {"last_error": "the registry is still checking req-1"},
        {"last_unknown_at": "now"},
    ],
    ids=["status", "operation", "handle", "claim", "last_error", "unsettled"],
)
def test_the_write_takes_only_an_unclaimed_settled_finding_that_cannot_search(registry_sim, settings, change):
    reg = unsearchable_finding(registry_sim, settings)
    seen = Registration.objects.get(pk=reg.pk)
    now = timezone.now()
    Registration.objects.filter(pk=reg.pk).update(**{k: now if v == "now" else v for k, v in change.items()})
    before = row(reg)

    took = Registration.objects.filter(pk=reg.pk).record_finding_handle(
        handle=PORTAL, actor="user:ops", reason="portal", now=now, seen=seen
    )

    assert took is False and row(reg) == before


def test_record_handle_still_refuses_a_registration_that_owes_nothing_to_find(registry_sim, settings):
    passport = published()
    assert drain_once().submitted == 1 and drain_once().registered == 1
    with pytest.raises(Refused) as refused:
        service.record_handle(passport.pk, handle=PORTAL, actor="user:ops", reason="portal")
    assert refused.value.code == "not_submitted"
    assert "cannot search" in refused.value.detail  # says what else it takes
    with pytest.raises(CommandError) as refused:
        call_command("registry", "handle", str(passport.pk), PORTAL, "--reason", "x", stdout=io.StringIO())
    assert refused.value.returncode == 1


# -- (c) a remembered request the registry does not know -------------------------------------------------


def finding_that_remembers(sim, settings) -> tuple:
    """A register whose reply was lost (the registry kept it, still checking), then the passport
    suspended: the finding finds it checking and remembers it (correlation_id)."""
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    sim.faults.update(lost_reply=1, checks_until_registered=1000)
    passport = published()
    assert drain_once().failed == 1
    [request] = [r for r in sim.requests.values() if r["upi"] == passport.upi]
    lifecycle.suspend(passport.pk, actor="test")
    drain_once()
    reg = reg_of(passport)
    assert (reg.operation, reg.correlation_id, reg.status) == ("deactivate", request["requestId"], "pending")
    return passport, request["requestId"]


def test_a_finding_whose_remembered_request_the_registry_does_not_know_goes_on_to_the_task_list(
    registry_sim, settings
):
    """The issue: the check of the remembered request answered 404, and the finding failed every
    pass, for ever."""
    sim = registry_sim
    passport, forgotten = finding_that_remembers(sim, settings)
    with sim.lock:
        del sim.requests[forgotten]  # the registry no longer knows it: its task list shows nothing

    report = drain_once()

    reg = reg_of(passport)
    assert (reg.status, reg.claim_token) == ("suspended", None), (reg.status, reg.last_error, report)
    line = reg.attempt_log.last()
    assert line.outcome == "absent" and forgotten in line.answer and "404" in line.answer
    assert ("GET", f"/dpp-registration-requests/{forgotten}") in sim.calls


def test_a_finding_drops_the_remembered_request_but_deactivates_what_the_task_list_shows(
    registry_sim, settings
):
    sim = registry_sim
    passport, forgotten = finding_that_remembers(sim, settings)
    with sim.lock:
        del sim.requests[forgotten]
    sim.faults["checks_until_registered"] = 1
    registry_sim.hold(passport.upi, "req-other")  # another request for the UPI: the task list shows it

    drain_until_idle(max_seconds=20, linger_seconds=0)

    reg = reg_of(passport)
    assert reg.status == "deactivated", (reg.status, reg.last_error)
    granted = sim.requests["req-other"]["registrationId"]
    assert reg.handle == granted and not sim.registrations[granted]["active"]


def test_a_remembered_request_answered_404_by_something_else_than_the_registry_is_not_dropped(
    registry_sim, settings
):
    """A 404 that is not the registry's own JSON error (a gateway's page) says nothing of the
    request: the finding's outcome is unknown, and the row goes on remembering it."""
    sim = registry_sim
    passport, forgotten = finding_that_remembers(sim, settings)
    with sim.lock:
        del sim.requests[forgotten]
    sim.faults.update(hostile_answer="wrong_content_type", hostile_on="check")

    report = drain_once()

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.correlation_id) == ("pending", "deactivate", forgotten)
    assert report.unknown == 1 and reg.attempt_log.last().outcome == "unknown"


def test_a_request_the_task_list_names_is_never_dropped_for_a_404(settings):
    """Only the request found before may be dropped: one the task list names and whose check the
    registry answers 404 is a registry contradicting itself, and the finding fails (no proof)."""
    from registry import adapters
    from registry.finding import find_held
    from tests.factories import RegistrationFactory

    class Contradicting:
        def find_submission(self, upi):
            return adapters.Found("req-listed")

        def check(self, request_id):
            raise adapters.UnknownRequest(
                f"registry answered HTTP 404 to check: the registry does not know {request_id}"
            )

    reg = RegistrationFactory(status="pending", operation="deactivate", correlation_id="req-before")

    with pytest.raises(adapters.UnknownRequest, match="req-listed"):
        find_held(Contradicting(), reg)


def test_the_registrations_page_offers_record_handle_on_such_a_deactivation_and_it_takes_it(
    registry_sim, settings, admin_client
):
    """The button on the registration's own page, as the list action: shown for a deactivation
    whose finding cannot search the registry, and its two passes end it."""
    from tests.test_buttons import button_url, buttons, change_url

    sim = registry_sim
    reg = unsearchable_finding(sim, settings)
    assert "Record handle…" in buttons(admin_client.get(change_url(reg)))

    done = admin_client.post(
        button_url(reg, "record_handle_selected"),
        {"post": "yes", "handle": PORTAL, "reason": "portal"},
        follow=True,
    )
    assert f"Recorded handle {PORTAL}".encode() in done.content
    assert row(reg)["handle"] == PORTAL
    deactivated_by_the_drain(sim, reg, settings)
