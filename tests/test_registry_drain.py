"""The drain against the registry simulator over real HTTP, and its guarded writes against
PostgreSQL: nothing it writes can touch an abandoned row."""

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from odal.core.models import Passport
from odal.surfaces import lifecycle
from outbox.models import Event
from registry import service
from registry.drain import drain_once
from registry.models import Registration, RegistrationAttempt
from tests.factories import PassportFactory, RegistrationFactory, backed_off_registration

pytestmark = pytest.mark.django_db


def published(**fields) -> Passport:
    passport = PassportFactory(**fields)
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.get(passport=passport)


def test_publish_registers_through_the_simulator(registry_sim):
    passport = published()
    assert reg_of(passport).status == "pending"

    assert drain_once().submitted == 1
    reg = reg_of(passport)
    assert reg.status == "submitted" and reg.correlation_id.startswith("req-")
    assert drain_once().registered == 1
    reg = reg_of(passport)
    assert reg.status == "registered" and reg.handle.startswith("reg-")
    assert list(reg.attempt_log.values_list("operation", "outcome", "late")) == [
        ("register", "submitted", False),
        ("check", "registered", False),
    ]
    assert Event.objects.filter(type="passport.registered", payload__registrationId=reg.handle).exists()
    register_call = [c for c in registry_sim.calls if c[0] == "POST"]
    assert register_call == [("POST", "/dpp-registration-requests")]


def test_still_checking_asks_again_later(registry_sim, settings):
    registry_sim.faults["checks_until_registered"] = 3
    passport = published()
    drain_once()
    drain_once()
    reg = reg_of(passport)
    assert reg.status == "submitted" and reg.claim_token is None
    assert reg.attempt_log.last().outcome == RegistrationAttempt.Outcome.CHECKING


