"""odal's settings, read from the environment (see CONTRACT.md's table).

Every variable goes through a small helper that raises ImproperlyConfigured naming the
variable, so a typo in a deployment stops start-up instead of running with a surprise.
"""

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlparse

import dj_database_url
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
    _check_secret_key,
)
from django.core.exceptions import ImproperlyConfigured

from odal import rules

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEFAULT_SECRET_KEY = "odal-development-only-secret-key-change-me"  # refused when ODAL_ENV=production
DB_CONNECT_TIMEOUT_SECONDS = 3  # PostgreSQL's connect_timeout unless DATABASE_URL sets one
# Redis's socket_connect_timeout and socket_timeout unless ODAL_BROKER_URL sets them; the read
# timeout stays above the 1 s BLPOP with which django-q2's pusher polls.
BROKER_CONNECT_TIMEOUT_SECONDS = 2
BROKER_TIMEOUT_SECONDS = 5
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


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
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


def env_duration(name: str, default: str, *, low_seconds: int, high_seconds: int) -> int | None:
    """Seconds of a duration such as 24h, 90m or 7d (d, h, m or s), or None for "off"."""
    raw = (os.environ.get(name) or "").strip() or default
    if raw.lower() == "off":
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if len(raw) < 2 or raw[-1].lower() not in units or not raw[:-1].isdigit() or len(raw) > 12:
        raise ImproperlyConfigured(f"{name} must be a duration such as 24h, 90m or 7d, or off; got {raw!r}")
    seconds = int(raw[:-1]) * units[raw[-1].lower()]
    if not low_seconds <= seconds <= high_seconds:
        raise ImproperlyConfigured(
            f"{name} must be from {low_seconds} seconds to {high_seconds // 86400} days, got {raw!r}"
        )
    return seconds


def without_password(text: str) -> str:
    """`text` with the password of any URL in it shown as ***: a start-up refusal goes to a
    terminal, a log, a CI run."""
    return re.sub(r"(://[^/@\s:]*:)[^/@\s]*@", r"\1***@", text)


def check_url_ports(name: str, url: str) -> None:
    """Every port a URL names (a PostgreSQL URL may name several hosts, comma-separated) must be
    one from 1 to 65,535: `http://registry:99999` was taken and failed only when first used."""
    netloc = urlparse(url).netloc.rpartition("@")[2]
    for host in netloc.split(","):
        # [v6]:port or name:port; a bare IPv6 address in brackets has no port after its ]
        port = host.rpartition("]")[2].rpartition(":")[2] if ":" in host.rpartition("]")[2] else ""
        if port and not (port.isdigit() and rules.PORT[0] <= int(port) <= rules.PORT[1]):
            raise ImproperlyConfigured(
                f"{name} must name a port from 1 to 65,535, got {port!r} in {without_password(url)!r}"
            )


