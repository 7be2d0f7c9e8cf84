"""What the long runs check at their end: `make torture` (tests/torture.py) and `make partition`
(tests/partition.py) install the same database-side history, make people's writes the same way,
and end with the same check().

install_history() puts an AFTER UPDATE trigger on `outbox_delivery` and `registry_registration`
of the run's own database (never the test database) that records every change: old and new
status, attempts, claim token, note (for a delivery the end of last_error, or "late success
noted" when the write set late_success_at, the sweep's note that must change nothing else; for a
registration the note its update wrote). check() then reads that history, the attempt logs and
the audit trail and answers the violations: something lost, a settled row changed by a late
writer, attempts differing from the claims made or past the budget, an abandoned registration
the registry holds, a registration abandoned or suspended while the registry holds an unrevoked
submission for it, an audit entry missing or extra for a person's write, a tally differing from
its rows. It needs in `figures`: "replayed" (what replay_dead took), "person_writes" (the
outcomes person_registry_write counted), "registry_holds" (registry_holds of the simulator) and
"registry_unrevoked" (registry_unrevoked of the simulator, read once every late register landed).
"""

import json
import threading
import time
from collections import Counter, defaultdict

HISTORY_SQL = """
CREATE TABLE IF NOT EXISTS torture_history (
    id bigserial PRIMARY KEY, tbl text, row_id uuid, at timestamptz DEFAULT clock_timestamp(),
    old_status text, new_status text, old_attempts int, new_attempts int,
    old_token uuid, new_token uuid, note text
);
CREATE OR REPLACE FUNCTION torture_record_delivery() RETURNS trigger AS $$
BEGIN
    INSERT INTO torture_history (tbl, row_id, old_status, new_status, old_attempts, new_attempts,
                                 old_token, new_token, note)
    VALUES (TG_TABLE_NAME, NEW.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts,
            OLD.claim_token, NEW.claim_token,
            CASE WHEN OLD.late_success_at IS DISTINCT FROM NEW.late_success_at THEN 'late success noted'
                 ELSE right(NEW.last_error, 60) END);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION torture_record_registration() RETURNS trigger AS $$
BEGIN
    INSERT INTO torture_history (tbl, row_id, old_status, new_status, old_attempts, new_attempts,
                                 old_token, new_token, note)
    VALUES (TG_TABLE_NAME, NEW.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts,
            OLD.claim_token, NEW.claim_token,
            -- the note this update wrote (none if it left the note as it was): a note outlives the
            -- write that made it ("handle recorded by ..." stays through deactivation and a publish)
            CASE WHEN NEW.note IS DISTINCT FROM OLD.note THEN left(NEW.note, 60) END);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER torture_delivery AFTER UPDATE ON outbox_delivery
    FOR EACH ROW EXECUTE FUNCTION torture_record_delivery();
CREATE TRIGGER torture_registration AFTER UPDATE ON registry_registration
    FOR EACH ROW EXECUTE FUNCTION torture_record_registration();
"""


def install_history() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(HISTORY_SQL)


# -- people's writes, as the checks count them ------------------------------------------------------


def replay_dead(*, actor: str, reason: str, limit: int = 15) -> int:
    """Replay up to `limit` dead deliveries, as a person would; returns how many it took."""
    from outbox.models import Delivery

    dead = list(Delivery.objects.filter(status="dead").values_list("pk", flat=True)[:limit])
    if not dead:
        return 0
    return Delivery.objects.filter(pk__in=dead).replay(actor=actor, reason=reason)


def person_registry_write(rng, outcomes: Counter, *, actor: str) -> None:
    """A person's registry write: record a handle (on some submitted rows) or abandon; the
    outcome, refusals included, is counted in `outcomes`. Half the time the person picks from the
    rows the admin shows as backed off after a failed register (what staff give up on); otherwise
    any registration, to be refused. The scenarios' passports are left alone (a random abandon
    of one ended the abandon-while-landing scenario before it could act, and a loaded short run
    then had no time to make it again). (That a run abandons at all is Scenarios' to make sure.)"""
    from django.utils import timezone

    from odal.core.errors import Refused
    from registry import service
    from registry.models import Registration

    regs = Registration.objects.exclude(passport__upi__contains=SCENARIO)  # (the scenarios' own are theirs)
    if rng.random() < 0.5:
        backed_off = regs.filter(status="pending", operation="register", attempts__gte=1,
                                 next_attempt_at__gt=timezone.now(), claim_token__isnull=True)  # fmt: skip
        regs = backed_off if backed_off.exists() else regs
    regs = list(regs.values_list("passport_id", "status"))
    if not regs:
        return
    pid, status = rng.choice(regs)
    try:
        if status == "submitted" and rng.random() < 0.3:
            # Each reason its own, so each recorded handle writes a note of its own (the history
            # tells a person's handle from the drain's by the note the update wrote).
            service.record_handle(pid, handle=f"reg-hand-{rng.randrange(10**6)}", actor=actor,
                                  reason=f"read off the registry portal (#{outcomes['handle recorded'] + 1})")  # fmt: skip
            outcomes["handle recorded"] += 1
        else:
            abandon_counted(pid, outcomes, actor=actor)
    except Refused as exc:
        outcomes[f"refused {exc.code}"] += 1


