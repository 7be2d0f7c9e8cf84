"""The figures of the admin dashboard, each with the link to the filtered list behind it, and
the 24-hour chart as server-rendered SVG (no script, no CDN: it works offline)."""

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from odal.core import tally
from outbox.models import Consumer, Delivery, DeliveryAttempt
from outbox.service import outbox_counts
from registry.service import registry_counts


@dataclass
class Figure:
    label: str
    value: int | str
    url: str
    tone: str = ""  # "", "good", "warn", "bad"


def changelist(app: str, model: str, **filters) -> str:
    url = reverse(f"admin:{app}_{model}_changelist")
    return f"{url}?{urlencode(filters)}" if filters else url


def age(moment, now) -> str:
    seconds = int((now - moment).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def outbox_figures(now) -> dict:
    counts = outbox_counts()
    oldest = counts["oldestPendingAt"]
    figures = [
        Figure("pending", counts["pending"], changelist("outbox", "delivery", status__exact="pending")),
        Figure(
            "delivered",
            counts["delivered"],
            changelist("outbox", "delivery", status__exact="delivered"),
            "good",
        ),
        Figure(
            "dead letters",
            counts["dead"],
            changelist("outbox", "deadletter"),
            "bad" if counts["dead"] else "good",
        ),
        Figure(
            "oldest pending",
            age(oldest, now) if oldest else "none",
            changelist("outbox", "delivery", status__exact="pending", o="-9"),
            "warn" if oldest and now - oldest > timedelta(minutes=15) else "",
        ),
    ]
    if counts["deadLateSuccesses"]:  # dead letters their consumer has after all: not to replay blindly
        late = changelist("outbox", "deadletter", late_success="yes")
        figures.insert(3, Figure("dead, but answered 2xx late", counts["deadLateSuccesses"], late, "warn"))
    ids = dict(Consumer.objects.values_list("name", "pk"))
    consumers = [
        {
            "name": row["name"],
            "paused": row["isPaused"],
            "paused_reason": row["pausedReason"],
            "paused_by": row["pausedBy"],
            "cells": [
                Figure(
                    status,
                    row[status],
                    changelist(
                        "outbox", "delivery", status__exact=status, consumer__id__exact=ids[row["name"]]
                    ),
                )
                for status in Delivery.Status.values
            ],
        }
        for row in counts["consumers"]
        if row["name"] in ids
    ]
    return {"figures": figures, "consumers": consumers}


def registry_figures() -> dict:
    counts = registry_counts()
    owed = [
        Figure(status, counts[status], changelist("registry", "registration", status__exact=status))
        for status in ("pending", "submitted", "registered", "rejected", "suspended", "deactivated")
    ]
    owed[2].tone = "good"
    if counts["rejected"]:
        owed[3].tone = "warn"
    apart = [
        Figure(
            "stalled",
            counts["stalled"],
            changelist("registry", "stalledregistration"),
            "bad" if counts["stalled"] else "good",
        ),
        Figure(
            "abandoned",
            counts["abandoned"],
            changelist("registry", "registration", status__exact="abandoned"),
        ),
    ]
    return {"owed": owed, "apart": apart}


def hourly_attempts(now) -> list[tuple]:
    """(hour, delivered, failed) for each of the last 24 hours, oldest first, from the tally's
    hourly buckets (odal.core.tally): the cost of 24 rows, not of the attempt log."""
    start = (now - timedelta(hours=23)).replace(minute=0, second=0, microsecond=0)
    buckets = {start + timedelta(hours=i): [0, 0] for i in range(24)}
    for (hour, key), n in tally.hourly("outbox.attempts", start).items():
        outcome = key.split(":")[0]
        if hour in buckets and outcome in (DeliveryAttempt.Outcome.DELIVERED, DeliveryAttempt.Outcome.FAILED):
            buckets[hour][0 if outcome == DeliveryAttempt.Outcome.DELIVERED else 1] += n
    return [(hour, d, f) for hour, (d, f) in sorted(buckets.items())]


def chart_svg(series: list[tuple]) -> str:
    """Bars per hour: delivered (green) and failed attempts (red), with hour labels."""
    width, height, top, bottom, left = 760, 190, 14, 26, 34
    plot_h = height - top - bottom
    peak = max([1] + [max(d, f) for _, d, f in series])
    slot = (width - left - 6) / len(series)
    bar = max(2.0, slot / 2 - 2)
    parts = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 4}" y2="{top + plot_h}" stroke="#999" stroke-width="1"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" class="axis">{peak}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">0</text>',
    ]
    for i, (hour, delivered, failed) in enumerate(series):
        x = left + i * slot + 1
        for j, (n, cls) in enumerate(((delivered, "ok"), (failed, "fail"))):
            h = plot_h * n / peak
            parts.append(
                f'<rect class="{cls}" x="{x + j * (bar + 1):.1f}" y="{top + plot_h - h:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}"><title>{hour:%H}:00 UTC: {n} {"delivered" if cls == "ok" else "failed"}</title></rect>'
            )
        if i % 3 == 0:
            parts.append(
                f'<text x="{x + bar:.1f}" y="{height - 8}" text-anchor="middle" class="axis">{hour:%H}:00</text>'
            )
    body = "".join(parts)  # only numbers and fixed text: nothing from users
    return mark_safe(
        f'<svg class="odal-chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="Delivery attempts per hour, last 24 hours">{body}</svg>'
    )


def dashboard() -> dict:
    now = timezone.now()
    series = hourly_attempts(now)
    return {
        "outbox": outbox_figures(now),
        "registry": registry_figures(),
        "chart": chart_svg(series),
        "chart_totals": (sum(d for _, d, _ in series), sum(f for _, _, f in series)),
        "now": now,
    }
