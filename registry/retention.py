"""Registry retention: the registry's attempt lines a purge deletes (outbox.retention walks them,
`regattempt_finished_idx`, beside the outbox's rows and in the same run's time; added to every
purge by RegistryConfig.ready). The registration's status is read when the purge runs, and
restated in its DELETE. Never the lines of a pending or submitted registration: it owes work."""

from datetime import datetime

from django.db.models import F, Q, QuerySet

from outbox import retention
from registry.models import RegistrationAttempt

# Registrations whose attempt log is history: no work is owed on them.
# Those that hold, or were refused, a registration: their lines are ordinary lines.
ORDINARY_REGISTRATIONS = ("registered", "rejected")
# Those that ended without a registration the registry holds, given up by a person or withdrawn:
# their lines are the evidence of what was sent and what the registry answered.
EVIDENCE_REGISTRATIONS = ("abandoned", "suspended", "deactivated")


def old_registry_attempts(before: datetime) -> QuerySet:
    return RegistrationAttempt.objects.filter(finished_at__lt=before)


def registry_attempts_to_purge(before: datetime, evidence_before: datetime) -> QuerySet:
    """The registry's attempt lines finished before `before`, of registrations no claim holds:
    - of a registered or rejected registration, the lines of its current work;
    - finished before `evidence_before` too, the evidence: every line of an abandoned, suspended
      or deactivated registration, and the lines of a registered or rejected one's earlier work
      (attempts that started before its current work was queued: it was published again, or
      suspended, after an outcome its status no longer shows, which may have been an abandon).
    Evidence is never kept shorter than ordinary lines: every line here finished before `before`."""
    ordinary = Q(registration__status__in=ORDINARY_REGISTRATIONS)
    this_work = Q(started_at__gte=F("registration__queued_at"))
    evidence = Q(registration__status__in=EVIDENCE_REGISTRATIONS) | (ordinary & ~this_work)
    return old_registry_attempts(before).filter(
        (ordinary & this_work) | (evidence & Q(finished_at__lt=evidence_before)),
        registration__claim_token__isnull=True,
    )


def walk(run, *, delivered_before: datetime, evidence_before: datetime) -> tuple:
    """Its walk of a purge (outbox.retention.add_walk): the index range, its key, what it takes."""
    lines = registry_attempts_to_purge(delivered_before, evidence_before)
    return old_registry_attempts(delivered_before), "finished_at", run.rows(lines, "registry_attempts")


def add_to_purges() -> None:
    retention.add_walk("registry_attempts", "registry attempt lines", walk)
