"""Passport UPIs in their canonical form (odal.core.upi.canonical_upi): scheme and host in lower case,
no default port, percent-encoding normalised. Each rewrite gets an audit entry. Passports whose
UPIs collide once spelt canonically (one product, several passports) are not merged: they are
left as they are and named in the output, for a person to resolve (docs/runbook.md, 'UPIs'),
then `odal passport canonicalise` finishes the job."""

import sys

from django.db import migrations

from odal.core.upi import canonicalise_upis


def canonicalise(apps, schema_editor):
    report = canonicalise_upis(apps)
    if report.rewritten or report.collisions or report.invalid:
        lines = ["Canonical UPIs (odal 0004):", *report.lines()]
        sys.stdout.write("\n" + "\n".join(f"  {line}" for line in lines) + "\n")


class Migration(migrations.Migration):
    dependencies = [("odal", "0003_operator_and_viewer_groups")]
    operations = [migrations.RunPython(canonicalise, migrations.RunPython.noop)]
