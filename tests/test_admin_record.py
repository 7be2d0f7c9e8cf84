"""Issue 38, item 6: the record reads right in the admin (settled rows without a next attempt,
attempts numbered across replays with the replay a line of the log, pretty JSON, one time
format with the zone, an audit trail that names its objects and finds them, event types typed
as names, words for a plain no, internals for superusers, filters named apart, a simulator that
refuses the demo passport as the registry refuses a product)."""

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from odal.core.groups import ensure_groups
from odal.core.models import AuditEntry
from outbox.events import emit
from outbox.models import Consumer, Delivery, DeliveryAttempt
from outbox.sweep import sweep_once
from registry.models import Registration
from tests.factories import (
    ConsumerFactory,
    DeliveryFactory,
    PassportFactory,
    RegistrationFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

FUTURE = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)  # a next attempt no settled row may show


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0  # retries are due at once; the tests sweep by hand


def row_of(html: str, text: str) -> str:
    """The changelist row (<tr>…</tr>) that holds `text`."""
    rows = [row for row in re.findall(r"<tr[^>]*>.*?</tr>", html, re.S) if text in row]
    assert len(rows) == 1, f"{len(rows)} rows hold {text!r}"
    return rows[0]


def staff_in(group: str):
    ensure_groups()
    user = UserFactory()
    user.groups.add(Group.objects.get(name=group))
    return user


# -- settled rows show no next attempt --------------------------------------------------------


@pytest.mark.parametrize("status", ["delivered", "dead"])
def test_a_settled_delivery_shows_no_next_attempt(admin_client, status):
    settled = DeliveryFactory(status=status, next_attempt_at=FUTURE, event__type=f"settled.{status}")
    DeliveryFactory(next_attempt_at=FUTURE + timedelta(days=1), event__type="still.pending")
    listing = admin_client.get(reverse("admin:outbox_delivery_changelist")).content.decode()
    assert "2031" not in row_of(listing, f"settled.{status}")
    assert "2031-01-03" in row_of(listing, "still.pending")
    page = admin_client.get(reverse("admin:outbox_delivery_change", args=[settled.pk])).content.decode()
    assert "2031" not in page


@pytest.mark.parametrize("status", ["registered", "rejected", "abandoned", "deactivated", "suspended"])
def test_a_settled_registration_shows_no_next_attempt(admin_client, status):
    reg = RegistrationFactory(
        status=status, next_attempt_at=FUTURE, passport__upi=f"https://id.example.eu/01/1/21/{status}"
    )
    listing = admin_client.get(reverse("admin:registry_registration_changelist")).content.decode()
    assert "2031" not in row_of(listing, f"/21/{status}")
    page = admin_client.get(reverse("admin:registry_registration_change", args=[reg.pk])).content.decode()
    assert "2031" not in page


def test_a_pending_registration_shows_its_next_attempt(admin_client):
    RegistrationFactory(
        status="pending", next_attempt_at=FUTURE, passport__upi="https://id.example.eu/01/1/21/p"
    )
    listing = admin_client.get(reverse("admin:registry_registration_changelist")).content.decode()
    assert "2031-01-02 03:04:05 UTC" in row_of(listing, "/21/p")


# -- attempts numbered across replays; a replay a line of the log ----------------------------


def dead_after_three_attempts() -> Delivery:
    consumer = ConsumerFactory(name="billing", target="tests.consumers.explode", max_attempts=3)
    emit("passport.published", {"dppId": "d-1"})
    for _ in range(3):
        sweep_once()
    delivery = Delivery.objects.get(consumer=consumer)
    assert delivery.status == "dead" and delivery.attempts == 3
    Consumer.objects.filter(pk=consumer.pk).update(target="tests.consumers.accept")
    return delivery


def test_a_replayed_delivery_numbers_its_attempts_on_and_its_budget_afresh():
    delivery = dead_after_three_attempts()
    Delivery.objects.filter(pk=delivery.pk).replay(actor="user:ops-lead", reason="billing is back")
    sweep_once()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert delivery.attempts == 1  # the budget was reset: one attempt of the new budget spent
    numbers = list(delivery.attempt_log.order_by("started_at").values_list("number", "outcome"))
    assert numbers == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "delivered")]


