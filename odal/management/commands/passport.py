import json

from django.apps import apps as django_apps
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from odal import lifecycle, rules
from odal.cli import argument, refused, subcommands
from odal.errors import Refused
from odal.models import AuditEntry, Passport
from odal.upi import canonicalise_upis


class Command(BaseCommand):
    help = "Create, publish, suspend or show a passport."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        create = sub.add_parser("create", help="create a draft passport")
        create.add_argument(
            "--upi", required=True, type=argument(rules.upi), help="an https URL, e.g. a GS1 Digital Link"
        )
        create.add_argument("--operator", required=True, type=argument(rules.operator_id), help="operator id")
        create.add_argument("--facility", type=argument(rules.facility_id), default="")
        create.add_argument("--commodity", type=argument(rules.commodity_code), default="")
        create.add_argument("--json", action="store_true")
        for name in ("publish", "suspend", "show"):
            p = sub.add_parser(name, help=f"{name} a passport")
            p.add_argument("passport_id", type=argument(rules.passport_id))
            p.add_argument("--actor", type=argument(rules.actor), default="cli")
            p.add_argument("--json", action="store_true")
        sub.add_parser(
            "canonicalise",
            help="rewrite stored UPIs in their canonical form; passports whose UPIs collide are named, not changed",
        )

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"do_{action}")(**options)
        except Refused as exc:
            raise refused(exc) from None

    def emit(self, passport, as_json, line):
        if as_json:
            self.stdout.write(
                json.dumps({"id": str(passport.pk), "upi": passport.upi, "status": passport.status})
            )
        else:
            self.stdout.write(line)

    def do_create(self, *, upi, operator, facility, commodity, json, **_):
        try:
            with transaction.atomic():
                passport = Passport.objects.create(
                    upi=upi, operator_id=operator, facility_id=facility, commodity_code=commodity
                )
                AuditEntry.objects.record(actor="cli", action="passport_created", obj=passport)
        except IntegrityError:
            raise CommandError("A passport with this upi already exists.") from None
        self.emit(passport, json, f"Created draft passport {passport.pk} for {passport.upi}")

    def do_publish(self, *, passport_id, actor, json, **_):
        result = lifecycle.publish(passport_id, actor=f"cli:{actor}")
        self.emit(result.passport, json, f"{result.passport.pk}: {result.detail}")

    def do_suspend(self, *, passport_id, actor, json, **_):
        result = lifecycle.suspend(passport_id, actor=f"cli:{actor}")
        self.emit(result.passport, json, f"{result.passport.pk}: {result.detail}")

    def do_canonicalise(self, **_):
        with transaction.atomic():
            report = canonicalise_upis(django_apps)
        self.stdout.write("\n".join(report.lines()))
        if report.collisions or report.invalid:
            raise CommandError(
                "Some passports were left unchanged (listed above): see docs/runbook.md, 'UPIs'.",
                returncode=1,
            )

    def do_show(self, *, passport_id, json, **_):
        passport = Passport.objects.filter(pk=passport_id).first()
        if passport is None:
            raise CommandError(f"No passport {passport_id}.")
        self.emit(passport, json, f"{passport.pk} {passport.status} {passport.upi}")