def abandon_counted(pid, outcomes: Counter, *, actor: str) -> str:
    """A person abandons the registration of passport `pid`; the outcome ("abandoned", "already
    abandoned" or "refused <code>") is counted in `outcomes` (what check() holds the audit trail
    to) and returned."""
    from odal.core.errors import Refused
    from registry import service

    try:
        result = service.abandon(pid, actor=actor, reason="the registry keeps refusing it")
        outcome = "already abandoned" if result.already_abandoned else "abandoned"
    except Refused as exc:
        outcome = f"refused {exc.code}"
    outcomes[outcome] += 1
    return outcome


def person_lifecycle_write(rng, outcomes: Counter, *, actor: str) -> None:
    """A person suspends a published passport, or publishes a suspended one again (the churn that
    makes registrations suspended, deactivated and queued afresh), counted in `outcomes`. The
    runs' scenario passports are left alone, and so is a passport whose registration was
    abandoned (publishing it queues the registration afresh, which the history's "abandoned stays
    abandoned" would count as a violation)."""
    from odal.core.models import Passport
    from odal.surfaces import lifecycle

    passports = Passport.objects.exclude(upi__contains=SCENARIO)
    if rng.random() < 0.5:
        pids = list(passports.filter(status="published").values_list("pk", flat=True))
        write, outcome = lifecycle.suspend, "suspended"
    else:
        pids = list(
            passports.filter(status="suspended")
            .exclude(registration__status="abandoned")
            .values_list("pk", flat=True)
        )
        write, outcome = lifecycle.publish, "published again"
    if pids:
        write(rng.choice(pids), actor=actor)
        outcomes[outcome] += 1


# -- what a run must show, made to happen ---------------------------------------------------------

# The registry simulator of the long runs: a little latency; every third passport's registers
# refused (REFUSED in its UPI: the case for abandon); requests registered on their third check;
# a slow task list read newest first (a register whose reply is lost during an abandon's lookup
# lands on a page the lookup has read already: the race abandon's guard closes).
REFUSED = "REFUSE"
SIMULATOR_FAULTS = {"latency": 0.05, "refuse_upi_containing": REFUSED, "checks_until_registered": 3,
                    "page_size": 20, "task_list_newest_first": True, "task_list_latency": 0.02}  # fmt: skip
# With late landings (LATE_LANDINGS), the first register of each passport with LANDS_LATE in
# its UPI reaches the registry LANDING_DELAY seconds after the drain gave up on it (its timeout,
# REGISTRY_TIMEOUT, is shorter): the simulator's late_landing. The settle window is longer than
# the delay, so a register odal no longer waits for has landed by the time it ends.
LANDS_LATE = "LANDS-LATE"
LANDING_DELAY = 3.0
REGISTRY_TIMEOUT = 1
SETTLE_SECONDS = 5
SETTLING = LANDING_DELAY + SETTLE_SECONDS  # seconds more a run's settle time gives the registrations
REGISTRY_ENV = {"ODAL_REGISTRY_TIMEOUT_SECONDS": str(REGISTRY_TIMEOUT), "ODAL_REGISTRY_SETTLE_SECONDS": str(SETTLE_SECONDS)}  # fmt: skip
# Late landings, and WITHDRAWN enforced, unless a run says --no-late-landings (WITHDRAWN is then
# reported apart). Before issue 22's outcomes that are not known (c0656fd), abandon answered 200
# between a register that timed out and its landing, and suspend ended the registration
# suspended: with late landings WITHDRAWN and ABANDONED failed (docs/reliability.md).
LATE_LANDINGS = True
SCENARIO = "SCENARIO"  # in the UPIs of the passports the scenarios make (the churn leaves them be)
SCENARIO_GRACE = 45.0  # seconds a run goes on past its time while a scenario is still to happen
SCENARIO_TRIES = 3  # a late-landing scenario whose request landed before it could act: made again


