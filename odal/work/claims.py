"""The one claim mechanism of both outboxes (the delivery sweep and the registry drain).

A row is *due* when its status is claimable and `next_attempt_at <= now`. A claim is one
conditional update of a batch of due rows, picked with `SELECT … FOR UPDATE SKIP LOCKED` on
PostgreSQL, that:

- sets a fresh `claim_token` (one per batch: a later claim of the same row always carries
  another one, which is all that matters);
- pushes `next_attempt_at` to `now + hold`, so a claimed row leaves the due range of the partial
  index and the due scan never walks over rows in flight; if the worker dies, the row simply
  becomes due again when the hold runs out;
- counts the attempt (`attempts = attempts + 1`) at claim time, so the attempt bound holds even
  when every attempt outlives its hold.

Only the current claim may end an attempt: terminal writes filter on `claim_token = <mine>` and
the expected status and clear the token. A late writer takes 0 rows and writes nothing.
"""

import math
import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections, models, transaction
from django.db.models import F, Q, sql
from django.utils import timezone

from odal.lookups import Ids  # (and pk__any: a claim's ids as one array)


@dataclass
class Claim:
    token: uuid.UUID
    at: datetime
    rows: list = field(default_factory=list)
    held_until: datetime | None = None  # after this the rows are due again, for any claimer
    # odal.work.deadline.now() from which no attempt of this claim starts (its pass sets it: its
    # task's deadline less its longest attempt); infinity: only the hold bounds them.
    start_by: float = math.inf

    def holds(self) -> bool:
        """Whether the hold still runs: an attempt started later may overlap another claim's."""
        return self.held_until is not None and timezone.now() < self.held_until


class ClaimQuerySet(models.QuerySet):
    """Mixed into the QuerySet of a model with status, attempts, next_attempt_at and claim_token."""

    claimable_statuses: tuple[str, ...] = ()

    def due(self, now: datetime | None = None):
        return self.filter(status__in=self.claimable_statuses, next_attempt_at__lte=now or timezone.now())

    def next_due_within(self, now: datetime, seconds: float) -> datetime | None:
        """When the first row falls due after `now` and within `seconds` of it; None if none does."""
        return (
            self.filter(status__in=self.claimable_statuses)
            .filter(next_attempt_at__gt=now, next_attempt_at__lte=now + timedelta(seconds=seconds))
            .order_by("next_attempt_at")
            .values_list("next_attempt_at", flat=True)
            .first()
        )

    def claimable(self, now: datetime):
        """Due rows a claim may take. Models with an attempt bound narrow this."""
        return self.due(now)

    def reclaim_updates(self, now: datetime) -> dict:
        """What else a claim writes on the rows it takes (the claim's UPDATE reads each row as it
        was: a claim_token still set there is a claim that ran out with no outcome written)."""
        return {}

    def claim(
        self,
        *,
        limit: int = 100,
        hold_seconds: int | None = None,
        now: datetime | None = None,
        select_related: tuple[str, ...] = (),
        read=None,
        skip: Q | None = None,
    ) -> Claim:
        """Claim up to `limit` due rows, none matching `skip`; returns the claim with the rows it
        took (their `attempts` already counts this attempt), read with `select_related`, or by
        `read(queryset of the rows taken)`, which returns them by primary key."""
        now = now or timezone.now()
        hold = timedelta(seconds=settings.ODAL_CLAIM_HOLD_SECONDS if hold_seconds is None else hold_seconds)
        held_until = now + hold
        claim = Claim(token=uuid.uuid4(), at=now, held_until=held_until)
        with transaction.atomic():
            # Two statements on purpose. A single UPDATE … WHERE pk IN (SELECT … LIMIT n FOR UPDATE
            # SKIP LOCKED) may take far more than n rows while others claim (PostgreSQL can run
            # the subquery more than once); tests/test_outbox_claims.py shows it.
            claimable = self.claimable(now) if skip is None else self.claimable(now).exclude(skip)
            ids = Ids(  # (three statements take them: spelled once)
                claimable.order_by("next_attempt_at")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:limit]
            )
            if not ids:
                return claim
            # The WHERE restates "still claimable": should a row not be locked (a read without
            # FOR UPDATE), a row another claimer took in between no longer matches, not taken twice.
            self.model._default_manager.filter(pk__any=ids).claimable(now).update(
                claim_token=claim.token,
                next_attempt_at=held_until,
                attempts=F("attempts") + 1,
                **self.reclaim_updates(now),
            )
        # By primary key: claim_token has no index, and a claim must not read the whole table.
        taken = self.model._default_manager.filter(pk__any=ids, claim_token=claim.token)
        rows = read(taken) if read is not None else taken.select_related(*select_related).in_bulk()
        # In the order they fell due (oldest first): resumed deliveries in the order they were made.
        claim.rows = [rows[pk] for pk in ids if pk in rows]
        return claim

    def update_returning_ids(self, values: dict) -> set:
        """PostgreSQL: `.update(**values)` of this queryset as one UPDATE … RETURNING, the ids of
        exactly the rows it wrote: each row is checked against the whole filter after any wait
        for its lock, so a row another writer settled meanwhile is neither written nor named."""
        query = self.query.chain(sql.UpdateQuery)
        query.add_update_values(values)
        query.annotations = {}
        compiler = query.get_compiler(self.db)
        try:
            compiler.pre_sql_setup()
            text, params = compiler.as_sql()
        except EmptyResultSet:  # (a filter that can match nothing: pk__any=[])
            return set()
        quote = connections[self.db].ops.quote_name
        returning = f"{quote(self.model._meta.db_table)}.{quote(self.model._meta.pk.column)}"
        with transaction.mark_for_rollback_on_error(self.db), connections[self.db].cursor() as cursor:
            cursor.execute(f"{text} RETURNING {returning}", params)
            return {row[0] for row in cursor.fetchall()}

    def release(self, *, token: uuid.UUID, now: datetime | None = None) -> int:
        """Give back the rows of a claim whose attempt never started (the hold ran out before
        their turn): the attempt counted at claim is returned and they are due again at once.
        Guarded: only rows still held by `token` in a claimable status; a row another claimer
        has taken since, or one settled meanwhile, is left alone. Returns how many it took."""
        return self.filter(claim_token=token, status__in=self.claimable_statuses).update(
            attempts=F("attempts") - 1, claim_token=None, next_attempt_at=now or timezone.now()
        )


def backoff_delay(
    attempt: int, *, base_seconds: float | None = None, cap_seconds: float | None = None
) -> timedelta:
    """Exponential backoff with jitter: base·2^(attempt-1), capped, then a random 50–100% of it,
    so retries of a failed batch spread out instead of arriving together."""
    base = settings.ODAL_BACKOFF_BASE_SECONDS if base_seconds is None else base_seconds
    cap = settings.ODAL_BACKOFF_MAX_SECONDS if cap_seconds is None else cap_seconds
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return timedelta(seconds=delay * random.uniform(0.5, 1.0))
