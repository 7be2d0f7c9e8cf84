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

"Now" is the database's clock, never a process's own: which rows are due, when a hold ends and
whether a claim still holds are read against PostgreSQL's `statement_timestamp()` (database_now),
so a worker whose clock lags takes no row another still holds, and one whose clock runs ahead
does not count a live hold as run out. A claim learns the database's time from its own UPDATE
(no statement more) and times its hold from then on the process's monotonic clock.
"""

import math
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections, models, transaction
from django.db.models import F, Q, sql
from django.db.models.functions import Now

from odal.core.lookups import Ids  # (and pk__any: a claim's ids as one array)


@dataclass
class Claim:
    token: uuid.UUID
    at: datetime | None = None  # the database's time of the claim (None: it took nothing)
    rows: list = field(default_factory=list)
    held_until: datetime | None = None  # the database's time after which the rows are due again
    ends: float = float("-inf")  # held_until on this process's monotonic clock (holds)
    # odal.work.deadline.now() from which no attempt of this claim starts (its pass sets it: its
    # task's deadline less its longest attempt); infinity: only the hold bounds them.
    start_by: float = math.inf

    def holds(self) -> bool:
        """Whether the hold still runs: an attempt started later may overlap another claim's.
        Read on the monotonic clock from the claim's own statement, so this process's wall clock,
        however wrong, does not count."""
        return time.monotonic() < self.ends


def database_now(db: str = "default"):
    """The now of a due or hold filter, or of a value written with one: the database's clock, as
    an expression each statement evaluates (statement_timestamp(): one instant per statement, also
    inside a long transaction)."""
    return Now()


class ClaimQuerySet(models.QuerySet):
    """Mixed into the QuerySet of a model with status, attempts, next_attempt_at and claim_token."""

    claimable_statuses: tuple[str, ...] = ()

    def due(self, now=None):
        """Rows due at `now` (a datetime or an expression; by default the database's now)."""
        now = database_now(self.db) if now is None else now
        return self.filter(status__in=self.claimable_statuses, next_attempt_at__lte=now)

    def seconds_to_next_due(self, within: float) -> float | None:
        """How long until the first row not due yet falls due, by the database's clock, if it
        does within `within` seconds; None if none does."""
        now = database_now(self.db)
        upcoming = (
            self.filter(status__in=self.claimable_statuses)
            .filter(next_attempt_at__gt=now, next_attempt_at__lte=now + timedelta(seconds=within))
            .order_by("next_attempt_at")
            .annotate(wait=F("next_attempt_at") - now)
            .values_list("wait", flat=True)
            .first()
        )
        return None if upcoming is None else upcoming.total_seconds()

    def claimable(self, now):
        """Due rows a claim may take (`now` a datetime or an expression). Models with an attempt
        bound narrow this."""
        return self.due(now)

    def reclaim_updates(self, now) -> dict:
        """What else a claim writes on the rows it takes (the claim's UPDATE reads each row as it
        was: a claim_token still set there is a claim that ran out with no outcome written);
        `now` is the claim's (a datetime or an expression)."""
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
        `read(queryset of the rows taken)`, which returns them by primary key. Due, and held, by
        the database's clock (database_now); `now`, a datetime, claims at that moment instead (a
        test's simulated clock)."""
        clock = database_now(self.db) if now is None else now
        hold = timedelta(seconds=settings.ODAL_CLAIM_HOLD_SECONDS if hold_seconds is None else hold_seconds)
        claim = Claim(token=uuid.uuid4())
        with transaction.atomic():
            # Two statements on purpose. A single UPDATE … WHERE pk IN (SELECT … LIMIT n FOR UPDATE
            # SKIP LOCKED) may take far more than n rows while others claim (PostgreSQL can run
            # the subquery more than once); tests/test_outbox_claims.py shows it.
            claimable = self.claimable(clock) if skip is None else self.claimable(clock).exclude(skip)
            ids = Ids(  # (three statements take them: spelled once)
                claimable.order_by("next_attempt_at")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:limit]
            )
            if not ids:
                return claim
            # The WHERE restates "still claimable": should a row not be locked (a read without
            # FOR UPDATE), a row another claimer took in between no longer matches, not taken twice.
            taking = self.model._default_manager.filter(pk__any=ids).claimable(clock)
            values = {
                "claim_token": claim.token,
                "next_attempt_at": clock + hold,
                "attempts": F("attempts") + 1,
                **self.reclaim_updates(clock),
            }
            # The hold ends `hold` after the UPDATE's own instant, which is no earlier than this:
            # timed from here on the monotonic clock, it never outlasts the database's.
            sent = time.monotonic()
            if isinstance(clock, datetime):
                taking.update(**values)
                claim.at = clock
            else:
                claim.at = taking.update_answering_now(values)
        claim.held_until, claim.ends = claim.at + hold, sent + hold.total_seconds()
        # By primary key: claim_token has no index, and a claim must not read the whole table.
        taken = self.model._default_manager.filter(pk__any=ids, claim_token=claim.token)
        rows = read(taken) if read is not None else taken.select_related(*select_related).in_bulk()
        # In the order they fell due (oldest first): resumed deliveries in the order they were made.
        claim.rows = [rows[pk] for pk in ids if pk in rows]
        return claim

    def _update_sql(self, values: dict) -> tuple[str, list] | None:
        """The SQL of `.update(**values)` of this queryset, or None if it can match nothing."""
        query = self.query.chain(sql.UpdateQuery)
        query.add_update_values(values)
        query.annotations = {}
        compiler = query.get_compiler(self.db)
        try:
            compiler.pre_sql_setup()
            return compiler.as_sql()
        except EmptyResultSet:  # (a filter that can match nothing: pk__any=[])
            return None

    def update_answering_now(self, values: dict) -> datetime:
        """PostgreSQL: `.update(**values)` of this queryset, in one statement that also answers its
        own instant, statement_timestamp() (the one its Now() expressions wrote: see claim)."""
        update = self._update_sql(values)
        text, params = (
            ("SELECT statement_timestamp()", [])
            if update is None
            else (f"WITH updated AS ({update[0]} RETURNING 1) SELECT statement_timestamp()", update[1])
        )
        with transaction.mark_for_rollback_on_error(self.db), connections[self.db].cursor() as cursor:
            cursor.execute(text, params)
            return cursor.fetchone()[0]

    def update_returning_ids(self, values: dict) -> set:
        """PostgreSQL: `.update(**values)` of this queryset as one UPDATE … RETURNING, the ids of
        exactly the rows it wrote: each row is checked against the whole filter after any wait
        for its lock, so a row another writer settled meanwhile is neither written nor named."""
        update = self._update_sql(values)
        if update is None:
            return set()
        text, params = update
        quote = connections[self.db].ops.quote_name
        returning = f"{quote(self.model._meta.db_table)}.{quote(self.model._meta.pk.column)}"
        with transaction.mark_for_rollback_on_error(self.db), connections[self.db].cursor() as cursor:
            cursor.execute(f"{text} RETURNING {returning}", params)
            return {row[0] for row in cursor.fetchall()}

    def release(self, *, token: uuid.UUID, now: datetime | None = None) -> int:
        """Give back the rows of a claim whose attempt never started (the hold ran out before
        their turn): the attempt counted at claim is returned and they are due again at once (by
        the database's clock, unless `now` says otherwise). Guarded: only rows still held by
        `token` in a claimable status; a row another claimer has taken since, or one settled
        meanwhile, is left alone. Returns how many it took."""
        return self.filter(claim_token=token, status__in=self.claimable_statuses).update(
            attempts=F("attempts") - 1,
            claim_token=None,
            next_attempt_at=database_now(self.db) if now is None else now,
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
