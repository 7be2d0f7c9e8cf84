"""The event outbox: consumers, events, one delivery per event and subscribed consumer, and the
log of every attempt."""

import base64
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connection, models, transaction
from django.db.models import Exists, F, OuterRef, Value
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Concat, Least
from django.utils import timezone

from odal.core import rules
from odal.core.errors import Refused
from odal.core.ids import uuid7
from odal.core.models import AuditEntry
from odal.core.reasons import clean_reason
from odal.core.text import storable
from odal.work.claims import ClaimQuerySet, database_now
from odal.work.wake import SWEEP

# Rows per transaction of a bulk write (replay, resend, unpark, a consumer's removal): a million
# rows is a thousand short transactions, each holding its locks for a moment, never one.
BULK_BATCH = 1_000


def new_secret() -> str:
    """A Standard Webhooks secret: whsec_ and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def default_max_attempts() -> int:
    return settings.ODAL_MAX_ATTEMPTS


class ConsumerQuerySet(models.QuerySet):
    """Every change of a consumer's state (pause, resume, the failure streak, the automatic and the
    allow-list pauses, settings, rotation, removal) is one method here: one filtered write whose
    WHERE states all that must still hold, answering whether it took the row. The operations
    around them (reasons, audit, events, parked deliveries) are outbox.service's. Each write of
    what the API shows of a consumer counts a `version` (its ETag)."""

    def python_outside(self, allowed: tuple[str, ...]):
        """Python consumers whose target no entry of `allowed` (ODAL_PYTHON_CONSUMERS) names, as
        odal.core.rules.python_allow_list_names reads the list."""
        paths, prefixes = rules.python_allow_list_names(allowed)
        named = models.Q(target__in=paths)
        for prefix in prefixes:
            named |= models.Q(target__startswith=prefix)
        return self.filter(kind=Consumer.Kind.PYTHON).exclude(named)

    def pause(self, *, by: str, reason: str, at: datetime) -> bool:
        """Pause a consumer a person (or odal) stops: only while it is not paused yet, so a second
        pause writes nothing and the first one's who and why stay. Returns whether it took."""
        return self.filter(paused=False).update(**_paused(by=by, reason=reason, at=at)) == 1

    def resume(self, *, allowed: tuple[str, ...]) -> bool:
        """Resume a paused consumer, with a fresh failure streak: only while it is paused, and never
        one whose Python target `allowed` (ODAL_PYTHON_CONSUMERS) does not name (it would be
        called), whatever the caller read of its target. Returns whether it took."""
        outside = Consumer.objects.python_outside(allowed).values("pk")
        return (
            self.filter(paused=True)
            .exclude(pk__in=outside)
            .update(
                paused=False,
                paused_reason="",
                paused_by="",
                paused_at=None,
                failing_since=None,
                failures=0,
                version=F("version") + 1,
            )
            == 1
        )

    def extend_failure_streak(self, *, failures: int, first_failure_at: datetime) -> bool:
        """Count `failures` more failed attempts in a row; a consumer with no streak starts one at
        `first_failure_at`. Relative (F, Coalesce): two sweeps counting at once both count, and the
        streak keeps its earliest start. Returns whether it took the row (it exists)."""
        return (
            self.update(
                failing_since=Coalesce(F("failing_since"), Value(first_failure_at)),
                failures=F("failures") + failures,
            )
            == 1
        )

    def end_failure_streak(self) -> bool:
        """A success ends the streak: only while one runs, so a healthy consumer's pass takes no row
        (and takes no lock). Returns whether it took."""
        return self.filter(failing_since__isnull=False).update(failing_since=None, failures=0) == 1

    def auto_pause(self, *, reason: str, at: datetime, after: timedelta, min_failures: int, by: str) -> bool:
        """odal pauses a consumer whose every attempt failed: only while it is not paused yet and
        its streak, as the database has it now (not as the caller read it), began at least `after`
        before `at` and counts at least `min_failures` attempts. Returns whether it took."""
        return (
            self.filter(paused=False, failing_since__lte=at - after, failures__gte=min_failures).update(
                **_paused(by=by, reason=reason, at=at)
            )
            == 1
        )

    def pause_outside(
        self, allowed: tuple[str, ...], *, by: str, reason: str, now: datetime
    ) -> dict[int, str]:
        """Pause every Python consumer not paused yet whose target `allowed` does not name, in one
        UPDATE whose filter restates all three (kind, not paused, target outside), so a consumer
        paused or changed to an allowed target meanwhile is left alone. The rows are locked
        first, so those read are exactly those the UPDATE takes (FOR NO KEY UPDATE, as the UPDATE
        itself locks: a publish's key-share lock on a consumer does not wait for it). Returns
        {id: target} taken."""
        with transaction.atomic(savepoint=False):
            outside = self.python_outside(allowed).filter(paused=False)
            taken = dict(outside.select_for_update(no_key=True).values_list("pk", "target"))
            if taken:
                Consumer.objects.filter(pk__in=taken).python_outside(allowed).filter(paused=False).update(
                    **_paused(by=by, reason=reason, at=now)
                )
        return taken

    def change_settings(self, *, version: int, **changes) -> bool:
        """Write `changes` (url, target, event types, budget, timeout) only while the row is still
        at `version`, the one they were read or shown at, and count a new version. False: someone
        else changed it meanwhile; nothing written (the "was" values read before stay true)."""
        return self.filter(version=version).update(**changes, version=F("version") + 1) == 1

    def rotate_secret(self, *, secret: str, new: str, grace_until: datetime | None, now: datetime) -> bool:
        """Replace `secret` (the one read) by `new`. With a grace (`grace_until`), only while no
        earlier rotation's grace still runs: a secret announced valid until its
        previousSecretExpiresAt is never dropped before then (the caller answers
        rotation_in_progress). Without one (a leaked secret), every older secret stops signing at
        once: that is how a grace is ended early. Returns whether it took the row."""
        rows = self.filter(secret=secret)
        if grace_until is not None:
            rows = rows.filter(models.Q(previous_secret_expires_at__isnull=True)
                               | models.Q(previous_secret_expires_at__lte=now))  # fmt: skip
        return (
            rows.update(
                secret=new,
                previous_secret=secret if grace_until else "",
                previous_secret_expires_at=grace_until,
                version=F("version") + 1,
            )
            == 1
        )

    def remove(self) -> bool:
        """Delete a consumer that has no delivery left (its settled ones deleted first, see
        outbox.service.remove_consumer). The row is locked first: a publish fanning out to it holds
        a key-share lock on it until it commits, so its delivery is seen by the DELETE, which
        restates that none exists. Returns whether it took the row (False: a delivery was made
        meanwhile, or the consumer is gone already)."""
        with transaction.atomic(savepoint=False):
            ids = list(self.select_for_update().values_list("pk", flat=True))
            owed = Exists(Delivery.objects.filter(consumer_id=OuterRef("pk")))
            _, deleted = Consumer.objects.filter(pk__in=ids).exclude(owed).delete()
        return deleted.get(Consumer._meta.label, 0) == 1


