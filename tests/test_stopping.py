"""odal.core.stopping's first signal, as a signal handler meets it: in the main thread, between two
bytecodes of whatever that thread was doing, `ask` itself included (issue 37, item 8)."""

import itertools
import signal
import threading
import time

import pytest

from odal.core import stopping
from tests.waiting import wait_for


def installed_handler(monkeypatch, then=None):
    """The handler `on_signals` installs, caught instead of installed (the test's own process
    keeps its handlers)."""
    caught = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: caught.setdefault(signum, handler))
    stopping.on_signals(then)
    return caught[signal.SIGTERM]


@pytest.fixture
def ended(monkeypatch):
    """This process's stop state, as it was before any signal, put back after the test; what
    `end` was asked (it ends nothing). The clocks the test started are over before it ends: one
    left running logs its "stopping" into whichever test runs next, in this process."""
    monkeypatch.setattr(stopping, "_asked", itertools.count(), raising=False)
    monkeypatch.setattr(stopping, "_here", False, raising=False)
    monkeypatch.setattr(stopping, "_shared", None, raising=False)
    monkeypatch.setattr(stopping, "_deadline", None)
    monkeypatch.setattr(stopping, "_requested", threading.Event(), raising=False)  # (before issue 37)
    ended = []
    monkeypatch.setattr(stopping, "end", lambda signum, why: ended.append(why))
    yield ended
    stopping._deadline = time.monotonic() - 1  # run out: each clock ends (the `end` above), within 1 s
    for clock in [t for t in threading.enumerate() if t.name == "odal-stop-clock"]:
        clock.join(10)
        assert not clock.is_alive(), "a clock outlived its test"


def test_a_signal_landing_inside_ask_neither_deadlocks_nor_starts_a_second_clock(ended, monkeypatch, caplog):
    """`odal up` asks from its main thread when a child dies; SIGTERM may land while it is inside
    `ask`. The handler then runs on top of it, in the same thread. With a lock held there, the
    handler's own `ask` waited for it forever. Driven here by calling the handler from inside
    `ask` (from grace_seconds, which it calls), exactly where a signal may land."""
    passed_on = []
    handler = installed_handler(monkeypatch, then=passed_on.append)
    landed = []

    def grace_with_a_signal_landing():
        if not landed:
            landed.append(True)
            handler(signal.SIGTERM, None)  # the signal, landing here
        return 3600.0  # (the clock never ends this test's process)

    monkeypatch.setattr(stopping, "grace_seconds", grace_with_a_signal_landing)
    caplog.set_level("WARNING", logger="odal.core.stopping")
    asking = threading.Thread(target=stopping.ask, args=(signal.SIGTERM,), daemon=True)
    asking.start()
    asking.join(5)
    assert not asking.is_alive(), "ask deadlocked: the handler that landed inside it waited for its lock"
    assert landed and stopping.requested() and not ended
    assert 3590 < stopping.remaining() <= 3600
    assert passed_on == [signal.SIGTERM]  # the handler still passes the signal on (odal up's children)
    assert wait_for(lambda: "SIGTERM: stopping" in caplog.text, 5)
    clocks = [t for t in threading.enumerate() if t.name == "odal-stop-clock" and t.is_alive()]
    assert len(clocks) == 1, clocks  # one ask counted: one clock
    assert caplog.text.count("SIGTERM: stopping") == 1


def test_a_second_signal_after_the_first_ends_the_process_at_once(ended, monkeypatch):
    monkeypatch.setattr(stopping, "grace_seconds", lambda: 3600.0)
    handler = installed_handler(monkeypatch)
    handler(signal.SIGTERM, None)
    assert stopping.requested() and not ended
    handler(signal.SIGINT, None)
    assert ended == ["a second signal came"]
