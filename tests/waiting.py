"""Waiting in tests for something another thread or process does: on its condition, not a fixed
sleep, so a loaded machine only makes a test slower, never wrong."""

import threading
import time


def wait_for(condition, seconds: float) -> bool:
    """Whether `condition()` became true within `seconds` (checked every 20 ms, and once more at
    the end)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def sweeping() -> tuple[threading.Thread, dict]:
    """outbox.sweep.sweep_once on a thread of its own (its database connections closed after),
    started: the thread, and a dict whose "report" it sets when the pass ends."""
    from django.db import connections

    from outbox.sweep import sweep_once

    box = {}

    def sweep():
        try:
            box["report"] = sweep_once()
        finally:
            connections.close_all()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    return sweeper, box


def advisory_lock_holders(key: int) -> int:
    """How many sessions hold the advisory lock `key` (pg_advisory_lock's bigint form) now, in
    this database: the other test workers (pytest-xdist), each in a database of its own on the
    same server, take the same keys."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s "
            "AND l.objsubid = 1 AND d.datname = current_database()",
            [(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0]
