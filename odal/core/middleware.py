import io
import json
import logging
import uuid
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpResponse, JsonResponse
from ninja.parser import Parser

from odal.core.text import JSON_NUMBERS, MAX_JSON_DEPTH, find_unstorable, storable, unstorable

API_PREFIX = "/vault/api/"
BULK_PATH = "/vault/api/v1/dpp/bulk"  # up to 1,000 passports: a limit of its own
logger = logging.getLogger(__name__)


class ApiErrorsAsJsonMiddleware:
    """Under the API root every error is the contract's JSON `{detail, code}`, also those no API
    handler wrote: an unknown route (Django's 404, in development its debug page listing every
    URL pattern), a method the route does not take (django-ninja's empty 405, whose `Allow` is
    kept), a Host not in ALLOWED_HOSTS (Django's 400, raised before any view). Outermost, so that
    it sees every answer.

    And `HEAD` is GET without the body (RFC 9110, 9.3.2), as Django's own views answer it: the
    route runs as GET (django-ninja routes a GET route's GET only), and its answer goes back with
    GET's status and headers, Content-Length included, and no body."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        api = request.path.startswith(API_PREFIX)
        head = api and request.method == "HEAD"
        if head:
            request.method = "GET"
        response = self.get_response(request)
        if head:
            request.method = "HEAD"
        if (
            response.status_code >= 400
            and api
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            response = as_json(request, response)
        if head:
            without_body(response)
        return response


def without_body(response) -> None:
    """`response` as the answer to HEAD: its headers, the length GET's body would have, no body."""
    if response.streaming:
        response.streaming_content = []
        del response["Content-Length"]
    else:
        length = len(response.content)
        response.content = b""
        response["Content-Length"] = str(length)


def as_json(request, response) -> JsonResponse:
    """`response`, an error that is not JSON, as `{detail, code}` with its status (and `Allow`)."""
    status = response.status_code
    headers = {name: response[name] for name in ("Retry-After", "WWW-Authenticate") if name in response}
    if status == 404:
        body = {
            "detail": f"No route of the API has this path. The routes are listed at {API_PREFIX}v1/docs.",
            "code": "not_found",
        }
    elif status == 405:
        # django-ninja lists the methods from a set, in no fixed order: sorted here. A route that
        # takes GET takes HEAD too (see ApiErrorsAsJsonMiddleware).
        methods = {m.strip() for m in response.get("Allow", "").split(",") if m.strip()}
        allowed = ", ".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))
        headers["Allow"] = allowed
        body = {
            "detail": f"This route does not take {storable(request.method, 20)}; it takes {allowed or 'none'}.",
            "code": "method_not_allowed",
        }
    elif status == 400 and not host_allowed(request):
        body = {
            "detail": "The Host header names no host this node serves (ALLOWED_HOSTS).",
            "code": "disallowed_host",
        }
    elif status == 400:
        body = bad_request()
    elif status >= 500:  # raised outside the API's handlers: django.request logged the traceback
        error_id = uuid.uuid4().hex[:12]
        logger.error("unexpected error %s: %s %r answered %s", error_id, request.method, request.path, status)
        body = {
            "detail": f"Something went wrong on our side; it was logged as error {error_id}. "
            "Try again later, or quote that id to the node's operator.",
            "code": "internal_error",
            "errorId": error_id,
        }
    else:  # as the API's handler words an HTTP error it has no code of its own for
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = f"HTTP {status}"
        body = {"detail": f"{phrase}.", "code": "http_error"}
    return JsonResponse(body, status=status, headers=headers)


def host_allowed(request) -> bool:
    try:
        request.get_host()
    except DisallowedHost:
        return False
    return True


class BodySizeLimitMiddleware:
    """Refuse an API request whose declared body is over ODAL_MAX_BODY_BYTES (POST dpp/bulk:
    ODAL_MAX_BULK_BODY_BYTES) with 413, before anything reads it.

    A body sent chunked (`Transfer-Encoding`, no `Content-Length`), which Django would take for
    no body at all, is read here up to that limit, when the server decoded it (gunicorn, `odal
    serve`, says so with `wsgi.input_terminated`), and handed on as a sized body; over the limit
    it is 413 as a sized one is. A server that cannot read it (Django's development server) gets
    411 `length_required`: the client should send a Content-Length."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        unsized = request.META.get("HTTP_TRANSFER_ENCODING") and not request.META.get("CONTENT_LENGTH")
        if unsized and (refusal := read_unsized_body(request)):
            return refusal
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > body_limit(request.path):
            if request.path.startswith(API_PREFIX):
                return JsonResponse(body_too_large(request.path), status=413)
            if request.content_type != "multipart/form-data":  # (whose files Django streams to disk)
                # DATA_UPLOAD_MAX_MEMORY_SIZE is the bulk route's, so hold every other body to
                # ODAL_MAX_BODY_BYTES here: Django's own answer to a body over it (400).
                raise RequestDataTooBig("The request body is larger than ODAL_MAX_BODY_BYTES.")
        return self.get_response(request)


def read_unsized_body(request) -> HttpResponse | None:
    """Read a body sent without a length, up to the path's limit, and give it to the request as a
    sized body (None); or the answer refusing it: 411 when the server cannot read it, 413 (400
    outside the API, as for a sized body) when it is over the limit."""
    api = request.path.startswith(API_PREFIX)
    if not request.META.get("wsgi.input_terminated"):
        body = {
            "detail": "Send the body with a Content-Length: this server cannot read a chunked body.",
            "code": "length_required",
        }
        return JsonResponse(body, status=411) if api else HttpResponse(status=411)
    limit = body_limit(request.path)
    data = request.META["wsgi.input"].read(limit + 1)  # the server ends the stream with the body
    if len(data) > limit:
        if api:
            return JsonResponse(body_too_large(request.path), status=413)
        raise RequestDataTooBig("The request body is larger than ODAL_MAX_BODY_BYTES.")
    # The body as Django holds a sized one (WSGIRequest reads `_stream`, a LimitedStream).
    request.META["CONTENT_LENGTH"] = str(len(data))
    request._stream = LimitedStream(io.BytesIO(data), len(data))
    return None


def body_limit(path: str) -> int:
    return settings.ODAL_MAX_BULK_BODY_BYTES if path == BULK_PATH else settings.ODAL_MAX_BODY_BYTES


def body_too_large(path: str = "") -> dict:
    return {
        "detail": f"The request body is larger than {body_limit(path)} bytes.",
        "code": "body_too_large",
    }


def bad_request() -> dict:
    return {"detail": "The request was refused as malformed.", "code": "bad_request"}


class UnstorableAddress(SuspiciousOperation):
    """A request outside the API whose path or query PostgreSQL cannot store: Django's 400."""


