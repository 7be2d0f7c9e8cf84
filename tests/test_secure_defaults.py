"""Issue 24, secure by default: production refuses what Django's deploy checks would (a weak
SECRET_KEY, ALLOWED_HOSTS '*', any error-level deploy check), naming the setting; `odal serve`
outside production listens on loopback only and says it runs in development."""

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.pg import free_port
from tests.test_serve import listening, production, refused, serving
from tests.test_settings import environment, read_settings, refusal

PRODUCTION = {"ODAL_ENV": "production", "ALLOWED_HOSTS": "dpp.example.eu", "ODAL_METRICS_TOKEN": "m" * 32}
STRONG_KEY = "s3cret-of-our-own-" * 3  # 54 characters, 12 different ones


# -- production: Django's deploy checks, as refusals -------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "x",
        "k" * 50,  # one character, fifty times
        "abcd" * 13,  # four different characters
        "django-insecure-" + STRONG_KEY,  # startproject's placeholder
        STRONG_KEY[:49],
    ],
    ids=["x", "one_character", "four_characters", "django_insecure", "49_characters"],
)
def test_production_refuses_a_secret_key_djangos_deploy_check_calls_weak(key):
    said = refusal(**PRODUCTION, SECRET_KEY=key)
    print(said)
    assert said.startswith("SECRET_KEY is too weak for ODAL_ENV=production"), said
    assert len(key) < 5 or key not in said  # a refusal goes to logs: never the key


def test_production_takes_a_secret_key_djangos_deploy_check_calls_strong():
    assert read_settings(**PRODUCTION, SECRET_KEY=STRONG_KEY)["SECRET_KEY"] == STRONG_KEY


@pytest.mark.parametrize("hosts", ["*", "dpp.example.eu,*", " * "])
def test_production_refuses_allowed_hosts_star(hosts):
    said = refusal(**{**PRODUCTION, "ALLOWED_HOSTS": hosts}, SECRET_KEY=STRONG_KEY)
    assert said.startswith("ALLOWED_HOSTS must name this node's host names, not '*'"), said


def test_outside_production_allowed_hosts_star_is_taken():
    assert read_settings(ALLOWED_HOSTS="*")["ALLOWED_HOSTS"] == ["*"]


def test_an_error_of_djangos_deploy_checks_is_a_refusal_naming_its_setting(settings, monkeypatch):
    from odal.core.checks import refuse_deploy_errors

    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)  # (the browser tests' own, async.E001)

    refuse_deploy_errors()  # odal's own settings: none
    settings.SECURE_REFERRER_POLICY = "bogus"  # security.E023
    with pytest.raises(ImproperlyConfigured, match=r"SECURE_REFERRER_POLICY.*security\.E023"):
        refuse_deploy_errors()


def test_production_does_not_start_with_an_error_of_djangos_deploy_checks(tmp_path):
    """As any odal command starts (the apps made ready): exit 1 and the sentence, no traceback."""
    (tmp_path / "bad_policy_settings.py").write_text(
        "from odal.settings import *  # noqa\nSECURE_REFERRER_POLICY = 'bogus'\n"
    )
    env = {**PRODUCTION, "SECRET_KEY": STRONG_KEY, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "odal", "check"],
        env={**environment(**env), "DJANGO_SETTINGS_MODULE": "bad_policy_settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(result.returncode, result.stderr[-500:])
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("odal cannot start: You have set the SECURE_REFERRER_POLICY setting")
    assert "Traceback" not in result.stderr
    # the same module in development starts (Django only reports it there)
    env.pop("ODAL_ENV")
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('ok')"],
        env={**environment(**env), "DJANGO_SETTINGS_MODULE": "bad_policy_settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# -- odal serve outside production: loopback only, and it says so ------------------------------------


def development(static_root, **changes) -> dict:
    """A web host's environment without ODAL_ENV=production (nor its key and metrics token)."""
    return production(static_root, ODAL_ENV=None, SECRET_KEY=None, ODAL_METRICS_TOKEN=None, **changes)


@pytest.mark.parametrize(
    "where, host",
    [
        ("--bind", "0.0.0.0"),
        ("ODAL_BIND", "0.0.0.0"),
        ("GUNICORN_CMD_ARGS", "0.0.0.0"),
        ("--bind", "[::]"),
        ("--bind", "dpp.example.eu"),  # a name may resolve anywhere
    ],
)
def test_odal_serve_outside_production_refuses_to_listen_beyond_loopback(tmp_path, where, host):
    port = free_port()
    address = f"{host}:{port}"
    args, env = ["--workers", "1"], {}
    if where == "--bind":
        args += ["--bind", address]
    elif where == "ODAL_BIND":
        env["ODAL_BIND"] = address
    else:
        env["GUNICORN_CMD_ARGS"] = f"--bind {address}"
    returncode, stderr = refused(*args, env=development(tmp_path / "static", **env))
    print(returncode, stderr)
    assert returncode == 1, stderr
    assert f"listens on loopback only, not on {address}" in stderr
    assert "run it in production: ODAL_ENV=production" in stderr
    assert not listening(port) and not (tmp_path / "static").exists()


def test_odal_serve_outside_production_refuses_gunicorns_host_alone(tmp_path):
    """gunicorn reads `--bind 0.0.0.0` as 0.0.0.0:8000."""
    env = development(tmp_path / "static", GUNICORN_CMD_ARGS="--bind 0.0.0.0")
    returncode, stderr = refused("--workers", "1", env=env)
    assert returncode == 1 and "not on 0.0.0.0 " in stderr, stderr


@pytest.mark.django_db  # (the database `odal serve` uses: the test database)
def test_odal_serve_outside_production_says_it_runs_in_development(tmp_path):
    port = free_port()
    with (tmp_path / "serve.log").open("w+") as log, serving(port, development(tmp_path / "static"), log):
        pass
    with (tmp_path / "serve.log").open() as log:
        said = [line for line in log if "development mode" in line]
    print(said)
    assert said == [
        "odal serve: development mode (ODAL_ENV=development): DEBUG on, the development secret key, "
        "/metrics open, private webhook targets allowed; loopback only. Set ODAL_ENV=production to "
        "serve other machines.\n"
    ]
