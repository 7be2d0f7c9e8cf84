"""odal outbox consumer …: add, list, show, change, pause, resume, remove, rotate the secret of,
and send a test event to a consumer. A person's write goes through outbox.service, with the
actor (cli, or cli:<--actor>) and the reason it asks for."""

from odal.core import rules
from odal.core.cli import Batches, Progress, argument, cli_actor, dumps, subcommands
from outbox import service
from outbox.checks import consumer_timeout_warning
from outbox.models import Consumer
from outbox.schemas import consumer_json


def add_arguments(sub) -> None:
    consumer = sub.add_parser("consumer", help="manage consumers")
    consumer_sub = subcommands(consumer, dest="consumer_action")
    _add_add(consumer_sub)
    listing = consumer_sub.add_parser("list", help="every consumer")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=list_handle)
    show = consumer_sub.add_parser("show", help="one consumer")
    show.add_argument("name", type=argument(rules.consumer_filter))
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=show_handle)
    _add_change(consumer_sub)
    for verb, text, handler in (
        ("pause", "pause: its deliveries wait, spending no attempt", pause_handle),
        ("resume", "resume: its waiting deliveries flow again, oldest first", resume_handle),
        ("remove", "remove it with its settled deliveries (refused while any is owed)", remove_handle),
        ("rotate-secret", "a new signing secret, printed once; the old one signs beside it for --grace",
         rotate_secret_handle),
        ("test-event", "send it an odal.test event", test_event_handle),
    ):  # fmt: skip
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
        one.set_defaults(handler=handler)


def _add_add(consumer_sub) -> None:
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
    add.add_argument("--timeout", type=argument(rules.timeout_seconds), default=10, help="seconds, 1 to 60")
    add.set_defaults(handler=add_handle)


def _add_change(consumer_sub) -> None:
    change = consumer_sub.add_parser("change", help="change url or target, event types, timeout, attempts")
    change.add_argument("name", type=argument(rules.consumer_filter))
    change.add_argument("--url", help="webhook URL")
    change.add_argument("--target", type=argument(rules.python_target), help="dotted path of a callable")
    change.add_argument("--events", type=argument(event_patterns), help="comma-separated event types")
    change.add_argument("--max-attempts", type=argument(rules.attempt_budget), help="1 to 1,000")
    change.add_argument("--timeout", type=argument(rules.timeout_seconds), help="seconds, 1 to 60")
    change.add_argument("--reason", type=argument(rules.reason))
    change.add_argument("--json", action="store_true")
    change.set_defaults(handler=change_handle)


def event_patterns(value: str) -> list[str]:
    """--events: comma-separated patterns (odal.core.rules.event_pattern), spaces around them ignored,
    each once. A value naming none (`--events ,`) is refused: stored, an empty list means every
    event, which a slip of the keyboard should not decide."""
    patterns = list(dict.fromkeys(p for p in (p.strip(" ") for p in value.split(",")) if p))
    if not patterns:
        raise ValueError("names no event type; give * for every event type, or leave --events out")
    for pattern in patterns:
        try:
            rules.event_pattern(pattern)
        except ValueError as exc:
            raise ValueError(f"names {rules.shown(pattern)}, which {exc}") from None
    return patterns


# -- the handlers, one per verb ----------------------------------------------------------------


def add_handle(command, *, name, url, target, events, max_attempts, timeout, **_):
    consumer = service.create_consumer(
        name=name,
        kind="webhook" if url else "python",
        url=url,
        target=target,
        event_types=events,
        max_attempts=max_attempts,
        timeout_seconds=timeout,
        actor="cli",
    )
    command.stdout.write(f"Added consumer {consumer.name} ({consumer.kind}).")
    command.stdout.write(f"Signing secret (shown once): {consumer.secret}")
    warn_of_timeout(command, consumer)


def list_handle(command, *, json: bool, **_):
    consumers = list(Consumer.objects.order_by("name"))
    if json:
        command.stdout.write(dumps([consumer_json(c) for c in consumers]))
        return
    for c in consumers:
        command.stdout.write(_consumer_line(c))
    if not consumers:
        command.stdout.write("No consumers (add one with: odal outbox consumer add NAME --url URL).")


def show_handle(command, *, name, json: bool, **_):
    _show(command, service.consumer_or_404(name), json)


