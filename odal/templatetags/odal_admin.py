from django import template

from odal.dashboard import changelist, dashboard
from odal.models import AuditEntry

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
