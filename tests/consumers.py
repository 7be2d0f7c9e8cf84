"""Python consumers the tests point at (dotted paths)."""

import threading
import time

calls: list = []
gate = threading.Event()


def accept(event, delivery_id):
    calls.append((event.type, str(delivery_id)))


def explode(event, delivery_id):
    raise ValueError("boom")


def reads_the_database(event, delivery_id):
    """Reads its delivery through this thread's own database connection."""
    from outbox.models import Delivery

    calls.append(Delivery.objects.filter(pk=delivery_id).values_list("pk", flat=True).get())


def slow(event, delivery_id):
    time.sleep(1.2)
    calls.append((event.type, str(delivery_id)))


def waits_for_a_delivered_webhook(event, delivery_id):
    """Waits up to 3 s for the sweep to have written a webhook delivery as delivered (through
    this thread's own database connection) and records whether it saw one."""
    from outbox.models import Delivery

    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if Delivery.objects.filter(consumer__kind="webhook", status="delivered").exists():
            calls.append("saw the webhook delivered")
            return
        time.sleep(0.05)
    calls.append("webhook outcome not written yet")


def blocks(event, delivery_id):
    """Waits for the test to open `gate` (at most 10 s, so a sweep that waits for it still ends)."""
    opened = gate.wait(10)
    calls.append("returned" if opened else "gate never opened")
    return "late answer"
