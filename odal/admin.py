from django.contrib import admin, messages
from django.db import models
from django.utils.html import format_html

from odal import lifecycle
from odal.errors import Refused
from odal.models import ApiToken, AuditEntry, Passport

admin.site.site_header = "odal back office"
admin.site.site_title = "odal"
admin.site.index_title = "Passports, registry and event outbox"


# Admin forms read a URL typed without a scheme as https (Django 6's default, asked for now).
URL_FORMFIELDS = {models.URLField: {"assume_scheme": "https"}}


def actor_of(request) -> str:
    return f"user:{request.user.get_username()}"


@admin.register(Passport)
class PassportAdmin(admin.ModelAdmin):
    formfield_overrides = URL_FORMFIELDS
    list_display = ["upi", "operator_id", "status", "created_at", "published_at"]
    list_filter = ["status"]
    search_fields = ["=id", "upi", "operator_id", "facility_id"]
    readonly_fields = ["id", "status", "created_at", "updated_at", "published_at", "suspended_at"]
    actions = ["publish_selected", "suspend_selected"]

    def get_readonly_fields(self, request, obj=None):
        # The upi is what the registry knows the passport by: fixed once created.
        return [*self.readonly_fields, "upi"] if obj else self.readonly_fields

    def has_publish_permission(self, request):
        return request.user.has_perm("odal.publish_passport")

    def has_suspend_permission(self, request):
        return request.user.has_perm("odal.suspend_passport")

    def _run(self, request, queryset, step, verb):
        changed, unchanged, refused = 0, 0, []
        for passport in queryset:
            try:
                result = step(passport.pk, actor=actor_of(request))
            except Refused as exc:
                refused.append(f"{passport.upi}: {exc.detail}")
                continue
            if result.changed:
                changed += 1
            else:
                unchanged += 1
        total = changed + unchanged + len(refused)
        self.message_user(
            request,
            f"{verb} {changed} of {total} selected; {unchanged} already were.",
            messages.SUCCESS if changed else messages.WARNING,
        )
        for line in refused:
            self.message_user(request, line, messages.ERROR)

    @admin.action(description="Publish selected passports", permissions=["publish"])
    def publish_selected(self, request, queryset):
        self._run(request, queryset, lifecycle.publish, "Published")

    @admin.action(description="Suspend selected passports", permissions=["suspend"])
    def suspend_selected(self, request, queryset):
        self._run(request, queryset, lifecycle.suspend, "Suspended")


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "object_link", "reason"]
    list_filter = ["action", "actor"]
    search_fields = ["=object_id", "actor", "reason"]
    date_hierarchy = "at"

    @admin.display(description="object")
    def object_link(self, entry):
        links = {
            "odal.passport": "odal/passport",
            "outbox.delivery": "outbox/delivery",
            "registry.registration": "registry/registration",
        }
        if entry.object_type in links and entry.object_id:
            return format_html(
                '<a href="/admin/{}/{}/change/">{} {}</a>',
                links[entry.object_type],
                entry.object_id,
                entry.object_type,
                entry.object_id,
            )
        return f"{entry.object_type} {entry.object_id}".strip()

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "scope", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope"]
    fields = ["name", "scope"]
    actions = ["revoke_selected"]

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
        self.message_user(
            request,
            f"Token for {token.name}: {plaintext} — copy it now; it is not shown again.",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_selected(self, request, queryset):
        revoked = queryset.revoke()
        self.message_user(request, f"Revoked {revoked} of {queryset.count()} selected.")

    def has_revoke_permission(self, request):
        return request.user.has_perm("odal.add_apitoken")
