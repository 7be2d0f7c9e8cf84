"""A registry's answers are checked before they are believed (issue 17, item 3, and item 2's
lookup): ids within the columns (an oversized one is a protocol error: a failed attempt with a
readable error and a metric), a task list that does not end (a repeated cursor, the page limit,
the lookup's deadline) is unreadable (502, exit 3), never an answer, and the lookup finds a
submission listed under any spelling of the passport's UPI. Against the simulator over real
HTTP, on PostgreSQL."""

import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from odal.surfaces import lifecycle
from registry import adapters, service
from registry.drain import drain_once
from registry.models import Registration
from tests.factories import PassportFactory, UserFactory, backed_off_registration

pytestmark = pytest.mark.django_db

UPI = "https://id.example.eu/01/09506000134352/21/ANSWERS-1"
REASON = {"reason": "the registry keeps refusing it"}


def published(upi: str = UPI) -> Registration:
    passport = PassportFactory(upi=upi)
    lifecycle.publish(passport.pk, actor="test")
    return Registration.objects.get(passport=passport)


def row(reg) -> dict:
    return Registration.objects.filter(pk=reg.pk).values().get()


def metric(name: str) -> float:
    for line in Client().get("/metrics").content.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def task_list_reads(sim) -> int:
    return sum(1 for call in sim.calls if call == ("GET", "/dpp-registration-requests"))


def abandon_cli(reg) -> CommandError:
    with pytest.raises(CommandError) as refused:
        call_command(
            "registry", "abandon", str(reg.passport_id), "--reason", "gone", stdout=io.StringIO(),
            stderr=io.StringIO(),
        )  # fmt: skip
    return refused.value


# -- ids within the columns ---------------------------------------------------------------------


def test_the_columns_of_a_registrys_ids_and_record_handle_take_500_characters():
    for name in ("correlation_id", "handle"):
        assert Registration._meta.get_field(name).max_length == adapters.MAX_ID == 500
    assert service.MAX_HANDLE_LENGTH == adapters.MAX_ID


def test_ids_of_300_characters_are_kept_and_the_registration_goes_through(registry_sim):
    """The issue: a 300-character requestId failed the write and the drain re-POSTed for ever."""
    registry_sim.faults["request_id_length"] = 300
    reg = published()

    first = drain_once()
    assert (first.submitted, first.failed, first.write_errors) == (1, 0, 0)
    assert len(row(reg)["correlation_id"]) == 300
    second = drain_once()
    assert (second.registered, second.failed, second.write_errors) == (1, 0, 0)
    done = row(reg)
    assert done["status"] == "registered" and len(done["handle"]) == 300 and done["last_error"] == ""
    assert [c for c in registry_sim.calls if c[0] == "POST"] == [("POST", "/dpp-registration-requests")]


def test_a_request_id_over_500_characters_is_a_protocol_error_and_the_row_stays_fixable(
    registry_sim, admin_api
):
    registry_sim.faults["request_id_length"] = 612
    reg = published()

    report = drain_once()

    # The registry took the request (202) but its id cannot be kept: not the protocol's answer,
    # so the outcome is unknown (the registry may hold it), not a plain failure.
    assert (report.submitted, report.unknown, report.write_errors) == (0, 1, 0)
    error = "protocol error: registry answered HTTP 202 to register with a requestId of 612 characters; at most 500 are kept"
    after = row(reg)
    assert (after["status"], after["correlation_id"], after["claim_token"]) == ("pending", "", None)
    assert after["last_error"] == error
    assert list(reg.attempt_log.values_list("outcome", "answer")) == [("unknown", error)]
    assert metric('registry_protocol_errors_total{operation="register"}') == 1.0
    assert metric('registry_protocol_errors_total{operation="check"}') == 0.0

    # The retry meets the request the registry kept (DUPLICATE_UPI), with the same id: the same
    # protocol error, counted again, and nothing written but the failed attempt.
    assert drain_once().unknown == 1
    assert row(reg)["last_error"].endswith(
        "DUPLICATE_UPI with a requestId of 612 characters; at most 500 are kept"
    )
    assert metric('registry_protocol_errors_total{operation="register"}') == 2.0
    # A person can still act on the row: suspending the passport queues a deactivation that
    # finds what the registry holds (it was attempted), not a withdrawal that drops it.
    assert admin_api.post(f"dpp/{reg.passport_id}/suspend").status_code == 200
    assert (row(reg)["status"], row(reg)["operation"]) == ("pending", "deactivate")


