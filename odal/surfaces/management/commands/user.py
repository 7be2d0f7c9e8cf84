from odal.core import rules, second_factor
from odal.core.cli import AreaCommand, argument, cli_actor, subcommands


class Command(AreaCommand):
    help = "People who sign in to the admin: remove a lost second factor (reset-2fa)."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        reset = sub.add_parser(
            "reset-2fa",
            help="remove a user's authenticator and recovery codes (a lost device); they set up a new "
            "one at their next sign-in. Exit 0 also when the user has none (nothing is written)",
        )
        reset.add_argument("name", type=argument(rules.username), help="the user's username")
        reset.add_argument("--reason", required=True)
        reset.add_argument("--actor", type=argument(rules.actor), help="who resets it, for the audit trail")
        reset.set_defaults(handler=reset_2fa)


def reset_2fa(command, *, name, reason, actor, **_):
    removed = second_factor.reset(name, reason=reason, actor=cli_actor(actor))
    if removed:
        command.stdout.write(
            f"Removed the second factor of {name} ({removed} device(s): authenticator and recovery codes); "
            "they set up a new one at their next sign-in."
        )
    else:
        command.stdout.write(f"{name} has no second factor: nothing to reset.")