def env_url(name: str, default: str, schemes: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip() or default
    parsed = urlparse(value)
    if parsed.scheme not in schemes or not (parsed.netloc or parsed.path):
        raise ImproperlyConfigured(
            f"{name} must be a {' or '.join(schemes)} URL, got {without_password(value)!r}"
        )
    check_url_ports(name, value)
    return value.rstrip("/")


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


def env_address(name: str, default: str) -> str:
    """HOST:PORT to listen on, checked by the command line's own rule (odal.rules.address)."""
    raw = os.environ.get(name, "").strip() or default
    try:
        return rules.address(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} {exc}, got {raw!r}") from None


def env_python_consumers(name: str, default: str) -> tuple[str, ...]:
    """The allow-list of Python consumers' targets (odal.rules.python_allow_list)."""
    raw = (os.environ.get(name) or "").strip() or default
    try:
        return rules.python_allow_list(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} {exc}, got {raw!r}") from None


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def database_from_env() -> dict:
    default = f"sqlite:///{VAR_DIR / 'odal.sqlite3'}"
    url = os.environ.get("DATABASE_URL", "").strip() or default
    if not url.startswith(("postgres://", "postgresql://", "sqlite://")):
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a postgres:// or sqlite:/// URL, got {without_password(url)!r}"
        )
    check_url_ports("DATABASE_URL", url)
    # Persistent connections (checked before reuse): a django-q2 worker or a sweep otherwise
    # opens a new connection for every task, which alone capped django-q2 near 40 tasks/s here.
    max_age = env_int("ODAL_DB_CONN_MAX_AGE", 60)
    try:
        config = dj_database_url.parse(url, conn_max_age=max_age, conn_health_checks=True)
    except Exception as exc:  # dj-database-url raises several kinds
        raise ImproperlyConfigured(f"DATABASE_URL could not be read: {without_password(str(exc))}") from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        Path(config["NAME"]).parent.mkdir(parents=True, exist_ok=True)
        # The web server, the sweep and the drain write at once: WAL, a busy timeout and
        # IMMEDIATE transactions keep SQLite from answering "database is locked".
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    else:
        # A database that does not answer fails a connection (and /readyz) within seconds, not
        # after the TCP timeout of minutes. A connect_timeout given in DATABASE_URL wins.
        config.setdefault("OPTIONS", {}).setdefault("connect_timeout", DB_CONNECT_TIMEOUT_SECONDS)
        for name, value in DB_KEEPALIVES.items():
            config["OPTIONS"].setdefault(name, value)
        # The server's statement bounds (odal.database) ride with the keepalives, unless the URL
        # has options of its own (a pooler that refuses them): the client's bound holds anyway.
        config["SERVER_BOUNDS"] = "options" not in config["OPTIONS"]
        config["OPTIONS"].setdefault("options", DB_SERVER_KEEPALIVES)
        config["ENGINE"] = "odal.database"  # Django's, with the statement bounds
        check_libpq_options(config["OPTIONS"])
    return config


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


ODAL_ENV = env_choice("ODAL_ENV", "development", ("development", "production"))
PRODUCTION = ODAL_ENV == "production"

# A blank SECRET_KEY counts as none: Django would take it and refuse only at the first request
# that signs something (every request of production would be a 500).
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY.strip():
    SECRET_KEY = DEFAULT_SECRET_KEY
DEBUG = env_bool("DEBUG", not PRODUCTION)
if PRODUCTION and SECRET_KEY == DEFAULT_SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set to a secret of your own when ODAL_ENV=production")
if PRODUCTION and not _check_secret_key(SECRET_KEY):  # Django's own test (check --deploy, security.W009)
    raise ImproperlyConfigured(
        f"SECRET_KEY is too weak for ODAL_ENV=production: Django's deploy check asks for at least "
        f"{SECRET_KEY_MIN_LENGTH} characters, at least {SECRET_KEY_MIN_UNIQUE_CHARACTERS} of them different, "
        f"and no '{SECRET_KEY_INSECURE_PREFIX}' prefix (make one with: python -c \"import secrets; "
        'print(secrets.token_urlsafe(50))")'
    )
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DEBUG must be off when ODAL_ENV=production")

# The host names this node answers to (the Host a load balancer forwards). Production must name
# them: the development default answers only to requests made on the machine itself.
ALLOWED_HOSTS = [h.strip() for h in env_str("ALLOWED_HOSTS", "").split(",") if h.strip()]
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS must name this node's host names (comma-separated, e.g. dpp.example.eu) "
        "when ODAL_ENV=production"
    )
if PRODUCTION and "*" in ALLOWED_HOSTS:  # any Host would do: password-reset links, caches poisoned
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS must name this node's host names, not '*', when ODAL_ENV=production "
        "(comma-separated, e.g. dpp.example.eu)"
    )
ALLOWED_HOSTS = ALLOWED_HOSTS or ["127.0.0.1", "localhost"]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

