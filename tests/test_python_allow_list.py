"""ODAL_PYTHON_CONSUMERS: the callables a Python consumer's target may name. Anything else is
refused on every surface (API, admin, command line) without being imported; a consumer made
before the list (or before it was narrowed) is paused by the sweep at its start, never called."""

import io
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import AuditEntry
from outbox import consumers as consumer_calls
from outbox.events import emit
from outbox.models import Consumer, Delivery
from outbox.sweep import sweep_once, sweep_until_idle
from tests import consumers
from tests.factories import ConsumerFactory, DeliveryFactory
from tests.test_settings import read_settings, refusal

SENTINEL = "tests.import_sentinel.call"  # importing it raises RuntimeError


@pytest.fixture(autouse=True)
def _forget_calls():
    consumers.calls.clear()
    sys.modules.pop("tests.import_sentinel", None)


# -- the setting ---------------------------------------------------------------------------------------


def test_the_default_allows_only_the_demo_receiver():
    assert read_settings()["ODAL_PYTHON_CONSUMERS"] == ("outbox.receiver.*",)


def test_the_list_takes_dotted_paths_and_prefixes():
    read = read_settings(ODAL_PYTHON_CONSUMERS=" erp.hooks.on_event , billing.* ")
    assert read["ODAL_PYTHON_CONSUMERS"] == ("erp.hooks.on_event", "billing.*")


@pytest.mark.parametrize(
    "value", ["*", "erp", "erp..x", "erp.hooks,,billing.*", "os.system()", "erp.*.x", "é.x"]
)
def test_a_malformed_list_stops_start_up_naming_the_variable(value):
    assert "ODAL_PYTHON_CONSUMERS" in refusal(ODAL_PYTHON_CONSUMERS=value)


# -- refused on every surface, nothing imported --------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "target", ["os.system", "subprocess.run", SENTINEL, "outbox.service.remove_consumer"]
)
def test_the_api_refuses_a_target_outside_the_list_without_importing_it(admin_api, target):
    answer = admin_api.post("outbox/consumers", {"name": "erp", "kind": "python", "target": target})
    assert answer.status_code == 422, answer.content
    assert "ODAL_PYTHON_CONSUMERS" in answer.json()["detail"]
    assert not Consumer.objects.exists() and not AuditEntry.objects.exists()
    assert "tests.import_sentinel" not in sys.modules


@pytest.mark.django_db
def test_an_allowed_target_whose_import_raises_is_422_not_500(admin_api, settings):
    settings.ODAL_PYTHON_CONSUMERS = (*settings.ODAL_PYTHON_CONSUMERS, "tests.import_sentinel.*")
    answer = admin_api.post("outbox/consumers", {"name": "erp", "kind": "python", "target": SENTINEL})
    assert answer.status_code == 422, answer.content
    assert answer.json()["code"] == "invalid_target"
    assert "RuntimeError: tests.import_sentinel was imported" in answer.json()["detail"]
    assert not Consumer.objects.exists()


@pytest.mark.django_db
def test_a_prefix_allows_only_what_is_defined_under_it(admin_api, settings):
    # outbox.receiver imports Webhook from standardwebhooks: under the prefix by name, not by origin.
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*",)
    answer = admin_api.post(
        "outbox/consumers", {"name": "erp", "kind": "python", "target": "outbox.receiver.Webhook"}
    )
    assert answer.status_code == 422, answer.content
    assert "not defined under an allowed prefix" in answer.json()["detail"]
    assert not Consumer.objects.exists()


@pytest.mark.django_db
def test_changing_a_target_to_one_outside_the_list_is_refused(admin_api):
    ConsumerFactory(name="erp", target="tests.consumers.accept")
    answer = admin_api.patch("outbox/consumers/erp", {"target": "os.system", "reason": "try"})
    assert answer.status_code == 422, answer.content
    assert Consumer.objects.get().target == "tests.consumers.accept"
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_the_admin_refuses_a_target_outside_the_list_without_importing_it(admin_client):
    page = admin_client.post(
        "/admin/outbox/consumer/add/",
        {"name": "erp", "kind": "python", "url": "", "target": SENTINEL, "event_types": "[]",
         "max_attempts": 3, "timeout_seconds": 10},
    )  # fmt: skip
    assert page.status_code == 200  # the form again, with its error
    assert "ODAL_PYTHON_CONSUMERS" in page.content.decode()
    assert not Consumer.objects.exists()
    assert "tests.import_sentinel" not in sys.modules


@pytest.mark.django_db
def test_the_command_line_refuses_a_target_outside_the_list_without_importing_it():
    with pytest.raises(CommandError, match="ODAL_PYTHON_CONSUMERS") as refused:
        call_command("outbox", "consumer", "add", "erp", "--target", SENTINEL, stdout=io.StringIO())
    assert refused.value.returncode == 1  # refused (2 would be a usage error)
    assert not Consumer.objects.exists()
    assert "tests.import_sentinel" not in sys.modules