def _paused(*, by: str, reason: str, at: datetime) -> dict:
    """What every pause writes (a person's, the automatic one, the allow-list's)."""
    return {
        "paused": True,
        "paused_by": by,
        "paused_reason": reason,
        "paused_at": at,
        "version": F("version") + 1,
    }


class Consumer(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        PYTHON = "python"

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WEBHOOK)
    url = models.URLField(
        max_length=2000, blank=True, default="", help_text="Webhook consumers: where to POST."
    )
    target = models.CharField(
        max_length=200, blank=True, default="", help_text="Python consumers: dotted path of a callable."
    )
    secret = models.CharField(max_length=100, default=new_secret, editable=False)
    event_types = models.JSONField(
        default=list,
        blank=True,
        help_text='Event types it receives: exact names or prefixes like "passport.*"; empty means all.',
    )
    max_attempts = models.PositiveIntegerField(default=default_max_attempts)
    timeout_seconds = models.PositiveIntegerField(default=10)
    # Paused: its deliveries are still created, but parked (status paused): none is claimed, none
    # spends an attempt, none is dead-lettered; on resume they flow in creation order.
    paused = models.BooleanField(default=False)
    paused_reason = models.TextField(blank=True, default="", editable=False)
    paused_by = models.CharField(max_length=200, blank=True, default="", editable=False)
    paused_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Automatic pause: since when every attempt failed, and how many did (reset by a success).
    failing_since = models.DateTimeField(null=True, blank=True, editable=False)
    failures = models.PositiveIntegerField(default=0, editable=False)
    # Secret rotation: the secret before the last rotation, still signing until it expires.
    previous_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Counts every write of what the API shows of it (settings, pause, rotation): the ETag of
    # GET outbox/consumers/{name}, checked by PATCH's If-Match and by the admin's change form.
    version = models.PositiveIntegerField(default=1, editable=False)

    objects = ConsumerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        permissions = [("pause_consumer", "Can pause and resume consumers")]

    def __str__(self) -> str:
        return self.name

    def wants(self, event_type: str) -> bool:
        if not self.event_types:
            return True
        for pattern in self.event_types:
            if pattern == "*" or pattern == event_type:
                return True
            if pattern.endswith(".*") and event_type.startswith(pattern[:-1]):
                return True
        return False


