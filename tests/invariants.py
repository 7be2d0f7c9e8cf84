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
    rows the admin shows as backed off after a failed register (what staff give up on), so a short
    run on a loaded machine still abandons; otherwise any registration, to be refused."""
    from django.utils import timezone

    from odal.errors import Refused
    from registry import service
    from registry.models import Registration

    regs = Registration.objects.all()
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
            result = service.abandon(pid, actor=actor, reason="the registry keeps refusing it")
            outcomes["already abandoned" if result.already_abandoned else "abandoned"] += 1
    except Refused as exc:
        outcomes[f"refused {exc.code}"] += 1


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

    from odal.models import AuditEntry
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

    # The counts the writes keep (odal.tally) must equal the rows they count, after every kill
    # and every refused late write (nothing is purged here, and no delivered row moves again).
    from odal import tally

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
