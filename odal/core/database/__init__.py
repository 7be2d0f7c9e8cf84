"""How long odal waits for its database: statement bounds (ODAL_DB_STATEMENT_SECONDS).

A database can stay connected and stop answering: a stuck server, a failover behind a pooler
or a load balancer, a network appliance that black-holes the connection but acknowledges it.
The server's own timeouts cannot help when the server never saw the statement, and TCP
keepalives never fire while something acknowledges. So every wait for PostgreSQL is bounded
twice, by the same figure:

- on the server, as `statement_timeout` and `lock_timeout` (nine tenths of the bound, so that a
  slow statement is the server's clean cancel, and the connection survives) and
  `idle_in_transaction_session_timeout` (the whole bound: a transaction its client forgot
  holds no lock longer);
- in the client (odal.core.database.base): a statement, a commit or a rollback that has no answer
  within the bound ends the connection and raises `Unanswered`, which odal.core.reconnect reads as a
  lost database: the API answers 503 database_unavailable, the probes and /metrics 503, a
  command exits 4, a worker waits for the database as for any outage. The waits before a first
  statement come out of the bound too (a reused connection's check, a new connection: see
  health_check_seconds and connect_seconds), so a database gone silent is answered within the
  bound however small it is.

The figure is ODAL_DB_STATEMENT_SECONDS when set (0: no bound), else the role's: WEB_SECONDS
for a process serving web requests (odal.wsgi says so), WORKER_SECONDS for everything else.
`odal migrate` runs unbounded: a migration may rewrite a big table, and an operator watches it.
"""

from django.conf import settings

WEB_SECONDS = 10
WORKER_SECONDS = 60
# A request that meets a database gone silent waits twice before its first statement: for the
# answer to its reused connection's SELECT 1, then for a new connection. Both come out of the
# bound, so that it is answered within it whatever the bound: at most a quarter of it for the
# check (and at most HEALTH_CHECK_SECONDS), at most half of it to connect (and at most the
# connect_timeout, 3 s unless DATABASE_URL says otherwise: odal.core.env).
HEALTH_CHECK_SECONDS = 2.0

WEB, WORKER, UNBOUNDED = "web", "worker", "unbounded"
role = WORKER  # odal.wsgi sets WEB; odal's command line UNBOUNDED for `migrate`


def statement_seconds() -> float | None:
    """How long a statement of this process may wait, or None for no bound."""
    if role == UNBOUNDED:
        return None
    configured = settings.ODAL_DB_STATEMENT_SECONDS
    if configured is None:
        return WEB_SECONDS if role == WEB else WORKER_SECONDS
    return configured or None


def health_check_seconds(bound: float | None) -> float:
    """How long a reused connection's check (SELECT 1) may wait under `bound`."""
    return min(HEALTH_CHECK_SECONDS, bound / 4) if bound else HEALTH_CHECK_SECONDS


def connect_seconds(bound: float | None) -> float | None:
    """How long making a connection may wait under `bound` (None: connect_timeout alone)."""
    return bound / 2 if bound else None


def server_options(seconds: float) -> str:
    """The startup `options` that make the server keep the bound too."""
    ms = int(seconds * 1000)
    return (
        f"-c statement_timeout={ms * 9 // 10} -c lock_timeout={ms * 9 // 10} "
        f"-c idle_in_transaction_session_timeout={ms}"
    )