def paused_consumers():
    """The ids of paused consumers, as a subquery (a handful of rows)."""
    return Consumer.objects.filter(paused=True).values("pk")


class Event(models.Model):
    """Created in the same transaction as the change it reports (see outbox.events.emit)."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    type = models.CharField(max_length=100, db_index=True)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("post_event", "Can post events through the API")]
        # The events of a passport (its id in the payload, as every passport event carries it):
        # the deliveries admin's search by passport id or UPI (issue 26).
        indexes = [models.Index(KT("payload__dppId"), name="event_dpp_idx")]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


@dataclass(frozen=True)
class Failure:
    """One failed attempt to settle (DeliveryQuerySet.mark_attempts_failed_each)."""

    delivery_id: uuid.UUID
    error: str
    retry_at: datetime
    at: datetime


class DeliveryQuerySet(ClaimQuerySet):
    claimable_statuses = ("pending",)

    def claimable(self, now):
        # A due row whose attempts are spent is dead-lettered by the sweep, never claimed again;
        # a paused consumer's rows wait (the sweep parks them, see park_paused).
        return (
            self.due(now).filter(attempts__lt=F("max_attempts")).exclude(consumer_id__in=paused_consumers())
        )

    def park_paused(self, *, now=None) -> int:
        """Park the pending rows of paused consumers (status paused) that no live claim holds
        (by the database's clock, unless `now` says otherwise): rows made due again while their
        consumer was pausing, a failure written after it paused, a replayed dead letter. Served by
        the (consumer, status) index; nothing to do while no consumer is paused. Returns how many
        it parked."""
        now = database_now(self.db) if now is None else now
        return (
            self.filter(status=Delivery.Status.PENDING, consumer_id__in=paused_consumers())
            .filter(models.Q(claim_token__isnull=True) | models.Q(next_attempt_at__lte=now))
            .update(status=Delivery.Status.PAUSED, claim_token=None)
        )

    def resumed_consumers_with_parked_rows(self) -> list[int]:
        """Consumers not paused that still have parked rows: a row parked by a transaction that
        committed after the resume had unparked (a publish or a failure that read the consumer
        as paused). One index probe per consumer (delivery_paused_idx)."""
        parked = Delivery.objects.filter(status=Delivery.Status.PAUSED, consumer_id=OuterRef("pk"))
        return list(Consumer.objects.filter(paused=False).filter(Exists(parked)).values_list("pk", flat=True))

    def unpark(self, *, consumer_id: int, limit: int = BULK_BATCH) -> int:
        """Resume up to `limit` parked rows of a consumer that is no longer paused: pending, due
        in the order they were created (their next attempt is their creation time), each with at
        least one attempt left. Guarded: only rows still parked, of a consumer not paused."""
        ids = list(
            self.filter(status=Delivery.Status.PAUSED, consumer_id=consumer_id)
            .order_by("created_at")
            .values_list("pk", flat=True)[:limit]
        )
        if not ids:
            return 0
        return (
            Delivery.objects.filter(pk__in=ids, status=Delivery.Status.PAUSED)
            .exclude(consumer_id__in=paused_consumers())
            .update(
                status=Delivery.Status.PENDING,
                next_attempt_at=F("created_at"),
                attempts=Least(F("attempts"), F("max_attempts") - 1),
            )
        )

    def _held(self, token: uuid.UUID):
        """The guard of every terminal write: the row is still pending and still held by the
        caller's claim. A late writer (its claim superseded, or the row settled) matches nothing."""
        return self.filter(status=Delivery.Status.PENDING, claim_token=token)

    def mark_delivered_each(self, *, token: uuid.UUID, at: datetime) -> set:
        """End the current attempt of every row of this queryset as delivered, in one UPDATE …
        RETURNING under _held's guard, checked on each row after any lock wait. Returns the ids
        it took (the others were late)."""
        delivered = {
            "status": Delivery.Status.DELIVERED,
            "delivered_at": at,
            "claim_token": None,
            "last_error": "",
        }
        return self._held(token).update_returning_ids(delivered)

    def mark_attempts_failed_each(self, *, token: uuid.UUID, failures: "list[Failure]") -> set:
        """End each row's current attempt as failed, with its own error: parked if its consumer is
        paused, else dead once the attempts counted at claim reach max_attempts, else due at
        retry_at. One UPDATE … FROM unnest(…), the guard (_held, this queryset's filter) checked on
        each row after any lock wait. Returns the ids it took (the others were late)."""
        if not failures:
            return set()
        # The claim's token is a column of the failures, not a constant: PostgreSQL estimates
        # one row for a constant token (no statistics know it), and for one row it joins by
        # scanning the 500 failures once per delivery (250,000 comparisons, 55 ms a flush of
        # 500). Compared per row, the join is a hash or merge join of the failures with the
        # deliveries their ids find (id = ANY, by the primary key): a few ms at any size.
        held = self._held(RawSQL("failure.token", ())).query
        if any(count for alias, count in held.alias_refcount.items() if alias != held.base_table):
            raise ValueError("mark_attempts_failed_each needs a queryset without joins")
        try:
            guard, guard_params = held.get_compiler(self.db).compile(held.where)
        except EmptyResultSet:  # (a queryset that can match nothing: .none(), pk__in=[])
            return set()
        table = connection.ops.quote_name(Delivery._meta.db_table)
        consumers = connection.ops.quote_name(Consumer._meta.db_table)
        paused = f"EXISTS (SELECT 1 FROM {consumers} c WHERE c.id = {table}.consumer_id AND c.paused)"
        spent = f"{table}.attempts >= {table}.max_attempts"
        ids = [str(f.delivery_id) for f in failures]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET "
                f"status = CASE WHEN {paused} THEN %s WHEN {spent} THEN %s ELSE %s END, "
                f"dead_at = CASE WHEN {paused} THEN NULL WHEN {spent} THEN failure.at END, "
                "next_attempt_at = failure.retry_at, claim_token = NULL, last_error = failure.error "
                "FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::uuid[]) "
                "AS failure(id, error, retry_at, at, token) "
                f"WHERE {table}.id = failure.id AND {table}.id = ANY(%s::uuid[]) AND {guard} "
                f"RETURNING {table}.id",
                [
                    Delivery.Status.PAUSED, Delivery.Status.DEAD, Delivery.Status.PENDING,
                    ids, [storable(f.error) for f in failures], [f.retry_at for f in failures],
                    [f.at for f in failures], [str(token)] * len(failures), ids, *guard_params,
                ],
            )  # fmt: skip
            return {row[0] for row in cursor.fetchall()}

    def note_late_success(self, *, at: datetime) -> bool:
        """A late attempt was answered 2xx at `at`: the consumer has it, whatever the row says (the
        dead-letter list and replay previews warn of a duplicate). A note on the row whatever its
        status, not a state change; it only moves forward. Returns whether it took the row."""
        newer = models.Q(late_success_at__isnull=True) | models.Q(late_success_at__lt=at)
        return self.filter(newer).update(late_success_at=at) == 1

    def copy_event_types(self, *, batch: int = 20_000, max_batches: int = 10) -> int:
        """Deliveries whose event_type is still '' get their event's type, in batches by primary
        key (at most `max_batches` a call): those a process of the release before migration
        outbox.0016 made after it ran (a rolling deploy), which the type filters would miss. By
        delivery_type_idx: nothing to do is one index probe. Returns how many it wrote."""
        written, after = 0, None
        for _ in range(max_batches):
            rows = self.filter(event_type="") if after is None else self.filter(event_type="", pk__gt=after)
            ids = list(rows.order_by("pk").values_list("pk", flat=True)[:batch])
            if not ids:
                break
            written += self.filter(pk__any=ids, event_type="").update(
                event_type=models.Subquery(Event.objects.filter(pk=OuterRef("event_id")).values("type")[:1])
            )
            after = ids[-1]
        return written

    def dead_answered_late(self):
        """Dead rows whose consumer answered a late attempt 2xx (note_late_success): what every
        replay or resend preview warns about."""
        return self.filter(status=Delivery.Status.DEAD, late_success_at__isnull=False)

    def dead_letter_exhausted(self, *, now=None) -> int:
        """Dead-letter due rows whose last counted attempt never reported (its worker died or
        hung past the hold), due by the database's clock unless `now` says otherwise. Returns how
        many it took."""
        now = database_now(self.db) if now is None else now
        return (
            self.due(now)
            .filter(attempts__gte=F("max_attempts"))
            .exclude(consumer_id__in=paused_consumers())  # parked instead (park_paused)
            .update(
                status=Delivery.Status.DEAD,
                dead_at=now,
                claim_token=None,
                last_error=Concat(
                    Value("attempt "),
                    Cast("attempts", models.CharField()),
                    Value(" never reported (its claim expired)"),
                    output_field=models.TextField(),
                ),
            )
        )

    def matching(
        self,
        *,
        statuses=None,
        consumer: str | None = None,
        event_type: str | None = None,
        dead_since: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ):
        """What a replay or resend by filter selects, on every surface: rows of `statuses` (None:
        any; replay and resend take only those they may), of the consumer named `consumer`, of
        `event_type`, dead at or after `dead_since`, created in [`since`, `until`). A consumer that
        does not exist is refused (422 unknown_consumer): a misspelt name must not read as
        "nothing to send"."""
        rows = self if statuses is None else self.filter(status__in=statuses)
        if consumer:
            if not Consumer.objects.filter(name=consumer).exists():
                raise Refused(
                    f"No consumer named {rules.shown(consumer)}.", code="unknown_consumer", status=422
                )
            rows = rows.filter(consumer__name=consumer)
        if event_type:
            rows = rows.filter(event_type=event_type)
        if dead_since:
            rows = rows.filter(dead_at__gte=dead_since)
        if since:
            rows = rows.filter(created_at__gte=since)
        if until:
            rows = rows.filter(created_at__lt=until)
        return rows

    def replay(self, *, actor: str, reason: str, at: datetime | None = None, **batching) -> int:
        """Dead -> pending with a fresh attempt budget, due now. Only dead rows are taken; one
        audit entry per row taken (who, why, previous attempts, last error, and lateSuccessAt:
        whether its consumer had answered 2xx late). Returns the count. late_success_at stays:
        the consumer did have it then, whatever becomes of the row."""
        return self._send_again(
            (Delivery.Status.DEAD,), "delivery_replayed", actor=actor, reason=reason, at=at, **batching
        )

    def resend(self, *, actor: str, reason: str, at: datetime | None = None, **batching) -> int:
        """Delivered or dead -> pending with a fresh attempt budget, due now: the consumer gets
        it again with the same webhook-id (it deduplicates as for any retry). Pending and paused
        rows are not taken (they are on their way). One audit entry per row taken."""
        return self._send_again(
            (Delivery.Status.DELIVERED, Delivery.Status.DEAD),
            "delivery_resent",
            actor=actor,
            reason=reason,
            at=at,
            **batching,
        )

    def _send_again(
        self,
        statuses: tuple,
        action: str,
        *,
        actor: str,
        reason: str,
        at: datetime | None,
        batch: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Send again, in batches of at most `batch` rows, each batch its own transaction with
        its audit entries, so a million rows is a thousand short transactions, never one lock set.
        Batches go on in primary-key order from where the last one stopped (a row sent again and
        dead again meanwhile is not taken twice) until one takes nothing. `progress(batches,
        total)` after each batch that committed. Returns the total taken."""
        reason = clean_reason(reason)
        at = at or timezone.now()
        batch = batch or BULK_BATCH  # read now, not at import: a test may lower it
        total = batches = 0
        after = None
        while True:
            rows = self if after is None else self.filter(pk__gt=after)
            taken, after = rows._send_again_batch(statuses, action, actor=actor, reason=reason, at=at,
                                                  batch=batch, done=total)  # fmt: skip
            if after is None:
                return total
            total += taken
            batches += 1
            if progress:
                progress(batches, total)

    def _send_again_batch(
        self, statuses: tuple, action: str, *, actor: str, reason: str, at: datetime, batch: int, done: int
    ) -> tuple[int, object]:
        """One batch of _send_again: (rows taken, the last primary key picked), or (0, None)
        when nothing is left to pick."""
        with transaction.atomic():
            before = list(
                self.filter(status__in=statuses)
                .order_by("pk")
                .select_for_update(of=("self",))
                .values(
                    "pk", "status", "attempts", "last_error", "dead_at", "delivered_at", "late_success_at"
                )[:batch]
            )
            if not before:
                return 0, None
            # Restates the filter and the status: only rows still matching are taken.
            taken = self.filter(pk__in=[row["pk"] for row in before], status__in=statuses).update(
                status=Delivery.Status.PENDING,
                attempts_before=F("attempts_before") + F("attempts"),
                attempts=0,
                next_attempt_at=at,
                dead_at=None,
                delivered_at=None,
                claim_token=None,
            )
            if taken != len(before):  # (locked rows: should a lock not hold) refuse, write nothing
                raise Refused(
                    "Some of these deliveries changed while they were being sent again; this batch "
                    f"was not changed ({done:,} sent again before it stay so). Try again.",
                    code="replay_conflict",
                )
            AuditEntry.objects.bulk_create(
                AuditEntry(
                    at=at,
                    actor=actor,
                    action=action,
                    object_type="outbox.delivery",
                    object_id=str(row["pk"]),
                    reason=reason,
                    details={
                        "previousStatus": row["status"],
                        "previousAttempts": row["attempts"],
                        "lastError": row["last_error"],
                        "deadAt": row["dead_at"].isoformat() if row["dead_at"] else None,
                        "deliveredAt": row["delivered_at"].isoformat() if row["delivered_at"] else None,
                        # The consumer had it already (a late 2xx): the trail says it was sent again anyway.
                        "lateSuccessAt": row["late_success_at"].isoformat()
                        if row["late_success_at"]
                        else None,
                    },
                )
                for row in before
            )
            SWEEP.on_commit()
        return taken, before[-1]["pk"]


class Delivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        DEAD = "dead"
        PAUSED = "paused", "paused (its consumer is paused)"

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # No index of their own: the unique (event, consumer) and the (consumer, status) indexes serve
    # them, and every index is one more entry to write each time the sweep updates a row.
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    consumer = models.ForeignKey(
        Consumer, on_delete=models.PROTECT, related_name="deliveries", db_index=False
    )
    # Its event's type, copied when the delivery is made (an event never changes): the lists
    # filtered by type walk delivery_type_idx, newest first, instead of joining every event.
    event_type = models.CharField(max_length=100, editable=False, db_default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0, help_text="Counted when an attempt is claimed.")
    # The attempts of the budgets before the last replay or resend: the budget starts afresh, the
    # attempt log's numbers go on (an attempt's number is attempts_before + attempts).
    attempts_before = models.IntegerField(
        default=0, db_default=0, editable=False
    )  # (no CHECK to validate over every row)
    max_attempts = models.PositiveIntegerField(default=default_max_attempts)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)
    late_success_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the consumer last answered 2xx to a late attempt (one whose claim was "
        "superseded or whose row was settled meanwhile): it has the delivery, whatever the status says.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["event", "consumer"], name="one_delivery_per_consumer")
        ]
        indexes = [
            # Serves the sweep's due scan and claim: status='pending' AND next_attempt_at <= now.
            # A claim pushes next_attempt_at past now, so rows in flight leave the scanned range.
            models.Index(
                fields=["next_attempt_at"], condition=models.Q(status="pending"), name="delivery_due_idx"
            ),
            # Serves dead_letter_exhausted: the few pending rows whose attempts are spent (their last
            # attempt in flight). Without it, each sweep pass would walk the whole due backlog.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending", attempts__gte=F("max_attempts")),
                name="delivery_spent_idx",
            ),
            # Serves the dead-letter list: status='dead' ordered by dead_at.
            models.Index(fields=["dead_at"], condition=models.Q(status="dead"), name="delivery_dead_idx"),
            # Serves counting paused rows and resuming them in creation order, per consumer.
            models.Index(
                fields=["consumer", "created_at"],
                condition=models.Q(status="paused"),
                name="delivery_paused_idx",
            ),
            models.Index(fields=["consumer", "status"], name="delivery_consumer_status_idx"),
            models.Index(fields=["-created_at", "-id"], name="delivery_listing_idx"),
            models.Index(fields=["event_type", "-created_at", "-id"], name="delivery_type_idx"),
        ]
        permissions = [("replay_delivery", "Can replay dead deliveries")]

    def __str__(self) -> str:
        return f"{self.event.type} → {self.consumer.name} ({self.status})"

    @property
    def number(self) -> int:
        """Its current attempt's number in the attempt log, on across replays (as the sweep's
        Claimed has it): a row read whole may stand where a claimed one does."""
        return self.attempts_before + self.attempts


class DeadLetter(Delivery):
    """Dead deliveries, as their own list in the admin (the dead-letter list)."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class DeliveryAttempt(models.Model):
    """One line of a delivery's attempt log, late writes included. Never changed once written."""

    class Outcome(models.TextChoices):
        DELIVERED = "delivered"
        FAILED = "failed"
        WRITE_ERROR = "write_error", "write error (the database refused the outcome)"

    delivery = models.ForeignKey(
        Delivery, on_delete=models.CASCADE, related_name="attempt_log", db_index=False
    )  # attempt_by_delivery_idx serves it
    # Its delivery's consumer, copied when the line is written (a delivery's consumer never
    # changes): a consumer's health (outbox.health) reads its own lines by attempt_by_consumer_idx
    # instead of joining every delivery. No constraint of its own (the delivery's holds, and a
    # consumer is removed only once it has no delivery left); null on lines written before it.
    consumer = models.ForeignKey(
        Consumer,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
    )
    number = models.PositiveIntegerField()
    claim_token = models.UUIDField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error = models.TextField(blank=True, default="")
    http_status = models.PositiveIntegerField(null=True, blank=True)
    answer = models.TextField(
        blank=True, default="", db_default="", help_text="An excerpt of the answer's body."
    )
    content_type = models.CharField(max_length=200, blank=True, default="", db_default="")
    duration_ms = models.PositiveIntegerField(default=0)
    late = models.BooleanField(
        default=False,
        help_text="The attempt outlived its claim: its outcome was not written to the delivery.",
    )

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [
            models.Index(fields=["delivery", "started_at"], name="attempt_by_delivery_idx"),
            # Serves a consumer's health (outbox.health): its last success and last failure (one
            # probe each), its newest lines of each outcome, and each outcome's lines of the last
            # 24 hours with their answer times (a range per outcome, read from the index alone).
            models.Index(
                fields=["consumer", "outcome", "finished_at"],
                include=["duration_ms"],
                name="attempt_by_consumer_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.outcome}{' (late)' if self.late else ''}"
