"""odal's settings: Django's, and the knobs of CONTRACT.md's table, read from the environment.

Every variable goes through a typed reader of odal.core.env that raises ImproperlyConfigured naming
the variable, so a typo in a deployment stops start-up instead of running with a surprise. What
is left here are names, grouped by what they govern, each with why it has its default; the
refusals that judge settings together (production's) stay beside the names they judge.
"""

import os
from datetime import timedelta
from pathlib import Path

from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
    _check_secret_key,
)
from django.core.exceptions import ImproperlyConfigured

from odal.core import rules
from odal.core.database import embedded
from odal.core.env import (
    DEFAULT_SECRET_KEY,
    database_from_env,
    env_address,
    env_bool,
    env_choice,
    env_duration,
    env_int,
    env_list,
    env_networks,
    env_python_consumers,
    env_rate,
    env_redis_url,
    env_str,
    env_url,
    redis_url_with_timeouts,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# -- where it runs, and Django's own refusals of production -----------------------------------

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
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS")
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
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# -- claims and retries (both outboxes) -------------------------------------------------------

ODAL_CLAIM_HOLD_SECONDS = env_int("ODAL_CLAIM_HOLD_SECONDS", 300, minimum=1)
ODAL_MAX_ATTEMPTS = env_int("ODAL_MAX_ATTEMPTS", 8, minimum=1, maximum=1000)
ODAL_BACKOFF_BASE_SECONDS = env_int("ODAL_BACKOFF_BASE_SECONDS", 30, minimum=0)
ODAL_BACKOFF_MAX_SECONDS = env_int("ODAL_BACKOFF_MAX_SECONDS", 6 * 3600, minimum=1)

# -- the registry outbox ----------------------------------------------------------------------

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
ODAL_REGISTRY_CHECK_SECONDS = env_int(
    "ODAL_REGISTRY_CHECK_SECONDS", 2, minimum=0
)  # first poll of a submitted row
ODAL_PUBLIC_URL = env_url("ODAL_PUBLIC_URL", "http://127.0.0.1:8000", ("http", "https"))  # dppEndpoint base
ODAL_REGISTRY_STALL_ATTEMPTS = env_int("ODAL_REGISTRY_STALL_ATTEMPTS", 5, minimum=1)
# How many registry requests a drain process has in flight at once (each on a thread of its own,
# which uses no database connection: only the pass's thread reads and writes).
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

# -- bounds -----------------------------------------------------------------------------------

# How long a statement may wait for PostgreSQL (see odal.core.database): unset, 10 s in a web request
# and 60 s elsewhere; 0, no bound. Past it the connection is given up as a lost database.
ODAL_DB_STATEMENT_SECONDS = env_int("ODAL_DB_STATEMENT_SECONDS", None, minimum=0, maximum=3600)
# After SIGTERM or SIGINT a long-running odal process has exited within this many seconds, whatever
# it waits for (see odal.core.stopping); a supervisor's stop timeout must exceed it.
ODAL_STOP_SECONDS = env_int("ODAL_STOP_SECONDS", 30, minimum=1, maximum=3600)

# -- the event outbox -------------------------------------------------------------------------

# Webhook consumers on loopback/private addresses are refused in production unless allowed.
ODAL_ALLOW_PRIVATE_WEBHOOKS = env_bool("ODAL_ALLOW_PRIVATE_WEBHOOKS", not PRODUCTION)
# The callables a Python consumer's target may name (dotted paths, or prefix.*); anything else is
# refused on every surface, and a consumer outside it is paused by the sweep, never called.
ODAL_PYTHON_CONSUMERS = env_python_consumers("ODAL_PYTHON_CONSUMERS", "outbox.receiver.*")
# How many requests a sweep process has in flight at once to any one webhook consumer.
ODAL_WEBHOOK_CONCURRENCY = env_int("ODAL_WEBHOOK_CONCURRENCY", 8, minimum=1, maximum=64)
# Kick an immediate sweep when a commit creates deliveries (off in most unit tests).
ODAL_KICK_SWEEP = env_bool("ODAL_KICK_SWEEP", True)
# A consumer whose every attempt failed for this long (and at least AUTO_PAUSE_MIN_FAILURES
# attempts) is paused by odal itself; "off" never pauses one.
ODAL_AUTO_PAUSE_AFTER = env_duration("ODAL_AUTO_PAUSE_AFTER", "24h", low_seconds=60, high_seconds=365 * 86400)

# -- monitoring -------------------------------------------------------------------------------

# /metrics answers only `Authorization: Bearer <ODAL_METRICS_TOKEN>` when set; unset, it is open,
# which production refuses.
ODAL_METRICS_TOKEN = env_str("ODAL_METRICS_TOKEN", "").strip()
if PRODUCTION and not ODAL_METRICS_TOKEN:
    raise ImproperlyConfigured(
        "ODAL_METRICS_TOKEN must be set when ODAL_ENV=production: /metrics then answers only "
        "'Authorization: Bearer <ODAL_METRICS_TOKEN>' (give the same token to Prometheus)"
    )
# /readyz answers 503 when deliveries are due and no sweep has finished a pass for this long.
ODAL_READYZ_SWEEP_SECONDS = env_int("ODAL_READYZ_SWEEP_SECONDS", 300, minimum=1)

# -- retention --------------------------------------------------------------------------------

# Retention (outbox.retention): delivered deliveries, events and the registry's attempt lines of
# registered or rejected registrations go after ODAL_RETENTION_DAYS; dead letters, which a person
# may still need, after ODAL_DEAD_RETENTION_DAYS. At most a century: a cutoff must stay a date.
ODAL_RETENTION_DAYS = env_int("ODAL_RETENTION_DAYS", 30, minimum=1, maximum=36_500)
ODAL_DEAD_RETENTION_DAYS = env_int("ODAL_DEAD_RETENTION_DAYS", 90, minimum=1, maximum=36_500)
# The registry's attempt lines that are evidence (of registrations that ended abandoned, suspended
# or deactivated, and of a registration's earlier work: see outbox.retention) go after
# ODAL_EVIDENCE_RETENTION_DAYS, ten years by default, and never before ODAL_RETENTION_DAYS.
ODAL_EVIDENCE_RETENTION_DAYS = env_int("ODAL_EVIDENCE_RETENTION_DAYS", 3650, minimum=1, maximum=36_500)

# -- the web server ---------------------------------------------------------------------------

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
    "odal.core",  # label "odal": its models, migrations and permissions keep their names
    "outbox",
    "registry",
    "odal.surfaces",
]

