"""Every job on the page of the thing it acts on: a list action, offered as a button on its
object's page (Django's object tools: the change page's own template block and a URL of the
model admin's get_urls).

A button posts to `<object>/do/<action>/`, which calls the list action itself with a queryset of
that one object: the same two-pass reason page (odal.core.admin_actions.reason_action), the same
write, the same message, and then back to the object's page. It is shown only where the list
action is offered to this person (ModelAdmin.get_actions: its `permissions=[...]`) and the
object's status allows it (the button's `when`); a POST made past either (a stale page, a forged
form) is refused with a message and changes nothing. The status check is the page's: the write
itself stays guarded where it is made (the QuerySet methods)."""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.http import HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import path, reverse


@dataclass(frozen=True)
class Button:
    """A list action offered on its object's page. `when(obj)` says whether the object's status
    allows it; `because` completes "<Label> is not open to this <thing>: …" when it does not."""

    action: str
    when: Callable[[object], bool] = lambda obj: True
    because: str = ""
    danger: bool = False  # gives up, removes or replaces something: shown as a danger


def label_of(description: str) -> str:
    """The button's label: the list action's, without its parenthesised hint ("Publish… (queues
    registration and events)" -> "Publish…")."""
    return description.split(" (", 1)[0].strip()


def hint_of(description: str) -> str:
    head, _, hint = description.partition(" (")
    return hint.rstrip(")") if hint else ""


class ObjectButtons:
    """Mixed into a ModelAdmin (before it): `object_buttons`, its list actions as buttons."""

    object_buttons: list[Button] = []

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name
        own = [
            path(
                "<path:object_id>/do/<str:action>/",
                self.admin_site.admin_view(self.object_button_view),
                name="{}_{}_button".format(*info),
            )
        ]
        return own + super().get_urls()  # (before the admin's own <path:object_id>/ redirect)

    def buttons_for(self, request, obj) -> list[dict]:
        """The buttons this person sees on `obj`'s page, in the order of `object_buttons`, the
        dangerous ones last."""
        offered = self.get_actions(request)
        info = self.model._meta.app_label, self.model._meta.model_name
        shown = []
        for button in self.object_buttons:
            if button.action not in offered or not button.when(obj):
                continue
            description = str(offered[button.action][2])
            shown.append(
                {
                    "action": button.action,
                    "label": label_of(description),
                    "hint": hint_of(description),
                    "danger": button.danger,
                    "url": reverse("admin:{}_{}_button".format(*info), args=[quote(obj.pk), button.action]),
                }
            )
        # The dangerous ones last, set apart from the others.
        shown.sort(key=lambda b: b["danger"])
        safe = sum(not b["danger"] for b in shown)
        if 0 < safe < len(shown):
            shown[safe]["apart"] = True
        return shown

    def object_button_view(self, request, object_id, action):
        opts = self.model._meta
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, opts, object_id)
        change_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(obj.pk)])
        if request.method != "POST":  # (a button is a form: a link followed or a page reloaded)
            return HttpResponseRedirect(change_url)
        button = next((b for b in self.object_buttons if b.action == action), None)
        offered = self.get_actions(request)
        if button is None or action not in offered or not self.has_view_or_change_permission(request, obj):
            self.message_user(
                request,
                f"You may not do that to this {opts.verbose_name}; nothing was changed.",
                messages.ERROR,
            )
            return HttpResponseRedirect(change_url)
        func, _, description = offered[action]
        if not button.when(obj):
            self.message_user(
                request,
                f"{label_of(str(description))} is not open to this {opts.verbose_name}: {button.because} "
                "Nothing was changed.",
                messages.ERROR,
            )
            return HttpResponseRedirect(change_url)
        # For the reason page: its breadcrumbs and "No, take me back" lead here, and a dangerous
        # job's confirm button says so.
        request.odal_back_url, request.odal_object, request.odal_action = change_url, obj, action
        response = func(self, request, self.get_queryset(request).filter(pk=obj.pk))
        if response is not None:
            return response
        if not self.get_queryset(request).filter(pk=obj.pk).exists():  # (removed)
            return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        return HttpResponseRedirect(change_url)

    def is_dangerous(self, action: str) -> bool:
        return any(b.danger for b in self.object_buttons if b.action == action)


def render_buttons(request, model_admin, obj) -> str:
    """The bar of buttons at the top of an object's page (templates/admin/change_form.html)."""
    if not isinstance(model_admin, ObjectButtons) or obj is None or obj.pk is None:
        return ""
    buttons = model_admin.buttons_for(request, obj)
    if not buttons:
        return ""
    context = {"buttons": buttons, "verbose_name": model_admin.model._meta.verbose_name}
    return render_to_string("admin/odal_buttons.html", context, request=request)
