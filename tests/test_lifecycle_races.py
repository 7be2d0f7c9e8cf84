"""Passport lifecycle against the registry outbox, where the two interleave (issue 12): a handle
recorded for a suspended passport, a re-publish after an attempted deactivation, a deactivation
whose passport was published again, and a suspend committing while the drain records
"registered" (real threads, real commits)."""

import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from odal.surfaces import lifecycle
from registry import service
from registry.drain import Attempt, DrainReport, drain_once, run_deactivate
from registry.models import Registration
from tests.factories import PassportFactory


def reg_of(passport) -> Registration:
    return Registration.objects.get(passport=passport)


def registered(registry_sim):
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    drain_once()  # register: submitted
    drain_once()  # check: registered
    assert reg_of(passport).status == "registered"
    return passport


@pytest.mark.django_db
def test_recording_a_handle_for_a_suspended_passport_queues_its_deactivation(registry_sim):
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    drain_once()
    lifecycle.suspend(passport.pk, actor="test")
    assert reg_of(passport).status == "submitted"  # left to whoever learns the outcome

    service.record_handle(passport.pk, handle="reg-by-hand", actor="user:ops", reason="read off the portal")

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.handle) == ("pending", "deactivate", "reg-by-hand")
    assert reg.next_attempt_at <= timezone.now()


@pytest.mark.django_db
def test_republish_after_an_attempted_deactivation_registers_afresh(registry_sim):
    """A deactivation attempted once (its reply lost: the registry may have dropped the
    registration) must not be cancelled as if the registry surely still held it."""
    passport = registered(registry_sim)
    lifecycle.suspend(passport.pk, actor="test")
    Registration.objects.filter(passport=passport).update(
        attempts=1,
        last_error="registry timed out after 10s",
        next_attempt_at=timezone.now() + timedelta(minutes=5),
    )

    result = lifecycle.publish(passport.pk, actor="test")

    reg = reg_of(passport)
    # One attempt, not none: the registry may still hold the registration (a later suspend finds it).
    assert (reg.status, reg.operation, reg.attempts, reg.handle) == ("pending", "register", 1, "")
    assert reg.next_attempt_at <= timezone.now()
    assert "queued afresh" in result.detail


@pytest.mark.django_db
@pytest.mark.parametrize("earlier_attempts, expected", [(0, "registered"), (1, "pending")])
def test_a_deactivation_whose_passport_was_published_again_sends_nothing(
    registry_sim, earlier_attempts, expected
):
    """The drain claimed the deactivation; the passport was published again before the drain
    asked the registry. Nothing is sent. If no earlier attempt was made the registration
    stands; if one was, it may have gone through, so a fresh register is owed."""
    passport = registered(registry_sim)
    lifecycle.suspend(passport.pk, actor="test")
    Registration.objects.filter(passport=passport).update(attempts=earlier_attempts)
    claim = Registration.objects.claim(limit=1, select_related=("passport",))
    lifecycle.publish(passport.pk, actor="test")  # the claimed deactivation is left to the drain
    calls_before = list(registry_sim.calls)

    run_deactivate(Attempt(claim.rows[0], claim.token, DrainReport()), adapter=_adapter())

    assert registry_sim.calls == calls_before  # no deactivate went out
    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.claim_token) == (expected, "register", None)
    assert reg.attempt_log.last().outcome == ("cancelled" if expected == "registered" else "reregister")


@pytest.mark.django_db(transaction=True)  # (the request, and so this publish, runs on a drain thread)
def test_published_again_while_the_registry_deactivated_registers_afresh(registry_sim):
    passport = registered(registry_sim)
    lifecycle.suspend(passport.pk, actor="test")
    adapter = _adapter()
    deactivate = adapter.deactivate

    def deactivate_while_published_again(handle):
        answer = deactivate(handle)
        try:
            lifecycle.publish(passport.pk, actor="test")  # lands while the registry answers
        finally:
            connections.close_all()  # this thread's
        return answer

    adapter.deactivate = deactivate_while_published_again

    assert drain_once(adapter=adapter).deactivated == 1

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.attempts) == ("pending", "register", 0)


@pytest.mark.django_db(transaction=True)
def test_a_suspend_committing_while_the_drain_records_registered_is_never_missed(registry_sim):
    """The suspend has run (the registration was submitted, so it left it to the drain) but not
    committed when the drain learns "registered". The drain must wait for the passport's row
    and queue the deactivation; reading past the uncommitted suspend would miss it."""
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    drain_once()
    suspended, commit_now = threading.Event(), threading.Event()

    def suspend_and_hold_the_commit():
        try:
            with transaction.atomic():
                lifecycle.suspend(passport.pk, actor="test")
                suspended.set()
                commit_now.wait(10)
        finally:
            connections.close_all()

    def drain():
        try:
            drain_once()
        finally:
            connections.close_all()

    suspender = threading.Thread(target=suspend_and_hold_the_commit)
    suspender.start()
    assert suspended.wait(10)
    drainer = threading.Thread(target=drain)
    drainer.start()
    drainer.join(timeout=1.0)  # a drain that does not wait for the passport's row is done by now
    commit_now.set()
    suspender.join(10)
    drainer.join(10)

    reg = reg_of(passport)
    assert (reg.status, reg.operation) == ("pending", "deactivate")


def _adapter():
    from registry.adapters import get_adapter

    return get_adapter()
