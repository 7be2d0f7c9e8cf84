"""Typed readers of odal's environment (CONTRACT.md's table), for odal/settings.py.

Each reader takes the variable's name and its default, and answers a value of its type or
raises ImproperlyConfigured naming the variable, so a typo in a deployment stops start-up
(exit 1) instead of running with a surprise. A variable that is unset or blank reads as its
default (env_str alone answers the text as it is set). A refusal that shows a URL shows it without its password (a start-up refusal goes to
a terminal, a log, a CI run).
"""

import ipaddress
import os
import re
from urllib.parse import parse_qsl, urlencode, urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from odal.core import rules

DEFAULT_SECRET_KEY = "odal-development-only-secret-key-change-me"  # refused when ODAL_ENV=production

# -- plain values ------------------------------------------------------------------------------


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_list(name: str) -> list[str]:
    """Comma-separated items, spaces around them and empty ones dropped; unset, none."""
    return [item.strip() for item in env_str(name, "").split(",") if item.strip()]


def env_int(name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ImproperlyConfigured(f"{name} must be {bounds}, got {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def env_rate(name: str, *, maximum: float, minimum: float = 0.0, why_minimum: str = "") -> float | None:
    """A rate per second above 0 (decimals allowed, e.g. 0.5 for one every two seconds) and at
    least `minimum` (`why_minimum` says why), or None when unset."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= maximum:  # NaN fails too
        raise ImproperlyConfigured(
            f"{name} must be a number of requests per second above 0 and at most {maximum:,g}, "
            f"or unset for no limit; got {raw!r}"
        )
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum:g} ({why_minimum}); got {raw!r}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip() or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_duration(
    name: str, default: str, *, low_seconds: int, high_seconds: int, may_be_off: bool = True
) -> int | None:
    """Seconds of a duration such as 24h, 90m or 7d (d, h, m or s), or None for "off" (where
    `may_be_off`)."""
    raw = (os.environ.get(name) or "").strip() or default
    if may_be_off and raw.lower() == "off":
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if len(raw) < 2 or raw[-1].lower() not in units or not raw[:-1].isdigit() or len(raw) > 12:
        off = ", or off" if may_be_off else ""
        raise ImproperlyConfigured(f"{name} must be a duration such as 24h, 90m or 7d{off}; got {raw!r}")
    seconds = int(raw[:-1]) * units[raw[-1].lower()]
    if not low_seconds <= seconds <= high_seconds:
        raise ImproperlyConfigured(
            f"{name} must be from {low_seconds} seconds to {high_seconds // 86400} days, got {raw!r}"
        )
    return seconds


def env_address(name: str, default: str) -> str:
    """HOST:PORT to listen on, checked by the command line's own rule (odal.core.rules.address)."""
    raw = os.environ.get(name, "").strip() or default
    try:
        return rules.address(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} {exc}, got {raw!r}") from None


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IP addresses or CIDR networks (10.0.0.0/8, 2001:db8::/32); unset, none."""
    networks = []
    for item in env_list(name):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} must be comma-separated IP addresses or networks (such as 10.0.0.5 or "
                f"10.0.0.0/8), got {item!r}"
            ) from None
    return tuple(networks)


def env_python_consumers(name: str, default: str) -> tuple[str, ...]:
    """The allow-list of Python consumers' targets (odal.core.rules.python_allow_list)."""
    raw = (os.environ.get(name) or "").strip() or default
    try:
        return rules.python_allow_list(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} {exc}, got {raw!r}") from None


# -- URLs --------------------------------------------------------------------------------------


def without_password(text: str) -> str:
    """`text` with the password of any URL in it shown as ***: a start-up refusal goes to a
    terminal, a log, a CI run."""
    return re.sub(r"(://[^/@\s:]*:)[^/@\s]*@", r"\1***@", text)


def check_url_ports(name: str, url: str) -> None:
    """Every port a URL names (a PostgreSQL URL may name several hosts, comma-separated) must be
    one from 1 to 65,535: `http://registry:99999` was taken and failed only when first used."""
    netloc = parsed_url(name, url).netloc.rpartition("@")[2]
    for host in netloc.split(","):
        # [v6]:port or name:port; a bare IPv6 address in brackets has no port after its ]
        port = host.rpartition("]")[2].rpartition(":")[2] if ":" in host.rpartition("]")[2] else ""
        if port and not (port.isdigit() and rules.PORT[0] <= int(port) <= rules.PORT[1]):
            raise ImproperlyConfigured(
                f"{name} must name a port from 1 to 65,535, got {port!r} in {without_password(url)!r}"
            )


def parsed_url(name: str, url: str):
    """`url` as urlparse reads it; one it cannot read (`http://[::1`) is refused by name."""
    try:
        return urlparse(url)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must be a valid URL ({exc}), got {without_password(url)!r}"
        ) from None


def env_url(name: str, default: str, schemes: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip() or default
    parsed = parsed_url(name, value)
    if parsed.scheme not in schemes or not (parsed.netloc or parsed.path):
        raise ImproperlyConfigured(
            f"{name} must be a {' or '.join(schemes)} URL, got {without_password(value)!r}"
        )
    check_url_ports(name, value)
    return value.rstrip("/")


# -- the broker (django-q2 on Redis) -----------------------------------------------------------

# Redis's socket_connect_timeout and socket_timeout unless ODAL_BROKER_URL sets them; the read
# timeout stays above the 1 s BLPOP with which django-q2's pusher polls.
BROKER_CONNECT_TIMEOUT_SECONDS = 2
BROKER_TIMEOUT_SECONDS = 5


def env_redis_url(name: str) -> str:
    """A redis:// (or rediss://) URL, or "" when unset."""
    url = os.environ.get(name, "").strip()
    if not url:
        return ""
    if not url.startswith(("redis://", "rediss://")):
        raise ImproperlyConfigured(f"{name} must be a redis:// URL, got {without_password(url)!r}")
    check_url_ports(name, url)
    return url


def redis_url_with_timeouts(url: str) -> str:
    """redis-py waits for ever by default. A Redis that takes connections and stops answering (a
    hung server, a network partition) would then hold each kick (and the request that commits
    it), the pusher's poll and the sentinel's heartbeat for good, and the cluster would never
    come back; with these timeouts each fails within seconds and django-q2 reconnects."""
    parsed = urlparse(url)
    query = dict(parse_qsl(parsed.query))
    query.setdefault("socket_connect_timeout", str(BROKER_CONNECT_TIMEOUT_SECONDS))
    query.setdefault("socket_timeout", str(BROKER_TIMEOUT_SECONDS))
    return parsed._replace(query=urlencode(query)).geturl()


# -- the database (DATABASE_URL) ---------------------------------------------------------------

DB_CONNECT_TIMEOUT_SECONDS = 3  # PostgreSQL's connect_timeout unless DATABASE_URL sets one
# A worker cut off from PostgreSQL by the network must give its connection up, and so must its
# backend on the server, which may hold row locks a claim or a terminal write took: without these
# a cut-off transaction keeps its rows locked (other sweeps' dead-lettering waits behind them)
# for the kernel's defaults of 15 minutes to 2 hours. libpq's keepalives probe an idle connection
# and tcp_user_timeout gives up on data left unacknowledged; the same four, sent in `options`,
# make the backend do the same. A dead peer is noticed within about 11 s; a slow query is not
# affected (its connection is acknowledged and answers the probes). DATABASE_URL may set any of
# them (e.g. ?keepalives_idle=30); an `options` of its own replaces the server settings (a pooler
# that refuses the options parameter, as PgBouncer does, needs `ignore_startup_parameters =
# options`, and its own keepalives towards the server).
DB_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}
DB_SERVER_KEEPALIVES = "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 -c tcp_user_timeout=10000"

# libpq's connection options whose values it checks only when connecting: a bad one then read as
# "the database does not answer" (exit 4, try again) although no retry can help. Checked at start.
LIBPQ_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "sslcertmode": ("disable", "allow", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}
LIBPQ_WHOLE_NUMBERS = (
    "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "tcp_user_timeout", "sslcompression", "sslsni",
)  # fmt: skip
# OPTIONS that Django's PostgreSQL backend takes for itself; the rest go to libpq.
DJANGO_PG_OPTIONS = ("isolation_level", "assume_role", "server_side_binding", "pool", "cursor_factory")


def database_from_env(default: str) -> dict:
    """DATABASES["default"] from DATABASE_URL (`default`, the embedded server's, when unset), kept
    ODAL_DB_CONN_MAX_AGE seconds (60): odal's engine (odal.core.database: the statement bounds), a
    connect timeout and the keepalives. odal runs on PostgreSQL only."""
    url = os.environ.get("DATABASE_URL", "").strip() or default
    if url.lower().startswith("sqlite"):
        raise ImproperlyConfigured(
            "DATABASE_URL is a SQLite URL, and odal runs on PostgreSQL only: set DATABASE_URL to a "
            "postgres://user@host:port/odal URL, or unset it to use the embedded PostgreSQL under var/pg"
        )
    if not url.startswith(("postgres://", "postgresql://")):
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgres:// URL, got {without_password(url)!r}")
    check_url_ports("DATABASE_URL", url)
    # Persistent connections (checked before reuse): a django-q2 worker or a sweep otherwise
    # opens a new connection for every task, which alone capped django-q2 near 40 tasks/s here.
    max_age = env_int("ODAL_DB_CONN_MAX_AGE", 60)
    try:
        config = dj_database_url.parse(url, conn_max_age=max_age, conn_health_checks=True)
    except Exception as exc:  # dj-database-url raises several kinds
        raise ImproperlyConfigured(f"DATABASE_URL could not be read: {without_password(str(exc))}") from None
    if not config.get("NAME"):  # (postgres:// alone: Django refused it only when first connecting)
        raise ImproperlyConfigured(f"DATABASE_URL must name a database, got {without_password(url)!r}")
    # A database that does not answer fails a connection (and /readyz) within seconds, not
    # after the TCP timeout of minutes. A connect_timeout given in DATABASE_URL wins.
    config.setdefault("OPTIONS", {}).setdefault("connect_timeout", DB_CONNECT_TIMEOUT_SECONDS)
    for name, value in DB_KEEPALIVES.items():
        config["OPTIONS"].setdefault(name, value)
    # The server's statement bounds (odal.core.database) ride with the keepalives, unless the URL
    # has options of its own (a pooler that refuses them): the client's bound holds anyway.
    config["SERVER_BOUNDS"] = "options" not in config["OPTIONS"]
    config["OPTIONS"].setdefault("options", DB_SERVER_KEEPALIVES)
    config["ENGINE"] = "odal.core.database"  # Django's, with the statement bounds
    check_libpq_options(config["OPTIONS"])
    return config


def check_libpq_options(options: dict) -> None:
    """The connection options DATABASE_URL's query gives libpq: each one libpq knows (its own
    parser, psycopg.pq.Conninfo.parse, says which), with a value it would take."""
    from psycopg import Error as PsycopgError
    from psycopg import pq
    from psycopg.conninfo import make_conninfo

    given = {k: v for k, v in options.items() if k not in DJANGO_PG_OPTIONS}
    try:
        pq.Conninfo.parse(make_conninfo(**{k: str(v) for k, v in given.items()}).encode())
    except PsycopgError as exc:
        raise ImproperlyConfigured(
            f"DATABASE_URL has a connection option libpq does not know: {str(exc).strip()}"
        ) from None
    for name, choices in LIBPQ_CHOICES.items():
        if name in given and str(given[name]) not in choices:
            raise ImproperlyConfigured(
                f"DATABASE_URL's {name} must be one of {', '.join(choices)}, got {str(given[name])!r}"
            )
    for name in LIBPQ_WHOLE_NUMBERS:
        if name in given and not str(given[name]).strip().lstrip("-").isdigit():
            raise ImproperlyConfigured(
                f"DATABASE_URL's {name} must be a whole number, got {str(given[name])!r}"
            )
