"""Python consumers' attempts: each on the process's runner thread, waited for no longer than
its consumer's timeoutSeconds, as a webhook's request is. A Python thread cannot be stopped, only
left to finish: an attempt past its timeout is reported as such (the sweep fails it), its runner
is left to finish it (what it returns is then handed to `late`), and the next attempt gets a new
runner. A consumer whose overrunning threads pile up (PYTHON_OVERRUNS_PER_CONSUMER) is taken no
more by this process until one returns (OVERRUNS), and both are counted in the tally for
/metrics; while it is held back the process says so at each pass (OVERRUNS.report)."""

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import close_old_connections, connections, transaction
from django.db.models import Q
from django.utils import timezone

from odal.core import tally
from odal.core.models import Heartbeat
from odal.core.reconnect import DatabaseLost

log = logging.getLogger(__name__)

PYTHON_OVERRUNS_PER_CONSUMER = 4  # threads of one Python consumer left running past its timeout
# before this process stops taking that consumer's rows (see Overruns)
PYTHON_TIMEOUTS = "outbox.python_timeouts"  # tally figures, key the consumer's id (see odal.core.tally)
PYTHON_BLOCKED = "outbox.python_blocked"
# A heartbeat role per consumer a process holds back now (Overruns.report): outbox.held:<its id>.
HELD_BACK = "outbox.held:"
REPORT_SECONDS = 1.0  # a process holding a consumer back says so again this often (its passes do)


