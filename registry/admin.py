from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.utils import timezone

from odal.core.admin import ReadOnlyAdmin, ReadOnlyInline, actor_of
from odal.core.admin_actions import ReasonForm, reason_action
from odal.core.admin_buttons import Button, ObjectButtons
from odal.core.errors import Refused
from odal.core.record import next_attempt, titled, when, without_internals, yes_or_no
from registry import service
from registry.models import UNSEARCHABLE, Registration, RegistrationAttempt, StalledRegistration

# A settled registration has no next attempt (its next_attempt_at is a leftover).
SETTLED = tuple(s for s in Registration.Status.values if s not in ("pending", "submitted"))


def not_checked_note(user, seconds: int) -> str:
    """The start of abandon's "not checked in time" line; the setting's name for superusers only
    (they set it; to staff it is noise)."""
    setting = ", ODAL_ADMIN_REGISTRY_SECONDS" if user.is_superuser else ""
    return f"Not checked in time ({seconds}s for every lookup{setting}), nothing written — "


class HandleForm(ReasonForm):
    handle = forms.CharField(
        max_length=service.MAX_HANDLE_LENGTH,
        help_text="The registry's registrationId, as the registry shows it.",
    )
    field_order = ["handle", "reason"]

    def clean_handle(self):
        try:
            return service.clean_handle(self.cleaned_data.get("handle"))
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None


class AttemptInline(ReadOnlyInline):
    model = RegistrationAttempt
    fields = ["number", "operation", "started_at", "finished_at", "outcome", "answer", "late_shown"]
    verbose_name_plural = "the registry's answers (attempt log)"

    @admin.display(description="late")
    def late_shown(self, attempt):
        return yes_or_no(attempt.late, "late: not written")


def handle_may_be_recorded(reg: Registration) -> bool:
    """Whether "Record handle…" is open to this registration (service.record_handle decides, and
    refuses what changed meanwhile): submitted, or a deactivation whose finding cannot search
    the registry (a person looked it up in the registry's own portal)."""
    if reg.status == Registration.Status.SUBMITTED:
        return True
    return (
        reg.status == Registration.Status.PENDING
        and reg.operation == Registration.Operation.DEACTIVATE
        and not reg.handle
        and reg.last_error.startswith(UNSEARCHABLE)
    )


