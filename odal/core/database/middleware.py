"""A page of the admin or the dashboard whose database does not answer within its bound
(odal.core.database), or at all: 503 with Retry-After and a sentence, not Django's 500. The API answers
its own 503 database_unavailable (odal.surfaces.api), the probes and /metrics theirs (odal.surfaces.views)."""

import logging

from django.http import HttpResponse
from django.utils.html import escape

from odal.core import reconnect

log = logging.getLogger(__name__)

PAGE = (
    '<!doctype html>\n<html lang="en"><head><title>Database unavailable | odal</title></head><body>\n'
    "<h1>The database does not answer in time</h1>\n"
    "<p>{detail}</p>\n</body></html>\n"
)
DETAIL = (
    "A restart or a failover, a statement or a lock wait longer than ODAL_DB_STATEMENT_SECONDS "
    "allows: nothing more was done; what was done before it is kept. Try again in a few seconds."
)


class DatabaseUnansweredMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return unanswered_page(request, exception)


def unanswered_page(request, exception) -> HttpResponse | None:
    """The 503 page when `exception` is a database that did not answer; None for any other.
    (Also for a middleware that reads the database before the view: odal.core.second_factor.)"""
    if not isinstance(exception, reconnect.ERRORS) or not reconnect.is_lost(exception):
        return None
    log.warning("%s %r: %s", request.method, request.path, reconnect.unanswered(exception))
    return HttpResponse(
        PAGE.format(detail=escape(DETAIL)),
        status=503,
        content_type="text/html; charset=utf-8",
        headers={"Retry-After": "5"},
    )
