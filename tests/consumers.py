"""Python consumers the tests point at (dotted paths)."""

import threading

calls: list = []
gate = threading.Event()


def accept(event, delivery_id):
    calls.append((event.type, str(delivery_id)))


def explode(event, delivery_id):
    raise ValueError("boom")
