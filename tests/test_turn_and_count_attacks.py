"""Attacks on issue 26's changes from their review: the tally's counts under mixed one-statement
updates, version 7 keys through every API path, and hand-overs that go wrong."""

import threading
import time

import pytest
from django.db import connections
from django.db.models import Case, Count, Value, When

from odal.core import tally
from odal.work import wake
from odal.work.wake import SWEEP, Listener
from outbox.models import Delivery
from registry.models import Registration
from tests.factories import ConsumerFactory, DeliveryFactory, RegistrationFactory
from tests.waiting import advisory_lock_holders

pytestmark = pytest.mark.django_db


def delivered_by_consumer() -> dict:
    return {int(k): v for k, v in tally.totals("outbox.delivered")["outbox.delivered"].items() if v}


def status_figures() -> dict:
    return {k: v for k, v in tally.totals("registry.status")["registry.status"].items() if v}


def status_rows() -> dict:
    rows = Registration.objects.values("status").annotate(n=Count("pk")).order_by()
    return {r["status"]: r["n"] for r in rows}


def test_mixed_delivery_updates_count_only_moves_into_delivered():
    a, b = ConsumerFactory(), ConsumerFactory()
    pend = DeliveryFactory.create_batch(4, consumer=a)
    done = DeliveryFactory.create_batch(3, consumer=a, status="delivered")
    dead = DeliveryFactory.create_batch(2, consumer=b, status="dead")
    base = delivered_by_consumer()
    assert base == {a.pk: 3}
    ids = [d.pk for d in pend + done + dead]
    # One statement: pending->delivered (4), delivered->delivered (3), dead->delivered (2)
    Delivery.objects.filter(pk__in=ids).update(status="delivered")
    assert delivered_by_consumer() == {a.pk: 7, b.pk: 2}
    # delivered->pending and delivered->delivered in one statement: nothing added
    Delivery.objects.filter(pk__in=ids).update(
        status=Case(When(pk__in=[d.pk for d in done], then=Value("pending")), default=Value("delivered"))
    )
    assert delivered_by_consumer() == {a.pk: 7, b.pk: 2}
    # back again: the 3 are counted a second time, as migration 0005 counted them
    Delivery.objects.filter(pk__in=ids).update(status="delivered")
    assert delivered_by_consumer() == {a.pk: 10, b.pk: 2}
    # a row touched without its status moving
    Delivery.objects.filter(pk__in=ids).update(last_error="x")
    assert delivered_by_consumer() == {a.pk: 10, b.pk: 2}


def test_mixed_registration_moves_keep_the_figures_equal_to_the_rows():
    regs = RegistrationFactory.create_batch(12)
    assert status_figures() == status_rows()
    statuses = ["pending", "submitted", "registered", "rejected"]
    for i, r in enumerate(regs):
        Registration.objects.filter(pk=r.pk).update(status=statuses[i % 4])
    assert status_figures() == status_rows()
    # one statement: a rotation of statuses, some rows to the same status
    Registration.objects.filter(pk__in=[r.pk for r in regs]).update(
        status=Case(
            When(status="pending", then=Value("submitted")),
            When(status="submitted", then=Value("pending")),
            When(status="registered", then=Value("registered")),
            default=Value("abandoned"),
        )
    )
    assert status_figures() == status_rows()
    Registration.objects.filter(pk__in=[r.pk for r in regs]).update(status="deactivated")
    assert status_figures() == status_rows()
    Registration.objects.update(last_error="") if hasattr(Registration, "last_error") else None
    assert status_figures() == status_rows()


def test_every_creation_path_through_the_api_keys_version_7(api_as):
    from odal.core.models import Passport
    from outbox.models import Event

    ConsumerFactory(name="billing", event_types=["passport.*"])
    ConsumerFactory(name="other", event_types=[])
    api = api_as("admin")
    one = api.post("dpp", {"upi": "https://id.example.eu/01/09506000134352/21/R-1", "operatorId": "OP-1"})
    assert one.status_code in (200, 201), one.content
    assert api.post(f"dpp/{one.json()['id']}/publish").status_code == 200
    bulk = api.post(
        "dpp/bulk",
        {"items": [{"upi": f"https://id.example.eu/01/09506000134352/21/R-B{n}", "operatorId": "OP-1"}
                   for n in range(5)], "publish": True},
    )  # fmt: skip
    assert bulk.status_code == 200, bulk.content
    ev = api.post("events", {"type": "order.made", "payload": {"x": 1}})
    assert ev.status_code == 201, ev.content
    keys = {
        "event": list(Event.objects.values_list("pk", flat=True)),
        "delivery": list(Delivery.objects.values_list("pk", flat=True)),
        "registration": list(Registration.objects.values_list("pk", flat=True)),
    }
    print({k: len(v) for k, v in keys.items()}, Passport.objects.count())
    assert all(keys.values())
    assert {k: {x.version for x in v} for k, v in keys.items()} == {k: {7} for k in keys}


