"""The second factor of a staff sign-in: TOTP (RFC 6238) with single-use recovery codes, through
django-otp (its TOTP and static devices; its OTPMiddleware tells a verified session apart).

Who owes it: with ODAL_ENV=production, every staff account that may change anything; anyone who
enrolled, everywhere. A session signed in by OpenID Connect owes nothing (its identity provider
owns the sign-in). Until it is given, the admin answers only the enrolment and code pages
(SecondFactorMiddleware) and the API refuses the session's writes (odal.core.auth)."""

import os
from binascii import hexlify, unhexlify
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.shortcuts import redirect
from django.urls import reverse
from django_otp import login as otp_login
from django_otp import user_has_device, verify_token
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from odal.core import reconnect, rules
from odal.core.database.middleware import unanswered_page
from odal.core.errors import Refused
from odal.core.models import AuditEntry
from odal.core.reasons import clean_reason

SIGNED_IN_BY = "odal_signed_in_by"  # "oidc": the identity provider owns the session's sign-in
PENDING_KEY = "odal_totp_pending"  # the enrolment's secret, in the session until a code confirms it
RECOVERY_CODES = 10
TOLERANCE = 1  # steps either side of now: a phone's clock a little off still signs in


def may_change_anything(user) -> bool:
    """A superuser, or staff with any permission beyond viewing (an Operator, or one given a
    permission by hand). Viewers may only look."""
    return user.is_superuser or any(
        not perm.partition(".")[2].startswith("view_") for perm in user.get_all_permissions()
    )


def owed(request) -> str | None:
    """What the session still owes before it may use the admin or write through the API:
    "code" (a device is confirmed, its code not typed yet), "enrol" (production asks for a
    device and there is none), or None."""
    user = request.user
    if not (user.is_authenticated and user.is_staff) or request.session.get(SIGNED_IN_BY) == "oidc":
        return None
    if user.is_verified():
        return None
    if user_has_device(user):
        return "code"
    if settings.PRODUCTION and may_change_anything(user):
        return "enrol"
    return None


class SecondFactorMiddleware:
    """An admin page asked by a session that owes its second factor redirects to the page that
    takes it (the code, or the enrolment); signing in and out stay open. After OTPMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info
        if path.startswith(reverse("admin:index")) and path not in open_paths():
            try:
                owes = owed(request)
            except reconnect.ERRORS as exc:  # before the view: DatabaseUnansweredMiddleware sees none
                if (page := unanswered_page(request, exc)) is None:
                    raise
                return page
            if owes:
                return redirect(f"{reverse(PAGES[owes])}?{urlencode({'next': request.get_full_path()})}")
        return self.get_response(request)


PAGES = {"enrol": "odal_second_factor", "code": "odal_second_factor_code"}


def open_paths() -> set[str]:
    return {reverse(name) for name in ("admin:login", "admin:logout", *PAGES.values())}


# -- enrolment ----------------------------------------------------------------------------------


def pending_key(request) -> str:
    """The secret being enrolled (hex), kept in the session so a reload shows the same one."""
    if PENDING_KEY not in request.session:
        request.session[PENDING_KEY] = hexlify(os.urandom(20)).decode()
    return request.session[PENDING_KEY]


def unsaved_device(user, key: str) -> TOTPDevice:
    return TOTPDevice(user=user, name="authenticator", key=key, confirmed=True)


def enrol(request, code: str) -> list[str] | None:
    """Confirm the pending secret with its current code: one TOTP device and RECOVERY_CODES
    recovery codes, in one transaction, and the session verified. Returns the recovery codes, or
    None when the code is wrong (or there is no pending secret, or a device was confirmed
    meanwhile): then nothing is written."""
    user, key = request.user, request.session.get(PENDING_KEY)
    if key is None or not code.isdigit():
        return None
    totp = TOTP(unhexlify(key))
    if not totp.verify(int(code), tolerance=TOLERANCE):
        return None
    with transaction.atomic():
        get_user_model().objects.select_for_update().get(pk=user.pk)  # one enrolment at a time
        if user_has_device(user):
            return None
        device = unsaved_device(user, key)
        device.last_t = totp.t()  # this code may not sign in again
        device.save()
        static = StaticDevice.objects.create(user=user, name="recovery codes", confirmed=True)
        codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
        StaticToken.objects.bulk_create(StaticToken(device=static, token=c) for c in codes)
    del request.session[PENDING_KEY]
    signed_in_with(request, device)
    return codes


def recovery_codes_left(user) -> int:
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


# -- the code at sign-in --------------------------------------------------------------------------


def check_code(request, code: str) -> str | None:
    """Verify `code` (six digits: the authenticator's; else a recovery code, used up by this) and
    mark the session verified. Returns None when it did, else the sentence that says why not."""
    user = request.user
    code = "".join(code.split()).lower()
    kind = TOTPDevice if len(code) == 6 and code.isdigit() else StaticDevice  # recovery codes: 8 letters
    for device in kind.objects.devices_for_user(user):
        allowed, why = device.verify_is_allowed()
        if not allowed:
            return (
                f"Too many wrong codes in a row: try again after {why['locked_until']:%H:%M:%S} UTC."
                if why and "locked_until" in why
                else "This device may not be used now."
            )
        if verify_token(user, device.persistent_id, code):
            signed_in_with(request, device)
            return None
    return (
        "That code is not right, or was used already: type the six digits your authenticator app "
        "shows now, or one of your recovery codes (each works once)."
    )


def signed_in_with(request, device) -> None:
    request.session.cycle_key()  # a session that gained a factor gets a new key
    otp_login(request, device)


# -- a lost device ----------------------------------------------------------------------------


def reset(username: str, *, reason: str, actor: str) -> int:
    """Remove every TOTP and recovery-code device of the user, in one transaction with its audit
    entry (`reset_2fa`); the user enrols again at the next sign-in. Returns how many devices went
    (0: there were none, nothing written); refused for an unknown user or a bad reason."""
    reason = clean_reason(reason)
    with transaction.atomic():
        user = get_user_model().objects.select_for_update().filter(username=username).first()
        if user is None:
            raise Refused(f"No user named {rules.shown(username)}.", code="unknown_user", status=404)
        removed = [model.objects.filter(user=user).delete()[1].get(model._meta.label, 0)
                   for model in (TOTPDevice, StaticDevice)]  # fmt: skip
        if not any(removed):
            return 0
        AuditEntry.objects.record(
            actor=actor, action="reset_2fa", obj=user, reason=reason,
            details={"username": user.get_username(), "totpDevices": removed[0], "recoveryDevices": removed[1]},
        )  # fmt: skip
    return sum(removed)
