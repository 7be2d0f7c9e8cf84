"""The API root under /vault/api/v1/: the NinjaAPI, its error handling, and the passport routes."""

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.http import Http404, HttpResponse
from ninja import Field, NinjaAPI, Query, Router, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from pydantic import ConfigDict, WithJsonSchema, field_validator

from odal.core import reconnect
from odal.core.auth import ScopedAuth, document_access
from odal.core.cursors import decode_cursor, encode_cursor
from odal.core.errors import Refused
from odal.core.idempotency import IdempotencyKey, idempotent
from odal.core.middleware import ParsedBodyParser, bad_request, body_too_large
from odal.core.models import AuditEntry, Passport
from odal.core.schemas import PassportIn, invalid_request, responses
from odal.surfaces import bulk, lifecycle
from outbox.api import router as outbox_router
from outbox.consumer_api import router as consumer_router
from registry.api import router as registry_router
from registry.schemas import RegistrationSummaryOut

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


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    return api.create_response(request, invalid_request(exc.errors), status=422)


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
    return api.create_response(request, body_too_large(request.path), status=413)


@api.exception_handler(SuspiciousOperation)
def on_suspicious(request, exc):
    # What Django itself answers (400) rather than the 500 of the handler below.
    return api.create_response(request, bad_request(), status=400)


DATABASE_UNAVAILABLE = (
    "The database does not answer (a restart or a failover, most likely). Try again in a few seconds."
)


@api.exception_handler(DatabaseError)
def on_database_error(request, exc):
    # A database that is down or went (a restart, a failover): 503, safe to retry, not a 500.
    if not reconnect.is_lost(exc):
        return on_unexpected(request, exc)
    # Which database, where, and what the driver said go to the log only: anyone may send a
    # token, and its lookup is what meets the lost database first.
    logger.warning("%s %r: %s", request.method, request.path, reconnect.unanswered(exc))
    body = {"detail": DATABASE_UNAVAILABLE, "code": "database_unavailable"}
    response = api.create_response(request, body, status=503)
    response["Retry-After"] = "5"
    return response


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


class PassportOut(Schema):
    """A passport with its registration summary (null until it is first published)."""

    # Read from the model, each alias naming the attribute; by name, it reads back its own JSON,
    # as an idempotent repeat of `POST dpp` does (odal.core.idempotency).
    model_config = ConfigDict(validate_by_name=True)

    id: uuid.UUID
    upi: str
    operatorId: str = Field(alias="operator_id")
    facilityId: str = Field(alias="facility_id")
    commodityCode: str = Field(alias="commodity_code")
    data: dict
    status: str
    createdAt: datetime = Field(alias="created_at")
    updatedAt: datetime = Field(alias="updated_at")
    publishedAt: datetime | None = Field(alias="published_at")
    suspendedAt: datetime | None = Field(alias="suspended_at")
    # A passport never published has none: reading it raises RelatedObjectDoesNotExist (an
    # AttributeError), which leaves the default.
    registration: RegistrationSummaryOut | None = None


class LifecycleOut(PassportOut):
    changed: bool
    detail: str


def with_registration(passports):
    """`passports` (a Passport queryset) with the registration each answer shows, joined: a page
    of them is one query, whatever its size."""
    return passports.select_related("registration")


def lifecycle_answer(result: lifecycle.LifecycleResult) -> Passport:
    """The passport as the transition left it (read again: the registry work may have changed its
    registration by an update the instance did not see), with what the transition did."""
    passport = with_registration(Passport.objects).get(pk=result.passport.pk)
    passport.changed, passport.detail = result.changed, result.detail
    return passport


@passports.post(
    "dpp",
    operation_id="createPassport",
    auth=ScopedAuth("write", perm="odal.add_passport"),
    response=responses({201: PassportOut}, 409, body=True),
)
def create_passport(
    request, payload: PassportIn, response: HttpResponse, idempotency_key: IdempotencyKey = None
):
    """Create a draft passport. With an `Idempotency-Key`, a repeat creates nothing."""
    with idempotent(request, response, "POST dpp", payload, idempotency_key) as idempotency:
        if idempotency.replay is not None:
            return idempotency.replay
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
        return idempotency.answer(201, PassportOut.from_orm(passport))


# Each item is checked on its own (a bad one fails alone), so the schema takes any JSON value
# and documents what an item should be: PassportIn.
BulkItem = Annotated[Any, WithJsonSchema(PassportIn.model_json_schema())]


