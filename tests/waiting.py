"""Waiting in tests for something another thread or process does: on its condition, not a fixed
sleep, so a loaded machine only makes a test slower, never wrong."""

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
