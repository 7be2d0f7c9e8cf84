"""Talking to the registry: the `http` adapter (CONTRACT.md's wire protocol, over httpx) and the
`none` adapter (a node without registry queues).

Every failure is mapped: 5xx, a timeout or a connection error on register/check/deactivate is
`Retryable`; anything odd while reading the task list makes `find_submission` raise
`RegistryUnreadable` rather than guess.
"""

from dataclasses import dataclass, field

import httpx
from django.conf import settings

from outbox.consumers import excerpt

MAX_TASK_PAGES = 1000


class Retryable(Exception):
    """The registry did not answer usefully; the attempt failed and may be retried."""


class RegistryUnreadable(Exception):
    """The task list could not be read completely; nothing can be concluded. Safe to retry."""


class NoRegistry(Exception):
    """This node has no registry queues (ODAL_REGISTRY_ADAPTER=none)."""


# -- answers ------------------------------------------------------------------------------------


@dataclass
class Accepted:
    request_id: str


@dataclass
class Duplicate:
    request_id: str


@dataclass
class Rejected:
    errors: str


@dataclass
class CheckAnswer:
    status: str  # checking, registered, rejected
    registration_id: str = ""
    errors: str = ""


@dataclass
class Found:
    correlation_id: str


@dataclass
class Ambiguous:
    candidates: list[str]


@dataclass
class NotFound:
    exhaustive: bool
    why: str = ""


@dataclass
class Unsupported:
    why: str = ""


