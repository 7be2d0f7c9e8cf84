import json
import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import Q
from django.db.models.fields.json import KT

from odal.core import rules
from odal.core.admin import OdalAdmin, ReadOnlyAdmin, ReadOnlyInline, actor_of, distinct_values
from odal.core.admin_actions import ReasonForm, StorableFormMixin, reason_action, secret_page
from odal.core.admin_buttons import Button, ObjectButtons
from odal.core.errors import Refused
from odal.core.models import Passport
from odal.core.record import (
    delivery_log,
    next_attempt,
    pretty_json,
    short_id,
    titled,
    when,
    without_internals,
    yes_or_no,
)
from odal.core.redact import redacted_url
from odal.core.upi import canonical_upi
from outbox import service
from outbox.checks import consumer_timeout_warning
from outbox.consumers import check_python_target, check_webhook_url
from outbox.events import check_event_pattern
from outbox.health import consumer_health
from outbox.models import Consumer, DeadLetter, Delivery, DeliveryAttempt, Event


class EventTypesField(forms.CharField):
    """Event types typed as names, comma-separated ("passport.*, outbox.test"), shown back so;
    each then checked by check_event_pattern (ConsumerForm.clean_event_types). A JSON list, as
    the form took before, is still read."""

    def prepare_value(self, value):
        # The consumer's list, joined; what was typed, shown again as typed (a refused JSON list
        # may hold a lone surrogate, which the page could not even be sent with).
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        text = super().to_python(value).strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except (ValueError, RecursionError):  # (a list nested deeper than Python recurses)
                raise forms.ValidationError(
                    'Type the event types as names separated by commas, e.g. "passport.*, outbox.test".'
                ) from None
        return [name.strip() for name in text.split(",") if name.strip()]


