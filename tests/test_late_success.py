"""A dead delivery whose late attempt was answered 2xx says so (issue 22, item 5): the sweep
notes lateSuccessAt on the row, the row's status stays as seed 000 wants, and every surface that
shows the delivery, or would send it again, says the consumer already has it."""

import io
import json
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.contrib.admin import helpers
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from odal.core.models import AuditEntry
from outbox.events import emit
from outbox.models import Delivery, DeliveryAttempt
from outbox.sweep import sweep_once
from tests.factories import DeadDeliveryFactory, DeliveryFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db

HOLD = 1  # seconds: short enough for an attempt to outlive it for real


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0  # retries are due at once; the tests sweep by hand


def outlived_hold(settings, script, *, max_attempts):
    """Sweep A claims the one delivery and its consumer stalls past A's hold; meanwhile sweep B
    takes the row (dead-letters it, or claims it and runs its own attempt); then A's answer
    arrives, late. Over real HTTP, with two real sweeps. Returns both reports."""
    settings.ODAL_CLAIM_HOLD_SECONDS = HOLD
    reports = {}
    with WebhookServer(script=script) as server:
        WebhookConsumerFactory(url=server.url, timeout_seconds=5, max_attempts=max_attempts)
        emit("passport.published", {"dppId": "abc"})

        def sweep_a():
            reports["a"] = sweep_once()
            connections.close_all()

        a = threading.Thread(target=sweep_a)
        a.start()
        time.sleep(HOLD + 0.2)  # A's hold has run out; A is still waiting on the consumer
        reports["b"] = sweep_once()
        a.join()
    assert reports["a"].late == 1, "A's answer was meant to arrive after B took the row"
    return reports["a"], reports["b"]


# -- the sweep notes a late 2xx ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_late_2xx_on_a_delivery_dead_lettered_meanwhile_sets_late_success_at_and_leaves_it_dead(settings):
    """Its one attempt never reported within the hold, so B dead-letters it ("never reported");
    then the consumer's 204 arrives."""
    _, b = outlived_hold(settings, [("stall", HOLD + 0.6, 204)], max_attempts=1)

    assert b.dead_lettered == 1 and b.claimed == 0
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.claim_token) == ("dead", 1, None)
    assert delivery.last_error == "attempt 1 never reported (its claim expired)"
    line = DeliveryAttempt.objects.get()
    assert (line.outcome, line.http_status, line.late) == ("delivered", 204, True)
    assert delivery.late_success_at == line.finished_at


@pytest.mark.django_db(transaction=True)
def test_a_late_2xx_after_a_newer_attempt_failed_to_dead_sets_late_success_at_and_leaves_it_dead(settings):
    """A's claim is superseded by B's, whose attempt fails and spends the budget (dead); then A's
    consumer answers 204."""
    _, b = outlived_hold(settings, [("stall", HOLD + 0.6, 204), 500], max_attempts=2)

    assert b.failed == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.claim_token) == ("dead", 2, None)
    assert delivery.last_error.startswith("HTTP 500")
    late = DeliveryAttempt.objects.get(late=True)
    assert (late.number, late.outcome) == (1, "delivered")
    assert delivery.late_success_at == late.finished_at


@pytest.mark.django_db(transaction=True)
def test_a_late_2xx_on_a_delivered_row_is_noted_and_changes_nothing_else(settings):
    _, b = outlived_hold(settings, [("stall", HOLD + 0.6, 204), 204], max_attempts=5)

    assert b.delivered == 1
    delivery = Delivery.objects.get()
    on_time = DeliveryAttempt.objects.get(late=False)
    late = DeliveryAttempt.objects.get(late=True)
    assert (delivery.status, delivery.attempts, on_time.outcome) == ("delivered", 2, "delivered")
    assert delivery.delivered_at < late.finished_at
    assert delivery.late_success_at == late.finished_at


