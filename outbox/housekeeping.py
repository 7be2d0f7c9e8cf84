"""The outbox's housekeeping services (odal.work.services): the sweep's, which a run of passes
runs between its passes, and the slow ones the scheduled purge task runs every 10 minutes."""

import logging

from django.utils import timezone

from odal.work.services import HEARTBEATS, IDEMPOTENCY_KEYS, SCHEDULED_SECONDS, TALLY_COMPACTION, Service
from outbox import retention, service
from outbox.models import Delivery

log = logging.getLogger("outbox.retention")  # (the scheduled run's lines keep their logger)

HOUSEKEEPING_SECONDS = 1.0  # a run of passes parks and unparks paused consumers' rows this often


def unpark_resumed() -> int:
    """The net under a resume (see the models): unpark what a resumed consumer still has parked."""
    unparked = 0
    for consumer_id in Delivery.objects.resumed_consumers_with_parked_rows():  # (one statement)
        unparked += Delivery.objects.unpark(consumer_id=consumer_id)
    return unparked


def copy_event_types() -> int:
    typed = Delivery.objects.copy_event_types()  # (a rolling deploy's stragglers: usually none)
    if typed:
        log.info("gave %d deliveries made without it their event's type", typed)
    return typed


# In this order. A Python consumer whose target ODAL_PYTHON_CONSUMERS does not allow is paused
# before any of its rows can be claimed: a run's services run before its first claim, so at every
# start. Parking only keeps paused rows out of the due index (no claim or dead-lettering takes a
# paused consumer's row anyway). A spent row is never claimed (the claim's filter), so
# dead-lettering it can wait for the run's housekeeping: one statement less in every other pass
# (issue 26, item 7). "No live claim holds it" and "due" by the database's clock (odal.work.claims).
ALLOW_LIST = Service(
    "python allow-list",
    HOUSEKEEPING_SECONDS,
    lambda: len(service.pause_python_consumers_outside_allow_list(now=timezone.now())),
)
PARK = Service("park", HOUSEKEEPING_SECONDS, Delivery.objects.park_paused)
UNPARK = Service("unpark", HOUSEKEEPING_SECONDS, unpark_resumed)
DEAD_LETTER = Service("dead-letter", HOUSEKEEPING_SECONDS, Delivery.objects.dead_letter_exhausted)
SWEEP = (ALLOW_LIST, PARK, UNPARK, DEAD_LETTER)

# The slow ones, each time the schedule runs them (outbox.tasks.purge).
RETENTION = Service("retention", SCHEDULED_SECONDS, retention.scheduled)
EVENT_TYPES = Service("event types", SCHEDULED_SECONDS, copy_event_types)
SCHEDULED = (RETENTION, EVENT_TYPES, TALLY_COMPACTION, HEARTBEATS, IDEMPOTENCY_KEYS)


def said(done: dict) -> str:
    """The scheduled run's one log line, saying what went; returns the purge's summary."""
    report = done[RETENTION.name]
    delivered_before, dead_before, evidence_before = report.cutoffs
    log.info(
        "%s (delivered before %s, dead before %s, registry evidence before %s); deleted %d expired "
        "idempotency keys; folded %d tally buckets, forgot %d idle workers",
        report.summary(),
        f"{delivered_before:%Y-%m-%d %H:%M:%S}Z",
        f"{dead_before:%Y-%m-%d %H:%M:%S}Z",
        f"{evidence_before:%Y-%m-%d %H:%M:%S}Z",
        done[IDEMPOTENCY_KEYS.name],
        done[TALLY_COMPACTION.name],
        done[HEARTBEATS.name],
    )
    return report.summary()