class UnstorableInputMiddleware:
    """The API's one boundary for hostile input: a path, query parameter, or any key or string of
    the JSON body that PostgreSQL cannot store (NUL, a lone surrogate), JSON nested deeper than
    MAX_JSON_DEPTH, or a number odal would not give back as sent (NaN, Infinity, 1e308, -0.0, an
    integer of more than 4,300 digits: odal.core.text.JSON_NUMBERS) is refused with 422 before any
    handler runs, so no schema needs a check of its own. The body is parsed once, here, and the
    API reads that parse (ParsedBodyParser): the body checked is the body handled.

    Outside the API (the admin, the dashboard) a path or query parameter with such a character
    is Django's 400: an admin list filtered on a NUL (`?status__exact=%00`) would otherwise reach
    PostgreSQL and be a 500. (Form bodies are the forms' to check: Django's fields refuse a NUL.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(API_PREFIX):
            try:
                problem = find_problem(request)
            except RequestDataTooBig:
                return JsonResponse(body_too_large(request.path), status=413)
            except SuspiciousOperation:  # e.g. more query parameters than Django reads
                return JsonResponse(bad_request(), status=400)
            if problem:
                return JsonResponse(invalid_request(*problem), status=422)
        elif problem := address_problem(request):
            # A 400 that says why (Django's own page says only "Bad Request (400)"), as plain text:
            # the field's name is the request's own. Logged as Django logs a SuspiciousOperation.
            sentence = f"The request's {problem[0]} {problem[1]}."
            logging.getLogger(f"django.security.{UnstorableAddress.__name__}").error(sentence)
            return HttpResponse(f"{sentence}\n", status=400, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


def address_problem(request) -> tuple[str, str] | None:
    """(field, problem) for the request's path or first query parameter PostgreSQL cannot
    store, or None."""
    problem = unstorable(request.path_info)
    if problem:
        return "path", problem
    for key, values in request.GET.lists():
        field = storable(key, 100)
        problem = unstorable(key)
        if problem:
            return field, f"has a name that {problem}"
        for value in values:
            problem = unstorable(value)
            if problem:
                return field, problem
    return None


def find_problem(request) -> tuple[str, str] | None:
    """(field, problem) for the first thing the API must refuse, or None."""
    if problem := address_problem(request):
        return problem
    if not request.body:
        return None
    try:
        data, problem = checked_json(request.body, items_alone=request.path_info == BULK_PATH)
    except ValueError:  # not JSON (or not UTF-8): the API answers 400 malformed_body, as ever
        return None
    request.parsed_json_body = data
    return problem


def checked_json(text, *, items_alone: bool = False) -> tuple[object, tuple[str, str] | None]:
    """`text` (str or bytes) parsed as JSON, and (field, problem) for the first thing in it the API
    must refuse (see UnstorableInputMiddleware), or None. ValueError when it is not JSON at all.
    With `items_alone` (POST dpp/bulk), the elements of a top-level `items` list are left to the
    route (odal.surfaces.bulk.screened), so that a bad item fails alone, as the route promises.
    `odal passport import` reads each line of a file through it too."""
    try:
        # A number odal would not give back as sent (NaN, 1e400, 1e308, -0.0, an integer of more
        # than 4,300 digits) is kept as a RefusedNumber where it stood: find_unstorable names its
        # place, and in a bulk item it fails that item alone.
        data = json.loads(text, **JSON_NUMBERS)
    except RecursionError:  # Python's json gives up at about 1,000 levels: deeper than our bound
        return None, ("body", f"is nested more than {MAX_JSON_DEPTH} levels deep")
    if items_alone and isinstance(data, dict) and isinstance(data.get("items"), list):
        return data, find_unstorable({**data, "items": []}, max_depth=MAX_JSON_DEPTH)
    return data, find_unstorable(data, max_depth=MAX_JSON_DEPTH)


def invalid_request(field: str, problem: str) -> dict:
    return {
        "detail": f"The request is not valid. {field}: {problem}.",
        "code": "invalid_request",
        "errors": [{"field": field, "message": problem}],
    }


class ParsedBodyParser(Parser):
    """django-ninja's parser, reading the body UnstorableInputMiddleware parsed and checked."""

    def parse_body(self, request):
        if hasattr(request, "parsed_json_body"):
            return request.parsed_json_body
        return super().parse_body(request)