def simulator_faults(*, late_landings: bool) -> dict:
    late = {"late_landing_upi_containing": LANDS_LATE, "landing_delay": LANDING_DELAY}
    return {**SIMULATOR_FAULTS, **(late if late_landings else {})}


def run_upi(n: int, *, late_landings: bool) -> str:
    """The UPI of a run's n-th passport: every third refused by the registry, and with late
    landings every fourth one's first register landing late."""
    kind = REFUSED if n % 3 == 0 else "OK"
    if late_landings and n % 4 == 1:
        kind += f"-{LANDS_LATE}"
    return f"https://id.example.eu/01/1/21/{kind}-{n}"


DOOMED = "doomed"  # in an event's payload: the receivers fail its deliveries' first tries


def payload_says(body: bytes, flag: str) -> bool:
    """Whether a webhook's body is an event whose payload has `flag`: true."""
    try:
        return json.loads(body)["data"].get(flag) is True
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


class Doomed:
    """A webhook receiver's side of a delivery the run makes die: the deliveries of an event with
    DOOMED in its payload (emit_doomed) are failed until each was tried `attempts` times, so each
    dead-letters (its budget spent) and the run replays it, and its next try is delivered. A run
    that must show a replay does not wait for failures to line up by chance."""

    def __init__(self, attempts: int):
        self.attempts = attempts
        self.tries = Counter()
        self.lock = threading.Lock()

    def fails(self, webhook_id: str | None, body: bytes) -> bool:
        if not payload_says(body, DOOMED):
            return False
        with self.lock:
            self.tries[webhook_id] += 1
            return self.tries[webhook_id] <= self.attempts

    @staticmethod
    def emit() -> None:
        from django.db import transaction

        from outbox.events import emit

        with transaction.atomic():
            emit("passport.published", {"dppId": "doomed", DOOMED: True})


def publish_scenario(name: str, *, actor: str):
    from odal.core.models import Passport
    from odal.surfaces import lifecycle

    passport = Passport.objects.create(
        upi=f"https://id.example.eu/01/1/21/{SCENARIO}-{name}", operator_id="OP-S"
    )
    lifecycle.publish(passport.pk, actor=actor)
    return passport


def registration_of(passport) -> dict:
    from registry.models import Registration

    fields = ("status", "operation", "attempts", "claim_token", "next_attempt_at")
    return Registration.objects.filter(passport=passport).values(*fields).get()


def tried_and_failed(reg: dict, *, waits: float | None = None) -> bool:
    """A pending register tried at least once, no claim on it; with `waits`, next tried more than
    that many seconds from now."""
    from datetime import timedelta

    from django.utils import timezone

    failed = (reg["status"], reg["operation"], reg["claim_token"]) == ("pending", "register", None)
    if not failed or reg["attempts"] < 1:
        return False
    return waits is None or reg["next_attempt_at"] > timezone.now() + timedelta(seconds=waits)


ASK_AGAIN = 1.0  # seconds a scenario waits after a refused abandon before it asks again


class Abandonable:
    """A registration the run abandons for sure: its passport's registers are refused (REFUSED),
    and once one failed and the row waits long enough for the registry to be asked (twice the
    longest abandon so far, at least a second: backoff grows, so such a wait comes), it is
    abandoned."""

    what = "a registration abandoned (its registers refused)"

    def __init__(self, outcomes: Counter, *, actor: str):
        self.outcomes, self.actor = outcomes, actor
        self.tries = 0
        self.arm()
        self.spare = 1.0
        self.asked = Counter()
        self.next_ask = 0.0
        self.done = False

    def arm(self) -> None:
        """A fresh passport whose registers are refused. Made again, up to SCENARIO_TRIES times,
        when the registry came to hold one of its registers after all: a run's random late landing
        (a gateway passing a register on later) got through, so abandon rightly refuses it."""
        self.passport = publish_scenario(f"{REFUSED}-abandon-{self.tries}", actor=self.actor)
        self.tries += 1

    def tick(self) -> None:
        if self.done or time.monotonic() < self.next_ask:
            return
        reg = registration_of(self.passport)
        if reg["status"] == "abandoned":  # a person's random write got there first
            self.done = True
        elif tried_and_failed(reg, waits=self.spare):
            started = time.monotonic()
            outcome = abandon_counted(self.passport.pk, self.outcomes, actor=self.actor)
            self.asked[outcome] += 1
            self.done = outcome == "abandoned"
            self.spare = max(self.spare, 2 * (time.monotonic() - started))
            self.next_ask = time.monotonic() + ASK_AGAIN
            if outcome == "refused registry_holds_submission" and self.tries < SCENARIO_TRIES:
                self.arm()

    def figures(self) -> dict:
        return {"done": self.done, "passports": self.tries, **self.asked}


