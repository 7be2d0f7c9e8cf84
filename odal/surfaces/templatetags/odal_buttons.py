"""The tags of odal.core.admin_buttons' templates: the bar of an object's buttons, and the look of a
dangerous job's confirm button on its reason page."""

from django import template
from django.contrib import admin

from odal.core.admin_buttons import ObjectButtons, render_buttons

register = template.Library()


@register.simple_tag(takes_context=True)
def odal_object_buttons(context):
    adminform = context.get("adminform")
    if adminform is None:
        return ""
    return render_buttons(context["request"], adminform.model_admin, context.get("original"))


@register.simple_tag(takes_context=True)
def odal_danger_class(context):
    """ " odal-danger" on the reason page of a dangerous job, from its list action or its button."""
    opts, request = context.get("opts"), context.get("request")
    action = context.get("action") or getattr(request, "odal_action", "")
    model_admin = admin.site._registry.get(opts.model) if opts is not None else None
    if isinstance(model_admin, ObjectButtons) and model_admin.is_dangerous(action):
        return " odal-danger"
    return ""
