from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.utils import quote, unquote
from django.db import transaction
from django.db.models import ProtectedError
from django.db.models.fields.json import KT
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from odal.core import rules
from odal.core.admin import (
    DistinctValuesFilter,
    OdalAdmin,
    OptionalReasonForm,
    ReadOnlyAdmin,
    actor_of,
)
from odal.core.admin_actions import (
    StorableModelForm,
    reason_action,
    secret_page,
)
from odal.core.admin_buttons import Button, ObjectButtons
from odal.core.errors import Refused
from odal.core.models import ApiToken, AuditEntry, Passport
from odal.core.record import object_link, pretty_json, titled, when
from odal.core.redact import redacted_urls_within
from odal.core.upi import canonical_upi
from odal.surfaces import lifecycle
from odal.surfaces.audit import audit_search, name_objects
from odal.surfaces.story import passport_story
from outbox.models import Delivery, Event
from registry.models import Registration

admin.site.site_header = "odal back office"
admin.site.site_title = "odal"
admin.site.index_title = "Passports, registry and event outbox"


class PassportAdminForm(StorableModelForm):
    """The passport form: the UPI refused or stored canonical (odal.core.upi), the other fields through
    the rules the API and `odal passport create` use (odal.core.rules)."""

    def clean_upi(self):
        try:
            return canonical_upi(self.cleaned_data.get("upi"))
        except ValueError as exc:
            raise forms.ValidationError(f"The UPI {exc}.") from None

    def clean_operator_id(self):
        return rules.form_value(rules.operator_id, self.cleaned_data.get("operator_id"))

    def clean_facility_id(self):
        return rules.form_value(rules.facility_id, self.cleaned_data.get("facility_id"))

    def clean_commodity_code(self):
        return rules.form_value(rules.commodity_code, self.cleaned_data.get("commodity_code"))


class ApiTokenForm(StorableModelForm):
    def clean_name(self):
        return rules.form_value(rules.token_name, self.cleaned_data.get("name"))


# A passport's place in its lifecycle: changed only by publish and suspend (odal.surfaces.lifecycle), which
# also queue the registry work and the events that go with it; never by the admin's form.
LIFECYCLE_FIELDS = ["status", "published_at", "suspended_at"]


def publishable(passport) -> bool:
    """Whether Publish… would do anything (lifecycle.publish, registry.service.on_publish): a
    draft or suspended passport, or a published one whose registration is queued afresh."""
    if passport.status != Passport.Status.PUBLISHED:
        return True
    reg = getattr(passport, "registration", None)  # (None when it has none: RelatedObjectDoesNotExist)
    return reg is not None and reg.status in ("rejected", "abandoned", "suspended", "deactivated")


class PublishedNotDeleted(Exception):
    """A delete of passports found one that has been published under its lock: nothing deleted."""

    def __init__(self, upis):
        super().__init__(upis)
        self.upis = upis


