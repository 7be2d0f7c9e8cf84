"""The housekeeping services (odal.work.services): each runs when due, in its order."""

import pytest

from odal.work import services
from odal.work.services import Due, Service
from outbox import housekeeping


def test_a_run_of_passes_parks_on_its_first_pass_then_about_once_a_second(monkeypatch):
    ran = []
    chores = Due((Service("park", housekeeping.HOUSEKEEPING_SECONDS, lambda: ran.append(1) or 0),))
    clock = iter([100.0, 100.2, 100.9, 101.1, 101.5])
    monkeypatch.setattr(services.time, "monotonic", lambda: next(clock))
    assert [bool(chores.run()) for _ in range(5)] == [True, False, False, True, False]
    assert len(ran) == 2


def test_a_service_that_raised_is_due_again_at_once_and_the_others_wait_their_turn():
    calls = []

    def lost():
        calls.append("lost")
        if calls.count("lost") == 1:
            raise ConnectionError("the database went away")
        return 0

    chores = Due((Service("first", 60, lambda: calls.append("first") or 1), Service("lost", 60, lost)))
    with pytest.raises(ConnectionError):
        chores.run()
    assert not chores.begun  # a run's next pass runs it before its claim again
    assert chores.run() == {"lost": 0} and chores.begun
    assert calls == ["first", "lost", "lost"]
