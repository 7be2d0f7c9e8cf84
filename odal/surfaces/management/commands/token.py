from django.core.management.base import BaseCommand, CommandError

from odal.core import rules
from odal.core.cli import argument, subcommands
from odal.core.models import ApiToken, AuditEntry


class Command(BaseCommand):
    help = "Create or revoke API tokens. `odal token create --name N --scope admin` prints the token once."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        create = sub.add_parser("create", help="create a token and print it once")
        create.add_argument("--name", required=True, type=argument(rules.token_name))
        create.add_argument("--scope", required=True, choices=[s.value for s in ApiToken.Scope])
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix (the 8 characters after odal_)")
        revoke.add_argument("prefix", type=argument(rules.token_prefix))
        revoke.add_argument(
            "--actor", type=argument(rules.actor), help="who revokes it, for the audit trail (default: cli)"
        )
        sub.add_parser("list", help="list tokens (never their secrets)")

    def handle(self, *args, action, **options):
        getattr(self, f"do_{action}")(**options)

    def do_create(self, *, name, scope, **_):
        token, plaintext = ApiToken.objects.issue(name=name, scope=scope)
        AuditEntry.objects.record(
            actor="cli", action="token_created", obj=token, details={"name": name, "scope": scope}
        )
        self.stdout.write(plaintext)
        self.stderr.write(f"Created {scope} token '{name}'. Copy it now: it is not shown again.")

    def do_revoke(self, *, prefix, actor=None, **_):
        actor = f"cli:{actor}" if actor else "cli"
        if ApiToken.objects.filter(prefix=prefix).revoke(actor=actor) != 1:
            raise CommandError(f"No live token with prefix {rules.shown(prefix)}.")
        self.stdout.write(f"Revoked token odal_{prefix}_…")

    def do_list(self, **_):
        for t in ApiToken.objects.all():
            state = f"revoked {t.revoked_at:%Y-%m-%d}" if t.revoked_at else "live"
            self.stdout.write(f"odal_{t.prefix}_…  {t.scope:5}  {t.name}  ({state})")
