"""The `odal` console script: Django's command line with odal's settings."""

import importlib
import os
import signal
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")
    import django
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:  # the settings read the environment: a bad or missing variable is its sentence, not a traceback
        importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
        django.setup()  # (production's refusals of Django's deploy checks come as the apps are ready)
    except ImproperlyConfigured as exc:
        sys.exit(f"odal cannot start: {exc}")
    # odal's modules are imported here, not above: after the settings, which they read
    from odal.core import database, reconnect

    if needs_the_database(sys.argv):
        start_the_embedded_database()
    if sys.argv[1:2] == ["migrate"]:
        database.role = database.UNBOUNDED  # a migration may rewrite a big table; an operator watches it
    try:
        if starts_the_cluster(sys.argv):
            if not database_answers("odal qcluster"):
                return  # told to stop while it waited
            stop_the_cluster_in_time()
        execute_from_command_line(sys.argv)
        sys.stdout.flush()  # (here, not at exit: a reader that went is a BrokenPipeError below)
    except reconnect.ERRORS as exc:  # a database that is down or went: its sentence, exit 4
        if reconnect.is_lost(exc):
            print(f"odal: {reconnect.unanswered(exc)}", file=sys.stderr)
            sys.exit(DATABASE_UNANSWERED)
        if table := not_migrated(exc):
            sys.exit(f"odal: the database has no table {table} yet: run `odal migrate` first.")
        raise
    except BrokenPipeError:  # (`odal token list | head -1`: the reader went; nobody reads more)
        # As Python's documentation does it: the rest of the output, flushed at exit, goes nowhere
        # (else it would raise again, as "Exception ignored"), and the exit says it did not finish.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def needs_the_database(argv: list[str]) -> bool:
    """A command, not a request for help."""
    return (
        bool(argv[1:])
        and argv[1] not in ("help", "version")
        and not {"-h", "--help", "--version"} & set(argv[2:])
    )


def start_the_embedded_database() -> None:
    """DATABASE_URL unset: the embedded PostgreSQL under var/pg runs (started here unless it
    answers already); a one-shot command leaves it running, `odal up` stops it as it stops."""
    from django.conf import settings

    from odal.core.database import embedded  # (as it runs: the console script loads before the settings)

    if settings.ODAL_EMBEDDED_DATABASE is None:
        return
    server = embedded.Server(settings.ODAL_EMBEDDED_DATABASE)
    try:
        if server.start():
            print(
                f"odal: started the embedded PostgreSQL in {server.root} (DATABASE_URL is unset); "
                "`odal up` stops it when it stops",
                file=sys.stderr,
            )
    except embedded.EmbeddedError as exc:
        sys.exit(f"odal cannot start the embedded PostgreSQL: {exc}")


def not_migrated(exc: BaseException) -> str:
    """The table a statement missed when the database has not been migrated (PostgreSQL's
    undefined table), or ""."""
    import re

    import psycopg

    error = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    if isinstance(error, psycopg.errors.UndefinedTable):
        found = re.search(r'relation "([^"]+)" does not exist', str(error))
        return found.group(1) if found else "(one of odal's)"
    return ""


def starts_the_cluster(argv: list[str]) -> bool:
    """`odal qcluster`, not its --help (which needs no database)."""
    return argv[1:2] == ["qcluster"] and not {"-h", "--help", "--version"} & set(argv[2:])


def database_answers(what: str) -> bool:
    """A worker started while its database is down waits for it (odal.core.reconnect.Outage), as
    `odal outbox sweep` does: django-q2's cluster with its ORM broker (the default) connects as
    it starts and ended with tracebacks and exit 1. False if SIGINT or SIGTERM came first."""
    import django

    from odal.core import reconnect  # (as it runs: the script loads before the settings)

    django.setup()
    stop = []
    previous = {
        sig: signal.signal(sig, lambda *_: stop.append(True)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        reconnect.check_database()
    except reconnect.ERRORS as exc:
        if not reconnect.is_lost(exc):
            raise
        return reconnect.Outage(what, should_stop=lambda: bool(stop)).wait(exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reconnect.close_connection()  # (the cluster forks its processes: none inherits it)
    return True


def stop_the_cluster_in_time() -> None:
    """django-q2's cluster stops on SIGTERM or SIGINT once its workers have finished their tasks,
    however long that takes, and hears the signal in its main process only. odal's stop reaches
    every process of it, and its clock (odal.core.stopping) ends it, its processes first, if it has
    not stopped within ODAL_STOP_SECONDS:

    - the stop is shared (stopping.share, made before the cluster forks): the main process's
      handler raises it, and every worker's pass sees it at once, as a sweep's or a drain's own
      process does: it starts no new attempt, gives back the rows it did not start, lets the
      attempts under way end, writes their outcomes and returns, and so does its task; then
      django-q2's own stop sequence (the sentinel's poison pills) ends the workers;
    - SIGTERM sent to the whole process group (systemd, a terminal's kill of the group) would end
      the sentinel, its pusher, its monitor and the workers at once (django-q2 leaves SIGTERM at
      its default in them): the sentinel is forked with SIGTERM blocked, so it and the processes
      it starts stop only by that sequence, as django-q2 has them do on SIGINT (which it ignores
      there); each worker takes SIGTERM back (post_spawn) as odal's own stop of that worker alone
      (the sentinel ends a worker past its task's timeout with SIGTERM)."""
    from django_q.cluster import Cluster
    from django_q.signals import post_spawn

    from odal.core import stopping  # (as it runs: the script loads before the settings)

    stopping.share()
    stop = Cluster.sig_handler

    def sig_handler(cluster, signum, frame):
        if stopping.asked():  # a second signal
            stopping.end(signum, "a second signal came")
        stopping.ask(signum)
        stop(cluster, signum, frame)

    Cluster.sig_handler = sig_handler
    main = os.getpid()

    def blocking_sigterm(block: bool):
        if os.getpid() == main:  # (not in the sentinel as it forks the workers: they inherit it blocked)
            signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK, {signal.SIGTERM})

    os.register_at_fork(
        before=lambda: blocking_sigterm(True), after_in_parent=lambda: blocking_sigterm(False)
    )
    post_spawn.connect(a_worker_stops_as_odal_does, weak=False)


def a_worker_stops_as_odal_does(sender, proc_name, **kwargs) -> None:
    """In each django-q2 worker as it starts (its post_spawn): SIGTERM, sent to it alone or to
    the whole group, is odal's stop of this worker (odal.core.stopping: its pass starts nothing more and
    gives back what it did not start, its clock ends it within ODAL_STOP_SECONDS). SIGINT stays
    ignored, as django-q2 has it: the main process stops the cluster."""
    from odal.core import stopping  # (as it runs: the script loads before the settings)

    stopping.on_signals(signals=(signal.SIGTERM,))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


DATABASE_UNANSWERED = 4  # the exit code of a command whose database does not answer: safe to retry


if __name__ == "__main__":
    main()
