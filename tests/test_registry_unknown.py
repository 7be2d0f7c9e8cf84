"""Outcomes the node does not know (issue 22): a register whose answer never came may still land.

The adapter tells an attempt whose request may have reached the registry (a timeout or a broken
connection after sending, a 502 or 504, an answer that is not the protocol's) from one the
registry refused or never saw; the row remembers when its last unknown attempt ended; abandon
takes the task list's silence for proof only ODAL_REGISTRY_SETTLE_SECONDS after it; suspend never
drops what the registry may hold; the drain reads the passport's status when it sends.
Everything here runs over real HTTP: the registry simulator, or a small server of this module
for the answers the simulator does not give."""

import io
import json
import threading
import time
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry, Passport
from odal.surfaces import lifecycle
from outbox.models import Event
from registry import adapters, service
from registry.drain import Attempt, DrainReport, drain_once, run_register
from registry.models import Registration
from tests.factories import PassportFactory, RegistrationFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def published(**fields) -> Passport:
    passport = PassportFactory(**fields)
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.get(passport=passport)


def row(reg) -> dict:
    return Registration.objects.filter(pk=reg.pk).values().get()


def back_off(passport, minutes=10):
    """The row waits for its next attempt (abandon considers only such a row)."""
    Registration.objects.filter(passport=passport).update(
        next_attempt_at=timezone.now() + timedelta(minutes=minutes)
    )


# -- a registry that answers as it is told -------------------------------------------------------------


class Scripted:
    """A local HTTP server answering POST /dpp-registration-requests as `answer` says: (status,
    content type, body), or "hang" (read the request, answer nothing for `hang` seconds), or
    "drop" (read the request, close the connection)."""

    def __init__(self):
        self.answer = (202, "application/json", b'{"requestId": "req-1", "status": "checking"}')
        self.hang = 3.0
        self.received = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.received += 1
                if outer.answer == "hang":
                    time.sleep(outer.hang)
                    return
                if outer.answer == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, content_type, body = outer.answer
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    server = Scripted()
    yield server
    server.close()


def register_with(url: str):
    reg = RegistrationFactory()
    adapter = adapters.HttpRegistry(base_url=url, token="t", timeout=1)
    try:
        return adapter.register(reg)
    finally:
        adapter.close()


@pytest.mark.parametrize(
    "answer, unknown",
    [
        ("hang", True),  # timed out after sending
        ("drop", True),  # connection broken after sending
        ((502, "text/html", b"<h1>Bad Gateway</h1>"), True),
        ((504, "text/html", b"<h1>Gateway Timeout</h1>"), True),
        ((202, "text/html", b"<h1>accepted</h1>"), True),  # not the registry's JSON
        ((202, "application/json", b'{"requestId": "req-1"'), True),  # JSON cut short
        ((409, "text/html", b"conflict"), True),
        ((503, "application/json", b'{"code": "UNAVAILABLE"}'), False),  # the registry's own
        ((500, "application/json", b'{"code": "BROKEN"}'), False),
        ((401, "text/html", b"who are you"), True),  # not the registry's own JSON error (issue 37)
        ((401, "application/json", b'{"code": "UNAUTHORIZED"}'), False),  # the registry refused it
        ((307, "text/html", b""), True),  # not the registry's answer either
        ((409, "application/json", b'{"code": "QUOTA"}'), False),
    ],
)
def test_the_adapter_tells_an_unknown_outcome_from_a_failure(scripted, answer, unknown):
    scripted.answer = answer
    with pytest.raises(adapters.Retryable) as raised:
        register_with(scripted.url)
    assert isinstance(raised.value, adapters.OutcomeUnknown) is unknown, str(raised.value)
    assert scripted.received == 1


def test_a_connection_that_never_opened_is_a_failure_not_an_unknown():
    with pytest.raises(adapters.Retryable) as raised:
        register_with("http://127.0.0.1:9")
    assert not isinstance(raised.value, adapters.OutcomeUnknown)
    assert str(raised.value).startswith("registry unreachable")