def test_a_resent_delivery_numbers_its_attempts_on_too():
    delivery = dead_after_three_attempts()
    Delivery.objects.filter(pk=delivery.pk).replay(actor="user:ops-lead", reason="billing is back")
    sweep_once()
    Delivery.objects.filter(pk=delivery.pk).resend(actor="user:ops-lead", reason="billing lost a day")
    sweep_once()
    numbers = list(delivery.attempt_log.order_by("started_at").values_list("number", flat=True))
    assert numbers == [1, 2, 3, 4, 5]


def test_the_delivery_page_shows_a_replay_as_a_line_of_its_log_in_time_order(admin_client):
    delivery = dead_after_three_attempts()
    Delivery.objects.filter(pk=delivery.pk).replay(actor="user:ops-lead", reason="billing is back")
    sweep_once()
    page = admin_client.get(reverse("admin:outbox_delivery_change", args=[delivery.pk])).content.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    marks = [
        text.find("3 failed"),
        text.find("replayed by user:ops-lead"),
        text.find("billing is back"),
        text.find("4 delivered"),
    ]
    assert -1 not in marks, f"missing from the log: {marks}"
    assert marks == sorted(marks), f"not in time order: {marks}"


# -- pretty JSON ------------------------------------------------------------------------------


def test_payloads_and_answers_are_pretty_json(admin_client):
    delivery = DeliveryFactory(event__payload={"dppId": "abc", "nested": {"ok": True}})
    now = timezone.now()
    DeliveryAttempt.objects.create(
        delivery=delivery, number=1, claim_token=delivery.pk, started_at=now, finished_at=now, outcome="delivered",
        http_status=200, answer='{"received":true,"id":7}', content_type="application/json",
    )  # fmt: skip
    page = admin_client.get(reverse("admin:outbox_delivery_change", args=[delivery.pk])).content.decode()
    assert "{&#x27;dppId&#x27;" not in page and "{'dppId'" not in page
    pres = re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S)
    assert any("&quot;dppId&quot;: &quot;abc&quot;" in p and "\n" in p for p in pres), pres
    assert any("&quot;received&quot;: true" in p for p in pres), pres
    event_page = admin_client.get(
        reverse("admin:outbox_event_change", args=[delivery.event_id])
    ).content.decode()
    assert any("&quot;nested&quot;: {" in p for p in re.findall(r"<pre[^>]*>(.*?)</pre>", event_page, re.S))


# -- one time format, to the second, with the zone --------------------------------------------

AT = datetime(2026, 12, 5, 19, 53, 21, 654321, tzinfo=UTC)
SHOWN = "2026-12-05 19:53:21 UTC"


def test_times_read_to_the_second_with_the_zone_in_lists_and_pages(admin_client):
    passport = PassportFactory(created_at=AT)
    delivery = DeliveryFactory(created_at=AT, next_attempt_at=AT)
    AuditEntry.objects.create(at=AT, actor="user:ops-lead", action="consumer_paused")
    for url in (
        reverse("admin:odal_passport_changelist"),
        reverse("admin:odal_passport_change", args=[passport.pk]),
        reverse("admin:outbox_delivery_changelist"),
        reverse("admin:outbox_delivery_change", args=[delivery.pk]),
        reverse("admin:odal_auditentry_changelist"),
    ):
        page = admin_client.get(url).content.decode()
        assert SHOWN in page, url
        assert "19:53:21.654321" not in page and "7:53 p.m." not in page and "19:53 " not in page, url


# -- the audit trail names, links and finds its objects ---------------------------------------


def test_the_audit_trail_names_and_links_its_objects(admin_client):
    consumer = ConsumerFactory(name="billing")
    passport = PassportFactory(upi="https://id.example.eu/01/1/21/NAMED-1")
    AuditEntry.objects.record(actor="user:ops-lead", action="consumer_paused", obj=consumer, reason="upgrade")
    AuditEntry.objects.record(actor="user:ops-lead", action="passport_published", obj=passport)
    listing = admin_client.get(reverse("admin:odal_auditentry_changelist")).content.decode()
    assert "outbox.consumer" not in listing
    link = reverse("admin:outbox_consumer_change", args=[consumer.pk])
    assert re.search(rf'<a href="{re.escape(link)}"[^>]*>consumer billing</a>', listing), row_of(
        listing, "upgrade"
    )
    link = reverse("admin:odal_passport_change", args=[passport.pk])
    assert re.search(
        rf'<a href="{re.escape(link)}"[^>]*>passport https://id.example.eu/01/1/21/NAMED-1</a>', listing
    )


