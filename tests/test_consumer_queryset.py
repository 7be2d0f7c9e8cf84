"""Every consumer state change is one guarded write on ConsumerQuerySet (issue 25): each test
here takes a row once, then shows the write taking nothing (and changing nothing) once what its
filter states no longer holds. Also the one selection of a replay or resend by filter
(DeliveryQuerySet.matching), filter by filter."""

from datetime import timedelta

import pytest
from django.utils import timezone

from odal.core.errors import Refused
from odal.core.models import AuditEntry
from outbox import service
from outbox.models import Consumer, Delivery
from tests.factories import ConsumerFactory, DeadDeliveryFactory, DeliveryFactory, EventFactory

pytestmark = pytest.mark.django_db

ALLOWED = ("tests.consumers.*",)


def one(consumer):
    return Consumer.objects.filter(pk=consumer.pk)


def row(consumer) -> Consumer:
    return Consumer.objects.get(pk=consumer.pk)


# -- pause and resume -----------------------------------------------------------------------------


def test_a_second_pause_takes_nothing_and_keeps_the_first_ones_who_and_why():
    consumer = ConsumerFactory()
    at = timezone.now()
    assert one(consumer).pause(by="alice", reason="maintenance", at=at)
    assert not one(consumer).pause(by="bob", reason="other", at=at + timedelta(minutes=1))
    paused = row(consumer)
    assert (paused.paused, paused.paused_by, paused.paused_reason, paused.paused_at) == (
        True,
        "alice",
        "maintenance",
        at,
    )
    assert paused.version == consumer.version + 1


def test_resume_takes_only_a_paused_consumer_and_starts_its_streak_afresh():
    consumer = ConsumerFactory()
    assert not one(consumer).resume(allowed=ALLOWED)
    assert row(consumer).version == consumer.version  # nothing written
    one(consumer).pause(by="alice", reason="maintenance", at=timezone.now())
    one(consumer).update(failing_since=timezone.now(), failures=4)
    assert one(consumer).resume(allowed=ALLOWED)
    resumed = row(consumer)
    assert (resumed.paused, resumed.paused_by, resumed.failing_since, resumed.failures) == (
        False,
        "",
        None,
        0,
    )


def test_resume_never_takes_a_python_consumer_the_allow_list_does_not_name():
    consumer = ConsumerFactory(target="elsewhere.run")
    one(consumer).pause(by="odal", reason="outside the list", at=timezone.now())
    assert not one(consumer).resume(allowed=ALLOWED)
    assert row(consumer).paused


# -- the failure streak and the automatic pause ---------------------------------------------------


def test_ending_a_streak_takes_only_a_running_one():
    consumer = ConsumerFactory()
    assert not one(consumer).end_failure_streak()
    one(consumer).update(failing_since=timezone.now(), failures=3)
    assert one(consumer).end_failure_streak()
    assert (row(consumer).failing_since, row(consumer).failures) == (None, 0)


def test_a_streak_counts_relatively_and_keeps_its_earliest_start():
    """Two sweeps counting at once from the same reading: both counts land, the first start stays."""
    consumer = ConsumerFactory()
    first = timezone.now() - timedelta(hours=1)
    assert one(consumer).extend_failure_streak(failures=3, first_failure_at=first)
    assert one(consumer).extend_failure_streak(failures=2, first_failure_at=first + timedelta(minutes=5))
    assert (row(consumer).failing_since, row(consumer).failures) == (first, 5)


@pytest.mark.parametrize(
    "paused, hours, failures, takes",
    [
        (False, 25, 10, True),
        (True, 25, 10, False),  # paused already (by a person): their who and why stay
        (False, 23, 10, False),  # a streak younger than `after`
        (False, 25, 9, False),  # too few failed attempts
    ],
)
def test_the_automatic_pause_takes_only_a_long_streak_of_a_consumer_not_paused(
    paused, hours, failures, takes
):
    consumer = ConsumerFactory()
    now = timezone.now()
    if paused:
        one(consumer).pause(by="alice", reason="maintenance", at=now)
    one(consumer).update(failing_since=now - timedelta(hours=hours), failures=failures)
    took = one(consumer).auto_pause(
        reason="failing", at=now, after=timedelta(hours=24), min_failures=10, by="odal"
    )
    assert took is takes
    after = row(consumer)
    assert after.paused is (paused or takes)
    assert after.paused_by == ("odal" if takes else "alice" if paused else "")


# -- the allow-list pause ------------------------------------------------------------------------


def test_the_allow_list_pause_takes_only_python_consumers_outside_it_not_paused_yet():
    outside = ConsumerFactory(target="elsewhere.run")
    inside = ConsumerFactory(target="tests.consumers.accept")
    held = ConsumerFactory(target="elsewhere.other")
    one(held).pause(by="alice", reason="maintenance", at=timezone.now())
    taken = Consumer.objects.pause_outside(ALLOWED, by="odal", reason="not allowed", now=timezone.now())
    assert taken == {outside.pk: "elsewhere.run"}
    assert (row(outside).paused, row(inside).paused, row(held).paused_by) == (True, False, "alice")


