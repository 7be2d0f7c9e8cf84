"""odal outbox status and show: what the outbox holds, overall and one delivery at a time."""

from django.core.management.base import CommandError

from odal.core import rules
from odal.core.cli import argument, dumps
from outbox.models import Delivery
from outbox.schemas import delivery_json
from outbox.service import outbox_counts


def add_arguments(sub) -> None:
    status = sub.add_parser("status", help="deliveries per status, overall and per consumer")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=status_handle)

    show = sub.add_parser("show", help="one delivery with its attempt log")
    show.add_argument("delivery", metavar="delivery-id", type=argument(rules.delivery_id))
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=show_handle)


def status_handle(command, *, json: bool, **_):
    counts = outbox_counts()
    if json:
        command.stdout.write(dumps(counts))
        return
    oldest = counts["oldestPendingAt"]
    age = f", oldest pending since {oldest:%Y-%m-%d %H:%M:%S}Z" if oldest else ""
    command.stdout.write(
        f"pending {counts['pending']}  delivered {counts['delivered']}  dead {counts['dead']}"
        f"{_answered_late(counts)}  paused {counts['paused']}{age}"
    )
    for c in counts["consumers"]:
        since = c["oldestPendingAt"]
        command.stdout.write(
            f"  {c['name']:<24} pending {c['pending']:<6} delivered {c['delivered']:<8} dead {str(c['dead']) + _answered_late(c):<6}"
            f" paused {c['paused']:<6}"
            + (f" oldest pending since {since:%Y-%m-%d %H:%M:%S}Z" if since else "")
            + (f"  (paused by {c['pausedBy']}: {c['pausedReason']})" if c["isPaused"] else "")
        )
    command.stdout.write("(delivered counts every delivery made, including rows retention has deleted)")
    if counts["deadLateSuccesses"]:
        command.stdout.write(
            "(answered 2xx late: dead, but a late attempt reached the consumer, which has them; "
            "odal outbox show <delivery-id> says when)"
        )


def _answered_late(counts: dict) -> str:
    """`odal outbox status`'s mark on a dead count: how many of them the consumer has after all."""
    n = counts["deadLateSuccesses"]
    return f" ({n} answered 2xx late)" if n else ""


def show_handle(command, *, delivery, json: bool, **_):
    row = (
        Delivery.objects.select_related("event", "consumer")
        .prefetch_related("attempt_log")
        .filter(pk=delivery)
        .first()
    )
    if row is None:
        raise CommandError(f"No delivery {delivery}.")
    if json:
        command.stdout.write(dumps(delivery_json(row)))
        return
    command.stdout.write(f"delivery {row.pk}: {row.event.type} (event {row.event_id}) to {row.consumer.name}")
    command.stdout.write(f"  status {row.status}, attempts {row.attempts} of {row.max_attempts}")
    if row.status == Delivery.Status.PENDING:
        command.stdout.write(f"  next attempt {row.next_attempt_at:%Y-%m-%d %H:%M:%S}Z")
    for label, at in (("delivered", row.delivered_at), ("dead since", row.dead_at)):
        if at:
            command.stdout.write(f"  {label} {at:%Y-%m-%d %H:%M:%S}Z")
    if row.last_error:
        command.stdout.write(f"  last error: {row.last_error}")
    if row.late_success_at:
        command.stdout.write(_late_success(row))
    for a in row.attempt_log.all():
        command.stdout.write(
            f"  attempt {a.number} {a.started_at:%Y-%m-%d %H:%M:%S}Z {a.outcome}"
            + (f" HTTP {a.http_status}" if a.http_status else "")
            + (" (late: written to the log only)" if a.late else "")
            + (f": {a.error}" if a.error else "")
        )


def _late_success(row: Delivery) -> str:
    """`odal outbox show`'s line on a delivery whose consumer answered 2xx to a late attempt."""
    said = f"  the consumer answered 2xx to a late attempt at {row.late_success_at:%Y-%m-%d %H:%M:%S}Z"
    if row.status == Delivery.Status.DEAD:
        said += ": it has this delivery although it is dead, and a replay or resend sends it again"
    return said + "."
