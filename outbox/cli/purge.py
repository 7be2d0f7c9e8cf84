"""odal outbox purge: delete settled rows older than the retention periods (what the scheduled
task does), or count them with --dry-run."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from odal.core import rules
from odal.core.cli import Progress, argument
from outbox import retention


def add_arguments(sub) -> None:
    purge = sub.add_parser(
        "purge",
        help="delete settled rows older than the retention periods (what the scheduled task does)",
    )
    purge.add_argument(
        "--older-than",
        type=argument(rules.retention_period),
        help="delivered deliveries, events and the attempt lines of registered or rejected registrations "
        "older than this, e.g. 30d, 12h, 90m (default: ODAL_RETENTION_DAYS)",
    )
    purge.add_argument(
        "--dead-older-than",
        type=argument(rules.retention_period),
        help="dead deliveries older than this (default: ODAL_DEAD_RETENTION_DAYS)",
    )
    purge.add_argument(
        "--evidence-older-than",
        type=argument(rules.retention_period),
        help="the registry's evidence older than this: attempt lines of abandoned, suspended or deactivated "
        "registrations, and of earlier work (default: ODAL_EVIDENCE_RETENTION_DAYS; never before --older-than)",
    )
    purge.add_argument(
        "--batch",
        type=argument(rules.batch_size),
        default=1000,
        help="rows per transaction (1 to 10,000)",
    )
    purge.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    purge.set_defaults(handler=handle)


def handle(command, *, older_than, dead_older_than, evidence_older_than, batch, dry_run, **_):
    older_than = older_than or timedelta(days=settings.ODAL_RETENTION_DAYS)
    dead_older_than = dead_older_than or timedelta(days=settings.ODAL_DEAD_RETENTION_DAYS)
    evidence_older_than = max(  # evidence goes never before the ordinary lines
        evidence_older_than or timedelta(days=settings.ODAL_EVIDENCE_RETENTION_DAYS), older_than
    )
    now = timezone.now()
    delivered_before, dead_before = now - older_than, now - dead_older_than
    evidence_before = now - evidence_older_than
    with Progress(command.stderr, what="rows checked" if dry_run else "rows deleted") as progress:
        report = retention.purge(
            delivered_before=delivered_before,
            dead_before=dead_before,
            evidence_before=evidence_before,
            batch=batch,
            dry_run=dry_run,
            progress=progress,
        )
    said = report.summary()
    command.stdout.write(
        f"{said[0].upper()}{said[1:]}: delivered older than {rules.duration_text(older_than)} "
        f"(before {delivered_before:%Y-%m-%d %H:%M:%S}Z), dead older than "
        f"{rules.duration_text(dead_older_than)} (before {dead_before:%Y-%m-%d %H:%M:%S}Z), registry "
        f"evidence older than {rules.duration_text(evidence_older_than)} "
        f"(before {evidence_before:%Y-%m-%d %H:%M:%S}Z)."
        + (" Nothing was deleted (--dry-run)." if dry_run else "")
    )
