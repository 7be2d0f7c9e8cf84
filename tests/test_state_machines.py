"""Property-based state machines (hypothesis) of the Delivery and Registration lifecycles against
PostgreSQL: random interleavings of claims, hold expiry, current and late terminal writes,
replay, publish, suspend, abandon and record-handle, with the invariants checked after every
step. The clock is simulated (timezone.now is the machine's clock, and the claims are made at
its time rather than the database's) so holds expire on demand; the real-time races are in
test_outbox_claims.py and test_outbox_sweep.py."""

import os
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from odal.core.errors import Refused
from odal.core.models import AuditEntry, Passport
from odal.surfaces import lifecycle
from outbox.models import Consumer, Delivery, Event, Failure
from registry import adapters, service
from registry.models import Registration
from registry.simulator import RegistryState
from tests.factories import ConsumerFactory, DeliveryFactory, PassportFactory

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

HOLD = 300
MAX_ATTEMPTS = 3
# Derandomized, with no example database: the same sequences on every run and every machine, so
# a red `make test` is a change's doing, never a draw's (a random draw found the abandon model
# missing the settle window only on some runs). `make fuzz` (ODAL_FUZZ_EXAMPLES set) draws anew.
EXPLORE = bool(os.environ.get("ODAL_FUZZ_EXAMPLES"))
MACHINE_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    derandomize=not EXPLORE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Clock:
    def __init__(self):
        self.now = timezone.now().replace(microsecond=0)
        self.patch = mock.patch("django.utils.timezone.now", lambda: self.now)
        self.patch.start()

    def advance(self, seconds: int):
        self.now += timedelta(seconds=seconds)

    def stop(self):
        self.patch.stop()


# -- deliveries ------------------------------------------------------------------------------------


@dataclass
class DeliveryModel:
    status: str = "pending"
    attempts: int = 0
    token: uuid.UUID | None = None
    next_attempt_at: object = None
    stale: list = field(default_factory=list)


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        Delivery.objects.all().delete()
        Event.objects.all().delete()
        Consumer.objects.all().delete()
        self.clock = Clock()
        consumer = ConsumerFactory(max_attempts=MAX_ATTEMPTS)
        self.rows = [DeliveryFactory(consumer=consumer, next_attempt_at=self.clock.now) for _ in range(2)]
        self.model = {row.pk: DeliveryModel(next_attempt_at=self.clock.now) for row in self.rows}
        self.audit_base = AuditEntry.objects.filter(action="delivery_replayed").count()
        self.replays = 0
        self.late_refused = 0

    def teardown(self):
        self.clock.stop()

    def due(self, m: DeliveryModel) -> bool:
        return m.status == "pending" and m.next_attempt_at <= self.clock.now

    @rule(seconds=st.sampled_from([0, 1, 30, HOLD + 1, 2 * HOLD]))
    def time_passes(self, seconds):
        self.clock.advance(seconds)

    @rule()
    def claim(self):
        expected = {pk for pk, m in self.model.items() if self.due(m) and m.attempts < MAX_ATTEMPTS}
        claim = Delivery.objects.claim(limit=10, hold_seconds=HOLD, now=self.clock.now)
        assert {row.pk for row in claim.rows} == expected
        for row in claim.rows:
            m = self.model[row.pk]
            if m.token:
                m.stale.append(m.token)
            m.token, m.attempts = claim.token, m.attempts + 1
            m.next_attempt_at = self.clock.now + timedelta(seconds=HOLD)
            assert row.attempts == m.attempts

    @rule(i=st.integers(0, 1), ok=st.booleans(), late=st.booleans(), backoff=st.sampled_from([0, 10, 600]))
    def attempt_reports(self, i, ok, late, backoff):
        pk = self.rows[i].pk
        m = self.model[pk]
        token = (m.stale[-1] if m.stale else uuid.uuid4()) if late or not m.token else m.token
        rows = Delivery.objects.filter(pk=pk)
        retry_at = self.clock.now + timedelta(seconds=backoff)
        failure = Failure(pk, "boom", retry_at=retry_at, at=self.clock.now)
        took = bool(
            rows.mark_delivered_each(token=token, at=self.clock.now)
            if ok
            else rows.mark_attempts_failed_each(token=token, failures=[failure])
        )
        assert took == (m.status == "pending" and token == m.token)
        if not took:
            self.late_refused += 1
            return
        m.stale.append(m.token)
        m.token = None
        if ok:
            m.status = "delivered"
        else:
            m.status = "dead" if m.attempts >= MAX_ATTEMPTS else "pending"
            m.next_attempt_at = retry_at

    @rule()
    def sweep_dead_letters(self):
        expected = [pk for pk, m in self.model.items() if self.due(m) and m.attempts >= MAX_ATTEMPTS]
        assert Delivery.objects.dead_letter_exhausted(now=self.clock.now) == len(expected)
        for pk in expected:
            m = self.model[pk]
            m.status, m.token = "dead", None

    @rule(i=st.integers(0, 1))
    def person_replays(self, i):
        pk = self.rows[i].pk
        m = self.model[pk]
        taken = Delivery.objects.filter(pk=pk).replay(actor="user:ops", reason="consumer fixed")
        assert taken == (1 if m.status == "dead" else 0)
        if taken:
            self.replays += 1
            m.status, m.attempts, m.token, m.next_attempt_at = "pending", 0, None, self.clock.now

    @invariant()
    def database_matches_the_model(self):
        for row in Delivery.objects.filter(pk__in=self.model):
            m = self.model[row.pk]
            assert (row.status, row.attempts, row.claim_token) == (m.status, m.attempts, m.token)
            assert row.attempts <= MAX_ATTEMPTS
            if row.status == "delivered":
                assert row.delivered_at is not None and row.claim_token is None

    @invariant()
    def one_audit_entry_per_replay(self):
        assert AuditEntry.objects.filter(action="delivery_replayed").count() == self.audit_base + self.replays


