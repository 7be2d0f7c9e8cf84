"""Single sign-on with OpenID Connect (mozilla-django-oidc), on when ODAL_OIDC_ISSUER,
ODAL_OIDC_CLIENT_ID and ODAL_OIDC_CLIENT_SECRET are set (odal/settings.py, "Sign-in: single
sign-on"; docs/security.md).

The provider's endpoints come from its discovery document, read at first use and kept for the
process's life; a failed read is said on the login page and tried again at the next use. A person
is found by username, created at first sign-in (without a usable password) and updated at every
one: the username is the claim preferred_username, else email, else sub; the values of the claim
ODAL_OIDC_GROUPS_CLAIM that are "Operators" or "Viewers" (any case) are the odal groups
(odal.core.groups) the person is in, and a person in neither has no staff access.
"""

import logging
import threading

import httpx
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from jwt import PyJWTError
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from odal.surfaces.signin.models import SignOnSubject

log = logging.getLogger(__name__)

GROUPS = ("Operators", "Viewers")
ENDPOINTS = {  # mozilla-django-oidc's setting: the discovery document's key
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",  # optional: the id_token's claims may be all there is
}
REQUIRED = ("authorization_endpoint", "token_endpoint", "jwks_uri")
DISCOVERY_SECONDS = 10
USERNAME_LENGTH = 150  # django.contrib.auth's

