"""Django's PostgreSQL backend with odal's statement bounds (see odal.database)."""

import contextlib

import psycopg
from django.db.backends.postgresql import base

from odal import database


class Unanswered(psycopg.OperationalError):
    """The database did not answer a statement within the bound; its connection is closed (an
    answer that comes later must not be read as another statement's)."""


class BoundedConnection(psycopg.Connection):
    """psycopg's connection whose every wait (a statement, a commit, a rollback, a fetch) ends
    after `bound` seconds. psycopg's own waits with a timeout of their own (LISTEN's notifies,
    the cancel on Ctrl-C) keep theirs."""

    bound: float | None = None

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


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        params = super().get_connection_params()
        seconds = database.statement_seconds()
        if seconds and self.settings_dict.get("SERVER_BOUNDS"):
            params["options"] = f"{params.get('options', '')} {database.server_options(seconds)}".strip()
        return params

    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        # psycopg makes its own Connection; the subclass adds behaviour, not state.
        connection.__class__ = BoundedConnection
        connection.bound = database.statement_seconds()
        return connection

    def is_usable(self):
        # A reused connection's check: a server that takes longer than this to answer SELECT 1
        # is not one to keep waiting on (the request reconnects, or answers 503, within its bound).
        if self.connection is None:
            return False
        with self.connection.bounded(
            min(database.HEALTH_CHECK_SECONDS, self.connection.bound or float("inf"))
        ):
            return super().is_usable()
