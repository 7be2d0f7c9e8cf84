"""Issue 41, item 4: every answer odal serves carries a Content-Security-Policy that allows only
odal's own scripts and styles, frame-ancestors 'none', a Referrer-Policy and X-Frame-Options DENY;
production adds HSTS to its https answers, and Django's deploy check finds nothing in it."""

import json
import subprocess
import sys

import pytest

from tests.test_serve import HOST, production

POLICY = {
    "default-src": "'none'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
    "base-uri": "'self'",
    "object-src": "'none'",
}

# What a production process answers (its own settings, a test client inside it), as JSON.
ASK = """
import json, sys, django
django.setup()
from django.test import Client
answers = {}
for path in ("/healthz", "/no-such-page"):
    for secure in (True, False):
        r = Client(HTTP_HOST=sys.argv[1]).get(path, secure=secure)
        answers[f"{path} {'https' if secure else 'http'}"] = [r.status_code, dict(r.headers)]
print(json.dumps(answers))
"""


def directives(header: str | None) -> dict:
    """A Content-Security-Policy as {directive: its sources} (django-csp writes them in any order)."""
    return dict(part.strip().partition(" ")[::2] for part in (header or "").split(";") if part.strip())


def policy(response) -> dict:
    return directives(response.headers.get("Content-Security-Policy"))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/admin/login/", "/admin/", "/healthz", "/readyz", "/vault/api/v1/docs", "/no-such-page"]
)
def test_every_answer_carries_the_policy_in_development(client, path):
    response = client.get(path)
    assert policy(response) == POLICY, path
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert "Strict-Transport-Security" not in client.get(path, secure=True).headers  # not in development


def test_the_admins_pages_carry_the_policy(admin_client):
    for path in ["/admin/", "/admin/odal/passport/", "/admin/outbox/consumer/", "/admin/odal/auditentry/"]:
        response = admin_client.get(path)
        assert response.status_code == 200 and policy(response) == POLICY, path


@pytest.mark.django_db
def test_production_answers_carry_the_policy_and_https_ones_hsts(tmp_path):
    env = production(tmp_path / "static")
    result = subprocess.run(
        [sys.executable, "-c", ASK, HOST], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    for name, (status, headers) in answers.items():
        assert status in (200, 404), name
        assert directives(headers.get("Content-Security-Policy")) == POLICY, name
        assert (headers["X-Frame-Options"], headers["Referrer-Policy"]) == ("DENY", "same-origin"), name
        if name.endswith("https"):
            assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains", name
        else:  # (a browser ignores HSTS over http; Django sends it only on https)
            assert "Strict-Transport-Security" not in headers, name


@pytest.mark.django_db
def test_the_deploy_check_finds_nothing_in_production(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "odal", "check", "--deploy", "--fail-level", "WARNING"],
        env=production(tmp_path / "static"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (2 silenced)." in result.stdout
