"""The registry outbox: one Registration per passport, the work this node owes the EU DPP
registry for it, and the log of every attempt at that work."""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from odal.core.ids import uuid7
from odal.core.models import Passport
from odal.core.text import storable
from odal.work.claims import ClaimQuerySet

# How last_error begins when a row needs a person for what the registry answered: a DUPLICATE_UPI
# naming a request whose registration the registry deactivated (registry.drain: not adopted, and
# stalled however few its attempts), and a deactivation whose finding cannot search the registry
# (registry.finding: a person may record the handle they found in the registry's portal).
NOT_ADOPTED = "not adopted: "
UNSEARCHABLE = "the registry cannot be searched"


def settled(now: datetime) -> Q:
    """No attempt whose outcome is unknown is younger than ODAL_REGISTRY_SETTLE_SECONDS: what the
    task list shows now is all this node's registers can ever have left there. (Before that, a
    register that timed out may still be on its way through a gateway or a queue.)"""
    return Q(last_unknown_at__isnull=True) | Q(
        last_unknown_at__lte=now - timedelta(seconds=settings.ODAL_REGISTRY_SETTLE_SECONDS)
    )


def later_unknown(at):
    """last_unknown_at moved to `at` (a datetime, or an expression: the database's now), never
    back (PostgreSQL's GREATEST passes over a NULL)."""
    at = at if hasattr(at, "resolve_expression") else Value(at)
    return Greatest(F("last_unknown_at"), at)


def owed_afresh(operation: str, now: datetime) -> dict:
    """A row that owes `operation` afresh, due now: no attempt made, no claim, nothing known of
    what the registry did before (requeue, reregister, find_and_deactivate)."""
    return {
        "operation": operation,
        "attempts": 0,
        "next_attempt_at": now,
        "queued_at": now,
        "claim_token": None,
        "correlation_id": "",
        "handle": "",
        "last_error": "",
    }


