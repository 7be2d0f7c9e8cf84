"""The outbox's operations that every surface shares (the API, the admin, the dashboard, the
command line and /metrics call these, never their own copies).

Counts cost the same at ten thousand and at ten million deliveries: pending and dead rows are
counted from their partial indexes (sets that stay small while the outbox is healthy), and
delivered rows from the tally the writes keep (odal.core.tally), which retention never lowers.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.db.models import Count, Min
from django.utils import timezone

from odal.core import rules, tally
from odal.core.errors import Refused
from odal.core.models import AuditEntry
from odal.core.reasons import clean_reason
from odal.core.redact import redacted_url
from odal.core.text import excerpt, storable
from odal.work.wake import SWEEP, wake_up
from outbox.consumers import check_python_target, check_webhook_url, signing_secrets  # noqa: F401
from outbox.events import check_event_pattern, emit
from outbox.models import BULK_BATCH, Consumer, Delivery, DeliveryAttempt, new_secret

log = logging.getLogger(__name__)

STATUSES = tuple(Delivery.Status.values)


def outbox_counts() -> dict:
    """Deliveries per status, overall and per consumer, with the oldest pending delivery:

    ``{pending, delivered, dead, paused, deadLateSuccesses, oldestPendingAt, consumers: [{name,
    isPaused, pausedReason, pausedBy, pending, delivered, dead, paused, deadLateSuccesses,
    oldestPendingAt}]}``. Each status is a count (``paused``: deliveries parked while their
    consumer is paused); ``isPaused`` says whether the consumer is. ``delivered`` counts
    deliveries ever delivered (it includes those retention has since deleted); the others count
    the rows there now, from partial indexes. ``deadLateSuccesses``: the dead ones whose
    consumer answered 2xx to a late attempt (it has them; see note_late_success)."""
    consumers = {c.pk: c for c in Consumer.objects.all()}
    rows = {
        pk: {**dict.fromkeys(STATUSES, 0), "deadLateSuccesses": 0, "oldestPendingAt": None}
        for pk in consumers
    }
    for row in (
        Delivery.objects.filter(status=Delivery.Status.PENDING)
        .values("consumer_id")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
        .order_by()
    ):
        if row["consumer_id"] in rows:  # (a consumer made since the consumers were read waits a scrape)
            rows[row["consumer_id"]].update(pending=row["n"], oldestPendingAt=row["oldest"])
    for status in (Delivery.Status.DEAD, Delivery.Status.PAUSED):
        for row in (
            Delivery.objects.filter(status=status).values("consumer_id").annotate(n=Count("pk")).order_by()
        ):
            if row["consumer_id"] in rows:
                rows[row["consumer_id"]][status] = row["n"]
    for row in Delivery.objects.dead_answered_late().values("consumer_id").annotate(n=Count("pk")).order_by():
        if row["consumer_id"] in rows:
            rows[row["consumer_id"]]["deadLateSuccesses"] = row["n"]
    delivered = tally.totals("outbox.delivered")["outbox.delivered"]
    for key, n in delivered.items():
        if key.isdigit() and int(key) in rows:
            rows[int(key)]["delivered"] = n
    total = {key: sum(r[key] for r in rows.values()) for key in (*STATUSES, "deadLateSuccesses")}
    total["delivered"] = sum(delivered.values())  # a removed consumer's deliveries still happened
    oldest = min((r["oldestPendingAt"] for r in rows.values() if r["oldestPendingAt"]), default=None)
    return {
        **total,
        "oldestPendingAt": oldest,
        "consumers": [
            {
                "name": consumers[pk].name,
                "isPaused": consumers[pk].paused,
                "pausedReason": consumers[pk].paused_reason,
                "pausedBy": consumers[pk].paused_by,
                **rows[pk],
            }
            for pk in sorted(rows, key=lambda pk: consumers[pk].name)
        ],
    }


def oldest_pending_seconds(counts: dict, *, now: datetime | None = None) -> dict[str, float]:
    """{consumer name: age in seconds of its oldest pending delivery, 0 when it has none}."""
    now = now or timezone.now()
    return {
        c["name"]: max(0.0, (now - c["oldestPendingAt"]).total_seconds()) if c["oldestPendingAt"] else 0.0
        for c in counts["consumers"]
    }


# -- consumers ---------------------------------------------------------------------------------------

AUTO_PAUSE_MIN_FAILURES = 10  # an automatic pause needs at least this many failed attempts in a row
DEFAULT_GRACE = timedelta(hours=24)  # a rotated-out secret signs alongside the new one this long


def consumer_or_404(name: str) -> Consumer:
    consumer = Consumer.objects.filter(name=name).first()
    if consumer is None:
        raise Refused(f"No consumer named {rules.shown(name)}.", code="not_found", status=404)
    return consumer


def create_consumer(
    *, name, kind, url, target, event_types, max_attempts, timeout_seconds, actor
) -> Consumer:
    """Validate and create a consumer, audited. The API, the admin form and `odal outbox
    consumer add` call it."""
    if kind == Consumer.Kind.WEBHOOK:
        if not url:
            raise Refused("A webhook consumer needs a url.", code="invalid_consumer", status=422)
        url, target = check_webhook_url(url), ""
    else:
        if not target:
            raise Refused(
                "A python consumer needs a target (a dotted path).", code="invalid_consumer", status=422
            )
        target, url = check_python_target(target), ""
    event_types = list(dict.fromkeys(event_types))  # (each once: a list of 20,000 repeats is one)
    for pattern in event_types:
        check_event_pattern(pattern)
    fields = {"timeout_seconds": timeout_seconds}
    if max_attempts is not None:
        fields["max_attempts"] = max_attempts
    try:
        with transaction.atomic():
            consumer = Consumer.objects.create(
                name=name, kind=kind, url=url, target=target, event_types=list(event_types), **fields
            )
            AuditEntry.objects.record(
                actor=actor,
                action="consumer_created",
                obj=consumer,
                details={
                    "kind": kind,
                    "url": redacted_url(url),  # the trail is read by Viewers: no credentials in it
                    "target": target,
                    "eventTypes": list(event_types),
                },
            )
    except IntegrityError:
        raise Refused(f"A consumer named {name!r} already exists.", code="consumer_exists") from None
    return consumer


CHANGEABLE = {"url": "url", "event_types": "eventTypes", "timeout_seconds": "timeoutSeconds",
              "max_attempts": "maxAttempts", "target": "target"}  # fmt: skip


def change_consumer(
    consumer: Consumer, *, actor: str, reason: str = "", if_version: int | None = None, **changes
) -> Consumer:
    """Change a consumer's url (or target), event types, timeout or attempt budget, each
    checked as at creation; audited with what it was and what it became. Only what differs is
    written; nothing that differs, nothing written. Deliveries already made keep their budget.

    The write takes the row only while it is still at the version `consumer` was read at, so
    a change made meanwhile is never undone and every "was" in the audit is what it replaced.
    `if_version`: the version the caller saw (PATCH's If-Match, the admin form's); another is
    refused 412 precondition_failed. Without it, a change that lands between the read and the
    write is refused 409 consumer_changed."""
    unknown = set(changes) - set(CHANGEABLE)
    if unknown:
        raise Refused(
            f"These cannot be changed: {', '.join(sorted(unknown))}.", code="invalid_request", status=422
        )
    if if_version is not None and if_version != consumer.version:
        raise _stale(consumer)
    changes = {k: v for k, v in changes.items() if v is not None}
    if "url" in changes:
        if consumer.kind != Consumer.Kind.WEBHOOK:
            raise Refused("Only a webhook consumer has a url.", code="invalid_consumer", status=422)
        changes["url"] = check_webhook_url(changes["url"])
    if "target" in changes:
        if consumer.kind != Consumer.Kind.PYTHON:
            raise Refused("Only a python consumer has a target.", code="invalid_consumer", status=422)
        changes["target"] = check_python_target(changes["target"])
    if "event_types" in changes:
        changes["event_types"] = [check_event_pattern(p) for p in dict.fromkeys(changes["event_types"])]
    before = {k: getattr(consumer, k) for k in changes}
    differs = {k: v for k, v in changes.items() if before[k] != v}
    if not differs:
        return consumer
    with transaction.atomic():
        if not Consumer.objects.filter(pk=consumer.pk).change_settings(version=consumer.version, **differs):
            if if_version is not None:
                raise _stale(consumer)
            raise Refused(
                f"{consumer.name} was changed by someone else meanwhile; nothing was written. Read it "
                "again, then make your change.",
                code="consumer_changed",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="consumer_changed",
            obj=consumer,
            reason=clean_reason(reason) if reason else "",
            details={CHANGEABLE[k]: _audited(k, before[k], v) for k, v in differs.items()},
        )
    consumer.refresh_from_db()
    return consumer


def _audited(field: str, was, now) -> dict:
    """What a change of `field` leaves in the audit trail: a URL without its credentials (and,
    when only those changed, a note saying so: both would read the same)."""
    if field == "url":
        shown = {"was": redacted_url(was), "now": redacted_url(now)}
        return shown | ({"credentialsChanged": True} if shown["was"] == shown["now"] else {})
    return {"was": was, "now": now}


def _stale(consumer: Consumer) -> Refused:
    return Refused(
        f"{consumer.name} was changed since you read it (it is at version {consumer.version} now, or "
        "later); nothing was written. Read it again, then make your change.",
        code="precondition_failed",
        status=412,
    )


def etag(consumer: Consumer) -> str:
    """The ETag of GET outbox/consumers/{name}: the row's version, which every write of what the
    API shows of it counts."""
    return f'"{consumer.version}"'


def version_of_if_match(header: str | None, consumer: Consumer) -> int | None:
    """The version an If-Match header asks for: None without one (no precondition), the current
    version for `*`, -1 (matches no row) for anything that is not one of our ETags."""
    if header is None:
        return None
    tags = [tag.strip() for tag in header.split(",")]
    if "*" in tags:
        return consumer.version
    if etag(consumer) in tags:  # strong comparison: W/"…" never matches, as RFC 9110 says
        return consumer.version
    return -1


def pause(consumer: Consumer, *, actor: str, reason: str, now: datetime | None = None) -> bool:
    """Pause a consumer: from now on its deliveries are parked (status paused): still created,
    never claimed, spending no attempt, never dead-lettered. Attempts already running finish and
    are written as usual (a failure is parked, not dead-lettered). Audited. Returns whether it
    took (False: it was paused already, nothing written)."""
    reason = clean_reason(reason)
    now = now or timezone.now()
    with transaction.atomic():
        if not Consumer.objects.filter(pk=consumer.pk).pause(by=actor, reason=reason, at=now):
            return False
        AuditEntry.objects.record(actor=actor, action="consumer_paused", obj=consumer, reason=reason)
        Delivery.objects.filter(consumer_id=consumer.pk).park_paused()
    consumer.refresh_from_db()
    return True


def resume(consumer: Consumer, *, actor: str, reason: str, progress=None) -> int | None:
    """Resume a paused consumer: its parked deliveries are due again, in the order they were
    created, each with at least one attempt left; the failure streak starts afresh. Audited.
    Returns how many deliveries it resumed, or None when the consumer was not paused. The
    parked rows are unparked in batches of BULK_BATCH, each its own statement (committed as
    it ends), `progress(batches, total)` after each."""
    reason = clean_reason(reason)
    allowed = settings.ODAL_PYTHON_CONSUMERS
    if consumer.kind == Consumer.Kind.PYTHON and not rules.python_target_allowed(consumer.target, allowed):
        raise Refused(
            f"{consumer.name} calls {consumer.target}, which ODAL_PYTHON_CONSUMERS ({', '.join(allowed)}) "
            "does not allow; it stays paused. Change its target to one the list allows, or widen the "
            "list, then resume it.",
            code="target_not_allowed",
        )
    with transaction.atomic():
        if not Consumer.objects.filter(pk=consumer.pk).resume(allowed=allowed):
            return None
        AuditEntry.objects.record(
            actor=actor,
            action="consumer_resumed",
            obj=consumer,
            reason=reason,
            details={"pausedBy": consumer.paused_by, "pausedReason": consumer.paused_reason},
        )
    resumed = batches = 0
    while n := Delivery.objects.unpark(consumer_id=consumer.pk):  # batches, each its own statement
        resumed += n
        batches += 1
        if progress:
            progress(batches, resumed)
    if resumed:  # (whatever ODAL_KICK_SWEEP says: a listening sweep is told at once)
        transaction.on_commit(lambda: wake_up(SWEEP))
    consumer.refresh_from_db()
    return resumed


def rotate_secret(
    consumer: Consumer,
    *,
    actor: str,
    reason: str,
    grace: timedelta = DEFAULT_GRACE,
    now: datetime | None = None,
) -> tuple[str, datetime | None]:
    """A new signing secret; the old one keeps signing alongside it for `grace` (every request
    then carries both signatures), so the consumer can switch over without losing a delivery.
    `grace` 0 drops every old one at once (a leaked secret). Audited, without either secret.
    Returns the new secret (shown once) and when the old one stops signing.

    A rotation with a grace while an earlier one's grace still runs is refused (409
    rotation_in_progress): it would drop the oldest secret before the time it was announced
    valid until. At most two secrets ever sign at once."""
    reason = clean_reason(reason)
    now = now or timezone.now()
    new = new_secret()
    expires = now + grace if grace > timedelta(0) else None
    with transaction.atomic():
        # Guarded by the secret read: of two rotations at once, the second is refused, not lost.
        took = Consumer.objects.filter(pk=consumer.pk).rotate_secret(
            secret=consumer.secret, new=new, grace_until=expires, now=now
        )
        if not took:
            current = Consumer.objects.filter(pk=consumer.pk).first()
            if current and current.secret == consumer.secret:  # the secret is the one read: a grace runs
                until = current.previous_secret_expires_at
                raise Refused(
                    f"The previous rotation's grace runs until {until:%Y-%m-%d %H:%M:%S}Z: its old secret "
                    "was announced valid until then, so nothing was changed. Rotate again after it, or "
                    "with a grace of 0 (a leaked secret: every old secret stops signing at once).",
                    code="rotation_in_progress",
                    previousSecretExpiresAt=DjangoJSONEncoder().default(until),  # as the API writes times
                )
            raise Refused(
                "The secret was rotated by someone else meanwhile; nothing was changed. Look at the "
                "consumer again before rotating.",
                code="rotation_conflict",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="consumer_secret_rotated",
            obj=consumer,
            reason=reason,
            details={"previousSecretExpiresAt": expires.isoformat() if expires else None},
        )
    consumer.refresh_from_db()
    return new, expires


def remove_consumer(
    consumer: Consumer, *, actor: str, reason: str, batch: int = BULK_BATCH, progress=None
) -> dict:
    """Remove a consumer with its settled deliveries and their attempt lines; refused (409)
    while any of its deliveries is pending or paused (they are owed). The settled rows go in
    batches of at most `batch`, each its own transaction with an audit entry per row it deleted
    (`delivery_removed`: what the row was), so a removal refused at its last step (a delivery
    made meanwhile) leaves a trail of every row that went, dead letters included.
    `progress(batches, total)` after each batch. The consumer's own entry at the end, only when
    the removal took it (a consumer someone else removed meanwhile: 404, nothing audited)."""
    reason = clean_reason(reason)
    owed = Delivery.objects.filter(
        consumer_id=consumer.pk, status__in=[Delivery.Status.PENDING, Delivery.Status.PAUSED]
    ).count()
    if owed:
        raise Refused(
            f"{consumer.name} still has {owed:,} deliveries pending or paused; it is not removed. Let "
            "them settle, or wait for them to be dead-lettered, then remove it.",
            code="deliveries_pending",
        )
    gone = batches = 0
    while taken := _remove_settled_batch(consumer, actor=actor, reason=reason, batch=batch):
        gone += taken
        batches += 1
        if progress:
            progress(batches, gone)
    with transaction.atomic():
        if not Consumer.objects.filter(pk=consumer.pk).remove():
            if not Consumer.objects.filter(pk=consumer.pk).exists():  # removed by someone else meanwhile
                raise Refused(
                    f"No consumer named {rules.shown(consumer.name)}.", code="not_found", status=404
                )
            raise Refused(
                f"{consumer.name} got new deliveries while it was being removed; it is not removed.",
                code="deliveries_pending",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="consumer_removed",
            obj=consumer,
            reason=reason,
            details={"kind": consumer.kind, "url": redacted_url(consumer.url), "deliveriesRemoved": gone},
        )
    return {"deliveriesRemoved": gone}


def _remove_settled_batch(consumer: Consumer, *, actor: str, reason: str, batch: int) -> int:
    """Delete up to `batch` settled deliveries of `consumer` with their attempt lines, and audit
    each, in one transaction. Returns how many it deleted (0: none left)."""
    settled = [Delivery.Status.DELIVERED, Delivery.Status.DEAD]
    now = timezone.now()
    with transaction.atomic():
        # Locked as picked: a resend waits for this batch, or this batch for it (then the
        # row is pending again and the DELETE, restating the status, leaves it).
        ids = list(
            Delivery.objects.filter(consumer_id=consumer.pk, status__in=settled)
            .select_for_update()
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return 0
        rows = Delivery.objects.filter(pk__in=ids, status__in=settled)
        taken = list(rows.values("pk", "status", "attempts", "last_error", "dead_at", "delivered_at"))
        if not taken:
            return 0
        lines = DeliveryAttempt.objects.filter(delivery_id__in=[row["pk"] for row in taken])
        lines._raw_delete(lines.db)
        rows = Delivery.objects.filter(pk__in=[row["pk"] for row in taken], status__in=settled)
        deleted = rows._raw_delete(rows.db)
        AuditEntry.objects.bulk_create(
            AuditEntry(
                at=now,
                actor=actor,
                action="delivery_removed",
                object_type="outbox.delivery",
                object_id=str(row["pk"]),
                reason=reason,
                details={
                    "consumer": consumer.name,
                    "status": row["status"],
                    "attempts": row["attempts"],
                    "lastError": row["last_error"],
                    "deadAt": row["dead_at"].isoformat() if row["dead_at"] else None,
                    "deliveredAt": row["delivered_at"].isoformat() if row["delivered_at"] else None,
                },
            )
            for row in taken
        )
    return deleted


# What a resend takes (a pending or paused delivery is on its way): what a resend by filter selects
# unless it names one of them.
RESENDABLE = (Delivery.Status.DELIVERED.value, Delivery.Status.DEAD.value)


# -- late successes ---------------------------------------------------------------------------------


def late_success_preview(rows, *, verb: str) -> dict:
    """What a replay or resend of `rows` (a Delivery queryset) should say before it is done:
    ``{"lateSuccesses": n, "warning": sentence or None}``, n the dead deliveries among them whose
    consumer answered 2xx to a late attempt (lateSuccessAt). `verb`: "replaying" or "resending"."""
    n = rows.dead_answered_late().count()
    return {"lateSuccesses": n, "warning": late_success_warning(n, verb=verb)}


def late_success_warning(n: int, *, verb: str) -> str | None:
    """The sentence every replay or resend preview shows when it would send dead deliveries
    their consumer already has (see DeliveryQuerySet.note_late_success); None for none."""
    if not n:
        return None
    one = n == 1
    return (
        f"{n:,} of the dead deliveries here {'was' if one else 'were'} answered 2xx by {'its' if one else 'their'} "
        f"consumer after all, by an attempt that outlived its claim (lateSuccessAt): the consumer already "
        f"has {'it' if one else 'them'}, and {verb} sends {'it' if one else 'them'} again (harmless only if "
        "it deduplicates on webhook-id)."
    )


def late_success_note(delivery: Delivery, *, verb: str) -> str | None:
    """The same warning for one delivery, as it was read before it was replayed or resent."""
    if delivery.status != Delivery.Status.DEAD or delivery.late_success_at is None:
        return None
    return (
        f"This dead delivery was answered 2xx by its consumer after all, at "
        f"{delivery.late_success_at:%Y-%m-%d %H:%M:%S}Z, by an attempt that outlived its claim "
        f"(lateSuccessAt): the consumer already has it, and {verb} sends it again (harmless only if it "
        "deduplicates on webhook-id)."
    )


TEST_EVENT = "odal.test"


def send_test_event(consumer: Consumer, *, actor: str) -> Delivery:
    """An `odal.test` event to this consumer alone, subscribed or not: a delivery like any other
    (parked while the consumer is paused). Audited."""
    with transaction.atomic():
        event, made = emit(
            TEST_EVENT,
            {"consumer": consumer.name, "sentBy": actor, "note": "A test event from odal: no action needed."},
            only=consumer,
        )
        if not made:  # removed since it was read (emit locks the consumers it sends to)
            raise Refused(f"No consumer named {rules.shown(consumer.name)}.", code="not_found", status=404)
        delivery = Delivery.objects.get(event=event, consumer=consumer)
        AuditEntry.objects.record(
            actor=actor, action="consumer_test_event", obj=consumer, details={"deliveryId": str(delivery.pk)}
        )
    return delivery


# -- automatic pause -------------------------------------------------------------------------------


def record_health(consumer: Consumer, *, successes: int, failures: int, first_failure_at, errors: list[str]):
    """After a flush: a success ends a consumer's failure streak; failures lengthen it. A
    consumer whose every attempt failed for ODAL_AUTO_PAUSE_AFTER, AUTO_PAUSE_MIN_FAILURES or
    more of them, is paused by odal itself (actor `odal`), with an audit entry and a
    `consumer.paused` event to the other consumers. For a healthy consumer, one UPDATE that
    takes no row (the caller's reading may be stale: another sweep may have started a streak)."""
    if successes:
        Consumer.objects.filter(pk=consumer.pk).end_failure_streak()
        consumer.failing_since, consumer.failures = None, 0
        return False
    if not failures:
        return False
    Consumer.objects.filter(pk=consumer.pk).extend_failure_streak(
        failures=failures, first_failure_at=first_failure_at
    )
    consumer.failing_since = consumer.failing_since or first_failure_at
    after = settings.ODAL_AUTO_PAUSE_AFTER
    if after is None or timezone.now() - consumer.failing_since < timedelta(seconds=after):
        return False
    return auto_pause(consumer, errors)


def auto_pause(consumer: Consumer, errors: list[str]) -> bool:
    """Pause `consumer` as odal, if its streak (as the database has it now, not as the caller
    read it) is long enough and it is not paused yet. Returns whether it took."""
    if settings.ODAL_AUTO_PAUSE_AFTER is None:  # off
        return False
    now = timezone.now()
    after = timedelta(seconds=settings.ODAL_AUTO_PAUSE_AFTER)
    last = "; ".join(dict.fromkeys(excerpt(e, 200) for e in errors[-3:])) or "no error text"
    reason = storable(
        f"every attempt failed for {rules.duration_text(after, words=True)} (last errors: {last})", 500
    )
    with transaction.atomic():
        took = Consumer.objects.filter(pk=consumer.pk).auto_pause(
            reason=reason, at=now, after=after, min_failures=AUTO_PAUSE_MIN_FAILURES, by=AUTO_ACTOR
        )
        if not took:
            return False
        consumer.refresh_from_db()
        AuditEntry.objects.record(
            actor=AUTO_ACTOR,
            action="consumer_paused",
            obj=consumer,
            reason=reason,
            details={"automatic": True, "failingSince": consumer.failing_since.isoformat(),
                     "failures": consumer.failures},
        )  # fmt: skip
        emit(
            "consumer.paused",
            {"consumer": consumer.name, "reason": reason, "pausedBy": AUTO_ACTOR, "pausedAt": now.isoformat(),
             "failingSince": consumer.failing_since.isoformat(), "failures": consumer.failures},
            exclude=consumer,
        )  # fmt: skip
        Delivery.objects.filter(consumer_id=consumer.pk).park_paused()
    log.warning(
        "consumer %s paused automatically: %s", consumer.name, reason, extra={"consumer": consumer.name}
    )
    return True


AUTO_ACTOR = "odal"


# -- Python consumers outside the allow-list ------------------------------------------------------


def pause_python_consumers_outside_allow_list(*, now: datetime | None = None) -> list[str]:
    """Pause, as odal, every Python consumer whose target ODAL_PYTHON_CONSUMERS (as this process
    has it) does not name: made before the list, or before it was narrowed. Its deliveries wait
    (parked), none is called; a person changes its target to an allowed one, or widens the list,
    then resumes it. Each pause is audited (`consumer_paused`, automatic, with the target and the
    list) and emits `consumer.paused`, as an automatic pause does. The sweep calls this at the
    start of every run of passes and about once a second after (outbox.housekeeping.ALLOW_LIST). One UPDATE
    that takes nothing while every Python consumer is allowed or paused. Returns the names."""
    allowed = settings.ODAL_PYTHON_CONSUMERS
    now = now or timezone.now()
    reason = storable(
        f"its target is not one ODAL_PYTHON_CONSUMERS allows ({', '.join(allowed)}): odal does not call it",
        500,
    )
    with transaction.atomic():
        taken = Consumer.objects.pause_outside(allowed, by=AUTO_ACTOR, reason=reason, now=now)
        paused = list(Consumer.objects.filter(pk__in=taken).order_by("name"))
        for consumer in paused:
            AuditEntry.objects.record(
                actor=AUTO_ACTOR,
                action="consumer_paused",
                obj=consumer,
                reason=reason,
                details={"automatic": True, "target": taken[consumer.pk], "allowed": list(allowed)},
            )
            emit(
                "consumer.paused",
                {
                    "consumer": consumer.name,
                    "reason": reason,
                    "pausedBy": AUTO_ACTOR,
                    "pausedAt": now.isoformat(),
                },
                exclude=consumer,
            )
            Delivery.objects.filter(consumer_id=consumer.pk).park_paused()
    for consumer in paused:
        log.warning(
            "Python consumer %s paused: %s (its target is %s)", consumer.name, reason, taken[consumer.pk],
            extra={"consumer": consumer.name},
        )  # fmt: skip
    return [consumer.name for consumer in paused]
