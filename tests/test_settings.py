"""odal's settings from the environment. A refusal raises ImproperlyConfigured naming the
variable while odal/settings.py is imported, before Django does anything else with them: those
are checked by read_settings, which runs that module here, afresh, under the environment a
process would start with (half a second of Python start saved each). start() starts a real
process, for what only a whole start-up shows (django.setup() completes)."""

import os
import runpy
import subprocess
import sys
from importlib.util import find_spec
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured

CHECK = "import django; django.setup(); print('ok')"
SETTINGS = find_spec("odal.settings").origin


def environment(**env) -> dict:
    """The suite's environment without odal's variables, with `env`: what a deployment sets."""
    environment = {
        k: v
        for k, v in os.environ.items()
        # (DJANGO_ALLOW_ASYNC_UNSAFE: the browser tests' own, which production's deploy check refuses)
        if not k.startswith(("ODAL_", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE"))
    }
    environment.update(env, DJANGO_SETTINGS_MODULE="odal.settings")
    return environment


def start(**env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHECK], env=environment(**env), capture_output=True, text=True
    )


def read_settings(*, base: dict | None = None, **env) -> dict:
    """The names odal/settings.py defines when a process starts with `env` (on top of `base`, by
    default the environment start() gives): the module run in a namespace of its own, as a
    start-up imports it, with os.environ patched meanwhile. Raises what the import would raise."""
    with mock.patch.dict(os.environ, environment(**env) if base is None else {**base, **env}, clear=True):
        return runpy.run_path(SETTINGS, run_name="odal.settings")


def refusal(**env) -> str:
    """The ImproperlyConfigured message with which start-up refuses `env` (fails if it does not)."""
    with pytest.raises(ImproperlyConfigured) as refused:
        read_settings(**env)
    return str(refused.value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("ODAL_CLAIM_HOLD_SECONDS", "five"),
        ("ODAL_CLAIM_HOLD_SECONDS", "0"),
        ("ODAL_MAX_ATTEMPTS", "-1"),
        ("ODAL_BACKOFF_BASE_SECONDS", "1.5"),
        ("ODAL_REGISTRY_ADAPTER", "soap"),
        ("ODAL_REGISTRY_URL", "ftp://registry"),
        ("ODAL_REGISTRY_STALL_ATTEMPTS", "x"),
        ("ODAL_BROKER_URL", "amqp://guest@localhost"),
        ("ODAL_ENV", "staging"),
        ("DATABASE_URL", "mysql://root@localhost/odal"),
        ("DEBUG", "maybe"),
        ("ODAL_DB_CONN_MAX_AGE", "forever"),
        ("ODAL_REGISTRY_CONCURRENCY", "0"),
        ("ODAL_REGISTRY_CONCURRENCY", "65"),
        ("ODAL_REGISTRY_RATE_PER_SECOND", "0"),
        ("ODAL_REGISTRY_RATE_PER_SECOND", "nan"),
        ("ODAL_REGISTRY_RATE_PER_SECOND", "100/s"),
        (
            "ODAL_REGISTRY_RATE_PER_SECOND",
            "1e-300",
        ),  # (the drain's timedelta overflowed: tests/test_hostile_16.py)
        ("ODAL_REGISTRY_RATE_PER_SECOND", "0.003"),  # slower than one per claim hold (300 s)
        ("ODAL_BIND", "nonsense"),
        ("ODAL_BIND", "127.0.0.1:70000"),
        ("ODAL_WEB_WORKERS", "0"),
        ("ODAL_WEB_WORKERS", "257"),
    ],
)
def test_bad_value_stops_start_up_naming_the_variable(name, value):
    assert name in refusal(**{name: value})


def test_defaults_start():
    result = start()
    assert result.returncode == 0, result.stderr


def test_a_rate_limit_may_be_a_fraction_of_one_a_second():
    result = start(ODAL_REGISTRY_RATE_PER_SECOND="0.5", ODAL_REGISTRY_CONCURRENCY="64")
    assert result.returncode == 0, result.stderr


def test_production_refuses_the_default_secret_key():
    assert "SECRET_KEY" in refusal(ODAL_ENV="production", DEBUG="false")


def test_production_refuses_debug():
    assert "DEBUG" in refusal(ODAL_ENV="production", DEBUG="true", SECRET_KEY="s3cret-of-our-own-" * 3)


def test_production_refuses_to_start_without_a_metrics_token():
    said = refusal(ODAL_ENV="production", SECRET_KEY="s3cret-of-our-own-" * 3, ALLOWED_HOSTS="dpp.example.eu")
    assert "ODAL_METRICS_TOKEN" in said


@pytest.mark.parametrize("hosts", [None, "", " , "])
def test_production_refuses_to_start_without_allowed_hosts(hosts):
    env = {"ODAL_ENV": "production", "SECRET_KEY": "s3cret-of-our-own-" * 3, "ODAL_METRICS_TOKEN": "m" * 32}
    said = refusal(**env, **({} if hosts is None else {"ALLOWED_HOSTS": hosts}))
    assert said.startswith("ALLOWED_HOSTS must name")


def test_production_starts_with_a_key_hosts_a_metrics_token_and_debug_off():
    result = start(
        ODAL_ENV="production",
        SECRET_KEY="s3cret-of-our-own-" * 3,
        ODAL_METRICS_TOKEN="m" * 32,
        ALLOWED_HOSTS="dpp.example.eu",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "name, value",
    [
        ("DATABASE_URL", "mysql://odal:Secr3t-pw@db.internal:3306/odal"),
        ("DATABASE_URL", "postgres://odal:Secr3t-pw@db.internal:notaport/odal"),
        ("ODAL_BROKER_URL", "amqp://odal:Secr3t-pw@mq.internal/"),
        ("ODAL_REGISTRY_URL", "ftp://odal:Secr3t-pw@registry.internal/"),
    ],
)
def test_a_refused_url_is_shown_without_its_password(name, value):
    message = refusal(**{name: value})
    assert name in message and "Secr3t-pw" not in message, message
