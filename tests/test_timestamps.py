"""Timestamps are read with psycopg's own loader (odal.core.database.base): Django's parses each value
in Python, a few microseconds a row of every read. The answer must be Django's: the moment, in
UTC, tzinfo datetime.timezone.utc, for plain and server-side cursors alike."""

import datetime

import pytest
from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from psycopg.pq import Format

from odal.core.models import AuditEntry

pytestmark = pytest.mark.django_db

TIMESTAMPTZ = 1184


def test_the_connection_reads_timestamps_with_psycopgs_loader():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    loader = connection.connection.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)
    assert not issubclass(loader, BaseTzLoader), loader  # (Django's, in Python)
    assert loader.__name__ == "TimestamptzLoader"


def test_a_timestamp_is_the_moment_in_utc_as_django_reads_it():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT '2026-03-29 01:30:00.5+02'::timestamptz, '1999-12-31 23:59:59.999999-11:30'::timestamptz, "
            "NULL::timestamptz, now()"
        )
        summer, odd, none, now = cursor.fetchone()
    utc = datetime.UTC
    assert summer == datetime.datetime(2026, 3, 28, 23, 30, 0, 500000, tzinfo=utc)
    assert odd == datetime.datetime(2000, 1, 1, 11, 29, 59, 999999, tzinfo=utc)
    assert summer.tzinfo is utc and odd.tzinfo is utc and now.tzinfo is utc
    assert none is None


def test_a_server_side_cursor_reads_them_alike():
    for minute in range(5):
        AuditEntry.objects.create(
            at=datetime.datetime(2026, 1, 1, 0, minute, tzinfo=datetime.UTC), actor="cli", action="x"
        )
    with transaction.atomic():  # (QuerySet.iterator's named cursor, in chunks of 2)
        moments = [e.at for e in AuditEntry.objects.order_by("at").iterator(chunk_size=2)]
    assert [m.minute for m in moments] == list(range(5))
    assert all(m.tzinfo is datetime.UTC for m in moments)


def test_under_use_tz_false_a_cursor_reads_them_naive_as_djangos_does(settings):
    # (the review's: settings changed under an open connection, as tests do)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    settings.USE_TZ = False
    with connection.cursor() as cursor:
        cursor.execute("SELECT '2026-01-01 12:00+00'::timestamptz")
        (value,) = cursor.fetchone()
    assert value == datetime.datetime(2026, 1, 1, 12, 0) and value.tzinfo is None


def test_a_connection_made_again_under_other_settings_reads_as_they_say():
    from django.db import connections
    from django.test import override_settings

    other = connections.create_connection("default")
    try:
        other.ensure_connection()
        assert other.psycopg_timestamps
        other.close()
        with override_settings(USE_TZ=False):
            for cached in ("timezone", "timezone_name"):
                other.__dict__.pop(cached, None)
            other.ensure_connection()
            assert not other.psycopg_timestamps
        other.close()
        for cached in ("timezone", "timezone_name"):
            other.__dict__.pop(cached, None)
        other.ensure_connection()
        assert other.psycopg_timestamps
        with other.cursor() as cursor:
            cursor.execute("SELECT '2026-01-01 12:00+00'::timestamptz")
            (value,) = cursor.fetchone()
        assert value == datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
    finally:
        other.close()
