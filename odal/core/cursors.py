"""The cursors of the API's pages, newest first (a row's created_at and id): the outbox's
deliveries and the passports (outbox.api, odal.surfaces.api)."""

import base64
import binascii
import uuid
from datetime import datetime

from odal.core import rules
from odal.core.errors import Refused


def encode_cursor(d) -> str:
    return base64.urlsafe_b64encode(f"{d.created_at.isoformat()}|{d.pk}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, pk = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return rules.moment(at), rules.uuid_id(pk)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Refused("The cursor is not one this API gave out.", code="invalid_cursor", status=422) from None