MIDDLEWARE = [
    "odal.core.middleware.ApiErrorsAsJsonMiddleware",  # outermost: it sees every answer under the API
    "odal.core.middleware.BodySizeLimitMiddleware",
    "odal.core.middleware.UnstorableInputMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, before anything spends work on them
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "odal.core.database.middleware.DatabaseUnansweredMiddleware",  # a page's lost database: 503, not 500
]

# Sign-in: second factor. TOTP devices and single-use recovery codes (django-otp); OTPMiddleware
# marks a session verified once a code was typed, and odal.core.second_factor's middleware keeps a
# session that owes one (production's changers, anyone enrolled) to the enrolment or code page.
INSTALLED_APPS += ["django_otp", "django_otp.plugins.otp_totp", "django_otp.plugins.otp_static"]
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "django_otp.middleware.OTPMiddleware",
)
MIDDLEWARE.insert(
    MIDDLEWARE.index("django_otp.middleware.OTPMiddleware") + 1,
    "odal.core.second_factor.SecondFactorMiddleware",
)
OTP_TOTP_ISSUER = "odal"  # the name an authenticator app shows beside the code
# (end of "Sign-in: second factor")

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

# DATABASE_URL (and ODAL_DB_CONN_MAX_AGE, the seconds a connection is kept: 60); unset, the
# embedded PostgreSQL in ODAL_PG_DIR (var/pg; odal.core.database.embedded), which odal's command line
# starts.
ODAL_PG_DIR = Path(env_str("ODAL_PG_DIR", "").strip() or VAR_DIR / "pg").resolve()
ODAL_EMBEDDED_DATABASE = None if env_str("DATABASE_URL", "").strip() else ODAL_PG_DIR
DATABASES = {"default": database_from_env(embedded.url(ODAL_PG_DIR))}
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
FORMAT_MODULE_PATH = ["odal.core.formats"]  # every time the admin shows to the second, with its zone

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

# -- Headers: CSP, referrer, HSTS (docs/security.md, "Headers") ------------------------------

