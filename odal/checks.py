"""odal's Django system checks. Django runs them as every command starts (the sweep, the drain,
`odal qcluster`, `odal serve`, `odal up`, runserver, every other `odal` command) and prints
what they find on stderr; `odal check` runs them alone.

odal.W001: a claim hold not longer than a timeout that can run under it. An attempt that takes
its whole timeout then outlives its claim: its row is due again, another attempt may run it
meanwhile (the delivery or the registration is sent again), and the late outcome changes nothing
(the attempt log keeps it, marked late). That is seed 000's trade and it stands; the warning says
that every slow attempt would pay it.

odal.E001 and odal.E002: django-q2 settings (Q_CLUSTER) whose timeouts cannot add up, refused
(docs/runbook.md, "Task timeouts"). django-q2 ends a task at its `timeout` wherever its code is;
a pass in a task starts no attempt later than the task's deadline less the attempt's timeout and
odal.work.deadline.MARGIN_SECONDS, so:
- E001: the timeout must exceed the longest attempt plus the margin (a consumer's timeoutSeconds
  may be 60; a deactivation that first finds what the registry holds takes
  ODAL_REGISTRY_LOOKUP_SECONDS and two requests): else a task could never start such an attempt,
  and every task would claim its rows only to give them back. (A task's run also waits, for rows
  falling due or a lost database, until its budget, odal.work.loops.TASK_SECONDS: 50 s, shorter
  than the longest webhook.)
- E002: `retry` must exceed the timeout (django-q2 presents a task again to another worker when
  it has not ended within `retry`: a task still running would run twice), so there must be one.

A surface, like odal.dashboard: it reads the outbox's consumers (see docs/architecture.md).
"""

from django.conf import settings
from django.core.checks import ERROR, Tags, Warning, register
from django.core.checks import Error as CheckError
from django.core.checks.registry import registry
from django.core.exceptions import ImproperlyConfigured
from django.db import Error, connection

from odal.reconnect import close_connection
from outbox.models import Consumer

W001 = "odal.W001"
E001 = "odal.E001"  # a task's timeout too short for the attempts it runs
E002 = "odal.E002"  # django-q2's retry not longer than its timeout
FEW = 5  # consumers named in the warning, the longest timeouts first; the rest are counted

# What an attempt of the registry drain runs under its claim, each bounded by a setting. (Abandon's
# own lookup runs under no claim: it writes only if the row is still what it read before it asked.)
REGISTRY_BOUNDS = (
    ("ODAL_REGISTRY_TIMEOUT_SECONDS", "how long one registry request of the drain may take"),
    (
        "ODAL_REGISTRY_LOOKUP_SECONDS",
        "how long the drain may read the registry's task list to find what it holds before it "
        "deactivates a passport suspended after a register was attempted",
    ),
)

CONSEQUENCE = (
    "an attempt that takes its whole timeout outlives its claim, the {what} may be sent again "
    "meanwhile, and the late outcome changes nothing (the attempt log keeps it, marked late)"
)


def register_checks() -> None:
    """By the odal app as it starts (OdalConfig.ready), and only there: the admin and the command
    line import this module for consumer_timeout_warning, and no import should be what registers."""
    register(claim_hold_outlasts_registry_requests, "odal")
    register(claim_hold_outlasts_consumer_timeouts, "odal", Tags.database)
    register(task_timeouts_add_up, "odal")


