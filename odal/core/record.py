"""How the admin writes the record (issue 38, item 6): one time format with its zone, JSON as
JSON, short ids with the whole one a hover or a click away, words for a plain no, settled rows
without a next attempt, an audit trail that names its objects and finds them by index, and the
internals (claim tokens, django-q2's tables) kept for superusers."""

import json
import re

from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from odal.core.models import AuditEntry

# -- times ------------------------------------------------------------------------------------

# Django's DATETIME_FORMAT for every date the admin shows by itself (odal/core/formats/en/formats.py:
# "Y-m-d H:i:s T"); when() is the same for the lines odal writes out itself.
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def when(moment) -> str:
    """`moment` to the second, in the node's zone, named: "2026-12-05 19:53:21 UTC"."""
    if moment is None:
        return "—"
    local = timezone.localtime(moment)
    return f"{local.strftime(TIME_FORMAT)} {local.tzname()}"


# -- JSON, ids, words -------------------------------------------------------------------------


SHOWN_CAP = 64 * 1024  # characters of one payload or answer shown (an answer is kept up to 64 KiB)
_SURROGATE = re.compile("[\ud800-\udfff]")


def pretty_text(value, *, sort_keys: bool = False) -> str:
    """`value` (JSON text, or what JSON text decodes to) indented for a person to read; text that
    is not JSON as it is. Whatever was stored, never a 500 and never a page without end: JSON
    nested deeper than Python recurses, or a number longer than Python reads, is shown as stored;
    a lone surrogate (stored as the escape \\ud800, which PostgreSQL's text keeps but UTF-8 cannot
    encode) is shown as that escape; past SHOWN_CAP characters the rest is counted, not shown."""
    text = value if isinstance(value, str) else None
    try:
        if text is not None:
            value = json.loads(text)
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys)
    except (TypeError, ValueError, RecursionError):
        text = text if text is not None else str(value)
    text = _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
    if len(text) > SHOWN_CAP:
        text = f"{text[:SHOWN_CAP]}\n… ({len(text) - SHOWN_CAP:,} more characters not shown)"
    return text


def pretty_json(value) -> SafeString:
    """A payload or an answer as indented JSON in a wrapping <pre>; text that is not JSON as it
    is (an answer may be anything), bounded (pretty_text)."""
    if isinstance(value, str) and not value:
        return format_html('<span class="odal-quiet">{}</span>', "(empty)")
    return format_html('<pre class="odal-json">{}</pre>', pretty_text(value))


SHORT = 8


def short_id(value, url: str | None = None) -> SafeString:
    """An id's first SHORT characters; the whole one in its title (a hover) and, given `url`, a
    click away (the object's page shows it whole)."""
    whole = str(value)
    shown = whole if len(whole) <= SHORT + 1 else f"{whole[:SHORT]}…"
    if url:
        return format_html('<a class="odal-id" href="{}" title="{}">{}</a>', url, whole, shown)
    return format_html('<span class="odal-id" title="{}">{}</span>', whole, shown)


def yes_or_no(value: bool, yes: str, no: str = "—") -> str:
    """A flag as a word (a red cross reads as "bad", and a plain no is not)."""
    return yes if value else no


def next_attempt(row, settled: tuple) -> str:
    """A row's next attempt, or "settled": a delivered or dead row has no next attempt."""
    return "— (settled)" if row.status in settled else when(row.next_attempt_at)


# -- a delivery's attempt log, replays and resends among its lines ----------------------------

SENT_AGAIN = {"delivery_replayed": "replayed", "delivery_resent": "resent"}


LOG_LINES = 100  # of a delivery's attempt log and its replays, the newest shown on its page