class ConsumerForm(StorableFormMixin, forms.ModelForm):
    """A consumer as the API and `odal outbox consumer add` take it: each field through its rule
    (odal.core.rules), the URL or target through the consumer's own checks."""

    url = forms.URLField(max_length=2000, required=False, assume_scheme="https")
    # The version of the consumer this form was opened on: a change saved since makes it stale
    # (ConsumerAdmin.save_model refuses it, whatever field either changed).
    opened_at_version = forms.IntegerField(required=False, widget=forms.HiddenInput)
    stale = False  # set by ConsumerAdmin.changeform_view when the guarded write refused this form
    event_types = EventTypesField(
        required=False,
        max_length=10_000,
        help_text='Names separated by commas: exact types or prefixes like "passport.*"; empty means all.',
    )

    class Meta:
        model = Consumer
        fields = ["name", "kind", "url", "target", "event_types", "max_attempts", "timeout_seconds"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["opened_at_version"].initial = self.instance.version

    def clean_name(self):
        return rules.form_value(rules.consumer_name, self.cleaned_data.get("name"))

    def clean_max_attempts(self):
        return rules.form_value(rules.attempt_budget, self.cleaned_data.get("max_attempts"))

    def clean_timeout_seconds(self):
        return rules.form_value(rules.timeout_seconds, self.cleaned_data.get("timeout_seconds"))

    def clean_event_types(self):
        patterns = self.cleaned_data.get("event_types")
        if patterns is None:
            return []
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise forms.ValidationError(
                'Type the event types as names separated by commas, e.g. "passport.*".'
            )
        try:
            return [check_event_pattern(pattern) for pattern in patterns]
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean(self):
        data = super().clean()
        if self.stale:
            raise forms.ValidationError(STALE_FORM)
        kind = data.get("kind") or (self.instance.kind if self.instance.pk else None)
        try:
            if kind == Consumer.Kind.WEBHOOK:
                check_webhook_url(data.get("url") or "")
            elif kind == Consumer.Kind.PYTHON:
                check_python_target(data.get("target") or "")
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None
        return data


STALE_FORM = (
    "Someone else changed this consumer since you opened this form; nothing was saved, so their "
    "change stands. Reload the page to see it, then make yours again."
)


class StaleForm(Exception):
    """save_model's guarded write took no row: the form is older than the consumer."""


@admin.register(Consumer)
class ConsumerAdmin(ObjectButtons, OdalAdmin):
    form = ConsumerForm
    list_display = [
        "name",
        "kind",
        "url",
        "target",
        "event_types_shown",
        "max_attempts",
        "timeout_seconds",
        "paused_shown",
    ]
    list_filter = ["kind", "paused"]
    search_fields = ["name", "url", "target"]

    actions = ["pause_selected", "resume_selected", "rotate_secret", "send_test_event", "delete_selected"]
    object_buttons = [
        Button("pause_selected", when=lambda c: not c.paused, because="it is paused already."),
        Button("resume_selected", when=lambda c: c.paused, because="it is not paused."),
        Button("rotate_secret", when=lambda c: c.kind == Consumer.Kind.WEBHOOK, danger=True,
               because="a Python consumer is called in this process and signs nothing."),
        Button("send_test_event"),
        Button("delete_selected", danger=True),
    ]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):
        shown = ["name", "kind", "paused_shown", "paused_by", "paused_reason"] if obj else []
        # (the add page has no URL to hide: whoever may add a consumer types it)
        return shown if obj is None or self.sees_whole_urls(request, obj) else [*shown, "url_redacted"]

    # A webhook URL whole only to staff who may change consumers (they configure it); to everyone
    # else, Viewers and Operators, without its credentials (odal.core.redact). Nor may they search by
    # it: a search for "token=a", then "token=ab"… would spell the secret out.
    def sees_whole_urls(self, request, obj=None) -> bool:
        return self.has_change_permission(request, obj)

    def get_list_display(self, request):
        if self.sees_whole_urls(request):
            return self.list_display
        return [("url_redacted" if name == "url" else name) for name in self.list_display]

    def get_search_fields(self, request):
        if self.sees_whole_urls(request):
            return self.search_fields
        return [name for name in self.search_fields if name != "url"]

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if obj is None or self.sees_whole_urls(request, obj):
            return fields
        return [("url_redacted" if name == "url" else name) for name in fields if name != "url_redacted"]

    @admin.display(description="event types")
    def event_types_shown(self, consumer):
        return ", ".join(consumer.event_types) or "all"

    @admin.display(description="paused", ordering="paused")
    def paused_shown(self, consumer):
        return yes_or_no(consumer.paused, "paused")

    @admin.display(description="url")
    def url_redacted(self, consumer):
        return redacted_url(consumer.url)

    def has_delete_permission(self, request, obj=None):
        # Removal is the "Remove…" action (delete_selected below): reasoned, guarded, audited.
        # Django's own delete page of one consumer (obj given) would delete it past all three.
        return obj is None and super().has_delete_permission(request)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Its health first (outbox.health; templates/admin/outbox/consumer/health.html)."""
        consumer = self.get_object(request, unquote(object_id))
        if consumer is not None and self.has_view_or_change_permission(request, consumer):
            whole = self.sees_whole_urls(request, consumer)
            extra_context = {
                **(extra_context or {}),
                "consumer_health": consumer_health(consumer, whole_urls=whole),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except StaleForm:
            # Its transaction is rolled back; the same POST again, now shown with the form error.
            request.odal_stale_form = True
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.stale = getattr(request, "odal_stale_form", False)
        return form

    def save_model(self, request, obj, form, change):
        """Through outbox.service, as the API and the command line: checked, audited."""
        data = form.cleaned_data
        if change:
            consumer = Consumer.objects.get(pk=obj.pk)
            # Only the fields this person changed (Django compares the post with the row read now,
            # which the version check below proves is the row the form was opened on). The form
            # shows url and target both; only its kind's is the consumer's.
            own = "url" if consumer.kind == Consumer.Kind.WEBHOOK else "target"
            fields = [
                k for k in (own, "event_types", "max_attempts", "timeout_seconds") if k in form.changed_data
            ]
            version = data.get("opened_at_version")
            try:
                changed = service.change_consumer(
                    consumer,
                    actor=actor_of(request),
                    if_version=-1 if version is None else version,  # (a form without one is no one's)
                    **{k: data[k] for k in fields},
                )
            except Refused as exc:
                if exc.code in ("precondition_failed", "consumer_changed"):
                    raise StaleForm from None
                raise
            if "timeout_seconds" in fields:
                self.warn_of_timeout(request, changed)
            return
        created = service.create_consumer(
            name=data["name"], kind=data["kind"], url=data.get("url"), target=data.get("target"),
            event_types=data.get("event_types") or [], max_attempts=data.get("max_attempts"),
            timeout_seconds=data["timeout_seconds"], actor=actor_of(request),
        )  # fmt: skip
        obj.pk, obj.secret = created.pk, created.secret
        self.warn_of_timeout(request, created)

    def response_add(self, request, obj, post_url_continue=None):
        """The signing secret, on the answer to the POST itself (see secret_page)."""
        return secret_page(
            self, request, title=f"Consumer {obj.name} added", label=f"Signing secret of {obj.name}",
            secret=obj.secret,
            lines=["The consumer checks each request's webhook-signature with it (Standard Webhooks)."],
        )  # fmt: skip

    def warn_of_timeout(self, request, consumer):
        """odal.W001, to the person who set the timeout: the processes running now checked at their
        start, before it, and show it only when they start again."""
        if warning := consumer_timeout_warning(consumer):
            self.message_user(request, warning, messages.WARNING)

    def has_pause_permission(self, request):
        return request.user.has_perm("outbox.pause_consumer")

    def _each(self, request, queryset, data, verb, call):
        done = []
        for consumer in queryset:
            if call(consumer, data):
                done.append(consumer.name)
        skipped = queryset.count() - len(done)
        note = f"; {skipped} already {verb}" if skipped else ""
        self.message_user(
            request,
            f"{verb.capitalize()}: {', '.join(done) or 'none'}{note}.",
            messages.SUCCESS if done else messages.WARNING,
        )

    @admin.action(description="Pause… (its deliveries wait, with a reason)", permissions=["pause"])
    def pause_selected(self, request, queryset):
        def perform(data):
            self._each(request, queryset, data, "paused",
                       lambda c, d: service.pause(c, actor=actor_of(request), reason=d["reason"]))  # fmt: skip

        return reason_action(
            self, request, queryset, title="Pause consumers",
            intro="Their deliveries are still made but wait: none is sent, none spends an attempt, none is "
            "dead-lettered, until they are resumed. Attempts running now finish.",
            perform=perform,
        )  # fmt: skip

    @admin.action(description="Resume… (waiting deliveries flow again)", permissions=["pause"])
    def resume_selected(self, request, queryset):
        def perform(data):
            self._each(request, queryset, data, "resumed",
                       lambda c, d: service.resume(c, actor=actor_of(request), reason=d["reason"]) is not None)  # fmt: skip

        return reason_action(
            self, request, queryset, title="Resume consumers",
            intro="Their waiting deliveries are due again, oldest first, each with at least one attempt left.",
            perform=perform,
        )  # fmt: skip

    @admin.action(description="Rotate the signing secret…", permissions=["change"])
    def rotate_secret(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Rotate one consumer's secret at a time.", messages.ERROR)
            return None
        consumer = queryset.get()

        def perform(data):
            try:
                secret, expires = service.rotate_secret(
                    consumer, actor=actor_of(request), reason=data["reason"], grace=data["grace"]
                )
            except Refused as exc:
                self.message_user(request, exc.detail, messages.ERROR)
                return None
            until = (
                f"The old secret signs beside it until {expires:%Y-%m-%d %H:%M:%S} UTC."
                if expires
                else "The old secret no longer signs."
            )
            return secret_page(
                self, request, title=f"Signing secret of {consumer.name} rotated",
                label=f"New signing secret of {consumer.name}", secret=secret, lines=[until],
            )  # fmt: skip

        return reason_action(
            self, request, queryset, title=f"Rotate the signing secret of {consumer.name}",
            intro="A new secret is made and shown once. During the grace period every request carries both "
            "signatures, so the consumer can switch without a failed delivery; 0 drops the old one at once "
            "(a leaked secret). While an earlier rotation's grace runs, only 0 is accepted.",
            perform=perform, form_class=RotateForm,
        )  # fmt: skip

    @admin.action(description="Send a test event", permissions=["change"])
    def send_test_event(self, request, queryset):
        for consumer in queryset:
            delivery = service.send_test_event(consumer, actor=actor_of(request))
            waiting = " (it waits: the consumer is paused)" if consumer.paused else ""
            self.message_user(
                request, f"Test event sent to {consumer.name}: delivery {delivery.pk}{waiting}."
            )

    @admin.action(description="Remove… (with a reason; only with no delivery owed)", permissions=["delete"])
    def delete_selected(self, request, queryset):
        """Replaces Django's delete_selected: each consumer through service.remove_consumer, the
        same guarded, audited removal as the API's DELETE and `odal outbox consumer remove`."""

        def perform(data):
            removed, refused = [], []
            for consumer in queryset:
                try:
                    service.remove_consumer(consumer, actor=actor_of(request), reason=data["reason"])
                except Refused as exc:
                    refused.append(exc.detail)
                else:
                    removed.append(consumer.name)
            selected = len(removed) + len(refused)
            self.message_user(
                request, f"Removed {len(removed)} of {selected} selected: {', '.join(removed) or 'none'}.",
                messages.SUCCESS if removed else messages.WARNING,
            )  # fmt: skip
            for detail in refused:
                self.message_user(request, detail, messages.ERROR)

        return reason_action(
            self, request, queryset, title="Remove consumers",
            intro="Each goes with its settled deliveries and their attempt lines, every row audited. One "
            "with a delivery pending or paused is not removed (it is owed).",
            perform=perform,
        )  # fmt: skip