@pytest.mark.django_db(transaction=True)
def test_a_late_failure_on_a_dead_lettered_delivery_notes_no_late_success(settings):
    outlived_hold(settings, [("stall", HOLD + 0.6, 500)], max_attempts=1)

    delivery = Delivery.objects.get()
    assert delivery.status == "dead"
    assert DeliveryAttempt.objects.get().late is True
    assert delivery.late_success_at is None


def test_an_attempt_that_took_its_row_notes_no_late_success():
    with WebhookServer(script=[500, 204]) as server:
        WebhookConsumerFactory(url=server.url, max_attempts=3)
        emit("passport.published", {})
        assert sweep_once().failed == 1
        assert sweep_once().delivered == 1
    delivery = Delivery.objects.get()
    assert delivery.status == "delivered" and delivery.late_success_at is None


# -- the note itself ---------------------------------------------------------------------------------


def test_a_late_success_only_ever_moves_late_success_at_forward():
    delivery = DeadDeliveryFactory()
    rows = Delivery.objects.filter(pk=delivery.pk)
    at = timezone.now()

    assert rows.note_late_success(at=at)
    assert not rows.note_late_success(at=at - timedelta(minutes=5))  # an older answer, written later
    assert not rows.note_late_success(at=at)
    assert rows.get().late_success_at == at
    assert rows.note_late_success(at=at + timedelta(minutes=1))
    assert rows.get().late_success_at == at + timedelta(minutes=1)


def test_noting_a_late_success_is_not_a_state_change():
    """On a row in flight (held by a newer claim) it changes nothing the claim relies on."""
    delivery = DeliveryFactory(max_attempts=3)
    claim = Delivery.objects.claim(limit=1)
    rows = Delivery.objects.filter(pk=delivery.pk)
    before = rows.values("status", "attempts", "claim_token", "next_attempt_at", "last_error").get()

    assert rows.note_late_success(at=timezone.now())

    assert rows.values("status", "attempts", "claim_token", "next_attempt_at", "last_error").get() == before
    assert rows.mark_delivered_each(token=claim.token, at=timezone.now())  # the claim still ends its attempt


def test_the_migration_notes_dead_letters_whose_attempt_log_holds_a_late_2xx():
    executor = MigrationExecutor(connection)
    executor.migrate([("outbox", "0010_coalesced_kicks")])
    old = executor.loader.project_state([("outbox", "0010_coalesced_kicks")]).apps
    consumer = old.get_model("outbox", "Consumer").objects.create(name="erp", url="https://erp.example/h")
    Event, Delivery_, Attempt = (old.get_model("outbox", m) for m in ("Event", "Delivery", "DeliveryAttempt"))
    at = timezone.now()

    def delivery(status, *lines):
        row = Delivery_.objects.create(event=Event.objects.create(type="t"), consumer=consumer, status=status)
        for n, (outcome, late, minutes) in enumerate(lines, 1):
            Attempt.objects.create(
                delivery=row, number=n, claim_token=uuid.uuid4(), started_at=at, outcome=outcome, late=late,
                finished_at=at + timedelta(minutes=minutes),
            )  # fmt: skip
        return row.pk

    answered = delivery("dead", ("delivered", True, 2), ("delivered", True, 1), ("failed", False, 3))
    failed_late = delivery("dead", ("failed", True, 1), ("failed", False, 2))
    delivered = delivery("delivered", ("delivered", True, 1), ("delivered", False, 2))
    resent_then_dead = delivery("dead", ("delivered", False, 1), ("failed", False, 2))  # on time, not late

    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # (no ALTER TABLE with foreign-key checks pending)
    MigrationExecutor(connection).migrate([("outbox", "0011_delivery_late_success_at")])

    noted = dict(Delivery.objects.values_list("pk", "late_success_at"))
    assert noted == {
        answered: at + timedelta(minutes=2),
        failed_late: None,
        delivered: None,
        resent_then_dead: None,
    }


# -- the API -----------------------------------------------------------------------------------------