class RegistrationQuerySet(ClaimQuerySet):
    claimable_statuses = ("pending", "submitted")

    def reclaim_updates(self, now) -> dict:
        """A register whose claim ran out with no outcome written (its drain died or stalled
        mid-request) may have reached the registry: the claim that takes it over records an
        outcome unknown, as of the claim's now (the database's)."""
        took_over = Q(
            claim_token__isnull=False,
            status=Registration.Status.PENDING,
            operation=Registration.Operation.REGISTER,
        )
        return {
            "last_unknown_at": Case(When(took_over, then=later_unknown(now)), default=F("last_unknown_at"))
        }

    # -- the drain's writes: each takes the row only while the drain's claim holds it and the
    # status is the one it expects. An abandoned (or otherwise settled) row matches none of them.

    def _held(self, token, *statuses, operation=None):
        rows = self.filter(claim_token=token, status__in=statuses)
        return rows.filter(operation=operation) if operation else rows

    def mark_submitted(self, *, token, correlation_id: str, next_check_at: datetime, **noting) -> bool:
        """register answered 202: the registry is checking our request."""
        return (
            self._held(token, Registration.Status.PENDING, operation=Registration.Operation.REGISTER).update(
                status=Registration.Status.SUBMITTED,
                correlation_id=correlation_id,
                attempts=0,  # from here attempts count checks
                next_attempt_at=next_check_at,
                claim_token=None,
                last_error="",
                submitted_at=timezone.now(),
                **noting,
            )
            == 1
        )

    def mark_submitted_noting(
        self, *, token, correlation_id: str, note: str, next_check_at: datetime
    ) -> bool:
        """register answered DUPLICATE_UPI: the registry already holds a request for this UPI
        (typically our own, whose reply was lost). Adopt its id and say so in the note."""
        return self.mark_submitted(
            token=token, correlation_id=correlation_id, next_check_at=next_check_at, note=note
        )

    def mark_registered(self, *, token, handle: str) -> bool:
        return (
            self._held(token, Registration.Status.SUBMITTED).update(
                status=Registration.Status.REGISTERED,
                handle=handle,
                claim_token=None,
                last_error="",
                registered_at=timezone.now(),
            )
            == 1
        )

    def mark_rejected(self, *, token, errors: str) -> bool:
        """register answered 422, or a check found the request rejected."""
        return (
            self.filter(claim_token=token)
            .filter(
                Q(status=Registration.Status.PENDING, operation=Registration.Operation.REGISTER)
                | Q(status=Registration.Status.SUBMITTED)
            )
            .update(status=Registration.Status.REJECTED, claim_token=None, last_error=storable(errors))
            == 1
        )

    def mark_deactivated(self, *, token) -> bool:
        return (
            self._held(
                token, Registration.Status.PENDING, operation=Registration.Operation.DEACTIVATE
            ).update(status=Registration.Status.DEACTIVATED, claim_token=None, last_error="")
            == 1
        )

    def mark_withdrawn(self, *, token, now: datetime | None = None) -> bool:
        """The drain found the passport no longer published before it asked the registry, on the
        row's first attempt (attempts 1: this claim's), with no outcome unknown still settling:
        the registry never saw a register for it, so it becomes suspended. A row attempted before
        is left to find_and_deactivate."""
        return (
            self._held(token, Registration.Status.PENDING, operation=Registration.Operation.REGISTER)
            .filter(attempts=1)
            .filter(settled(now or timezone.now()))
            .update(status=Registration.Status.SUSPENDED, claim_token=None)
            == 1
        )

    def find_and_deactivate(self, *, now: datetime, token=None) -> int:
        """A withdrawn passport whose register was attempted (any outcome but a rejection, which
        ends the row): the registry may hold it, so the row owes a deactivation that first finds
        what the registry holds (handle unknown), due now. From suspending: no claim holds the row
        (one that does is left to its drain); from the drain, which found the passport withdrawn
        before it asked: its claim."""
        return self.filter(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.REGISTER,
            claim_token=token,
        ).update(**owed_afresh(Registration.Operation.DEACTIVATE, now))

    def mark_checked(self, *, token, next_check_at: datetime) -> bool:
        """A check found the request still being checked: ask again later."""
        return (
            self._held(token, Registration.Status.SUBMITTED).update(
                next_attempt_at=next_check_at, claim_token=None
            )
            == 1
        )

    def mark_rate_limited(self, *, token, error: str, retry_at: datetime) -> bool:
        """The registry answered 429: it did not act on the request, so the attempt does not
        count (attempts - 1, as when a claim gives back a row it never started) and the row is due
        again when the pause the registry asked for ends."""
        return (
            self._held(token, Registration.Status.PENDING, Registration.Status.SUBMITTED).update(
                attempts=F("attempts") - 1,
                next_attempt_at=retry_at,
                claim_token=None,
                last_error=storable(error),
            )
            == 1
        )

    def mark_attempt_failed(
        self, *, token, error: str, retry_at: datetime, unknown_at: datetime | None = None
    ) -> bool:
        """The registry could not be reached or answered 5xx: try again at retry_at. With
        `unknown_at` (when the attempt ended), its outcome is unknown: the request may have
        reached the registry, and the row remembers when (last_unknown_at)."""
        noting = {"last_unknown_at": later_unknown(unknown_at)} if unknown_at else {}
        return (
            self._held(token, Registration.Status.PENDING, Registration.Status.SUBMITTED).update(
                next_attempt_at=retry_at, claim_token=None, last_error=storable(error), **noting
            )
            == 1
        )

    def note_unknown_outcome(self, *, at: datetime) -> int:
        """A late attempt (its claim superseded, or the row settled meanwhile) whose outcome is
        unknown: it writes no outcome, but its request may still land, so the row remembers it
        (only ever later). Not a state change: status, claim and attempts are left alone."""
        return self.update(last_unknown_at=later_unknown(at))

    # -- the drain's writes for a deactivation that first finds what the registry holds (a
    # suspend after a register was attempted: handle unknown, `handle=""`) --------------------------

    def _finding(self, token):
        return self._held(
            token, Registration.Status.PENDING, operation=Registration.Operation.DEACTIVATE
        ).filter(handle="")

    def mark_found_deactivated(self, *, token, handle: str, now: datetime) -> bool:
        """The registry held a registration of ours, now deactivated (or already gone); and no
        register of ours can still land (settled)."""
        return (
            self._finding(token)
            .filter(settled(now))
            .update(status=Registration.Status.DEACTIVATED, handle=handle, claim_token=None, last_error="")
            == 1
        )

    def mark_found_absent(self, *, token, now: datetime, note: str) -> bool:
        """The registry holds nothing of ours (an exhaustive lookup; or what it held it rejected),
        and no register of ours can still land (settled): the withdrawal is complete."""
        return (
            self._finding(token)
            .filter(settled(now))
            .update(status=Registration.Status.SUSPENDED, claim_token=None, last_error="", note=note)
            == 1
        )

    def mark_finding_waits(
        self, *, token, retry_at: datetime, correlation_id: str = "", error: str = ""
    ) -> bool:
        """Look again at retry_at: the registry is still checking what it holds (`correlation_id`,
        checked directly next time), or a register of ours may still land (the settle window)."""
        return (
            self._finding(token).update(
                next_attempt_at=retry_at,
                claim_token=None,
                correlation_id=correlation_id or F("correlation_id"),
                last_error=storable(error),
            )
            == 1
        )

    # -- people's and the lifecycle's writes -------------------------------------------------------

    def abandon(self, *, actor: str, reason: str, now: datetime, seen: "Registration") -> bool:
        """Give up a registration the registry provably never accepted. Takes the row only
        while it is a pending register, has been attempted, is backed off (not due), no claim
        holds it, and it is still the row `seen` before the registry was asked: the same
        attempts and next_attempt_at. Attempts are counted at claim, so an attempt claimed
        during the lookup (whose register may have reached the registry after the lookup read
        past it) voids the registry's answer. And only once settled: no attempt whose outcome is
        unknown (a register that may still land) is younger than ODAL_REGISTRY_SETTLE_SECONDS."""
        return (
            self.filter(
                status=Registration.Status.PENDING,
                operation=Registration.Operation.REGISTER,
                attempts__gte=1,
                next_attempt_at__gt=now,
                claim_token__isnull=True,
                attempts=seen.attempts,
                next_attempt_at=seen.next_attempt_at,
            )
            .filter(settled(now))
            .update(
                status=Registration.Status.ABANDONED,
                note=f"abandoned by {actor}: {reason}",
                abandoned_at=now,
            )
            == 1
        )

    def record_handle(
        self, *, handle: str, actor: str, reason: str, now: datetime, seen: "Registration"
    ) -> bool:
        """A person read the handle off the registry: submitted -> registered, only while the row
        is still the submission they saw (same request id, no check claimed since)."""
        return (
            self.filter(
                status=Registration.Status.SUBMITTED,
                correlation_id=seen.correlation_id,
                attempts=seen.attempts,
            ).update(
                status=Registration.Status.REGISTERED,
                handle=handle,
                claim_token=None,
                note=f"handle recorded by {actor}: {reason}",
                registered_at=now,
            )
            == 1
        )

    def record_finding_handle(
        self, *, handle: str, actor: str, reason: str, now: datetime, seen: "Registration"
    ) -> bool:
        """A person found the registration in the registry's own portal for a deactivation whose
        finding cannot search the registry: the drain deactivates by that handle next (due now,
        its attempts counted afresh). Takes the row only while it is such a finding (pending
        deactivate, handle unknown, no claim, its last attempt found the registry unsearchable),
        no attempt was claimed since the person read it (`seen`'s attempts), and no register of
        ours can still land (settled): until then the portal shows not all the registry will hold."""
        return (
            self.filter(
                status=Registration.Status.PENDING,
                operation=Registration.Operation.DEACTIVATE,
                handle="",
                claim_token__isnull=True,
                attempts=seen.attempts,
                last_error__startswith=UNSEARCHABLE,
            )
            .filter(settled(now))
            .update(
                handle=handle,
                attempts=0,
                next_attempt_at=now,
                queued_at=now,
                last_error="",
                note=f"handle recorded by {actor}: {reason}",
            )
            == 1
        )

    def requeue(self, *, now: datetime) -> int:
        """Publishing again: a rejected, abandoned, suspended or deactivated row owes a
        registration afresh. Pending, submitted and registered rows are left alone."""
        return self.filter(
            status__in=[
                Registration.Status.REJECTED,
                Registration.Status.ABANDONED,
                Registration.Status.SUSPENDED,
                Registration.Status.DEACTIVATED,
            ]
        ).update(status=Registration.Status.PENDING, **owed_afresh(Registration.Operation.REGISTER, now))

    def cancel_deactivation(self, *, token=None) -> int:
        """The passport is published again while a deactivation that never reached the registry is
        owed: the registration stands. From publishing: no attempt made (attempts 0, no claim).
        From the drain, which found the passport published before it asked: only its own attempt
        counted (attempts 1, its claim). Only a deactivation of a registration the registry granted
        (its handle known): one that was still to find what the registry holds has no registration
        to stand on. A deactivation attempted before may have gone through with its reply lost:
        `reregister` handles those, and those still finding."""
        return (
            self.filter(
                status=Registration.Status.PENDING,
                operation=Registration.Operation.DEACTIVATE,
                claim_token=token,
                attempts=0 if token is None else 1,
            )
            .exclude(handle="")
            .update(
                status=Registration.Status.REGISTERED,
                operation=Registration.Operation.REGISTER,
                claim_token=None,
                last_error="",
            )
        )

    def reregister(self, *, now: datetime, token=None) -> int:
        """The passport is published again while a deactivation that was attempted is owed: the
        registry may or may not still hold the registration (a reply may have been lost), so a
        fresh register follows, due now (a registry that still holds it answers DUPLICATE_UPI,
        which is adopted). From publishing: no claim holds the row; from the drain: its claim.
        The register starts at one attempt, not none: the registry may hold what the row's
        earlier writes left there, so a suspend before the drain gets to it must find that, not
        withdraw the row as never sent (withdraw_unsent, mark_withdrawn)."""
        return self.filter(
            Q(attempts__gte=1 if token is None else 2) | Q(handle=""),
            status=Registration.Status.PENDING,
            operation=Registration.Operation.DEACTIVATE,
            claim_token=token,
        ).update(**{**owed_afresh(Registration.Operation.REGISTER, now), "attempts": 1})

    def withdraw_unsent(self, *, now: datetime) -> int:
        """Suspending: a pending register never attempted (attempts 0: none claimed, or each given
        back unsent; so no claim holds it either, a claim counts its attempt), with no outcome
        unknown still settling, becomes suspended: the registry cannot hold it. (One attempted is
        find_and_deactivate's; one an attempt holds is left to the drain, which withdraws it, or
        finds it, when it reports.)"""
        return (
            self.filter(
                status=Registration.Status.PENDING,
                operation=Registration.Operation.REGISTER,
                attempts=0,
            )
            .filter(settled(now))
            .update(status=Registration.Status.SUSPENDED)
        )

    def queue_deactivation(self, *, now: datetime) -> int:
        """Suspending a registered passport: owe the registry a deactivation, due now."""
        return self.filter(status=Registration.Status.REGISTERED).update(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.DEACTIVATE,
            attempts=0,
            next_attempt_at=now,
            queued_at=now,
            claim_token=None,
            last_error="",
        )

    def stalled(self, *, now: datetime | None = None):
        """Pending rows that need a person: many attempts, owed for over a day, or a register whose
        DUPLICATE_UPI named a registration the registry deactivated (not adopted: only a person
        can get the registry to let the UPI go)."""
        now = now or timezone.now()
        return self.filter(status=Registration.Status.PENDING).filter(
            Q(attempts__gte=settings.ODAL_REGISTRY_STALL_ATTEMPTS)
            | Q(queued_at__lt=now - timedelta(days=1))
            | Q(operation=Registration.Operation.REGISTER, last_error__startswith=NOT_ADOPTED)
        )


