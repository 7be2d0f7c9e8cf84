"""Time-ordered keys (odal.core.ids): version 7, the milliseconds first, made alike in Python and by
PostgreSQL, and used for the queue tables' rows however they are written."""

import time
import uuid

import pytest
from django.db import connection

from odal.core.ids import UUID7_SQL, uuid7
from outbox.events import emit, emit_many
from outbox.models import Delivery, Event
from registry.models import Registration
from tests.factories import ConsumerFactory, RegistrationFactory

pytestmark = pytest.mark.django_db


def milliseconds(key: uuid.UUID) -> int:
    return key.int >> 80


# The 74 random bits: after the time and the version (bits 64–75), and after the variant (0–61).
RANDOM_BITS = [*range(62), *range(64, 76)]


def every_random_bit_varies(keys: list[uuid.UUID]) -> bool:
    """Not one random bit is the same in every key (of 500: a chance of 74 / 2^499 of failing)."""
    return all(len({(k.int >> bit) & 1 for k in keys}) == 2 for bit in RANDOM_BITS)


def test_a_key_is_version_7_of_rfc_9562_and_starts_with_the_time():
    before = time.time_ns() // 1_000_000
    keys = [uuid7() for _ in range(1000)]
    after = time.time_ns() // 1_000_000
    assert {k.version for k in keys} == {7}
    assert {k.variant for k in keys} == {uuid.RFC_4122}
    assert all(before <= milliseconds(k) <= after for k in keys)
    assert len(set(keys)) == 1000
    assert every_random_bit_varies(keys)


def test_keys_made_a_millisecond_apart_sort_in_the_order_they_were_made():
    first = uuid7()
    made_at = time.time_ns() // 1_000_000
    assert made_at - 1 <= milliseconds(first) <= made_at
    while time.time_ns() // 1_000_000 <= made_at:
        time.sleep(0.0005)
    later = [uuid7() for _ in range(100)]
    assert all(key > first for key in later)
    assert all(str(key) > str(first) for key in later)  # as text too (the admin's and the API's order)


def test_the_database_has_the_function_odal_ids_defines():
    """A change to UUID7_SQL needs a migration that installs it: the function migrated is this one."""
    body = UUID7_SQL.split("$$")[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'odal_uuid7'")
        assert cursor.fetchall() == [(body,)]


def test_postgresql_makes_the_same_keys():
    with connection.cursor() as cursor:
        cursor.execute(UUID7_SQL)  # (this text, in the test's transaction: the one above is migrated)
        cursor.execute(
            "SELECT odal_uuid7(), (extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM generate_series(1, 500)"
        )
        rows = cursor.fetchall()
    keys = [uuid.UUID(str(k)) for k, _ in rows]
    assert {k.version for k in keys} == {7}
    assert {k.variant for k in keys} == {uuid.RFC_4122}
    assert all(abs(milliseconds(k) - at) <= 1 for k, (_, at) in zip(keys, rows, strict=True))
    assert len(set(keys)) == 500
    assert every_random_bit_varies(keys)


def test_events_deliveries_and_registrations_are_keyed_by_time_however_written():
    ConsumerFactory(event_types=[])
    ConsumerFactory(event_types=[])
    before = time.time_ns() // 1_000_000
    emit("passport.published", {"n": 1})  # one event, its deliveries by bulk_create
    emit_many("passport.published", [{"n": n} for n in range(5)])  # insert_rows: server-made keys
    RegistrationFactory()
    after = time.time_ns() // 1_000_000
    keys = [*Event.objects.values_list("pk", flat=True), *Delivery.objects.values_list("pk", flat=True)]
    keys += Registration.objects.values_list("pk", flat=True)
    assert len(keys) == 6 + 12 + 1
    assert {k.version for k in keys} == {7}
    assert all(before - 1 <= milliseconds(k) <= after + 1 for k in keys)