def test_delivery_lifecycle_state_machine():
    run_state_machine_as_test(DeliveryMachine, settings=MACHINE_SETTINGS)


# -- registrations ---------------------------------------------------------------------------------


class SimulatorLookup:
    """find_submission read straight off the registry simulator's state (no HTTP): what an
    exhaustive read of its task list would answer at this moment."""

    def __init__(self, sim: RegistryState):
        self.sim = sim

    def find_submission(self, upi):
        held = holds(self.sim, upi)
        if len(held) == 1:
            return adapters.Found(held[0])
        return adapters.Ambiguous(held) if held else adapters.NotFound(exhaustive=True)

    def close(self):
        pass


def holds(sim: RegistryState, upi: str) -> list[str]:
    """The requests the simulator holds for `upi` (rejected ones do not count)."""
    return [r["requestId"] for r in sim.requests.values() if r["upi"] == upi and r["status"] != "rejected"]


DRAIN_WRITES = [
    "mark_submitted", "mark_submitted_noting", "mark_registered", "mark_rejected", "mark_deactivated",
    "mark_withdrawn", "mark_checked", "mark_attempt_failed",
]  # fmt: skip


class RegistrationMachine(RuleBasedStateMachine):
    def __init__(self, settings_override=None):
        super().__init__()
        self.setup()

    def setup(self):
        Registration.objects.all().delete()
        self.clock = Clock()
        self.passport = PassportFactory()
        self.tokens: list[uuid.UUID] = []  # every claim token ever handed out, newest last
        self.abandons = 0
        self.handles = 0
        self.audit_base = AuditEntry.objects.filter(
            action__in=["registry_abandoned", "registry_handle_recorded"]
        ).count()
        self.was_abandoned = False
        self.published_since = False
        self.sim = RegistryState(token="t")  # the registry: what it holds is checked, not assumed
        self.lookup: tuple[Registration, bool] | None = None  # an abandon between its two steps

    def teardown(self):
        self.clock.stop()

    @initialize(first_attempt=st.sampled_from(["none", "registry down"]))
    def published(self, first_attempt):
        lifecycle.publish(self.passport.pk, actor="user:ops")
        if first_attempt == "registry down":  # tried once, nothing reached the registry, backed off
            self.drain_register_reaches_the_registry(reply="registry down")

    def reg(self) -> Registration | None:
        return Registration.objects.filter(passport=self.passport).first()

    @rule(seconds=st.sampled_from([0, 1, 30, HOLD + 1]))
    def time_passes(self, seconds):
        self.clock.advance(seconds)

    @rule()
    def publish(self):
        lifecycle.publish(self.passport.pk, actor="user:ops")
        self.published_since = True

    @rule()
    def suspend(self):
        try:
            lifecycle.suspend(self.passport.pk, actor="user:ops")
        except Refused as exc:
            assert exc.code == "passport_is_draft"

    @rule()
    def drain_claims(self):
        claim = Registration.objects.claim(limit=5, hold_seconds=HOLD, now=self.clock.now)
        if claim.rows:
            self.tokens.append(claim.token)

    @rule(write=st.sampled_from(DRAIN_WRITES), backoff=st.sampled_from([0, 60]))
    def drain_attempt(self, write, backoff):
        """A whole drain attempt: claim if due, then report with this claim's token."""
        self.drain_claims()
        if self.tokens:
            self.drain_reports(write, late=False, backoff=backoff)

    @precondition(lambda self: self.tokens)
    @rule(write=st.sampled_from(DRAIN_WRITES), late=st.booleans(), backoff=st.sampled_from([0, 60]))
    def drain_reports(self, write, late, backoff):
        reg = self.reg()
        if reg is None:
            return
        token = self.tokens[0] if late else self.tokens[-1]
        before = Registration.objects.filter(pk=reg.pk).values().get()
        rows = Registration.objects.filter(pk=reg.pk)
        now = self.clock.now
        took = {
            "mark_submitted": lambda: rows.mark_submitted(
                token=token, correlation_id="req-1", next_check_at=now
            ),
            "mark_submitted_noting": lambda: rows.mark_submitted_noting(
                token=token, correlation_id="req-1", note="dup", next_check_at=now
            ),
            "mark_registered": lambda: rows.mark_registered(token=token, handle="reg-1"),
            "mark_rejected": lambda: rows.mark_rejected(token=token, errors="no"),
            "mark_deactivated": lambda: rows.mark_deactivated(token=token),
            "mark_withdrawn": lambda: rows.mark_withdrawn(token=token),
            "mark_checked": lambda: rows.mark_checked(token=token, next_check_at=now + timedelta(seconds=5)),
            "mark_attempt_failed": lambda: rows.mark_attempt_failed(
                token=token, error="503", retry_at=now + timedelta(seconds=backoff)
            ),
        }[write]()
        if before["claim_token"] != token or before["status"] in ("abandoned", "registered", "rejected",
                                                                   "suspended", "deactivated"):  # fmt: skip
            assert not took, f"{write} took a row it does not hold: {before}"
        if not took:
            assert Registration.objects.filter(pk=reg.pk).values().get() == before

    @rule(reply=st.sampled_from(["answered", "lost", "registry down"]))
    def drain_register_reaches_the_registry(self, reply):
        """A whole register attempt against the simulator: time passes until the row is due, the
        drain claims it, the request reaches the registry, which keeps it unless it is down, and
        the reply arrives or is lost (then the attempt fails and backs off)."""
        reg = self.reg()
        if reg is not None and reg.next_attempt_at > self.clock.now:
            self.clock.advance(int((reg.next_attempt_at - self.clock.now).total_seconds()) + 1)
        claim = Registration.objects.filter(passport=self.passport).claim(
            limit=1, hold_seconds=HOLD, now=self.clock.now
        )
        if not claim.rows:
            return
        self.tokens.append(claim.token)
        reg = claim.rows[0]
        rows = Registration.objects.filter(pk=reg.pk)
        if reg.status != "pending" or reg.operation != "register":
            return  # a check or a deactivation: other rules cover those writes
        if reply == "registry down":
            status, body = 503, {}
        else:
            status, body = self.sim.register({"upi": self.passport.upi, "operatorId": "OP-1"}, str(reg.pk))
        now = self.clock.now
        if reply == "lost" or status >= 500:
            rows.mark_attempt_failed(token=claim.token, error="503", retry_at=now + timedelta(seconds=60))
        elif status == 202:
            rows.mark_submitted(token=claim.token, correlation_id=body["requestId"], next_check_at=now)
        elif status == 409:
            rows.mark_submitted_noting(
                token=claim.token, correlation_id=body["requestId"], note="dup", next_check_at=now
            )

    @precondition(lambda self: self.lookup is None)
    @rule()
    def abandon_lookup_starts(self):
        """Abandon's first step: the row is read and checked, and the lookup reads the first page
        of a newest-first task list. A request that reaches the registry after this lands on
        that page, already read: the lookup's answer is what the registry held at this moment."""
        reg = self.reg()
        if reg is None or reg.status == "abandoned":
            return
        try:
            service.check_abandonable(reg)
        except Refused:
            return
        self.lookup = (reg, bool(holds(self.sim, self.passport.upi)))

    @precondition(lambda self: self.lookup is not None)
    @rule()
    def abandon_lookup_finishes(self):
        """Abandon's second step: the last page is read; if nothing was seen, the write, which
        must refuse a row that is no longer the one read before the lookup."""
        seen, found = self.lookup
        self.lookup = None
        if found:
            return
        before = Registration.objects.filter(pk=seen.pk).values().get()
        try:
            service.finish_abandon(seen, actor="user:ops", reason="gone")
        except Refused as exc:
            # outcome_unknown: a claim took over one that ran out mid-register (drain_claims), which
            # is an outcome unknown; the row is refused until the settle window has passed.
            unsettled = Registration.objects.get(pk=seen.pk).settles_at is not None
            assert exc.code == "registration_changed" or (exc.code == "outcome_unknown" and unsettled)
            assert Registration.objects.filter(pk=seen.pk).values().get() == before
            return
        self.abandons += 1
        self.was_abandoned, self.published_since = True, False

    @rule()
    def person_abandons(self):
        reg = self.reg()
        if reg is None:
            return
        before = Registration.objects.filter(pk=reg.pk).values().get()
        try:
            result = service.abandon(
                self.passport.pk, actor="user:ops", reason="gone", adapter=SimulatorLookup(self.sim)
            )
        except Refused:
            assert Registration.objects.filter(pk=reg.pk).values().get() == before
            return
        if not result.already_abandoned:
            self.abandons += 1
            assert before["status"] == "pending" and before["operation"] == "register"
            assert before["attempts"] >= 1 and before["claim_token"] is None
            assert before["next_attempt_at"] > self.clock.now
            self.was_abandoned, self.published_since = True, False

    @rule()
    def abandon_update_races_the_drain(self):
        """The conditional update alone, as it lands when the row changed after abandon's checks:
        it must take the row only if every condition still holds. (Only reached when the registry
        holds nothing: otherwise abandon stops at the registry's answer.)"""
        reg = self.reg()
        if reg is None or holds(self.sim, self.passport.upi):
            return
        b = Registration.objects.filter(pk=reg.pk).values().get()
        took = Registration.objects.filter(pk=reg.pk).abandon(
            actor="user:ops", reason="gone", now=self.clock.now, seen=reg
        )
        settle = timedelta(seconds=django_settings.ODAL_REGISTRY_SETTLE_SECONDS)
        allowed = (
            b["status"] == "pending" and b["operation"] == "register" and b["attempts"] >= 1
            and b["next_attempt_at"] > self.clock.now and b["claim_token"] is None
            # settled: no attempt of unknown outcome younger than the settle window (issue 22)
            and (b["last_unknown_at"] is None or b["last_unknown_at"] <= self.clock.now - settle)
        )  # fmt: skip
        assert took == allowed, f"abandon's update took={took} on {b}"
        if took:
            self.was_abandoned, self.published_since = True, False

    @rule()
    def person_records_handle(self):
        try:
            service.record_handle(self.passport.pk, handle="reg-9", actor="user:ops", reason="portal")
        except Refused:
            return
        self.handles += 1

    @invariant()
    def abandoned_means_the_registry_holds_no_submission(self):
        reg = self.reg()
        if reg is not None and reg.status == "abandoned":
            assert not holds(self.sim, self.passport.upi), (
                f"abandoned while the registry holds {holds(self.sim, self.passport.upi)}"
            )

    @invariant()
    def abandoned_stays_abandoned_until_published_again(self):
        reg = self.reg()
        if self.was_abandoned and not self.published_since:
            assert reg.status == "abandoned"

    @invariant()
    def audit_only_for_writes_that_took(self):
        trail = AuditEntry.objects.filter(
            action__in=["registry_abandoned", "registry_handle_recorded"]
        ).count()
        assert trail == self.audit_base + self.abandons + self.handles

    @invariant()
    def passport_and_registration_agree(self):
        reg = self.reg()
        if reg is None:
            return
        passport = Passport.objects.get(pk=self.passport.pk)
        assert reg.status in Registration.Status.values
        if reg.status == "abandoned":
            assert passport.status in ("published", "suspended") and reg.note.startswith(
                "abandoned by user:ops"
            )


