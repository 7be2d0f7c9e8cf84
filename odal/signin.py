"""Sign-in to the admin: the lock on guessed passwords (django-axes, configured in odal/settings.py
"Sign-in: lockout"), the client's address it counts against, the admin's login page (the lock's
sentence, single sign-on's button, no password form when password sign-in is off) and how long a
signed-in session lasts. docs/security.md says what each promises.
"""

import ipaddress
import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.signals import user_logged_in
from django.db.models import Max
from django.dispatch import receiver
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily

from odal.models import AuditEntry

LOCKED = "login_locked"  # the audit action of a lock
SIGNED_IN_BY = "odal_signed_in_by"  # session key: "oidc" (single sign-on) or "password"
SIGN_ON_BACKEND = "odal.sso.SignOnBackend"
PASSWORD_OFF = "Password sign-in is turned off here: sign in with single sign-on."


# -- the client's address ---------------------------------------------------------------------


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address (an IPv4 address written as IPv6, ::ffff:a.b.c.d, as IPv4), or None."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def trusted(address) -> bool:
    return any(address in network for network in settings.ODAL_TRUSTED_PROXIES)


def client_address(request) -> str | None:
    """The address sign-in attempts are counted against (AXES_CLIENT_IP_CALLABLE): the direct
    peer's, unless the peer is a trusted proxy (ODAL_TRUSTED_PROXIES); then the right-most address
    of X-Forwarded-For that is not itself a trusted proxy, since every one left of it was written
    by the client. A hop that is no address counts as the proxy's own (no key the client picks)."""
    peer = ip(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return None
    if not trusted(peer):
        return str(peer)
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        address = ip(hop)
        if address is None:
            return str(peer)
        if not trusted(address):
            return str(address)
    return str(peer)


class LockBackend(AxesStandaloneBackend):
    """axes' backend, first of AUTHENTICATION_BACKENDS: a locked pair goes no further. An
    authentication without a request (Django's test client's login(), code of our own) has no
    address to count against and is left to the next backend; every sign-in page passes one."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def not_a_password(request, credentials) -> bool:
    """AXES_WHITELIST_CALLABLE: an authentication without a username (single sign-on's callback)
    is not a password guess, and is neither counted nor locked: the provider owns that."""
    return not (credentials or {}).get("username")


# -- the lock ----------------------------------------------------------------------------------


def lock_ends(request, credentials) -> timezone.datetime:
    """When the lock on this account from this address ends: a window after the wrong password
    that completed it (tries refused during the lock do not move it)."""
    window = timedelta(seconds=settings.ODAL_LOGIN_WINDOW)
    last = AccessAttempt.objects.filter(
        username=get_client_username(request, credentials),
        ip_address=request.axes_ip_address,
        attempt_time__gte=timezone.now() - window,
    ).aggregate(last=Max("attempt_time"))["last"]
    return (last or timezone.now()) + window


def locked_out(request, original_response=None, credentials=None) -> TemplateResponse:
    """AXES_LOCKOUT_CALLABLE: the admin's login page saying the account is locked from here and
    until when; 429 with Retry-After (the form stays, for another account)."""
    until = lock_ends(request, credentials)
    seconds = max(1, math.ceil((until - timezone.now()).total_seconds()))
    sentence = (
        f"Too many wrong passwords for this account from your address: it cannot sign in from here "
        f"until {until:%H:%M} UTC (in {math.ceil(seconds / 60)} minute{'s' if seconds > 60 else ''}), "
        f"even with the right password."
    )
    response = login_page(request, status=429, odal_refused=sentence)
    response["Retry-After"] = str(seconds)
    return response.render()  # (a middleware's answer: no view renders it)


@receiver(user_locked_out)
def record_lock(sender, request, username, ip_address, **kwargs) -> None:
    """One audit entry per lock, by the wrong password that completes it: a try refused during the
    lock is not counted (axes leaves axes_failures_since_start unset) and records nothing."""
    attempts = getattr(request, "axes_failures_since_start", None)
    if attempts is None:
        return
    AuditEntry.objects.record(
        actor=username or "anonymous",
        action=LOCKED,
        details={"address": ip_address, "attempts": attempts},
    )


class SignInCollector:
    """odal_login_locked_total, counted from the audit trail (append-only), so every web process
    reports the deployment's figure."""

    def collect(self):
        yield CounterMetricFamily(
            "odal_login_locked",
            "Sign-in locks: an account locked from one address after too many wrong passwords (one per lock).",
            value=AuditEntry.objects.filter(action=LOCKED).count(),
        )


# -- the login page and the session ------------------------------------------------------------


def page_options() -> dict:
    return {"odal_sign_on": settings.ODAL_OIDC, "odal_password_login": settings.ODAL_PASSWORD_LOGIN}


def login_page(request, *, status: int, **extra) -> TemplateResponse:
    """The admin's login page, as admin.site.login shows it, with an unbound form and `extra`."""
    context = {
        **admin.site.each_context(request),
        "title": "Log in",
        "subtitle": None,
        "app_path": request.get_full_path(),
        "username": request.user.get_username() if hasattr(request, "user") else "",
        "form": (admin.site.login_form or AdminAuthenticationForm)(request),
        REDIRECT_FIELD_NAME: request.POST.get(REDIRECT_FIELD_NAME)
        or request.GET.get(REDIRECT_FIELD_NAME)
        or reverse("admin:index"),
        **page_options(),
        **extra,
    }
    return TemplateResponse(request, "admin/login.html", context, status=status)


def login(request):
    """The admin's login view (served in place of admin.site's own by odal.urls): Django's, with
    single sign-on's button; with ODAL_PASSWORD_LOGIN=0 a password posted is refused (403)."""
    if request.method == "POST" and not settings.ODAL_PASSWORD_LOGIN:
        return login_page(request, status=403, odal_refused=PASSWORD_OFF)
    return admin.site.login(request, extra_context=page_options())


@receiver(user_logged_in)
def mark_session(sender, request, user, **kwargs) -> None:
    """Say how the session signed in (the second factor exempts single sign-on's: the provider
    owns it), and end it ODAL_SESSION_SECONDS after sign-in whatever it does meanwhile."""
    if request is None or not hasattr(request, "session"):
        return
    request.session[SIGNED_IN_BY] = "oidc" if getattr(user, "backend", "") == SIGN_ON_BACKEND else "password"
    request.session.set_expiry(timezone.now() + timedelta(seconds=settings.ODAL_SESSION_SECONDS))
