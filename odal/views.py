from django.db import connection
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from odal.metrics import registry


def metrics(request):
    """Prometheus text. Figures are read from the database at scrape time, so every web and
    worker process reports the same numbers."""
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
