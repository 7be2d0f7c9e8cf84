"""Settling: writing a pass's endings (an ending is the outcome of one attempt, waiting to be
written), for every kind of claimed work.

A set of endings is written in one transaction: each by its guarded write, then their attempt-log
lines in one statement, then what follows the writes that took their row. If the database refuses
the set, each is written again on its own (write_in_sets); one it still refuses keeps its claim
until the hold runs out and gets a write_error line instead. An ending whose write took nothing is
late: logged, and nothing written of it but its line (and what its kind notes of a late one).

A kind (outbox.settling, registry.settling) is a Settling: it says what its write is and what follows.
"""

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from django.db import transaction

from odal.core import reconnect
from odal.core.text import storable

log = logging.getLogger(__name__)


def write_in_sets(items: list, write, refused) -> list:
    """Write `items` in one transaction (`write(items)` says, per item, whether its guarded write
    took its row). If the database refuses the set, each is written again in a transaction of its
    own (a set of one too: what the database refused may have been passing, a deadlock), so one
    row it cannot store costs no other row its outcome; for that one `refused(item, exc)` is
    called (it keeps its claim until the hold runs out, then it is due again) and its answer is
    None. If the database is lost meanwhile, DatabaseLost unwinds the pass: nothing
    more is written for its claim, and its rows are due again after the hold (odal.core.reconnect)."""
    if not items:
        return []
    try:
        with transaction.atomic():
            return write(items)
    except Exception as exc:  # DataError, or psycopg refusing to encode: see which row, below
        reconnect.raise_if_lost(exc)
        log.warning("writing %s outcomes together failed; writing them one by one", len(items), exc_info=True)
    taken = []
    for item in items:
        try:
            with transaction.atomic():
                taken += write([item])
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            refused(item, exc)
            taken.append(None)
    return taken


@dataclass
class Written:
    """What settle did with a list of endings, each in one of three lists."""

    taken: list = field(default_factory=list)  # their write took their row
    late: list = field(
        default_factory=list
    )  # their write took nothing: the claim was superseded, or the row settled
    refused: list = field(default_factory=list)  # the database refused them: their rows stay claimed


class Settling(ABC):
    """What a kind's endings are: their guarded write, their attempt-log lines, what follows."""

    log: logging.Logger  # the kind's own: its late and refused lines are logged there

    @abstractmethod
    def write(self, endings: list) -> list[bool]:
        """The endings' guarded writes in the caller's transaction (and what a late one notes on
        its row): for each, whether it took its row."""

    @abstractmethod
    def log_attempts(self, endings: list, taken: list[bool]) -> None:
        """Their attempt-log lines, in one statement (late where the write took nothing)."""

    def followed(self, taken: list) -> None:
        """What follows the writes that took their row, in the same transaction (by default nothing)."""
        return None

    @abstractmethod
    def was_late(self, ending) -> None:
        """Log that an ending's write took nothing."""

    @abstractmethod
    def named(self, ending) -> tuple[str, dict]:
        """How the log names an ending's attempt ("delivery 5 attempt 2"), and its ids (the line's extra)."""

    @abstractmethod
    def refused_error(self, ending, exc: Exception) -> str:
        """The attempt-log error of an ending the database refused (`exc`)."""

    @abstractmethod
    def log_refused(self, ending, error: str) -> None:
        """Write the write_error line of an ending the database refused."""


def settle(kind: Settling, endings: list) -> Written:
    """Write `endings` (see the module), in sets; which took, which were late, which were refused."""
    written = Written()

    def write(some: list) -> list[bool]:
        taken = kind.write(some)
        kind.log_attempts(some, taken)
        kind.followed([ending for ending, took in zip(some, taken, strict=True) if took])
        return taken

    taken = write_in_sets(endings, write, lambda ending, exc: refused(kind, ending, exc))
    for ending, took in zip(endings, taken, strict=True):
        if took is None:
            written.refused.append(ending)
        elif took:
            written.taken.append(ending)
        else:
            written.late.append(ending)
    for ending in written.late:
        kind.was_late(ending)
    return written


def refused(kind: Settling, ending, exc: Exception) -> None:
    """The database refused this ending: say so in the attempt log (a write_error line, counted in
    /metrics) and in the process log, and go on."""
    error = kind.refused_error(ending, exc)
    name, ids = kind.named(ending)
    kind.log.error("%s: %s", name, storable(error), extra=ids)
    try:
        with transaction.atomic():
            kind.log_refused(ending, error)
    except Exception as exc:
        reconnect.raise_if_lost(exc)
        kind.log.exception("%s: not even the attempt-log line could be written", name, extra=ids)
