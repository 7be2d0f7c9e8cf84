"""Outcomes that are not known (issue 22), end to end with a register that really lands late: the
simulator's late_landing holds it past the drain's timeout, as a gateway that passes a request on
after its client gave up, and stores it when the test says (land_pending), never on the
machine's speed. Against the real drain, the http adapter and the simulator: abandon refuses while
the last unknown attempt is younger than ODAL_REGISTRY_SETTLE_SECONDS (409 outcome_unknown), and
a suspend after (or during) such a register finds what the registry holds and deactivates it
rather than ending `suspended`. Before issue 22's change each answered 200 abandoned or ended
suspended while the registry then held the request. (tests/test_registry_unknown.py has the
change's own tests, one per guard.)"""

import threading

import pytest
from django.db import connections

from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from registry import adapters
from registry.drain import drain_once, drain_until_idle
from registry.models import Registration
from tests.factories import PassportFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

NEVER = 600  # seconds: a landing_delay no test reaches; land_pending() lands the request


@pytest.fixture
def unknown_outcomes(registry_sim, settings):
    """The simulator's next register lands late; a failed attempt backs off past the test (so a
    backed-off row is abandonable by its state alone); the settle window outlasts the test."""
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    settings.ODAL_BACKOFF_BASE_SECONDS = 600
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 600
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER)
    return registry_sim


def published():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.select_related("passport").get(passport=passport)


def held(sim, upi) -> list[dict]:
    return [r for r in sim.requests.values() if r["upi"] == upi]


def snapshot(reg):
    return Registration.objects.filter(pk=reg.pk).values().get(), AuditEntry.objects.count()


def abandon(client, passport):
    return client.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "the registry keeps refusing it"})


def register_timed_out_and_is_on_its_way(sim, passport) -> Registration:
    """The drain's register timed out; the registry holds nothing yet; the request is on its way."""
    drain_once()
    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.attempts, reg.claim_token) == ("pending", "register", 1, None)
    assert held(sim, passport.upi) == [] and sim.landing(passport.upi) == 1
    return reg


def deactivated_in_the_registry(sim, passport) -> bool:
    """The registry granted the late request and its registration is no longer active."""
    [request] = held(sim, passport.upi)
    return request["status"] == "registered" and not sim.registrations[request["registrationId"]]["active"]


def ends_deactivated(sim, passport, settings) -> Registration:
    """The request lands; the drain finds it, has it granted and deactivates it, and ends the row
    once the settle window (3 s from the unknown attempt) has passed."""
    sim.land_pending()
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    drain_until_idle(max_seconds=30, linger_seconds=10)
    reg = reg_of(passport)
    assert reg.status == "deactivated", (reg.status, reg.operation, reg.last_error, held(sim, passport.upi))
    assert deactivated_in_the_registry(sim, passport)
    return reg


def test_abandon_refuses_while_a_register_that_timed_out_may_still_land(admin_api, unknown_outcomes):
    sim = unknown_outcomes
    passport = published()
    reg = register_timed_out_and_is_on_its_way(sim, passport)
    before = snapshot(reg)

    response = abandon(admin_api, passport)
    assert response.status_code == 409, response.json()
    assert response.json()["code"] == "outcome_unknown" and "retryAfter" in response.json()
    assert snapshot(reg) == before  # the row untouched, nothing audited

    sim.land_pending()  # the gateway passes the request on: the registry holds it
    assert len(held(sim, passport.upi)) == 1
    response = abandon(admin_api, passport)
    assert response.status_code == 409 and response.json()["code"] == "registry_holds_submission"
    assert reg_of(passport).status == "pending"


def test_abandon_refuses_after_a_register_whose_drain_died_after_sending(admin_api, unknown_outcomes):
    """The drain sent the register and died before it wrote anything; the next attempt is a plain
    503. The claim that took over the unfinished attempt recorded its outcome as unknown."""
    sim = unknown_outcomes
    passport = published()
    claim = Registration.objects.claim(limit=1, hold_seconds=1, select_related=("passport",))
    adapter = adapters.get_adapter()
    try:
        with pytest.raises(adapters.Retryable):
            adapter.register(claim.rows[0])  # sent; its drain dies here and writes nothing
    finally:
        adapter.close()
    assert wait_for(lambda: Registration.objects.due().filter(passport=passport).exists(), 10)  # hold over
    sim.faults["register_5xx"] = 1
    assert drain_once().failed == 1  # the next attempt: a plain 503, its outcome known
    reg = reg_of(passport)
    assert (reg.status, reg.attempts, reg.claim_token) == ("pending", 2, None)
    assert held(sim, passport.upi) == [] and sim.landing(passport.upi) == 1
    before = snapshot(reg)

    response = abandon(admin_api, passport)
    assert response.status_code == 409 and response.json()["code"] == "outcome_unknown", response.json()
    assert snapshot(reg) == before


def test_suspend_after_a_register_that_timed_out_deactivates_what_the_registry_granted(
    unknown_outcomes, settings
):
    sim = unknown_outcomes
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 3
    passport = published()
    register_timed_out_and_is_on_its_way(sim, passport)

    lifecycle.suspend(passport.pk, actor="test")
    assert (reg_of(passport).status, reg_of(passport).operation) == ("pending", "deactivate")
    ends_deactivated(sim, passport, settings)


@pytest.mark.django_db(transaction=True)  # the drain runs on its own thread and connection
def test_suspend_while_the_register_is_on_its_way_deactivates_what_the_registry_granted(
    unknown_outcomes, settings
):
    """The suspend comes while the drain's register is at the gateway (sent, not yet answered):
    the row is the drain's, which finds what the registry holds once its attempt reports."""
    sim = unknown_outcomes
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 3
    settings.ODAL_BACKOFF_BASE_SECONDS = 0  # the row is the drain's again at once, not in 10 minutes
    passport = published()

    def attempt():
        try:
            drain_once()
        finally:
            connections.close_all()

    drain = threading.Thread(target=attempt)
    drain.start()
    try:
        assert wait_for(lambda: sim.landing(passport.upi) == 1, 20)  # sent, held at the gateway
        lifecycle.suspend(passport.pk, actor="test")
    finally:
        drain.join(30)
    assert held(sim, passport.upi) == [] and reg_of(passport).status == "pending"
    ends_deactivated(sim, passport, settings)
