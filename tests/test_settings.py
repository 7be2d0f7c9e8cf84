import os
import subprocess
import sys

import pytest

CHECK = "import django; django.setup(); print('ok')"


def start(**env) -> subprocess.CompletedProcess:
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ODAL_", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"))
    }
    environment.update(env, DJANGO_SETTINGS_MODULE="odal.settings")
    return subprocess.run([sys.executable, "-c", CHECK], env=environment, capture_output=True, text=True)


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
        ("ODAL_BIND", "nonsense"),
        ("ODAL_BIND", "127.0.0.1:70000"),
        ("ODAL_WEB_WORKERS", "0"),
        ("ODAL_WEB_WORKERS", "257"),
    ],
)
def test_bad_value_stops_start_up_naming_the_variable(name, value):
    result = start(**{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


def test_defaults_start():
    result = start()
    assert result.returncode == 0, result.stderr


def test_a_rate_limit_may_be_a_fraction_of_one_a_second():
    result = start(ODAL_REGISTRY_RATE_PER_SECOND="0.5", ODAL_REGISTRY_CONCURRENCY="64")
    assert result.returncode == 0, result.stderr


def test_production_refuses_the_default_secret_key():
    result = start(ODAL_ENV="production", DEBUG="false")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_production_refuses_debug():
    result = start(ODAL_ENV="production", DEBUG="true", SECRET_KEY="s3cret-of-our-own-" * 3)
    assert result.returncode != 0
    assert "DEBUG" in result.stderr


def test_production_refuses_to_start_without_a_metrics_token():
    result = start(ODAL_ENV="production", SECRET_KEY="s3cret-of-our-own-" * 3, ALLOWED_HOSTS="dpp.example.eu")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "ODAL_METRICS_TOKEN" in result.stderr


@pytest.mark.parametrize("hosts", [None, "", " , "])
def test_production_refuses_to_start_without_allowed_hosts(hosts):
    env = {"ODAL_ENV": "production", "SECRET_KEY": "s3cret-of-our-own-" * 3, "ODAL_METRICS_TOKEN": "m" * 32}
    result = start(**env, **({} if hosts is None else {"ALLOWED_HOSTS": hosts}))
    assert result.returncode != 0
    assert "ImproperlyConfigured: ALLOWED_HOSTS must name" in result.stderr


def test_production_starts_with_a_key_hosts_a_metrics_token_and_debug_off():
    result = start(
        ODAL_ENV="production",
        SECRET_KEY="s3cret-of-our-own-" * 3,
        ODAL_METRICS_TOKEN="m" * 32,
        ALLOWED_HOSTS="dpp.example.eu",
    )
    assert result.returncode == 0, result.stderr