# Every answer carries a Content-Security-Policy (django-csp): the admin's scripts, styles, fonts
# and images come from odal itself (static files: no inline script or style anywhere), images also
# as data: URLs (the second factor's QR code), and no other site may frame a page, post its forms
# or reset its base URL. A deployment that needs another source adds it here.
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1, "csp.middleware.CSPMiddleware"
)
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'none'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],  # live.js polls its own pages
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'self'"],
        "object-src": ["'none'"],
    }
}
X_FRAME_OPTIONS = "DENY"  # (Django's default; frame-ancestors says the same to newer browsers)
SECURE_REFERRER_POLICY = "same-origin"  # (Django's default) no page address leaves for another site
# HSTS in production, on every https answer (the balancer's X-Forwarded-Proto, which gunicorn believes
# from FORWARDED_ALLOW_IPS): a year, this host's subdomains too, and no request for the browsers'
# preload list, which would bind the whole registrable domain (security.W021, silenced). odal does
# not redirect http itself (security.W008, silenced): the balancer does, and its plain-http health
# checks of /healthz must not get a redirect.
SECURE_HSTS_SECONDS = 365 * 86400 if PRODUCTION else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_HSTS_PRELOAD = False
SILENCED_SYSTEM_CHECKS = ["security.W008", "security.W021"]

# django-q2: its ORM broker on the same database unless ODAL_BROKER_URL names Redis.
# django-q2 ends a task at its timeout wherever its code is; a pass in a task starts no attempt that
# could not end before it (odal.work.deadline), and registry.checks refuses a timeout too short for the
# longest attempt (docs/runbook.md, "Task timeouts"). A task still running at `retry` would be
# presented to another worker: retry stays above the timeout.
ODAL_Q_TIMEOUT_SECONDS = env_int("ODAL_Q_TIMEOUT_SECONDS", 90, minimum=1, maximum=86400)
Q_CLUSTER = {
    "name": "odal",
    "workers": env_int("ODAL_Q_WORKERS", 2, minimum=1),
    "timeout": ODAL_Q_TIMEOUT_SECONDS,
    "retry": ODAL_Q_TIMEOUT_SECONDS + 30,
    "max_attempts": 1,
    "queue_limit": 50,
    "catch_up": False,
    "label": "Background tasks",
    "poll": 0.2,
    # django-q2 logs every enqueue at INFO, which would litter `odal passport publish` output.
    "log_level": env_choice("ODAL_Q_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR")),
}
ODAL_BROKER_URL = env_redis_url("ODAL_BROKER_URL")
if ODAL_BROKER_URL:
    Q_CLUSTER["redis"] = redis_url_with_timeouts(ODAL_BROKER_URL)
else:
    Q_CLUSTER["orm"] = "default"

# text: one plain line per record; json: one JSON object per line (odal/core/logs.py says which keys).
ODAL_LOG_FORMAT = env_choice("ODAL_LOG_FORMAT", "text", ("text", "json"))
ODAL_LOG_LEVEL = env_choice("ODAL_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "odal.core.logs.JsonFormatter"},
    },
    "filters": {
        "redact_urls": {"()": "odal.core.logs.RedactUrls"},  # no URL credentials in a log
        "lost_database_in_a_line": {"()": "odal.core.logs.LostDatabaseInALine"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if ODAL_LOG_FORMAT == "json" else "plain",
            "filters": ["redact_urls"],
        }
    },
    "loggers": {
        "odal": {"handlers": ["console"], "level": ODAL_LOG_LEVEL},
        "outbox": {"handlers": ["console"], "level": ODAL_LOG_LEVEL},
        "registry": {"handlers": ["console"], "level": ODAL_LOG_LEVEL},
        # django-q2 adds its own handler (text) or reaches the root's (json); this only filters
        "django-q": {"filters": ["lost_database_in_a_line"], "level": Q_CLUSTER["log_level"]},
    },
}
if ODAL_LOG_FORMAT == "json":
    # Every line JSON, not only odal's: the root logger gets the same handler for what others log
    # (Django's request errors, django-q2), Django's own console handler makes way for it, and
    # odal's loggers stop there so nothing is written twice.
    LOGGING["root"] = {"handlers": ["console"], "level": "WARNING"}
    LOGGING["loggers"]["django"] = {"handlers": [], "level": "INFO"}
    for name in ("odal", "outbox", "registry"):
        LOGGING["loggers"][name]["propagate"] = False

# -- Sign-in: lockout (django-axes; odal.surfaces.signin.lockout, docs/security.md "Lockout") -----