@admin.register(Registration)
class RegistrationAdmin(ObjectButtons, ReadOnlyAdmin):
    list_display = [
        "passport",
        "status",
        "operation",
        "attempts",
        "next_attempt_shown",
        "short_error",
        "note",
    ]
    list_filter = [("status", titled("registration status")), "operation"]
    search_fields = ["=passport__id", "passport__upi", "correlation_id", "handle"]
    list_select_related = ["passport"]
    readonly_fields = [
        "passport", "status", "operation", "attempts", "next_attempt_shown", "claim_token", "correlation_id",
        "handle", "last_error", "note", "created_at", "queued_at", "submitted_at", "registered_at", "abandoned_at",
        "last_unknown_at", "settles",
    ]  # fmt: skip
    fields = readonly_fields
    inlines = [AttemptInline]
    actions = ["abandon_selected", "record_handle_selected"]
    object_buttons = [
        Button("abandon_selected", danger=True,
               when=lambda r: r.status == Registration.Status.PENDING and r.operation == Registration.Operation.REGISTER,
               because="only a pending registration that owes the registry a register can be abandoned."),
        Button("record_handle_selected", when=handle_may_be_recorded,
               because="a handle can only be recorded while the registry is checking a submission (submitted), "
                       "or for a deactivation whose finding cannot search the registry."),
    ]  # fmt: skip

    def get_fields(self, request, obj=None):
        return without_internals(request, super().get_fields(request, obj))

    @admin.display(description="next attempt at", ordering="next_attempt_at")
    def next_attempt_shown(self, reg):
        return next_attempt(reg, SETTLED)

    @admin.display(description="last error")
    def short_error(self, reg):
        return reg.last_error[:80]

    @admin.display(description="absence provable from")
    def settles(self, reg):
        """When the task list's silence becomes proof (abandon, a suspend's finding)."""
        if reg.settles_at is None:
            return "now (no attempt whose outcome is unknown is still settling)"
        return (
            f"{when(reg.settles_at)}: an attempt whose outcome is unknown ended "
            f"{when(reg.last_unknown_at)}; its register may still reach the registry until then"
        )

    def has_abandon_permission(self, request):
        return request.user.has_perm("registry.abandon_registration")

    def has_record_handle_permission(self, request):
        return request.user.has_perm("registry.record_handle")

    @admin.action(description="Abandon… (registrations the registry never accepted)", permissions=["abandon"])
    def abandon_selected(self, request, queryset):
        """Both passes ask the registry about every selected row at once, within
        ODAL_ADMIN_REGISTRY_SECONDS in all (service.ask_registry_within), so the page comes well
        before the web server's timeout whatever the registry does; a row whose lookup did not
        finish in time reads "not checked" and is not written. The writes are made here, on the
        request's own thread and connection, each the guarded update of finish_abandon."""
        selected = list(queryset.select_related("passport"))
        now = timezone.now()
        refused, to_ask = {}, []
        for reg in selected:
            if reg.status == Registration.Status.ABANDONED:
                continue
            try:
                service.check_abandonable(reg, now)
            except Refused as exc:
                refused[reg.pk] = exc
            else:
                to_ask.append(reg)
        lookups = service.ask_registry_within(
            to_ask, seconds=settings.ODAL_ADMIN_REGISTRY_SECONDS, threads=settings.ODAL_REGISTRY_CONCURRENCY
        )
        for pk, lookup in lookups.items():
            if lookup.refusal is not None:
                refused[pk] = lookup.refusal
        unchecked = [reg for reg in to_ask if not lookups[reg.pk].checked]

        def perform(data):
            abandoned, refusals = 0, []
            for reg in selected:
                if reg.pk in refused:
                    refusals.append(f"{reg.passport.upi}: {refused[reg.pk].detail}")
                elif reg.status != Registration.Status.ABANDONED and lookups[reg.pk].checked:
                    try:
                        service.finish_abandon(reg, actor=actor_of(request), reason=data["reason"])
                    except Refused as exc:
                        refusals.append(f"{reg.passport.upi}: {exc.detail}")
                    else:
                        abandoned += 1
            late = (
                f"; {len(unchecked)} not checked in time: try again"
                if unchecked
                else ". The passports stay published; publishing one again queues a fresh registration"
            )
            self.message_user(
                request,
                f"Abandoned {abandoned} of {len(selected)} selected{late}.",
                messages.SUCCESS if abandoned and not unchecked else messages.WARNING,
            )
            if unchecked:
                self.message_user(
                    request,
                    not_checked_note(request.user, settings.ODAL_ADMIN_REGISTRY_SECONDS)
                    + ", ".join(reg.passport.upi for reg in unchecked),
                    messages.WARNING,
                )
            for line in refusals:
                self.message_user(request, f"Not abandoned — {line}", messages.ERROR)

        return reason_action(
            self,
            request,
            queryset,
            title="Abandon registrations",
            intro=(
                "The registry was asked about each one just now, all at once within "
                f"{settings.ODAL_ADMIN_REGISTRY_SECONDS}s. Only a registration it provably never accepted is "
                "abandoned; it is asked again when you confirm, and a row not checked in time then is left "
                "as it is. The passports stay published."
            ),
            headers=["passport (upi)", "status", "attempts", "last error", "what the registry answered"],
            rows=[
                (
                    reg.passport.upi,
                    reg.status,
                    reg.attempts,
                    reg.last_error or "—",
                    self.registry_answer(reg, refused.get(reg.pk), lookups.get(reg.pk)),
                )
                for reg in selected
            ],
            perform=perform,
        )

    @staticmethod
    def registry_answer(reg, refusal, lookup) -> str:
        if reg.status == Registration.Status.ABANDONED:
            return "already abandoned"
        if refusal is not None:
            return f"cannot be abandoned: {refusal.detail}"
        if not lookup.checked:
            return "not checked, try again: the registry did not answer in time (nothing is written for it)"
        return "the registry holds no submission for it (every page of its task list read): can be abandoned"

    @admin.action(
        description="Record handle… (a submitted registration, or a deactivation that cannot search the registry)",
        permissions=["record_handle"],
    )
    def record_handle_selected(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(
                request, "Select exactly one registration to record its handle.", messages.ERROR
            )
            return None
        reg = queryset.select_related("passport").get()

        def perform(data):
            try:
                done = service.record_handle(
                    reg.passport_id, handle=data["handle"], actor=actor_of(request), reason=data["reason"]
                )
            except Refused as exc:
                self.message_user(request, exc.detail, messages.ERROR)
                return
            if done.status == Registration.Status.PENDING:
                said = "the drain deactivates the registration by it"
            else:
                said = "registered"
            self.message_user(request, f"Recorded handle {data['handle']} for {reg.passport.upi}: {said}.")

        intro = f"{reg.passport.upi} is {reg.status} (correlation id {reg.correlation_id or '—'})."
        if reg.finds_first and reg.status == Registration.Status.PENDING:
            intro = (
                f"{reg.passport.upi} owes a deactivation whose finding looks for what the registry holds; its "
                f"last attempt: {reg.last_error or '—'}. Record the handle you found in the registry's portal: "
                "the drain then deactivates the registration by it."
            )
        return reason_action(
            self,
            request,
            queryset,
            title="Record handle",
            intro=intro,
            rows=[],
            perform=perform,
            form_class=HandleForm,
        )


@admin.register(StalledRegistration)
class StalledRegistrationAdmin(RegistrationAdmin):
    """Pending registrations that need a person: many attempts, or owed for over a day."""

    list_display = ["passport", "operation", "attempts", "queued_at", "next_attempt_at", "short_error"]
    list_filter = ["operation"]
    ordering = ["-attempts"]
    actions = ["abandon_selected", "record_handle_selected"]

    def get_queryset(self, request):
        return super().get_queryset(request).stalled()
