"""Issue 38's admin, attacked (a hostile staff member, a hostile peer): what broke, pinned."""

import re
import uuid

import pytest
from django.contrib import admin as django_admin
from django.test import RequestFactory

from odal.core.models import AuditEntry, Passport
from tests.factories import (
    DeadDeliveryFactory,
    PassportFactory,
    PublishedPassportFactory,
    UserFactory,
    WebhookConsumerFactory,
)
from tests.test_buttons import as_member, messages_of

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("status", ["published", "suspended"])
def test_a_published_passport_is_never_deleted_from_the_list(admin_client, settings, status):
    """With ODAL_REGISTRY_ADAPTER=none no registration protects a published passport: Django's
    delete_selected deleted it ("Successfully deleted 1 passport.")."""
    settings.ODAL_REGISTRY_ADAPTER = "none"
    passport, draft = PassportFactory(status=status), PassportFactory()
    selected = {"action": "delete_selected", "_selected_action": [str(passport.pk), str(draft.pk)]}
    for form in (selected, {**selected, "post": "yes"}):  # the first pass, and a forged second
        answer = admin_client.post("/admin/odal/passport/", form, follow=True)
        assert answer.status_code == 200
        assert "has been published" in messages_of(answer) and "Nothing was deleted" in messages_of(answer)
        assert passport.upi in messages_of(answer)
    assert Passport.objects.filter(pk__in=[passport.pk, draft.pk]).count() == 2
    assert not AuditEntry.objects.filter(action="passport_deleted").exists()
    # Drafts alone are deleted as before.
    admin_client.post(
        "/admin/odal/passport/",
        {"action": "delete_selected", "_selected_action": [str(draft.pk)], "post": "yes"},
    )
    assert not Passport.objects.filter(pk=draft.pk).exists()


def test_a_passport_published_after_the_confirmation_page_is_not_deleted(settings):
    """The confirmation page (list or object) showed a draft; it was published before the POST
    that confirms (no registration with adapter none): the delete itself, under the row's lock,
    refuses it (delete_queryset and delete_model are what Django calls on that POST)."""
    from odal.surfaces.admin import PublishedNotDeleted

    settings.ODAL_REGISTRY_ADAPTER = "none"
    passport = PublishedPassportFactory()
    model_admin = django_admin.site._registry[Passport]
    request = RequestFactory().post("/admin/odal/passport/")
    request.user = UserFactory(is_staff=True, is_superuser=True)
    for delete in (
        lambda: model_admin.delete_queryset(request, Passport.objects.filter(pk=passport.pk)),
        lambda: model_admin.delete_model(request, passport),
    ):
        with pytest.raises(PublishedNotDeleted):
            delete()
        assert Passport.objects.filter(pk=passport.pk).exists()


def attempt_line(delivery, **fields):
    from django.utils import timezone

    from outbox.models import DeliveryAttempt

    now = timezone.now()
    return DeliveryAttempt.objects.create(
        delivery=delivery, consumer=delivery.consumer, number=1, claim_token=uuid.uuid4(),
        started_at=now, finished_at=now, outcome="failed", http_status=500, **fields,
    )  # fmt: skip


HOSTILE_ANSWERS = {
    # A lone surrogate, as a JSON escape: PostgreSQL's text keeps the escape, json.loads makes it a
    # str that UTF-8 cannot encode (the page's answer was a 500: UnicodeEncodeError).
    "lone surrogate": ('{"a": "\\ud800", "b": ["\\udfff"]}', "\\ud800"),
    "nested deeper than Python recurses": ("[" * 3000 + "]" * 3000, "[[[["),
    "a number longer than Python reads": ('{"n": ' + "9" * 5000 + "}", "99999"),
    "HTML": ('{"x": "<script>alert(1)</script>\\"><img src=x onerror=alert(1)>"}', "&lt;script&gt;alert(1)"),
}


@pytest.mark.parametrize("case", HOSTILE_ANSWERS)
@pytest.mark.parametrize("who", ["superuser", "Viewers"])
def test_a_hostile_answer_renders_on_the_delivery_and_consumer_pages(admin_client, client, case, who):
    answer, shown = HOSTILE_ANSWERS[case]
    viewer = admin_client if who == "superuser" else client
    if who == "Viewers":
        as_member(client, "Viewers")
    delivery = DeadDeliveryFactory(consumer=WebhookConsumerFactory())
    attempt_line(delivery, answer=answer, content_type="application/json")
    for url in (
        f"/admin/outbox/delivery/{delivery.pk}/change/",
        f"/admin/outbox/consumer/{delivery.consumer.pk}/change/",
    ):
        page = viewer.get(url)
        assert page.status_code == 200, url
        body = page.content.decode()
        assert shown in body, url
        assert "<script>alert" not in body and "<img src=x" not in body


