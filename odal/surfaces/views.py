import hmac
import logging
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from odal.core import tally
from odal.core.metrics import registry
from odal.core.text import error_text
from outbox.models import Delivery

log = logging.getLogger(__name__)


def metrics_token_given(request) -> bool:
    """Whether the request carries `Authorization: Bearer <ODAL_METRICS_TOKEN>`, compared in
    constant time. True when no token is configured (development only: production refuses to
    start without one)."""
    expected = settings.ODAL_METRICS_TOKEN
    if not expected:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


def metrics(request):
    """Prometheus text. Figures are read from the database at scrape time, so every web and
    worker process reports the same numbers."""
    if not metrics_token_given(request):
        response = HttpResponse(
            "# 401 Unauthorized: /metrics needs 'Authorization: Bearer <ODAL_METRICS_TOKEN>'.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        text = generate_latest(registry)
    except (DatabaseError, InterfaceError) as exc:  # the figures are the database's: none to give
        log.warning("/metrics: the database did not answer: %s", error_text(exc))
        return HttpResponse(
            "# 503 Service Unavailable: the database does not answer; no figures can be read.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
            headers={"Retry-After": "5"},
        )
    return HttpResponse(text, content_type=CONTENT_TYPE_LATEST)


def healthz(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (DatabaseError, InterfaceError) as exc:
        log.warning("/healthz: the database did not answer: %s", error_text(exc))
        return not_ready("database_unreachable", "The database does not answer.")
    return JsonResponse({"status": "ok"})


def not_ready(code: str, detail: str) -> JsonResponse:
    return JsonResponse({"status": "not_ready", "code": code, "detail": detail}, status=503)


def readyz(request):
    """200 when the database answers and, if any delivery is due, a sweep finished a pass within
    ODAL_READYZ_SWEEP_SECONDS; else 503 naming why. Open like /healthz, and it says no more: no
    figures, no error text (that goes to the log)."""
    now = timezone.now()
    try:
        # EXISTS on delivery_due_idx (status='pending' AND next_attempt_at <= now): one index probe.
        due = Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now).exists()
        last = tally.last_pass(tally.SWEEP) if due else None
    except (DatabaseError, InterfaceError) as exc:  # refused, timed out, or the connection broke
        log.warning("/readyz: the database did not answer: %s", error_text(exc))
        return not_ready("database_unreachable", "The database does not answer.")
    if due and (last is None or now - last > timedelta(seconds=settings.ODAL_READYZ_SWEEP_SECONDS)):
        return not_ready(
            "sweep_stalled",
            "Deliveries are due and no sweep has finished a pass within ODAL_READYZ_SWEEP_SECONDS.",
        )
    return JsonResponse({"status": "ready"})
