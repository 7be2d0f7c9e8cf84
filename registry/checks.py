"""The registry's Django system checks, and django-q2's task timeouts (the drain's attempts are
the longest). Django runs them as every command starts (the sweep, the drain,
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

Consumers' W001 is the outbox's (outbox/checks.py); what they share is odal.core.checks.
"""

from django.conf import settings
from django.core.checks import Error as CheckError
from django.core.checks import Warning, register

from odal.core import rules
from odal.core.checks import CONSEQUENCE, E001, E002, W001
from odal.work.deadline import MARGIN_SECONDS
from registry.drain import longest_attempt_seconds

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


def register_checks() -> None:
    """By the registry app as it starts (RegistryConfig.ready), and only there."""
    register(claim_hold_outlasts_registry_requests, "odal")
    register(task_timeouts_add_up, "odal")


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


def task_timeouts_add_up(app_configs=None, **kwargs) -> list[CheckError]:
    """odal.E001 and odal.E002 (see the module)."""
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
