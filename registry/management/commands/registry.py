from odal.core.cli import AreaCommand
from registry.cli import drain, registrations, simulate

# In the order `odal registry --help` lists their subcommands.
AREAS = (drain, registrations, simulate)


class Command(AreaCommand):
    help = "The registry outbox: drain, status, show a registration, abandon, record a handle, run the simulator."
    areas = AREAS