# -- a consumer made before the list: paused at start, never called ----------------------------------


@pytest.mark.django_db
def test_the_sweep_pauses_a_consumer_outside_the_list_at_its_start_and_never_calls_it(settings):
    inside = ConsumerFactory(name="erp", target="tests.consumers.accept")
    outside = ConsumerFactory(name="old-erp", target="tests.consumers.slow")  # made before the list
    emit("passport.published", {"n": 1})
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*", "tests.consumers.accept")

    report = sweep_once()

    outside.refresh_from_db()
    assert outside.paused and outside.paused_by == "odal"
    assert "ODAL_PYTHON_CONSUMERS" in outside.paused_reason
    parked = Delivery.objects.get(consumer=outside)
    assert (parked.status, parked.attempts) == ("paused", 0)  # waits, never attempted
    # Only the allowed consumer was called: the event, and the consumer.paused the pause emitted.
    called = sorted(type_ for type_, _ in consumers.calls)
    assert called == ["consumer.paused", "passport.published"] and report.failed == 0
    assert {d for _, d in consumers.calls} == {str(d.pk) for d in Delivery.objects.filter(consumer=inside)}
    [entry] = AuditEntry.objects.filter(action="consumer_paused")
    assert (entry.actor, entry.object_id) == ("odal", str(outside.pk))
    assert entry.details["target"] == "tests.consumers.slow" and entry.details["automatic"] is True
    # once: the next pass finds nothing more to pause
    sweep_once()
    assert AuditEntry.objects.filter(action="consumer_paused").count() == 1


@pytest.mark.django_db
def test_a_run_of_passes_pauses_a_consumer_outside_the_list_before_its_first_claim(settings):
    """A run of passes (odal outbox sweep, a kicked task) does its housekeeping after its passes,
    so that no commit's webhook waits for it, but its first: that one comes before any claim, so
    a consumer outside the list is paused before a row of it can be attempted."""
    ConsumerFactory(name="erp", target="tests.consumers.accept")
    outside = ConsumerFactory(name="old-erp", target="tests.consumers.slow")
    emit("passport.published", {"n": 1})
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*", "tests.consumers.accept")

    report = sweep_until_idle(max_seconds=10, linger_seconds=0)

    parked = Delivery.objects.get(consumer=outside)
    assert (parked.status, parked.attempts) == ("paused", 0)  # waits, never attempted
    assert report.failed == 0 and report.delivered == 2  # the event and consumer.paused, to erp


@pytest.mark.django_db
def test_a_consumer_outside_the_list_is_not_resumed(admin_api, settings):
    ConsumerFactory(name="old-erp", target="tests.consumers.accept")
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*",)
    sweep_once()
    answer = admin_api.post("outbox/consumers/old-erp/resume", {"reason": "try again"})
    assert answer.status_code == 409, answer.content
    assert answer.json()["code"] == "target_not_allowed"
    assert Consumer.objects.get().paused
    assert not AuditEntry.objects.filter(action="consumer_resumed").exists()


@pytest.mark.django_db
def test_a_claimed_row_of_a_consumer_outside_the_list_is_not_called(settings):
    # Belt and braces: a row claimed before the pause (another process's list) fails, uncalled.
    delivery = DeliveryFactory(consumer=ConsumerFactory(target="tests.consumers.accept"))
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*",)
    outcome = consumer_calls.call(delivery.consumer, delivery.pk, delivery.event, client=None)
    assert not outcome.ok and outcome.error.startswith("not called:")
    assert "ODAL_PYTHON_CONSUMERS" in outcome.error
    assert consumers.calls == []


@pytest.mark.django_db
def test_a_consumer_a_person_paused_keeps_their_pause(settings):
    person = ConsumerFactory(
        name="old-erp",
        target="tests.consumers.accept",
        paused=True,
        paused_by="user:alice",
        paused_reason="ERP down",
    )
    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*",)
    sweep_once()
    person.refresh_from_db()
    assert (person.paused_by, person.paused_reason) == ("user:alice", "ERP down")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_a_resume_read_before_the_target_changed_does_not_resume_it(settings):
    from outbox import service

    settings.ODAL_PYTHON_CONSUMERS = ("outbox.receiver.*", "tests.consumers.accept")
    consumer = ConsumerFactory(target="tests.consumers.accept", paused=True, paused_by="user:alice")
    stale = Consumer.objects.get(pk=consumer.pk)  # read while its target was allowed
    Consumer.objects.filter(pk=consumer.pk).update(target="tests.consumers.explode")  # (an older list's)
    assert service.resume(stale, actor="user:bob", reason="back") is None
    assert Consumer.objects.get(pk=consumer.pk).paused
    assert not AuditEntry.objects.exists()
