from django.core.management.base import BaseCommand

from odal.cli import refused, subcommands
from odal.errors import Refused
from outbox.cli import consumers, deliveries, purge, receive, replay, sweep

# In the order `odal outbox --help` lists their subcommands.
AREAS = (sweep, deliveries, replay, purge, receive, consumers)


class Command(BaseCommand):
    help = "The event outbox: sweep, status, show, replay or resend deliveries, purge old rows, manage consumers."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        for area in AREAS:
            area.add_arguments(sub)

    def handle(self, *args, action, handler, **options):
        try:
            handler(self, **options)
        except Refused as exc:
            raise refused(exc) from None
