"""Django's PostgreSQL backend with odal's statement bounds (see odal.core.database), reading
timestamps with psycopg's own loader."""

import contextlib
import contextvars
import datetime
import time

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import IsolationLevel
from psycopg.types.datetime import TimestamptzLoader

from odal.core import database


class Unanswered(psycopg.OperationalError):
    """The database did not answer a statement within the bound; its connection is closed (an
    answer that comes later must not be read as another statement's)."""


# When the connection being made must have answered (time.monotonic()), if sooner than psycopg's
# connect_timeout says: see BoundedConnection.connect.
_CONNECT_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "connect_deadline", default=None
)


class BoundedConnection(psycopg.Connection):
    """psycopg's connection whose every wait (a statement, a commit, a rollback, a fetch) ends
    after `bound` seconds. psycopg's own waits with a timeout of their own (LISTEN's notifies,
    the cancel on Ctrl-C) keep theirs."""

    bound: float | None = None

    @classmethod
    def connect(cls, conninfo: str = "", *, within: float | None = None, **kwargs):
        """psycopg's connect, which also gives up after `within` seconds (None: psycopg's
        connect_timeout alone, which counts whole seconds and at least 2: too coarse for a
        small bound)."""
        if not within:
            return super().connect(conninfo, **kwargs)
        deadline = _CONNECT_DEADLINE.set(time.monotonic() + within)
        try:
            return super().connect(conninfo, **kwargs)
        finally:
            _CONNECT_DEADLINE.reset(deadline)

    @classmethod
    def _connect_gen(cls, conninfo: str = ""):
        # psycopg waits on this generator (resuming it at least every tenth of a second) and reads
        # its _WaitTimeout as its own connect_timeout expiring: "connection timeout expired".
        connecting = super()._connect_gen(conninfo)
        deadline = _CONNECT_DEADLINE.get()
        return connecting if deadline is None else _until(connecting, deadline)

    def wait(self, gen, interval=psycopg.connection._WAIT_INTERVAL, timeout=None):
        if timeout is not None or not self.bound:
            return super().wait(gen, interval=interval, timeout=timeout)
        try:
            return super().wait(gen, interval=interval, timeout=self.bound)
        except psycopg.errors._WaitTimeout:
            self.pgconn.finish()
            raise Unanswered(f"no answer within {self.bound:g} s (ODAL_DB_STATEMENT_SECONDS)") from None

    @contextlib.contextmanager
    def bounded(self, seconds: float):
        """Waits within the `with` end after `seconds` instead (a wait that is meant to be
        shorter, or a lock wait meant to be longer, than the bound)."""
        kept, self.bound = self.bound, seconds
        try:
            yield
        finally:
            self.bound = kept


def _until(connecting, deadline: float):
    """The connect generator `connecting`, given up at `deadline` (time.monotonic())."""
    try:
        waiting = next(connecting)
        while True:
            ready = yield waiting
            if time.monotonic() >= deadline:
                raise psycopg.errors._WaitTimeout("connect deadline")
            waiting = connecting.send(ready)
    except StopIteration as made:
        return made.value


class DatabaseWrapper(base.DatabaseWrapper):
    # Whether the connection reads timestamptz with psycopg's own loader (see get_connection_params).
    psycopg_timestamps = False

    def get_connection_params(self):
        params = super().get_connection_params()
        self.psycopg_timestamps = False  # (a connection made again under other settings: tests)
        # Django registers a loader of its own for timestamptz, a subclass of psycopg's pure-Python
        # one (to set the time zone after), which parses each value with a regular expression in
        # Python: about 2.7 microseconds a value here against 0.4 for psycopg's C loader, paid by
        # every row a sweep reads (its event's time) and every row of every list. On a connection
        # whose TimeZone is UTC (Django sets it so when USE_TZ and the database's TIME_ZONE is
        # unset, as odal runs) psycopg's loader answers what Django's does: the moment, with
        # tzinfo datetime.timezone.utc. Registered as the Python class, psycopg takes its C one.
        if settings.USE_TZ and self.timezone is datetime.UTC and self.timezone_name == "UTC":
            params["context"].register_loader("timestamptz", TimestamptzLoader)
            self.psycopg_timestamps = True
        seconds = database.statement_seconds()
        if seconds and self.settings_dict.get("SERVER_BOUNDS"):
            params["options"] = f"{params.get('options', '')} {database.server_options(seconds)}".strip()
        return params

    def get_new_connection(self, conn_params):
        bound = database.statement_seconds()
        if self.pool or "isolation_level" in self.settings_dict["OPTIONS"]:  # (not odal's: Django's way)
            connection = super().get_new_connection(conn_params)
            # psycopg makes its own Connection; the subclass adds behaviour, not state.
            connection.__class__ = BoundedConnection
        else:
            # Django's, connecting within the bound's share (odal.core.database.connect_seconds).
            self.isolation_level = IsolationLevel.READ_COMMITTED
            connection = BoundedConnection.connect(within=database.connect_seconds(bound), **conn_params)
        connection.bound = bound
        return connection

    def create_cursor(self, name=None):
        if not self.psycopg_timestamps:
            return super().create_cursor(name)
        # Django's, but for its check of the loader's time zone (psycopg's loader has no `timezone`;
        # it answers in the connection's, UTC, which is Django's: see get_connection_params).
        if not name:
            cursor = self.connection.cursor()
        elif self.settings_dict["OPTIONS"].get("server_side_binding") is not True:
            cursor = base.ServerSideCursor(
                self.connection, name=name, scrollable=False, withhold=self.connection.autocommit
            )
        else:
            cursor = self.connection.cursor(name, scrollable=False, withhold=self.connection.autocommit)
        if not (settings.USE_TZ and self.timezone is datetime.UTC):  # (settings changed under it: tests)
            base.register_tzloader(self.timezone, cursor)  # (Django's loader, for this cursor)
        return cursor

    def is_usable(self):
        # A reused connection's check: a server that takes longer than this to answer SELECT 1
        # is not one to keep waiting on (the request reconnects, or answers 503, within its bound:
        # odal.core.database.health_check_seconds).
        if self.connection is None:
            return False
        with self.connection.bounded(database.health_check_seconds(self.connection.bound)):
            return super().is_usable()
