import json
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from odal import rules
from odal.checks import consumer_timeout_warning
from odal.cli import Progress, argument, refused, run_until_signalled, serving, subcommands
from odal.errors import Refused
from outbox import retention, service
from outbox.models import Consumer, Delivery
from outbox.schemas import consumer_json, delivery_json
from outbox.service import create_consumer, outbox_counts
from outbox.sweep import sweep_forever, sweep_until_idle


class Command(BaseCommand):
    help = "The event outbox: sweep, status, show, replay or resend deliveries, purge old rows, manage consumers."

    def add_arguments(self, parser):
        sub = subcommands(parser)

        sweep = sub.add_parser("sweep", help="claim due deliveries and run them")
        sweep.add_argument("--once", action="store_true", help="one pass, then exit")
        sweep.add_argument(
            "--batch", type=argument(rules.batch_size), default=100, help="rows per pass (1 to 10,000)"
        )

        status = sub.add_parser("status", help="deliveries per status, overall and per consumer")
        status.add_argument("--json", action="store_true")

        show = sub.add_parser("show", help="one delivery with its attempt log")
        show.add_argument("delivery", metavar="delivery-id", type=argument(rules.delivery_id))
        show.add_argument("--json", action="store_true")

        replay = sub.add_parser("replay", help="replay dead deliveries, with a reason")
        replay.add_argument("ids", nargs="*", metavar="delivery-id", type=argument(rules.delivery_id))
        replay.add_argument("--dead", action="store_true", help="every dead delivery matching the filters")
        replay.add_argument("--consumer", type=argument(rules.consumer_filter))
        replay.add_argument("--event-type", type=argument(rules.event_type_filter))
        replay.add_argument("--since", type=argument(rules.moment), help="dead since (ISO 8601)")
        replay.add_argument("--reason", required=True)
        replay.add_argument("--actor", type=argument(rules.actor), help="who replays, for the audit trail")
        replay.add_argument("--dry-run", action="store_true")

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

        receive = sub.add_parser(
            "receive", help="run the demo webhook receiver (verifies signatures, prints events)"
        )
        receive.add_argument("--port", type=argument(rules.port), default=8200)
        receive.add_argument(
            "--consumer",
            type=argument(rules.consumer_filter),
            default="demo-receiver",
            help="whose secret to verify with",
        )

        consumer = sub.add_parser("consumer", help="manage consumers")
        consumer_sub = subcommands(consumer, dest="consumer_action")
        add = consumer_sub.add_parser("add", help="add a consumer (prints its signing secret once)")
        add.add_argument("name", type=argument(rules.consumer_name))
        target = add.add_mutually_exclusive_group(required=True)
        target.add_argument("--url", help="webhook URL")
        target.add_argument(
            "--target", type=argument(rules.python_target), help="dotted path of a Python callable"
        )
        add.add_argument(
            "--events",
            type=argument(event_patterns),
            default=[],
            help="comma-separated event types (default: all)",
        )
        add.add_argument("--max-attempts", type=argument(rules.attempt_budget), help="1 to 1,000")
        add.add_argument(
            "--timeout", type=argument(rules.timeout_seconds), default=10, help="seconds, 1 to 60"
        )
        listing = consumer_sub.add_parser("list", help="every consumer")
        listing.add_argument("--json", action="store_true")
        show = consumer_sub.add_parser("show", help="one consumer")
        show.add_argument("name", type=argument(rules.consumer_filter))
        show.add_argument("--json", action="store_true")
        change = consumer_sub.add_parser(
            "change", help="change url or target, event types, timeout, attempts"
        )
        change.add_argument("name", type=argument(rules.consumer_filter))
        change.add_argument("--url", help="webhook URL")
        change.add_argument("--target", type=argument(rules.python_target), help="dotted path of a callable")
        change.add_argument("--events", type=argument(event_patterns), help="comma-separated event types")
        change.add_argument("--max-attempts", type=argument(rules.attempt_budget), help="1 to 1,000")
        change.add_argument("--timeout", type=argument(rules.timeout_seconds), help="seconds, 1 to 60")
        change.add_argument("--reason", type=argument(rules.reason))
        change.add_argument("--json", action="store_true")
        for verb, text in (
            ("pause", "pause: its deliveries wait, spending no attempt"),
            ("resume", "resume: its waiting deliveries flow again, oldest first"),
            ("remove", "remove it with its settled deliveries (refused while any is owed)"),
            ("rotate-secret", "a new signing secret, printed once; the old one signs beside it for --grace"),
            ("test-event", "send it an odal.test event"),
        ):
            one = consumer_sub.add_parser(verb, help=text)
            one.add_argument("name", type=argument(rules.consumer_filter))
            if verb != "test-event":
                one.add_argument("--reason", required=True, type=argument(rules.reason))
            if verb == "rotate-secret":
                one.add_argument(
                    "--grace", type=argument(rules.grace_period), default=service.DEFAULT_GRACE,
                    help="how long the old secret keeps signing, e.g. 24h (0s: not at all)",
                )  # fmt: skip
            one.add_argument("--actor", type=argument(rules.actor), help="who does it, for the audit trail")
            one.add_argument("--json", action="store_true")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"do_{action}")(**options)
        except Refused as exc:
            raise refused(exc) from None

    # -- sweep ---------------------------------------------------------------------------------

    def do_sweep(self, *, once, batch, **_):
        if once:
            report = sweep_until_idle(batch=batch, max_seconds=0)
            self.stdout.write(f"Swept once: {report.summary()}.")
            return
        self.stdout.write(
            f"Sweeping until interrupted (Ctrl-C or SIGTERM: no new attempts, stopped within "
            f"{settings.ODAL_STOP_SECONDS}s)…"
        )
        report = run_until_signalled(sweep_forever, batch=batch)
        self.stdout.write(f"Stopped after {report.passes} passes: {report.summary()}.")

    # -- status --------------------------------------------------------------------------------

    def do_status(self, *, json: bool, **_):
        counts = outbox_counts()
        if json:
            self.stdout.write(_dumps(counts))
            return
        oldest = counts["oldestPendingAt"]
        age = f", oldest pending since {oldest:%Y-%m-%d %H:%M:%S}Z" if oldest else ""
        self.stdout.write(
            f"pending {counts['pending']}  delivered {counts['delivered']}  dead {counts['dead']}"
            f"{_answered_late(counts)}  paused {counts['paused']}{age}"
        )
        for c in counts["consumers"]:
            since = c["oldestPendingAt"]
            self.stdout.write(
                f"  {c['name']:<24} pending {c['pending']:<6} delivered {c['delivered']:<8} dead {str(c['dead']) + _answered_late(c):<6}"
                f" paused {c['paused']:<6}"
                + (f" oldest pending since {since:%Y-%m-%d %H:%M:%S}Z" if since else "")
                + (f"  (paused by {c['pausedBy']}: {c['pausedReason']})" if c["isPaused"] else "")
            )
        self.stdout.write("(delivered counts every delivery made, including rows retention has deleted)")
        if counts["deadLateSuccesses"]:
            self.stdout.write(
                "(answered 2xx late: dead, but a late attempt reached the consumer, which has them; "
                "odal outbox show <delivery-id> says when)"
            )

    # -- show ----------------------------------------------------------------------------------

    def do_show(self, *, delivery, json: bool, **_):
        row = (
            Delivery.objects.select_related("event", "consumer")
            .prefetch_related("attempt_log")
            .filter(pk=delivery)
            .first()
        )
        if row is None:
            raise CommandError(f"No delivery {delivery}.")
        if json:
            self.stdout.write(_dumps(delivery_json(row)))
            return
        self.stdout.write(
            f"delivery {row.pk}: {row.event.type} (event {row.event_id}) to {row.consumer.name}"
        )
        self.stdout.write(f"  status {row.status}, attempts {row.attempts} of {row.max_attempts}")
        if row.status == Delivery.Status.PENDING:
            self.stdout.write(f"  next attempt {row.next_attempt_at:%Y-%m-%d %H:%M:%S}Z")
        for label, at in (("delivered", row.delivered_at), ("dead since", row.dead_at)):
            if at:
                self.stdout.write(f"  {label} {at:%Y-%m-%d %H:%M:%S}Z")
        if row.last_error:
            self.stdout.write(f"  last error: {row.last_error}")
        if row.late_success_at:
            said = (
                f"  the consumer answered 2xx to a late attempt at {row.late_success_at:%Y-%m-%d %H:%M:%S}Z"
            )
            if row.status == Delivery.Status.DEAD:
                said += ": it has this delivery although it is dead, and a replay or resend sends it again"
            self.stdout.write(said + ".")
        for a in row.attempt_log.all():
            self.stdout.write(
                f"  attempt {a.number} {a.started_at:%Y-%m-%d %H:%M:%S}Z {a.outcome}"
                + (f" HTTP {a.http_status}" if a.http_status else "")
                + (" (late: written to the log only)" if a.late else "")
                + (f": {a.error}" if a.error else "")
            )

    # -- replay --------------------------------------------------------------------------------

    def do_replay(self, *, ids, dead, consumer, event_type, since, reason, actor, dry_run, **_):
        actor = f"cli:{actor}" if actor else "cli"
        if bool(ids) == bool(dead):
            raise CommandError(
                "Name delivery ids, or pass --dead with optional filters (not both).", returncode=2
            )
        if ids:
            if consumer or event_type or since:
                raise CommandError("--consumer, --event-type and --since go with --dead.", returncode=2)
            rows = Delivery.objects.filter(pk__in=ids)
            found = rows.count()
            if found != len(set(ids)):
                raise CommandError(
                    f"{len(set(ids)) - found} of the named deliveries do not exist; nothing replayed."
                )
        else:
            rows = Delivery.objects.matching(consumer=consumer, event_type=event_type, dead_since=since)
        late = service.late_success_preview(rows, verb="replaying")["warning"]
        if dry_run:
            self.stdout.write(
                f"Would replay {rows.filter(status=Delivery.Status.DEAD).count()} dead deliveries."
            )
            self._warn(late)
            return
        selected = rows.count()
        with Progress(self.stderr, total=selected, what="replayed") as progress:
            batches = Batches(progress)
            replayed = rows.replay(actor=actor, reason=reason, at=timezone.now(), progress=batches)
        self.stdout.write(f"Replayed {replayed} of {selected} selected{batches.said()}.")
        self._warn(late if replayed else None)
        if ids and replayed < selected:
            raise CommandError(f"{selected - replayed} were not dead and were left as they are.")

    # -- resend --------------------------------------------------------------------------------

    def do_resend(self, *, ids, consumer, event_type, status, since, until, reason, actor, dry_run, **_):
        actor = f"cli:{actor}" if actor else "cli"
        filters = consumer or event_type or status or since or until
        if bool(ids) == bool(filters):
            raise CommandError(
                "Name delivery ids, or filter with --consumer, --event-type, --status, --since, --until "
                "(not both).",
                returncode=2,
            )
        if since and until and since >= until:
            raise CommandError("--since must be before --until.", returncode=2)
        if ids:
            rows = Delivery.objects.filter(pk__in=ids)
            found = rows.count()
            if found != len(set(ids)):
                raise CommandError(
                    f"{len(set(ids)) - found} of the named deliveries do not exist; nothing resent."
                )
            selected = found
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
            self.stdout.write(f"Would resend {rows.count()} deliveries.")
            self._warn(late)
            return
        with Progress(self.stderr, total=selected, what="resent") as progress:
            batches = Batches(progress)
            resent = rows.resend(actor=actor, reason=reason, progress=batches)
        self.stdout.write(
            f"Resent {resent} deliveries"
            + (f" of {selected} named" if selected else "")
            + f"{batches.said()}."
        )
        self._warn(late if resent else None)
        if ids and resent < selected:
            raise CommandError(
                f"{selected - resent} were pending or paused (on their way) and were left as they are."
            )

    def _warn(self, warning: str | None) -> None:
        """A replay's or resend's warning (dead deliveries their consumer answered 2xx late), on stderr."""
        if warning:
            self.stderr.write(f"Warning: {warning}")

    # -- purge ---------------------------------------------------------------------------------

    def do_purge(self, *, older_than, dead_older_than, evidence_older_than, batch, dry_run, **_):
        older_than = older_than or timedelta(days=settings.ODAL_RETENTION_DAYS)
        dead_older_than = dead_older_than or timedelta(days=settings.ODAL_DEAD_RETENTION_DAYS)
        evidence_older_than = max(  # evidence goes never before the ordinary lines
            evidence_older_than or timedelta(days=settings.ODAL_EVIDENCE_RETENTION_DAYS), older_than
        )
        now = timezone.now()
        delivered_before, dead_before = now - older_than, now - dead_older_than
        evidence_before = now - evidence_older_than
        with Progress(self.stderr, what="rows checked" if dry_run else "rows deleted") as progress:
            report = retention.purge(
                delivered_before=delivered_before,
                dead_before=dead_before,
                evidence_before=evidence_before,
                batch=batch,
                dry_run=dry_run,
                progress=progress,
            )
        said = report.summary()
        self.stdout.write(
            f"{said[0].upper()}{said[1:]}: delivered older than {rules.duration_text(older_than)} "
            f"(before {delivered_before:%Y-%m-%d %H:%M:%S}Z), dead older than "
            f"{rules.duration_text(dead_older_than)} (before {dead_before:%Y-%m-%d %H:%M:%S}Z), registry "
            f"evidence older than {rules.duration_text(evidence_older_than)} "
            f"(before {evidence_before:%Y-%m-%d %H:%M:%S}Z)."
            + (" Nothing was deleted (--dry-run)." if dry_run else "")
        )

    def do_receive(self, *, port, consumer, **_):
        from outbox.models import Consumer
        from outbox.receiver import make_server

        row = Consumer.objects.filter(name=consumer).first()
        if row is None:
            raise CommandError(f"No consumer named {consumer!r}: its secret verifies the signatures.")
        server = serving(lambda: make_server(port, row.secret, self.stdout), port, "demo receiver")
        self.stdout.write(f"Demo receiver for {consumer} on http://127.0.0.1:{port}/hooks")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()

    # -- consumers -----------------------------------------------------------------------------

    def do_consumer(self, *, consumer_action, **options):
        if consumer_action == "add":
            consumer = create_consumer(
                name=options["name"],
                kind="webhook" if options["url"] else "python",
                url=options["url"],
                target=options["target"],
                event_types=options["events"],
                max_attempts=options["max_attempts"],
                timeout_seconds=options["timeout"],
                actor="cli",
            )
            self.stdout.write(f"Added consumer {consumer.name} ({consumer.kind}).")
            self.stdout.write(f"Signing secret (shown once): {consumer.secret}")
            self._warn_of_timeout(consumer)
            return
        as_json = options.get("json")
        if consumer_action == "list":
            consumers = list(Consumer.objects.order_by("name"))
            if as_json:
                self.stdout.write(_dumps([consumer_json(c) for c in consumers]))
                return
            for c in consumers:
                self.stdout.write(_consumer_line(c))
            if not consumers:
                self.stdout.write("No consumers (add one with: odal outbox consumer add NAME --url URL).")
            return
        consumer = service.consumer_or_404(options["name"])
        actor = f"cli:{options['actor']}" if options.get("actor") else "cli"
        if consumer_action == "show":
            self._show(consumer, as_json)
        elif consumer_action == "change":
            consumer = service.change_consumer(
                consumer, actor=actor, reason=options.get("reason") or "", url=options["url"],
                target=options["target"], event_types=options["events"], max_attempts=options["max_attempts"],
                timeout_seconds=options["timeout"],
            )  # fmt: skip
            self._show(consumer, as_json)
            if options["timeout"] is not None:  # (the start's checks named an unchanged one already)
                self._warn_of_timeout(consumer)
        elif consumer_action == "pause":
            took = service.pause(consumer, actor=actor, reason=options["reason"])
            consumer.refresh_from_db()
            if as_json:
                self.stdout.write(_dumps(consumer_json(consumer)))
            elif took:
                self.stdout.write(f"Paused {consumer.name}: its deliveries wait until it is resumed.")
            else:
                self.stdout.write(
                    f"Already paused (by {consumer.paused_by}: {consumer.paused_reason}); nothing changed."
                )
        elif consumer_action == "resume":
            with Progress(self.stderr, what="resumed") as progress:
                batches = Batches(progress)
                resumed = service.resume(consumer, actor=actor, reason=options["reason"], progress=batches)
            consumer.refresh_from_db()
            if as_json:
                self.stdout.write(_dumps(consumer_json(consumer)))
            elif resumed is None:
                self.stdout.write(f"{consumer.name} was not paused; nothing changed.")
            else:
                self.stdout.write(
                    f"Resumed {consumer.name}: {resumed} waiting deliveries are due again{batches.said()}."
                )
        elif consumer_action == "remove":
            with Progress(self.stderr, what="deleted") as progress:
                batches = Batches(progress)
                removed = service.remove_consumer(
                    consumer, actor=actor, reason=options["reason"], progress=batches
                )
            if as_json:
                self.stdout.write(_dumps({"name": consumer.name, **removed}))
            else:
                self.stdout.write(
                    f"Removed {consumer.name} with {removed['deliveriesRemoved']} settled deliveries"
                    f"{batches.said()}."
                )
        elif consumer_action == "rotate-secret":
            secret, expires = service.rotate_secret(
                consumer, actor=actor, reason=options["reason"], grace=options["grace"]
            )
            if as_json:
                self.stdout.write(_dumps({"secret": secret, "previousSecretExpiresAt": expires}))
                return
            self.stdout.write(f"New signing secret for {consumer.name} (shown once): {secret}")
            self.stdout.write(
                f"The old secret signs beside it until {expires:%Y-%m-%d %H:%M:%S}Z."
                if expires
                else "The old secret no longer signs."
            )
        elif consumer_action == "test-event":
            delivery = service.send_test_event(consumer, actor=actor)
            if as_json:
                self.stdout.write(_dumps({"deliveryId": delivery.pk}))
            else:
                self.stdout.write(
                    f"Test event sent to {consumer.name}: delivery {delivery.pk}"
                    + (" (waiting: the consumer is paused)." if consumer.paused else ".")
                )

    def _warn_of_timeout(self, consumer) -> None:
        if warning := consumer_timeout_warning(consumer):
            self.stderr.write(f"Warning: {warning}")

    def _show(self, consumer, as_json: bool) -> None:
        if as_json:
            self.stdout.write(_dumps(consumer_json(consumer)))
            return
        self.stdout.write(_consumer_line(consumer))
        self.stdout.write(f"  event types: {', '.join(consumer.event_types) or 'all'}")
        self.stdout.write(f"  attempts {consumer.max_attempts}, timeout {consumer.timeout_seconds}s")
        if consumer.previous_secret_expires_at:
            self.stdout.write(
                f"  old secret signs until {consumer.previous_secret_expires_at:%Y-%m-%d %H:%M:%S}Z"
            )