class WhileLanding:
    """A person's write made while the passport's first register is on its way to the registry
    (late landing): its UPI has LANDS_LATE (that register lands late) and REFUSED (its retries are
    refused, so the row stays a pending register, tried and failed). `act` is "abandon" (asked
    whenever the row is backed off, until it takes) or "suspend" (once the try failed). Done once
    the request landed with the write made before; if it landed first (a drain held the row past
    it), made again with a fresh passport, up to SCENARIO_TRIES times. Today's code abandons (or
    suspends) the row and the registry then holds the request: WITHDRAWN (and ABANDONED) fail."""

    def __init__(self, sim, outcomes: Counter, act: str, *, actor: str):
        self.sim, self.outcomes, self.act, self.actor = sim, outcomes, act, actor
        self.what = f"{'an' if act == 'abandon' else 'a'} {act} while its register was landing late"
        self.made = Counter()  # what the writes made while landing answered
        self.tries = 0
        self.done = False
        self.arm()

    def arm(self) -> None:
        self.passport = publish_scenario(f"{REFUSED}-{LANDS_LATE}-{self.act}-{self.tries}", actor=self.actor)
        self.tries += 1
        self.asked = 0  # writes made while the request was on its way
        self.took = False  # ...one of which took the row: asked no more
        self.next_ask = 0.0

    def landed(self) -> bool:
        with self.sim.state.lock:
            return any(landing["upi"] == self.passport.upi for landing in self.sim.state.landings)

    def tick(self) -> None:
        if self.done:
            return
        if self.landed():
            if self.asked:
                self.done = True
            elif self.tries < SCENARIO_TRIES:
                self.arm()
            return
        if self.took or time.monotonic() < self.next_ask or not self.sim.state.landing(self.passport.upi):
            return  # its write took, a refusal is recent, or its register is not yet sent
        reg = registration_of(self.passport)
        if self.act == "abandon" and tried_and_failed(reg, waits=0):
            outcome = abandon_counted(self.passport.pk, self.outcomes, actor=self.actor)
            self.took = outcome == "abandoned"
        elif self.act == "suspend" and tried_and_failed(reg):
            from odal.surfaces import lifecycle

            self.took = lifecycle.suspend(self.passport.pk, actor=self.actor).changed
            outcome = "suspended" if self.took else "not suspended"
        else:
            return
        self.asked += 1
        self.made[outcome] += 1
        self.next_ask = time.monotonic() + ASK_AGAIN

    def figures(self) -> dict:
        return {"done": self.done, "passports": self.tries, **self.made}


class Scenarios:
    """What a run must show, made to happen rather than hoped for: a registration abandoned and,
    with late landings, an abandon and a suspend each made while the register is on its way.
    The run calls tick() as it goes and goes on (at most SCENARIO_GRACE seconds) until done();
    shortfalls() names what still did not happen."""

    def __init__(self, sim, outcomes: Counter, *, actor: str, late_landings: bool):
        self.sim, self.outcomes = sim, outcomes
        self.each = [Abandonable(outcomes, actor=actor)]
        if late_landings:
            self.each += [WhileLanding(sim, outcomes, act, actor=actor) for act in ("abandon", "suspend")]

    def tick(self) -> None:
        for scenario in self.each:
            scenario.tick()

    def done(self) -> bool:
        return all(scenario.done for scenario in self.each)

    def shortfalls(self) -> list[str]:
        return [f"{scenario.what}: not made to happen" for scenario in self.each if not scenario.done]

    def figures(self) -> dict:
        """What each scenario made, and how its (last) passport's registration ended."""
        found = {
            scenario.what: {**scenario.figures(), "ended": "{status} ({operation})".format(**registration_of(scenario.passport))}
            for scenario in self.each
        }  # fmt: skip
        with self.sim.state.lock:
            found["late landings (registry's answer: count)"] = dict(
                Counter(str(landing["status"]) for landing in self.sim.state.landings)
            )
            found["late landings still on their way"] = len(self.sim.state.late)
        return found