class Registration(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending (owes the registry a write)"
        SUBMITTED = "submitted", "submitted (the registry is checking)"
        REGISTERED = "registered"
        REJECTED = "rejected"
        SUSPENDED = "suspended", "suspended (withdrawn before the registry accepted it)"
        DEACTIVATED = "deactivated"
        ABANDONED = "abandoned", "abandoned (given up by a person)"

    class Operation(models.TextChoices):
        REGISTER = "register"
        DEACTIVATE = "deactivate"

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    passport = models.OneToOneField(Passport, on_delete=models.PROTECT, related_name="registration")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    operation = models.CharField(max_length=16, choices=Operation.choices, default=Operation.REGISTER)
    attempts = models.PositiveIntegerField(default=0, help_text="Counted when an attempt is claimed.")
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    correlation_id = models.CharField(
        max_length=500, blank=True, default="", help_text="The registry's requestId."
    )
    handle = models.CharField(
        max_length=500, blank=True, default="", help_text="The registry's registrationId."
    )
    last_error = models.TextField(blank=True, default="")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    queued_at = models.DateTimeField(default=timezone.now, help_text="When the current work was owed.")
    submitted_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    abandoned_at = models.DateTimeField(null=True, blank=True)
    last_unknown_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the last attempt whose outcome is unknown ended (its request may have reached "
        "the registry with no answer back): absence in the task list proves nothing until "
        "ODAL_REGISTRY_SETTLE_SECONDS after it.",
    )

    objects = RegistrationQuerySet.as_manager()

    class Meta:
        ordering = ["-queued_at"]
        indexes = [
            # Serves the drain's due scan and claim: status IN ('pending', 'submitted') AND
            # next_attempt_at <= now. A claim pushes next_attempt_at past now.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=["pending", "submitted"]),
                name="registration_due_idx",
            ),
            models.Index(fields=["status"], name="registration_status_idx"),
        ]
        permissions = [
            ("abandon_registration", "Can abandon registrations"),
            ("record_handle", "Can record registry handles"),
        ]

    def __str__(self) -> str:
        return f"{self.passport.upi} ({self.status})"

    @property
    def settles_at(self) -> datetime | None:
        """From when a lookup that finds nothing proves absence (None: already)."""
        if self.last_unknown_at is None:
            return None
        at = self.last_unknown_at + timedelta(seconds=settings.ODAL_REGISTRY_SETTLE_SECONDS)
        return at if at > timezone.now() else None

    @property
    def finds_first(self) -> bool:
        """A deactivation whose registration's handle is unknown: it finds what the registry holds."""
        return self.operation == Registration.Operation.DEACTIVATE and not self.handle

    def claim_is_live(self, now: datetime) -> bool:
        """An attempt holds the row: claimed, and its hold has not run out (then it is due again)."""
        return self.claim_token is not None and self.next_attempt_at > now