# ODAL_LOGIN_ATTEMPTS wrong passwords for one account from one address, none of them more than
# ODAL_LOGIN_WINDOW after the one before, lock that account from that address until the window
# has passed since the last of them, even with the right password. Other accounts and other
# addresses are not locked. X-Forwarded-For is believed only from ODAL_TRUSTED_PROXIES.
ODAL_LOGIN_ATTEMPTS = env_int("ODAL_LOGIN_ATTEMPTS", 5, minimum=1, maximum=1000)
ODAL_LOGIN_WINDOW = env_duration(
    "ODAL_LOGIN_WINDOW", "15m", low_seconds=1, high_seconds=30 * 86400, may_be_off=False
)
ODAL_TRUSTED_PROXIES = env_networks("ODAL_TRUSTED_PROXIES")
INSTALLED_APPS += ["axes", "odal.surfaces.signin"]
MIDDLEWARE += ["axes.middleware.AxesMiddleware"]  # turns a locked sign-in's answer into the lock's page
AXES_FAILURE_LIMIT = ODAL_LOGIN_ATTEMPTS
AXES_COOLOFF_TIME = timedelta(seconds=ODAL_LOGIN_WINDOW)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # the pair, never either alone
AXES_CLIENT_IP_CALLABLE = "odal.surfaces.signin.lockout.client_address"  # (never ipware's guesses)
AXES_WHITELIST_CALLABLE = (
    "odal.surfaces.signin.lockout.not_a_password"  # single sign-on's callback is no guess
)
AXES_LOCKOUT_CALLABLE = "odal.surfaces.signin.lockout.locked_out"
AXES_RESET_ON_SUCCESS = True  # the right password before the limit starts the count again
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # a refused try does not move the lock's end
AXES_DISABLE_ACCESS_LOG = True  # the audit trail records locks; no table of every sign-in
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False

# -- Sign-in: single sign-on (mozilla-django-oidc; odal.surfaces.signin.sso, docs/security.md) ----

# On when the three are set; ODAL_OIDC_GROUPS_CLAIM names the claim whose values Operators and
# Viewers map to odal's groups. ODAL_PASSWORD_LOGIN=0 (only with single sign-on) turns staff
# password sign-in off.
ODAL_OIDC_ISSUER = env_str("ODAL_OIDC_ISSUER", "").strip()
ODAL_OIDC_CLIENT_ID = env_str("ODAL_OIDC_CLIENT_ID", "").strip()
ODAL_OIDC_CLIENT_SECRET = env_str("ODAL_OIDC_CLIENT_SECRET", "").strip()
_OIDC_SET = {"ODAL_OIDC_ISSUER": ODAL_OIDC_ISSUER, "ODAL_OIDC_CLIENT_ID": ODAL_OIDC_CLIENT_ID,
             "ODAL_OIDC_CLIENT_SECRET": ODAL_OIDC_CLIENT_SECRET}  # fmt: skip
ODAL_OIDC = all(_OIDC_SET.values())
if any(_OIDC_SET.values()) and not ODAL_OIDC:
    raise ImproperlyConfigured(
        "Single sign-on needs ODAL_OIDC_ISSUER, ODAL_OIDC_CLIENT_ID and ODAL_OIDC_CLIENT_SECRET all set; "
        f"{', '.join(name for name, value in _OIDC_SET.items() if not value)} "
        f"{'is' if sum(not value for value in _OIDC_SET.values()) == 1 else 'are'} not"
    )
if ODAL_OIDC:
    ODAL_OIDC_ISSUER = env_url("ODAL_OIDC_ISSUER", "", ("https",) if PRODUCTION else ("http", "https"))
ODAL_OIDC_GROUPS_CLAIM = env_str("ODAL_OIDC_GROUPS_CLAIM", "").strip() or "groups"
ODAL_PASSWORD_LOGIN = env_bool("ODAL_PASSWORD_LOGIN", True)
if not ODAL_PASSWORD_LOGIN and not ODAL_OIDC:
    raise ImproperlyConfigured(
        "ODAL_PASSWORD_LOGIN=0 turns password sign-in off only when single sign-on is on "
        "(ODAL_OIDC_ISSUER, ODAL_OIDC_CLIENT_ID, ODAL_OIDC_CLIENT_SECRET): without it no one could sign in"
    )
AUTHENTICATION_BACKENDS = [
    "odal.surfaces.signin.lockout.LockBackend",  # first: a locked pair goes no further
    *(["odal.surfaces.signin.sso.SignOnBackend"] if ODAL_OIDC else []),
    # (single sign-on's backend answers permissions as Django's does, for the sessions it signs in)
    *(["django.contrib.auth.backends.ModelBackend"] if ODAL_PASSWORD_LOGIN else []),
]
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_RP_SCOPES = "openid email profile"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10
LOGIN_REDIRECT_URL = "/admin/"

# -- Sign-in: sessions (odal.surfaces.signin.pages.mark_session) -----------------------------------

# A signed-in session ends this many seconds after sign-in, however busy it is (absolute, not
# renewed by activity).
ODAL_SESSION_SECONDS = env_int("ODAL_SESSION_SECONDS", 28800, minimum=60, maximum=30 * 86400)
SESSION_COOKIE_AGE = ODAL_SESSION_SECONDS