# -- the drain records it -------------------------------------------------------------------------------


def test_an_unknown_register_is_logged_as_unknown_and_remembered_on_the_row(registry_sim, settings):
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    registry_sim.faults["latency"] = 1.5
    passport = published()

    before = timezone.now()
    report = drain_once()

    reg = reg_of(passport)
    assert (report.failed, report.unknown) == (0, 1)
    assert (reg.status, reg.claim_token) == ("pending", None)
    assert before < reg.last_unknown_at <= timezone.now()
    [line] = reg.attempt_log.all()
    assert (line.outcome, line.late, line.finished_at) == ("unknown", False, reg.last_unknown_at)


def test_a_failure_is_not_remembered_as_unknown(registry_sim):
    registry_sim.faults["register_5xx"] = 1
    passport = published()

    assert drain_once().failed == 1

    reg = reg_of(passport)
    assert reg.last_unknown_at is None
    assert list(reg.attempt_log.values_list("outcome", flat=True)) == ["failed"]


def test_a_late_unknown_attempt_is_remembered_though_it_writes_no_outcome(registry_sim, settings):
    """A claims and stalls past its hold; B takes the row over and is answered; A's register
    then times out. A writes nothing (late), but its request may land: the row remembers it."""
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    passport = published()
    slow = Registration.objects.claim(limit=1, hold_seconds=1, select_related=("passport",))
    time.sleep(1.1)
    registry_sim.faults["register_5xx"] = 1
    assert drain_once().failed == 1  # B
    taken_over_at = reg_of(passport).last_unknown_at  # B took over A's claim: unknown as of then
    registry_sim.faults["latency"] = 1.5

    report = DrainReport()
    run_register(Attempt(slow.rows[0], slow.token, report), adapter=adapters.get_adapter())  # A, late

    reg = reg_of(passport)
    assert (report.late, report.unknown) == (1, 0)
    assert reg.last_unknown_at > taken_over_at
    late = reg.attempt_log.get(late=True)
    assert (late.outcome, late.finished_at) == ("unknown", reg.last_unknown_at)
    assert (reg.status, reg.attempts, reg.claim_token) == ("pending", 2, None)  # B's outcome stands


def test_a_claim_that_takes_over_an_unfinished_register_records_an_outcome_unknown():
    """The drain that held it died mid-request: its register may have reached the registry."""
    reg = RegistrationFactory(
        attempts=1, claim_token=uuid.uuid4(), next_attempt_at=timezone.now() - timedelta(seconds=1)
    )
    before = timezone.now()

    claim = Registration.objects.claim(limit=1)

    assert [r.pk for r in claim.rows] == [reg.pk]
    assert claim.rows[0].last_unknown_at >= before


def test_a_claim_of_a_row_no_claim_held_records_nothing():
    RegistrationFactory(attempts=1, next_attempt_at=timezone.now() - timedelta(seconds=1))

    claim = Registration.objects.claim(limit=1)

    assert claim.rows[0].last_unknown_at is None


# -- abandon waits for the settle window ------------------------------------------------------------------


def unknown_then_backed_off(registry_sim, settings) -> Passport:
    """A register that timed out (outcome unknown) and now waits for its next attempt; the
    registry does not hold it yet (a gateway still holds it: it may land later)."""
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    registry_sim.faults["latency"] = 1.5
    passport = published()
    assert drain_once().unknown == 1
    registry_sim.faults["latency"] = 0
    # (the simulator keeps the request after its latency: wait for that, then make it forget it)
    assert wait_for(lambda: any(r["upi"] == passport.upi for r in list(registry_sim.requests.values())), 5)
    with registry_sim.lock:
        registry_sim.requests.clear()
        registry_sim.by_key.clear()
    back_off(passport)
    return passport


