"""The admin's login page (the lock's sentence, single sign-on's button, no password form when
password sign-in is off) and what a sign-in writes into its session: how it signed in, and when
it ends (docs/security.md, "Sign-in")."""

import unicodedata
from datetime import timedelta

from axes.helpers import get_client_ip_address
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.signals import user_logged_in
from django.db import connection, transaction
from django.dispatch import receiver
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

SIGNED_IN_BY = "odal_signed_in_by"  # session key: "oidc" (single sign-on) or "password"
SIGN_ON_BACKEND = "odal.surfaces.signin.sso.SignOnBackend"
PASSWORD_OFF = "Password sign-in is turned off here: sign in with single sign-on."


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
    if request.method != "POST":
        return admin.site.login(request, extra_context=page_options())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [guess_key(request)])
        return admin.site.login(request, extra_context=page_options())


def guess_key(request) -> str:
    """The account and address a posted password is counted against, as the lock counts them (the
    form's username: stripped, NFKC). One guess of a pair at a time, each seeing the ones before
    it counted: guesses sent at once would all pass the lock's check before any was counted."""
    username = unicodedata.normalize("NFKC", str(request.POST.get("username", "")).strip())
    return f"odal sign-in\n{get_client_ip_address(request)}\n{username}"


@receiver(user_logged_in)
def mark_session(sender, request, user, **kwargs) -> None:
    """Say how the session signed in (the second factor exempts single sign-on's: the provider
    owns it), and end it ODAL_SESSION_SECONDS after sign-in whatever it does meanwhile."""
    if request is None or not hasattr(request, "session"):
        return
    request.session[SIGNED_IN_BY] = "oidc" if getattr(user, "backend", "") == SIGN_ON_BACKEND else "password"
    request.session.set_expiry(timezone.now() + timedelta(seconds=settings.ODAL_SESSION_SECONDS))
