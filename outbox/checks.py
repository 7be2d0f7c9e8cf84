"""The outbox's system check, odal.W001 for consumers (odal.core.checks): a claim hold not longer
than a consumer's timeout. Registered by the outbox app as it starts (OutboxConfig.ready)."""

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.db import Error, connection

from odal.core.checks import CONSEQUENCE, W001
from odal.core.reconnect import close_connection
from outbox.models import Consumer

FEW = 5  # consumers named in the warning, the longest timeouts first; the rest are counted


def register_checks() -> None:
    """By the outbox app as it starts (OutboxConfig.ready), and only there: the admin and the
    command line import this module for consumer_timeout_warning, and no import should be what
    registers."""
    register(claim_hold_outlasts_consumer_timeouts, "odal", Tags.database)


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
