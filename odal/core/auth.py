"""Who is calling the API, and may they: bearer tokens with scopes, or a staff session with its
Django permissions.

Each route declares both in one place, its `auth=`: `ScopedAuth("write", perm="odal.suspend_passport")`.
A bearer token is held to the scope (admin implies write, write implies read); a staff session to
the permission (a superuser has them all), and a session request that changes something must also
pass Django's CSRF check.
"""

from dataclasses import dataclass

from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.utils import check_csrf

from odal.core import second_factor
from odal.core.errors import Refused
from odal.core.models import SCOPE_ORDER, ApiToken

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


@dataclass(frozen=True)
class Principal:
    actor: str  # "token:<name>" or "user:<username>": what the audit trail records
    scope: str | None = None  # a token's scope; None for a staff session (its permissions decide)


class ScopedAuth(HttpBearer):
    """Bearer token held to `scope`, or staff session held to `perm`.

    No credentials: None, which the API answers with 401. Bad credentials: 401 saying why.
    Good credentials without the scope or the permission: 403 naming what is needed.
    """

    def __init__(self, scope: str, *, perm: str):
        assert scope in SCOPE_ORDER, scope
        assert perm.count(".") == 1, f"a permission is 'app_label.codename', got {perm!r}"
        self.scope = scope
        self.perm = perm
        super().__init__()

    def __repr__(self) -> str:
        return f"ScopedAuth({self.scope!r}, perm={self.perm!r})"

    def __call__(self, request: HttpRequest):
        header = request.headers.get("Authorization")
        if header:
            scheme, _, plaintext = header.partition(" ")
            if scheme.lower() != "bearer" or not plaintext.strip():
                raise Refused(
                    "Send the token as 'Authorization: Bearer <token>'.", code="unauthenticated", status=401
                )
            return self.authenticate(request, plaintext.strip())
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and user.is_staff:
            if request.method not in SAFE_METHODS and check_csrf(request) is not None:
                raise Refused(
                    "CSRF check failed: a session request that changes something needs the CSRF token.",
                    code="csrf_failed",
                    status=403,
                )
            if request.method not in SAFE_METHODS and second_factor.owed(request):
                raise Refused(
                    "This session has not given its second factor: sign in to the admin with your "
                    "authenticator's code (or set it up there) first. A bearer token needs none.",
                    code="second_factor_required",
                    status=403,
                )
            return self.check_permission(user)
        return None

    def authenticate(self, request: HttpRequest, token: str):
        api_token = ApiToken.objects.authenticate(token)
        if api_token is None:
            raise Refused(
                "That API token is not valid: unknown or revoked.", code="invalid_token", status=401
            )
        return self.check_scope(Principal(f"token:{api_token.name}", api_token.scope))

    def check_scope(self, principal: Principal) -> Principal:
        if SCOPE_ORDER[principal.scope] < SCOPE_ORDER[self.scope]:
            raise Refused(
                f"This needs the {self.scope} scope; these credentials have {principal.scope}.",
                code="insufficient_scope",
                status=403,
                requiredScope=self.scope,
            )
        return principal

    def check_permission(self, user) -> Principal:
        """A staff session may do what its Django permissions allow, route by route."""
        if not user.has_perm(self.perm):
            raise Refused(
                f"This needs the permission {self.perm}; your account does not have it. "
                "Ask an administrator to give it to you (or to a group of yours).",
                code="insufficient_permission",
                status=403,
                requiredPermission=self.perm,
            )
        return Principal(f"user:{user.get_username()}")


def document_access(api) -> None:
    """Write each operation's scope and permission into the OpenAPI document
    (`x-odal-scope`, `x-odal-permission`), from the ScopedAuth its route declares."""
    for _prefix, router in api._routers:
        for path_view in router.path_operations.values():
            for operation in path_view.operations:
                for auth in operation.auth_callbacks:
                    if isinstance(auth, ScopedAuth):
                        operation.openapi_extra = {
                            **(operation.openapi_extra or {}),
                            "x-odal-scope": auth.scope,
                            "x-odal-permission": auth.perm,
                        }
