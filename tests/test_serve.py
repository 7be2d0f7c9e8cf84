"""Issue 15.4: `odal serve`, the production web entry, answers the admin and the API.

The test is the load balancer of a real deployment: TLS ends there, so it speaks plain HTTP to
the web host, forwards the Host the browser asked for and says the browser's connection was
https (`X-Forwarded-Proto`), which gunicorn believes only from the addresses in its
`FORWARDED_ALLOW_IPS` (by default the host itself, where this test runs). The cookies production
sets are Secure: the browser behind the balancer keeps them, so the test keeps them by hand and
sends them back, as the balancer passes them on.
"""

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from binascii import unhexlify
from contextlib import contextmanager
from http.cookies import SimpleCookie

import httpx
import pytest
from django.db import connection
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from odal.core.models import Passport
from tests.factories import UserFactory, issue_token
from tests.pg import free_port

HOST = "dpp.odal.test"  # the name the balancer forwards; ALLOWED_HOSTS names it
METRICS_TOKEN = "metrics-" + secrets.token_hex(16)
START_SECONDS = 60  # collectstatic, then gunicorn forks its workers: a few seconds here
REFUSAL_SECONDS = 20  # a refusal comes as the settings are read, well within a second here
UPI = "https://id.example.eu/01/09506000134352/21/SERVE-1"


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def production(static_root, **changes) -> dict:
    """The environment of a production web host, with `changes` (None drops a variable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "ODAL_",
                "DEBUG",
                "SECRET_KEY",
                "ALLOWED_HOSTS",
                "CSRF_",
                "GUNICORN_",
                "FORWARDED_",
                "DJANGO_ALLOW_ASYNC_UNSAFE",
            )  # (the browser tests' own: production's deploy check refuses it)
        )
    }
    env.update(
        ODAL_ENV="production",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS=HOST,
        ODAL_METRICS_TOKEN=METRICS_TOKEN,
        DATABASE_URL=database_url(),
        ODAL_KICK_SWEEP="false",  # no worker runs here
        ODAL_REGISTRY_URL="http://127.0.0.1:9",  # nothing answers: no call here may reach a registry
        ODAL_STATIC_ROOT=str(static_root),
    )
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def refused(*args: str, env: dict) -> tuple[int, str]:
    """`odal serve ARGS` that must refuse at once: its exit code and stderr. Should it start a
    server instead, the server (master and workers) goes and the test fails."""
    process = subprocess.Popen(
        [sys.executable, "-m", "odal", "serve", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so that a server wrongly started goes whole
    )
    try:
        stdout, stderr = process.communicate(timeout=REFUSAL_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"odal serve {' '.join(args)} started instead of refusing")
    assert "Traceback" not in stdout + stderr, stderr
    return process.returncode, stderr


class Browser:
    """A browser behind the TLS load balancer: every request as the balancer forwards it, and the
    cookies kept between them."""

    def __init__(self, port: int):
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        self.cookies: dict[str, SimpleCookie] = {}

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Host": HOST, "X-Forwarded-Proto": "https", **kwargs.pop("headers", {})}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{name}={m[name].value}" for name, m in self.cookies.items())
        response = self.http.request(method, path, headers=headers, **kwargs)
        for line in response.headers.get_list("set-cookie"):
            cookie = SimpleCookie(line)
            for name in cookie:
                self.cookies[name] = cookie
        return response

    def cookie(self, name: str):
        return self.cookies[name][name]


@contextmanager
def serving(port: int, env: dict, log, workers: int = 2):
    """`odal serve` on `port` with `env`, its output in `log`, once it answers /healthz; on the way
    out SIGTERM to its process group (its workers too), SIGKILL if it is still up 30 s later."""
    argv = ["serve", "--bind", f"127.0.0.1:{port}", "--workers", str(workers)]
    with answering(argv, port, env, log) as process:
        yield process


@contextmanager
def answering(argv: list[str], port: int, env: dict, log):
    """`odal ARGV`, a web server on `port`, once it answers /healthz (see serving)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "odal", *argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the workers go with it if the test fails
    )
    deadline = time.monotonic() + START_SECONDS
    try:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": HOST}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            log.seek(0)
            pytest.fail(f"odal {argv[0]} did not answer within {START_SECONDS} s:\n{log.read()[-3000:]}")
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def server(tmp_path):
    """`odal serve` in production on a free port, answering; stopped afterwards."""
    port = free_port()
    with (
        (tmp_path / "serve.log").open("w+") as log,
        serving(port, production(tmp_path / "static"), log) as process,
    ):
        yield port, process, log, tmp_path / "static"