def registry_settled(sim) -> bool:
    """Nothing more to come for the registrations: no late register on its way, no deactivation
    owed, no submission being checked (rows whose registers the registry refuses stay pending)."""
    from registry.models import Registration

    if sim.state.landing():
        return False
    owed = Registration.objects.filter(status="pending", operation="deactivate")
    return not owed.exists() and not Registration.objects.filter(status="submitted").exists()


def registry_holds(sim) -> list[str]:
    """The UPIs the registry simulator holds a request for (rejected ones do not count)."""
    return sorted({r["upi"] for r in sim.state.requests.values() if r["status"] != "rejected"})


def registry_unrevoked(sim) -> list[str]:
    """The UPIs the registry simulator holds an unrevoked submission for: a request it is still
    checking, or one it registered whose registration was not deactivated (rejected ones, and
    registrations deactivated, do not count)."""
    state = sim.state
    with state.lock:
        return sorted({
            r["upi"] for r in state.requests.values()
            if r["status"] == "checking"
            or (r["status"] == "registered" and state.registrations.get(r["registrationId"], {}).get("active"))
        })  # fmt: skip


# -- the checks ---------------------------------------------------------------------------------------

# The invariants, as the runs print them; every violation is a sentence under one of them.
LOST = "nothing lost: deliveries = events x consumers"
SETTLED = "no settled delivery changed, but dead -> pending by a replay"
ATTEMPTS = "every claim counts one attempt; attempts = claims, within the budget"
LATE = "late writes changed nothing; the attempt log matches the history"
ABANDONED = "abandoned stays abandoned, and the registry holds nothing for it"
WITHDRAWN = (
    "no registration ends abandoned or suspended while the registry holds an unrevoked submission for it"
)
AUDIT = "one audit entry per person's write that took a row"
TALLY = "the tallies equal the rows they count"
INVARIANTS = (LOST, SETTLED, ATTEMPTS, LATE, ABANDONED, WITHDRAWN, AUDIT, TALLY)
LATE_SUCCESS_NOTED = "late success noted"  # the history's note of a change to late_success_at only


class Violations(list):
    """The violations' sentences, in the order found, and how many each invariant had; and apart
    from them, those of an invariant not enforced (`unenforced`, `unenforced_by_invariant`)."""

    def __init__(self):
        super().__init__()
        self.by_invariant = Counter()
        self.unenforced: list[str] = []
        self.unenforced_by_invariant = Counter()

    def add(self, invariant: str, sentence: str, *, enforced: bool = True) -> None:
        if not enforced:
            self.unenforced_by_invariant[invariant] += 1
            self.unenforced.append(sentence)
            return
        self.by_invariant[invariant] += 1
        self.append(sentence)