def delivery_log(delivery) -> SafeString:
    """The attempt log of `delivery` with each replay and resend (its audit entry: who, why) as a
    line of its own, in time order. Read by indexes: attempt_by_delivery_idx, the trail's
    object_id index."""
    attempts = list(delivery.attempt_log.order_by("-started_at", "-id")[: LOG_LINES + 1])
    again = AuditEntry.objects.filter(
        object_type="outbox.delivery", object_id=str(delivery.pk), action__in=list(SENT_AGAIN)
    ).order_by("-at", "-id")[: LOG_LINES + 1]
    lines = [(a.started_at, 0, a.pk, a) for a in attempts] + [(e.at, 1, e.pk, e) for e in again]
    if not lines:
        return format_html('<p class="odal-quiet">{}</p>', "No attempt yet.")
    lines.sort(key=lambda t: t[:3])
    rows = []
    if len(lines) > LOG_LINES:  # (a delivery replayed again and again: the page stays a page)
        lines = lines[-LOG_LINES:]
        rows.append(format_html(
            '<tr class="odal-again"><td colspan="6">{}</td></tr>',
            f"Earlier lines not shown: these are the newest {LOG_LINES} of its attempts and replays.",
        ))  # fmt: skip
    for _, kind, _, line in lines:
        if kind == 1:
            before = line.details.get("previousAttempts")
            rows.append(format_html(
                '<tr class="odal-again"><td>{}</td><td colspan="5"><b>{} by {}</b> — “{}”{}</td></tr>',
                when(line.at), SENT_AGAIN[line.action], line.actor, line.reason,
                f" (after {before} attempts; a fresh budget)" if before is not None else "",
            ))  # fmt: skip
            continue
        status = f"HTTP {line.http_status}" if line.http_status else ""
        rows.append(format_html(
            '<tr><td>{}</td><td class="odal-nowrap">{} {}{}</td><td>{}</td><td>{} ms</td><td>{}</td><td>{}</td></tr>',
            when(line.started_at), line.number, line.outcome,
            " (late: not written)" if line.late else "", status, line.duration_ms, line.error or "—",
            answer_of(line),
        ))  # fmt: skip
    return format_html(
        '<div class="odal-log-box"><table class="odal-log"><thead><tr><th>started</th><th>attempt</th>'
        "<th>HTTP</th><th>took</th><th>error</th><th>answer</th></tr></thead><tbody>{}</tbody></table></div>",
        format_html_join("", "{}", ((r,) for r in rows)),
    )


def answer_of(attempt) -> SafeString | str:
    """What the consumer answered: its content type, then the body as JSON where it is JSON."""
    if not attempt.answer and not attempt.content_type:
        return "—"
    kind = (
        format_html('<div class="odal-quiet">{}</div>', attempt.content_type) if attempt.content_type else ""
    )
    return format_html("{}{}", kind, pretty_json(attempt.answer))


# -- the audit trail: names, links, search ----------------------------------------------------

ADMIN_OF = {  # an entry's object_type: (its admin's URL name, the word for it)
    "odal.passport": ("admin:odal_passport_change", "passport"),
    "odal.apitoken": ("admin:odal_apitoken_change", "API token"),
    "outbox.consumer": ("admin:outbox_consumer_change", "consumer"),
    "outbox.delivery": ("admin:outbox_delivery_change", "delivery"),
    "registry.registration": ("admin:registry_registration_change", "registration"),
}


def object_link(entry) -> SafeString | str:
    """ "consumer billing", linked to the consumer's page (an object gone since: its kind and short id)."""
    if not entry.object_type:
        return "—"
    url_name, word = ADMIN_OF.get(entry.object_type, (None, entry.object_type))
    name = getattr(entry, "object_name", None)
    if name is None:
        return format_html("{} {}{}", word, short_id(entry.object_id), " (gone)" if url_name else "")
    try:
        url = reverse(url_name, args=[entry.object_id])
    except NoReverseMatch:
        return f"{word} {name}"
    return format_html('<a href="{}" title="{} {}">{} {}</a>', url, word, entry.object_id, word, name)


class SuperusersOnly:
    """An admin that only superusers see at all (django-q2's task tables: internals)."""

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request) and super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args):
        return self.has_module_permission(request) and super().has_add_permission(request, *args)

    def has_change_permission(self, request, obj=None):
        return self.has_module_permission(request) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self.has_module_permission(request) and super().has_delete_permission(request, obj)


def superusers_only(site, app_label: str) -> None:
    """Make every admin of `app_label` registered on `site` one only superusers see."""
    for model, model_admin in list(site._registry.items()):
        if model._meta.app_label == app_label and not isinstance(model_admin, SuperusersOnly):
            site.unregister(model)
            site.register(model, type(type(model_admin).__name__, (SuperusersOnly, type(model_admin)), {}))


def without_internals(request, fields: list) -> list:
    """`fields` without the claim token unless a superuser asks."""
    if request.user.is_superuser:
        return list(fields)
    return [name for name in fields if name != "claim_token"]


# -- filters named apart ----------------------------------------------------------------------


def titled(title: str):
    """Django's filter of a field with choices, titled `title` ("By passport status") where the
    field's own name would make two filters read "By status"."""
    from django.contrib import admin

    class Titled(admin.ChoicesFieldListFilter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.title = title

    return Titled
