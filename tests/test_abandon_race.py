"""Abandon against a drain attempt made while the registry is being asked (issue 12): a slow task
list read newest first, and a register whose reply is lost landing on its first page after that
page was read. The registry holds a submission; abandon must not say it holds none."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from registry import service
from registry.drain import drain_once
from registry.models import Registration
from tests.factories import PassportFactory


def task_list_reads(sim) -> int:
    return sum(1 for call in list(sim.calls) if call == ("GET", "/dpp-registration-requests"))


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)  # abandon runs on its own thread and connection
@pytest.mark.slow
def test_abandon_refuses_when_a_drain_attempt_lands_during_a_slow_newest_first_lookup(registry_sim, settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 60
    for n in range(5):  # other passports' requests: the task list has three pages of two
        registry_sim.hold(f"https://id.example.eu/01/09506000134352/21/OTHER-{n}", f"req-other-{n}")
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    registry_sim.faults["register_5xx"] = 1
    assert drain_once().failed == 1  # tried once; nothing reached the registry
    due_at = timezone.now() + timedelta(seconds=1)  # backed off, and due while the lookup reads
    Registration.objects.filter(passport=passport).update(next_attempt_at=due_at)
    registry_sim.faults.update(page_size=2, task_list_newest_first=True, task_list_latency=1.5, lost_reply=1)
    outcome = {}

    def abandon():
        try:
            outcome["result"] = service.abandon(passport.pk, actor="user:ops", reason="registry refuses it")
        except Refused as exc:
            outcome["refused"] = exc
        finally:
            connections.close_all()

    lookup = threading.Thread(target=abandon)
    lookup.start()
    wait_for(lambda: task_list_reads(registry_sim) >= 2)  # page 1 has been read
    wait_for(lambda: timezone.now() > due_at)
    attempt = drain_once()  # claimed; the register reaches the registry; the reply is lost
    lookup.join(30)

    assert attempt.failed == 1
    held = [r for r in registry_sim.requests.values() if r["upi"] == passport.upi]
    assert len(held) == 1, "the registry holds the lost-reply submission"
    assert "result" not in outcome, f"abandoned while the registry holds {held[0]['requestId']}"
    assert outcome["refused"].code == "registration_changed" and outcome["refused"].status == 409
    reg = Registration.objects.get(passport=passport)
    assert (reg.status, reg.attempts) == ("pending", 2)
    assert not AuditEntry.objects.filter(action="registry_abandoned").exists()
