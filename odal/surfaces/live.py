"""Pages that refresh their changing parts in place (issue 38, item 2).

A live page polls a small endpoint, `/admin/odal/live/<kind>/[<pk>/]`, which answers a short
JSON *stamp* of what the page shows: status, attempts, next attempt, counts. Each stamp is read
with ONE query over indexes (partial indexes, primary keys, the tally), the same cost at ten
thousand rows as at ten million. The page keeps the stamp it was rendered with; only when a poll
answers another does it fetch itself again and swap its live parts (odal/surfaces/static/odal/live.js).

A stamp says whether work is in flight (`busy`): the page then polls every BUSY_SECONDS, at rest
every REST_SECONDS; a hidden tab does not poll.

The page's own stamp is read before the page reads what it shows (LiveAdmin, and the dashboard's
tag, which runs in the page's head): a change landing between the two makes the page newer than
its stamp (one refetch too many), never older (a page that would sit stale at rest).
"""

import hashlib
import json
import re
import uuid
from datetime import datetime
from decimal import Decimal

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import BigIntegerField, CharField, F, Func, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.http import Http404, JsonResponse
from django.urls import reverse

from odal.core.admin import CappedPaginator
from odal.core.models import AuditEntry, Passport, Tally
from outbox.models import Consumer, DeadLetter, Delivery, DeliveryAttempt, Event
from registry.models import Registration, RegistrationAttempt, StalledRegistration

BUSY_SECONDS = 3
REST_SECONDS = 30
# Readonly fields of object pages that change while work is in flight: live.js swaps each
# `.field-<name> .readonly` (Django's own field markup, kept) as a live part.
LIVE_FIELDS = {
    "passport": ["status", "published_at", "suspended_at", "registration_panel", "events_panel"],
    "registration": [
        "passport", "status", "operation", "attempts", "next_attempt_shown", "correlation_id", "handle",
        "last_error", "note", "submitted_at", "registered_at", "abandoned_at", "last_unknown_at", "settles",
    ],
    "delivery": [
        "status", "attempts", "max_attempts", "next_attempt_shown", "last_error", "delivered_at", "dead_at",
        "late_success_at", "attempt_log_shown",
    ],
    "consumer": ["paused", "paused_by", "paused_reason"],
}  # fmt: skip
# Other parts of object pages that are live as a whole: the registration's attempt log (an inline).
LIVE_PARTS = {"registration": ["#attempt_log-group"]}
LIST_PARTS = [
    "#result_list",
    "#changelist-form .paginator",
    "#changelist-form .action-counter",
    "#changelist-search .quiet",  # ("3 results (Show all)")
]


class CappedCount(Subquery):
    """count(*) of a queryset's first rows, as far as the admin's lists count (CappedPaginator:
    CAP + 1, "more than CAP"): (SELECT count(*) FROM (… LIMIT CAP + 1) capped). Past it a stamp
    still moves on its other parts (the newest attempt, the next claim), and the count costs no
    more at ten million rows than at ten thousand."""

    template = "(SELECT count(*) FROM (%(subquery)s) capped)"
    output_field = IntegerField()

    def __init__(self, queryset: QuerySet):
        super().__init__(queryset.order_by().values("pk")[: CappedPaginator.CAP + 1])


def newest(queryset: QuerySet, field: str = "pk") -> Subquery:
    """The greatest `field` of a queryset: MAX(field), which PostgreSQL reads as one probe of the
    end of the index that leads with it."""
    meta = queryset.model._meta
    return aggregate(queryset, "MAX", field, output_field=meta.pk if field == "pk" else meta.get_field(field))


def aggregate(queryset: QuerySet, function: str, field: str = "pk", output_field=None) -> Subquery:
    """function(field) over a queryset, as a scalar subquery: SELECT COUNT(id) FROM … WHERE …
    (a plain function to Django, so no GROUP BY: one row whatever the queryset matches)."""
    value = Func(F(field), function=function, output_field=output_field or BigIntegerField())
    return Subquery(queryset.order_by().annotate(aggregated=value).values("aggregated")[:1])


def tally_sum(metric: str, key=None) -> Subquery:
    rows = Tally.objects.filter(metric=metric, **({} if key is None else {"key": key}))
    return aggregate(rows, "SUM", "value")


def one_row(**parts) -> dict:
    """Several scalar subqueries (expressions that need no row of their own) in ONE statement:
    SELECT (…) AS a, (…) AS b. Compiled by Django, so it runs on any database Django speaks."""
    query = Passport.objects.none().query.clone()  # (any model: only its compiler is used)
    compiler = query.get_compiler(connection=connection)
    columns, params = [], []
    for name, expression in parts.items():
        sql, p = compiler.compile(expression.resolve_expression(query))
        columns.append(f"{sql} AS {connection.ops.quote_name(name)}")
        params.extend(p)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(columns), params)
        return dict(zip(parts, cursor.fetchone(), strict=True))