def test_abandon_within_the_settle_window_is_409_outcome_unknown_and_writes_nothing(
    registry_sim, settings, admin_api
):
    passport = unknown_then_backed_off(registry_sim, settings)
    reg = reg_of(passport)
    before = row(reg)

    answer = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "registry refuses it"})

    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert body["code"] == "outcome_unknown"
    settles = reg.last_unknown_at + timedelta(seconds=settings.ODAL_REGISTRY_SETTLE_SECONDS)
    assert body["retryAfter"].replace("Z", "+00:00") == settles.isoformat()
    assert settles.isoformat(timespec="seconds") in body["detail"]
    assert row(reg) == before
    assert not AuditEntry.objects.filter(action="registry_abandoned").exists()
    assert not Event.objects.filter(type="passport.registration_abandoned").exists()
    assert any(c[0] == "GET" for c in registry_sim.calls)  # the lookup ran first


def test_abandon_after_the_settle_window_proves_absence_as_before(registry_sim, settings, admin_api):
    passport = unknown_then_backed_off(registry_sim, settings)
    Registration.objects.filter(passport=passport).update(
        last_unknown_at=timezone.now() - timedelta(seconds=settings.ODAL_REGISTRY_SETTLE_SECONDS + 1)
    )

    answer = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "registry refuses it"})

    assert answer.status_code == 200, answer.content
    assert reg_of(passport).status == "abandoned"


def test_abandon_within_the_window_that_finds_the_submission_names_it(registry_sim, settings, admin_api):
    """The lookup comes first: a submission found is still the 409 that names it."""
    passport = unknown_then_backed_off(registry_sim, settings)
    registry_sim.hold(passport.upi, "req-landed")

    answer = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "gone"})

    assert (answer.status_code, answer.json()["code"]) == (409, "registry_holds_submission")
    assert answer.json()["correlationId"] == "req-landed"


def test_abandon_refuses_when_an_unknown_attempt_is_noted_while_the_registry_is_asked(settings):
    """The row was settled when read; during the lookup a late attempt of an earlier claim times
    out and is noted. The write restates the window: it takes nothing, and says why."""
    reg = RegistrationFactory(attempts=2, next_attempt_at=timezone.now() + timedelta(minutes=10))
    seen = Registration.objects.select_related("passport").get(pk=reg.pk)
    Registration.objects.filter(pk=reg.pk).note_unknown_outcome(at=timezone.now())
    before = row(reg)

    with pytest.raises(Refused) as refused:
        service.finish_abandon(seen, actor="user:ops", reason="gone")

    assert refused.value.code == "outcome_unknown"
    assert row(reg) == before
    assert not AuditEntry.objects.filter(action="registry_abandoned").exists()


def test_the_cli_abandon_within_the_window_exits_1_and_says_from_when(registry_sim, settings):
    passport = unknown_then_backed_off(registry_sim, settings)
    settles = reg_of(passport).settles_at

    with pytest.raises(CommandError) as refused:
        call_command("registry", "abandon", str(passport.pk), "--reason", "gone", stdout=io.StringIO())

    assert refused.value.returncode == 1
    assert f"Try again from {settles.isoformat(timespec='seconds')}" in str(refused.value)
    assert reg_of(passport).status == "pending"


def test_the_admin_abandon_page_shows_the_window_per_row_before_confirming(
    registry_sim, settings, admin_client
):
    from django.contrib.admin import helpers

    passport = unknown_then_backed_off(registry_sim, settings)
    reg = reg_of(passport)

    page = admin_client.post(
        "/admin/registry/registration/",
        {"action": "abandon_selected", helpers.ACTION_CHECKBOX_NAME: [str(reg.pk)]},
    )

    assert page.status_code == 200
    text = page.content.decode()
    assert "outcome is unknown" in text, text[text.find("<tbody") :][:3000]
    assert reg.settles_at.isoformat(timespec="seconds") in text
    assert reg_of(passport).status == "pending"


# -- suspend never drops what the registry may hold ------------------------------------------------------