def test_registration_lifecycle_state_machine():
    run_state_machine_as_test(
        RegistrationMachine, settings=settings(MACHINE_SETTINGS, max_examples=40, stateful_step_count=40)
    )


class AbandonLookupMachine(RuleBasedStateMachine):
    """What abandon's lookup races, and little else: its two steps, drain attempts whose request
    reaches the simulator (answered, reply lost, or registry down), time, and publish. Fewer rules
    than RegistrationMachine (and a rule of its own for the lost reply), so the interleavings
    that matter come up often; the invariant is read off the simulator's state."""

    def __init__(self):
        super().__init__()
        RegistrationMachine.setup(self)

    R = RegistrationMachine
    teardown, reg, time_passes, publish = R.teardown, R.reg, R.time_passes, R.publish
    drain_register_reaches_the_registry = R.drain_register_reaches_the_registry
    abandon_lookup_starts, abandon_lookup_finishes = R.abandon_lookup_starts, R.abandon_lookup_finishes
    abandoned_means_the_registry_holds_no_submission = R.abandoned_means_the_registry_holds_no_submission
    audit_only_for_writes_that_took = R.audit_only_for_writes_that_took
    del R

    @initialize()
    def published_and_tried_once(self):
        """Where abandon begins: published, one attempt made while the registry was down."""
        RegistrationMachine.published(self, first_attempt="registry down")

    @rule()
    def drain_register_whose_reply_is_lost(self):
        RegistrationMachine.drain_register_reaches_the_registry(self, reply="lost")


