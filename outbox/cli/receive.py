"""odal outbox receive: the demo webhook receiver, which verifies signatures and prints events."""

from django.core.management.base import CommandError

from odal.core import rules
from odal.core.cli import argument, serving
from outbox.models import Consumer
from outbox.receiver import make_server


def add_arguments(sub) -> None:
    receive = sub.add_parser(
        "receive", help="run the demo webhook receiver (verifies signatures, prints events)"
    )
    receive.add_argument("--port", type=argument(rules.port), default=8200)
    receive.add_argument(
        "--consumer",
        type=argument(rules.consumer_filter),
        default="demo-receiver",
        help="whose secret to verify with",
    )
    receive.set_defaults(handler=handle)


def handle(command, *, port, consumer, **_):
    row = Consumer.objects.filter(name=consumer).first()
    if row is None:
        raise CommandError(f"No consumer named {consumer!r}: its secret verifies the signatures.")
    server = serving(lambda: make_server(port, row.secret, command.stdout), port, "demo receiver")
    command.stdout.write(f"Demo receiver for {consumer} on http://127.0.0.1:{port}/hooks")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