def test_a_5xx_fails_the_attempt_and_backs_off(registry_sim, settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 30
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    report = drain_once()
    assert report.failed == 1
    reg = reg_of(passport)
    assert (reg.status, reg.attempts) == ("pending", 1)
    assert reg.last_error.startswith("registry answered HTTP 503")
    assert reg.next_attempt_at > timezone.now() + timedelta(seconds=10)
    assert drain_once().claimed == 0


def test_a_422_rejects(registry_sim):
    registry_sim.faults["reject_upi_containing"] = "BAD"
    passport = published(upi="https://id.example.eu/01/1/21/BAD-1")
    assert drain_once().rejected == 1
    reg = reg_of(passport)
    assert reg.status == "rejected" and "VALIDATION_FAILED" in reg.last_error
    assert Event.objects.filter(type="passport.registration_rejected").count() == 1


def test_a_lost_reply_is_healed_by_duplicate_upi_on_the_next_attempt(registry_sim):
    registry_sim.faults["lost_reply"] = 1
    passport = published()
    assert drain_once().failed == 1  # the registry kept it, but we heard 503
    [held] = registry_sim.requests
    assert drain_once().submitted == 1  # register again: 409 DUPLICATE_UPI
    reg = reg_of(passport)
    assert reg.status == "submitted" and reg.correlation_id == held
    assert "DUPLICATE_UPI" in reg.note and held in reg.note
    assert drain_once().registered == 1
    assert len(registry_sim.requests) == 1


def test_a_slow_registry_times_out(registry_sim, settings):
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    registry_sim.faults["latency"] = 1.5
    passport = published()
    report = drain_once()
    reg = reg_of(passport)
    # The request was sent: it may have reached the registry. Not a failure, an outcome unknown.
    assert (report.failed, report.unknown) == (0, 1)
    assert reg.last_error == "registry timed out after 1s; the request may have reached it"
    assert reg.last_unknown_at is not None
    assert list(reg.attempt_log.values_list("outcome", flat=True)) == ["unknown"]


def test_an_unreachable_registry_fails_the_attempt(registry_sim, settings):
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"
    passport = published()
    drain_once()
    assert reg_of(passport).last_error.startswith("registry unreachable: ConnectError")


def test_suspend_deactivates_a_registered_passport(registry_sim):
    passport = published()
    drain_once()
    drain_once()
    handle = reg_of(passport).handle
    lifecycle.suspend(passport.pk, actor="test")
    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("pending", "deactivate")
    assert drain_once().deactivated == 1
    assert reg_of(passport).status == "deactivated"
    assert registry_sim.registrations[handle]["active"] is False


def test_suspend_before_any_attempt_withdraws_and_republish_queues_afresh(registry_sim):
    passport = published()
    lifecycle.suspend(passport.pk, actor="test")
    assert reg_of(passport).status == "suspended"
    assert drain_once().claimed == 0
    lifecycle.publish(passport.pk, actor="test")
    reg = reg_of(passport)
    assert (reg.status, reg.attempts) == ("pending", 0)
    assert drain_once().submitted == 1


def test_the_drain_withdraws_a_register_whose_passport_was_suspended(registry_sim):
    reg = RegistrationFactory(passport__status="suspended")
    drain_once()
    reg.refresh_from_db()
    assert reg.status == "suspended"
    assert registry_sim.calls == []  # the registry was never asked


def test_suspended_while_checking_deactivates_once_registered(registry_sim):
    passport = published()
    drain_once()
    lifecycle.suspend(passport.pk, actor="test")
    assert reg_of(passport).status == "submitted"  # left to the drain
    drain_once()  # check: registered, and a deactivation is owed at once
    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("pending", "deactivate")
    drain_once()
    assert reg_of(passport).status == "deactivated"


def test_republish_cancels_an_unattempted_deactivation(registry_sim):
    passport = published()
    drain_once()
    drain_once()
    lifecycle.suspend(passport.pk, actor="test")
    lifecycle.publish(passport.pk, actor="test")
    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("registered", "register")


def test_none_adapter_queues_nothing(settings):
    settings.ODAL_REGISTRY_ADAPTER = "none"
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    assert not Registration.objects.exists()


# -- the guarded writes on an abandoned row --------------------------------------------------------

DRAIN_WRITES = {
    "mark_submitted": lambda rows, t: rows.mark_submitted(
        token=t, correlation_id="req-x", next_check_at=timezone.now()
    ),
    "mark_submitted_noting": lambda rows, t: rows.mark_submitted_noting(
        token=t, correlation_id="req-x", note="dup", next_check_at=timezone.now()
    ),
    "mark_registered": lambda rows, t: rows.mark_registered(token=t, handle="reg-x"),
    "mark_rejected": lambda rows, t: rows.mark_rejected(token=t, errors="no"),
    "mark_deactivated": lambda rows, t: rows.mark_deactivated(token=t),
    "mark_withdrawn": lambda rows, t: rows.mark_withdrawn(token=t),
    "mark_checked": lambda rows, t: rows.mark_checked(token=t, next_check_at=timezone.now()),
    "mark_attempt_failed": lambda rows, t: rows.mark_attempt_failed(
        token=t, error="x", retry_at=timezone.now()
    ),
    "mark_rate_limited": lambda rows, t: rows.mark_rate_limited(
        token=t, error="registry answered HTTP 429", retry_at=timezone.now()
    ),
}


@pytest.mark.parametrize("operation", ["register", "deactivate"])
@pytest.mark.parametrize("write", list(DRAIN_WRITES))
def test_every_drain_write_bounces_off_an_abandoned_row(write, operation):
    token = uuid.uuid4()
    reg = RegistrationFactory(
        status="abandoned", operation=operation, claim_token=token, attempts=3, note="abandoned by x: y"
    )
    assert DRAIN_WRITES[write](Registration.objects.filter(pk=reg.pk), token) is False
    reg.refresh_from_db()
    assert (reg.status, reg.note, reg.correlation_id, reg.handle) == (
        "abandoned",
        "abandoned by x: y",
        "",
        "",
    )


@pytest.mark.parametrize("write", list(DRAIN_WRITES))
def test_no_drain_write_takes_a_row_held_by_another_claim(write):
    reg = RegistrationFactory(status="submitted" if write in ("mark_registered", "mark_checked") else "pending",
                              operation="deactivate" if write == "mark_deactivated" else "register",
                              claim_token=uuid.uuid4(), attempts=1)  # fmt: skip
    assert DRAIN_WRITES[write](Registration.objects.filter(pk=reg.pk), uuid.uuid4()) is False
    assert DRAIN_WRITES[write](Registration.objects.filter(pk=reg.pk), reg.claim_token) is True


@pytest.mark.django_db(transaction=True)  # (B and the abandon run on A's pool thread, during its request)
def test_a_drain_pass_that_read_the_row_before_it_was_abandoned_changes_nothing(registry_sim, settings):
    """A claims the row and stalls past its hold; B claims it and fails; a person abandons it
    (the registry holds nothing); then A's register call finally runs. Its answer bounces off.
    (B taking over A's claim records an outcome unknown, and its settle window would refuse this
    abandon: tests/test_unknown_outcomes.py. Here the window is 0, to see the write bounce.)"""
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 0
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    passport = published()
    adapter = _adapter()
    register = adapter.register

    def register_after_b_and_the_abandon(reg):
        try:
            time.sleep(1.1)  # A's hold runs out while its request waits
            registry_sim.faults["register_5xx"] = 1
            assert drain_once().failed == 1  # B
            Registration.objects.filter(passport=passport).update(
                next_attempt_at=timezone.now() + timedelta(minutes=5)
            )
            service.abandon(passport.pk, actor="user:ops", reason="registry refuses it")
        finally:
            connections.close_all()  # this thread's
        return register(reg)

    adapter.register = register_after_b_and_the_abandon
    report = drain_once(adapter=adapter)  # A, late

    assert report.late == 1 and report.submitted == 0
    reg = reg_of(passport)
    assert reg.status == "abandoned" and reg.correlation_id == ""
    late = RegistrationAttempt.objects.get(late=True)
    assert (late.number, late.outcome) == (1, RegistrationAttempt.Outcome.SUBMITTED)


@pytest.mark.django_db(transaction=True)  # (B runs on A's pool thread, during its request)
def test_a_late_rejection_emits_no_event(registry_sim, settings):
    """A claims the row and stalls past its hold; B claims it; then A's register is rejected. Its
    answer is late: a line marked late, and no passport.registration_rejected (its write took
    nothing, so nothing follows it)."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    registry_sim.faults["reject_upi_containing"] = "LATE"
    passport = published(upi="https://id.example.eu/01/09506000134352/21/LATE-1")
    adapter = _adapter()
    register = adapter.register

    def register_after_b_claimed(reg):
        try:
            time.sleep(1.1)  # A's hold runs out while its request waits
            assert len(Registration.objects.claim(limit=1).rows) == 1  # B
        finally:
            connections.close_all()  # this thread's
        return register(reg)

    adapter.register = register_after_b_claimed
    report = drain_once(adapter=adapter)  # A, late

    assert (report.late, report.rejected) == (1, 0)
    assert reg_of(passport).status == "pending"
    late = RegistrationAttempt.objects.get(late=True)
    assert late.outcome == RegistrationAttempt.Outcome.REJECTED
    assert not Event.objects.filter(type="passport.registration_rejected").exists()


def test_a_drain_pass_starts_no_register_after_its_claims_hold_ran_out(registry_sim, settings):
    """Two due registrations, one claim with a 1 s hold, one request in flight at a time, a
    registry that takes 1.2 s to answer: the second's turn comes after the hold ran out, when the
    row may be another drain's (or abandoned). No request goes out for it; its counted attempt is
    given back and it is due now. (tests/test_registry_concurrency.py: the same with several.)"""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    first, second = published(), published()
    registry_sim.faults["latency"] = 1.2

    report = drain_once()

    assert (report.claimed, report.submitted, report.not_started) == (2, 1, 1)
    assert "1 not started (hold ran out)" in report.summary()
    assert [c for c in registry_sim.calls if c[0] == "POST"] == [("POST", "/dpp-registration-requests")]
    submitted, waiting = sorted([reg_of(first), reg_of(second)], key=lambda r: r.status != "submitted")
    assert submitted.status == "submitted"
    assert (waiting.status, waiting.attempts, waiting.claim_token) == ("pending", 0, None)
    assert waiting.next_attempt_at <= timezone.now()
    assert not waiting.attempt_log.exists()


def test_release_gives_back_only_rows_the_claim_still_holds():
    mine = backed_off_registration(attempts=1, claim_token=uuid.uuid4(), next_attempt_at=timezone.now())
    taken_since = backed_off_registration(attempts=2, claim_token=uuid.uuid4())
    settled = backed_off_registration(attempts=1, claim_token=mine.claim_token, status="registered")
    rows = Registration.objects.filter(pk__in=[mine.pk, taken_since.pk, settled.pk])

    assert rows.release(token=mine.claim_token) == 1

    mine.refresh_from_db()
    assert (mine.attempts, mine.claim_token) == (0, None)
    assert Registration.objects.get(pk=taken_since.pk).attempts == 2
    assert Registration.objects.get(pk=settled.pk).attempts == 1


def _adapter():
    from registry.adapters import get_adapter

    return get_adapter()


# -- abandon's conditional update ------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, takes",
    [
        ({}, True),
        ({"attempts": 0}, False),
        ({"next_attempt_at": "now"}, False),
        ({"claim_token": "live"}, False),
        ({"status": "submitted"}, False),
        ({"operation": "deactivate"}, False),
    ],
    ids=["backed-off", "never-tried", "due-now", "live-claim", "submitted", "owes-deactivation"],
)
def test_abandon_takes_a_row_only_while_pending_tried_and_backed_off(fields, takes):
    now = timezone.now()
    if fields.get("next_attempt_at") == "now":
        fields["next_attempt_at"] = now - timedelta(seconds=1)
    if fields.get("claim_token") == "live":
        fields["claim_token"] = uuid.uuid4()
    reg = backed_off_registration(**fields)
    took = Registration.objects.filter(pk=reg.pk).abandon(actor="user:x", reason="why", now=now, seen=reg)
    assert took is takes
    reg.refresh_from_db()
    assert (reg.status == "abandoned") is takes


@pytest.mark.parametrize(
    "change", [{"attempts": 3}, {"next_attempt_at": 60}], ids=["attempted-since", "rescheduled-since"]
)
def test_abandon_takes_nothing_when_the_row_is_no_longer_the_one_seen(change):
    """An attempt claimed and failed while the registry was asked leaves the row pending, tried
    and backed off, as abandon wants it, but not the row the registry's answer was about."""
    now = timezone.now()
    seen = backed_off_registration()
    if "next_attempt_at" in change:
        change = {"next_attempt_at": seen.next_attempt_at + timedelta(seconds=change["next_attempt_at"])}
    Registration.objects.filter(pk=seen.pk).update(**change)
    took = Registration.objects.filter(pk=seen.pk).abandon(actor="user:x", reason="why", now=now, seen=seen)
    assert took is False
    assert Registration.objects.get(pk=seen.pk).status == "pending"


@pytest.mark.parametrize(
    "change", [{"attempts": 3}, {"correlation_id": "req-other"}], ids=["checked-since", "other-request"]
)
def test_record_handle_takes_nothing_when_the_row_is_no_longer_the_one_seen(change):
    seen = backed_off_registration(status="submitted", correlation_id="req-1")
    Registration.objects.filter(pk=seen.pk).update(**change)
    took = Registration.objects.filter(pk=seen.pk).record_handle(
        handle="h", actor="x", reason="y", now=timezone.now(), seen=seen
    )
    assert took is False
    assert Registration.objects.get(pk=seen.pk).status == "submitted"


def test_abandoned_is_counted_and_not_stalled(settings):
    settings.ODAL_REGISTRY_STALL_ATTEMPTS = 5
    backed_off_registration(status="abandoned", attempts=40)
    backed_off_registration(attempts=6)  # stalled: many attempts
    backed_off_registration(attempts=1, queued_at=timezone.now() - timedelta(days=2))  # stalled: old
    backed_off_registration(attempts=1)
    counts = service.registry_counts()
    assert (counts["abandoned"], counts["pending"], counts["stalled"]) == (1, 3, 2)


def test_republish_queues_an_abandoned_registration_afresh():
    reg = backed_off_registration(status="abandoned", note="abandoned by x: y")
    result = lifecycle.publish(reg.passport_id, actor="user:ops")
    assert result.changed and "queued afresh" in result.detail
    reg.refresh_from_db()
    assert (reg.status, reg.attempts, reg.operation) == ("pending", 0, "register")
    assert reg.next_attempt_at <= timezone.now()


@pytest.mark.parametrize("status", ["pending", "submitted", "registered"])
def test_republish_leaves_live_registrations_alone(status):
    reg = backed_off_registration(status=status, correlation_id="req-1")
    lifecycle.publish(reg.passport_id, actor="user:ops")
    reg.refresh_from_db()
    assert (reg.status, reg.attempts, reg.correlation_id) == (status, 2, "req-1")


class ChangesTheRowWhileAsked:
    """An adapter whose find_submission lets a drain claim the row while the registry is being
    asked (the row becomes due and is claimed), then answers 'holds nothing'."""

    def __init__(self, reg):
        self.reg = reg

    def find_submission(self, upi):
        from registry.adapters import NotFound

        Registration.objects.filter(pk=self.reg.pk).update(next_attempt_at=timezone.now())
        assert len(Registration.objects.claim(limit=1).rows) == 1
        return NotFound(exhaustive=True)

    def close(self):
        pass


def test_abandon_writes_nothing_when_the_row_changed_while_the_registry_was_asked():
    from odal.core.errors import Refused
    from odal.core.models import AuditEntry

    reg = backed_off_registration()
    with pytest.raises(Refused) as refused:
        service.abandon(reg.passport_id, actor="user:x", reason="why", adapter=ChangesTheRowWhileAsked(reg))
    assert refused.value.code == "registration_changed" and refused.value.status == 409
    reg.refresh_from_db()
    assert reg.status == "pending" and reg.claim_token is not None
    assert not AuditEntry.objects.exists()
    assert not Event.objects.filter(type="passport.registration_abandoned").exists()


@pytest.mark.parametrize("status", ["pending", "registered", "abandoned", "rejected"])
def test_record_handle_takes_only_a_submitted_row(status):
    reg = backed_off_registration(status=status)
    took = Registration.objects.filter(pk=reg.pk).record_handle(
        handle="h", actor="x", reason="y", now=timezone.now(), seen=reg
    )
    assert took is False
    assert Registration.objects.get(pk=reg.pk).status == status
