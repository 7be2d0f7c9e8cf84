import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import AuditEntry
from registry.models import Registration
from tests.factories import backed_off_registration

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("registry", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_abandon_says_the_passport_stays_published(registry_sim):
    reg = backed_off_registration()
    out = run("abandon", str(reg.passport_id), "--reason", "registry refuses it", "--actor", "alice")
    assert "Abandoned" in out and "stays published" in out
    assert Registration.objects.get(pk=reg.pk).note == "abandoned by cli:alice: registry refuses it"
    assert AuditEntry.objects.get(action="registry_abandoned").actor == "cli:alice"


def test_abandon_json_and_already_abandoned_exit_0(registry_sim):
    reg = backed_off_registration()
    first = json.loads(run("abandon", str(reg.passport_id), "--reason", "gone", "--json"))
    assert first["status"] == "abandoned" and first["alreadyAbandoned"] is False
    second = json.loads(run("abandon", str(reg.passport_id), "--reason", "gone", "--json"))
    assert second["alreadyAbandoned"] is True


def test_abandon_refused_exits_1(registry_sim):
    reg = backed_off_registration(attempts=0)
    with pytest.raises(CommandError, match="never been attempted") as refused:
        run("abandon", str(reg.passport_id), "--reason", "x")
    assert refused.value.returncode == 1


def test_abandon_registry_unreadable_exits_3(registry_sim, settings):
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"
    reg = backed_off_registration()
    with pytest.raises(CommandError, match="Safe to retry") as refused:
        run("abandon", str(reg.passport_id), "--reason", "x")
    assert refused.value.returncode == 3
    assert Registration.objects.get(pk=reg.pk).status == "pending"


def test_abandon_bad_id_is_refused(registry_sim):
    with pytest.raises(CommandError, match="not a passport id"):
        run("abandon", "123", "--reason", "x")


def test_abandon_without_reason_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "odal", "registry", "abandon", "x"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "--reason" in result.stderr


def test_handle_and_status():
    reg = backed_off_registration(status="submitted")
    assert "registered with handle reg-5" in run(
        "handle", str(reg.passport_id), "reg-5", "--reason", "portal"
    )
    body = json.loads(run("status", "--json"))
    assert body["registered"] == 1 and body["stalled"] == 0
    assert "abandoned 0" in run("status")


def test_handle_on_abandoned_exits_1():
    reg = backed_off_registration(status="abandoned")
    with pytest.raises(CommandError, match="abandoned") as refused:
        run("handle", str(reg.passport_id), "reg-5", "--reason", "portal")
    assert refused.value.returncode == 1


def test_drain_once(registry_sim):
    reg = backed_off_registration(attempts=0)
    Registration.objects.filter(pk=reg.pk).update(next_attempt_at=reg.created_at)
    assert "1 submitted" in run("drain", "--once")


def test_simulate_refuses_an_unknown_fault():
    with pytest.raises(CommandError, match="NAME=VALUE"):
        run("simulate", "--fault", "gremlins=1")


def test_odal_up_starts_the_simulator_with_the_demo_faults_only():
    """`make run`'s registry answers at once and without a rate limit; only the demo's faults."""
    from odal.surfaces.management.commands.up import Command

    (argv,) = [argv for name, argv in Command().processes("127.0.0.1:8000") if name == "registry simulator"]
    assert argv[-6:] == [
        "--fault", "reject_upi_containing=REFUSE", "--fault", "refuse_upi_containing=OUTAGE",
        "--fault", "checks_until_registered=2",
    ]  # fmt: skip
    assert not {"--latency-ms", "--rate-limit"} & set(argv)
