"""Hostile review of issue 22 ("what the node does not know it must never treat as known").

Each test here failed on the code as merged (788f3ca) and says in its docstring what went wrong.
Everything runs over real HTTP against the registry simulator."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import Passport
from odal.surfaces import lifecycle
from registry import service
from registry.drain import drain_once
from registry.models import Registration, RegistrationAttempt
from tests.factories import PassportFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def published() -> Passport:
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.get(passport=passport)


def due_now(passport) -> None:
    Registration.objects.filter(passport=passport).update(next_attempt_at=timezone.now())


def held_unrevoked(sim, upi: str) -> list[str]:
    """What the registry holds for `upi` that is not revoked: a request still checking, or a
    registration still active."""
    with sim.lock:
        held = []
        for request in sim.requests.values():
            if request["upi"] != upi or request["status"] == "rejected":
                continue
            if request["status"] == "registered":
                if sim.registrations[request["registrationId"]]["active"]:
                    held.append(request["registrationId"])
            else:
                held.append(request["requestId"])
        return held


def drain_until_settled(passport, *, passes=10) -> Registration:
    for _ in range(passes):
        reg = reg_of(passport)
        if reg.status not in ("pending", "submitted"):
            return reg
        due_now(passport)
        drain_once()
    return reg_of(passport)


# -- 1. publishing again makes an attempted row look never attempted -------------------------------------


def test_suspend_after_publishing_again_never_drops_a_registration_whose_deactivation_failed(
    registry_sim, settings
):
    """A registered passport is suspended; its deactivation fails (the registry was unreachable:
    nothing deactivated). It is published again (reregister: a fresh register, attempts 0) and
    suspended again before the drain gets to it. On the merged code the second suspend took the
    row for a register never attempted (withdraw_unsent: attempts 0) and ended it `suspended` at
    once, while the registry still held the active registration: nothing ever deactivated it."""
    passport = published()
    drain_once()  # submitted
    drain_once()  # registered
    assert reg_of(passport).status == "registered"
    lifecycle.suspend(passport.pk, actor="user:ops")
    good = settings.ODAL_REGISTRY_URL
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"  # unreachable: the deactivation fails, unsent
    assert drain_once().failed == 1
    settings.ODAL_REGISTRY_URL = good
    assert held_unrevoked(registry_sim, passport.upi)  # still active

    lifecycle.publish(passport.pk, actor="user:ops")  # registers afresh (attempts 0)
    lifecycle.suspend(passport.pk, actor="user:ops")  # before the drain made that register

    reg = drain_until_settled(passport)
    assert held_unrevoked(registry_sim, passport.upi) == [] or reg.status != "suspended", (
        f"row ended {reg.status} while the registry holds {held_unrevoked(registry_sim, passport.upi)}"
    )
    assert reg.status == "deactivated"
    assert held_unrevoked(registry_sim, passport.upi) == []


def test_suspend_after_publishing_again_during_a_finding_never_drops_what_landed(registry_sim, settings):
    """A register's outcome is unknown and it landed (the registry is checking it). Suspended:
    the row owes a finding. Published again before the drain found anything (reregister: a
    fresh register, attempts 0), then suspended again once the window has passed. On the merged
    code that suspend read attempts 0 as 'never sent' (withdraw_unsent only waits for the settle
    window, it does not look) and ended the row `suspended` while the registry held the
    submission, which it then granted: nothing ever deactivated it."""
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 1
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    registry_sim.faults["latency"] = 1.5
    passport = published()
    assert drain_once().unknown == 1
    registry_sim.faults["latency"] = 0
    assert wait_for(lambda: held_unrevoked(registry_sim, passport.upi), 5)  # it landed
    lifecycle.suspend(passport.pk, actor="user:ops")
    assert reg_of(passport).finds_first

    lifecycle.publish(passport.pk, actor="user:ops")
    assert wait_for(lambda: reg_of(passport).settles_at is None, 5)
    lifecycle.suspend(passport.pk, actor="user:ops")

    reg = drain_until_settled(passport)
    assert reg.status != "suspended" or not held_unrevoked(registry_sim, passport.upi), (
        f"row ended suspended while the registry holds {held_unrevoked(registry_sim, passport.upi)}"
    )
    assert reg.status == "deactivated" and held_unrevoked(registry_sim, passport.upi) == []


# -- 2. the finding's remembered request id stands in for the task list ------------------------------


def test_a_finding_proves_absence_with_a_lookup_made_once_settled_not_with_a_remembered_request_id(
    registry_sim, settings
):
    """Two registers of a row had unknown outcomes: the first landed (req-A, checking), the second
    was still in a gateway's queue. Suspended: the finding reads the task list, finds req-A still
    checking and remembers it. The registry rejects req-A; the second register then lands (the
    UPI is free again: req-B), within the settle window. On the merged code every later pass
    checked req-A alone (never the task list again): req-A rejected, window passed, so the row
    ended `suspended` while the registry held req-B, and then granted it."""
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 2
    registry_sim.faults["checks_until_registered"] = 100  # req-A stays checking until told
    passport = published()
    registry_sim.faults["latency"] = 1.5
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    assert drain_once().unknown == 1  # the first register: lands as req-A
    registry_sim.faults["latency"] = 0
    assert wait_for(lambda: held_unrevoked(registry_sim, passport.upi), 5)
    [request_a] = held_unrevoked(registry_sim, passport.upi)
    # The second register: sent, no answer (noted as the drain notes it); it sits in a gateway.
    Registration.objects.filter(passport=passport).update(attempts=2)
    Registration.objects.filter(passport=passport).note_unknown_outcome(at=timezone.now())
    lifecycle.suspend(passport.pk, actor="user:ops")

    drain_once()  # the finding: req-A still checking, remembered
    assert reg_of(passport).correlation_id == request_a
    with registry_sim.lock:
        registry_sim.requests[request_a]["status"] = "rejected"
    registry_sim.hold(passport.upi, "req-B")  # the second register lands, inside the window

    assert wait_for(lambda: reg_of(passport).settles_at is None, 5)
    reg = drain_until_settled(passport)

    assert reg.status != "suspended" or not held_unrevoked(registry_sim, passport.upi), (
        f"row ended suspended while the registry holds {held_unrevoked(registry_sim, passport.upi)}"
    )


# -- 3. figures: a finding's late answers and protocol errors ------------------------------------------


def metric(name: str) -> float:
    for line in Client().get("/metrics").content.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_late_answers_and_protocol_errors_of_a_finding_are_in_the_metrics(registry_sim):
    """A finding's attempt-log lines have operation `find`. The tally counts their late answers
    and protocol errors under `find`, but /metrics exported only check, deactivate and register:
    on the merged code a finding's late answers and a registry breaking the protocol during one
    were counted and never shown (registry_late_writes_total, registry_protocol_errors_total)."""
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    drain_once()
    lifecycle.suspend(passport.pk, actor="user:ops")
    reg = reg_of(passport)
    now = timezone.now()
    for late, answer in ((True, "absent"), (False, "protocol error: registry answered HTTP 200 to check")):
        RegistrationAttempt.objects.create(
            registration=reg, number=1, claim_token=reg.pk, operation="find", started_at=now,
            finished_at=now, outcome="failed", answer=answer, late=late,
        )  # fmt: skip

    assert metric('registry_late_writes_total{operation="find"}') == 1.0
    assert metric('registry_protocol_errors_total{operation="find"}') == 1.0


# -- 4. what a stuck finding tells a person to do ----------------------------------------------------------


def test_a_finding_against_an_unsearchable_registry_advises_only_what_a_person_can_do(registry_sim):
    """A finding row (pending deactivate, no handle) against a registry whose task list cannot be
    searched fails every pass, for ever. On the merged code its last_error told a person to
    "record its handle", which record-handle refused on such a row (only a submitted row took
    one): the advice led nowhere."""
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    drain_once()
    lifecycle.suspend(passport.pk, actor="user:ops")
    registry_sim.faults["unsearchable"] = True

    drain_once()

    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("pending", "deactivate")
    assert "publish" in reg.last_error
    # Since issue 37 (item 9b) record-handle takes such a row, and the advice says so.
    assert "record its handle" in reg.last_error
    try:
        done = service.record_handle(passport.pk, handle="reg-1", actor="user:ops", reason="read it off")
    except Refused as refused:
        pytest.fail(f"last_error advises what record-handle refuses ({refused.detail}): {reg.last_error!r}")
    assert (done.status, done.operation, done.handle) == ("pending", "deactivate", "reg-1")


# -- 5. a withdrawal written after the passport was published again ---------------------------------------


def test_a_withdrawal_written_after_a_publish_again_leaves_the_passport_owing_its_registration(registry_sim):
    """The drain claimed a first register; the passport was suspended, so the drain decided to
    send nothing (withdraw: `withdrawn`), and its outcome waits to be flushed with the pass's
    others (up to FLUSH_SECONDS). The passport is published again meanwhile: publishing leaves a
    claimed row to the drain. On the merged code the withdrawal was then written as it was
    decided (mark_withdrawn: `suspended`) and nothing re-read the passport: a published passport
    whose registration ended suspended, owing the registry nothing, never registered."""
    import uuid

    from registry.drain import Attempt, DrainReport, plan_register, write_endings
    from tests.factories import RegistrationFactory

    reg = RegistrationFactory(
        attempts=1, claim_token=uuid.uuid4(), next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    Passport.objects.filter(pk=reg.passport_id).update(status=Passport.Status.PUBLISHED)
    claimed = Registration.objects.select_related("passport").get(pk=reg.pk)  # as the claim read it
    assert "left to the drain" in lifecycle.suspend(reg.passport_id, actor="user:ops").detail
    endings = []
    assert plan_register(Attempt(claimed, reg.claim_token, DrainReport(), endings)) is None
    assert [e.outcome for e in endings] == ["withdrawn"]

    result = lifecycle.publish(reg.passport_id, actor="user:ops")  # before the pass flushes
    assert "left as it is" in result.detail
    write_endings(endings)

    after = Registration.objects.get(pk=reg.pk)
    assert Passport.objects.get(pk=reg.passport_id).status == "published"
    assert (after.status, after.operation) == ("pending", "register"), (
        f"a published passport's registration ended {after.status}"
    )
    assert not registry_sim.calls
    assert drain_once().submitted == 1
