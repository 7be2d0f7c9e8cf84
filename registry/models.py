"""The registry outbox: one Registration per passport, the work this node owes the EU DPP
registry for it, and the log of every attempt at that work."""

import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from odal.models import Passport
from odal.text import storable
from outbox.claims import ClaimQuerySet


class RegistrationQuerySet(ClaimQuerySet):
    claimable_statuses = ("pending", "submitted")

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

    def mark_withdrawn(self, *, token) -> bool:
        """The drain found the passport no longer published before it asked the registry:
        a register the registry never saw from this attempt becomes suspended."""
        return (
            self._held(token, Registration.Status.PENDING, operation=Registration.Operation.REGISTER).update(
                status=Registration.Status.SUSPENDED, claim_token=None
            )
            == 1
        )

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

    def mark_attempt_failed(self, *, token, error: str, retry_at: datetime) -> bool:
        """The registry could not be reached or answered 5xx: try again at retry_at."""
        return (
            self._held(token, Registration.Status.PENDING, Registration.Status.SUBMITTED).update(
                next_attempt_at=retry_at, claim_token=None, last_error=storable(error)
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
        past it) voids the registry's answer."""
        return (
            self.filter(
                status=Registration.Status.PENDING,
                operation=Registration.Operation.REGISTER,
                attempts__gte=1,
                next_attempt_at__gt=now,
                claim_token__isnull=True,
                attempts=seen.attempts,
                next_attempt_at=seen.next_attempt_at,
            ).update(
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
        ).update(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.REGISTER,
            attempts=0,
            next_attempt_at=now,
            queued_at=now,
            claim_token=None,
            correlation_id="",
            handle="",
            last_error="",
        )

    def cancel_deactivation(self, *, token=None) -> int:
        """The passport is published again while a deactivation that never reached the registry is
        owed: the registration stands. From publishing: no attempt made (attempts 0, no claim).
        From the drain, which found the passport published before it asked: only its own attempt
        counted (attempts 1, its claim). A deactivation attempted before may have gone through
        with its reply lost: `reregister` handles those."""
        return self.filter(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.DEACTIVATE,
            claim_token=token,
            attempts=0 if token is None else 1,
        ).update(
            status=Registration.Status.REGISTERED,
            operation=Registration.Operation.REGISTER,
            claim_token=None,
            last_error="",
        )

    def reregister(self, *, now: datetime, token=None) -> int:
        """The passport is published again while a deactivation that was attempted is owed: the
        registry may or may not still hold the registration (a reply may have been lost), so a
        fresh register follows, due now (a registry that still holds it answers DUPLICATE_UPI,
        which is adopted). From publishing: no claim holds the row; from the drain: its claim."""
        return self.filter(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.DEACTIVATE,
            claim_token=token,
            attempts__gte=1 if token is None else 2,
        ).update(
            operation=Registration.Operation.REGISTER,
            attempts=0,
            next_attempt_at=now,
            queued_at=now,
            claim_token=None,
            correlation_id="",
            handle="",
            last_error="",
        )

    def withdraw_unsent(self, *, now: datetime) -> int:
        """Suspending: a pending register that no attempt holds becomes suspended. (One that an
        attempt holds is left to the drain, which withdraws or deactivates it when it reports.)"""
        return self.filter(
            status=Registration.Status.PENDING,
            operation=Registration.Operation.REGISTER,
            claim_token__isnull=True,
        ).update(status=Registration.Status.SUSPENDED)

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
        """Pending rows that need a person: many attempts, or owed for over a day."""
        now = now or timezone.now()
        return self.filter(status=Registration.Status.PENDING).filter(
            Q(attempts__gte=settings.ODAL_REGISTRY_STALL_ATTEMPTS) | Q(queued_at__lt=now - timedelta(days=1))
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

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
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
    def claim_is_live(self) -> bool:
        return self.claim_token is not None and self.next_attempt_at > timezone.now()


class RegistrationAttempt(models.Model):
    """One line of a registration's attempt log: what the drain asked and what the registry
    answered, late answers included. Never changed once written."""

    WRITE_ERROR = "write_error"  # the outcome the database refused (the answer says which and why)
    RATE_LIMITED = "rate_limited"  # a 429: the attempt was given back (the next one has its number)

    registration = models.ForeignKey(Registration, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    claim_token = models.UUIDField()
    operation = models.CharField(max_length=16)  # register, check, deactivate
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=32)  # submitted, duplicate, registered, rejected, checking, ...
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

    def paused_until(self) -> datetime:
        return self.filter(pk=1).values_list("paused_until", flat=True).first() or LONG_AGO


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