def test_suspend_after_an_unknown_register_that_landed_deactivates_what_the_registry_granted(
    registry_sim, settings
):
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 3
    passport = unknown_then_backed_off(registry_sim, settings)

    result = lifecycle.suspend(passport.pk, actor="user:ops")

    assert "deactivation queued" in result.detail
    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.handle) == ("pending", "deactivate", "")
    # Within the window the registry shows nothing: no proof yet, the drain looks again later.
    report = drain_once()
    reg = reg_of(passport)
    assert (report.deactivated, reg.status, reg.claim_token) == (0, "pending", None)
    assert reg.attempt_log.last().outcome == "unsettled"
    assert reg.next_attempt_at > reg.last_unknown_at + timedelta(seconds=3)
    # The late register lands, and the registry grants it.
    registry_sim.hold(passport.upi, "req-late")
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
    drain_once()  # found, still checking (the simulator grants it on this check)
    reg = reg_of(passport)
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
    while reg_of(passport).status == "pending":  # the window may still run: wait it out
        assert wait_for(lambda: reg_of(passport).settles_at is None, 5)
        Registration.objects.filter(pk=reg.pk).update(next_attempt_at=timezone.now())
        drain_once()
    reg = reg_of(passport)
    assert reg.status == "deactivated"
    [held] = [r for r in registry_sim.requests.values() if r["upi"] == passport.upi]
    assert held["status"] == "registered" and reg.handle == held["registrationId"]
    assert registry_sim.registrations[reg.handle]["active"] is False
    assert Event.objects.filter(type="passport.deregistered", payload__registrationId=reg.handle).exists()


def test_suspend_after_a_refused_register_ends_suspended_once_the_registry_shows_nothing(registry_sim):
    registry_sim.faults["register_5xx"] = 1  # the registry's own refusal: nothing reached it
    passport = published()
    assert drain_once().failed == 1

    lifecycle.suspend(passport.pk, actor="user:ops")
    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("pending", "deactivate")

    report = drain_once()

    reg = reg_of(passport)
    assert (reg.status, reg.claim_token) == ("suspended", None)
    assert reg.attempt_log.last().outcome == "absent"
    assert "holds no submission" in reg.note
    assert report.claimed == 1 and not [c for c in registry_sim.calls if c[0] == "POST"][1:]


def test_suspend_after_an_unknown_register_the_registry_rejected_ends_suspended(registry_sim, settings):
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 0
    passport = unknown_then_backed_off(registry_sim, settings)
    registry_sim.hold(passport.upi, "req-late")
    registry_sim.faults["checks_until_registered"] = 5
    lifecycle.suspend(passport.pk, actor="user:ops")

    drain_once()  # found: still checking
    assert reg_of(passport).correlation_id == "req-late"
    registry_sim.requests["req-late"]["status"] = "rejected"
    Registration.objects.filter(passport=passport).update(next_attempt_at=timezone.now())
    drain_once()

    reg = reg_of(passport)
    assert reg.status == "suspended"
    assert "rejected" in reg.note


def test_suspend_of_a_register_never_attempted_withdraws_it_at_once(registry_sim):
    passport = published()

    result = lifecycle.suspend(passport.pk, actor="user:ops")

    assert "never sent" in result.detail
    assert reg_of(passport).status == "suspended"
    assert drain_once().claimed == 0


def test_publishing_again_while_the_finding_is_owed_registers_afresh(registry_sim):
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    drain_once()
    lifecycle.suspend(passport.pk, actor="user:ops")

    lifecycle.publish(passport.pk, actor="user:ops")

    reg = reg_of(passport)
    # One attempt, not none: a suspend before the drain gets to it finds what the registry holds.
    assert (reg.status, reg.operation, reg.attempts) == ("pending", "register", 1)
    assert drain_once().submitted == 1