class RotateForm(ReasonForm):
    grace = forms.CharField(
        initial="24h",
        help_text="How long the old secret keeps signing beside the new one, e.g. 24h, 90m, 0s.",
    )

    def clean_grace(self):
        return rules.form_value(rules.grace_period, self.cleaned_data.get("grace"))


class AttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    fields = [
        "number", "started_at", "finished_at", "outcome", "http_status", "duration_ms", "late", "error",
        "content_type", "answer",
    ]  # fmt: skip
    ordering = ["started_at", "id"]


def event_types() -> list[str]:
    """The distinct event types, by hopping through the index on outbox_event.type (see
    odal.core.admin.distinct_values)."""
    return distinct_values(Event, "type")


# A passport has a handful of events; a search by its id stops at this many.
SEARCH_EVENTS = 1000


def delivery_search(term: str) -> Q:
    """What the deliveries admin's search box finds for `term` (taken whole): a delivery, an event
    or a passport by its id, a passport by its UPI, a consumer by a part of its name, an event
    type by a part of it. Each by an index, whatever the table's size: the consumers, event types,
    passports and events are looked up first (the consumers and the types are few; a passport's
    events are found by event_dpp_idx), then the deliveries filtered by what was found. Django's
    own search ORs LIKE '%term%' over six columns of three tables, which no index answers: seconds
    over a few million deliveries, and a page that times out over ten million."""
    try:
        as_id = uuid.UUID(term)
    except ValueError:
        as_id = None
    if as_id is not None:
        return Q(pk=as_id) | Q(event_id__in=[as_id, *passport_events([str(as_id)])])
    found = Q(pk__in=[])  # (nothing, where nothing matches)
    consumers = list(Consumer.objects.filter(name__icontains=term).values_list("pk", flat=True))
    if consumers:
        found |= Q(consumer_id__in=consumers)
    types = [t for t in event_types() if term.casefold() in t.casefold()]
    if types:
        found |= Q(event_type__in=types)
    upis = {term}
    try:
        upis.add(canonical_upi(term))
    except ValueError:
        pass
    passports = [str(pk) for pk in Passport.objects.filter(upi__in=upis).values_list("pk", flat=True)]
    if passports:
        found |= Q(event_id__in=passport_events(passports))
    return found


