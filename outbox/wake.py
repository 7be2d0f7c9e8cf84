"""Waking the sweep the moment a commit creates due work, and when a retry falls due.

On PostgreSQL one sweep at a time is *the listener*: it holds a session advisory lock on its own
connection, LISTENs on a channel, and between passes waits for a notification or for the next
poll (at most POLL_SECONDS, so a retry falling due is attempted within about a second of its
next_attempt_at). A commit that creates deliveries sends a NOTIFY; only when no sweep holds the
lock does it also enqueue a django-q2 sweep task (outbox.kick), which becomes the listener.

The lock is not a correctness lock: the claims decide who delivers what, and two sweeps
listening at once would do no harm. It only keeps kicks from piling up tasks that would each
linger. It lives on the listener's connection, so a listener that dies (SIGKILL, lost network)
gives it up with its connection.

A listener whose connection is lost (a database restart, a terminated backend) is reopened by
its sweep's odal.reconnect.Outage once the database answers: it LISTENs again and takes the lock
again if it is free. Meanwhile commits find the lock free and enqueue sweep tasks, as they do
whenever no sweep listens.
"""

import logging

import psycopg
from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

CHANNEL = "odal_outbox"
LISTENER_LOCK = 0x6F64616C_0001  # pg advisory lock key ("odal", 1); per database
POLL_SECONDS = 1.0  # the longest a listener waits without looking for rows that fell due


def notify_sweep() -> bool:
    """After a commit that created due deliveries: NOTIFY the listener. Returns whether a
    listener holds the lock (if not, the caller enqueues a sweep). One statement; outside
    PostgreSQL there is no listener."""
    if connection.vendor != "postgresql":
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, ''), pg_try_advisory_xact_lock_shared(%s)", [CHANNEL, LISTENER_LOCK]
            )
            free = cursor.fetchone()[1]
    except DatabaseError:
        log.warning("could not notify the sweep", exc_info=True)
        return False
    return not free


class Listener:
    """A connection of its own that LISTENs on CHANNEL and may hold the listener lock."""

    def __init__(self):
        self.conn = self._connect()
        self.leading = False
        self.wants_lead = False  # it tried to lead: after a lost connection it tries again

    @staticmethod
    def _connect():
        conn = connection.get_new_connection(connection.get_connection_params())
        conn.autocommit = True
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    @classmethod
    def open(cls) -> "Listener | None":
        if connection.vendor != "postgresql":
            return None
        return cls()

    def reopen(self) -> str:
        """After its connection was lost (the lock and the LISTEN went with it): a new
        connection that LISTENs again, and takes the lock again if it tried to lead and the lock
        is free. Part of an odal.reconnect.Outage: it raises while the database does not answer,
        and says what it does now."""
        self.close()
        self.leading = False
        self.conn = self._connect()
        if self.wants_lead:
            self.try_lead()
        return "listening again, " + ("leading" if self.leading else "not leading (another sweep leads)")

    def try_lead(self) -> bool:
        """Take the listener lock if nobody holds it."""
        self.wants_lead = True
        self.leading = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [LISTENER_LOCK]).fetchone()[0]
        return self.leading

    def wait_to_lead(self, seconds: float) -> bool:
        """Wait up to `seconds` for the lock (a relay successor, while its predecessor hands over)."""
        self.wants_lead = True
        try:
            self.conn.execute(f"SET lock_timeout = {int(seconds * 1000)}")
            self.conn.execute("SELECT pg_advisory_lock(%s)", [LISTENER_LOCK])
            self.leading = True
        except psycopg.errors.LockNotAvailable:  # someone else leads
            self.leading = False
        finally:
            self.conn.execute("SET lock_timeout = 0")
        return self.leading

    def wait(self, seconds: float) -> bool:
        """Block until a notification arrives or `seconds` pass; True if woken by one. Drains
        the notifications already queued, so a burst of commits wakes the sweep once."""
        woken = False
        for _ in self.conn.notifies(timeout=max(0.0, seconds), stop_after=1):
            woken = True
        if woken:
            for _ in self.conn.notifies(timeout=0):
                pass
        return woken

    def close(self) -> None:
        """Closing the connection releases the lock and stops listening."""
        try:
            self.conn.close()
        except Exception:  # pragma: no cover - closing a broken connection
            log.debug("closing the listener connection failed", exc_info=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