def test_a_finding_the_drain_starts_after_a_publish_again_registers_afresh(registry_sim):
    """Published again after the drain claimed the finding: it sends nothing and registers
    afresh (never `registered`: there is no registration of its own to stand on)."""
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    drain_once()
    lifecycle.suspend(passport.pk, actor="user:ops")
    claim = Registration.objects.claim(limit=1, select_related=("passport",))
    Passport.objects.filter(pk=passport.pk).update(status=Passport.Status.PUBLISHED)

    from registry.drain import run_deactivate

    run_deactivate(Attempt(claim.rows[0], claim.token, DrainReport()), adapters.get_adapter())

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.attempts, reg.handle) == ("pending", "register", 1, "")


# -- the drain reads the passport's status when it sends --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_register_waiting_for_its_turn_under_the_rate_limit_is_not_sent_after_a_suspend(
    registry_sim, settings
):
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 0.5  # the second register's turn is 2 s after the first
    settings.ODAL_REGISTRY_CONCURRENCY = 2
    first, second = published(), published()
    Registration.objects.filter(passport=first).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    reports = []

    def drain():
        from django.db import connections

        try:
            reports.append(drain_once(batch=2))
        finally:
            connections.close_all()

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        assert wait_for(lambda: len(registry_sim.requests) == 1, 5)  # the first went out
        assert reg_of(second).claim_token is not None  # the second is claimed, waiting for its turn
        lifecycle.suspend(second.pk, actor="user:ops")
    finally:
        thread.join()

    sent = [r["upi"] for r in registry_sim.requests.values()]
    assert sent == [first.upi]
    assert reg_of(second).status == "suspended"
    assert reg_of(second).attempt_log.get().outcome == "withdrawn"
    (report,) = reports
    assert (report.claimed, report.submitted) == (2, 1)