@dataclass
class HttpRegistry:
    base_url: str
    token: str
    timeout: float = 10.0
    client: httpx.Client | None = field(default=None, repr=False)

    name = "http"

    def _client(self) -> httpx.Client:
        if self.client is None:
            self.client = httpx.Client(
                base_url=self.base_url,
                timeout=self.timeout,
                headers={"Authorization": f"Bearer {self.token}", "User-Agent": "odal-registry/1"},
            )
        return self.client

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self._client().request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise Retryable(f"registry timed out after {self.timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise Retryable(f"registry unreachable: {type(exc).__name__}: {exc}"[:500]) from None
        if response.status_code >= 500:
            raise Retryable(
                f"registry answered HTTP {response.status_code}: {excerpt(response.text)}".rstrip(": ")
            )
        return response

    @staticmethod
    def _json(response: httpx.Response) -> dict:
        try:
            body = response.json()
        except ValueError:
            raise Retryable(f"registry answered HTTP {response.status_code} without JSON") from None
        if not isinstance(body, dict):
            raise Retryable(f"registry answered HTTP {response.status_code} with unexpected JSON")
        return body

    # -- the drain's calls --------------------------------------------------------------------

    def register(self, registration) -> Accepted | Duplicate | Rejected:
        passport = registration.passport
        body = {
            "upi": passport.upi,
            "operatorId": passport.operator_id,
            "facilityIds": [passport.facility_id] if passport.facility_id else [],
            "commodityCode": passport.commodity_code,
            "dppEndpoint": f"{settings.ODAL_PUBLIC_URL}/vault/api/v1/dpp/{passport.pk}",
        }
        response = self._send(
            "POST", "/dpp-registration-requests", json=body, headers={"Idempotency-Key": str(registration.pk)}
        )
        payload = self._json(response)
        if response.status_code in (200, 201, 202) and payload.get("requestId"):
            return Accepted(str(payload["requestId"]))
        if (
            response.status_code == 409
            and payload.get("code") == "DUPLICATE_UPI"
            and payload.get("requestId")
        ):
            return Duplicate(str(payload["requestId"]))
        if response.status_code == 422:
            return Rejected(_errors(payload))
        raise Retryable(
            f"registry answered HTTP {response.status_code} to register: {excerpt(response.text)}"
        )

    def check(self, request_id: str) -> CheckAnswer:
        response = self._send("GET", f"/dpp-registration-requests/{request_id}")
        payload = self._json(response)
        status = payload.get("status")
        if response.status_code != 200 or status not in ("checking", "registered", "rejected", "received"):
            raise Retryable(
                f"registry answered HTTP {response.status_code} to check: {excerpt(response.text)}"
            )
        if status == "registered":
            if not payload.get("registrationId"):
                raise Retryable("registry says registered but gave no registrationId")
            return CheckAnswer("registered", registration_id=str(payload["registrationId"]))
        if status == "rejected":
            return CheckAnswer("rejected", errors=_errors(payload))
        return CheckAnswer("checking")

    def deactivate(self, registration_id: str) -> str:
        response = self._send("POST", f"/registrations/{registration_id}/deactivate")
        if response.status_code in (200, 204):
            return "deactivated"
        if response.status_code == 404:
            return "already gone"
        raise Retryable(
            f"registry answered HTTP {response.status_code} to deactivate: {excerpt(response.text)}"
        )

    # -- abandon's question ---------------------------------------------------------------------

    def find_submission(self, upi: str) -> Found | Ambiguous | NotFound | Unsupported:
        """Read the whole task list. Found/Ambiguous if requests for the UPI are held (rejected
        ones do not count); NotFound(exhaustive=True) only if every page was read, none names the
        UPI and none is still `received` (unread by the registry, its upi possibly unknown)."""
        held: list[str] = []
        unread = 0
        cursor = None
        for page in range(MAX_TASK_PAGES):
            params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            try:
                response = self._send("GET", "/dpp-registration-requests", params=params)
            except Retryable as exc:
                raise RegistryUnreadable(str(exc)) from None
            if response.status_code in (404, 405, 501) and page == 0:
                return Unsupported(
                    f"the registry's task list cannot be searched (HTTP {response.status_code})"
                )
            if response.status_code != 200:
                raise RegistryUnreadable(f"task list page {page + 1}: HTTP {response.status_code}")
            try:
                body = self._json(response)
                items = body["items"]
                cursor = body.get("nextCursor")
                if not isinstance(items, list):
                    raise TypeError
            except (Retryable, KeyError, TypeError):
                raise RegistryUnreadable(f"task list page {page + 1} is not what the protocol says") from None
            for item in items:
                if not isinstance(item, dict):
                    raise RegistryUnreadable(f"task list page {page + 1} holds a malformed item")
                if item.get("status") == "received":
                    unread += 1
                elif item.get("upi") == upi and item.get("status") != "rejected":
                    held.append(str(item.get("requestId")))
            if not cursor:
                break
        else:
            return NotFound(exhaustive=False, why=f"the task list has more than {MAX_TASK_PAGES} pages")
        if len(held) == 1:
            return Found(held[0])
        if held:
            return Ambiguous(held)
        if unread:
            return NotFound(exhaustive=False, why=f"{unread} task(s) not yet read by the registry")
        return NotFound(exhaustive=True)


class NoneRegistry:
    """ODAL_REGISTRY_ADAPTER=none: this node queues no registry work."""

    name = "none"

    def register(self, registration):
        raise NoRegistry()

    def check(self, request_id):
        raise NoRegistry()

    def deactivate(self, registration_id):
        raise NoRegistry()

    def find_submission(self, upi):
        raise NoRegistry()

    def close(self) -> None:
        pass


def get_adapter():
    if settings.ODAL_REGISTRY_ADAPTER == "none":
        return NoneRegistry()
    return HttpRegistry(
        base_url=settings.ODAL_REGISTRY_URL,
        token=settings.ODAL_REGISTRY_TOKEN,
        timeout=settings.ODAL_REGISTRY_TIMEOUT_SECONDS,
    )


def _errors(payload: dict) -> str:
    errors = payload.get("errors") or []
    code = payload.get("code") or "REJECTED"
    if isinstance(errors, list) and errors:
        return f"{code}: " + "; ".join(
            str(e) if not isinstance(e, dict) else str(e.get("message", e)) for e in errors
        )
    return str(code)
