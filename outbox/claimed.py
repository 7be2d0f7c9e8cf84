"""What a sweep pass reads of the deliveries it claimed: plain rows, each with its event whole."""

from outbox.models import Event

# What a pass reads of the rows it claimed (read_claimed): no timestamp of the delivery (each costs
# a parse in Python), the whole event (a Python consumer gets it, a webhook's body is made of it).
CLAIMED = (
    "pk", "event_id", "consumer_id", "attempts", "attempts_before", "event__type", "event__payload",
    "event__created_at",
)  # fmt: skip
EVENT_READ = ("id", "type", "payload", "created_at")  # (in the model's order, as Model.from_db takes them)


class Claimed:
    """A claimed delivery as a pass sees it: its id, consumer and event, and the number of this
    attempt. Not a model instance (making one cost the sweep more than the rest of its read):
    nothing of it is read again or saved, and a field a pass does not read is not there at all,
    so using one fails at once instead of costing a query a row."""

    __slots__ = ("pk", "event_id", "consumer_id", "attempts", "number", "event")

    def __init__(self, pk, event_id, consumer_id, attempts, event, number=None):
        self.pk, self.event_id, self.consumer_id, self.attempts, self.event = (
            pk, event_id, consumer_id, attempts, event,
        )  # fmt: skip
        # Its number in the attempt log: on across replays (attempts counts the budget only).
        self.number = attempts if number is None else number

    def __repr__(self) -> str:
        return f"<Claimed delivery {self.pk} attempt {self.attempts}>"


def read_claimed(taken) -> dict:
    """The rows a pass claimed, by primary key (Claimed, each with its event whole), made from
    one joined read of plain rows: Django's select_related, two model instances and three
    timestamps a row, cost more than the rest of the sweep's own work per delivery."""
    rows, db = {}, taken.db
    for pk, event_id, consumer_id, attempts, before, *event in taken.values_list(*CLAIMED):
        event = Event.from_db(db, EVENT_READ, (event_id, *event))
        rows[pk] = Claimed(pk, event_id, consumer_id, attempts, event, number=before + attempts)
    return rows
