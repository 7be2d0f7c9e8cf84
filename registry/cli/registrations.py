"""odal registry status, show, abandon and handle: what the registry outbox holds, and the two
writes a person makes on a registration (give it up, record its handle), with a reason."""

from odal.core import rules
from odal.core.cli import argument, cli_actor, dumps
from registry import service
from registry.schemas import AbandonOut, RegistrationOut


def add_arguments(sub) -> None:
    status = sub.add_parser("status", help="registrations per status, stalled and abandoned apart")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=status_handle)

    show = sub.add_parser("show", help="a passport's registration and its attempt log")
    show.add_argument("passport_id", type=argument(rules.passport_id))
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=show_handle)

    abandon = sub.add_parser("abandon", help="give up a registration the registry provably never accepted")
    abandon.add_argument("passport_id", type=argument(rules.passport_id))
    abandon.add_argument("--reason", required=True)
    abandon.add_argument("--actor", type=argument(rules.actor), help="who abandons it, for the audit trail")
    abandon.add_argument("--json", action="store_true")
    abandon.set_defaults(handler=abandon_handle)

    handle = sub.add_parser(
        "handle",
        help="record the registry handle of a submitted registration, or of a deactivation whose finding "
        "cannot search the registry (the drain then deactivates it by that handle)",
    )
    handle.add_argument("passport_id", type=argument(rules.passport_id))
    handle.add_argument("handle")
    handle.add_argument("--reason", required=True)
    handle.add_argument("--actor", type=argument(rules.actor), help="who records it, for the audit trail")
    handle.set_defaults(handler=record_handle)


def status_handle(command, *, json: bool, **_):
    counts = service.registry_counts()
    if json:
        command.stdout.write(dumps(counts))
        return
    owed = "  ".join(f"{k} {counts[k]}" for k in ("pending", "submitted", "registered", "rejected"))
    rest = "  ".join(f"{k} {counts[k]}" for k in ("suspended", "deactivated"))
    command.stdout.write(f"{owed}  {rest}")
    command.stdout.write(
        f"stalled {counts['stalled']} (pending and needing a person)  abandoned {counts['abandoned']}"
    )


def show_handle(command, *, passport_id, json: bool, **_):
    shown = RegistrationOut.from_orm(service.registration_for(passport_id)).model_dump()
    if json:
        command.stdout.write(dumps(shown))
        return
    head = f"{passport_id}: {shown['status']} ({shown['operation']}), {shown['attempts']} attempt(s)"
    if shown["correlationId"] or shown["handle"]:
        head += f", request {shown['correlationId'] or '-'}, handle {shown['handle'] or '-'}"
    command.stdout.write(head)
    if shown["settlesAt"]:
        command.stdout.write(
            f"An attempt whose outcome is unknown ended {shown['lastUnknownAt']:%Y-%m-%d %H:%M:%S}; "
            f"absence in the registry's task list proves nothing until {shown['settlesAt']:%Y-%m-%d %H:%M:%S} UTC."
        )
    if shown["lastError"]:
        command.stdout.write(f"last error: {shown['lastError']}")
    for line in shown["attemptLog"]:
        command.stdout.write(
            f"  #{line['number']} {line['operation']} {line['finishedAt']:%Y-%m-%d %H:%M:%S} "
            f"{line['outcome']}{' (late)' if line['late'] else ''}: {line['answer']}"
        )


def abandon_handle(command, *, passport_id, reason, actor, json: bool, **_):
    result = service.abandon(passport_id, actor=cli_actor(actor), reason=reason)
    if json:
        command.stdout.write(dumps(AbandonOut.from_orm(result).model_dump()))
        return
    command.stdout.write(f"{passport_id}: {result.detail}")


def record_handle(command, *, passport_id, handle, reason, actor, **_):
    reg = service.record_handle(passport_id, handle=handle, actor=cli_actor(actor), reason=reason)
    if reg.status == reg.Status.PENDING:  # a deactivation whose finding could not search the registry
        command.stdout.write(
            f"{passport_id}: handle {reg.handle} recorded; the drain deactivates the registration by it."
        )
    else:
        command.stdout.write(f"{passport_id}: registered with handle {reg.handle}.")
