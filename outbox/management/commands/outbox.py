from odal.core.cli import AreaCommand
from outbox.cli import consumers, deliveries, purge, receive, replay, sweep

# In the order `odal outbox --help` lists their subcommands.
AREAS = (sweep, deliveries, replay, purge, receive, consumers)


class Command(AreaCommand):
    help = "The event outbox: sweep, status, show, replay or resend deliveries, purge old rows, manage consumers."
    areas = AREAS
