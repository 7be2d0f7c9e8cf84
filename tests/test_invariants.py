"""The long runs' end-of-run check (tests/invariants.py) must be able to fail: here it reads a
history made by real guarded writes (the registry's, and the sweep's note of a late 2xx), then
one made by a writer that ignores its guard, inside a test's transaction (the history table and
its triggers are rolled back with it); and registrations abandoned or suspended against what a
registry simulator's state holds."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from odal.work.settle import settle
from outbox import consumers
from outbox.models import Delivery, DeliveryAttempt
from outbox.settling import DeliverySettling, Ending
from registry.models import Registration, RegistrationAttempt
from registry.simulator import RegistryState
from tests import invariants
from tests.factories import DeliveryFactory, RegistrationFactory

pytestmark = pytest.mark.django_db


def line(reg, token, outcome, *, late):
    RegistrationAttempt.objects.create(
        registration=reg, number=1, claim_token=token, operation="register", outcome=outcome,
        answer="", started_at=timezone.now(), finished_at=timezone.now(), late=late,
    )  # fmt: skip


def late_claim_and_its_successor():
    """A row claimed by T1, whose hold runs out; claimed again by T2, which ends the attempt."""
    invariants.install_history()
    reg = RegistrationFactory()
    rows = Registration.objects.filter(pk=reg.pk)
    first = Registration.objects.claim(limit=1, hold_seconds=0).token
    rows.update(next_attempt_at=timezone.now() - timedelta(seconds=1))  # the hold ran out
    second = Registration.objects.claim(limit=1).token
    assert rows.mark_submitted(token=second, correlation_id="req-2", next_check_at=timezone.now())
    line(reg, second, "submitted", late=False)
    return reg, rows, first


def registry_late_violations() -> list[str]:
    figures = {"replayed": 0, "person_writes": {}, "registry_holds": []}
    found = invariants.check(figures, max_attempts=8)
    return [v for v in found if "registry writes" in v], figures


def test_a_late_registry_write_refused_by_its_guard_is_no_violation():
    reg, rows, first = late_claim_and_its_successor()
    assert not rows.mark_attempt_failed(token=first, error="timed out", retry_at=timezone.now())
    line(reg, first, "failed", late=True)

    found, figures = registry_late_violations()
    assert found == [] and figures["registry_late_writes_refused"] == 1


def test_a_late_registry_write_that_changed_the_row_is_a_violation():
    reg, rows, first = late_claim_and_its_successor()
    # A writer without its guard: it takes the row its claim lost, and is logged late.
    Registration.objects.filter(pk=reg.pk).update(claim_token=first)
    rows.update(status="pending", claim_token=None, last_error="timed out")
    line(reg, first, "failed", late=True)

    found, _ = registry_late_violations()
    assert found == ["1 late registry writes changed a row"]


def test_a_registry_write_logged_as_taken_must_be_in_the_history():
    reg, rows, first = late_claim_and_its_successor()
    line(reg, first, "failed", late=False)  # logged as taken, but nothing in the history took it

    found, _ = registry_late_violations()
    assert found == ["1 registry writes logged as taken are not in the history"]


def test_a_drain_write_on_a_row_whose_note_a_person_wrote_earlier_is_the_drains():
    """A note outlives its write: "handle recorded by …" stays on the row through a suspend's
    deactivation (and a publish again). The drain's write then is still the drain's, not a person's."""
    invariants.install_history()
    reg = RegistrationFactory(status="pending", operation="deactivate", note="handle recorded by ops: seen")
    claim = Registration.objects.claim(limit=1)
    assert Registration.objects.filter(pk=reg.pk).mark_deactivated(token=claim.token)
    line(reg, claim.token, "deactivated", late=False)

    found, figures = registry_late_violations()
    assert found == [] and figures["audit_entries"]["registry_handle_recorded"] == 0


# -- deliveries: a late 2xx's note (lateSuccessAt) ---------------------------------------------------


def dead_lettered_under_a_late_attempt():
    """A delivery with one attempt, claimed; the hold runs out and the sweep dead-letters it
    ("never reported"). Returns the claim whose attempt is now late."""
    invariants.install_history()
    DeliveryFactory(max_attempts=1)
    claim = Delivery.objects.claim(limit=1, select_related=("event",))
    Delivery.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))  # the hold ran out
    assert Delivery.objects.dead_letter_exhausted(now=timezone.now()) == 1
    return claim


