"""Python consumers' attempts: each on the process's runner thread, waited for no longer than
its consumer's timeoutSeconds, as a webhook's request is. A Python thread cannot be stopped, only
left to finish: an attempt past its timeout is reported as such (the sweep fails it), its runner
is left to finish it (what it returns is then handed to `late`), and the next attempt gets a new
runner. A consumer whose overrunning threads pile up (PYTHON_OVERRUNS_PER_CONSUMER) is taken no
more by this process until one returns (OVERRUNS), and both are counted in the tally for
/metrics."""

import logging
import queue
import threading

from django.db import close_old_connections, connections, transaction
from django.db.models import Q

from odal import tally

log = logging.getLogger(__name__)

PYTHON_OVERRUNS_PER_CONSUMER = 4  # threads of one Python consumer left running past its timeout
# before this process stops taking that consumer's rows (see Overruns)
PYTHON_TIMEOUTS = "outbox.python_timeouts"  # tally figures, key the consumer's id (see odal.tally)
PYTHON_BLOCKED = "outbox.python_blocked"
TIMED_OUT = object()  # within_timeout's answer for an attempt still running at its timeout


class Overruns:
    """Threads of Python attempts that ran past their consumer's timeout and still run, per
    consumer, in this process (a Python thread cannot be stopped, only left to finish). With
    PYTHON_OVERRUNS_PER_CONSUMER of one consumer still running, this process takes none of its
    rows until one returns, so a consumer that hangs costs at most that many threads; other
    processes, and the rows of other consumers, go on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: dict[int, set] = {}

    def add(self, consumer, thread: threading.Thread) -> bool:
        """Count one more overrunning thread; True if that one made the consumer's threads reach
        the bound (the caller counts it in outbox.python_blocked, outside this lock)."""
        with self.lock:
            running = self.threads.setdefault(consumer.pk, set())
            running.add(thread)
            if len(running) != PYTHON_OVERRUNS_PER_CONSUMER:
                return False
            log.error(
                "Python consumer %s: %s attempts still running past its timeout of %ss; this process "
                "takes none of its deliveries until one returns",
                consumer.name, len(running), consumer.timeout_seconds, extra={"consumer": consumer.name},
            )  # fmt: skip
            return True

    def done(self, consumer, thread: threading.Thread) -> None:
        with self.lock:
            running = self.threads.get(consumer.pk, set())
            running.discard(thread)
            if len(running) == PYTHON_OVERRUNS_PER_CONSUMER - 1:
                log.warning(
                    "Python consumer %s: an overrunning attempt returned; this process takes its deliveries again",
                    consumer.name, extra={"consumer": consumer.name},
                )  # fmt: skip
            if not running:
                self.threads.pop(consumer.pk, None)

    def full(self, consumer_id: int) -> bool:
        with self.lock:
            return len(self.threads.get(consumer_id, ())) >= PYTHON_OVERRUNS_PER_CONSUMER

    def skip(self) -> Q | None:
        """The rows this process must not claim: those of consumers whose threads piled up."""
        with self.lock:
            full = [
                pk for pk, running in self.threads.items() if len(running) >= PYTHON_OVERRUNS_PER_CONSUMER
            ]
        return Q(consumer_id__in=full) if full else None

    def join(self, timeout: float | None = None) -> None:
        """Wait for the overrunning threads to return (for tests)."""
        with self.lock:
            threads = [t for running in self.threads.values() for t in running]
        for thread in threads:
            thread.join(timeout)


OVERRUNS = Overruns()


class PythonRunner:
    """The thread Python attempts run on, kept from one attempt to the next: a thread (and its
    database wrappers) made and ended per attempt halved the no-op sweep's throughput. One whose
    attempt overran is left to finish it and then ends (stop); the next attempt gets a new one."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.loop, name="odal-python-runner", daemon=True)
        self.thread.start()

    def loop(self) -> None:
        try:
            while (job := self.jobs.get()) is not None:
                try:
                    close_old_connections()  # its connection, if a consumer opened one and it broke
                    job()
                except Exception:  # (a job says what it raised; this thread must go on)
                    log.exception("a Python attempt's runner failed")
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.jobs.put(None)


RUNNER_LOCK = threading.Lock()
RUNNER: PythonRunner | None = None


def python_runner(*, replace: PythonRunner | None = None) -> PythonRunner:
    """This process's runner; with `replace` (one whose attempt overran), a new one."""
    global RUNNER
    with RUNNER_LOCK:
        if RUNNER is None or RUNNER is replace:
            RUNNER = PythonRunner()
        return RUNNER


def within_timeout(consumer, call, *, late):
    """`call()` on the process's Python runner thread, waited for up to the consumer's
    timeoutSeconds: its result, or TIMED_OUT (then its runner is left to finish it, counted in
    OVERRUNS, and `late(result)` is called with what it returns). What `call` raises is raised
    here (a lost database: the pass's to unwind with, not the runner's)."""
    box: dict = {}
    lock = threading.Lock()
    done = threading.Event()
    runner = python_runner()

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:
            box["raised"] = exc
            return
        finally:
            done.set()
        with lock:
            box["result"], abandoned = result, box.get("abandoned", False)
        if abandoned:
            try:
                late(result)
            except Exception:
                log.exception("Python consumer %s: a late outcome could not be written", consumer.name)
            OVERRUNS.done(consumer, runner.thread)

    runner.jobs.put(run)
    done.wait(consumer.timeout_seconds)
    with lock:
        if "raised" in box:
            raise box["raised"]
        if "result" in box:
            return box["result"]
        box["abandoned"] = True
        blocked = OVERRUNS.add(
            consumer, runner.thread
        )  # (under the lock: the thread's done() comes after it)
    runner.stop()  # once its attempt returns; the next attempt gets a new runner
    python_runner(replace=runner)
    count_overrun(consumer, blocked)
    return TIMED_OUT


PYTHON_TIMEOUTS = "outbox.python_timeouts"  # tally figures, key the consumer's id (see odal.tally)
PYTHON_BLOCKED = "outbox.python_blocked"


def count_overrun(consumer, blocked: bool) -> None:
    """Add a Python attempt past its timeout, and (`blocked`) this process stopping to take the
    consumer's rows, to the tally, so /metrics shows them: the web process that serves it
    cannot see this worker's threads. A tally that cannot be written is logged, never raised:
    the attempt's failure is still written by the pass."""
    key = str(consumer.pk)
    try:
        with transaction.atomic():
            tally.bump(PYTHON_TIMEOUTS, {key: 1})
            if blocked:
                tally.bump(PYTHON_BLOCKED, {key: 1})
    except Exception:
        log.exception("Python consumer %s: its timeout could not be counted", consumer.name,
                      extra={"consumer": consumer.name})  # fmt: skip