def search(client, term):
    return client.get(reverse("admin:odal_auditentry_changelist"), {"q": term}).content.decode()


def test_the_audit_trail_finds_entries_by_upi_consumer_name_and_actor(admin_client):
    billing, other = ConsumerFactory(name="billing"), ConsumerFactory(name="deployer")
    passport = PassportFactory(upi="https://id.example.eu/01/1/21/FIND-ME")
    reg = RegistrationFactory(passport=passport)
    AuditEntry.objects.record(
        actor="user:ops-lead", action="consumer_paused", obj=billing, reason="r-billing"
    )
    AuditEntry.objects.record(actor="user:someone", action="consumer_paused", obj=other, reason="r-deployer")
    AuditEntry.objects.record(
        actor="token:pim-sync", action="passport_published", obj=passport, reason="r-pass"
    )
    AuditEntry.objects.record(actor="user:someone", action="registry_abandoned", obj=reg, reason="r-reg")

    found = search(admin_client, "https://id.example.eu/01/1/21/FIND-ME")
    assert "r-pass" in found and "r-reg" in found and "r-billing" not in found
    found = search(admin_client, "billing")
    assert "r-billing" in found and "r-deployer" not in found and "r-pass" not in found
    found = search(admin_client, "ops-lead")
    assert "r-billing" in found and "r-deployer" not in found and "r-reg" not in found
    found = search(admin_client, "pim-sync")
    assert "r-pass" in found and "r-billing" not in found


def test_an_audit_search_reads_the_trail_by_its_indexes_only(admin_client):
    """No LIKE over the trail (a sequential scan at ten million entries): the search finds the
    objects and actors first, then the entries by object_id and actor (audit_actor_idx)."""
    ConsumerFactory(name="billing")
    with CaptureQueriesContext(connection) as queries:
        search(admin_client, "billing")
    trail = [q["sql"] for q in queries.captured_queries if 'FROM "odal_auditentry"' in q["sql"]]
    assert trail
    for sql in trail:
        assert " LIKE " not in sql.upper(), sql


# -- event types as comma-separated names -----------------------------------------------------


def consumer_post(**fields):
    return {
        "name": "billing", "kind": "python", "url": "", "target": "tests.consumers.accept",
        "event_types": "passport.*, outbox.test", "max_attempts": 3, "timeout_seconds": 2, **fields,
    }  # fmt: skip


def test_event_types_are_typed_as_comma_separated_names(admin_client):
    answer = admin_client.post(reverse("admin:outbox_consumer_add"), consumer_post())
    assert answer.status_code == 200, answer.content.decode()[:2000]
    consumer = Consumer.objects.get(name="billing")
    assert consumer.event_types == ["passport.*", "outbox.test"]
    page = admin_client.get(reverse("admin:outbox_consumer_change", args=[consumer.pk])).content.decode()
    assert re.search(r'name="event_types"[^>]*value="passport\.\*, outbox\.test"', page) or re.search(
        r'value="passport\.\*, outbox\.test"[^>]*name="event_types"', page
    ), re.findall(r"<[^>]*event_types[^>]*>", page)


def test_an_event_type_that_is_no_pattern_is_refused_by_the_same_rule(admin_client):
    answer = admin_client.post(
        reverse("admin:outbox_consumer_add"), consumer_post(event_types="passport.*, no way")
    )
    assert not Consumer.objects.exists()
    assert "is not an event pattern" in answer.content.decode()


# -- a plain no is not a red cross ------------------------------------------------------------


def test_a_plain_no_is_a_word_not_a_red_cross(admin_client):
    consumer = ConsumerFactory(name="billing", paused=False)
    delivery = DeliveryFactory(consumer=consumer)
    now = timezone.now()
    DeliveryAttempt.objects.create(delivery=delivery, number=1, claim_token=delivery.pk, started_at=now,
                                   finished_at=now, outcome="failed", late=False)  # fmt: skip
    for url in (
        reverse("admin:outbox_consumer_changelist"),
        reverse("admin:outbox_consumer_change", args=[consumer.pk]),
        reverse("admin:outbox_delivery_change", args=[delivery.pk]),
    ):
        assert "icon-no.svg" not in admin_client.get(url).content.decode(), url


