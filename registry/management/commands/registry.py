from django.core.management.base import BaseCommand

from odal.cli import refused, subcommands
from odal.errors import Refused
from registry.cli import drain, registrations, simulate

# In the order `odal registry --help` lists their subcommands.
AREAS = (drain, registrations, simulate)


class Command(BaseCommand):
    help = "The registry outbox: drain, status, show a registration, abandon, record a handle, run the simulator."

    def add_arguments(self, parser):
        sub = subcommands(parser)
        for area in AREAS:
            area.add_arguments(sub)

    def handle(self, *args, action, handler, **options):
        try:
            handler(self, **options)
        except Refused as exc:
            raise refused(exc) from None
