"""The sweep through django-q2 for real: a qcluster process on the test database picks up the
sweep that a committed publish kicked, and the webhook arrives at a local server."""

import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection
from django_q.conf import Conf
from django_q.models import Schedule

from odal.surfaces import lifecycle
from outbox.models import Delivery
from registry.models import Registration
from tests.factories import PassportFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer


def test_migrations_schedule_the_sweep(db):
    schedule = Schedule.objects.get(name="outbox sweep")
    assert (schedule.func, schedule.schedule_type, schedule.minutes, schedule.repeats) == (
        "outbox.tasks.sweep",
        Schedule.MINUTES,
        1,
        -1,
    )


def test_the_kicked_task_runs_the_sweep(db, settings, monkeypatch):
    """With django-q2's documented sync mode the kick runs the sweep inline at commit."""
    settings.ODAL_KICK_SWEEP = True
    monkeypatch.setattr(Conf, "SYNC", True)
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url)
        passport = PassportFactory()
        with django_capture_on_commit(True):
            lifecycle.publish(passport.pk, actor="test")
    assert len(server.received) == 1
    assert Delivery.objects.get().status == "delivered"


def django_capture_on_commit(execute):
    from django.test import TestCase

    return TestCase.captureOnCommitCallbacks(execute=execute)


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_real_cluster_delivers_the_event_and_registers_the_passport(settings, registry_sim):
    """One publish: the kicked sweep delivers passport.published to a local webhook server and
    the kicked drain registers the passport with the simulator, both in the cluster's process."""
    settings.ODAL_KICK_SWEEP = True
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ODAL_Q_WORKERS": "2",
        "ODAL_REGISTRY_URL": settings.ODAL_REGISTRY_URL,
        "ODAL_REGISTRY_TOKEN": settings.ODAL_REGISTRY_TOKEN,
        "ODAL_REGISTRY_CHECK_SECONDS": "0",
    }
    with WebhookServer() as server:
        WebhookConsumerFactory(url=server.url, event_types=["passport.*"])
        cluster = subprocess.Popen(
            [sys.executable, "-m", "odal", "qcluster"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            passport = PassportFactory()
            lifecycle.publish(passport.pk, actor="test")  # commits: the kick enqueues a sweep
            deadline = time.monotonic() + 45

            def registered():
                return Registration.objects.filter(passport=passport, status="registered").exists()

            while (
                not (server.received and registered())
                and time.monotonic() < deadline
                and cluster.poll() is None
            ):
                time.sleep(0.2)
        finally:
            cluster.send_signal(signal.SIGTERM)  # the sentinel stops its own workers
            try:
                output = cluster.communicate(timeout=30)[0].decode(errors="replace")
            except subprocess.TimeoutExpired:
                os.killpg(cluster.pid, signal.SIGKILL)
                output = cluster.communicate()[0].decode(errors="replace")
    assert server.received, f"no webhook arrived; the cluster said:\n{output[-3000:]}"
    reg = Registration.objects.get(passport=passport)
    assert reg.status == "registered", f"registration is {reg.status}; the cluster said:\n{output[-3000:]}"
    assert reg.handle in registry_sim.registrations
    published = Delivery.objects.get(event__type="passport.published")
    # (passport.registered may arrive first: a sweep calls a consumer concurrently, in no order)
    assert str(published.pk) in [r.headers["webhook-id"] for r in server.received]
    deadline = time.monotonic() + 10
    while Delivery.objects.get(pk=published.pk).status != "delivered" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert Delivery.objects.get(pk=published.pk).status == "delivered"
