"""The API root under /vault/api/v1/: the NinjaAPI, its error handling, and the passport routes."""

import logging
import uuid
from datetime import datetime

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import Http404, HttpResponse
from ninja import NinjaAPI, Query, Router, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from pydantic import field_validator

from odal import lifecycle, rules
from odal.auth import ScopedAuth, document_access
from odal.errors import Refused
from odal.idempotency import IdempotencyKey, idempotent
from odal.middleware import ParsedBodyParser, bad_request, body_too_large
from odal.models import AuditEntry, Passport
from odal.schemas import responses
from outbox.api import decode_cursor, encode_cursor
from outbox.api import router as outbox_router
from outbox.consumer_api import router as consumer_router
from registry.api import router as registry_router
from registry.models import Registration
from registry.service import registration_json

api = NinjaAPI(
    title="odal",
    version="1",
    description=(
        "The back office of a Digital Product Passport node: passports, the EU DPP registry "
        "outbox and the event outbox. Authenticate with `Authorization: Bearer <token>` "
        "(create one with `odal token create`) or a staff session. Each operation names the token "
        "scope it needs (`x-odal-scope`: admin implies write, write implies read) and the Django "
        "permission a staff session needs (`x-odal-permission`). Errors are `{detail, code}`."
    ),
    urls_namespace="api",
    parser=ParsedBodyParser(),
)
logger = logging.getLogger(__name__)


def _field_of(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "path", "query")]
    return ".".join(parts) or "request"


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    problems = []
    for error in exc.errors:
        message = str(error.get("msg", "is not valid")).removeprefix("Value error, ")
        problems.append(f"{_field_of(error.get('loc', ()))}: {message}")
    detail = "The request is not valid. " + "; ".join(problems) + "."
    errors = [{"field": _field_of(e.get("loc", ())), "message": str(e.get("msg"))} for e in exc.errors]
    return api.create_response(
        request, {"detail": detail, "code": "invalid_request", "errors": errors}, status=422
    )


@api.exception_handler(Refused)
def on_refused(request, exc: Refused):
    return api.create_response(request, exc.as_json(), status=exc.status)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return api.create_response(
        request,
        {
            "detail": "Authentication required: send 'Authorization: Bearer <token>' or sign in as staff.",
            "code": "unauthenticated",
        },
        status=401,
    )


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return api.create_response(request, {"detail": "Not found.", "code": "not_found"}, status=404)


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    if exc.status_code == 400:  # django-ninja's "Cannot parse request body"
        body = {"detail": "The request body is not valid JSON.", "code": "malformed_body"}
    else:
        body = {"detail": str(exc), "code": "http_error"}
    return api.create_response(request, body, status=exc.status_code)


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    return api.create_response(request, body_too_large(), status=413)


@api.exception_handler(SuspiciousOperation)
def on_suspicious(request, exc):
    # What Django itself answers (400) rather than the 500 of the handler below.
    return api.create_response(request, bad_request(), status=400)


@api.exception_handler(Exception)
def on_unexpected(request, exc):
    # Never a traceback, whatever DEBUG says: the traceback goes to the log under an id the
    # client can quote.
    error_id = uuid.uuid4().hex[:12]
    logger.exception("unexpected error %s in %s %r", error_id, request.method, request.path, exc_info=exc)
    body = {
        "detail": f"Something went wrong on our side; it was logged as error {error_id}. "
        "Try again later, or quote that id to the node's operator.",
        "code": "internal_error",
        "errorId": error_id,
    }
    return api.create_response(request, body, status=500)


# -- passports -----------------------------------------------------------------------------------

passports = Router(tags=["passports"])


class PassportIn(Schema):
    upi: str
    operatorId: str
    facilityId: str | None = None
    commodityCode: str | None = None
    data: dict | None = None

    @field_validator("upi")
    @classmethod
    def _upi(cls, value: str) -> str:
        return rules.upi(value)

    @field_validator("operatorId")
    @classmethod
    def _operator(cls, value: str) -> str:
        return rules.operator_id(value)

    @field_validator("facilityId")
    @classmethod
    def _facility(cls, value: str | None) -> str | None:
        return None if value is None else rules.facility_id(value)

    @field_validator("commodityCode")
    @classmethod
    def _commodity(cls, value: str | None) -> str | None:
        return None if value is None else rules.commodity_code(value)


class PassportOut(Schema):
    id: uuid.UUID
    upi: str
    operatorId: str
    facilityId: str
    commodityCode: str
    data: dict
    status: str
    createdAt: datetime
    updatedAt: datetime
    publishedAt: datetime | None
    suspendedAt: datetime | None
    registration: dict | None = None