# -- internals for superusers -----------------------------------------------------------------


def test_staff_see_no_claim_token_and_superusers_do(client, admin_client):
    token = "0f0f0f0f-1111-2222-3333-444444444444"
    delivery = DeliveryFactory(claim_token=token)
    reg = RegistrationFactory(claim_token=token)
    client.force_login(staff_in("Operators"))
    for url in (
        reverse("admin:outbox_delivery_change", args=[delivery.pk]),
        reverse("admin:registry_registration_change", args=[reg.pk]),
    ):
        page = client.get(url)
        assert page.status_code == 200
        assert token not in page.content.decode() and "claim token" not in page.content.decode().lower(), url
        assert token in admin_client.get(url).content.decode(), url


def test_django_q_tables_are_for_superusers_only(client, admin_client):
    staff = UserFactory()
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_q"))
    client.force_login(staff)
    assert client.get(reverse("admin:django_q_schedule_changelist")).status_code == 403
    assert "Background tasks" not in client.get(reverse("admin:index")).content.decode()
    assert admin_client.get(reverse("admin:django_q_schedule_changelist")).status_code == 200


def test_an_operator_is_told_no_environment_variable(client, settings):
    """The abandon page's "not checked in time" names ODAL_ADMIN_REGISTRY_SECONDS to superusers only."""
    from registry.admin import not_checked_note

    assert "ODAL_" not in not_checked_note(UserFactory(), 20)
    assert "ODAL_ADMIN_REGISTRY_SECONDS" in not_checked_note(UserFactory(is_superuser=True), 20)


# -- filters named apart ----------------------------------------------------------------------

LISTS = [
    "odal_passport", "odal_auditentry", "odal_apitoken", "outbox_consumer", "outbox_delivery", "outbox_deadletter",
    "outbox_event", "registry_registration", "registry_stalledregistration",
]  # fmt: skip


@pytest.mark.parametrize("name", LISTS)
def test_no_two_filters_of_a_list_have_the_same_title(admin_client, name):
    page = admin_client.get(reverse(f"admin:{name}_changelist")).content.decode()
    titles = [re.sub(r"\s+", " ", t).strip() for t in re.findall(r"<summary>(.*?)</summary>", page, re.S)]
    assert len(titles) == len(set(titles)), titles
    assert " By status " not in f" {' '.join(titles)} "


def test_the_passport_list_names_its_two_status_filters(admin_client):
    page = admin_client.get(reverse("admin:odal_passport_changelist")).content.decode()
    assert "By passport status" in page and "By registration status" in page


# -- the demo's refused passport: refused as the registry refuses a product -------------------


def test_the_demo_simulator_refuses_the_refuse_passport_with_a_422_and_its_errors(registry_simulator):
    from odal.surfaces.management.commands.demo import DEMO_PASSPORTS
    from odal.surfaces.management.commands.up import Command

    (argv,) = [argv for name, argv in Command().processes("127.0.0.1:8000") if name == "registry simulator"]
    faults = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--fault")
    registry_simulator.state.reset()
    registry_simulator.state.faults.update({k: int(v) if v.isdigit() else v for k, v in faults.items()})
    (upi,) = [upi for upi, *_ in DEMO_PASSPORTS if "REFUSE" in upi]
    port = registry_simulator.server_address[1]
    answer = httpx.post(
        f"http://127.0.0.1:{port}/dpp-registration-requests",
        json={"upi": upi, "operatorId": "OP-DEMO-2", "dppEndpoint": "http://x"},
        headers={"Authorization": "Bearer sim-token"},
    )
    registry_simulator.state.reset()
    assert answer.status_code == 422, answer.text
    assert json.loads(answer.text)["errors"], answer.text


def test_status_filters_still_filter(admin_client):
    RegistrationFactory(status="rejected", passport__upi="https://id.example.eu/01/1/21/REJ")
    listing = admin_client.get(
        reverse("admin:odal_passport_changelist"), {"registration__status__exact": "rejected"}
    )
    assert "/21/REJ" in listing.content.decode()
    assert Registration.objects.count() == 1
