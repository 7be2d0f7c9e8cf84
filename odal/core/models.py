"""odal's core: passports, the audit trail and API tokens."""

import hashlib
import hmac
import secrets
import uuid
from datetime import timedelta

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from odal.core.rows import insert_rows

SCOPE_ORDER = {"read": 0, "write": 1, "admin": 2}


class PassportQuerySet(models.QuerySet):
    """The passport's own status moves, each one filtered update that reports what it took."""

    def mark_published(self, *, at=None) -> int:
        """Draft or suspended -> published. Returns how many rows it took."""
        at = at or timezone.now()
        return self.filter(status__in=[Passport.Status.DRAFT, Passport.Status.SUSPENDED]).update(
            status=Passport.Status.PUBLISHED, published_at=at, updated_at=at
        )

    def mark_suspended(self, *, at=None) -> int:
        """Published -> suspended. Returns how many rows it took."""
        at = at or timezone.now()
        return self.filter(status=Passport.Status.PUBLISHED).update(
            status=Passport.Status.SUSPENDED, suspended_at=at, updated_at=at
        )


class Passport(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        PUBLISHED = "published"
        SUSPENDED = "suspended"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    upi = models.URLField(
        "unique product identifier",
        max_length=2000,
        unique=True,
        help_text="An https URL, for example a GS1 Digital Link.",
    )
    operator_id = models.CharField(max_length=200)
    facility_id = models.CharField(max_length=200, blank=True, default="")
    commodity_code = models.CharField(max_length=50, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)
    published_at = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)

    objects = PassportQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Serves GET dpp: newest first, paged by the keyset (created_at, id) of the last row.
            models.Index(fields=["-created_at", "-id"], name="passport_listing_idx"),
        ]
        permissions = [
            ("publish_passport", "Can publish passports"),
            ("suspend_passport", "Can suspend passports"),
        ]

    def __str__(self) -> str:
        return f"{self.upi} ({self.status})"


class AuditEntryQuerySet(models.QuerySet):
    def record(
        self,
        *,
        actor: str,
        action: str,
        obj=None,
        object_type: str = "",
        object_id: str = "",
        reason: str = "",
        details: dict | None = None,
    ) -> "AuditEntry":
        """Append one entry. Call it inside the transaction of the write it records, and only
        once that write has taken its row."""
        if obj is not None:
            object_type = object_type or obj._meta.label_lower
            object_id = object_id or str(obj.pk)
        return self.create(
            actor=actor,
            action=action,
            object_type=object_type,
            object_id=str(object_id),
            reason=reason,
            details=details or {},
        )

    def record_each(self, entries: list[tuple[str, object, dict]], *, actor: str, model) -> None:
        """record() for many writes by one actor at once, in one INSERT: each entry (action, the
        primary key of the `model` row it is about, details), in order. The same rules: inside
        the transaction of the writes, each of which took its row."""
        insert_rows(
            self.model,
            [{"action": action, "object_id": str(pk), "details": details} for action, pk, details in entries],
            same={"actor": actor, "object_type": model._meta.label_lower, "reason": "", "at": timezone.now()},
        )

    def datetimes(self, field_name, kind, order="ASC", tzinfo=None):
        """Django's datetimes(), which the admin's date drill-down asks for (the years, the months
        of a year, the days of a month), found by hopping: the earliest entry at or after the
        start of each period, one index probe per period that has entries, where Django's groups
        every entry of the list (the whole trail, for its years)."""
        if kind not in ("year", "month", "day") or order not in ("ASC", "DESC") or "__" in field_name:
            return super().datetimes(field_name, kind, order, tzinfo)
        zone = tzinfo or timezone.get_current_timezone()
        rows, found, start = self.order_by(), [], None
        while True:
            later = rows if start is None else rows.filter(**{f"{field_name}__gte": start})
            first = later.aggregate(first=models.Min(field_name))["first"]
            if first is None:
                break
            found.append(period_start(timezone.localtime(first, zone), kind))
            start = next_period(found[-1], kind)
            if start is None:  # (the last period a datetime can start: year 9999's)
                break
        return found if order == "ASC" else found[::-1]


def period_start(moment, kind: str):
    """The start of the year, month or day `moment` falls in, in its own time zone."""
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
    return {"year": day.replace(month=1, day=1), "month": day.replace(day=1), "day": day}[kind]


def next_period(start, kind: str):
    """The start of the year, month or day after the one `start` begins; None past year 9999."""
    try:
        if kind == "year":
            return start.replace(year=start.year + 1)
        if kind == "month":
            return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
        return start + timedelta(days=1)  # (wall-clock arithmetic: midnight, on a day of a clock change too)
    except (ValueError, OverflowError):
        return None