FAILED = "Single sign-on did not sign you in: start again, or ask your administrator if it keeps failing."
NOT_STAFF = (
    "Your single sign-on account is in neither the Operators nor the Viewers group, so it has no access "
    "to odal's back office: ask your administrator to add you to one."
)


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read; the message is a sentence for a person."""


_documents: dict[str, dict] = {}  # issuer: its discovery document
_lock = threading.Lock()


def discovery(issuer: str) -> dict:
    """The issuer's discovery document (/.well-known/openid-configuration), read once per process."""
    with _lock:
        if issuer in _documents:
            return _documents[issuer]
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = httpx.get(url, timeout=DISCOVERY_SECONDS)
        answer.raise_for_status()
        document = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("single sign-on: %s could not be read: %s", url, exc)
        raise ProviderUnavailable(
            "Single sign-on is unavailable: the sign-on provider did not answer as expected. Try again "
            "later, or sign in with your password if you have one."
        ) from None
    problem = ""
    if not isinstance(document, dict):
        problem = "it is not a JSON object"
    elif missing := [key for key in REQUIRED if not isinstance(document.get(key), str)]:
        problem = f"it names no {', '.join(missing)}"
    elif str(document.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        problem = f"it names another issuer ({document.get('issuer')!r})"
    if problem:
        log.warning("single sign-on: %s is not a discovery document of %s: %s", url, issuer, problem)
        raise ProviderUnavailable(
            "Single sign-on is unavailable: the sign-on provider's configuration could not be used "
            "(ODAL_OIDC_ISSUER may name the wrong address). Tell your administrator."
        )
    with _lock:
        _documents[issuer] = document
    return document


def sso_setting(attr: str, *default):
    """mozilla-django-oidc's settings: the endpoints from discovery, the client from odal's names."""
    if attr in ENDPOINTS:
        return discovery(settings.ODAL_OIDC_ISSUER).get(ENDPOINTS[attr])
    if attr == "OIDC_RP_CLIENT_ID":
        return settings.ODAL_OIDC_CLIENT_ID
    if attr == "OIDC_RP_CLIENT_SECRET":
        return settings.ODAL_OIDC_CLIENT_SECRET
    return import_from_settings(attr, *default)


def back_to_login(request, sentence: str) -> HttpResponseRedirect:
    messages.error(request, sentence)
    return HttpResponseRedirect(reverse("admin:login"))


def issuer() -> str:
    return settings.ODAL_OIDC_ISSUER.rstrip("/")


def subject(claims: dict) -> str:
    """The person at the provider (OpenID Connect's `sub`, which every id_token carries)."""
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SuspiciousOperation("The id_token names no subject (sub).")
    return claims["sub"]


def group_names(claims: dict) -> list[str]:
    """odal's groups that the groups claim names (a list of names, or one name; anything else, none)."""
    values = claims.get(settings.ODAL_OIDC_GROUPS_CLAIM)
    values = [values] if isinstance(values, str) else values if isinstance(values, list) else []
    named = {value.strip().casefold() for value in values if isinstance(value, str)}
    return [group for group in GROUPS if group.casefold() in named]


class SignOnBackend(OIDCAuthenticationBackend):
    get_settings = staticmethod(sso_setting)

    def __init__(self, *args, **kwargs):
        # (the endpoints are read at sign-on, not here: Django makes its backends for every
        # authentication, and a password sign-in must not wait for the provider)
        self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        if request is None or "nonce" not in kwargs:  # not single sign-on's callback
            return None
        for name in ("OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT"):
            setattr(self, name, self.get_settings(name))
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        self.OIDC_RP_CLIENT_SECRET = self.get_settings("OIDC_RP_CLIENT_SECRET")
        self.OIDC_RP_SIGN_ALGO = self.get_settings("OIDC_RP_SIGN_ALGO")
        self.OIDC_RP_IDP_SIGN_KEY = None  # the provider's keys, from its JWKS
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        """The library's check (signature, expiry, nonce), and the issuer and audience it skips."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if str(payload.get("iss", "")).rstrip("/") != settings.ODAL_OIDC_ISSUER.rstrip("/"):
            raise SuspiciousOperation("The id_token was issued by another issuer.")
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("The id_token was issued to another client.")
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        """The id_token's claims, with the userinfo endpoint's where the provider has one."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            more = super().get_userinfo(access_token, id_token, payload)
            if more.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("The userinfo endpoint answered for another subject.")
            claims.update(more)
        return claims

    def get_username(self, claims) -> str:
        for claim in ("preferred_username", "email", "sub"):
            if isinstance(claims.get(claim), str) and claims[claim].strip():
                return claims[claim].strip()[:USERNAME_LENGTH]
        return ""

    def verify_claims(self, claims) -> bool:
        return bool(self.get_username(claims))

    def filter_users_by_claims(self, claims):
        """The person's account: the one this subject signed in before, else one of its username
        that single sign-on made (no usable password) for no other subject. A local account of
        that username (a password of its own) is never signed in, nor changed, by the provider."""
        known = self.UserModel.objects.filter(
            sign_on_subject__issuer=issuer(), sign_on_subject__subject=subject(claims)
        )
        if known.exists():
            return known
        users = self.UserModel.objects.filter(username=self.get_username(claims))
        if any(user.has_usable_password() for user in users):
            raise SuspiciousOperation("The username is a local account's, with a password of its own.")
        if SignOnSubject.objects.filter(user__in=users).exists():
            raise SuspiciousOperation("The username is the account of another of the provider's subjects.")
        return users

    def create_user(self, claims):
        user = self.UserModel.objects.create_user(self.get_username(claims))  # no usable password
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        """The person's groups among Operators and Viewers, and staff access only with one of them
        (a superuser keeps it: made by hand, on the command line)."""
        chosen = group_names(claims)
        user.is_staff = bool(chosen) or user.is_superuser
        if isinstance(claims.get("email"), str):
            user.email = claims["email"][:254]
        user.save(update_fields=["is_staff", "email"])
        SignOnSubject.objects.get_or_create(
            user=user, defaults={"issuer": issuer(), "subject": subject(claims)}
        )
        groups = Group.objects.filter(name__in=GROUPS)
        user.groups.remove(*[group for group in groups if group.name not in chosen])
        user.groups.add(*[group for group in groups if group.name in chosen])
        return user


class SignOnStart(OIDCAuthenticationRequestView):
    """The "Sign in with single sign-on" button: to the provider's authorization endpoint."""

    get_settings = staticmethod(sso_setting)

    def __init__(self, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(**kwargs)  # (endpoints: in get, said if unread)

    def get(self, request):
        if not settings.ODAL_OIDC:
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = self.get_settings("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except ProviderUnavailable as exc:
            return back_to_login(request, str(exc))
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        return super().get(request)


class SignOnCallback(OIDCAuthenticationCallbackView):
    """Where the provider sends the person back: signed in, or the login page saying why not."""

    get_settings = staticmethod(sso_setting)

    def get(self, request):
        if not settings.ODAL_OIDC:
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except ProviderUnavailable as exc:
            return back_to_login(request, str(exc))
        except (requests.RequestException, SuspiciousOperation, PyJWTError, ValueError, KeyError) as exc:
            log.warning("single sign-on failed: %s: %s", type(exc).__name__, exc)
            return back_to_login(request, FAILED)

    def login_failure(self):
        return back_to_login(self.request, FAILED)

    def login_success(self):
        if not self.user.is_staff:
            return back_to_login(self.request, NOT_STAFF)
        return super().login_success()
