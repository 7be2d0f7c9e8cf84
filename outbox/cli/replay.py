"""odal outbox replay and resend: dead deliveries due again (replay), or delivered and dead ones
sent again (resend), named by id or chosen by filters, always with a reason."""

from django.core.management.base import CommandError
from django.utils import timezone

from odal.core import rules
from odal.core.cli import Batches, Progress, argument, cli_actor
from outbox import service
from outbox.models import Delivery


def add_arguments(sub) -> None:
    replay = sub.add_parser("replay", help="replay dead deliveries, with a reason")
    replay.add_argument("ids", nargs="*", metavar="delivery-id", type=argument(rules.delivery_id))
    replay.add_argument("--dead", action="store_true", help="every dead delivery matching the filters")
    replay.add_argument("--consumer", type=argument(rules.consumer_filter))
    replay.add_argument("--event-type", type=argument(rules.event_type_filter))
    replay.add_argument("--since", type=argument(rules.moment), help="dead since (ISO 8601)")
    replay.add_argument("--reason", required=True)
    replay.add_argument("--actor", type=argument(rules.actor), help="who replays, for the audit trail")
    replay.add_argument("--dry-run", action="store_true")
    replay.set_defaults(handler=replay_handle)

    resend = sub.add_parser("resend", help="send delivered or dead deliveries again, with a reason")
    resend.add_argument("ids", nargs="*", metavar="delivery-id", type=argument(rules.delivery_id))
    resend.add_argument(
        "--consumer", type=argument(rules.consumer_filter), help="every one of this consumer's"
    )
    resend.add_argument("--event-type", type=argument(rules.event_type_filter))
    resend.add_argument("--status", choices=service.RESENDABLE, help="only delivered, or only dead")
    resend.add_argument("--since", type=argument(rules.moment), help="made at or after (ISO 8601)")
    resend.add_argument("--until", type=argument(rules.moment), help="made before (ISO 8601)")
    resend.add_argument("--reason", required=True, type=argument(rules.reason))
    resend.add_argument("--actor", type=argument(rules.actor), help="who resends, for the audit trail")
    resend.add_argument("--dry-run", action="store_true")
    resend.set_defaults(handler=resend_handle)


def replay_handle(command, *, ids, dead, consumer, event_type, since, reason, actor, dry_run, **_):
    if bool(ids) == bool(dead):
        raise CommandError(
            "Name delivery ids, or pass --dead with optional filters (not both).", returncode=2
        )
    if ids:
        if consumer or event_type or since:
            raise CommandError("--consumer, --event-type and --since go with --dead.", returncode=2)
        rows, _ = _named(ids, "replayed")
    else:
        rows = Delivery.objects.matching(consumer=consumer, event_type=event_type, dead_since=since)
    late = service.late_success_preview(rows, verb="replaying")["warning"]
    if dry_run:
        command.stdout.write(
            f"Would replay {rows.filter(status=Delivery.Status.DEAD).count()} dead deliveries."
        )
        warn(command, late)
        return
    selected = rows.count()
    with Progress(command.stderr, total=selected, what="replayed") as progress:
        batches = Batches(progress)
        replayed = rows.replay(actor=cli_actor(actor), reason=reason, at=timezone.now(), progress=batches)
    command.stdout.write(f"Replayed {replayed} of {selected} selected{batches.said()}.")
    warn(command, late if replayed else None)
    if ids and replayed < selected:
        raise CommandError(f"{selected - replayed} were not dead and were left as they are.")


def resend_handle(command, *, ids, consumer, event_type, status, since, until, reason, actor, dry_run, **_):
    if bool(ids) == bool(consumer or event_type or status or since or until):
        raise CommandError(
            "Name delivery ids, or filter with --consumer, --event-type, --status, --since, --until "
            "(not both).",
            returncode=2,
        )
    if since and until and since >= until:
        raise CommandError("--since must be before --until.", returncode=2)
    if ids:
        rows, selected = _named(ids, "resent")
        rows = rows.filter(status__in=service.RESENDABLE)
    else:
        rows = Delivery.objects.matching(
            statuses=[status] if status else service.RESENDABLE,
            consumer=consumer,
            event_type=event_type,
            since=since,
            until=until,
        )
        selected = None
    late = service.late_success_preview(rows, verb="resending")["warning"]
    if dry_run:
        command.stdout.write(f"Would resend {rows.count()} deliveries.")
        warn(command, late)
        return
    with Progress(command.stderr, total=selected, what="resent") as progress:
        batches = Batches(progress)
        resent = rows.resend(actor=cli_actor(actor), reason=reason, progress=batches)
    command.stdout.write(
        f"Resent {resent} deliveries" + (f" of {selected} named" if selected else "") + f"{batches.said()}."
    )
    warn(command, late if resent else None)
    if ids and resent < selected:
        raise CommandError(
            f"{selected - resent} were pending or paused (on their way) and were left as they are."
        )


def _named(ids, done: str):
    """The deliveries named by id and how many they are, or a refusal (nothing `done`) when any
    of them does not exist."""
    rows = Delivery.objects.filter(pk__in=ids)
    found = rows.count()
    if found != len(set(ids)):
        raise CommandError(f"{len(set(ids)) - found} of the named deliveries do not exist; nothing {done}.")
    return rows, found


def warn(command, warning: str | None) -> None:
    """A replay's or resend's warning (dead deliveries their consumer answered 2xx late), on stderr."""
    if warning:
        command.stderr.write(f"Warning: {warning}")