def passport_events(passport_ids: list[str]) -> list[uuid.UUID]:
    """The ids of the events about these passports (their payload's dppId), by event_dpp_idx."""
    # (payload ->> 'dppId', the index's expression)
    events = Event.objects.annotate(dpp=KT("payload__dppId")).filter(dpp__in=passport_ids)
    return list(events.values_list("pk", flat=True)[:SEARCH_EVENTS])


class EventTypeFilter(admin.SimpleListFilter):
    """Filter by event type, listing the types without a scan (see event_types)."""

    title = "event type"
    parameter_name = "event_type"
    field = "event_type"  # (the delivery's copy: delivery_type_idx)

    def lookups(self, request, model_admin):
        return [(t, t) for t in event_types()]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class TypeFilter(EventTypeFilter):
    parameter_name = "type"
    field = "type"


def status_text(delivery: Delivery) -> str:
    """Its status, with the mark of a dead delivery whose consumer answered 2xx late."""
    if delivery.status == Delivery.Status.DEAD and delivery.late_success_at:
        return f"dead — consumer answered 2xx late at {when(delivery.late_success_at)}"
    return delivery.status


class LateSuccessFilter(admin.SimpleListFilter):
    """Dead letters whose consumer answered 2xx to a late attempt, or the others: select all of
    "no" to replay only what the consumer never had."""

    title = "consumer answered 2xx late"
    parameter_name = "late_success"

    def lookups(self, request, model_admin):
        return [("yes", "yes (it has them)"), ("no", "no")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(late_success_at__isnull=self.value() == "no")
        return queryset


@admin.register(Delivery)
class DeliveryAdmin(ObjectButtons, ReadOnlyAdmin):
    list_display = [
        "id_shown",
        "event_type",
        "consumer",
        "status_shown",
        "attempts_shown",
        "next_attempt_shown",
        "short_error",
    ]
    list_filter = [("status", titled("delivery status")), "consumer", EventTypeFilter]
    search_fields = ["id"]  # (the box shows; delivery_search is what it finds)
    search_help_text = (
        "A delivery, event or passport id; a passport's UPI; part of a consumer's name or of an event type."
    )
    list_select_related = ["event", "consumer"]
    readonly_fields = [
        "id", "event", "consumer", "status", "attempts", "max_attempts", "next_attempt_shown", "claim_token",
        "last_error", "delivered_at", "dead_at", "late_success_at", "created_at", "payload", "attempt_log_shown",
    ]  # fmt: skip
    fields = readonly_fields
    actions = ["replay_selected", "resend_selected"]
    object_buttons = [
        Button("replay_selected", when=lambda d: d.status == Delivery.Status.DEAD,
               because="only a dead delivery can be replayed."),
        Button("resend_selected", when=lambda d: d.status in service.RESENDABLE,
               because="only a delivered or dead delivery can be sent again (this one is on its way)."),
    ]  # fmt: skip

    def get_fields(self, request, obj=None):
        return without_internals(request, super().get_fields(request, obj))

    @admin.display(description="id", ordering="created_at")
    def id_shown(self, delivery):
        return short_id(delivery.pk)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_shown(self, delivery):
        return f"{delivery.attempts} of {delivery.max_attempts}"  # (one column: the list fits a laptop)

    @admin.display(description="next attempt at", ordering="next_attempt_at")
    def next_attempt_shown(self, delivery):
        return next_attempt(delivery, (Delivery.Status.DELIVERED, Delivery.Status.DEAD))

    @admin.display(description="attempt log (replays and resends among them)")
    def attempt_log_shown(self, delivery):
        return delivery_log(delivery)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        return (queryset.filter(delivery_search(term)) if term else queryset), False

    @admin.display(description="status", ordering="status")
    def status_shown(self, delivery):
        return status_text(delivery)

    @admin.display(description="consumer answered 2xx late", ordering="late_success_at")
    def late_success(self, delivery):
        return f"at {when(delivery.late_success_at)} — it has it" if delivery.late_success_at else ""

    @admin.display(description="last error")
    def short_error(self, delivery):
        return delivery.last_error[:80]

    @admin.display(description="event payload")
    def payload(self, delivery):
        return pretty_json(delivery.event.payload)

    def has_replay_permission(self, request):
        return request.user.has_perm("outbox.replay_delivery")

    @admin.action(description="Replay… (dead deliveries, with a reason)", permissions=["replay"])
    def replay_selected(self, request, queryset):
        selected = queryset.count()

        def perform(data):
            batches = Batches()
            try:
                replayed = queryset.replay(actor=actor_of(request), reason=data["reason"], progress=batches)
            except Refused as exc:
                self.message_user(request, exc.detail, messages.ERROR)
                return
            skipped = selected - replayed
            note = f"; {skipped} were not dead" if skipped else ""
            level = messages.SUCCESS if replayed else messages.WARNING
            self.message_user(
                request, f"Replayed {replayed} of {selected} selected{batches.said()}{note}.", level
            )

        dead = queryset.filter(status=Delivery.Status.DEAD).count()
        return self._reason_page(request, queryset, selected, dead, perform)

    @admin.action(
        description="Resend… (delivered or dead, same webhook-id, with a reason)", permissions=["replay"]
    )
    def resend_selected(self, request, queryset):
        selected = queryset.count()

        def perform(data):
            batches = Batches()
            try:
                resent = queryset.resend(actor=actor_of(request), reason=data["reason"], progress=batches)
            except Refused as exc:
                self.message_user(request, exc.detail, messages.ERROR)
                return
            skipped = selected - resent
            note = f"; {skipped} were pending or paused (on their way)" if skipped else ""
            self.message_user(
                request,
                f"Resent {resent} of {selected} selected{batches.said()}{note}.",
                messages.SUCCESS if resent else messages.WARNING,
            )

        settled = queryset.filter(status__in=service.RESENDABLE).count()
        return reason_action(
            self, request, queryset, title="Resend deliveries",
            intro=(f"{settled} of the {selected} selected deliveries are delivered or dead and will be sent again: "
                   "pending, due now, with a fresh attempt budget and the same webhook-id (consumers "
                   "deduplicate it). The others are left as they are."),
            warning=service.late_success_preview(queryset, verb="resending")["warning"],
            headers=["event", "consumer", "status", "attempts", "last error"],
            rows=self._preview_rows(queryset),
            perform=perform,
        )  # fmt: skip

    def _reason_page(self, request, queryset, selected, dead, perform):
        return reason_action(
            self,
            request,
            queryset,
            title="Replay deliveries",
            intro=(
                f"{dead} of the {selected} selected deliveries are dead and will be replayed: "
                "pending, due now, "
                "with a fresh attempt budget. The others are left as they are."
            ),
            warning=service.late_success_preview(queryset, verb="replaying")["warning"],
            headers=["event", "consumer", "status", "attempts", "last error"],
            rows=self._preview_rows(queryset),
            perform=perform,
        )

    @staticmethod
    def _preview_rows(queryset):
        """The first 50 selected, each dead one its consumer answered 2xx late marked so."""
        return [
            (d.event.type, d.consumer.name, status_text(d), d.attempts, d.last_error[:120] or "—")
            for d in queryset.select_related("event", "consumer")[:50]
        ]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id_shown", "type", "created_at"]
    list_filter = [TypeFilter]
    search_fields = ["=id", "type"]
    readonly_fields = ["id", "type", "payload_shown", "created_at"]
    fields = readonly_fields

    @admin.display(description="id", ordering="created_at")
    def id_shown(self, event):
        return short_id(event.pk)

    @admin.display(description="payload")
    def payload_shown(self, event):
        return pretty_json(event.payload)


class ErrorKindFilter(admin.SimpleListFilter):
    title = "error kind"
    parameter_name = "error_kind"
    KINDS = {
        "http_4xx": ("HTTP 4xx", {"last_error__startswith": "HTTP 4"}),
        "http_5xx": ("HTTP 5xx", {"last_error__startswith": "HTTP 5"}),
        "timeout": ("timed out", {"last_error__startswith": "timed out"}),
        "connection": ("connection error", {"last_error__startswith": "connection error"}),
        "never_reported": ("never reported", {"last_error__contains": "never reported"}),
    }

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in self.KINDS.items()] + [("other", "raised / other")]

    def queryset(self, request, queryset):
        value = self.value()
        if value in self.KINDS:
            return queryset.filter(**self.KINDS[value][1])
        if value == "other":
            for _, lookup in self.KINDS.values():
                queryset = queryset.exclude(**lookup)
            return queryset
        return queryset


@admin.register(DeadLetter)
class DeadLetterAdmin(DeliveryAdmin):
    """The dead-letter list: dead deliveries, by consumer and kind of error, replayable. Those
    whose consumer answered 2xx to a late attempt are marked (it has them)."""

    list_display = [
        "id_shown",
        "event_type",
        "consumer",
        "attempts",
        "dead_at",
        "late_success",
        "short_error",
    ]
    list_filter = ["consumer", ErrorKindFilter, LateSuccessFilter, EventTypeFilter]
    ordering = ["-dead_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(status=Delivery.Status.DEAD)


class Batches:
    """The `progress` of a bulk replay or resend: how many batches (transactions) it took, for
    the report. A refusal part way says so: the batches before it stay written."""

    def __init__(self):
        self.count = self.total = 0

    def __call__(self, batches: int, total: int) -> None:
        self.count, self.total = batches, total

    def said(self) -> str:
        return f" in {self.count:,} batches" if self.count > 1 else ""