class BulkIn(Schema):
    items: list[BulkItem] = Field(
        ...,
        max_length=bulk.MAX_ITEMS,
        description=f"Up to {bulk.MAX_ITEMS:,} passports, each as `POST dpp` takes one.",
    )
    publish: bool = Field(
        False, description="Publish each passport created, as `POST dpp/{dppId}/publish` does."
    )

    @field_validator("items", mode="before")
    @classmethod
    def _at_most(cls, value):
        if isinstance(value, list) and len(value) > bulk.MAX_ITEMS:
            raise ValueError(
                f"holds {len(value):,} passports, and a request holds at most {bulk.MAX_ITEMS:,}: "
                "send the others in another request"
            )
        return value


class BulkError(Schema):
    detail: str
    code: str
    dppId: uuid.UUID | None = Field(
        None, description="upi_taken, upi_repeated: the passport holding the UPI."
    )
    errors: list[dict] | None = Field(
        None, description="invalid_request: each field and what is wrong with it."
    )


class BulkResult(Schema):
    index: int = Field(..., description="The item's place in `items`, from 0.")
    id: uuid.UUID | None = Field(None, description="The passport it created.")
    error: BulkError | None = Field(None, description="Why it created none.")


class BulkOut(Schema):
    results: list[BulkResult]


PUBLISHING = ScopedAuth("write", perm="odal.publish_passport")


@passports.post(
    "dpp/bulk",
    operation_id="createPassports",
    auth=ScopedAuth("write", perm="odal.add_passport"),
    response=responses({200: BulkOut}, 409, body=True),
    exclude_none=True,
)
def create_passports(
    request, payload: BulkIn, response: HttpResponse, idempotency_key: IdempotencyKey = None
):
    """Create up to 1,000 draft passports, each as `POST dpp` would, and with `publish` publish
    each, in one transaction. Answers one result per item, in order: the passport's `id`, or an
    `error` (`{detail, code}`) for that item alone: `invalid_request`, `upi_taken` or
    `upi_repeated` (naming the passport in `dppId`), `batch_failed` (the database refused the
    whole batch; nothing was created, safe to send again). With an `Idempotency-Key`, a repeat
    creates nothing (an answer with `batch_failed` is not kept: the key stays free)."""
    if payload.publish and request.auth.scope is None:  # a staff session: may it publish, too?
        PUBLISHING.check_permission(request.user)
    with idempotent(request, response, "POST dpp/bulk", payload, idempotency_key) as idempotency:
        if idempotency.replay is not None:
            return idempotency.replay
        intake = bulk.Intake(actor=request.auth.actor, publish=payload.publish)
        results = intake.take([(index, bulk.screened(raw)) for index, raw in enumerate(payload.items)])
        failed = any(r.error is not None and r.error["code"] == "batch_failed" for r in results)
        return idempotency.answer(200, {"results": [r.as_json() for r in results]}, keep=not failed)


@passports.get(
    "dpp/{dppId}",
    operation_id="getPassport",
    auth=ScopedAuth("read", perm="odal.view_passport"),
    response=responses({200: PassportOut}, 404),
)
def get_passport(request, dppId: uuid.UUID):
    """A passport with its registration summary."""
    passport = with_registration(Passport.objects).filter(pk=dppId).first()
    if passport is None:
        raise Refused(f"No passport {dppId}.", code="not_found", status=404)
    return passport


class PassportPage(Schema):
    items: list[PassportOut]
    nextCursor: str | None


@passports.get(
    "dpp",
    operation_id="listPassports",
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
    rows = with_registration(Passport.objects).order_by("-created_at", "-id")  # passport_listing_idx
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
    return {"items": page[:limit], "nextCursor": next_cursor}


@passports.post(
    "dpp/{dppId}/publish",
    operation_id="publishPassport",
    auth=ScopedAuth("write", perm="odal.publish_passport"),
    response=responses({200: LifecycleOut}, 404, 409, body=True),
)
def publish_passport(request, dppId: uuid.UUID):
    """Publish a draft or suspended passport. Publishing a published one changes nothing."""
    return lifecycle_answer(lifecycle.publish(dppId, actor=request.auth.actor))


@passports.post(
    "dpp/{dppId}/suspend",
    operation_id="suspendPassport",
    auth=ScopedAuth("write", perm="odal.suspend_passport"),
    response=responses({200: LifecycleOut}, 404, 409, body=True),
)
def suspend_passport(request, dppId: uuid.UUID):
    """Suspend (withdraw) a published passport."""
    return lifecycle_answer(lifecycle.suspend(dppId, actor=request.auth.actor))


api.add_router("", passports)
api.add_router("", outbox_router)
api.add_router("", consumer_router)
api.add_router("", registry_router)
document_access(api)