def test_the_attempt_log_shows_unknown_apart_from_failed_on_every_surface(
    registry_sim, settings, admin_api, admin_client
):
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    registry_sim.faults.update(register_5xx=1)
    passport = published()
    assert drain_once().failed == 1
    registry_sim.faults["latency"] = 1.5
    Registration.objects.filter(passport=passport).update(next_attempt_at=timezone.now())
    assert drain_once().unknown == 1
    reg = reg_of(passport)

    api = admin_api.get(f"dpp/{passport.pk}/registry").json()
    assert [line["outcome"] for line in api["attemptLog"]] == ["failed", "unknown"]
    assert api["lastUnknownAt"].startswith(reg.last_unknown_at.isoformat(timespec="milliseconds")[:23])
    assert api["settlesAt"] is not None

    out = io.StringIO()
    call_command("registry", "show", str(passport.pk), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert [line["outcome"] for line in shown["attemptLog"]] == ["failed", "unknown"]
    assert shown["lastUnknownAt"] is not None
    out = io.StringIO()
    call_command("registry", "show", str(passport.pk), stdout=out)
    assert "outcome is unknown" in out.getvalue() and "unknown: registry timed out" in out.getvalue()

    page = admin_client.get(f"/admin/registry/registration/{reg.pk}/change/").content.decode()
    assert "absence provable from" in page.lower() and "its register may still reach the registry" in page


# -- the guards of the new writes, one by one ----------------------------------------------------------


def test_an_unknown_outcome_noted_late_never_moves_the_row_s_time_back():
    now = timezone.now()
    reg = RegistrationFactory(last_unknown_at=now)

    assert Registration.objects.filter(pk=reg.pk).note_unknown_outcome(at=now - timedelta(minutes=5)) == 1

    assert row(reg)["last_unknown_at"] == now


def test_suspend_does_not_withdraw_a_register_whose_unknown_outcome_still_settles():
    """Never claimed since it was queued afresh, but an unknown attempt of its earlier life may
    still land: it is found, not dropped."""
    reg = RegistrationFactory(attempts=0, last_unknown_at=timezone.now() - timedelta(seconds=5))

    lifecycle.suspend(reg.passport_id, actor="user:ops")

    assert (row(reg)["status"], row(reg)["operation"]) == ("pending", "deactivate")


def suspended_while_claimed(attempts: int, **fields):
    """A register claimed (its `attempts`-th attempt) when its passport is suspended."""
    reg = RegistrationFactory(
        attempts=attempts,
        claim_token=uuid.uuid4(),
        next_attempt_at=timezone.now() + timedelta(minutes=5),
        **fields,
    )
    claimed = Registration.objects.select_related("passport").get(pk=reg.pk)  # as the claim read it
    result = lifecycle.suspend(reg.passport_id, actor="user:ops")
    assert "left to the drain" in result.detail
    return claimed


def test_a_claimed_first_register_whose_passport_was_suspended_is_withdrawn_unsent(registry_sim):
    reg = suspended_while_claimed(1)

    run_register(Attempt(reg, reg.claim_token, DrainReport()), adapters.get_adapter())

    assert (row(reg)["status"], row(reg)["claim_token"]) == ("suspended", None)
    assert not registry_sim.calls


def test_a_claimed_later_register_whose_passport_was_suspended_is_found_not_withdrawn(registry_sim):
    """Its earlier attempt may have reached the registry: this one sends nothing, and the row owes
    the deactivation that finds what the registry holds."""
    reg = suspended_while_claimed(2)

    run_register(Attempt(reg, reg.claim_token, DrainReport()), adapters.get_adapter())

    after = row(reg)
    assert (after["status"], after["operation"], after["claim_token"]) == ("pending", "deactivate", None)
    assert not registry_sim.calls


def test_a_first_register_is_not_withdrawn_while_an_unknown_outcome_still_settles():
    reg = RegistrationFactory(
        attempts=1, claim_token=uuid.uuid4(), next_attempt_at=timezone.now() + timedelta(minutes=5),
        last_unknown_at=timezone.now() - timedelta(seconds=5),
    )  # fmt: skip

    assert Registration.objects.filter(pk=reg.pk).mark_withdrawn(token=reg.claim_token) is False


def finding(**fields) -> Registration:
    """A deactivation that finds what the registry holds, claimed."""
    return RegistrationFactory(
        status="pending", operation="deactivate", attempts=1, claim_token=uuid.uuid4(),
        next_attempt_at=timezone.now() + timedelta(minutes=5), **fields,
    )  # fmt: skip


@pytest.mark.parametrize("write", ["mark_found_absent", "mark_found_deactivated"])
def test_a_finding_ends_the_row_only_once_settled(write):
    reg = finding(last_unknown_at=timezone.now() - timedelta(seconds=5))
    before = row(reg)
    rows = Registration.objects.filter(pk=reg.pk)
    ends = {
        "mark_found_absent": lambda: rows.mark_found_absent(
            token=reg.claim_token, now=timezone.now(), note="x"
        ),
        "mark_found_deactivated": lambda: rows.mark_found_deactivated(
            token=reg.claim_token, handle="reg-1", now=timezone.now()
        ),
    }

    assert ends[write]() is False
    assert row(reg) == before
    Registration.objects.filter(pk=reg.pk).update(last_unknown_at=timezone.now() - timedelta(hours=1))
    assert ends[write]() is True


@pytest.mark.parametrize("write", ["mark_found_absent", "mark_found_deactivated", "mark_finding_waits"])
def test_a_finding_s_writes_never_take_a_deactivation_of_a_known_handle(write):
    """A registered row's deactivation (its handle known) is settle_deactivate's, never a finding's."""
    reg = finding(handle="reg-1")
    before = row(reg)
    rows, token, now = Registration.objects.filter(pk=reg.pk), reg.claim_token, timezone.now()
    took = {
        "mark_found_absent": lambda: rows.mark_found_absent(token=token, now=now, note="x"),
        "mark_found_deactivated": lambda: rows.mark_found_deactivated(token=token, handle="reg-2", now=now),
        "mark_finding_waits": lambda: rows.mark_finding_waits(token=token, retry_at=now),
    }[write]()

    assert took is False
    assert row(reg) == before