def answered_late(**fields):
    """A dead delivery whose consumer answered 2xx to a late attempt."""
    delivery = DeadDeliveryFactory(**fields)
    at = timezone.now().replace(microsecond=0)  # as the API writes it (to the millisecond)
    assert Delivery.objects.filter(pk=delivery.pk).note_late_success(at=at)
    delivery.refresh_from_db()
    return delivery


def test_the_api_shows_late_success_at_on_a_delivery_the_dead_letter_list_and_the_event(admin_api):
    marked, plain = answered_late(), DeadDeliveryFactory()
    at = marked.late_success_at.isoformat().replace("+00:00", "Z")

    dead = {
        d["id"]: d["lateSuccessAt"] for d in admin_api.get("outbox/deliveries", status="dead").json()["items"]
    }
    assert dead == {str(marked.pk): at, str(plain.pk): None}
    assert admin_api.get(f"outbox/deliveries/{marked.pk}").json()["lateSuccessAt"] == at
    assert admin_api.get(f"outbox/deliveries/{plain.pk}").json()["lateSuccessAt"] is None
    assert admin_api.get(f"events/{marked.event_id}").json()["deliveries"][0]["lateSuccessAt"] == at


def test_the_api_replay_and_resend_dry_runs_warn_of_dead_deliveries_answered_2xx_late(admin_api):
    erp = WebhookConsumerFactory(name="erp")
    answered_late(consumer=erp)
    DeadDeliveryFactory(consumer=erp)
    delivered = DeliveryFactory(consumer=erp, status="delivered")  # its consumer had it anyway: no warning
    assert Delivery.objects.filter(pk=delivered.pk).note_late_success(at=timezone.now())

    replay = admin_api.post("outbox/replay", {"consumer": "erp", "dryRun": True}).json()
    resend = admin_api.post(
        "outbox/resend", {"consumer": "erp", "reason": "a preview", "dryRun": True}
    ).json()

    assert (replay["wouldReplay"], replay["lateSuccesses"]) == (2, 1)
    assert (resend["wouldResend"], resend["lateSuccesses"]) == (3, 1)
    assert replay["warning"].startswith(
        "1 of the dead deliveries here was answered 2xx by its consumer after all"
    )
    assert "replaying sends it again" in replay["warning"]
    assert "resending sends it again" in resend["warning"]
    assert Delivery.objects.filter(status="dead").count() == 2  # a dry run changes nothing


def test_the_api_dry_runs_say_nothing_when_no_dead_delivery_was_answered_late(admin_api):
    erp = WebhookConsumerFactory(name="erp")
    DeadDeliveryFactory(consumer=erp)
    answered_late()  # another consumer's

    replay = admin_api.post("outbox/replay", {"consumer": "erp", "dryRun": True}).json()
    resend = admin_api.post(
        "outbox/resend", {"consumer": "erp", "reason": "a preview", "dryRun": True}
    ).json()

    assert (replay["lateSuccesses"], replay["warning"]) == (0, None)
    assert (resend["lateSuccesses"], resend["warning"]) == (0, None)


@pytest.mark.parametrize("verb", ["replay", "resend"])
def test_replaying_or_resending_one_delivery_answered_2xx_late_says_so(admin_api, verb):
    marked, plain = answered_late(), DeadDeliveryFactory()

    answer = admin_api.post(f"outbox/deliveries/{marked.pk}/{verb}", {"reason": "the endpoint is fixed"})
    quiet = admin_api.post(f"outbox/deliveries/{plain.pk}/{verb}", {"reason": "the endpoint is fixed"})

    assert answer.status_code == 200 and answer.json()["status"] == "pending"
    assert answer.json()["warning"].startswith(
        "This dead delivery was answered 2xx by its consumer after all, at "
    )
    assert f"and {verb}ing sends it again" in answer.json()["warning"]
    assert quiet.status_code == 200 and quiet.json()["warning"] is None