def refuse_deploy_errors() -> None:
    """In production, start only if none of Django's deploy checks (what `check --deploy` runs)
    finds an error: raise ImproperlyConfigured with the first one's sentence, which names its
    setting. Django itself only reports them, and only when asked for --deploy. (Its warnings
    that odal makes refusals, a weak SECRET_KEY and ALLOWED_HOSTS '*', are refused in settings.)"""
    for check in sorted(registry.deployment_checks, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
        for message in check(app_configs=None, databases=None):
            if message.level >= ERROR:
                raise ImproperlyConfigured(
                    f"{message.msg} ({message.id}: Django's deploy check calls it an error; "
                    "ODAL_ENV=production does not start with one)"
                )


def claim_hold_outlasts_registry_requests(app_configs=None, **kwargs) -> list[Warning]:
    if settings.ODAL_REGISTRY_ADAPTER == "none":  # no registry queues: the drain sends nothing
        return []
    hold = settings.ODAL_CLAIM_HOLD_SECONDS
    found = []
    for name, what in REGISTRY_BOUNDS:
        seconds = getattr(settings, name)
        if hold <= seconds:
            found.append(
                Warning(
                    f"ODAL_CLAIM_HOLD_SECONDS={hold} is not longer than {name}={seconds} ({what}): "
                    + CONSEQUENCE.format(what="registration")
                    + ".",
                    hint=f"Raise ODAL_CLAIM_HOLD_SECONDS above {seconds} by a margin (the default is 300), "
                    f"or lower {name}.",
                    id=W001,
                )
            )
    return found


def claim_hold_outlasts_consumer_timeouts(app_configs=None, **kwargs) -> list[Warning]:
    """Read from the database on every start, not only under `odal check --database`: consumers
    change while odal runs, and a warning shown only when asked for is not shown on start."""
    hold = settings.ODAL_CLAIM_HOLD_SECONDS
    longest, count = consumers_timing_out_after(hold)
    if not count:
        return []
    named = ", ".join(f"{name!r} {seconds}" for name, seconds in longest)
    if count == 1:
        whose = f"consumer {longest[0][0]!r} timeoutSeconds={longest[0][1]}"
    elif count == len(longest):
        whose = f"the timeoutSeconds of {count} consumers ({named})"
    else:
        whose = (
            f"the timeoutSeconds of {count:,} consumers (the longest: {named}; {count - len(longest):,} more)"
        )
    return [
        Warning(
            f"ODAL_CLAIM_HOLD_SECONDS={hold} is not longer than {whose}: "
            + CONSEQUENCE.format(what="delivery")
            + ".",
            hint=f"Raise ODAL_CLAIM_HOLD_SECONDS above {longest[0][1]} by a margin (the default is 300), "
            f"or lower {'its timeout' if count == 1 else 'their timeouts'}: "
            "odal outbox consumer change NAME --timeout SECONDS.",
            id=W001,
        )
    ]


def task_timeouts_add_up(app_configs=None, **kwargs) -> list[CheckError]:
    """odal.E001 and odal.E002 (see the module)."""
    from odal import rules
    from odal.work.deadline import MARGIN_SECONDS
    from registry.drain_pass import longest_attempt_seconds

    timeout, retry = settings.Q_CLUSTER.get("timeout"), settings.Q_CLUSTER.get("retry")
    if timeout is None:
        return [
            CheckError(
                "Q_CLUSTER has no timeout: django-q2 presents a task that has not ended within its retry "
                f"({retry} s) to another worker, and a pass in a task without one has no deadline but its "
                "claim's hold.",
                hint='Set Q_CLUSTER["timeout"] below Q_CLUSTER["retry"] (odal sets both from '
                "ODAL_Q_TIMEOUT_SECONDS: leave them to it).",
                id=E002,
            )
        ]
    longest = [
        (
            rules.TIMEOUT_SECONDS[1],
            f"a consumer's timeoutSeconds (up to {rules.TIMEOUT_SECONDS[1]} s) for a delivery",
        ),
    ]  # (the runs' own budget, odal.work.loops.TASK_SECONDS, is shorter than the first: covered)
    if settings.ODAL_REGISTRY_ADAPTER != "none":
        longest.append(
            (
                longest_attempt_seconds(finds=True),
                f"a registry deactivation that first finds what the registry holds "
                f"(ODAL_REGISTRY_LOOKUP_SECONDS={settings.ODAL_REGISTRY_LOOKUP_SECONDS} and two requests of "
                f"ODAL_REGISTRY_TIMEOUT_SECONDS={settings.ODAL_REGISTRY_TIMEOUT_SECONDS})",
            )
        )
    found = []
    for seconds, what in longest:
        if timeout <= seconds + MARGIN_SECONDS:
            found.append(
                CheckError(
                    f"django-q2's task timeout (ODAL_Q_TIMEOUT_SECONDS={timeout}) is not longer than {what}, "
                    f"{seconds:g} s, plus {MARGIN_SECONDS:g} s to write its outcome: django-q2 ends a task at "
                    "its timeout wherever it is, so no task could start such an attempt (its rows would be "
                    "claimed and given back, task after task).",
                    hint=f"Raise ODAL_Q_TIMEOUT_SECONDS above {seconds + MARGIN_SECONDS:g}, or lower the bound "
                    "named.",
                    id=E001,
                )
            )
    if retry is not None and retry <= timeout:
        found.append(
            CheckError(
                f'Q_CLUSTER["retry"]={retry} is not longer than its timeout ({timeout} s): django-q2 would '
                "present a task still running to another worker, and both would run it.",
                hint='Raise Q_CLUSTER["retry"] above Q_CLUSTER["timeout"] (odal sets both from '
                "ODAL_Q_TIMEOUT_SECONDS: leave them to it).",
                id=E002,
            )
        )
    return found


def consumer_timeout_warning(consumer: Consumer) -> str:
    """odal.W001 for one consumer, for the person who just set its timeout (the command line, the
    admin): the checks ran as their process started, before it. "" when the hold is longer."""
    hold, seconds = settings.ODAL_CLAIM_HOLD_SECONDS, consumer.timeout_seconds
    if seconds < hold:
        return ""
    return (
        f"ODAL_CLAIM_HOLD_SECONDS={hold} is not longer than consumer {consumer.name!r} timeoutSeconds={seconds}: "
        + CONSEQUENCE.format(what="delivery")
        + f". Raise ODAL_CLAIM_HOLD_SECONDS above {seconds} by a margin, or lower this timeout ({W001})."
    )


def consumers_timing_out_after(hold: int) -> tuple[list[tuple[str, int]], int]:
    """The consumers whose timeoutSeconds is at least `hold`: the FEW longest (name, seconds) and
    how many in all. None (0) when there is no database to read, one that does not answer, or
    one without odal's tables yet (`odal check` on a build machine, `odal migrate` on a new
    database): the settings are then all there is to check, and the start goes on."""
    opened = connection.connection is None
    try:
        rows = Consumer.objects.filter(timeout_seconds__gte=hold)
        longest = list(rows.order_by("-timeout_seconds", "name").values_list("name", "timeout_seconds")[:FEW])
        count = rows.count() if len(longest) == FEW else len(longest)
    except Error:
        return [], 0
    finally:
        if opened:  # the check leaves no connection behind: `odal qcluster` forks after it
            close_connection()
    return longest, count
