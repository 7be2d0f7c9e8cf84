"""Python consumers in a sweep pass: they run on a thread of their own, so webhook outcomes are
written while they run, and none starts after the claim's hold ran out (issue 12)."""

import pytest

from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from tests import consumers
from tests.factories import ConsumerFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer


@pytest.fixture(autouse=True)
def _calls():
    consumers.calls.clear()


@pytest.mark.django_db(transaction=True)  # the Python consumer reads what the sweep committed
def test_webhook_outcomes_are_written_while_a_python_consumer_runs():
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        ConsumerFactory(target="tests.consumers.waits_for_a_delivered_webhook")
        emit("passport.published", {"n": 1})

        report = sweep_once()

    assert consumers.calls == ["saw the webhook delivered"]
    assert (report.claimed, report.delivered, report.late) == (2, 2, 0)


@pytest.mark.django_db
def test_no_python_consumer_starts_after_the_claims_hold_ran_out(settings):
    """Two deliveries to a Python consumer that takes 1.2 s, a 1 s hold: the second's turn
    comes when it is due again for any claimer. It is not called, gets its counted attempt back,
    and is due at once."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    ConsumerFactory(target="tests.consumers.slow")
    emit("passport.published", {"n": 1})
    emit("passport.published", {"n": 2})

    report = sweep_once()

    assert (report.claimed, report.delivered, report.not_started) == (2, 1, 1)
    assert len(consumers.calls) == 1
    waiting = Delivery.objects.get(status="pending")
    assert (waiting.attempts, waiting.claim_token) == (0, None)
    assert not waiting.attempt_log.exists()