def in_flight_deliveries() -> dict:
    return {
        "pending": CappedCount(Delivery.objects.filter(status=Delivery.Status.PENDING)),
        "dead": CappedCount(Delivery.objects.filter(status=Delivery.Status.DEAD)),
        "paused": CappedCount(Delivery.objects.filter(status=Delivery.Status.PAUSED)),
        # A claim pushes a pending row's next attempt past every other (delivery_due_idx's last entry).
        "nextClaim": newest(Delivery.objects.filter(status=Delivery.Status.PENDING), "next_attempt_at"),
        "lastDeadAt": newest(Delivery.objects.filter(status=Delivery.Status.DEAD), "dead_at"),
        "lastAttempt": newest(DeliveryAttempt.objects.all()),  # every attempt's end, by its primary key
        "delivered": tally_sum("outbox.delivered"),
    }


def in_flight_registrations() -> dict:
    return {
        **{f"registry.{s}": tally_sum("registry.status", s) for s in Registration.Status.values},
        "stalled": CappedCount(Registration.objects.stalled()),
        "nextRegistryClaim": newest(
            Registration.objects.filter(status__in=["pending", "submitted"]), "next_attempt_at"
        ),
        "lastRegistryAttempt": newest(RegistrationAttempt.objects.all()),
    }


def dashboard_stamp() -> dict:
    state = one_row(
        **in_flight_deliveries(),
        **in_flight_registrations(),
        consumers=aggregate(Consumer.objects.all(), "SUM", "version"),  # (a pause, resume or change adds one)
        lastAudit=newest(AuditEntry.objects.all(), "at"),
    )
    state["busy"] = bool(state["pending"]) or bool(
        (state["registry.pending"] or 0) + (state["registry.submitted"] or 0)
    )
    return state


def deliveries_stamp() -> dict:
    state = one_row(**in_flight_deliveries())
    state["busy"] = bool(state["pending"])
    return state


def registrations_stamp() -> dict:
    state = one_row(**in_flight_registrations())
    state["busy"] = bool((state["registry.pending"] or 0) + (state["registry.submitted"] or 0))
    return state


def first_row(queryset: QuerySet, *fields, **annotations) -> dict:
    row = queryset.annotate(**annotations).values(*fields, *annotations).first()
    if row is None:
        raise Http404("No such object: it may have been deleted.")
    return row


def registration_stamp(pk) -> dict:
    state = first_row(
        Registration.objects.filter(pk=pk),
        "status", "operation", "attempts", "next_attempt_at", "correlation_id", "handle", "last_unknown_at",
        "passport__status",
        lastAttempt=newest(RegistrationAttempt.objects.filter(registration=OuterRef("pk"))),
    )  # fmt: skip
    state["busy"] = state["status"] in ("pending", "submitted")
    return state


def delivery_stamp(pk) -> dict:
    state = first_row(
        Delivery.objects.filter(pk=pk),
        "status", "attempts", "max_attempts", "next_attempt_at", "delivered_at", "dead_at", "late_success_at",
        lastAttempt=newest(DeliveryAttempt.objects.filter(delivery=OuterRef("pk"))),
    )  # fmt: skip
    state["busy"] = state["status"] == Delivery.Status.PENDING
    return state


def passport_stamp(pk) -> dict:
    # Its events by event_dpp_idx (payload ->> 'dppId'), their deliveries by one_delivery_per_consumer,
    # their attempt lines by attempt_by_delivery_idx: a handful of rows whatever the tables hold.
    if connection.vendor == "postgresql":
        events = Event.objects.annotate(dpp=KT("payload__dppId")).filter(dpp=str(pk)).values("pk")
    else:  # (SQLite compares a key's JSON value)
        events = Event.objects.filter(payload__dppId=str(pk)).values("pk")
    deliveries = Delivery.objects.filter(event__in=events)
    state = first_row(
        Passport.objects.filter(pk=pk),
        "status", "updated_at", "published_at", "suspended_at", "registration__status",
        "registration__attempts", "registration__next_attempt_at", "registration__handle",
        registryLastAttempt=newest(RegistrationAttempt.objects.filter(registration__passport=OuterRef("pk"))),
        deliveries=aggregate(deliveries, "COUNT"),
        pendingDeliveries=aggregate(deliveries.filter(status=Delivery.Status.PENDING), "COUNT"),
        deliveryAttempts=aggregate(deliveries, "SUM", "attempts"),
        attemptLines=aggregate(DeliveryAttempt.objects.filter(delivery__in=deliveries.values("pk")), "COUNT"),
        lastAudit=newest(AuditEntry.objects.filter(object_id=str(pk))),
    )  # fmt: skip
    state["busy"] = state["registration__status"] in ("pending", "submitted") or bool(
        state["pendingDeliveries"]
    )
    return state


