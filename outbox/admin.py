from django import forms
from django.contrib import admin, messages
from django.db import connection, transaction

from odal import rules
from odal.admin import OdalAdmin, ReadOnlyAdmin, ReadOnlyInline, actor_of
from odal.admin_actions import StorableFormMixin, reason_action
from odal.errors import Refused
from odal.models import AuditEntry
from outbox.consumers import check_python_target, check_webhook_url
from outbox.events import check_event_pattern
from outbox.models import Consumer, DeadLetter, Delivery, DeliveryAttempt, Event


class ConsumerForm(StorableFormMixin, forms.ModelForm):
    """A consumer as the API and `odal outbox consumer add` take it: each field through its rule
    (odal.rules), the URL or target through the consumer's own checks."""

    url = forms.URLField(max_length=2000, required=False, assume_scheme="https")

    class Meta:
        model = Consumer
        fields = ["name", "kind", "url", "target", "event_types", "max_attempts", "timeout_seconds"]

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
            raise forms.ValidationError('Event types must be a JSON list of names, e.g. ["passport.*"].')
        try:
            return [check_event_pattern(pattern) for pattern in patterns]
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean(self):
        data = super().clean()
        kind = data.get("kind") or (self.instance.kind if self.instance.pk else None)
        try:
            if kind == Consumer.Kind.WEBHOOK:
                check_webhook_url(data.get("url") or "")
            elif kind == Consumer.Kind.PYTHON:
                check_python_target(data.get("target") or "")
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None
        return data


@admin.register(Consumer)
class ConsumerAdmin(OdalAdmin):
    form = ConsumerForm
    list_display = [
        "name",
        "kind",
        "url",
        "target",
        "event_types",
        "max_attempts",
        "timeout_seconds",
        "paused",
    ]
    list_filter = ["kind", "paused"]
    search_fields = ["name", "url", "target"]

    def get_readonly_fields(self, request, obj=None):
        return ["name", "kind"] if obj else []

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            AuditEntry.objects.record(
                actor=actor_of(request), action="consumer_changed" if change else "consumer_created", obj=obj
            )
        if not change:
            self.message_user(
                request,
                f"Signing secret of {obj.name}: {obj.secret} — copy it now; it is not shown again.",
                messages.WARNING,
            )


class AttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    fields = ["number", "started_at", "finished_at", "outcome", "http_status", "duration_ms", "late", "error"]
    ordering = ["started_at", "id"]


def event_types() -> list[str]:
    """The distinct event types, found by hopping through the index on outbox_event.type (a
    recursive query: one index probe per type), not by reading every event as SELECT DISTINCT
    does: the same cost over ten million events as over ten thousand."""
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE types(type) AS (
                SELECT (SELECT type FROM {table} ORDER BY type LIMIT 1)
                UNION ALL
                SELECT (SELECT type FROM {table} WHERE type > types.type ORDER BY type LIMIT 1)
                FROM types WHERE types.type IS NOT NULL
            )
            SELECT type FROM types WHERE type IS NOT NULL
            """
        )
        return [row[0] for row in cursor.fetchall()]


class EventTypeFilter(admin.SimpleListFilter):
    """Filter by event type, listing the types without a scan (see event_types)."""

    title = "event type"
    parameter_name = "event_type"
    field = "event__type"

    def lookups(self, request, model_admin):
        return [(t, t) for t in event_types()]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class TypeFilter(EventTypeFilter):
    parameter_name = "type"
    field = "type"


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "event_type",
        "consumer",
        "status",
        "attempts",
        "max_attempts",
        "next_attempt_at",
        "short_error",
    ]
    list_filter = ["status", "consumer", EventTypeFilter]
    search_fields = [
        "=id",
        "=event__id",
        "consumer__name",
        "event__type",
        "event__payload__dppId",
        "event__payload__upi",
    ]
    list_select_related = ["event", "consumer"]
    readonly_fields = [
        "id", "event", "consumer", "status", "attempts", "max_attempts", "next_attempt_at", "claim_token",
        "last_error", "delivered_at", "dead_at", "created_at", "payload",
    ]  # fmt: skip
    fields = readonly_fields
    inlines = [AttemptInline]
    actions = ["replay_selected"]

    @admin.display(description="event type", ordering="event__type")
    def event_type(self, delivery):
        return delivery.event.type

    @admin.display(description="last error")
    def short_error(self, delivery):
        return delivery.last_error[:80]

    @admin.display(description="event payload")
    def payload(self, delivery):
        return delivery.event.payload

    def has_replay_permission(self, request):
        return request.user.has_perm("outbox.replay_delivery")

    @admin.action(description="Replay… (dead deliveries, with a reason)", permissions=["replay"])
    def replay_selected(self, request, queryset):
        selected = queryset.count()

        def perform(data):
            try:
                replayed = queryset.replay(actor=actor_of(request), reason=data["reason"])
            except Refused as exc:
                self.message_user(request, exc.detail, messages.ERROR)
                return
            skipped = selected - replayed
            note = f"; {skipped} were not dead" if skipped else ""
            level = messages.SUCCESS if replayed else messages.WARNING
            self.message_user(request, f"Replayed {replayed} of {selected} selected{note}.", level)

        dead = queryset.filter(status=Delivery.Status.DEAD).count()
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
            headers=["event", "consumer", "status", "attempts", "last error"],
            rows=[
                (d.event.type, d.consumer.name, d.status, d.attempts, d.last_error[:120] or "—")
                for d in queryset.select_related("event", "consumer")[:50]
            ],
            perform=perform,
        )


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "type", "created_at"]
    list_filter = [TypeFilter]
    search_fields = ["=id", "type"]
    readonly_fields = ["id", "type", "payload", "created_at"]


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
    """The dead-letter list: dead deliveries, by consumer and kind of error, replayable."""

    list_display = ["id", "event_type", "consumer", "attempts", "dead_at", "short_error"]
    list_filter = ["consumer", ErrorKindFilter, EventTypeFilter]
    ordering = ["-dead_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(status=Delivery.Status.DEAD)