@pytest.mark.slow
def enrolled(user) -> TOTPDevice:
    """A confirmed authenticator for `user`: production asks staff who may change anything for it."""
    return TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)


def type_the_code(browser, device: TOTPDevice) -> None:
    """After the password, in production: the admin sends a session to the code page; the code
    from `device` takes it on to the admin."""
    asked = browser.request("GET", "/admin/")
    assert asked.status_code == 302 and asked.headers["location"].startswith("/admin/second-factor/code/")
    code_page = browser.request("GET", asked.headers["location"])
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', code_page.text).group(1)
    typed = browser.request(
        "POST",
        asked.headers["location"],
        data={"code": f"{totp(unhexlify(device.key)):06d}", "csrfmiddlewaretoken": csrf},
        headers={"Origin": f"https://{HOST}", "Referer": f"https://{HOST}{asked.headers['location']}"},
    )
    assert typed.status_code == 302 and typed.headers["location"] == "/admin/", typed.text[:1000]


@pytest.mark.django_db(transaction=True)  # the server's workers read what this test commits
def test_odal_serve_answers_the_admin_and_the_api_in_production(server):
    staff = UserFactory(username="night-shift", is_superuser=True)
    device = enrolled(staff)
    token = issue_token("write", name="pim-sync")
    port, process, log, static_root = server
    browser = Browser(port)

    # The admin's login page, with its CSRF cookie Secure as production sets it.
    page = browser.request("GET", "/admin/login/?next=/admin/")
    assert page.status_code == 200, page.text[:500]
    assert browser.cookie("csrftoken")["secure"]
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)

    # Its stylesheet: collected by `odal serve` under a content-hashed name and served by
    # WhiteNoise, compressed and cached for good (Django alone serves no static file in production).
    stylesheet = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page.text).group(1)
    css = browser.request("GET", stylesheet, headers={"Accept-Encoding": "gzip"})
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    assert css.headers["content-encoding"] == "gzip" and "Accept-Encoding" in css.headers["vary"]
    assert css.headers["cache-control"] == "max-age=315360000, public, immutable"
    assert css.text == (static_root / stylesheet.removeprefix("/static/")).read_text()

    # Log in as the browser does: the form's token, the Origin it came from.
    logged_in = browser.request(
        "POST",
        "/admin/login/?next=/admin/",
        data={"username": staff.username, "password": "pw-for-tests", "csrfmiddlewaretoken": csrf},
        headers={"Origin": f"https://{HOST}", "Referer": f"https://{HOST}/admin/login/"},
    )
    assert logged_in.status_code == 302, logged_in.text[:1000]
    assert logged_in.headers["location"] == "/admin/"
    session = browser.cookie("sessionid")
    assert session["secure"] and session["httponly"]
    # Production asks a superuser for the second factor (docs/security.md): the code, then the admin.
    type_the_code(browser, device)
    index = browser.request("GET", "/admin/")
    assert index.status_code == 200
    assert "night-shift" in index.text and "Passports" in index.text

    # A machine's call with its bearer token, written to the database this test reads.
    created = httpx.post(
        f"http://127.0.0.1:{port}/vault/api/v1/dpp",
        json={"upi": UPI, "operatorId": "OP-SERVE"},
        headers={"Host": HOST, "X-Forwarded-Proto": "https", "Authorization": f"Bearer {token}"},
    )
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "draft"
    assert Passport.objects.get(pk=created.json()["id"]).upi == UPI

    # /metrics answers Prometheus with the metrics token only.
    metrics = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(metrics, headers={"Host": HOST}).status_code == 401
    scraped = httpx.get(metrics, headers={"Host": HOST, "Authorization": f"Bearer {METRICS_TOKEN}"})
    assert scraped.status_code == 200 and "registry_outbox_pending" in scraped.text

    # A host name it was not told to serve is refused.
    assert (
        httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": "elsewhere.test"}).status_code == 400
    )

    # SIGTERM: gunicorn lets the workers finish and exits cleanly, leaving the port free.
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert not listening(port)
    log.seek(0)
    said = log.read()
    assert f"odal serve: 2 workers on 127.0.0.1:{port}" in said
    assert "Shutting down: Master" in said and "Traceback" not in said


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS", "ODAL_METRICS_TOKEN"])
def test_production_refuses_to_serve_without_its_settings(tmp_path, missing):
    env = production(tmp_path / "static", **{missing: None})
    returncode, stderr = refused("--bind", f"127.0.0.1:{free_port()}", "--workers", "1", env=env)
    assert returncode == 1, stderr
    assert missing in stderr and "ODAL_ENV=production" in stderr
    assert not (tmp_path / "static").exists()  # refused before collecting anything