def test_abandon_lookup_state_machine():
    run_state_machine_as_test(AbandonLookupMachine, settings=settings(MACHINE_SETTINGS, max_examples=80))


# -- outcomes that are not known: late landings, abandon, suspend and the finding (issue 22) ---------

SETTLE = 900


class SimRegistry:
    """The drain's adapter, straight onto the simulator's state (no HTTP), with the register's
    fate chosen by the rule that sends it: answered, refused (nothing kept), unknown but kept, or
    unknown and still in transit (it lands later, within the settle window: the assumption the
    window stands for)."""

    def __init__(self, machine):
        self.machine, self.sim = machine, machine.sim
        self.fate = "answered"

    def register(self, reg):
        body, key = {"upi": reg.passport.upi, "operatorId": "OP-1"}, str(reg.pk)
        if self.fate == "refused":
            raise adapters.Retryable("registry answered HTTP 503")
        if self.fate == "in transit":
            self.machine.in_transit.append((body, key, self.machine.clock.now + timedelta(seconds=SETTLE)))
            raise adapters.OutcomeUnknown("registry timed out after 10s; the request may have reached it")
        status, answer = self.sim.register(body, key)
        if self.fate == "unknown":
            raise adapters.OutcomeUnknown("registry answered HTTP 504")
        if status == 202:
            return adapters.Accepted(answer["requestId"])
        if status == 409:
            return adapters.Duplicate(answer["requestId"])
        raise adapters.Retryable(f"registry answered HTTP {status}")

    def check(self, request_id):
        status, body = self.sim.check(request_id)
        if status != 200:
            raise adapters.Retryable(f"registry answered HTTP {status} to check")
        if body["status"] == "registered":
            return adapters.CheckAnswer("registered", registration_id=body["registrationId"])
        if body["status"] == "rejected":
            return adapters.CheckAnswer("rejected", errors="REJECTED")
        return adapters.CheckAnswer("checking")

    def deactivate(self, registration_id):
        status, _ = self.sim.deactivate(registration_id)
        return "deactivated" if status in (200, 204) else "already gone"

    def find_submission(self, upi):
        return SimulatorLookup(self.sim).find_submission(upi)