def test_a_registration_id_over_500_characters_is_a_protocol_error_and_a_handle_can_be_recorded(
    registry_sim, admin_api
):
    """The issue: a 300-character registrationId left the row submitted for ever, and record
    handle could not fix it (its limit was 200 too)."""
    reg = published()
    assert drain_once().submitted == 1
    registry_sim.faults["request_id_length"] = 612  # the registrationId it grants now

    report = drain_once()

    assert (report.registered, report.failed, report.write_errors) == (0, 1, 0)
    after = row(reg)
    assert (after["status"], after["handle"], after["claim_token"]) == ("submitted", "", None)
    assert after["last_error"] == (
        "protocol error: registry answered HTTP 200 to check with a registrationId of 612 characters; "
        "at most 500 are kept"
    )
    assert metric('registry_protocol_errors_total{operation="check"}') == 1.0
    handle = "reg-" + "h" * 496  # the registry's id in a form odal can keep, read off its portal
    response = admin_api.post(
        f"dpp/{reg.passport_id}/registry/handle", {"handle": handle, "reason": "portal"}
    )
    assert response.status_code == 200, response.content
    assert (row(reg)["status"], row(reg)["handle"]) == ("registered", handle)


def test_record_handle_refuses_a_handle_over_500_characters(admin_api):
    reg = backed_off_registration(status="submitted", correlation_id="req-1")
    response = admin_api.post(
        f"dpp/{reg.passport_id}/registry/handle", {"handle": "h" * 501, "reason": "portal"}
    )
    assert response.status_code == 422 and response.json()["code"] == "invalid_handle"
    assert "at most 500" in response.json()["detail"]
    assert row(reg)["status"] == "submitted"


def test_a_held_request_whose_id_is_over_500_characters_makes_the_task_list_unreadable(
    registry_sim, admin_api
):
    reg = backed_off_registration(passport__upi=UPI)
    registry_sim.hold(UPI, "req-" + "x" * 608)
    before = row(reg)
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)
    assert response.status_code == 502, response.content
    assert response.json()["code"] == "registry_unreadable"
    assert (
        "holds an item with a requestId of 612 characters; at most 500 are kept" in response.json()["detail"]
    )
    assert row(reg) == before


# -- a task list that does not end ----------------------------------------------------------------


def test_a_task_list_repeating_its_cursor_is_unreadable(registry_sim, admin_api):
    """The issue: the same nextCursor every time was read 999 times, then answered 422."""
    registry_sim.faults["task_list_repeat_cursor"] = True
    reg = backed_off_registration()
    before = row(reg)

    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)

    assert response.status_code == 502, response.content
    body = response.json()
    assert body["code"] == "registry_unreadable"
    assert "the task list repeats cursor 'again' (on task list page 2)" in body["detail"]
    assert task_list_reads(registry_sim) == 2
    assert row(reg) == before
    assert abandon_cli(reg).returncode == 3


def test_a_repeated_cursor_never_shows_a_held_request_many_times(registry_sim):
    registry_sim.faults["task_list_repeat_cursor"] = True
    registry_sim.hold(UPI, "req-held")
    adapter = adapters.get_adapter()
    try:
        with pytest.raises(adapters.RegistryUnreadable, match="repeats cursor"):
            adapter.find_submission(UPI)
    finally:
        adapter.close()


def test_the_lookup_ends_at_its_deadline_however_many_pages_are_left(registry_sim, admin_api, settings):
    settings.ODAL_REGISTRY_LOOKUP_SECONDS = 1
    registry_sim.faults.update(page_size=1, task_list_latency=0.2)
    for n in range(20):  # 20 pages of 0.2 s: 4 s to read them all
        registry_sim.hold(f"https://other.example.eu/{n}", f"req-{n}", status="registered")
    reg = backed_off_registration()
    before = row(reg)

    started = time.monotonic()
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)

    assert time.monotonic() - started < 2.0
    assert response.status_code == 502, response.content
    assert response.json()["code"] == "registry_unreadable"
    assert (
        "the task list was not read to its end within 1s (ODAL_REGISTRY_LOOKUP_SECONDS"
        in response.json()["detail"]
    )
    assert row(reg) == before