def test_an_address_in_use_is_refused_before_anything_is_collected(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        returncode, stderr = refused("--bind", f"127.0.0.1:{port}", env=production(tmp_path / "static"))
    assert returncode == 1, stderr
    assert f"cannot listen on port {port}" in stderr and "choose another --bind" in stderr
    assert not (tmp_path / "static").exists()


def test_without_collected_static_files_production_refuses_to_serve(tmp_path):
    args = ("--bind", f"127.0.0.1:{free_port()}", "--no-collectstatic")
    returncode, stderr = refused(*args, env=production(tmp_path / "static"))
    assert returncode == 1, stderr
    assert "No static files were collected" in stderr


def test_gunicorn_cmd_args_come_over_odal_settings_and_the_command_line_over_both(settings, monkeypatch):
    from odal.surfaces.management.commands.serve import gunicorn_application

    settings.ODAL_BIND, settings.ODAL_WEB_WORKERS = "127.0.0.1:8123", 5
    monkeypatch.delenv("GUNICORN_CMD_ARGS", raising=False)
    plain = gunicorn_application({}).cfg
    assert (plain.bind, plain.workers, plain.control_socket_disable) == (["127.0.0.1:8123"], 5, True)
    assert (
        plain.timeout == settings.ODAL_REGISTRY_LOOKUP_SECONDS + 30
    )  # an abandon's lookup may take that long

    monkeypatch.setenv("GUNICORN_CMD_ARGS", "--workers 3 --access-logfile - --forwarded-allow-ips 10.0.0.0/8")
    from_env = gunicorn_application({}).cfg
    assert (from_env.bind, from_env.workers, from_env.accesslog) == (["127.0.0.1:8123"], 3, "-")
    assert "10.0.0.0/8" in str(from_env.forwarded_allow_ips)

    given = gunicorn_application({"bind": ["0.0.0.0:9000"], "workers": 2}).cfg
    assert (given.bind, given.workers, given.accesslog) == (["0.0.0.0:9000"], 2, "-")


def test_a_500_gunicorn_answers_itself_is_json_with_an_error_id_the_log_names(caplog):
    """(What gunicorn answers when the application failed outside Django's handlers: its other
    answers are sent to a real `odal serve` in tests/test_gunicorn_answers.py.)"""
    import json

    from odal.surfaces.management.commands.serve import json_error

    with caplog.at_level("ERROR"):
        head, _, body = json_error(500, "Internal Server Error").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"Content-Type: application/json" in head and f"Content-Length: {len(body)}".encode() in head
    answer = json.loads(body)
    assert answer["code"] == "internal_error" and answer["errorId"] in answer["detail"]
    assert answer["errorId"] in caplog.text
    assert json.loads(json_error(408, "Request Timeout").partition(b"\r\n\r\n")[2]) == {
        "detail": "Request Timeout.",
        "code": "http_error",
    }
