import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from odal.metrics import registry


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
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