class Overruns:
    """Threads of Python attempts that ran past their consumer's timeout and still run, per
    consumer, in this process (a Python thread cannot be stopped, only left to finish). With
    PYTHON_OVERRUNS_PER_CONSUMER of one consumer still running, this process takes none of its
    rows until one returns, so a consumer that hangs costs at most that many threads; other
    processes, and the rows of other consumers, go on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: dict[int, set] = {}
        self.reported: set = set()  # the consumers the database was last told this process holds back
        self.reported_at = float("-inf")  # (time.monotonic())

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
        full = self.held_back()
        return Q(consumer_id__in=sorted(full)) if full else None

    def held_back(self) -> set:
        """The consumers whose rows this process takes none of now."""
        with self.lock:
            return {
                pk for pk, running in self.threads.items() if len(running) >= PYTHON_OVERRUNS_PER_CONSUMER
            }

    def report(self) -> None:
        """Tell the database which consumers this process holds back (for /metrics: the web process
        cannot see this one's threads), on the sweep's thread after each pass: a heartbeat of role
        HELD_BACK + the consumer's id for this worker, written again every REPORT_SECONDS while it
        holds it back, deleted once it takes its rows again. No statement while it holds none back
        and said none. A process that dies holding one back stops writing its heartbeat, which
        /metrics then counts no more (outbox.metrics.python_overruns)."""
        held = self.held_back()
        now = time.monotonic()
        if held == self.reported and (not held or now - self.reported_at < REPORT_SECONDS):
            return
        worker, at = tally.worker_name(), timezone.now()
        with transaction.atomic():
            Heartbeat.objects.filter(worker=worker, role__startswith=HELD_BACK).exclude(
                role__in=[f"{HELD_BACK}{pk}" for pk in held]
            ).delete()
            Heartbeat.objects.bulk_create(
                [Heartbeat(role=f"{HELD_BACK}{pk}", worker=worker, at=at) for pk in sorted(held)],
                update_conflicts=True,
                unique_fields=["role", "worker"],
                update_fields=["at"],
            )
        self.reported, self.reported_at = held, now

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
    """This process's runner; with `replace` (one the watcher gave up on), a new one, and
    `replace` is stopped: it ends once the job it is in returns."""
    global RUNNER
    if replace is not None:
        replace.stop()
    with RUNNER_LOCK:
        if RUNNER is None or RUNNER is replace:
            RUNNER = PythonRunner()
        return RUNNER


@dataclass
class Jobs:
    """Python attempts for run_each, each `(consumer, row, future)`: `call(consumer, row)` runs
    within the consumer's timeoutSeconds (what it returns or raises is the future's); `skip(consumer)`,
    asked first and not timed, says not to call it (the future gets None); past the timeout the
    future gets `timed_out(consumer, row, started_at)` and what `call` returns later goes to
    `late(result)`. One set of functions for the list: nothing is made per attempt but its future."""

    items: list[tuple]
    call: Callable
    skip: Callable
    late: Callable
    timed_out: Callable


class Batch:
    """A list of jobs handed to a runner at once, run one after another from `start`: one hand-off
    a batch, not two thread switches an attempt (that halved the no-op sweep). The runner says
    which job runs and since when; the watcher (run_each's thread) sleeps until that job's
    timeout, not once per job. Whoever of the two takes the lock first decides a job at its
    timeout: the runner's result, or the watcher's giving up on it (then the runner hands what it
    returns to `late` and ends)."""

    def __init__(self, jobs: Jobs, start: int):
        self.jobs, self.start = jobs, start
        self.lock = threading.Lock()
        self.ended = threading.Event()  # the runner is through the list (or gave up on it)
        self.current: int | None = None  # the job being called, and since when (monotonic)
        self.since = 0.0
        self.next = start  # the first job the runner has not taken yet
        self.abandoned = False

    def run(self) -> None:
        """On the runner thread."""
        jobs, lock = self.jobs, self.lock
        try:
            for index in range(self.start, len(jobs.items)):
                consumer, row, future = jobs.items[index]
                with lock:
                    if self.abandoned:
                        return  # (the watcher gave the list to another runner: see watch)
                    self.next = index + 1
                if not future.set_running_or_notify_cancel():
                    continue  # the pass gave it back before its turn
                try:
                    if jobs.skip(consumer):
                        future.set_result(None)
                        continue
                    with lock:
                        self.current, self.since = index, time.monotonic()
                    result = jobs.call(consumer, row)
                except BaseException as exc:  # (a lost database: the pass's to unwind with)
                    if self.took():
                        future.set_exception(exc)
                        continue
                    log.error(
                        "Python consumer %s: an attempt given up on raised", consumer.name, exc_info=exc
                    )
                    OVERRUNS.done(consumer, threading.current_thread())
                    return
                if not self.took():
                    # Whatever the late write does, this thread no longer overruns: a lost database
                    # (a BaseException) must not leave it counted, or after PYTHON_OVERRUNS_PER_CONSUMER
                    # such blips this process would never take the consumer's rows again.
                    try:
                        jobs.late(result)
                    except Exception:
                        log.exception(
                            "Python consumer %s: a late outcome could not be written", consumer.name
                        )
                    except DatabaseLost as lost:  # (this runner ends here: nothing to unwind)
                        log.warning(
                            "Python consumer %s: a late outcome could not be written: the database "
                            "does not answer (%s)", consumer.name, lost, extra={"consumer": consumer.name},
                        )  # fmt: skip
                    finally:
                        OVERRUNS.done(consumer, threading.current_thread())
                    return
                future.set_result(result)
        finally:
            self.ended.set()

    def took(self) -> bool:
        """The runner's side of the race at a timeout: True if the job's end is still its own."""
        with self.lock:
            self.current = None
            return not self.abandoned

    def watch(self, runner: "PythonRunner") -> int:
        """On run_each's thread: wait for the runner to end the list, or for the job it runs to
        pass its consumer's timeout. Returns where the rest of the list starts (its length when
        done). A job that starts while it sleeps ends its timeout no sooner than the shortest
        timeout of the list from now, so it sleeps no longer than that. A runner that takes no
        job in all that time is stuck (it never started the list): the list goes to a new one."""
        items = self.jobs.items
        shortest = min(consumer.timeout_seconds for consumer, _, _ in items[self.start :])
        taken = self.next
        while True:
            with self.lock:
                current, since = self.current, self.since
            wait = shortest
            if current is not None:
                wait = min(wait, since + items[current][0].timeout_seconds - time.monotonic())
            if self.ended.wait(max(wait, 0)):
                return len(items)
            if current is None:
                with self.lock:
                    stuck = self.current is None and self.next == taken
                    taken = self.next
                    self.abandoned = self.abandoned or stuck
                if not stuck:
                    continue
                log.error("the Python runner took none of its %s attempts in %ss; a new runner takes them",
                          len(items) - taken, shortest)  # fmt: skip
                python_runner(replace=runner)
                return taken
            consumer, row, future = items[current]
            with self.lock:
                if self.current != current or self.since != since:
                    continue  # it returned meanwhile
                self.abandoned = True
                # (under the lock: the runner's done() comes after it)
                blocked = OVERRUNS.add(consumer, runner.thread)
            started_at = datetime.now(UTC) - timedelta(seconds=time.monotonic() - since)
            future.set_result(self.jobs.timed_out(consumer, row, started_at))
            python_runner(replace=runner)  # (it ends once that attempt returns; the rest get a new one)
            count_overrun(consumer, blocked)
            return current + 1


def run_each(jobs: Jobs) -> None:
    """Run `jobs` in order on the process's Python runner thread, each within its consumer's
    timeoutSeconds (see Jobs). A job past it is given up on: its runner is left to finish it
    (counted in OVERRUNS; what it returns goes to `late`), and the jobs after it go on on a new
    runner. Returns when every job's future has its result."""
    start = 0
    while start < len(jobs.items):
        runner = python_runner()
        batch = Batch(jobs, start)
        runner.jobs.put(batch.run)
        start = batch.watch(runner)


def count_overrun(consumer, blocked: bool) -> None:
    """Add a Python attempt past its timeout, and (`blocked`) this process stopping to take the
    consumer's rows, to the tally, so /metrics shows them: the web process that serves it
    cannot see this worker's threads. A tally that cannot be written is logged, never raised:
    the attempt's failure is still written by the pass."""
    key = str(consumer.pk)
    close_old_connections()  # (this is the watcher's thread: its connection, if a restart broke it)
    try:
        with transaction.atomic():
            tally.bump(PYTHON_TIMEOUTS, {key: 1})
            if blocked:
                tally.bump(PYTHON_BLOCKED, {key: 1})
    except Exception:
        log.exception("Python consumer %s: its timeout could not be counted", consumer.name,
                      extra={"consumer": consumer.name})  # fmt: skip