def unrevoked(sim: RegistryState, upi: str) -> list[str]:
    """What the registry holds for `upi` that may still be (or is) granted: requests checking, or
    registered with their registration still active."""
    held = []
    for r in sim.requests.values():
        if r["upi"] != upi or r["status"] == "rejected":
            continue
        if r["status"] == "registered" and not sim.registrations[r["registrationId"]]["active"]:
            continue
        held.append(r["requestId"])
    return held


class UncertainOutcomeMachine(RuleBasedStateMachine):
    """Registers whose outcome is unknown (kept by the registry, or landing later), drains that die
    mid-request, abandon, publish and suspend, and the drain's finding, through the drain's own
    plan and settle steps. The invariant: no registration is abandoned or suspended while the
    registry holds an unrevoked submission for it, whenever that is read."""

    def __init__(self):
        super().__init__()
        RegistrationMachine.setup(self)
        self.in_transit: list = []  # (register body, its Idempotency-Key, lands by)
        self.adapter = SimRegistry(self)
        self.override = override_settings(ODAL_REGISTRY_SETTLE_SECONDS=SETTLE)
        self.override.enable()

    def teardown(self):
        self.override.disable()
        self.clock.stop()

    reg = RegistrationMachine.reg

    @initialize()
    def published(self):
        lifecycle.publish(self.passport.pk, actor="user:ops")

    def land(self, until):
        """Requests in transit land by their time: the registry keeps them as they arrive."""
        for item in [t for t in self.in_transit if t[2] <= until]:
            self.in_transit.remove(item)
            self.sim.register(item[0], item[1])

    @rule(seconds=st.sampled_from([1, 30, HOLD + 1, SETTLE + 1]))
    def time_passes(self, seconds):
        self.land(self.clock.now + timedelta(seconds=seconds))
        self.clock.advance(seconds)

    @precondition(lambda self: self.in_transit)
    @rule()
    def a_register_in_transit_lands_early(self):
        self.land(self.in_transit[0][2])

    @rule()
    def publish(self):
        lifecycle.publish(self.passport.pk, actor="user:ops")

    @rule()
    def suspend(self):
        try:
            lifecycle.suspend(self.passport.pk, actor="user:ops")
        except Refused as exc:
            assert exc.code == "passport_is_draft"

    def claim_when_due(self):
        reg = self.reg()
        if reg is not None and reg.next_attempt_at > self.clock.now:
            self.time_passes(int((reg.next_attempt_at - self.clock.now).total_seconds()) + 1)
        return Registration.objects.filter(passport=self.passport).claim(
            limit=1, hold_seconds=HOLD, select_related=("passport",), now=self.clock.now
        )

    @rule(fate=st.sampled_from(["in transit", "answered", "refused", "unknown", "in transit"]))
    def drain_attempt(self, fate):
        """One whole attempt of whatever the row owes, through the drain's plan and settle."""
        from registry.drain import Attempt, DrainReport, operation_of

        claim = self.claim_when_due()
        if not claim.rows:
            return
        reg = claim.rows[0]
        self.adapter.fate = fate
        attempt = Attempt(reg, claim.token, DrainReport())
        plan, settle = operation_of(reg)
        if request := plan(attempt):
            settle(attempt, request.send(self.adapter))

    @rule()
    def a_register_goes_missing_then_a_suspend(self):
        """The interleaving this machine is for, made common: a register in transit, then at once
        the passport suspended (then any rule: the drain's finding, time, the landing)."""
        self.drain_attempt("in transit")
        self.suspend()

    @rule()
    def a_register_goes_missing_then_an_abandon(self):
        self.drain_attempt("in transit")
        self.person_abandons()

    @rule()
    def drain_dies_mid_register(self):
        """A drain claims a register, sends it and dies: no outcome is written; its request lands
        before its hold has run out (the next claim takes the row over only after that)."""
        claim = self.claim_when_due()
        if not claim.rows:
            return
        reg = claim.rows[0]
        if (reg.status, reg.operation) == ("pending", "register"):
            body = {"upi": self.passport.upi, "operatorId": "OP-1"}
            self.in_transit.append((body, str(reg.pk), claim.held_until))

    @rule()
    def the_registry_rejects_what_it_is_checking(self):
        for r in self.sim.requests.values():
            if r["upi"] == self.passport.upi and r["status"] == "checking":
                r["status"] = "rejected"

    @rule()
    def person_abandons(self):
        try:
            service.abandon(
                self.passport.pk, actor="user:ops", reason="gone", adapter=SimulatorLookup(self.sim)
            )
        except Refused:
            pass

    @invariant()
    def nothing_the_registry_may_grant_is_dropped(self):
        reg = self.reg()
        if reg is not None and reg.status in ("abandoned", "suspended"):
            held = unrevoked(self.sim, self.passport.upi)
            assert not held, (
                f"{reg.status} while the registry holds {held} (in transit: {len(self.in_transit)})"
            )


def test_uncertain_outcomes_state_machine():
    """Derandomized: the same interleavings every run (a test that must be able to fail fails
    every time, not by luck); tests/mutations.py removes the settle window's guards under it."""
    run_state_machine_as_test(
        UncertainOutcomeMachine,
        settings=settings(
            MACHINE_SETTINGS, max_examples=80, stateful_step_count=25, derandomize=True, database=None
        ),
    )