def delivery_violations() -> list[str]:
    figures = {"replayed": 0, "person_writes": {}, "registry_holds": []}
    return [v for v in invariants.check(figures, max_attempts=8) if "deliver" in v]


def test_a_late_success_noted_on_a_dead_letter_is_no_violation():
    claim = dead_lettered_under_a_late_attempt()
    now = timezone.now()

    written = settle(
        DeliverySettling(claim.token), [Ending(claim.rows[0], consumers.Outcome(True), now, now)]
    )

    assert written.taken == [] and Delivery.objects.get().late_success_at == now
    assert delivery_violations() == []


def test_a_late_success_note_that_changed_the_row_is_a_violation():
    claim = dead_lettered_under_a_late_attempt()
    # A note written with more than the note: the dead row is pending again.
    Delivery.objects.update(late_success_at=timezone.now(), status="pending")
    DeliveryAttempt.objects.create(
        delivery=claim.rows[0], number=1, claim_token=claim.token, started_at=timezone.now(),
        finished_at=timezone.now(), outcome="delivered", late=True,
    )  # fmt: skip

    found = delivery_violations()
    assert len(found) == 1 and found[0].startswith("noting a late success changed delivery")


# -- no registration ends abandoned or suspended while the registry holds an unrevoked submission


def registry(*submissions):
    """A registry simulator's state holding, per (upi, what): a request it is "checking", one it
    "registered" (its registration active), one it registered and "deactivated", or "rejected"."""
    state = RegistryState(token="t")
    for n, (upi, what) in enumerate(submissions):
        state.hold(upi, f"req-{n}", status="rejected" if what == "rejected" else "checking")
        if what in ("registered", "deactivated"):
            state.check(f"req-{n}")
        if what == "deactivated":
            state.deactivate(state.requests[f"req-{n}"]["registrationId"])
    return SimpleNamespace(state=state)


def withdrawn_found(sim, *, enforced=True):
    invariants.install_history()
    figures = {"replayed": 0, "person_writes": {}, "registry_holds": [],
               "registry_unrevoked": invariants.registry_unrevoked(sim)}  # fmt: skip
    found = invariants.check(figures, max_attempts=8, withdrawn_enforced=enforced)
    return [v for v in found if "unrevoked" in v], found, figures


@pytest.mark.parametrize("status", ["abandoned", "suspended"])
@pytest.mark.parametrize("submission", ["checking", "registered"])
def test_a_registration_withdrawn_while_the_registry_holds_an_unrevoked_submission_is_a_violation(
    status, submission
):
    reg = RegistrationFactory(status=status)
    upi = reg.passport.upi
    found, violations, figures = withdrawn_found(registry((upi, submission)))
    assert found == [
        f"registration of {upi} ended {status} while the registry holds an unrevoked submission for it"
    ]
    assert violations.by_invariant[invariants.WITHDRAWN] == 1
    assert figures["withdrawn_while_the_registry_holds_it"] == {status: 1}


@pytest.mark.parametrize(
    "status, submission",
    [("suspended", "deactivated"), ("abandoned", "rejected"), ("suspended", "rejected"), ("registered", "registered"),
     ("pending", "checking"), ("deactivated", "deactivated")],
)  # fmt: skip
def test_what_the_registry_revoked_or_a_registration_that_stands_is_no_violation(status, submission):
    reg = RegistrationFactory(status=status)
    found, _, figures = withdrawn_found(registry((reg.passport.upi, submission)))
    assert found == [] and figures["withdrawn_while_the_registry_holds_it"] == {}


def test_another_passports_submission_is_no_violation():
    RegistrationFactory(status="suspended")
    found, _, _ = withdrawn_found(registry(("https://id.example.eu/01/1/21/SOMEONE-ELSE", "checking")))
    assert found == []


def test_a_withdrawn_registration_not_enforced_is_reported_apart():
    reg = RegistrationFactory(status="suspended")
    _, violations, figures = withdrawn_found(registry((reg.passport.upi, "checking")), enforced=False)
    assert list(violations) == [] and violations.by_invariant[invariants.WITHDRAWN] == 0
    assert violations.unenforced == [
        f"registration of {reg.passport.upi} ended suspended while the registry holds an unrevoked submission for it"
    ]
    assert figures["withdrawn_while_the_registry_holds_it"] == {"suspended": 1}