class RegistrationAttempt(models.Model):
    """One line of a registration's attempt log: what the drain asked and what the registry
    answered, late answers included. Never changed once written."""

    WRITE_ERROR = "write_error"  # the outcome the database refused (the answer says which and why)
    RATE_LIMITED = "rate_limited"  # a 429: the attempt was given back (the next one has its number)
    UNKNOWN = "unknown"  # the request may have reached the registry; no answer of its own came back

    registration = models.ForeignKey(Registration, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    claim_token = models.UUIDField()
    operation = models.CharField(max_length=16)  # register, check, deactivate
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=32)  # submitted, duplicate, registered, rejected, checking,
    # failed (the registry's own refusal or unavailability, or no connection), unknown (UNKNOWN), ...
    answer = models.TextField(blank=True, default="")
    late = models.BooleanField(default=False)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [
            models.Index(fields=["registration", "started_at"], name="regattempt_by_registration_idx"),
            # Serves retention's walk (outbox.retention): finished_at < cutoff, in (finished_at, id)
            # order, a batch at a time from where the last one stopped.
            models.Index(fields=["finished_at", "id"], name="regattempt_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.operation} #{self.number}: {self.outcome}{' (late)' if self.late else ''}"


class StalledRegistration(Registration):
    """Pending registrations that need a person, as their own list in the admin."""

    class Meta:
        proxy = True
        verbose_name = "stalled registration"
        verbose_name_plural = "stalled registrations"


LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


class RegistryPaceQuerySet(models.QuerySet):
    """The writes of RegistryPace's one row (made on first use: a test's flush empties the table)."""

    def book(
        self, *, slots: int, interval: timedelta, now: datetime, before: datetime | None = None
    ) -> datetime | None:
        """Book `slots` requests, `interval` apart, after every slot booked before (by any drain
        process) and after any pause: one UPDATE, whose row lock puts concurrent bookings one
        after the other. Returns when the first of them may go out; None, booking nothing, when
        that would not be before `before` (a claim's hold ends first: a slot never used would
        still push every drain's later ones back)."""
        self.get_or_create(pk=1)
        rows = self.filter(pk=1)
        if before is not None:
            rows = rows.filter(next_slot_at__lt=before, paused_until__lt=before)
            if now >= before:
                return None
        with transaction.atomic():
            after = Greatest(F("next_slot_at"), F("paused_until"), Value(now))
            if not rows.update(next_slot_at=after + interval * slots):
                return None
            return self.filter(pk=1).values_list("next_slot_at", flat=True).get() - interval * slots

    def schedule(self) -> tuple[datetime, datetime]:
        """(the end of the pause a 429 asked for, the rate limit's first free slot)."""
        row = self.filter(pk=1).values_list("paused_until", "next_slot_at").first()
        return row or (LONG_AGO, LONG_AGO)

    def pause(self, *, until: datetime, reason: str) -> bool:
        """A 429 asked every client to wait until `until`: every drain, in every process, sends
        nothing before then. Only ever lengthens a pause (a shorter Retry-After answered later
        does not cut one short). Returns whether it lengthened it."""
        self.get_or_create(pk=1)
        return (
            self.filter(pk=1, paused_until__lt=until).update(
                paused_until=until, pause_reason=storable(reason, 500)
            )
            == 1
        )


class RegistryPace(models.Model):
    """How fast every drain, in every process on every machine, may send to the registry
    (registry.pace): the next free slot of ODAL_REGISTRY_RATE_PER_SECOND, and the end of a pause a
    429 asked for. One row."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    next_slot_at = models.DateTimeField(
        default=LONG_AGO,
        help_text="The rate limit's first free slot: the next booking starts here, or later.",
    )
    paused_until = models.DateTimeField(default=LONG_AGO, help_text="Every drain waits until then.")
    pause_reason = models.TextField(blank=True, default="", help_text="The 429 that asked for the pause.")

    objects = RegistryPaceQuerySet.as_manager()

    def __str__(self) -> str:
        return f"registry pace (paused until {self.paused_until:%Y-%m-%d %H:%M:%S})"