# -- the hand-over ----------------------------------------------------------------------------------


def lock_holders() -> int:
    return advisory_lock_holders(SWEEP.lock)


class RelaySuccessor(threading.Thread):
    """What run_kicked_task does for relay=True, minus the passes: wait for the lock, once told to
    (`may_wait`: a real one runs a pass first); if that times out, close (and help with one pass,
    which cannot see a commit made after it)."""

    def __init__(self, wait_seconds):
        super().__init__(daemon=True)
        self.wait_seconds, self.led, self.gave_up_at = wait_seconds, None, None
        self.may_wait = threading.Event()  # its first pass is over: it may wait for the lock
        self.waited = threading.Event()  # its wait for the lock is over, led or not

    def run(self):
        try:
            with Listener.open() as listener:
                self.may_wait.wait(20)
                self.led = listener.wait_to_lead(self.wait_seconds)
                self.gave_up_at = time.monotonic()
        finally:
            self.waited.set()
            connections.close_all()


def test_a_leader_whose_successor_gave_up_inside_its_long_pass_takes_its_last_look(db, settings, monkeypatch):
    """The leader relays, its successor waits SUCCESSOR_WAIT_SECONDS for the lock while the leader is
    inside one long pass (slow webhooks: a pass lasts up to the consumers' timeouts), gives up and
    helps once. The leader's pass ends past HANDOVER_SECONDS: it unlocks and, having relayed,
    skips its last look. A row committed after the helper's pass and before the unlock found the
    lock held (no kick) and is left to the minute's schedule: nobody leads, nobody was woken."""
    settings.ODAL_KICK_SWEEP = True
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 2}
    monkeypatch.setattr(wake, "TURN_SECONDS", 0.2)
    monkeypatch.setattr(wake, "HANDOVER_SECONDS", 1.0)
    successors = []

    def relay_kick(func, name, **kwargs):
        successor = RelaySuccessor(wait_seconds=0.5)
        successors.append(successor)
        successor.start()
        return True

    woken = []
    monkeypatch.setattr(wake, "kick", relay_kick)
    monkeypatch.setattr(wake, "wake_up", lambda w: woken.append(w))

    def listening(listener, seconds, should_stop=lambda: False, lead=None):
        long_pass_done = False
        while not should_stop():
            if successors and not long_pass_done:
                # One pass of slow webhooks, longer than the successor's wait (to its end, however
                # late a loaded machine starts it) and than HANDOVER_SECONDS. The successor waits
                # from inside it: had it waited when the kick returned, hand_over would give it the lock.
                ends_at = time.monotonic() + 2.0
                successors[0].may_wait.set()
                successors[0].waited.wait(20)
                time.sleep(max(0.0, ends_at - time.monotonic()))
                long_pass_done = True
            else:
                time.sleep(0.02)
        return "listened"

    assert wake.run_kicked_task(
        SWEEP, relay=False, listening=listening, until_idle=lambda: "idle",
        owed=lambda: True, due=lambda: True,  # a row committed during the long pass is due
    ) == "listened"  # fmt: skip
    (successor,) = successors
    successor.join(10)
    assert successor.led is False  # it gave up inside the leader's pass
    assert lock_holders() == 0  # and nobody leads now
    assert woken, "a row is due, nobody leads, and the leader skipped its last look"


def test_a_turn_whose_listener_no_longer_leads_enqueues_no_relay(db, settings, monkeypatch):
    """A leader whose listener was lost and reopened while another task took the lock goes on as a
    non-leader until its turn ends; it relayed all the same, and its successor held a worker
    SUCCESSOR_WAIT_SECONDS waiting for the other leader's lock. Only a leader relays."""
    settings.ODAL_KICK_SWEEP = True
    monkeypatch.setattr(wake, "TURN_SECONDS", 0)
    kicks = []
    monkeypatch.setattr(wake, "kick", lambda func, name, **kw: kicks.append(kw) or True)
    with Listener.open() as other, Listener.open() as reopened:
        assert other.try_lead() and not reopened.try_lead()
        turn = wake.Turn(SWEEP, reopened, owed=lambda: True)
        turn()
        assert turn() is True
    assert kicks == [], f"a non-leader relayed: {kicks}"
