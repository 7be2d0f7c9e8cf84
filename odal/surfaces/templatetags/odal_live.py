"""{% odal_live %}: the head of a live page (odal.surfaces.live): live.js and live.css, and the page's
config as JSON (json_script: data, not a script, so a Content-Security-Policy without inline
scripts lets it be). Pages that are not live get only the two files: the busy state of a slow
action (live.js) and of any form or link marked data-busy works everywhere."""

from django import template
from django.urls import resolve

from odal.surfaces import live

register = template.Library()


@register.inclusion_tag("admin/odal_live.html", takes_context=True)
def odal_live(context):
    request = context.get("request")
    config = getattr(request, "odal_live", None)
    if config is None and request is not None and context.get("user", None) is not None:
        match = request.resolver_match or resolve(request.path_info)
        if match.view_name == "admin:index" and request.user.is_active and request.user.is_staff:
            config = live.page_config(request, "dashboard")  # (before the dashboard's figures are read)
    return {"config": config}
