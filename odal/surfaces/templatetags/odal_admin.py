from django import template

from odal.core.models import AuditEntry
from odal.surfaces.dashboard import changelist, dashboard

register = template.Library()


@register.simple_tag
def odal_dashboard():
    return dashboard()


@register.simple_tag
def odal_recent_audit(limit=8):
    return {
        "entries": AuditEntry.objects.order_by("-at", "-id")[:limit],
        "url": changelist("odal", "auditentry"),
    }
