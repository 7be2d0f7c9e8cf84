"""A passport's story (issue 38, item 4): one time-ordered list, newest first, of its lifecycle,
its registration's attempts (an outcome the registry never answered marked as unknown), its
events and their deliveries, and the audit entries about it, each line linking to its object.

Bounded: each source reads at most LINES of its newest rows by an index (the passport's events
by event_dpp_idx, their deliveries by one_delivery_per_consumer, the registration's attempts by
regattempt_by_registration_idx, the audit entries by their object_id index), and the page shows
the newest LINES of them all, with links to the whole lists when there is more.
"""

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.db import connection
from django.db.models.fields.json import KT
from django.urls import reverse

from odal.core.models import AuditEntry, Passport
from odal.core.redact import redacted_urls_in
from outbox.models import Delivery, Event
from registry.models import Registration, RegistrationAttempt

LINES = 50

# Audit actions that are steps of the passport's own lifecycle (shown as such, with who and why).
LIFECYCLE = {
    "passport_created": "created",
    "passport_published": "published",
    "passport_suspended": "suspended",
    "passport_changed": "changed",
}


@dataclass
class Line:
    at: datetime
    kind: str  # lifecycle, registry, event, delivery, audit
    text: str
    url: str
    outcome: str = ""  # a word shown as a badge (and a CSS class): delivered, unknown, …
    note: str = ""  # a sentence in words beside the badge
    actor: str = ""
    reason: str = ""

    @property
    def kind_shown(self) -> str:
        return {"registry": "registry", "lifecycle": "passport"}.get(self.kind, self.kind)


@dataclass
class Story:
    passport: Passport
    lines: list[Line]
    more: bool  # some source had more than was read, or there were more lines than shown
    links: dict[str, str]


def _admin(name: str, pk) -> str:
    return reverse(f"admin:{name}_change", args=[pk])


def passport_story(passport: Passport) -> Story:
    pid = str(passport.pk)
    passport_url = _admin("odal_passport", passport.pk)
    lines: list[Line] = []
    more = False

    registration = Registration.objects.filter(passport=passport).first()
    if connection.vendor == "postgresql":  # (payload ->> 'dppId', event_dpp_idx's expression)
        events_of = Event.objects.annotate(dpp=KT("payload__dppId")).filter(dpp=pid)
    else:
        events_of = Event.objects.filter(payload__dppId=pid)
    events = list(events_of.order_by("-created_at")[: LINES + 1])
    more |= len(events) > LINES
    events = events[:LINES]
    deliveries = list(
        Delivery.objects.filter(event_id__in=[e.pk for e in events])
        .select_related("consumer", "event")
        .order_by("-created_at")[: LINES + 1]
    )
    more |= len(deliveries) > LINES
    deliveries = deliveries[:LINES]

    objects = {pid: "odal.passport"}
    if registration is not None:
        objects[str(registration.pk)] = "registry.registration"
    objects.update({str(d.pk): "outbox.delivery" for d in deliveries})
    entries = list(AuditEntry.objects.filter(object_id__in=list(objects)).order_by("-at", "-id")[: LINES + 1])
    more |= len(entries) > LINES
    entries = [e for e in entries[:LINES] if objects.get(e.object_id) == e.object_type]

    # The lifecycle: its audit entries say who and why; a step without one (made before the trail
    # recorded it) is told from the passport's own fields.
    told = {e.action for e in entries}
    for action, at in (
        ("passport_created", passport.created_at),
        ("passport_published", passport.published_at),
        ("passport_suspended", passport.suspended_at),
    ):
        if at is not None and action not in told:
            lines.append(Line(at, "lifecycle", LIFECYCLE[action].capitalize(), passport_url))
    links_of = {
        "odal.passport": passport_url,
        "registry.registration": _admin("registry_registration", registration.pk) if registration else "",
    }
    for e in entries:
        url = links_of.get(e.object_type) or _admin("outbox_delivery", e.object_id)
        if e.object_type == "odal.passport" and e.action in LIFECYCLE:
            text, kind = LIFECYCLE[e.action].capitalize(), "lifecycle"
        else:
            text, kind = _audit_text(e), "audit"
        lines.append(Line(e.at, kind, text, url, actor=e.actor, reason=e.reason))

    if registration is not None:
        reg_url = _admin("registry_registration", registration.pk)
        lines.append(Line(registration.created_at, "registry", "Registration owed to the registry", reg_url,
                          actor="system"))  # fmt: skip
        attempts = list(registration.attempt_log.order_by("-started_at", "-id")[: LINES + 1])
        more |= len(attempts) > LINES
        for a in attempts[:LINES]:
            unknown = a.outcome == RegistrationAttempt.UNKNOWN
            note = (
                "the request may have reached the registry; no answer of its own came back"
                if unknown
                else redacted_urls_in(a.answer)[:200]
            )
            if a.late:
                note = f"late, not written: {note}"
            lines.append(Line(a.finished_at, "registry", f"{a.operation.capitalize()} attempt {a.number}", reg_url,
                              outcome=a.outcome, note=note, actor="registry drain"))  # fmt: skip

    for e in events:
        lines.append(
            Line(e.created_at, "event", f"Event {e.type}", _admin("outbox_event", e.pk), actor="system")
        )
    for d in deliveries:
        at = d.delivered_at or d.dead_at or d.created_at
        note = f"{d.attempts} attempt{'s' if d.attempts != 1 else ''}"
        if d.last_error:
            note += f"; last error: {redacted_urls_in(d.last_error)[:160]}"
        lines.append(Line(at, "delivery", f"{d.event.type} → {d.consumer.name}", _admin("outbox_delivery", d.pk),
                          outcome=d.status, note=note))  # fmt: skip

    lines.sort(key=lambda line: line.at, reverse=True)
    more |= len(lines) > LINES
    links = {
        "trail": f"{reverse('admin:odal_auditentry_changelist')}?{urlencode({'q': pid})}",
        "deliveries": f"{reverse('admin:outbox_delivery_changelist')}?{urlencode({'q': pid})}",
        "registration": _admin("registry_registration", registration.pk) if registration else "",
    }
    return Story(passport=passport, lines=lines[:LINES], more=more, links=links)


def _audit_text(entry: AuditEntry) -> str:
    words = entry.action.replace("_", " ")
    return words[:1].upper() + words[1:]