@admin.register(Passport)
class PassportAdmin(ObjectButtons, OdalAdmin):
    form = PassportAdminForm  # stored as the API and the command line store it (odal.core.rules)
    list_display = ["upi", "operator_id", "status", "registration_status", "created_at", "published_at"]
    list_filter = [
        ("status", titled("passport status")),
        ("registration__status", titled("registration status")),
    ]
    search_fields = ["=id", "upi", "operator_id", "facility_id"]
    list_select_related = ["registration"]
    readonly_fields = [
        "id",
        *LIFECYCLE_FIELDS,
        "created_at",
        "updated_at",
        "registration_panel",
        "events_panel",
    ]
    actions = ["publish_selected", "suspend_selected", "delete_selected"]
    object_buttons = [
        Button("publish_selected", when=publishable,
               because="it is published and its registration is not one that publishing queues afresh."),
        Button("suspend_selected", when=lambda p: p.status == Passport.Status.PUBLISHED,
               because="only a published passport can be suspended.", danger=True),
    ]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):
        # The upi is what the registry knows the passport by: fixed once created.
        if obj is None:
            return ["id", *LIFECYCLE_FIELDS, "created_at", "updated_at"]
        return [*self.readonly_fields, "upi"]

    def save_model(self, request, obj, form, change):
        """Audited in the same transaction. A change writes only the fields the form changed (and
        updated_at): never the lifecycle fields, not even as read when the form was loaded, so a
        publish or suspend committing meanwhile is not undone."""
        with transaction.atomic():
            if not change:
                obj.save()
                AuditEntry.objects.record(actor=actor_of(request), action="passport_created", obj=obj)
                return
            fields = list(form.changed_data)  # the lifecycle fields are not in the form (read-only)
            if not fields:
                return
            obj.updated_at = timezone.now()
            values = {name: getattr(obj, name) for name in [*fields, "updated_at"]}
            if Passport.objects.filter(pk=obj.pk).update(**values) != 1:
                self.message_user(
                    request, "The passport was deleted meanwhile; nothing saved.", messages.ERROR
                )
                return
            AuditEntry.objects.record(
                actor=actor_of(request), action="passport_changed", obj=obj, details={"fields": fields}
            )

    def delete_model(self, request, obj):
        self.delete_drafts(request, [obj.pk])

    def delete_queryset(self, request, queryset):
        self.delete_drafts(request, list(queryset.values_list("pk", flat=True)))

    def delete_drafts(self, request, pks):
        """Delete these passports, all drafts, or none: one that has been published (published or
        suspended) meanwhile, with ODAL_REGISTRY_ADAPTER=none no registration protecting it, is
        refused here (PublishedNotDeleted), under the rows' locks, not only by the page."""
        with transaction.atomic():
            doomed = list(
                Passport.objects.filter(pk__in=pks)
                .order_by("pk")
                .select_for_update()
                .values_list("pk", "upi", "status")
            )
            published = [upi for _, upi, status in doomed if status != Passport.Status.DRAFT]
            if published:
                raise PublishedNotDeleted(published)
            # Locked: the delete takes exactly these drafts, or refuses them all (ProtectedError).
            Passport.objects.filter(pk__in=[pk for pk, _, _ in doomed], status=Passport.Status.DRAFT).delete()
            for pk, upi, _ in doomed:
                self._audit_deletion(request, pk, upi)

    @admin.action(description="Delete selected passports (drafts only)", permissions=["delete"])
    def delete_selected(self, request, queryset):
        """Django's delete_selected, for drafts only: a selection holding a passport that has been
        published is refused whole, before the confirmation page (and again under the rows' locks,
        delete_drafts, when it is confirmed)."""
        published = list(queryset.exclude(status=Passport.Status.DRAFT).values_list("upi", flat=True)[:6])
        if published:
            self.refuse_published(request, published)
            return None
        return delete_selected(self, request, queryset)

    def refuse_published(self, request, upis):
        shown = ", ".join(upis[:5]) + (", …" if len(upis) > 5 else "")
        self.message_user(
            request,
            f"Not deleted: {shown} {'has' if len(upis) == 1 else 'have'} been published, and a passport that "
            "has been published is never deleted (the registry may know it); only drafts are. Suspend it "
            "instead. Nothing was deleted.",
            messages.ERROR,
        )

    @staticmethod
    def _audit_deletion(request, pk, upi):
        AuditEntry.objects.record(
            actor=actor_of(request),
            action="passport_deleted",
            object_type=Passport._meta.label_lower,
            object_id=str(pk),
            details={"upi": upi},
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Its story after its fields (odal.surfaces.story; templates/admin/odal/passport/story.html)."""
        passport = self.get_object(request, unquote(object_id))
        if passport is not None and self.has_view_or_change_permission(request, passport):
            extra_context = {**(extra_context or {}), "passport_story": passport_story(passport)}
        return super().change_view(request, object_id, form_url, extra_context)

    @staticmethod
    def deletable(passport) -> bool:
        """Only a draft is deleted: a passport that has been published the registry may know."""
        return passport.status == Passport.Status.DRAFT

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # No Delete on a passport that has been published: delete_view refuses it.
        if obj is not None and not self.deletable(obj):
            context["show_delete"] = False
        return super().render_change_form(request, context, add, change, form_url, obj)

    def delete_view(self, request, object_id, extra_context=None):
        # A message on the passport's page, not Django's "Cannot delete" page (a permission error).
        passport = self.get_object(request, unquote(object_id))
        if passport is not None and not self.deletable(passport):
            self.message_user(
                request,
                f"Not deleted: the passport is {passport.status}, and a passport that has been published is "
                "never deleted (the registry may know it). "
                + (
                    "Suspend it instead."
                    if passport.status == Passport.Status.PUBLISHED
                    else "It stays withdrawn."
                ),
                messages.ERROR,
            )
            return HttpResponseRedirect(reverse("admin:odal_passport_change", args=[quote(passport.pk)]))
        # The confirmation page lists a registration as protecting the passport; one created
        # after that check (a publish meanwhile) is refused by PROTECT here: a message, not a 500.
        try:
            return super().delete_view(request, object_id, extra_context)
        except ProtectedError:
            self.refuse_protected(request)
        except PublishedNotDeleted as exc:
            self.refuse_published(request, exc.upis)
        return HttpResponseRedirect(reverse("admin:odal_passport_change", args=[quote(passport.pk)]))

    def response_action(self, request, queryset):
        try:
            return super().response_action(request, queryset)
        except ProtectedError:
            self.refuse_protected(request)
            return None
        except PublishedNotDeleted as exc:
            self.refuse_published(request, exc.upis)
            return None

    def refuse_protected(self, request):
        self.message_user(
            request,
            "Not deleted: the passport has a registration (it has been published), and a passport "
            "the registry may know is never deleted. Suspend it instead.",
            messages.ERROR,
        )

    def get_fields(self, request, obj=None):
        fields = ["upi", "operator_id", "facility_id", "commodity_code", "data"]
        if obj is None:
            return fields
        return ["id", "status", *fields, "created_at", "published_at", "suspended_at", "registration_panel",
                "events_panel"]  # fmt: skip

    @admin.display(description="registration", ordering="registration__status")
    def registration_status(self, passport):
        reg = getattr(passport, "registration", None)
        return reg.status if reg else "—"

    @admin.display(description="registration")
    def registration_panel(self, passport):
        reg = Registration.objects.filter(passport=passport).first()
        if reg is None:
            return "None: the passport has not been published on this node."
        facts = [
            ("status", reg.get_status_display()),
            ("operation owed", reg.operation if reg.status == "pending" else "—"),
            ("attempts", reg.attempts),
            (
                "next attempt",
                when(reg.next_attempt_at) if reg.status in ("pending", "submitted") else "— (settled)",
            ),
            ("correlation id", reg.correlation_id or "—"),
            ("handle", reg.handle or "—"),
            ("last error", reg.last_error or "—"),
            ("note", reg.note or "—"),
        ]
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", facts)
        answers = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    when(a.finished_at),
                    a.operation,
                    a.outcome,
                    a.answer,
                    "late: not written" if a.late else "",
                )  # fmt: skip
                for a in reg.attempt_log.order_by("-started_at")[:20]
            ),
        )
        link = reverse("admin:registry_registration_change", args=[reg.pk])
        return format_html(
            "<table>{}</table><p><b>The registry's answers</b> (newest first)</p>"
            "<table><tr><th>when</th><th>asked</th><th>outcome</th><th>answer</th><th></th></tr>{}</table>"
            '<p><a href="{}">Open the registration</a> (to abandon it or record a handle)</p>',
            rows,
            answers or format_html("<tr><td colspan=5>{}</td></tr>", "No attempt yet."),
            link,
        )

    @admin.display(description="events and deliveries")
    def events_panel(self, passport):
        # Its events by event_dpp_idx (payload ->> 'dppId'): `event__payload__dppId=` compares JSON
        # values, which no index serves (it walked every event, 261 ms at 200,000; issue 38's bench row).
        events = Event.objects.annotate(dpp=KT("payload__dppId")).filter(dpp=str(passport.pk)).values("pk")
        deliveries = (
            Delivery.objects.filter(event_id__in=events)
            .select_related("event", "consumer")
            .order_by("-event__created_at")[:50]
        )
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
            (
                (
                    when(d.event.created_at),
                    d.event.type,
                    d.consumer.name,
                    reverse("admin:outbox_delivery_change", args=[d.pk]),
                    d.status,
                    d.attempts,
                    d.last_error[:80],
                )
                for d in deliveries
            ),  # fmt: skip
        )
        if not rows:
            return "No events yet."
        return format_html(
            "<table><tr><th>event at</th><th>type</th><th>consumer</th><th>delivery</th><th>attempts</th>"
            "<th>last error</th></tr>{}</table>",
            rows,
        )

    def has_publish_permission(self, request):
        return request.user.has_perm("odal.publish_passport")

    def has_suspend_permission(self, request):
        return request.user.has_perm("odal.suspend_passport")

    def _lifecycle_action(self, request, queryset, step, verb, title, intro):
        selected = list(queryset)

        def perform(data):
            changed, unchanged, refused = 0, 0, []
            for passport in selected:
                try:
                    result = step(passport.pk, actor=actor_of(request), reason=data["reason"])
                except Refused as exc:
                    refused.append(f"{passport.upi}: {exc.detail}")
                    continue
                changed += result.changed
                unchanged += not result.changed
            note = f"; {unchanged} needed no change" if unchanged else ""
            note += f"; {len(refused)} refused" if refused else ""
            self.message_user(request, f"{verb} {changed} of {len(selected)} selected{note}.",
                              messages.SUCCESS if changed else messages.WARNING)  # fmt: skip
            for line in refused:
                self.message_user(request, line, messages.ERROR)

        return reason_action(
            self, request, queryset, title=title, intro=intro, perform=perform, form_class=OptionalReasonForm,
            rows=[f"{p.upi} ({p.status})" for p in selected],
        )  # fmt: skip

    @admin.action(description="Publish… (queues registration and events)", permissions=["publish"])
    def publish_selected(self, request, queryset):
        return self._lifecycle_action(
            request, queryset, lifecycle.publish, "Published", "Publish passports",
            "Publishing makes each passport public, emits passport.published and owes the registry a "
            "registration (a rejected or abandoned one is queued afresh).",
        )  # fmt: skip

    @admin.action(description="Suspend… (withdraws; deactivates registrations)", permissions=["suspend"])
    def suspend_selected(self, request, queryset):
        return self._lifecycle_action(
            request, queryset, lifecycle.suspend, "Suspended", "Suspend passports",
            "Suspending withdraws each passport, emits passport.suspended, and withdraws its pending "
            "registration or owes the registry a deactivation.",
        )  # fmt: skip


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor", "action", "object_link", "reason"]
    # The actions and actors listed by hopping through audit_action_idx and audit_actor_idx; the
    # date drill-down by AuditEntryQuerySet.datetimes: the list opens as fast over ten million
    # entries as over ten thousand.
    list_filter = [("action", DistinctValuesFilter), ("actor", DistinctValuesFilter)]
    search_fields = ["=object_id"]  # (the box shows; odal.surfaces.audit.audit_search is what it finds)
    search_help_text = "An object's id, a passport's UPI, part of a consumer's name or of an actor's."
    date_hierarchy = "at"

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        return (queryset.filter(audit_search(term)) if term else queryset), False

    def get_changelist(self, request, **kwargs):
        class NamingChangeList(super().get_changelist(request, **kwargs)):
            def get_results(self, request):
                super().get_results(request)
                name_objects(self.result_list)  # (a few indexed reads per page, one per kind)

        return NamingChangeList

    def get_fields(self, request, obj=None):
        # Entries written before URLs were redacted in the trail (issue 24) may hold a webhook
        # URL's credentials, and the trail cannot be changed: they are redacted where it is read.
        fields = super().get_fields(request, obj)
        return [
            ("details_shown" if name == "details" else name) for name in fields if name != "details_shown"
        ]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "details_shown"]

    @admin.display(description="details")
    def details_shown(self, entry):
        return pretty_json(redacted_urls_within(entry.details))

    @admin.display(description="object")
    def object_link(self, entry):
        """Its object named and linked: "consumer billing", not "outbox.consumer 2"."""
        if not hasattr(entry, "object_name"):  # (not on a page of the list: named alone)
            name_objects([entry])
        return object_link(entry)


@admin.register(ApiToken)
class ApiTokenAdmin(OdalAdmin):
    form = ApiTokenForm
    list_display = ["name", "scope", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope"]
    fields = ["name", "scope"]
    actions = ["revoke_selected"]

    def formfield_for_choice_field(self, db_field, request, **kwargs):
        # Only a superuser may mint an admin token: for anyone else the choice is not offered, and
        # posting it anyway is refused as an invalid choice.
        if db_field.name == "scope" and not request.user.is_superuser:
            kwargs["choices"] = [
                (value, label) for value, label in db_field.get_choices() if value != ApiToken.Scope.ADMIN
            ]
            kwargs["help_text"] = "Only a superuser may create an admin token."
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        token, plaintext = ApiToken.objects.issue(name=obj.name, scope=obj.scope)
        obj.pk = token.pk
        AuditEntry.objects.record(
            actor=actor_of(request),
            action="token_created",
            obj=token,
            details={"name": token.name, "scope": token.scope},
        )
        obj.plaintext = plaintext  # for response_add only; never stored

    def response_add(self, request, obj, post_url_continue=None):
        """The token, on the answer to the POST itself (see secret_page)."""
        return secret_page(
            self, request, title=f"API token {obj.name} created", label=f"Token for {obj.name} ({obj.scope})",
            secret=obj.plaintext, lines=["Send it as Authorization: Bearer <token>."],
        )  # fmt: skip

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_selected(self, request, queryset):
        revoked = queryset.revoke(actor=actor_of(request))
        self.message_user(request, f"Revoked {revoked} of {queryset.count()} selected.")

    def has_revoke_permission(self, request):
        return request.user.has_perm("odal.add_apitoken")