def test_resending_a_delivered_delivery_whose_consumer_also_answered_late_is_no_warning(admin_api):
    """Its consumer had it anyway (it is delivered): a resend is asked for exactly that."""
    delivered = DeliveryFactory(status="delivered")
    assert Delivery.objects.filter(pk=delivered.pk).note_late_success(at=timezone.now())

    answer = admin_api.post(f"outbox/deliveries/{delivered.pk}/resend", {"reason": "they lost it"})

    assert answer.status_code == 200 and answer.json()["warning"] is None


# -- the admin ---------------------------------------------------------------------------------------


def shown(at) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC"


def test_the_dead_letter_list_marks_what_the_consumer_answered_2xx_late_and_filters_on_it(admin_client):
    marked, plain = answered_late(), DeadDeliveryFactory()

    page = admin_client.get("/admin/outbox/deadletter/").content.decode()
    has = admin_client.get("/admin/outbox/deadletter/", {"late_success": "yes"}).content.decode()
    never = admin_client.get("/admin/outbox/deadletter/", {"late_success": "no"}).content.decode()

    assert f"at {shown(marked.late_success_at)} — it has it" in page and "2 dead letters" in page
    assert str(marked.pk) in has and str(plain.pk) not in has
    assert str(plain.pk) in never and str(marked.pk) not in never


def test_the_deliveries_list_and_page_show_a_dead_delivery_answered_2xx_late(admin_client):
    marked = answered_late()
    delivered = DeliveryFactory(status="delivered")
    Delivery.objects.filter(pk=delivered.pk).note_late_success(at=timezone.now())

    listing = admin_client.get("/admin/outbox/delivery/").content.decode()
    page = admin_client.get(f"/admin/outbox/delivery/{marked.pk}/change/").content.decode()

    assert listing.count("consumer answered 2xx late at") == 1  # the dead one; delivered is just delivered
    assert f"dead — consumer answered 2xx late at {shown(marked.late_success_at)}" in listing
    assert "Late success at" in page


@pytest.mark.parametrize("action, verb", [("replay_selected", "replaying"), ("resend_selected", "resending")])
@pytest.mark.parametrize("changelist", ["/admin/outbox/delivery/", "/admin/outbox/deadletter/"])
def test_the_admin_replay_and_resend_pages_warn_of_dead_deliveries_answered_2xx_late(
    admin_client, changelist, action, verb
):
    marked, plain = answered_late(), DeadDeliveryFactory()
    selected = {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(marked.pk), str(plain.pk)]}

    page = admin_client.post(changelist, selected).content.decode()
    quiet = admin_client.post(changelist, {**selected, helpers.ACTION_CHECKBOX_NAME: [str(plain.pk)]})

    assert 'name="reason"' in page
    assert '<li class="warning">1 of the dead deliveries here was answered 2xx by its consumer' in page
    assert f"and {verb} sends it again" in page
    assert f"<td>dead — consumer answered 2xx late at {shown(marked.late_success_at)}</td>" in page
    assert "<td>dead</td>" in page  # the other one
    assert 'class="warning"' not in quiet.content.decode()
    assert Delivery.objects.filter(status="dead").count() == 2  # a first pass changes nothing


# -- counts, the dashboard and the command line ------------------------------------------------------


