"""Secrets are shown once, on a page of their own (issue 24): a new API token, a new consumer's
signing secret and a rotated one are the answer to the admin POST that made them, marked
no-store, and never kept in a message (Django's default storage keeps those in the signed but
unencrypted `messages` cookie, or the session row), a cookie, the session or a log. After each
flow every cookie (decoded as Django decodes it), every session row, the log, the admin's
history and the audit trail are read."""

import logging
import re

import pytest
from django.contrib.admin import helpers
from django.contrib.admin.models import LogEntry
from django.contrib.messages.storage.cookie import CookieStorage
from django.contrib.sessions.models import Session
from django.http import HttpRequest

from odal.core.models import ApiToken, AuditEntry
from outbox.models import Consumer
from tests.factories import WebhookConsumerFactory

pytestmark = pytest.mark.django_db


def kept(client, secret: str, caplog) -> list[str]:
    """Where the secret is found outside the one page that showed it."""
    found = []
    for name, morsel in client.cookies.items():
        if secret in morsel.value:
            found.append(f"cookie {name}")
        if name == CookieStorage.cookie_name and morsel.value:
            decoded = CookieStorage(HttpRequest())._decode(morsel.value) or []
            if any(secret in str(message) for message in decoded):
                found.append(f"cookie {name}, decoded")
    for session in Session.objects.all():
        if secret in session.session_data or secret in repr(session.get_decoded()):
            found.append(f"session row {session.session_key}")
    if secret in caplog.text:
        found.append("log")
    for entry in LogEntry.objects.all():  # Django's admin history
        if secret in f"{entry.object_repr} {entry.change_message}":
            found.append(f"admin log entry {entry.pk}")
    for entry in AuditEntry.objects.all():
        if secret in f"{entry.reason} {entry.details}":
            found.append(f"audit entry {entry.pk}")
    return found


def shown_once(response, pattern: str) -> str:
    """The secret on the POST's own answer: a page, not a redirect, that no cache may store."""
    assert response.status_code == 200, response.status_code
    assert "no-store" in response.headers["Cache-Control"]
    match = re.search(pattern, response.content.decode())
    assert match, "the page shows the secret"
    return match.group(0)


def test_a_new_api_token_is_shown_on_the_answer_to_its_post_and_kept_nowhere(admin_client, caplog):
    caplog.set_level(logging.DEBUG)
    response = admin_client.post("/admin/odal/apitoken/add/", {"name": "deployer", "scope": "write"})
    plaintext = shown_once(response, r"odal_[0-9a-f]{8}_[A-Za-z0-9_-]+")
    assert ApiToken.objects.authenticate(plaintext).name == "deployer"
    after = admin_client.get("/admin/odal/apitoken/")
    assert plaintext.encode() not in after.content  # not shown again
    assert kept(admin_client, plaintext, caplog) == []


def test_a_new_consumers_secret_is_shown_on_the_answer_to_its_post_and_kept_nowhere(admin_client, caplog):
    caplog.set_level(logging.DEBUG)
    response = admin_client.post(
        "/admin/outbox/consumer/add/",
        {"name": "deployer", "kind": "webhook", "url": "https://deploy.example.eu/hook", "target": "",
         "event_types": '["passport.*"]', "max_attempts": 5, "timeout_seconds": 5},
    )  # fmt: skip
    consumer = Consumer.objects.get(name="deployer")
    assert kept(admin_client, consumer.secret, caplog) == []
    secret = shown_once(response, r"whsec_[A-Za-z0-9+/=]+")
    assert secret == consumer.secret
    for page in ("/admin/outbox/consumer/", f"/admin/outbox/consumer/{consumer.pk}/change/"):
        assert secret.encode() not in admin_client.get(page).content
    assert kept(admin_client, secret, caplog) == []


def test_a_rotated_secret_is_shown_on_the_answer_to_the_action_and_kept_nowhere(admin_client, caplog):
    caplog.set_level(logging.DEBUG)
    consumer = WebhookConsumerFactory(name="hook")
    old = consumer.secret
    response = admin_client.post(
        "/admin/outbox/consumer/",
        {"action": "rotate_secret", helpers.ACTION_CHECKBOX_NAME: [consumer.pk], "post": "yes",
         "reason": "yearly", "grace": "1h"},
    )  # fmt: skip
    consumer.refresh_from_db()
    assert kept(admin_client, consumer.secret, caplog) == []
    secret = shown_once(response, r"whsec_[A-Za-z0-9+/=]+")
    assert secret == consumer.secret != old and old.encode() not in response.content
    assert b"signs beside it until" in response.content
    assert secret.encode() not in admin_client.get("/admin/outbox/consumer/").content
    for each in (secret, old):
        assert kept(admin_client, each, caplog) == []


def test_the_api_answers_that_carry_a_secret_are_no_store(admin_api):
    created = admin_api.post(
        "outbox/consumers",
        {"name": "deployer", "kind": "webhook", "url": "https://deploy.example.eu/hook", "eventTypes": []},
    )
    assert created.status_code == 201, created.content
    assert created.json()["secret"].startswith("whsec_") and "no-store" in created.headers["Cache-Control"]
    rotated = admin_api.post("outbox/consumers/deployer/rotate-secret", {"reason": "yearly"})
    assert rotated.status_code == 200, rotated.content
    assert "no-store" in rotated.headers["Cache-Control"]
