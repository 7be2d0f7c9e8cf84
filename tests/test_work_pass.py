"""The one pass of odal.work (odal/work/passes.py), as the sweep and the drain use it: what the
review of the refactor found it doing differently from the two passes it replaced."""

import pytest
from django.db import DataError
from django.utils import timezone

from odal.core import stopping
from odal.surfaces import lifecycle
from outbox import consumers, sweep
from outbox.models import Delivery, DeliveryAttempt
from outbox.sweep import Finished, finish_attempts
from registry import adapters, drain
from registry.drain import drain_once
from registry.models import Registration
from tests.factories import DeliveryFactory, PassportFactory


@pytest.mark.django_db
def test_one_outcome_the_database_refuses_once_is_written_on_its_retry(monkeypatch):
    """A set of one the database refuses (a deadlock, a serialization failure: passing) is
    written again on its own, as a larger set's outcomes are: not a write_error whose row stays
    claimed and whose webhook is sent again after the hold."""
    DeliveryFactory()
    claim = Delivery.objects.claim(limit=1, select_related=("event",))
    d, now = claim.rows[0], timezone.now()
    real, calls = sweep._settle, []

    def refuse_once(token, finished):
        calls.append(len(finished))
        if len(calls) == 1:
            raise DataError("deadlock detected (transient)")
        return real(token, finished)

    monkeypatch.setattr(sweep, "_settle", refuse_once)
    settled = finish_attempts(claim.token, [Finished(d, consumers.Outcome(True), now, now)])

    assert settled.taken == {d.pk} and calls == [1, 1]
    d.refresh_from_db()
    assert d.status == Delivery.Status.DELIVERED
    assert not DeliveryAttempt.objects.filter(outcome=DeliveryAttempt.Outcome.WRITE_ERROR).exists()


@pytest.mark.django_db
def test_a_drain_asked_to_stop_during_a_request_plans_no_further_row(settings, monkeypatch):
    """SIGTERM while a request is out: the pass gives its waiting rows back before it starts
    anything more (no passport read, no pace slot booked, for a row it will not send)."""
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    for _ in range(3):
        lifecycle.publish(PassportFactory().pk, actor="test")

    class Adapter:
        def register(self, registration):
            monkeypatch.setattr(stopping, "_here", True)  # SIGTERM while the request is out
            return adapters.Accepted(request_id=f"req-{registration.pk}")

        def close(self):
            pass

    planned, real = [], drain.operation_of

    def counting(reg):
        plan, settle = real(reg)

        def counted(attempt):
            planned.append(attempt.reg.pk)
            return plan(attempt)

        return counted, settle

    monkeypatch.setattr(drain, "operation_of", counting)
    report = drain_once(adapter=Adapter())
    assert report.submitted == 1 and report.not_started == 2
    assert len(planned) == 1, planned
    assert Registration.objects.filter(claim_token__isnull=False).count() == 0