# The outbox and registry knobs of CONTRACT.md.
ODAL_CLAIM_HOLD_SECONDS = env_int("ODAL_CLAIM_HOLD_SECONDS", 300, minimum=1)
ODAL_MAX_ATTEMPTS = env_int("ODAL_MAX_ATTEMPTS", 8, minimum=1, maximum=1000)
ODAL_BACKOFF_BASE_SECONDS = env_int("ODAL_BACKOFF_BASE_SECONDS", 30, minimum=0)
ODAL_BACKOFF_MAX_SECONDS = env_int("ODAL_BACKOFF_MAX_SECONDS", 6 * 3600, minimum=1)
ODAL_REGISTRY_ADAPTER = env_choice("ODAL_REGISTRY_ADAPTER", "http", ("http", "none"))
ODAL_REGISTRY_URL = env_url("ODAL_REGISTRY_URL", "http://127.0.0.1:8100", ("http", "https"))
ODAL_REGISTRY_TOKEN = env_str("ODAL_REGISTRY_TOKEN", "odal-simulator-token")
ODAL_REGISTRY_TIMEOUT_SECONDS = env_int("ODAL_REGISTRY_TIMEOUT_SECONDS", 10, minimum=1)
# The whole of a lookup (every page of the registry's task list) runs under this deadline: abandon's,
# and the drain's before a deactivation (under its claim: odal.W001 warns of a hold not longer).
ODAL_REGISTRY_LOOKUP_SECONDS = env_int("ODAL_REGISTRY_LOOKUP_SECONDS", 60, minimum=1, maximum=3600)
# The admin's "Abandon…" asks the registry about every selected row at once (ODAL_REGISTRY_CONCURRENCY
# threads) within this many seconds in all, well below the web server's timeout (`odal serve` lowers
# it to two thirds of gunicorn's, if that is shorter): rows not checked in time are not written.
ODAL_ADMIN_REGISTRY_SECONDS = env_int("ODAL_ADMIN_REGISTRY_SECONDS", 20, minimum=1, maximum=3600)
# After a registry attempt whose outcome is unknown (its request may have reached the registry,
# no answer of the registry's own came back), absence in the task list proves nothing until this
# long has passed: a gateway or queue may still pass the request on (abandon, suspend).
ODAL_REGISTRY_SETTLE_SECONDS = env_int("ODAL_REGISTRY_SETTLE_SECONDS", 900, minimum=0, maximum=30 * 86400)
# How long a statement may wait for PostgreSQL (see odal.database): unset, 10 s in a web request
# and 60 s elsewhere; 0, no bound. Past it the connection is given up as a lost database.
ODAL_DB_STATEMENT_SECONDS = (
    env_int("ODAL_DB_STATEMENT_SECONDS", 0, minimum=0, maximum=3600)
    if env_str("ODAL_DB_STATEMENT_SECONDS", "").strip()
    else None
)
# After SIGTERM or SIGINT a long-running odal process has exited within this many seconds, whatever
# it waits for (see odal.stopping); a supervisor's stop timeout must exceed it.
ODAL_STOP_SECONDS = env_int("ODAL_STOP_SECONDS", 30, minimum=1, maximum=3600)
ODAL_REGISTRY_CHECK_SECONDS = env_int(
    "ODAL_REGISTRY_CHECK_SECONDS", 2, minimum=0
)  # first poll of a submitted row
ODAL_PUBLIC_URL = env_url("ODAL_PUBLIC_URL", "http://127.0.0.1:8000", ("http", "https"))  # dppEndpoint base
ODAL_REGISTRY_STALL_ATTEMPTS = env_int("ODAL_REGISTRY_STALL_ATTEMPTS", 5, minimum=1)
# How many registry requests a drain process has in flight at once (each on a thread of its own,
# with a database connection of its own).
ODAL_REGISTRY_CONCURRENCY = env_int("ODAL_REGISTRY_CONCURRENCY", 8, minimum=1, maximum=64)
# Registry requests per second across every drain process of the deployment, on every machine
# (kept in the database: registry.pace); unset, no limit. A 429 pauses them all either way.
# At least one request per claim hold: a slower rate could never send a claimed row in time (and
# one request every 1e300 s is no number the drain's clock can hold).
ODAL_REGISTRY_RATE_PER_SECOND = env_rate(
    "ODAL_REGISTRY_RATE_PER_SECOND",
    maximum=10_000,
    minimum=1 / ODAL_CLAIM_HOLD_SECONDS,
    why_minimum="one request per ODAL_CLAIM_HOLD_SECONDS: a slower rate could never send a claimed "
    "registration before its claim ran out",
)
ODAL_BROKER_URL = os.environ.get("ODAL_BROKER_URL", "").strip()
# Webhook consumers on loopback/private addresses are refused in production unless allowed.
ODAL_ALLOW_PRIVATE_WEBHOOKS = env_bool("ODAL_ALLOW_PRIVATE_WEBHOOKS", not PRODUCTION)
# How many requests a sweep process has in flight at once to any one webhook consumer.
# The callables a Python consumer's target may name (dotted paths, or prefix.*); anything else is
# refused on every surface, and a consumer outside it is paused by the sweep, never called.
ODAL_PYTHON_CONSUMERS = env_python_consumers("ODAL_PYTHON_CONSUMERS", "outbox.receiver.*")
ODAL_WEBHOOK_CONCURRENCY = env_int("ODAL_WEBHOOK_CONCURRENCY", 8, minimum=1, maximum=64)
# Kick an immediate sweep when a commit creates deliveries (off in most unit tests).
ODAL_KICK_SWEEP = env_bool("ODAL_KICK_SWEEP", True)
# /metrics answers only `Authorization: Bearer <ODAL_METRICS_TOKEN>` when set; unset, it is open,
# which production refuses.
ODAL_METRICS_TOKEN = env_str("ODAL_METRICS_TOKEN", "").strip()
if PRODUCTION and not ODAL_METRICS_TOKEN:
    raise ImproperlyConfigured(
        "ODAL_METRICS_TOKEN must be set when ODAL_ENV=production: /metrics then answers only "
        "'Authorization: Bearer <ODAL_METRICS_TOKEN>' (give the same token to Prometheus)"
    )