def consumer_stamp(pk) -> dict:
    of = Delivery.objects.filter(consumer=OuterRef("pk"))
    state = first_row(
        Consumer.objects.filter(pk=pk),
        "paused", "version", "failures", "failing_since",
        pending=CappedCount(of.filter(status=Delivery.Status.PENDING)),
        dead=CappedCount(of.filter(status=Delivery.Status.DEAD)),
        parked=CappedCount(of.filter(status=Delivery.Status.PAUSED)),
        nextClaim=newest(of.filter(status=Delivery.Status.PENDING), "next_attempt_at"),
        # Its attempts' ends, each a probe of attempt_by_consumer_idx (consumer, outcome, finished_at).
        **{
            f"last_{outcome}": newest(
                DeliveryAttempt.objects.filter(consumer=OuterRef("pk"), outcome=outcome), "finished_at"
            )
            for outcome in DeliveryAttempt.Outcome.values
        },
        delivered=tally_sum("outbox.delivered", Cast(OuterRef("pk"), output_field=CharField())),
    )  # fmt: skip
    state["busy"] = bool(state["pending"])
    return state


# kind: (model whose view permission the stamp asks, stamp function, whether it takes a pk)
KINDS = {
    "dashboard": (None, dashboard_stamp, False),
    "deliveries": (Delivery, deliveries_stamp, False),
    "registrations": (Registration, registrations_stamp, False),
    "passport": (Passport, passport_stamp, True),
    "registration": (Registration, registration_stamp, True),
    "delivery": (Delivery, delivery_stamp, True),
    "consumer": (Consumer, consumer_stamp, True),
}
# The admin's models and the stamp of their pages: object pages, then lists.
OBJECT_KINDS = {Passport: "passport", Registration: "registration", StalledRegistration: "registration",
                Delivery: "delivery", DeadLetter: "delivery", Consumer: "consumer"}  # fmt: skip
LIST_KINDS = {Registration: "registrations", StalledRegistration: "registrations", Delivery: "deliveries",
              DeadLetter: "deliveries"}  # fmt: skip


def answer(kind: str, state: dict) -> dict:
    """The JSON a poll answers: the stamp (a digest of the state), busy or not, and the state."""
    busy = bool(state.pop("busy"))
    shown = {camel(key): plain(value) for key, value in state.items()}
    digest = hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()[:20]
    return {
        "kind": kind,
        "stamp": digest,
        "busy": busy,
        "pollSeconds": BUSY_SECONDS if busy else REST_SECONDS,
        "state": shown,
    }


def camel(name: str) -> str:
    """registration__next_attempt_at, registry.pending -> registrationNextAttemptAt, registryPending."""
    first, *rest = [word for word in re.split(r"__|_|\.", name) if word]
    return first + "".join(word[:1].upper() + word[1:] for word in rest)


def plain(value):
    if isinstance(value, Decimal):  # (a SUM, read without Django's converters)
        return int(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def read(kind: str, pk=None) -> dict:
    _, stamp, takes_pk = KINDS[kind]
    return answer(kind, stamp(pk) if takes_pk else stamp())


def stamp_view(request, kind: str, pk: str | None = None):
    """GET /admin/odal/live/<kind>/[<pk>/]: the stamp of one page, for staff who may view what it
    shows (the dashboard: every staff member, as its page). Behind the admin's login
    (admin.site.admin_view, in odal.urls). Refusals are JSON {detail, code}, as the API's."""
    if kind not in KINDS or (pk is None) == KINDS[kind][2]:
        return refusal(404, "not_found", f"No live page of kind {kind!r}{' with an id' if pk else ''}.")
    model = KINDS[kind][0]
    if model is not None:
        model_admin = admin.site._registry.get(model)
        if model_admin is None or not model_admin.has_view_permission(request):
            return refusal(403, "permission_denied", f"You may not view {model._meta.verbose_name_plural}.")
    try:
        return JsonResponse(read(kind, None if pk is None else model._meta.pk.to_python(pk)))
    except (ValidationError, Http404):
        return refusal(404, "not_found", f"No {model._meta.verbose_name} {pk}: it may have been deleted.")


def refusal(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail, "code": code}, status=status)


def url_of(kind: str, pk=None) -> str:
    if pk is None:
        return reverse("odal_live", args=[kind])
    return reverse("odal_live_object", args=[kind, str(pk)])


def page_config(request, kind: str, pk=None) -> dict:
    """What live.js reads from the page (json_script "odal-live"): where to poll, the stamp the
    page was rendered with, and which of its parts are live beyond its [data-live] elements."""
    polled = read(kind, pk)
    return {
        "url": url_of(kind, pk),
        "stamp": polled["stamp"],
        "pollSeconds": polled["pollSeconds"],
        "busySeconds": BUSY_SECONDS,
        "restSeconds": REST_SECONDS,
        "fields": LIVE_FIELDS.get(kind, []),
        "parts": LIST_PARTS if pk is None and kind != "dashboard" else LIVE_PARTS.get(kind, []),
    }