def change_handle(command, *, name, url, target, events, max_attempts, timeout, reason, json: bool, **_):
    consumer = service.consumer_or_404(name)
    consumer = service.change_consumer(
        consumer, actor="cli", reason=reason or "", url=url, target=target, event_types=events,
        max_attempts=max_attempts, timeout_seconds=timeout,
    )  # fmt: skip
    _show(command, consumer, json)
    if timeout is not None:  # (the start's checks named an unchanged one already)
        warn_of_timeout(command, consumer)


def pause_handle(command, *, name, reason, actor, json: bool, **_):
    consumer = service.consumer_or_404(name)
    took = service.pause(consumer, actor=cli_actor(actor), reason=reason)
    consumer.refresh_from_db()
    if json:
        command.stdout.write(dumps(consumer_json(consumer)))
    elif took:
        command.stdout.write(f"Paused {consumer.name}: its deliveries wait until it is resumed.")
    else:
        command.stdout.write(
            f"Already paused (by {consumer.paused_by}: {consumer.paused_reason}); nothing changed."
        )


def resume_handle(command, *, name, reason, actor, json: bool, **_):
    consumer = service.consumer_or_404(name)
    with Progress(command.stderr, what="resumed") as progress:
        batches = Batches(progress)
        resumed = service.resume(consumer, actor=cli_actor(actor), reason=reason, progress=batches)
    consumer.refresh_from_db()
    if json:
        command.stdout.write(dumps(consumer_json(consumer)))
    elif resumed is None:
        command.stdout.write(f"{consumer.name} was not paused; nothing changed.")
    else:
        command.stdout.write(
            f"Resumed {consumer.name}: {resumed} waiting deliveries are due again{batches.said()}."
        )


def remove_handle(command, *, name, reason, actor, json: bool, **_):
    consumer = service.consumer_or_404(name)
    with Progress(command.stderr, what="deleted") as progress:
        batches = Batches(progress)
        removed = service.remove_consumer(consumer, actor=cli_actor(actor), reason=reason, progress=batches)
    if json:
        command.stdout.write(dumps({"name": consumer.name, **removed}))
    else:
        command.stdout.write(
            f"Removed {consumer.name} with {removed['deliveriesRemoved']} settled deliveries{batches.said()}."
        )


def rotate_secret_handle(command, *, name, reason, grace, actor, json: bool, **_):
    consumer = service.consumer_or_404(name)
    secret, expires = service.rotate_secret(consumer, actor=cli_actor(actor), reason=reason, grace=grace)
    if json:
        command.stdout.write(dumps({"secret": secret, "previousSecretExpiresAt": expires}))
        return
    command.stdout.write(f"New signing secret for {consumer.name} (shown once): {secret}")
    command.stdout.write(
        f"The old secret signs beside it until {expires:%Y-%m-%d %H:%M:%S}Z."
        if expires
        else "The old secret no longer signs."
    )


def test_event_handle(command, *, name, actor, json: bool, **_):
    consumer = service.consumer_or_404(name)
    delivery = service.send_test_event(consumer, actor=cli_actor(actor))
    if json:
        command.stdout.write(dumps({"deliveryId": delivery.pk}))
    else:
        command.stdout.write(
            f"Test event sent to {consumer.name}: delivery {delivery.pk}"
            + (" (waiting: the consumer is paused)." if consumer.paused else ".")
        )


# -- what the handlers print -------------------------------------------------------------------


def warn_of_timeout(command, consumer: Consumer) -> None:
    """odal.W001 to whoever just set a timeout the claim hold does not outlast, on stderr."""
    if warning := consumer_timeout_warning(consumer):
        command.stderr.write(f"Warning: {warning}")


def _show(command, consumer: Consumer, as_json: bool) -> None:
    if as_json:
        command.stdout.write(dumps(consumer_json(consumer)))
        return
    command.stdout.write(_consumer_line(consumer))
    command.stdout.write(f"  event types: {', '.join(consumer.event_types) or 'all'}")
    command.stdout.write(f"  attempts {consumer.max_attempts}, timeout {consumer.timeout_seconds}s")
    if consumer.previous_secret_expires_at:
        command.stdout.write(
            f"  old secret signs until {consumer.previous_secret_expires_at:%Y-%m-%d %H:%M:%S}Z"
        )


def _consumer_line(c: Consumer) -> str:
    where = c.url or c.target
    state = f"paused by {c.paused_by}: {c.paused_reason}" if c.paused else "active"
    return f"{c.name:<24} {c.kind:<8} {where}  ({state})"