# A consumer whose every attempt failed for this long (and at least AUTO_PAUSE_MIN_FAILURES
# attempts) is paused by odal itself; "off" never pauses one.
ODAL_AUTO_PAUSE_AFTER = env_duration("ODAL_AUTO_PAUSE_AFTER", "24h", low_seconds=60, high_seconds=365 * 86400)
# /readyz answers 503 when deliveries are due and no sweep has finished a pass for this long.
ODAL_READYZ_SWEEP_SECONDS = env_int("ODAL_READYZ_SWEEP_SECONDS", 300, minimum=1)
# Retention (outbox.retention): delivered deliveries, events and the registry's attempt lines of
# registered or rejected registrations go after ODAL_RETENTION_DAYS; dead letters, which a person
# may still need, after ODAL_DEAD_RETENTION_DAYS. At most a century: a cutoff must stay a date.
ODAL_RETENTION_DAYS = env_int("ODAL_RETENTION_DAYS", 30, minimum=1, maximum=36_500)
ODAL_DEAD_RETENTION_DAYS = env_int("ODAL_DEAD_RETENTION_DAYS", 90, minimum=1, maximum=36_500)
# The registry's attempt lines that are evidence (of registrations that ended abandoned, suspended
# or deactivated, and of a registration's earlier work: see outbox.retention) go after
# ODAL_EVIDENCE_RETENTION_DAYS, ten years by default, and never before ODAL_RETENTION_DAYS.
ODAL_EVIDENCE_RETENTION_DAYS = env_int("ODAL_EVIDENCE_RETENTION_DAYS", 3650, minimum=1, maximum=36_500)
# `odal serve` (gunicorn): where it listens and how many worker processes it forks; gunicorn's
# own GUNICORN_CMD_ARGS may change either, and --bind/--workers override both.
ODAL_BIND = env_address("ODAL_BIND", "127.0.0.1:8000")
ODAL_WEB_WORKERS = env_int(
    "ODAL_WEB_WORKERS", min(2 * cores() + 1, rules.WEB_WORKERS[1]), minimum=1, maximum=rules.WEB_WORKERS[1]
)  # gunicorn's advice: two per core, plus one
# The biggest request body the API reads; larger ones get 413.
ODAL_MAX_BODY_BYTES = env_int("ODAL_MAX_BODY_BYTES", 256 * 1024, minimum=1024)
# POST dpp/bulk's own limit: up to 1,000 passports in one body.
ODAL_MAX_BULK_BODY_BYTES = env_int("ODAL_MAX_BULK_BODY_BYTES", 8 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(
    ODAL_MAX_BODY_BYTES, ODAL_MAX_BULK_BODY_BYTES
)  # the middleware holds each route to its own

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "ninja",
    "odal",
    "outbox",
    "registry",
]

