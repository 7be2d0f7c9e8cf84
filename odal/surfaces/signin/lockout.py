"""The lock on guessed passwords (django-axes, configured in odal/settings.py "Sign-in: lockout";
docs/security.md "Lockout"): the client's address it counts against, its page, its audit entry
and its counter."""

import ipaddress
import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.db.models import Max
from django.dispatch import receiver
from django.template.response import TemplateResponse
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily

from odal.core.models import AuditEntry
from odal.surfaces.signin.pages import login_page

LOCKED = "login_locked"  # the audit action of a lock


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


def counted(address) -> str:
    """An IPv6 address counts as its /64 (one subscriber's network: a new address for every guess
    is no escape), written as the network's first address."""
    if address.version == 6:
        return str(ipaddress.IPv6Address(int(address) >> 64 << 64))  # (a scope id, %eth0, goes too)
    return str(address)


def client_address(request) -> str | None:
    """The address sign-in attempts are counted against (AXES_CLIENT_IP_CALLABLE): the direct
    peer's, unless the peer is a trusted proxy (ODAL_TRUSTED_PROXIES); then the right-most address
    of X-Forwarded-For that is not itself a trusted proxy, since every one left of it was written
    by the client. A hop that is no address counts as the proxy's own (no key the client picks)."""
    peer = ip(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return None
    if not trusted(peer):
        return counted(peer)
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        address = ip(hop)
        if address is None:
            return counted(peer)
        if not trusted(address):
            return counted(address)
    return counted(peer)


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