# -- settings, rotation -----------------------------------------------------------------------------


def test_a_change_from_a_stale_version_takes_nothing():
    consumer = ConsumerFactory(timeout_seconds=2)
    assert one(consumer).change_settings(version=consumer.version, timeout_seconds=5)
    assert not one(consumer).change_settings(version=consumer.version, timeout_seconds=9)
    assert (row(consumer).timeout_seconds, row(consumer).version) == (5, consumer.version + 1)


def test_a_rotation_from_a_stale_secret_takes_nothing():
    consumer = ConsumerFactory()
    now = timezone.now()
    assert one(consumer).rotate_secret(secret=consumer.secret, new="whsec_b", grace_until=None, now=now)
    assert not one(consumer).rotate_secret(secret=consumer.secret, new="whsec_c", grace_until=None, now=now)
    assert row(consumer).secret == "whsec_b"


# -- removal ----------------------------------------------------------------------------------------


def test_removal_takes_only_a_consumer_without_deliveries():
    consumer = ConsumerFactory()
    delivery = DeliveryFactory(consumer=consumer, status=Delivery.Status.DELIVERED)
    assert not one(consumer).remove()  # refused by its filter, not by the foreign key's protection
    assert Consumer.objects.filter(pk=consumer.pk).exists()
    delivery.delete()
    assert one(consumer).remove()
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    assert not one(consumer).remove()  # gone already: nothing to take


def test_a_removal_of_a_consumer_removed_meanwhile_is_refused_and_not_audited():
    """Two removals from the same reading: the second takes no row, so it leaves no audit entry
    (it used to record a second `consumer_removed`)."""
    consumer = ConsumerFactory(name="erp")
    service.remove_consumer(Consumer.objects.get(pk=consumer.pk), actor="alice", reason="gone")
    with pytest.raises(Refused) as refused:
        service.remove_consumer(consumer, actor="bob", reason="gone too")
    assert (refused.value.code, refused.value.status) == ("not_found", 404)
    assert list(AuditEntry.objects.filter(action="consumer_removed").values_list("actor", flat=True)) == [
        "alice"
    ]


# -- one selection for replay and resend ------------------------------------------------------------


@pytest.fixture
def spread():
    """Deliveries that differ in one respect each from `base` (dead, of erp, passport.published,
    dead and created a day ago)."""
    now = timezone.now()
    erp, crm = ConsumerFactory(name="erp"), ConsumerFactory(name="crm")
    day_ago = now - timedelta(days=1)

    def dead(**fields):
        fields = {"consumer": erp, "created_at": day_ago, "dead_at": day_ago, **fields}
        return DeadDeliveryFactory(**fields)

    return {
        "now": now,
        "base": dead(),
        "delivered": dead(status=Delivery.Status.DELIVERED, dead_at=None, delivered_at=day_ago),
        "crm": dead(consumer=crm),
        "other_type": dead(event=EventFactory(type="passport.suspended")),
        "dead_long_ago": dead(dead_at=now - timedelta(days=10)),
        "made_long_ago": dead(created_at=now - timedelta(days=10)),
        "made_now": dead(created_at=now),
    }


def picked(rows) -> set:
    return set(rows.values_list("pk", flat=True))


@pytest.mark.parametrize(
    "filters, left_out",
    [
        ({"statuses": ("dead",)}, {"delivered"}),
        ({"consumer": "erp"}, {"crm"}),
        ({"event_type": "passport.published"}, {"other_type"}),
        ({"dead_since": "2 days"}, {"dead_long_ago", "delivered"}),
        ({"since": "2 days"}, {"made_long_ago"}),
        ({"until": "1 hour"}, {"made_now"}),
    ],
)
def test_a_replay_or_resend_selects_by_each_filter(spread, filters, left_out):
    ago = {"2 days": timedelta(days=2), "1 hour": timedelta(hours=1)}
    filters = {k: spread["now"] - ago[v] if v in ago else v for k, v in filters.items()}
    rows = {name: d for name, d in spread.items() if name != "now"}
    assert picked(Delivery.objects.matching()) == {d.pk for d in rows.values()}
    assert picked(Delivery.objects.matching(**filters)) == {
        d.pk for n, d in rows.items() if n not in left_out
    }


def test_a_replay_or_resend_refuses_a_consumer_that_does_not_exist():
    DeadDeliveryFactory()
    with pytest.raises(Refused) as refused:
        Delivery.objects.matching(consumer="nobody")
    assert refused.value.code == "unknown_consumer"