class AuditEntry(models.Model):
    """Append-only: the admin shows it read-only and, on PostgreSQL, a trigger installed by
    migration 0002 refuses UPDATE and DELETE of any row."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64, blank=True, default="")
    object_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    reason = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit trail"
        # The admin's list, newest first, whole or filtered by action or actor: each a walk of
        # one index, and each filter's values found by hopping through its index (issue 26).
        indexes = [
            models.Index(fields=["-at", "-id"], name="audit_listing_idx"),
            models.Index(fields=["action", "-at", "-id"], name="audit_action_idx"),
            models.Index(fields=["actor", "-at", "-id"], name="audit_actor_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type}:{self.object_id}"


def _hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


# How stale `ApiToken.last_used_at` may be: it changes at most once per interval.
TOKEN_USE_INTERVAL = timedelta(minutes=1)


class ApiTokenQuerySet(models.QuerySet):
    def issue(self, *, name: str, scope: str) -> tuple["ApiToken", str]:
        """Create a token and return it with its plaintext, which is never stored or shown again."""
        prefix = secrets.token_hex(4)
        plaintext = f"odal_{prefix}_{secrets.token_urlsafe(32)}"
        token = self.create(name=name, scope=scope, prefix=prefix, secret_hash=_hash_token(plaintext))
        return token, plaintext

    def authenticate(self, plaintext: str) -> "ApiToken | None":
        """The live token this plaintext names, or None. The hash is compared in constant time."""
        parts = plaintext.split("_", 2)
        if len(parts) != 3 or parts[0] != "odal" or len(parts[1]) != 8:
            return None
        token = self.filter(prefix=parts[1], revoked_at__isnull=True).first()
        if token is None or not hmac.compare_digest(token.secret_hash, _hash_token(plaintext)):
            return None
        now = timezone.now()
        # At most one write a minute per token, and no statement at all while the value just read
        # is younger than that: most requests send only the lookup.
        if token.last_used_at is None or token.last_used_at < now - TOKEN_USE_INTERVAL:
            self.filter(pk=token.pk).mark_used(at=now)
        return token

    def mark_used(self, *, at) -> bool:
        """Record a use at `at`, unless another request recorded one less than TOKEN_USE_INTERVAL
        before it (two requests that both read an old value write once); True if it took the row."""
        return (
            self.filter(
                models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=at - TOKEN_USE_INTERVAL)
            ).update(last_used_at=at)
            == 1
        )

    def revoke(self, *, actor: str, at=None) -> int:
        """Revoke the tokens of this queryset that are still live; return how many it took. Each
        token this call revoked gets a `token_revoked` audit entry naming `actor`, in the same
        transaction; one already revoked (before, or by a rival meanwhile) gets none."""
        at = at or timezone.now()
        revoked = 0
        with transaction.atomic():
            for pk, name, scope, prefix in self.order_by("pk").values_list("pk", "name", "scope", "prefix"):
                if self.model.objects.filter(pk=pk, revoked_at__isnull=True).update(revoked_at=at) != 1:
                    continue
                revoked += 1
                AuditEntry.objects.record(
                    actor=actor,
                    action="token_revoked",
                    object_type="odal.apitoken",
                    object_id=str(pk),
                    details={"name": name, "scope": scope, "prefix": prefix},
                )
        return revoked


class ApiToken(models.Model):
    class Scope(models.TextChoices):
        READ = "read"
        WRITE = "write"
        ADMIN = "admin"

    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=8, choices=Scope.choices)
    prefix = models.CharField(max_length=8, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.scope}, odal_{self.prefix}_…)"

    def allows(self, scope: str) -> bool:
        """admin implies write, write implies read."""
        return SCOPE_ORDER[self.scope] >= SCOPE_ORDER[scope]


class Tally(models.Model):
    """Counts kept by the writes themselves, so that no page view or scrape counts a big table.

    Database triggers (migration 0005) add to it in the same transaction as the write they
    count: deliveries that became delivered, attempt-log lines by outcome, registrations by
    status. Python adds what no single table write says (rows purged, see odal.core.tally.bump).
    Each database session adds to rows of its own (`shard` is its backend pid), in hourly
    buckets, so no row is hot; `odal.core.tally.compact` (every 10 minutes) folds each past hour into one row
    per figure and hour, and hours older than two days into one row per figure. A figure is the
    sum of its rows: deleting counted rows never lowers it.
    """

    metric = models.CharField(max_length=64)
    key = models.CharField(max_length=200, blank=True, default="")
    hour = models.DateTimeField()
    shard = models.IntegerField(default=0)
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["metric", "key", "hour", "shard"], name="tally_bucket")
        ]

    def __str__(self) -> str:
        return f"{self.metric}[{self.key}] {self.hour:%Y-%m-%d %H}:00 = {self.value}"


class Heartbeat(models.Model):
    """When each worker process last finished a pass of the sweep or the drain: one row per
    (role, worker), written at most once a second by that worker, so none is hot."""

    role = models.CharField(max_length=32)  # "outbox.sweep" or "registry.drain"
    worker = models.CharField(max_length=200)  # host:pid
    at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["role", "worker"], name="one_heartbeat_per_worker")]
        indexes = [models.Index(fields=["role", "-at"], name="heartbeat_latest_idx")]

    def __str__(self) -> str:
        return f"{self.role} {self.worker} {self.at:%Y-%m-%d %H:%M:%S}"


IDEMPOTENCY_WINDOW = timedelta(hours=24)  # how long a first answer is kept for its Idempotency-Key


class IdempotencyRecordQuerySet(models.QuerySet):
    def expired(self, *, now=None) -> "IdempotencyRecordQuerySet":
        """Records older than IDEMPOTENCY_WINDOW: their keys no longer count."""
        return self.filter(created_at__lte=(now or timezone.now()) - IDEMPOTENCY_WINDOW)

    def forget_expired(self, *, now=None) -> int:
        """Delete the expired records of this queryset (one DELETE); return how many went."""
        rows = self.expired(now=now)
        return rows._raw_delete(rows.db)

    def answer(self, *, status_code: int, response: dict) -> bool:
        """Store the first answer in a record still waiting for it. True if it took the row."""
        return self.filter(status_code__isnull=True).update(status_code=status_code, response=response) == 1


class IdempotencyRecord(models.Model):
    """The first answer to a request sent with an `Idempotency-Key` (odal.core.idempotency).

    One per caller, route and key (the unique constraint is what makes a concurrent second
    request wait for the first and then find its record). It is inserted, without an answer,
    in the transaction that does the work, and given the answer before that commits: a record
    other transactions can see always has its answer, and a request that fails leaves none.
    """

    caller = models.CharField(max_length=200)  # "token:<prefix>" or "user:<id>": keys are per caller
    route = models.CharField(max_length=64)  # "POST events", "POST dpp", ...
    key = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64)  # sha256 of the request body as canonical JSON
    status_code = models.PositiveSmallIntegerField(null=True)  # null until the work is done
    response = models.JSONField(null=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = IdempotencyRecordQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["caller", "route", "key"], name="one_record_per_idempotency_key")
        ]
        # Serves expired(): the purge's DELETE of records older than the window.
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_idx")]

    def __str__(self) -> str:
        return f"{self.route} {self.key!r} by {self.caller} ({self.status_code})"


class RetentionPositionQuerySet(models.QuerySet):
    def open(self, walks, *, now) -> None:
        """A position, at the start, for each walk that has none yet (one INSERT … ON CONFLICT DO
        NOTHING: several purges starting at once make each row once)."""
        self.bulk_create(
            [RetentionPosition(walk=walk, moved_at=now) for walk in walks], ignore_conflicts=True
        )

    def where(self, walks) -> dict:
        """{walk: (lap, (key, id) where it stopped, or None at the start)}; a walk with no row
        yet is at the start of lap 0."""
        rows = self.filter(walk__in=walks).values_list("walk", "laps", "after_key", "after_id")
        found = {walk: (laps, None if key is None else (key, pk)) for walk, laps, key, pk in rows}
        return {walk: found.get(walk, (0, None)) for walk in walks}

    def advance(self, walk: str, *, lap: int, at, to, now) -> bool:
        """Move `walk` from `at` in `lap` to `to` ((key, id) or None: back to the start, which
        begins its next lap), only while it is still there: a purge claims the stretch of its
        index between the two, in the transaction that deletes what the stretch holds. Another
        purge that read the same position (even one a whole lap ago) then takes no row and
        leaves the stretch, and the walk, to this one. True if it took the row."""
        (at_key, at_id), (to_key, to_id) = at or (None, ""), to or (None, "")
        rows = self.filter(walk=walk, laps=lap, after_key=at_key, after_id=at_id)
        laps = F("laps") + 1 if to is None else F("laps")
        return rows.update(after_key=to_key, after_id=to_id, laps=laps, moved_at=now) == 1


class RetentionPosition(models.Model):
    """Where each of retention's walks (outbox.retention) stopped: its next run starts after that
    entry of its index, so that rows retention must keep at the front of an index are walked past
    once a lap, not at every run. (key, id) of the last entry walked, both empty at the start;
    `laps`, how many times it went back to the start."""

    walk = models.CharField(max_length=64, primary_key=True)
    after_key = models.DateTimeField(null=True, blank=True)
    after_id = models.CharField(max_length=64, blank=True, default="")  # the primary key, as text
    laps = models.BigIntegerField(default=0)
    moved_at = models.DateTimeField()

    objects = RetentionPositionQuerySet.as_manager()

    def __str__(self) -> str:
        at = f"after {self.after_key} {self.after_id}" if self.after_key else "start"
        return f"{self.walk}: lap {self.laps}, {at}"


from odal.core.kicks import Kick  # noqa: E402, F401  (a model of this app: odal.work's one table)