def check(figures, *, max_attempts: int, withdrawn_enforced: bool = True) -> Violations:
    """Every invariant, from the history, the attempt logs and the audit trail; returns the
    violations (sentences) and adds what it counted to `figures`. With `withdrawn_enforced` false,
    what WITHDRAWN finds is reported apart (Violations.unenforced), not as violations."""
    from django.db import connection
    from django.db.models import Count

    from odal.core.models import AuditEntry
    from outbox.models import Consumer, Delivery, DeliveryAttempt, Event
    from registry.models import Registration, RegistrationAttempt

    violations = Violations()
    counts = dict(Delivery.objects.values_list("status").annotate(n=Count("pk")).order_by())
    figures["deliveries"] = {s: counts.get(s, 0) for s in ("delivered", "dead", "pending")}
    owed = Event.objects.count() * Consumer.objects.count()  # every consumer subscribes to everything here
    figures["deliveries_owed"] = owed
    if sum(figures["deliveries"].values()) != owed or sum(counts.values()) != owed:
        violations.add(LOST, f"deliveries lost: {owed} owed (events x consumers), found {counts}")

    with connection.cursor() as cursor:
        cursor.execute("SELECT tbl, row_id, old_status, new_status, old_attempts, new_attempts, old_token, "
                       "new_token, note FROM torture_history ORDER BY id")  # fmt: skip
        history = cursor.fetchall()
    figures["history_rows"] = len(history)

    # A settled delivery never changes again, except dead -> pending by a replay.
    claims = Counter()
    releases = Counter()  # claimed rows a pass never started, their attempt given back
    attempts_now = defaultdict(int)
    terminal = set()  # (row, token) of every write that ended an attempt
    dead_to_pending = 0
    for tbl, row, old_s, new_s, old_a, new_a, old_t, new_t, note in history:
        if tbl != "outbox_delivery":
            continue
        if note == LATE_SUCCESS_NOTED:  # a late 2xx's note (lateSuccessAt): it must change nothing else
            if (old_s, old_a, old_t) != (new_s, new_a, new_t):
                violations.add(
                    LATE, f"noting a late success changed delivery {row} ({old_s} -> {new_s}, attempts "
                    f"{old_a} -> {new_a}, claim {old_t} -> {new_t})",
                )  # fmt: skip
            continue
        if old_s == "delivered":
            violations.add(SETTLED, f"delivery {row} changed after it was delivered ({old_s} -> {new_s})")
        if old_s == "dead":
            if new_s != "pending" or new_a != 0:
                violations.add(
                    SETTLED, f"dead delivery {row} changed other than by replay ({new_s}, attempts {new_a})"
                )
            dead_to_pending += 1
            attempts_now[row] = 0
            continue
        if new_a > max_attempts:
            violations.add(ATTEMPTS, f"delivery {row} ran past its budget: {new_a} attempts")
        if new_t is not None and new_t != old_t:  # a claim
            claims[row] += 1
            attempts_now[row] += 1
            if new_a != old_a + 1:
                violations.add(
                    ATTEMPTS, f"claim of {row} did not count exactly one attempt ({old_a} -> {new_a})"
                )
        elif old_t is not None and new_t is None and new_a == old_a - 1:  # a release: never started
            releases[row] += 1
            attempts_now[row] -= 1
            if old_s != "pending" or new_s != "pending":
                violations.add(ATTEMPTS, f"release of {row} changed its status ({old_s} -> {new_s})")
        elif (
            old_t is not None
            and new_t is None
            and not (note or "").endswith("never reported (its claim expired)")
        ):
            terminal.add((row, old_t))
    final = dict(Delivery.objects.values_list("pk", "attempts"))
    mismatched = [row for row, n in attempts_now.items() if final.get(row) != n]
    if mismatched:
        violations.add(
            ATTEMPTS, f"{len(mismatched)} deliveries whose attempts differ from the claims made on them"
        )
    log = list(DeliveryAttempt.objects.values_list("delivery_id", "claim_token", "late"))
    current = {(d, t) for d, t, late in log if not late}
    late = {(d, t) for d, t, late in log if late}
    if current != terminal:
        violations.add(
            LATE,
            f"attempt log and history disagree: {len(current - terminal)} logged writes not in history, "
            f"{len(terminal - current)} history writes not logged",
        )
    if late & terminal:
        violations.add(LATE, f"{len(late & terminal)} late writes changed a row")
    figures["claims"] = sum(claims.values())
    figures["claims_released_unstarted"] = sum(releases.values())
    figures["attempts_logged"] = len(log)
    figures["late_writes_refused"] = len(late)

    # Registrations: abandoned means the registry holds nothing for the passport.
    held = set(figures.pop("registry_holds", []))
    abandoned_upis = set(
        Registration.objects.filter(status="abandoned").values_list("passport__upi", flat=True)
    )
    figures["abandoned_while_the_registry_holds_it"] = len(abandoned_upis & held)
    for upi in sorted(abandoned_upis & held):
        violations.add(
            ABANDONED, f"registration of {upi} abandoned while the registry holds a submission for it"
        )

    # Registrations: none ends abandoned or suspended (given up, or withdrawn as never accepted)
    # while the registry holds a submission it may still grant, or granted and still has active.
    unrevoked = set(figures.pop("registry_unrevoked", []))
    withdrawn = Registration.objects.filter(
        status__in=["abandoned", "suspended"], passport__upi__in=unrevoked
    )
    found = sorted(withdrawn.values_list("passport__upi", "status"))
    figures["withdrawn_while_the_registry_holds_it"] = dict(Counter(status for _, status in found))
    for upi, status in found:
        violations.add(
            WITHDRAWN,
            f"registration of {upi} ended {status} while the registry holds an unrevoked submission for it",
            enforced=withdrawn_enforced,
        )

    # Registrations: abandoned stays abandoned; people's writes audited once each.
    for tbl, row, old_s, new_s, *_rest in history:
        if tbl == "registry_registration" and old_s == "abandoned":
            violations.add(ABANDONED, f"abandoned registration {row} changed to {new_s}")
    abandoned_by_history = sum(1 for h in history if h[0] == "registry_registration" and h[3] == "abandoned"
                               and h[2] != "abandoned")  # fmt: skip
    handles_by_history = sum(1 for h in history if h[0] == "registry_registration" and h[2] == "submitted"
                             and h[3] == "registered" and (h[8] or "").startswith("handle recorded by"))  # fmt: skip
    audit = Counter(AuditEntry.objects.values_list("action", flat=True))
    people = figures.get("person_writes", {})
    expected = {
        "delivery_replayed": figures["replayed"],
        "registry_abandoned": people.get("abandoned", 0),
        "registry_handle_recorded": people.get("handle recorded", 0),
    }
    for action, n in expected.items():
        if audit.get(action, 0) != n:
            violations.add(
                AUDIT, f"audit trail has {audit.get(action, 0)} {action} entries for {n} writes that took"
            )
    if dead_to_pending != figures["replayed"]:
        violations.add(AUDIT, f"{dead_to_pending} dead -> pending changes for {figures['replayed']} replays")
    if abandoned_by_history != expected["registry_abandoned"]:
        violations.add(
            AUDIT, f"{abandoned_by_history} rows abandoned for {expected['registry_abandoned']} abandons"
        )
    if handles_by_history != expected["registry_handle_recorded"]:
        violations.add(
            AUDIT,
            f"{handles_by_history} handles in history for {expected['registry_handle_recorded']} recorded",
        )
    figures["registrations_by_status"] = dict(
        Registration.objects.values_list("status").annotate(n=Count("pk")).order_by()
    )
    # Registrations: a late write changed nothing. A write of the claim T that took its row
    # cleared T (history: old token T, new none); a person's record_handle clears a checking
    # claim too, and is not the claim's write. A line logged late for (row, T) must have no such
    # write in the history, and each line logged as taken must have one (write_error lines: the
    # database refused the write). Releases (rows never started) clear T and log no line.
    token_writes = {
        (row, old_t)
        for tbl, row, old_s, new_s, old_a, new_a, old_t, new_t, note in history
        if tbl == "registry_registration" and old_t is not None and new_t is None
        and not (note or "").startswith("handle recorded by")
    }  # fmt: skip
    reg_log = list(
        RegistrationAttempt.objects.values_list("registration_id", "claim_token", "late", "outcome")
    )
    reg_late = {(r, t) for r, t, late, _ in reg_log if late}
    reg_taken = {
        (r, t) for r, t, late, outcome in reg_log if not late and outcome != RegistrationAttempt.WRITE_ERROR
    }
    if reg_late & token_writes:
        violations.add(LATE, f"{len(reg_late & token_writes)} late registry writes changed a row")
    if reg_taken - token_writes:
        violations.add(
            LATE, f"{len(reg_taken - token_writes)} registry writes logged as taken are not in the history"
        )
    figures["registry_late_writes_refused"] = len(reg_late)
    figures["audit_entries"] = {k: audit[k] for k in expected}

    # The counts the writes keep (odal.core.tally) must equal the rows they count, after every kill
    # and every refused late write (nothing is purged here, and no delivered row moves again).
    from odal.core import tally

    kept = tally.totals("outbox.delivered", "outbox.attempts", "registry.status")
    rows = {
        "outbox.delivered": {
            str(c): n
            for c, n in Delivery.objects.filter(status="delivered")
            .values_list("consumer_id")
            .annotate(n=Count("pk"))
            .order_by()
        },
        "outbox.attempts": {
            outcome + (":late" if late else ""): n
            for outcome, late, n in DeliveryAttempt.objects.values_list("outcome", "late")
            .annotate(n=Count("pk"))
            .order_by()
        },
        "registry.status": dict(figures["registrations_by_status"]),
    }
    for metric, expected_rows in rows.items():
        found = {k: n for k, n in kept[metric].items() if n}
        if found != expected_rows:
            violations.add(TALLY, f"tally {metric} says {found}, the rows say {expected_rows}")
    figures["tally_checked"] = sorted(rows)
    figures["violations"] = len(violations)
    return violations
