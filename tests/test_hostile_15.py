"""Hostile review of issue 15 (`odal serve`, riding out a lost database, the Redis broker, the
partition run): what broke, kept broken no more."""

import pytest

from odal.settings import DEFAULT_SECRET_KEY
from tests.pg import free_port
from tests.test_serve import production, refused
from tests.test_settings import read_settings, refusal

# -- production refuses a blank SECRET_KEY ---------------------------------------------------------------
# Before: SECRET_KEY="" (an EnvironmentFile line `SECRET_KEY=` whose secret did not make it) passed
# the production refusal; `odal serve` started and every request was a 500 (Django refuses an empty
# key only when something is signed).

PRODUCTION = {"ODAL_ENV": "production", "ALLOWED_HOSTS": "dpp.example.eu", "ODAL_METRICS_TOKEN": "m" * 32}


@pytest.mark.parametrize("key", ["", "   ", "\t"], ids=["empty", "spaces", "tab"])
def test_production_refuses_a_blank_secret_key(key):
    said = refusal(**PRODUCTION, SECRET_KEY=key)
    assert said.startswith("SECRET_KEY must be set"), said


@pytest.mark.parametrize("key", ["", "  "], ids=["empty", "spaces"])
def test_a_blank_secret_key_is_the_development_default_outside_production(key):
    assert read_settings(SECRET_KEY=key)["SECRET_KEY"] == DEFAULT_SECRET_KEY


def test_a_secret_key_of_its_own_is_kept_as_it_is():
    assert read_settings(**PRODUCTION, SECRET_KEY=" s3cret ")["SECRET_KEY"] == " s3cret "


def test_odal_serve_refuses_a_blank_secret_key_in_production(tmp_path):
    env = production(tmp_path / "static", SECRET_KEY="")
    returncode, stderr = refused("--bind", f"127.0.0.1:{free_port()}", "--workers", "1", env=env)
    assert returncode == 1, stderr
    assert "SECRET_KEY" in stderr and "ODAL_ENV=production" in stderr
    assert not (tmp_path / "static").exists()