class LifecycleOut(PassportOut):
    changed: bool
    detail: str


def passport_json(passport: Passport) -> dict:
    return {
        "id": passport.id,
        "upi": passport.upi,
        "operatorId": passport.operator_id,
        "facilityId": passport.facility_id,
        "commodityCode": passport.commodity_code,
        "data": passport.data,
        "status": passport.status,
        "createdAt": passport.created_at,
        "updatedAt": passport.updated_at,
        "publishedAt": passport.published_at,
        "suspendedAt": passport.suspended_at,
        "registration": registration_summary(passport),
    }


def registration_summary(passport: Passport) -> dict | None:
    reg = Registration.objects.filter(passport=passport).first()
    return registration_json(reg) if reg else None


@passports.post(
    "dpp",
    auth=ScopedAuth("write", perm="odal.add_passport"),
    response=responses({201: PassportOut}, 409, body=True),
)
def create_passport(
    request, payload: PassportIn, response: HttpResponse, idempotency_key: IdempotencyKey = None
):
    """Create a draft passport. With an `Idempotency-Key`, a repeat creates nothing."""
    with idempotent(request, response, "POST dpp", payload, idempotency_key) as once:
        if once.replay is not None:
            return once.replay
        if Passport.objects.filter(upi=payload.upi).exists():
            raise Refused("A passport with this upi already exists.", code="upi_taken", status=409)
        try:
            with transaction.atomic():
                passport = Passport.objects.create(
                    upi=payload.upi,
                    operator_id=payload.operatorId,
                    facility_id=payload.facilityId or "",
                    commodity_code=payload.commodityCode or "",
                    data=payload.data or {},
                )
                AuditEntry.objects.record(actor=request.auth.actor, action="passport_created", obj=passport)
        except IntegrityError:
            raise Refused("A passport with this upi already exists.", code="upi_taken", status=409) from None
        return once.answer(201, passport_json(passport))


@passports.get(
    "dpp/{dppId}",
    auth=ScopedAuth("read", perm="odal.view_passport"),
    response=responses({200: PassportOut}, 404),
)
def get_passport(request, dppId: uuid.UUID):
    """A passport with its registration summary."""
    passport = Passport.objects.filter(pk=dppId).first()
    if passport is None:
        raise Refused(f"No passport {dppId}.", code="not_found", status=404)
    return passport_json(passport)


class PassportPage(Schema):
    items: list[PassportOut]
    nextCursor: str | None


@passports.get(
    "dpp",
    auth=ScopedAuth("read", perm="odal.view_passport"),
    response=responses({200: PassportPage}),
)
def list_passports(
    request,
    status: str | None = None,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=200),
):
    """Passports, newest first, a page at a time: pass `nextCursor` back as `cursor` for the next."""
    rows = Passport.objects.order_by("-created_at", "-id")  # passport_listing_idx
    if status:
        if status not in Passport.Status.values:
            raise Refused(
                f"status must be one of {', '.join(Passport.Status.values)}.",
                code="invalid_status",
                status=422,
            )
        rows = rows.filter(status=status)
    if cursor:
        at, pk = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    page = list(rows[: limit + 1])
    next_cursor = encode_cursor(page[limit - 1]) if len(page) > limit else None
    return {"items": [passport_json(p) for p in page[:limit]], "nextCursor": next_cursor}


@passports.post(
    "dpp/{dppId}/publish",
    auth=ScopedAuth("write", perm="odal.publish_passport"),
    response=responses({200: LifecycleOut}, 404, 409, body=True),
)
def publish_passport(request, dppId: uuid.UUID):
    """Publish a draft or suspended passport. Publishing a published one changes nothing."""
    result = lifecycle.publish(dppId, actor=request.auth.actor)
    return {**passport_json(result.passport), "changed": result.changed, "detail": result.detail}


@passports.post(
    "dpp/{dppId}/suspend",
    auth=ScopedAuth("write", perm="odal.suspend_passport"),
    response=responses({200: LifecycleOut}, 404, 409, body=True),
)
def suspend_passport(request, dppId: uuid.UUID):
    """Suspend (withdraw) a published passport."""
    result = lifecycle.suspend(dppId, actor=request.auth.actor)
    return {**passport_json(result.passport), "changed": result.changed, "detail": result.detail}


api.add_router("", passports)
api.add_router("", outbox_router)
api.add_router("", consumer_router)
api.add_router("", registry_router)
document_access(api)