def test_one_slow_page_is_cut_short_at_the_lookups_deadline(registry_sim, settings):
    """Each request's own timeout (2 s here) is not allowed past the lookup's deadline (1 s)."""
    settings.ODAL_REGISTRY_LOOKUP_SECONDS = 1
    registry_sim.faults["task_list_latency"] = 1.5
    reg = backed_off_registration()
    started = time.monotonic()
    refused = abandon_cli(reg)
    assert time.monotonic() - started < 1.4
    assert refused.returncode == 3 and "within 1s (ODAL_REGISTRY_LOOKUP_SECONDS; 0 page(s) read)" in str(
        refused
    )
    assert row(reg)["status"] == "pending"


def test_more_pages_than_the_limit_is_unreadable_not_absence(registry_sim, admin_api, monkeypatch):
    monkeypatch.setattr(adapters, "MAX_TASK_PAGES", 3)
    registry_sim.faults["page_size"] = 1
    for n in range(5):
        registry_sim.hold(f"https://other.example.eu/{n}", f"req-{n}", status="registered")
    reg = backed_off_registration()
    before = row(reg)
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)
    assert response.status_code == 502, response.content
    assert response.json()["code"] == "registry_unreadable"
    assert "the task list has more than 3 pages; it was not read to its end" in response.json()["detail"]
    assert task_list_reads(registry_sim) == 3
    assert row(reg) == before


def test_json_nested_deeper_than_the_parser_goes_is_malformed_on_every_surface(
    registry_sim, admin_api, client
):
    """The issue: a task list nested 200,000 levels deep was a 500 (API), a traceback (CLI) and a
    500 page (admin). The simulator's deep_json nests 100,000 levels."""
    registry_sim.faults.update(hostile_answer="deep_json", hostile_on="task_list")
    reg = backed_off_registration()
    before = row(reg)

    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)
    assert response.status_code == 502 and response.json()["code"] == "registry_unreadable"
    assert "with malformed JSON: [[[[" in response.json()["detail"]

    refused = abandon_cli(reg)
    assert refused.returncode == 3 and "malformed JSON" in str(refused)

    user = UserFactory(is_superuser=True)
    client.force_login(user)
    page = client.post(
        "/admin/registry/registration/", {"action": "abandon_selected", "_selected_action": [str(reg.pk)]}
    )
    assert page.status_code == 200
    assert b"cannot be abandoned: The registry&#x27;s task list could not be read" in page.content
    assert row(reg) == before


# -- another spelling of the same UPI ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "HTTPS://ID.EXAMPLE.EU:443/01/09506000134352/21/ANSWERS-1",
        "https://id.example.eu:443/01/09506000134352/21/ANSWERS-1",
        "https://id.example.eu/%30%31/09506000134352/21/ANSWERS%2d1",
    ],
    ids=["upper-and-port", "default-port", "escaped"],
)
def test_abandon_is_refused_when_the_registry_lists_the_submission_under_another_spelling(
    registry_sim, admin_api, spelling
):
    """The issue: abandon compared UPIs as exact strings, read another spelling as 'holds
    nothing', and abandoned a row whose submission the registry held."""
    reg = backed_off_registration(passport__upi=UPI)
    registry_sim.hold(spelling, "req-other-spelling")
    before = row(reg)

    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)

    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "registry_holds_submission" and body["correlationId"] == "req-other-spelling"
    assert row(reg) == before


def test_a_lost_reply_listed_under_another_spelling_is_found(registry_sim, admin_api, settings):
    """The drain's request got through, its reply was lost, and the registry's task list spells
    the UPI its own way: abandon must still see the request."""
    settings.ODAL_BACKOFF_BASE_SECONDS = 600  # the failed row waits: abandon may consider it
    registry_sim.faults.update(lost_reply=1, upi_spelling="upper")
    reg = published()
    assert drain_once().failed == 1
    held = next(iter(registry_sim.requests.values()))

    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)

    assert response.status_code == 409, response.content
    assert response.json()["correlationId"] == held["requestId"]
    assert row(reg)["status"] == "pending"


def test_a_spelling_of_another_upi_is_not_a_match(registry_sim, admin_api):
    """The path keeps its case: /answers-1 is another product."""
    reg = backed_off_registration(passport__upi=UPI)
    registry_sim.hold(UPI.replace("ANSWERS", "answers"), "req-another-product")
    response = admin_api.post(f"dpp/{reg.passport_id}/registry/abandon", REASON)
    assert response.status_code == 200, response.content


def test_the_simulator_refuses_an_unknown_upi_spelling(registry_sim):
    with pytest.raises(CommandError, match="upi_spelling is one of upper, escaped"):
        call_command("registry", "simulate", "--fault", "upi_spelling=lower")