def outbox(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("outbox", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_counts_the_dashboard_and_odal_outbox_status_mark_dead_letters_answered_2xx_late(admin_client):
    erp = WebhookConsumerFactory(name="erp")
    answered_late(consumer=erp)
    DeadDeliveryFactory(consumer=erp)
    delivered = DeliveryFactory(consumer=erp, status="delivered")
    Delivery.objects.filter(pk=delivered.pk).note_late_success(at=timezone.now())  # not a dead letter

    counts = json.loads(outbox("status", "--json")[0])
    human, _ = outbox("status")
    dashboard = admin_client.get("/admin/").content.decode()

    assert (counts["dead"], counts["deadLateSuccesses"]) == (2, 1)
    assert (counts["consumers"][0]["dead"], counts["consumers"][0]["deadLateSuccesses"]) == (2, 1)
    assert "dead 2 (1 answered 2xx late)" in human and "erp" in human
    assert (
        'href="/admin/outbox/deadletter/?late_success=yes"><b>1</b><span>dead, but answered 2xx late'
        in dashboard
    )


def test_odal_outbox_show_gives_late_success_at_in_json_and_says_what_it_means():
    marked = answered_late()
    DeliveryAttempt.objects.create(
        delivery=marked, number=3, claim_token=uuid.uuid4(), started_at=marked.late_success_at,
        finished_at=marked.late_success_at, outcome="delivered", http_status=204, late=True,
    )  # fmt: skip

    body = json.loads(outbox("show", str(marked.pk), "--json")[0])
    human, _ = outbox("show", str(marked.pk))

    assert body["status"] == "dead" and body["id"] == str(marked.pk)
    assert datetime.fromisoformat(body["lateSuccessAt"]) == marked.late_success_at
    assert [(a["number"], a["outcome"], a["late"]) for a in body["attemptLog"]] == [(3, "delivered", True)]
    assert (
        f"the consumer answered 2xx to a late attempt at {marked.late_success_at:%Y-%m-%d %H:%M:%S}Z: it has "
        "this delivery although it is dead, and a replay or resend sends it again."
    ) in human
    assert "attempt 3" in human and "HTTP 204 (late: written to the log only)" in human


def test_odal_outbox_show_of_an_unknown_delivery_exits_1_and_a_bad_id_2():
    with pytest.raises(CommandError, match="No delivery") as unknown:
        outbox("show", str(uuid.uuid4()))
    with pytest.raises(CommandError) as bad:
        outbox("show", "not-an-id")
    assert (unknown.value.returncode, bad.value.returncode) == (1, 2)


@pytest.mark.parametrize("verb", ["replay", "resend"])
def test_odal_outbox_replay_and_resend_dry_runs_warn_of_dead_deliveries_answered_2xx_late(verb):
    erp = WebhookConsumerFactory(name="erp")
    answered_late(consumer=erp)
    DeadDeliveryFactory(consumer=erp)
    which = ["--dead", "--consumer", "erp"] if verb == "replay" else ["--consumer", "erp"]

    out, err = outbox(verb, *which, "--reason", "the endpoint is fixed", "--dry-run")

    assert f"Would {verb} 2" in out
    assert err.startswith("Warning: 1 of the dead deliveries here was answered 2xx by its consumer after all")
    assert f"and {verb}ing sends it again" in err
    assert Delivery.objects.filter(status="dead").count() == 2


@pytest.mark.parametrize("verb", ["replay", "resend"])
def test_odal_outbox_replay_and_resend_of_named_deliveries_warn_too_and_a_plain_one_does_not(verb):
    marked, plain = answered_late(), DeadDeliveryFactory()

    _, warned = outbox(verb, str(marked.pk), "--reason", "the endpoint is fixed")
    _, quiet = outbox(verb, str(plain.pk), "--reason", "the endpoint is fixed")

    assert "Warning: 1 of the dead deliveries here was answered 2xx" in warned
    assert quiet == ""
    assert set(Delivery.objects.values_list("status", flat=True)) == {"pending"}


@pytest.mark.parametrize("verb", ["replay", "resend"])
def test_the_audit_trail_of_a_replay_or_resend_keeps_late_success_at_and_the_row_keeps_it_too(verb):
    marked, plain = answered_late(), DeadDeliveryFactory()

    taken = getattr(Delivery.objects.filter(pk__in=[marked.pk, plain.pk]), verb)(actor="test", reason="fixed")

    assert taken == 2
    details = dict(AuditEntry.objects.values_list("object_id", "details__lateSuccessAt"))
    assert details == {str(marked.pk): marked.late_success_at.isoformat(), str(plain.pk): None}
    assert Delivery.objects.get(pk=marked.pk).late_success_at == marked.late_success_at  # history: kept
