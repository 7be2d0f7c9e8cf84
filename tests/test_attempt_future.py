"""odal.work.passes.AttemptFuture answers as concurrent.futures.Future does, for every move a pass
and the Python runner make (it is Future without a Condition per attempt)."""

from concurrent.futures import CancelledError, Future, InvalidStateError

import pytest

from odal.work.passes import AttemptFuture, Pass

MOVES = {
    "start, result": ["start", ("set_result", 7)],
    "start, exception": ["start", ("set_exception", KeyError("k"))],
    "cancel, then the runner starts it": ["cancel", "start"],
    "start, then the pass cancels it": ["start", "cancel"],
    "cancel twice": ["cancel", "cancel"],
    "result without start (skipped)": [("set_result", None)],
    "result twice": ["start", ("set_result", 1), ("set_result", 2)],
    "result after cancel": ["cancel", ("set_result", 1)],
    "exception after result": ["start", ("set_result", 1), ("set_exception", KeyError("k"))],
    "start twice": ["start", "start"],
    "cancel after result": ["start", ("set_result", 1), "cancel"],
}


def play(future, moves) -> list:
    """What each move answers or raises, what the callbacks saw, and the ended future's state."""
    seen = []
    future.add_done_callback(lambda f: seen.append("early"))
    answers = []
    for move in moves:
        name, *args = move if isinstance(move, tuple) else (move,)
        call = {"start": future.set_running_or_notify_cancel}.get(name) or getattr(future, name)
        try:
            answers.append(("=", call(*args)))
        except (InvalidStateError, RuntimeError) as exc:
            answers.append(("raised", type(exc).__name__))
    if future.done():
        future.add_done_callback(lambda f: seen.append("late"))  # (called at once)
        try:
            outcome = ("result", future.result())
        except CancelledError:
            outcome = ("cancelled",)
        except KeyError as exc:
            outcome = ("exception", str(exc))
    else:
        outcome = ("not done",)
    return [answers, seen, outcome, future.done(), future.cancelled()]


@pytest.mark.parametrize("moves", MOVES.values(), ids=MOVES.keys())
def test_an_attempt_future_moves_as_a_future_does(moves):
    assert play(AttemptFuture(), moves) == play(Future(), moves)


def test_its_result_is_asked_only_once_it_ended():
    # (Future's would block: nothing waits on an attempt's future, the pass asks it once ended)
    future = AttemptFuture()
    future.set_running_or_notify_cancel()
    with pytest.raises(InvalidStateError):
        future.result()


def test_a_callback_that_raises_is_logged_as_futures_is(caplog):
    # (the review's: added after the end, it ran outside the try)
    def boom(f):
        raise ValueError("callback")

    for future in (Future(), AttemptFuture()):
        future.add_done_callback(boom)  # (before the end)
        future.set_running_or_notify_cancel()
        future.set_result(1)
        future.add_done_callback(boom)  # (after: called at once)
        assert future.result() == 1


class Quiet(Pass):
    """A pass that only tracks futures (the bell's tests)."""

    flush_rows, flush_seconds, look_seconds, not_started_line = 3, 60.0, 60.0, "%s"

    def start_more(self):
        pass

    def ended(self, row, job, result):
        pass

    def write(self, items):
        pass


def end(future) -> None:
    future.set_running_or_notify_cancel()
    future.set_result(None)


def test_quiet_attempts_wake_the_pass_once_all_have_ended_or_a_flush_is_due():
    """Attempts a runner of their own starts (the webhooks' loop) ring the pass's bell only when
    every one of them has ended or flush_rows have: not once per attempt."""
    passing = Quiet(claim=None, report=None)
    futures = [AttemptFuture() for _ in range(5)]
    for row, future in enumerate(futures):
        passing.track(future, row, quiet=True)
    end(futures[0]), end(futures[1])
    assert not passing.bell.is_set()  # 2 ended, 3 to go: nothing to write yet
    end(futures[2])
    assert passing.bell.is_set()  # flush_rows ended
    assert passing.wait_ended(0) == futures[:3] and not passing.bell.is_set()
    end(futures[3])
    assert not passing.bell.is_set()
    end(futures[4])
    assert passing.bell.is_set()  # the last one
    assert passing.wait_ended(0) == futures[3:]


def test_an_attempt_tracked_aloud_wakes_the_pass_as_it_ends():
    passing = Quiet(claim=None, report=None)
    quiet, aloud = AttemptFuture(), AttemptFuture()
    passing.track(quiet, 0, quiet=True)
    passing.track(aloud, 1)
    end(aloud)
    assert passing.bell.is_set() and passing.wait_ended(0) == [aloud]
    assert passing.wait_ended(0.01) == []  # (nothing rang: waited its time)
