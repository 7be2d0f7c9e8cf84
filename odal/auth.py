"""Who is calling the API, and may they: bearer tokens with scopes, or a staff session."""

from dataclasses import dataclass

from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.utils import check_csrf

from odal.errors import Refused
from odal.models import SCOPE_ORDER, ApiToken

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


@dataclass(frozen=True)
class Principal:
    actor: str  # "token:<name>" or "user:<username>": what the audit trail records
    scope: str


def session_scope(user) -> str:
    """A staff session's scope: superusers are admins, staff who may publish write, others read."""
    if user.is_superuser:
        return "admin"
    if user.has_perm("odal.publish_passport"):
        return "write"
    return "read"


class ScopedAuth(HttpBearer):
    """Bearer token or staff session, then the scope check.

    No credentials: None, which the API answers with 401. Bad credentials: 401 saying why.
    Good credentials without the scope: 403 naming the scope needed.
    """

    def __init__(self, scope: str):
        assert scope in SCOPE_ORDER
        self.scope = scope
        super().__init__()

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
            return self.check_scope(Principal(f"user:{user.get_username()}", session_scope(user)))
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


READ = ScopedAuth("read")
WRITE = ScopedAuth("write")
ADMIN = ScopedAuth("admin")
