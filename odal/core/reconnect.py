"""Riding out a lost database: a restart, a failover, a terminated backend, a cut network.

The long-lived loops (the outbox sweep and its listener, the registry drain, and the django-q2
tasks that run them) catch a lost database around each pass and hand it to their `Outage`,
which logs the loss once, waits with a growing pause until the database answers again, and logs
the recovery once with how long it took. Nothing else in odal reconnects: Django opens a new
connection on the next query once the broken one is closed, and an Outage closes it.

A pass that loses its database writes nothing more. Where an outcome's write fails because the
connection went (not because the database refused the row), the writer raises `DatabaseLost`
instead of trying again on a new connection: a COMMIT whose answer was lost may have landed, and
writing the outcome again would log one attempt twice. Its rows keep their claim until the hold
runs out and are then due again (at least once; the guarded writes make that safe).
"""

import logging
import random
import time
from typing import NoReturn

import psycopg
from django.db import Error, connection

from odal.core.text import error_text

log = logging.getLogger(__name__)

# SQLSTATEs that mean the server went away or does not take connections yet, beside class 08
# (connection exception) and libpq's own errors, which carry none.
LOST_STATES = {
    "57P01",  # admin_shutdown: pg_ctl stop/restart -m fast, pg_terminate_backend
    "57P02",  # crash_shutdown: another backend crashed, the server restarts
    "57P03",  # cannot_connect_now: starting up, shutting down, in recovery
    "53300",  # too_many_connections: a restarted server as every client reconnects at once
    # The statement bounds (odal.core.database): a database too slow to answer within them is treated
    # as one that does not answer (503, exit 4, the loop waits), not as a refusal of the row.
    "57014",  # query_canceled: statement_timeout (or an operator's pg_cancel_backend)
    "55P03",  # lock_not_available: lock_timeout
    "25P03",  # idle_in_transaction_session_timeout: the server ended the session
}
FIRST_PAUSE = 0.1  # seconds before the second try; doubles on every failed try...
LONGEST_PAUSE = 2.0  # ...up to this (each pause is jittered down by up to half)


class DatabaseLost(BaseException):  # noqa: N818 (a signal to unwind, like asyncio.CancelledError)
    """The connection went while an outcome was being written. A BaseException on purpose: it
    must unwind a pass through every `except Exception` that keeps one attempt's failure from
    ending the pass (none of those may write the attempt's outcome as failed on a new
    connection), up to the loop and its Outage. `error` is the database error behind it."""

    def __init__(self, error: BaseException):
        super().__init__(error_text(error))
        self.error = error


ERRORS = (DatabaseLost, Error, psycopg.Error)  # what a loop catches to ask is_lost()


def is_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection to the database is gone or cannot be made (rather than
    that the database refused a statement, which is the caller's to handle)."""
    if isinstance(exc, DatabaseLost):
        return True
    error = exc if isinstance(exc, psycopg.Error) else exc.__cause__  # Django wraps psycopg's
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in LOST_STATES


def unanswered(exc: BaseException) -> str:
    """A sentence for a person whose command or request met a database that does not answer."""
    return (
        f"The database does not answer ({where_and_why(exc)}). "
        "Nothing more was done; what was done before it went is kept. Try again once it answers."
    )


def lost_in_a_line(exc: BaseException) -> str:
    """What a log says of a lost connection, without a traceback."""
    return f"the database does not answer ({where_and_why(exc)})"


def where_and_why(exc: BaseException) -> str:
    """The database's name and host, and the driver's cause on one line."""
    where = connection.settings_dict
    host = f"{where.get('HOST') or 'local socket'}{':' + str(where['PORT']) if where.get('PORT') else ''}"
    return f"{where.get('NAME')} on {host}: {' '.join(error_text(database_error(exc)).split())}"


def raise_if_lost(exc: BaseException) -> None:
    """Where an outcome's write failed: unwind the pass if the database went."""
    if is_lost(exc):
        raise DatabaseLost(exc) from exc


def give_up(exc: BaseException) -> NoReturn:
    """Raise the database error behind `exc` for a caller that stops waiting, its own cause kept
    (is_lost reads it: the command line says the database does not answer, not a traceback)."""
    error = database_error(exc)
    raise error from error.__cause__


def database_error(exc: BaseException) -> BaseException:
    """The database error behind `exc`, for a caller that gives up (a command, a django-q2 task:
    a BaseException must not end a worker process)."""
    return exc.error if isinstance(exc, DatabaseLost) else exc


def close_connection() -> None:
    try:
        connection.close()
    except Error:  # closing a broken connection
        log.debug("closing the lost connection failed", exc_info=True)


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


class Outage:
    """How one loop rides out a lost database. `wait(exc)` after each loss; `reopen`, if given,
    is part of the database answering again (the sweep's listener: a new connection that
    LISTENs, and leads again if it led) and says what it did. `deadline` (time.monotonic()) bounds a loop that has
    only so long (a django-q2 task's turn)."""

    def __init__(self, what: str, *, should_stop=lambda: False, deadline: float | None = None, reopen=None):
        self.what, self.should_stop, self.deadline, self.reopen = what, should_stop, deadline, reopen

    def attempt(self, one_pass):
        """`one_pass()`'s result; None if it lost the database and the database answers again
        (the caller goes on with its next pass). Past the deadline, or told to stop, the database
        error is raised (give_up); an error that is not a lost database is raised as it is."""
        try:
            return one_pass()
        except ERRORS as exc:
            if not is_lost(exc):
                raise
            if not self.wait(exc):
                give_up(exc)
            return None

    def wait(self, exc: BaseException) -> bool:
        """Close the lost connection, log the loss, and try again, at once and then after pauses
        growing from FIRST_PAUSE to LONGEST_PAUSE, until the database answers (True, logged with
        how long it took) or the loop is told to stop or runs out of time (False). An error
        that is not a lost database is raised."""
        started = time.monotonic()
        log.warning(
            "%s lost the database (%s); waiting for it to answer again",
            self.what,
            " ".join(error_text(database_error(exc)).split()),  # (libpq's messages span lines)
        )
        pause, tries = FIRST_PAUSE, 0
        while True:
            tries += 1
            close_connection()
            try:
                check_database()
                reopened = self.reopen() if self.reopen is not None else None
            except ERRORS as again:
                if not is_lost(again):
                    raise
            else:
                log.warning(
                    "%s: the database answers again after %.1f s (%s %s); %scarrying on",
                    self.what, time.monotonic() - started, tries, "try" if tries == 1 else "tries",
                    f"{reopened}; " if reopened else "",
                )  # fmt: skip
                return True
            out_of_time = self.deadline is not None and time.monotonic() + pause > self.deadline
            if self.should_stop() or out_of_time:
                log.warning(
                    "%s: the database still does not answer after %.1f s; %s",
                    self.what, time.monotonic() - started, "stopping" if self.should_stop() else "giving up",
                )  # fmt: skip
                return False
            time.sleep(pause * random.uniform(0.5, 1.0))  # jittered, so a fleet does not retry in step
            pause = min(pause * 2, LONGEST_PAUSE)