def test_a_huge_answer_is_shown_bounded(admin_client):
    """An answer is kept up to 64 KiB; a row holding more (written before the cap, or by hand) is
    shown to SHOWN_CAP characters, the rest counted: the page stays a page."""
    delivery = DeadDeliveryFactory(consumer=WebhookConsumerFactory())
    for _ in range(3):
        attempt_line(delivery, answer="x" * 3_000_000)
    for url in (
        f"/admin/outbox/delivery/{delivery.pk}/change/",
        f"/admin/outbox/consumer/{delivery.consumer.pk}/change/",
    ):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert len(page.content) < 1_000_000, (url, len(page.content))
        assert "more characters not shown" in page.content.decode()


@pytest.mark.parametrize(
    "typed, refused",
    [
        ("[" * 100_000 + "]" * 100_000, "as names separated by commas"),  # (was a 500: RecursionError)
        ("passport.*，outbox.test", "is not an event pattern"),  # a full-width comma is no comma
        ('["\\u0000"]', "NUL character"),
        ("a" * 100_000, "is not an event pattern"),
    ],
)
def test_hostile_event_types_are_a_form_error(admin_client, typed, refused):
    consumer = WebhookConsumerFactory(event_types=["outbox.test"])
    form = {
        "name": consumer.name, "kind": consumer.kind, "url": consumer.url, "target": "", "event_types": typed,
        "max_attempts": consumer.max_attempts, "timeout_seconds": consumer.timeout_seconds,
        "opened_at_version": consumer.version,
    }  # fmt: skip
    page = admin_client.post(f"/admin/outbox/consumer/{consumer.pk}/change/", form)
    assert page.status_code == 200
    assert refused in str(page.context["adminform"].form.errors["event_types"])
    consumer.refresh_from_db()
    assert consumer.event_types == ["outbox.test"]


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("escaped", [False, True])
def test_an_answer_echoing_the_request_keeps_no_replayable_signature(client, settings, status, escaped):
    """An echo endpoint (httpbin's /anything, a request bin) answers with the request's headers:
    the signature was kept in the attempt's answer (and a 5xx's error) and shown to a Viewer on the
    delivery's page and the consumer's, who could replay the signed request within its tolerance."""
    import json

    from outbox.events import emit
    from outbox.models import Delivery
    from outbox.sweep import sweep_once
    from tests.webhook_server import Answer, WebhookServer

    settings.ODAL_BACKOFF_BASE_SECONDS = 0

    def echo(received):
        text = json.dumps({"headers": received.headers, "data": received.body})
        if escaped:  # (PHP's json_encode writes "/" as "\/")
            text = text.replace("/", "\\/")
        return Answer(status, text.encode(), [("content-type", "application/json")])

    with WebhookServer([echo]) as server:
        consumer = WebhookConsumerFactory(url=server.url, timeout_seconds=2)
        emit("passport.published", {"n": 1})
        assert sweep_once().claimed == 1
    signature = server.received[0].headers["webhook-signature"].partition(",")[2]
    assert len(signature) == 44 and "webhook-signature" in Delivery.objects.get().attempt_log.get().answer
    line = Delivery.objects.get().attempt_log.get()
    for kept in (line.answer, line.error, Delivery.objects.get().last_error):
        assert signature not in kept and signature.replace("/", "\\/") not in kept
    as_member(client, "Viewers")
    for url in (
        f"/admin/outbox/delivery/{line.delivery_id}/change/",
        f"/admin/outbox/consumer/{consumer.pk}/change/",
    ):
        body = client.get(url).content.decode()
        assert signature not in body and signature.replace("/", "\\/") not in body, url


def test_every_signature_is_hidden_as_sent_and_with_its_slashes_escaped():
    """Deterministic (a live signature holds a "/" about half the time): both signatures of a
    rotation's grace, raw and as PHP's json_encode writes them."""
    from outbox.consumers import _signatures_in, without_signatures

    sent = {"webhook-signature": "v1,ab/cd+ef/gh= v1,zz/yy+xx=="}
    echoed = 'v1,ab/cd+ef/gh= "v1,ab\\/cd+ef\\/gh=" v1,zz/yy+xx== v1,zz\\/yy+xx=='
    assert without_signatures(echoed, _signatures_in(sent)) == 'v1,*** "v1,***" v1,*** v1,***'