def _answered_late(counts: dict) -> str:
    """`odal outbox status`'s mark on a dead count: how many of them the consumer has after all."""
    n = counts["deadLateSuccesses"]
    return f" ({n} answered 2xx late)" if n else ""


def _consumer_line(c) -> str:
    where = c.url or c.target
    state = f"paused by {c.paused_by}: {c.paused_reason}" if c.paused else "active"
    return f"{c.name:<24} {c.kind:<8} {where}  ({state})"


def _dumps(value) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, indent=2)


def event_patterns(value: str) -> list[str]:
    """--events: comma-separated patterns (odal.rules.event_pattern), spaces around them ignored."""
    patterns = [p for p in (p.strip(" ") for p in value.split(",")) if p]
    for pattern in patterns:
        try:
            rules.event_pattern(pattern)
        except ValueError as exc:
            raise ValueError(f"names {rules.shown(pattern)}, which {exc}") from None
    return patterns


class Batches:
    """The `progress` of a bulk write (replay, resend, resume, remove): counts the batches it
    committed and shows the rows done on the command's Progress line."""

    def __init__(self, progress: Progress):
        self.progress, self.count = progress, 0

    def __call__(self, batches: int, total: int) -> None:
        self.count = batches
        self.progress(total)

    def said(self) -> str:
        """For the summary line: nothing for one batch or none, else how many."""
        return f" in {self.count:,} batches" if self.count > 1 else ""
