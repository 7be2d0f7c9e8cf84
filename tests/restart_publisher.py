"""Publishes passports one after another, for tests/test_db_restart.py, the way a web process
would: a write that fails because the database is gone is tried again (and found done if it
committed after all). Prints one line per publish that committed, "<passport id> <unix time>",
and stops on SIGTERM after the publish in hand.

Usage: python tests/restart_publisher.py PREFIX [--count N] [--every SECONDS]
(DATABASE_URL names the database; ODAL_KICK_SWEEP=0 publishes without waking anything.)
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")

import django  # noqa: E402

django.setup()

from django.db import DatabaseError, close_old_connections  # noqa: E402

from odal.core.models import Passport  # noqa: E402
from odal.surfaces import lifecycle  # noqa: E402


def publish(upi: str) -> str:
    while True:
        try:
            close_old_connections()  # a connection the database dropped is replaced
            passport, _ = Passport.objects.get_or_create(
                upi=upi, defaults={"operator_id": "OP-1", "facility_id": "FAC-1", "commodity_code": "8507 60"}
            )
            lifecycle.publish(passport.pk, actor="restart test")  # (publishing it again changes nothing)
            return str(passport.pk)
        except DatabaseError as exc:
            print(f"retrying {upi}: {type(exc).__name__}", file=sys.stderr, flush=True)
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("--count", type=int, default=0, help="stop after this many (0: until SIGTERM)")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between publishes")
    args = parser.parse_args()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    n = 0
    while not stop["now"] and (not args.count or n < args.count):
        n += 1
        pk = publish(f"https://id.example.eu/01/09506000134352/21/{args.prefix}-{n:05d}")
        print(pk, time.time(), flush=True)
        time.sleep(args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