@pytest.mark.parametrize("status", [500, 400])
def test_a_registry_echoing_our_bearer_token_shows_it_to_no_one(settings, client, status):
    """A registry (or a gateway before it) answering with the request's headers: the bearer token
    was kept in the registration's last error and attempt log, and shown to a Viewer on the
    passport's story and the registration's page."""
    import json

    from odal.surfaces import lifecycle
    from registry.drain import drain_once
    from registry.models import Registration
    from tests.webhook_server import Answer, WebhookServer

    token = "reg/token+s3cr3t-value"

    def echo(received):
        text = json.dumps({"headers": received.headers}).replace("/", "\\/")  # (and with "/" escaped)
        return Answer(
            status,
            (text + " " + received.headers["authorization"]).encode(),
            [("content-type", "application/json")],
        )

    with WebhookServer([echo]) as server:
        settings.ODAL_REGISTRY_ADAPTER = "http"
        settings.ODAL_REGISTRY_URL = server.url.rsplit("/", 1)[0]
        settings.ODAL_REGISTRY_TOKEN = token
        settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 2
        passport = PassportFactory()
        lifecycle.publish(passport.pk, actor="test")
        report = drain_once()
        # (not the registry's own JSON error: an outcome unknown, issue 37 item 3; its text is kept)
        assert report.unknown == 1, report
    assert server.received[0].headers["authorization"] == f"Bearer {token}"
    registration = Registration.objects.get()
    kept = [registration.last_error, *registration.attempt_log.values_list("answer", flat=True)]
    assert "Bearer ***" in " ".join(kept)
    as_member(client, "Viewers")
    for url in (
        f"/admin/odal/passport/{passport.pk}/change/",
        f"/admin/registry/registration/{registration.pk}/change/",
    ):
        kept.append(client.get(url).content.decode())
    for text in kept:
        assert "s3cr3t" not in text


def test_redacting_a_long_run_of_letters_takes_linear_time():
    """A consumer's page for a Viewer redacts every error it shows: 100,000 letters without "://"
    took 25 s (the scheme's unbounded repeat tried from each letter to the run's end). The bound
    is generous: linear time is milliseconds here, the square was minutes."""
    import time

    from odal.core.redact import redacted_urls_in

    text = "x" * 200_000 + " https://user:pa55word@hooks.example.com/in?token=SECRETVALUE"
    started = time.monotonic()
    shown = redacted_urls_in(text)
    assert time.monotonic() - started < 5
    assert "pa55word" not in shown and "SECRETVALUE" not in shown
    # A scheme longer than the bound is still found (from its last 32 characters): still redacted.
    assert "pa55word" not in redacted_urls_in("a" * 40 + "://user:pa55word@host/")


def test_a_delivery_replayed_again_and_again_shows_its_newest_lines(admin_client):
    """Each replay gives a fresh budget: a delivery's attempt log has no bound of its own. Its page
    printed every line (60,000 lines: 159 MB, 6.5 s); it shows the newest LOG_LINES, in order."""
    from datetime import timedelta

    from django.utils import timezone

    from odal.core import record
    from outbox.models import DeliveryAttempt

    shown_at_most = 100  # (odal.core.record.LOG_LINES, checked last)

    delivery = DeadDeliveryFactory(consumer=WebhookConsumerFactory())
    now = timezone.now()
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(
            delivery=delivery, consumer=delivery.consumer, number=n, claim_token=uuid.uuid4(),
            started_at=now - timedelta(seconds=3000 - n), finished_at=now - timedelta(seconds=3000 - n),
            outcome="failed", error=f"line {n:04d}",
        )
        for n in range(1, 3001)
    )  # fmt: skip
    AuditEntry.objects.record(
        actor="user:ops", action="delivery_replayed", obj=delivery, reason="fixed at last"
    )
    body = admin_client.get(f"/admin/outbox/delivery/{delivery.pk}/change/").content.decode()
    shown = [int(n) for n in re.findall(r"line (\d{4})", body)]
    assert shown == list(range(3002 - shown_at_most, 3001))  # the newest, oldest first, the replay after them
    assert "fixed at last" in body and "Earlier lines not shown" in body
    assert shown_at_most == record.LOG_LINES


def test_a_nul_in_an_admin_search_is_a_400_that_says_why(admin_client):
    """The audit trail searched for a NUL: Django's bare "Bad Request (400)" page, no sentence."""
    answer = admin_client.get("/admin/odal/auditentry/", {"q": "upi\x00"})
    assert answer.status_code == 400
    assert answer["content-type"].startswith("text/plain")
    assert (
        "The request's q contains the NUL character (\\u0000), which cannot be stored."
        in answer.content.decode()
    )
