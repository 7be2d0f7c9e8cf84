"""Run many `odal` command lines, each in a process of its own, for the price of one Python start.

`python -m tests.odal_forks [timeout]` reads a JSON list of argument lists on stdin and writes a JSON list
of [exit code, stdout, stderr] (exit code null: killed after the timeout) in the same order. It
sets Django up once, as `python -m odal` does with the environment it was started with, then forks
one child per command line; the child runs odal's `__main__` as `python -m odal <args>` would
and exits as the interpreter does (an uncaught exception prints its traceback and exits 1,
SystemExit's code is the exit code, non-daemon threads are waited for, atexit runs). A fresh
`python -m odal` costs half a second of CPU before it reads its arguments, nearly all of it
importing Django, django-ninja and odal: tests/test_cli_malformed.py runs some sixty of them.

Every command line of one run shares the environment, so the Django that was set up before the
fork is the one each child would have set up itself. Commands that need other settings start
their own `python -m odal`.
"""

import json
import os
import signal
import sys
import tempfile
import time

PARALLEL = 4  # children at once


def child(args: list[str], out: int, err: int) -> None:
    """In the forked child: become `python -m odal *args`, then exit as Python would."""
    import atexit
    import runpy
    import threading

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    code = 0
    try:
        sys.argv = ["-m", *args]  # run_module puts odal/__main__.py first, as -m does
        runpy.run_module("odal", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with it
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def run_all(commands: list[list[str]], timeout: float) -> list[list]:
    results: list = [None] * len(commands)
    waiting = list(enumerate(commands))
    running: dict[int, tuple] = {}  # pid -> (index, stdout file, stderr file, deadline)
    killed: set[int] = set()
    while waiting or running:
        while waiting and len(running) < PARALLEL:
            index, args = waiting.pop(0)
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - closed once read
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(args, out.fileno(), err.fileno())
            running[pid] = (index, out, err, time.monotonic() + timeout)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for pid, (_index, _out, _err, deadline) in list(running.items()):
                if time.monotonic() > deadline and pid not in killed:
                    os.kill(pid, signal.SIGKILL)  # as subprocess.run's timeout does
                    killed.add(pid)
            time.sleep(0.005)
            continue
        index, out, err, _deadline = running.pop(pid)
        out.seek(0)
        err.seek(0)
        said = [out.read().decode(errors="replace"), err.read().decode(errors="replace")]
        out.close()
        err.close()
        results[index] = [None if pid in killed else os.waitstatus_to_exitcode(status), *said]
    return results


def main() -> None:
    commands = json.load(sys.stdin)
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")  # as odal's main() does
    import django

    django.setup()
    results = run_all(commands, timeout)
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
