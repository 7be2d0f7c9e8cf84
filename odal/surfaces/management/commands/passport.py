import json
import time

from django.apps import apps as django_apps
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, reset_queries, transaction

from odal.core import rules
from odal.core.cli import Progress, argument, refused, subcommands
from odal.core.errors import Refused
from odal.core.models import AuditEntry, Passport
from odal.core.upi import canonicalise_upis
from odal.surfaces import bulk, lifecycle


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
        load = sub.add_parser(
            "import",
            help="create passports from a CSV or JSON lines file (see docs/runbook.md, 'Bulk intake')",
        )
        load.add_argument(
            "file",
            help="JSON lines (one object per line, as POST dpp takes it; .jsonl) or CSV with a header row "
            "naming upi, operatorId, facilityId, commodityCode, data (a JSON object)",
        )
        load.add_argument("--publish", action="store_true", help="publish each passport created")
        load.add_argument(
            "--batch",
            type=argument(rules.bulk_batch),
            default=bulk.MAX_ITEMS,
            help=f"passports per transaction (1 to {bulk.MAX_ITEMS:,})",
        )
        load.add_argument("--actor", type=argument(rules.actor), default="cli")
        load.add_argument("--json", action="store_true", help="the summary, with every problem, as JSON")
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

    def do_import(self, *, file, publish, batch, actor, json, **_):
        """Each batch of rows through bulk.Intake (what POST dpp/bulk does), a problem line per row
        it refused (or that was there already), then a summary; exit 1 if any row was refused."""
        source = bulk.PassportFile.open(file)
        summary = ImportSummary(file=file)
        intake = bulk.Intake(actor=f"cli:{actor}", publish=publish, item="line")
        started = time.monotonic()
        with Progress(self.stdout, total=source.count(), what="rows") as progress:
            for rows in batches(source.rows(), batch):
                self.report(intake.batch(rows), summary, progress, json)
                reset_queries()  # (with DEBUG on, Django keeps every statement: each holds a batch)
        summary.seconds = time.monotonic() - started
        self.stdout.write(summary.as_json_text() if json else summary.line())
        if summary.refused:
            raise CommandError(
                f"{summary.refused:,} of {summary.rows:,} rows were refused (each is named above with why); "
                "the others are in. Fix those rows and run the import again: the passports already in "
                "are reported as existing, not made twice.",
                returncode=1,
            )

    def report(self, results, summary, progress, as_json):
        for result in results:
            summary.add(result)
            if result.error is not None and not as_json:
                progress.close()  # the bar's line, blanked before the problem's
                self.stderr.write(f"line {result.index}: {result.error['detail']}")
        progress(summary.rows)

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


def batches(rows, size: int):
    """`rows` in lists of `size` (the last may be shorter)."""
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class ImportSummary:
    """What an import did, counted row by row."""

    def __init__(self, *, file: str):
        self.file = file
        self.rows = self.created = self.published = self.existing = self.refused = 0
        self.seconds = 0.0
        self.problems = []

    def add(self, result: bulk.ItemResult) -> None:
        self.rows += 1
        if result.id is not None:
            self.created += 1
            self.published += result.published
        elif result.existing:
            self.existing += 1
        else:
            self.refused += 1
        if result.error is not None:
            self.problems.append({"line": result.index, "error": result.error})

    @property
    def per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (
            f"{self.file}: {self.rows:,} rows in {self.seconds:.1f} s ({self.per_second:,.0f} rows/s): "
            f"{self.created:,} created, {self.published:,} published, {self.existing:,} existing, "
            f"{self.refused:,} refused."
        )

    def as_json_text(self) -> str:
        return json.dumps(
            {
                "file": self.file,
                "rows": self.rows,
                "created": self.created,
                "published": self.published,
                "existing": self.existing,
                "refused": self.refused,
                "seconds": round(self.seconds, 3),
                "rowsPerSecond": round(self.per_second, 1),
                "problems": self.problems,
            },
            default=str,
        )
