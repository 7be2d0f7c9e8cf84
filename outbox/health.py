"""How a consumer is doing (issue 38, item 3): what its admin page leads with, as Svix's and
Hookdeck's endpoint pages do.

Read from its own attempt-log lines by attempt_by_consumer_idx (consumer, outcome, finished_at,
with duration_ms in the index): the 24 hours' counts and answer times are one index range per
outcome, read from the index alone; the last success and the last failure one probe each; the
newest attempts one short range per outcome. Its pending and dead deliveries are counted by
delivery_consumer_status_idx, stopping at COUNT_CAP. So the page costs the same in a table of ten
thousand rows as in one of ten million: what grows is the consumer's own traffic of a day.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode, urlsplit

from django.db.models import Aggregate, Count, FloatField
from django.db.models.functions import TruncHour
from django.urls import reverse
from django.utils import timezone

from odal.core.record import pretty_text
from odal.core.redact import HIDDEN, redacted_url, redacted_urls_in
from outbox.consumers import USER_AGENT, webhook_body
from outbox.models import Consumer, Delivery, DeliveryAttempt

HOURS = 24
RECENT = 20  # attempts shown with their request and answer
COUNT_CAP = 10_000  # pending and dead deliveries counted up to this many ("10,000+" beyond)
OUTCOMES = tuple(DeliveryAttempt.Outcome.values)


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont: the value below which `fraction` of them lie, interpolated
    between the two nearest (as Python's statistics.quantiles(method="inclusive"))."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float):
        super().__init__(expression, fraction=float(fraction))


@dataclass
class Hour:
    start: datetime
    delivered: int = 0
    failed: int = 0  # failed attempts and write errors

    @property
    def total(self) -> int:
        return self.delivered + self.failed


@dataclass
class Attempt:
    """One recent attempt as the page shows it: the request odal sent, and what came back."""

    line: DeliveryAttempt
    method: str
    target: str  # the URL (redacted as the person may see it) or the Python callable
    headers: list[tuple[str, str]]
    body: str  # pretty JSON
    answer: str  # pretty JSON when it is JSON, else as stored
    error: str
    delivery_url: str


@dataclass
class Health:
    consumer: Consumer
    since: datetime
    now: datetime
    counts: dict[str, int]
    hours: list[Hour]
    p50_ms: float | None
    p95_ms: float | None
    last_success: DeliveryAttempt | None
    last_failure: DeliveryAttempt | None
    last_failure_error: str  # redacted as its URL is for this person
    pending: int
    dead: int
    parked: int
    links: dict[str, str]
    endpoint: str  # its URL as this person may see it
    recent: list[Attempt] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return sum(self.counts.values())

    @property
    def success_rate(self) -> float | None:
        """Delivered of the attempts the consumer answered or failed (write errors, the database
        refusing an outcome, are not the consumer's doing), as a percentage; None without any."""
        delivered, failed = self.counts["delivered"], self.counts["failed"]
        return None if delivered + failed == 0 else 100 * delivered / (delivered + failed)

    @property
    def rate_shown(self) -> str:
        rate = self.success_rate
        return "—" if rate is None else f"{rate:.1f}%"

    @property
    def tone(self) -> str:
        rate = self.success_rate
        if rate is None:
            return ""
        return "good" if rate >= 99 else "warn" if rate >= 90 else "bad"

    @property
    def peak(self) -> int:
        return max([1] + [h.total for h in self.hours])

    @property
    def bars(self) -> list[dict]:
        """The chart's geometry (an SVG of 24 stacked bars): numbers only, nothing from users."""
        width, height, top, left = 720, 150, 8, 30
        plot = height - top - 22
        slot = (width - left - 4) / HOURS
        out = []
        for i, hour in enumerate(self.hours):
            ok_h = plot * hour.delivered / self.peak
            fail_h = plot * hour.failed / self.peak
            x = left + i * slot + 1
            out.append({
                "hour": hour, "x": f"{x:.1f}", "w": f"{slot - 3:.1f}",
                "ok_y": f"{top + plot - ok_h:.1f}", "ok_h": f"{ok_h:.1f}",
                "fail_y": f"{top + plot - ok_h - fail_h:.1f}", "fail_h": f"{fail_h:.1f}",
                "label_x": f"{x + (slot - 3) / 2:.1f}", "labelled": i % 3 == 0,
            })  # fmt: skip
        return out

    @property
    def chart_box(self) -> dict:
        return {"width": 720, "height": 150, "base": 150 - 22, "left": 30, "top": 8}


def _shown(n: int) -> str:
    return f"{COUNT_CAP:,}+" if n > COUNT_CAP else f"{n:,}"


def consumer_health(consumer: Consumer, *, whole_urls: bool, now: datetime | None = None) -> Health:
    """The figures of `consumer`'s page. `whole_urls`: the person may change consumers and sees
    its URL whole; everyone else sees it as odal.core.redact shows it."""
    now = now or timezone.now()
    since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
    lines = DeliveryAttempt.objects.filter(consumer=consumer)
    window = lines.filter(outcome__in=OUTCOMES, finished_at__gte=since, finished_at__lte=now)

    counts = dict.fromkeys(OUTCOMES, 0)
    hours = {since + timedelta(hours=i): Hour(since + timedelta(hours=i)) for i in range(HOURS)}
    by_hour = (
        window.annotate(hour=TruncHour("finished_at"))
        .values("outcome", "hour")
        .annotate(n=Count("*"))
        .order_by()
    )
    for row in by_hour:
        counts[row["outcome"]] += row["n"]
        hour = hours.get(row["hour"])
        if hour is not None:
            if row["outcome"] == DeliveryAttempt.Outcome.DELIVERED:
                hour.delivered += row["n"]
            else:
                hour.failed += row["n"]

    p50 = p95 = None
    if sum(counts.values()):
        found = window.aggregate(p50=Percentile("duration_ms", 0.5), p95=Percentile("duration_ms", 0.95))
        p50, p95 = found["p50"], found["p95"]

    def newest(outcome):
        return lines.filter(outcome=outcome).order_by("-finished_at").select_related("delivery").first()

    recent_lines = sorted(
        (
            line
            for outcome in OUTCOMES
            for line in lines.filter(outcome=outcome)
            .order_by("-finished_at")
            .select_related("delivery__event")[:RECENT]
        ),
        key=lambda line: line.finished_at,
        reverse=True,
    )[:RECENT]

    last_failure = newest(DeliveryAttempt.Outcome.FAILED)

    def capped(status) -> int:
        return Delivery.objects.filter(consumer=consumer, status=status)[: COUNT_CAP + 1].count()

    deliveries = reverse("admin:outbox_delivery_changelist")
    links = {
        "pending": f"{deliveries}?{urlencode({'consumer__id__exact': consumer.pk, 'status__exact': 'pending'})}",
        "parked": f"{deliveries}?{urlencode({'consumer__id__exact': consumer.pk, 'status__exact': 'paused'})}",
        "dead": f"{reverse('admin:outbox_deadletter_changelist')}?{urlencode({'consumer__id__exact': consumer.pk})}",
        "all": f"{deliveries}?{urlencode({'consumer__id__exact': consumer.pk})}",
        "trail": f"{reverse('admin:odal_auditentry_changelist')}?{urlencode({'q': consumer.pk})}",
    }
    return Health(
        consumer=consumer,
        since=since,
        now=now,
        counts=counts,
        hours=list(hours.values()),
        p50_ms=p50,
        p95_ms=p95,
        last_success=newest(DeliveryAttempt.Outcome.DELIVERED),
        last_failure=last_failure,
        last_failure_error=_error_shown(last_failure.error if last_failure else "", whole_urls),
        pending=capped(Delivery.Status.PENDING),
        dead=capped(Delivery.Status.DEAD),
        parked=capped(Delivery.Status.PAUSED) if consumer.paused else 0,
        links=links,
        endpoint=consumer.url if whole_urls else redacted_url(consumer.url),
        recent=[shown_attempt(consumer, line, whole_urls=whole_urls) for line in recent_lines],
    )


def pretty(text: str) -> str:
    """JSON indented for a person to read; anything else as it is; bounded (odal.core.record.pretty_text)."""
    return pretty_text(text, sort_keys=True)


def shown_attempt(consumer: Consumer, line: DeliveryAttempt, *, whole_urls: bool) -> Attempt:
    """What odal sent (rebuilt: the request is not stored, and the same body goes out on every
    attempt) and what came back. Never a credential: the signing secret is not shown, nor the
    signature (it was computed at sending time and is not kept), a URL's userinfo password and
    query values only to whoever may change consumers, Basic credentials never."""
    delivery = line.delivery
    body = pretty(webhook_body(delivery.event))
    if consumer.kind == Consumer.Kind.PYTHON:
        method, target, headers = "call", consumer.target, []
    else:
        method, target = "POST", consumer.url if whole_urls else redacted_url(consumer.url)
        headers = [
            ("content-type", "application/json"),
            ("user-agent", USER_AGENT),
            ("webhook-id", str(delivery.pk)),
            ("webhook-timestamp", f"{int(line.started_at.timestamp())} (about: when the attempt started)"),
            ("webhook-signature", "v1,… (HMAC-SHA256 with the signing secret; not kept, not shown)"),
        ]
        if _has_userinfo(consumer.url):
            headers.insert(0, ("authorization", f"Basic {HIDDEN} (the URL's credentials)"))
    return Attempt(
        line=line,
        method=method,
        target=target,
        headers=headers,
        body=body,
        answer=pretty(line.answer),
        error=_error_shown(line.error, whole_urls),
        delivery_url=reverse("admin:outbox_delivery_change", args=[delivery.pk]),
    )


def _error_shown(error: str, whole_urls: bool) -> str:
    """An attempt's error (an HTTP library's may quote the URL), as its URL is shown."""
    return error if whole_urls else redacted_urls_in(error)


def _has_userinfo(url: str) -> bool:
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:
        return False
