import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from odal.core.models import Passport
from outbox.models import Consumer

DEMO_PASSPORTS = [
    ("https://id.example.eu/01/09506000134352/21/BATT-0001", "OP-DEMO-1", "FAC-7", "8507 60"),
    ("https://id.example.eu/01/09506000134352/21/BATT-0002", "OP-DEMO-1", "FAC-7", "8507 60"),
    ("https://id.example.eu/01/04012345000018/21/TEX-0042", "OP-DEMO-2", "FAC-2", "6109 10"),
    # The simulator of `make run` refuses UPIs containing REFUSE as the registry refuses a product
    # (422 with its errors): publish this one to see a registration end rejected, with the reasons.
    ("https://id.example.eu/01/04012345000018/21/REFUSE-0666", "OP-DEMO-2", "FAC-2", "6109 10"),
    # …and is unavailable for UPIs containing OUTAGE (503, nothing kept, every time): publish this
    # one to see a registration retry and stall, then abandon it.
    ("https://id.example.eu/01/04012345000018/21/OUTAGE-0503", "OP-DEMO-2", "FAC-2", "6109 10"),
]


class Command(BaseCommand):
    help = "Load the small demo of `make run` (an admin user, a few passports). Safe to run again."

    def handle(self, *args, **options):
        with transaction.atomic():
            login = self.admin_user()
            created = self.passports()
            self.extras()
        self.stdout.write(f"Demo ready: {created} new passport(s). Admin login: {login}")

    def admin_user(self) -> str:
        password_file = settings.VAR_DIR / "demo-admin-password"
        User = get_user_model()
        if not User.objects.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "admin@example.invalid", password)
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(password + "\n")
        password = (
            password_file.read_text().strip()
            if password_file.exists()
            else "(set before; see createsuperuser)"
        )
        return f"admin / {password}"

    def passports(self) -> int:
        created = 0
        for upi, operator, facility, commodity in DEMO_PASSPORTS:
            _, was_created = Passport.objects.get_or_create(
                upi=upi,
                defaults={"operator_id": operator, "facility_id": facility, "commodity_code": commodity},
            )
            created += was_created
        return created

    def extras(self) -> None:
        # The demo webhook consumer: `odal up` runs its receiver on port 8200.
        Consumer.objects.get_or_create(
            name="demo-receiver",
            defaults={"kind": "webhook", "url": "http://127.0.0.1:8200/hooks", "event_types": ["passport.*"]},
        )
