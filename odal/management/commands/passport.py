import json

from django.apps import apps as django_apps
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from odal import lifecycle
from odal.cli import parse_uuid, refused, subcommands
from odal.errors import Refused
from odal.models import AuditEntry, Passport
from odal.schemas import check_text, check_upi
from odal.upi import canonicalise_upis


class Command(BaseCommand):
    help = "Create, publish, suspend or show a passport."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        create = sub.add_parser("create", help="create a draft passport")
        create.add_argument("--upi", required=True, help="an https URL, e.g. a GS1 Digital Link")
        create.add_argument("--operator", required=True, help="operator id")
        create.add_argument("--facility", default="")
        create.add_argument("--commodity", default="")
        create.add_argument("--json", action="store_true")
        for name in ("publish", "suspend", "show"):
            p = sub.add_parser(name, help=f"{name} a passport")
            p.add_argument("passport_id")
            p.add_argument("--actor", default="cli")
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
            upi = check_upi(upi)
            operator = check_text(operator, max_length=200, required=True)
        except ValueError as exc:
            raise CommandError(f"Invalid passport: {exc}.") from None
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
        result = lifecycle.publish(parse_uuid(passport_id), actor=f"cli:{actor}")
        self.emit(result.passport, json, f"{result.passport.pk}: {result.detail}")

    def do_suspend(self, *, passport_id, actor, json, **_):
        result = lifecycle.suspend(parse_uuid(passport_id), actor=f"cli:{actor}")
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
        passport = Passport.objects.filter(pk=parse_uuid(passport_id)).first()
        if passport is None:
            raise CommandError(f"No passport {passport_id}.")
        self.emit(passport, json, f"{passport.pk} {passport.status} {passport.upi}")
