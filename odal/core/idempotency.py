"""`Idempotency-Key` on the API's create routes: the same key and body within 24 hours answers
the first result again and creates nothing; the same key with another body is 409.

A route opts in with one header parameter and one `with` block around its work:

    def post_event(request, payload: EventIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
        with idempotent(request, response, "POST events", payload, idempotency_key) as idempotency:
            if idempotency.replay is not None:
                return idempotency.replay
            event, deliveries = emit(payload.type, payload.payload)
            return idempotency.answer(201, {"id": event.pk, ...})

With a key, the block runs in one transaction, in this order:
1. The caller's record of this route and key, if older than the window, is deleted: it no
   longer counts.
2. A record (request hash, no answer yet) is inserted. The unique constraint on (caller, route,
   key) decides between concurrent requests: a second INSERT waits for the first transaction
   and, once that commits, fails. The second then reads the committed record: the same body
   hash answers its stored status and body (header `Idempotent-Replayed: true`); another is
   409 `idempotency_conflict`. (If the first rolled back, the second's INSERT simply succeeds.)
3. The route does its work and `idempotency.answer()` stores the answer in the record; the
   transaction commits. A refusal (Refused) or an error rolls all of it back, record included,
   so the key is free again for a corrected request.
Without a key nothing of this happens: the route runs as it always did.
"""

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Header, Status
from pydantic import BaseModel

from odal.core.errors import Refused
from odal.core.models import IdempotencyRecord

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 200

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=KEY_HEADER,
        description=(
            "Optional: 1 to 200 printable ASCII characters, unique per request you mean (a UUID "
            "is a good choice). Sent again with the same body within 24 hours, the request "
            f"creates nothing and answers the first result again, with `{REPLAYED_HEADER}: true`; "
            "with another body it is refused with 409 `idempotency_conflict`. A request that was "
            "refused or failed leaves the key unused. Keys are per caller (API token or staff user) "
            "and per route."
        ),
    ),
]


def check_key(key: str) -> str:
    """The key as given, or Refused (422 invalid_request) saying what is wrong with it."""
    if not key or not key.strip():
        problem = "is empty"
    elif len(key) > MAX_KEY_LENGTH:
        problem = f"is longer than {MAX_KEY_LENGTH} characters"
    elif not all(" " <= c <= "~" for c in key):
        problem = "may hold printable ASCII characters only (no control characters, no accents)"
    else:
        return key
    raise Refused(
        f"The request is not valid. {KEY_HEADER} header: {problem}.",
        code="invalid_request",
        status=422,
        errors=[{"field": KEY_HEADER, "message": problem}],
    )


def caller_of(request: HttpRequest) -> str:
    """Whose keys these are: the API token (by its prefix, unique among tokens; its name is not)
    or the staff user (by id). Called after the route's auth has accepted the request."""
    header = request.headers.get("Authorization")
    if header:  # "Bearer odal_<prefix>_<secret>", already authenticated
        return "token:" + header.partition(" ")[2].strip().split("_", 2)[1]
    return f"user:{request.user.pk}"


def request_hash(body) -> str:
    """sha256 of the request body (as the route validated it) in canonical JSON: key order and
    whitespace do not matter."""
    if isinstance(body, BaseModel):
        try:
            body = body.model_dump(mode="json")
        except ValueError:  # a bulk item, to be refused alone, holding a lone surrogate (Unicode-
            body = body.model_dump()  # EncodeError), NaN, or nested deeper than pydantic writes JSON
    return hashlib.sha256(canonical_json(body).encode("utf-8", "surrogatepass")).hexdigest()


class _Token(str):
    pass


def canonical_json(value) -> str:
    """json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False), without
    recursion: a bulk item may be nested as deep as the body's parse went (about 900 levels), and
    this runs further down the stack than that parse did (a recursive dump would fail there)."""
    out, todo = [], [value]
    while todo:
        item = todo.pop()
        if type(item) is _Token:
            out.append(item)
        elif isinstance(item, dict):
            entries = sorted(item.items(), key=lambda entry: entry[0])
            todo.append(_Token("}"))
            for n in reversed(range(len(entries))):
                key, inner = entries[n]
                todo.append(inner)
                todo.append(_Token(("," if n else "") + json.dumps(key, ensure_ascii=False) + ":"))
            todo.append(_Token("{"))
        elif isinstance(item, list | tuple):
            todo.append(_Token("]"))
            for n in reversed(range(len(item))):
                todo.append(item[n])
                if n:
                    todo.append(_Token(","))
            todo.append(_Token("["))
        else:
            out.append(json.dumps(item, ensure_ascii=False, default=str))
    return "".join(out)


@dataclass
class IdempotentRequest:
    """A request under its Idempotency-Key, as `idempotent()` hands it to the route: the route
    returns `replay` (the first answer to this key) if it is set, else does its work and returns
    `answer(status, body)`, which keeps that answer for a repeat."""

    record: IdempotencyRecord | None = None  # this request's record (None without a key)
    replay: Status | None = None  # the first answer, when this key was used before
    answered: bool = False

    def answer(self, status_code: int, body: dict | BaseModel, *, keep: bool = True) -> Status:
        """The route's answer (its response schema, or a dict of it), stored in the record (when
        there is one) as the JSON sent, for a repeat. `keep=False`: an answer that reports a
        failure (the key stays free, as after a refusal)."""
        self.answered = True
        if self.record is not None and not keep:
            IdempotencyRecord.objects.filter(pk=self.record.pk).delete()
        elif self.record is not None:
            shown = body.model_dump() if isinstance(body, BaseModel) else body
            stored = json.loads(json.dumps(shown, cls=DjangoJSONEncoder))
            taken = IdempotencyRecord.objects.filter(pk=self.record.pk).answer(
                status_code=status_code, response=stored
            )
            assert taken, "an idempotency record is answered once, by its own request"
        return Status(status_code, body)


@contextmanager
def idempotent(
    request: HttpRequest, response: HttpResponse, route: str, body, key: str | None
) -> Iterator[IdempotentRequest]:
    """Run a route's work at most once per (caller, route, key); see the module's docstring.
    `response` is the route's temporal response (for the replay header); `body` the validated
    payload; `key` the Idempotency-Key header, None when it was not sent."""
    if key is None:
        yield IdempotentRequest()
        return
    key = check_key(key)
    caller, digest = caller_of(request), request_hash(body)
    this_key = IdempotencyRecord.objects.filter(caller=caller, route=route, key=key)
    with transaction.atomic():
        # A rival deleting the same old record first makes this wait, then delete nothing; its
        # new record is then found by the INSERT below.
        this_key.forget_expired(now=timezone.now())
        try:
            with transaction.atomic():  # a savepoint: the transaction goes on after a conflict
                record = IdempotencyRecord.objects.create(
                    caller=caller, route=route, key=key, request_hash=digest
                )
        except IntegrityError:
            record = None
        if record is None:
            first = this_key.get()  # committed (an INSERT only fails on a committed rival)
            if first.request_hash != digest:
                raise Refused(
                    f"This {KEY_HEADER} was already used, within the last 24 hours, with a "
                    "different request body. Send a new key for a new request, or the same body "
                    "to get the first answer again.",
                    code="idempotency_conflict",
                    status=409,
                )
            response[REPLAYED_HEADER] = "true"
            yield IdempotentRequest(replay=Status(first.status_code, first.response))
            return
        idempotency = IdempotentRequest(record=record)
        yield idempotency
        if not idempotency.answered:  # a route that forgot answer() would commit a record with no answer
            raise RuntimeError(f"{route}: idempotent() block left without idempotency.answer()")