MIDDLEWARE = [
    "odal.middleware.ApiErrorsAsJsonMiddleware",  # outermost: it sees every answer under the API
    "odal.middleware.BodySizeLimitMiddleware",
    "odal.middleware.UnstorableInputMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, before anything spends work on them
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "odal.database.middleware.DatabaseUnansweredMiddleware",  # a page's lost database: 503, not 500
]

ROOT_URLCONF = "odal.urls"
WSGI_APPLICATION = "odal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_from_env()}
if os.environ.get("ODAL_TEST_DATABASE"):  # lets two suites (make test, make fuzz) run side by side
    DATABASES["default"]["TEST"] = {"NAME": os.environ["ODAL_TEST_DATABASE"]}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# `odal serve` collects the static files into it (a folder of their own for each release, or
# var/static of the checkout); WhiteNoise serves them from there.
STATIC_ROOT = Path(env_str("ODAL_STATIC_ROOT", "").strip() or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production serves compressed files under content-hashed names, cached for a year; the
    # manifest that maps the names exists only once collectstatic ran (`odal serve` runs it).
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION

# django-q2: its ORM broker on the same database unless ODAL_BROKER_URL names Redis.
Q_CLUSTER = {
    "name": "odal",
    "workers": env_int("ODAL_Q_WORKERS", 2, minimum=1),
    "timeout": 90,
    "retry": 120,
    "max_attempts": 1,
    "queue_limit": 50,
    "catch_up": False,
    "label": "Background tasks",
    "poll": 0.2,
    # django-q2 logs every enqueue at INFO, which would litter `odal passport publish` output.
    "log_level": env_choice("ODAL_Q_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR")),
}
if ODAL_BROKER_URL:
    if not ODAL_BROKER_URL.startswith(("redis://", "rediss://")):
        raise ImproperlyConfigured(
            f"ODAL_BROKER_URL must be a redis:// URL, got {without_password(ODAL_BROKER_URL)!r}"
        )
    check_url_ports("ODAL_BROKER_URL", ODAL_BROKER_URL)
    Q_CLUSTER["redis"] = redis_url_with_timeouts(ODAL_BROKER_URL)
else:
    Q_CLUSTER["orm"] = "default"

# text: one plain line per record; json: one JSON object per line (odal/logs.py says which keys).
ODAL_LOG_FORMAT = env_choice("ODAL_LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "odal.logs.JsonFormatter"},
    },
    "filters": {"redact_urls": {"()": "odal.logs.RedactUrls"}},  # no URL credentials in a log
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if ODAL_LOG_FORMAT == "json" else "plain",
            "filters": ["redact_urls"],
        }
    },
    "loggers": {
        "odal": {"handlers": ["console"], "level": env_str("ODAL_LOG_LEVEL", "INFO")},
        "outbox": {"handlers": ["console"], "level": env_str("ODAL_LOG_LEVEL", "INFO")},
        "registry": {"handlers": ["console"], "level": env_str("ODAL_LOG_LEVEL", "INFO")},
    },
}
if ODAL_LOG_FORMAT == "json":
    # Every line JSON, not only odal's: the root logger gets the same handler for what others log
    # (Django's request errors, django-q2), Django's own console handler makes way for it, and
    # odal's loggers stop there so nothing is written twice.
    LOGGING["root"] = {"handlers": ["console"], "level": "WARNING"}
    LOGGING["loggers"]["django"] = {"handlers": [], "level": "INFO"}
    LOGGING["loggers"]["django-q"] = {"level": Q_CLUSTER["log_level"]}
    for name in ("odal", "outbox", "registry"):
        LOGGING["loggers"][name]["propagate"] = False
