"""A gateway's answer is not the registry's (issue 37, items 3 and 4).

CONTRACT.md: an answer "that is not the registry's own JSON" is `unknown`. Whatever its status,
an answer without the registry's own JSON error (HTML, empty, plain text, JSON of another shape)
may come from something in front of the registry that passed the request on: its outcome is
unknown. Only the registry's own JSON error is `failed`. docs/reliability.md ("What an answer
means") holds the table; ANSWERS below is that table, each row answered over real HTTP by a local
server and read through the `http` adapter. Then, end to end against the simulator: a register
answered by Cloudflare's 524 whose request lands later, and a task list answering 501."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from registry import adapters
from registry.drain import drain_once, drain_until_idle
from registry.models import Registration, RegistrationAttempt
from registry.simulator import GATEWAY_ANSWERS
from tests.factories import PassportFactory, RegistrationFactory

JSON = "application/json"
HTML = "text/html; charset=UTF-8"
CF_524 = GATEWAY_ANSWERS["524"][1]
CF_520 = GATEWAY_ANSWERS["520"][1]
NGINX_500 = GATEWAY_ANSWERS["html_500"][1]


def own(code: str, **more) -> tuple[str, bytes]:
    """The registry's own JSON error (CONTRACT's wire protocol): an object whose code is a string."""
    return JSON, json.dumps({"code": code, **more}).encode()


def body(content_type: str, value) -> tuple[str, bytes]:
    return content_type, value if isinstance(value, bytes) else json.dumps(value).encode()


EMPTY = ("", b"")
TEXT = ("text/plain", b"error code: 520")
AWS_JSON = body(JSON, {"message": "Internal server error"})  # an API gateway's own JSON
CF_JSON = body(JSON, {"success": False, "errors": [{"code": 524, "message": "A timeout occurred"}]})
NUMBER_CODE = body(JSON, {"code": 524})
EMPTY_CODE = body(JSON, {"code": "", "message": "Internal server error"})
PROBLEM = body("application/problem+json", {"type": "about:blank", "title": "Bad Gateway", "status": 500})
REDIRECT = ("", b"")  # with a Location header (see Registry)

ACCEPTED = body(JSON, {"requestId": "req-1", "status": "checking"})
CHECKING = body(JSON, {"requestId": "req-1", "upi": "u", "status": "checking"})
REGISTERED = body(JSON, {"requestId": "req-1", "upi": "u", "status": "registered", "registrationId": "reg-1"})
GONE = body(
    JSON,
    {
        "requestId": "req-1",
        "upi": "u",
        "status": "registered",
        "registrationId": "reg-1",
        "deactivated": True,
    },
)
NO_TASKS = body(JSON, {"items": [], "nextCursor": None})

# (call, status, (content type, body), outcome): the table of docs/reliability.md, row by row.
ANSWERS = [
    # register: POST /dpp-registration-requests
    ("register", 202, ACCEPTED, "submitted"),
    ("register", 201, body(JSON, {"requestId": "req-1"}), "submitted"),
    ("register", 202, ("text/html", b"<h1>Accepted</h1>"), "unknown"),
    ("register", 202, EMPTY, "unknown"),
    ("register", 200, body(JSON, {"status": "checking"}), "unknown"),  # another shape: no requestId
    ("register", 204, EMPTY, "unknown"),
    ("register", 409, own("DUPLICATE_UPI", requestId="req-0"), "duplicate"),
    ("register", 409, own("DUPLICATE_UPI"), "unknown"),  # its requestId missing
    ("register", 409, own("QUOTA_EXCEEDED"), "failed"),
    ("register", 409, ("text/html", b"<h1>Conflict</h1>"), "unknown"),
    ("register", 422, own("VALIDATION_FAILED", errors=[{"message": "bad upi"}]), "rejected"),
    ("register", 422, AWS_JSON, "unknown"),
    ("register", 429, own("RATE_LIMITED"), "rate limited"),
    ("register", 429, (HTML, b"<h1>Error 1015: You are being rate limited</h1>"), "rate limited"),
    ("register", 307, REDIRECT, "unknown"),
    ("register", 500, own("INTERNAL"), "failed"),
    ("register", 503, own("UNAVAILABLE"), "failed"),
    ("register", 401, own("UNAUTHORIZED"), "failed"),
    ("register", 404, own("NOT_FOUND"), "failed"),
    ("register", 500, (HTML, NGINX_500), "unknown"),
    ("register", 500, EMPTY, "unknown"),
    ("register", 500, TEXT, "unknown"),
    ("register", 500, AWS_JSON, "unknown"),
    ("register", 500, NUMBER_CODE, "unknown"),
    ("register", 500, EMPTY_CODE, "unknown"),
    ("register", 500, body(JSON, {"code": "internal_error", "detail": "boom"}), "failed"),  # any code string
    ("register", 500, PROBLEM, "unknown"),
    ("register", 503, EMPTY, "unknown"),
    ("register", 401, (HTML, b"<h1>401 Authorization Required</h1>"), "unknown"),
    ("register", 403, (HTML, b"<h1>Access denied | registry.example.eu used Cloudflare</h1>"), "unknown"),
    ("register", 404, (HTML, b"<h1>404 Not Found</h1>"), "unknown"),
    ("register", 520, (HTML, CF_520), "unknown"),
    ("register", 520, TEXT, "unknown"),
    ("register", 524, (HTML, CF_524), "unknown"),
    ("register", 524, CF_JSON, "unknown"),
    ("register", 502, (HTML, b"<h1>502 Bad Gateway</h1>"), "unknown"),
    ("register", 504, own("GATEWAY_TIMEOUT"), "unknown"),  # 502, 504, 520-527, 530: a gateway's status
    ("register", 524, own("TIMEOUT"), "unknown"),
    # a status the call does not expect and that is no refusal, whatever the body: a 203 is a
    # transforming proxy's copy of the registry's 200 (the request was taken), a 2xx, a 1xx, past 599
    ("register", 203, own("NON_AUTHORITATIVE"), "unknown"),
    ("register", 299, own("ODD"), "unknown"),
    ("register", 600, own("ODD"), "unknown"),
    # check: GET /dpp-registration-requests/{requestId}
    ("check", 200, CHECKING, "checking"),
    ("check", 200, REGISTERED, "registered"),
    ("check", 200, GONE, "registered, deactivated"),
    ("check", 200, body(JSON, {"requestId": "req-1", "status": "lost"}), "failed"),  # the protocol's, broken
    ("check", 200, (HTML, b"<h1>Maintenance</h1>"), "unknown"),
    ("check", 200, EMPTY, "unknown"),
    ("check", 200, AWS_JSON, "unknown"),  # another shape: no status
    ("check", 404, own("NOT_FOUND"), "failed: unknown request"),
    ("check", 404, (HTML, b"<h1>404 Not Found</h1>"), "unknown"),
    ("check", 429, own("RATE_LIMITED"), "rate limited"),
    ("check", 307, REDIRECT, "unknown"),
    ("check", 500, own("INTERNAL"), "failed"),
    ("check", 500, (HTML, NGINX_500), "unknown"),
    ("check", 503, EMPTY, "unknown"),
    ("check", 524, (HTML, CF_524), "unknown"),
    ("check", 502, own("BAD_GATEWAY"), "unknown"),
    ("check", 203, own("NON_AUTHORITATIVE"), "unknown"),
    ("check", 999, own("ODD"), "unknown"),
    # deactivate: POST /registrations/{registrationId}/deactivate
    ("deactivate", 204, EMPTY, "deactivated"),
    ("deactivate", 200, EMPTY, "deactivated"),
    ("deactivate", 200, body(JSON, {"registrationId": "reg-1", "active": False}), "deactivated"),
    ("deactivate", 200, (HTML, b"<h1>OK</h1>"), "unknown"),
    ("deactivate", 202, body(JSON, {"queued": True}), "unknown"),  # not the protocol's 200 or 204
    ("deactivate", 202, own("QUEUED"), "unknown"),  # accepted, to be done: it may land
    ("deactivate", 404, own("NOT_FOUND"), "already gone"),
    ("deactivate", 404, (HTML, b"<h1>404 Not Found</h1>"), "unknown"),
    ("deactivate", 404, EMPTY, "unknown"),
    ("deactivate", 429, own("RATE_LIMITED"), "rate limited"),
    ("deactivate", 307, REDIRECT, "unknown"),
    ("deactivate", 409, own("LOCKED"), "failed"),
    ("deactivate", 500, own("INTERNAL"), "failed"),
    ("deactivate", 500, (HTML, NGINX_500), "unknown"),
    ("deactivate", 520, (HTML, CF_520), "unknown"),
    ("deactivate", 524, (HTML, CF_524), "unknown"),
    ("deactivate", 600, own("ODD"), "unknown"),
    # task list: GET /dpp-registration-requests?limit=200 (find_submission; its first page)
    ("task list", 200, NO_TASKS, "not found (exhaustive)"),
    ("task list", 200, (HTML, b"<h1>Maintenance</h1>"), "unreadable"),
    ("task list", 200, AWS_JSON, "unreadable"),
    ("task list", 404, own("NOT_SUPPORTED"), "cannot be searched"),
    ("task list", 404, (HTML, b"<h1>404 Not Found</h1>"), "cannot be searched"),
    ("task list", 405, EMPTY, "cannot be searched"),
    ("task list", 501, own("NOT_IMPLEMENTED"), "cannot be searched"),
    ("task list", 501, (HTML, b"<h1>Error response</h1><p>Error code: 501</p>"), "cannot be searched"),
    ("task list", 429, own("RATE_LIMITED"), "unreadable"),
    ("task list", 307, REDIRECT, "unreadable"),
    ("task list", 500, own("INTERNAL"), "unreadable"),
    ("task list", 503, EMPTY, "unreadable"),
    ("task list", 524, (HTML, CF_524), "unreadable"),
]


class Registry:
    """A local HTTP server answering every request with `answer`: (status, content type, body);
    a 3xx points elsewhere, a 429 asks for a second's wait. It keeps what it was asked."""

    def __init__(self):
        self.answer = (200, "", b"")
        self.asked: list[tuple[str, str]] = []
        self.headers: list[dict] = []  # each request's
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.asked.append((self.command, self.path))
                outer.headers.append(dict(self.headers))
                status, content_type, data = outer.answer
                self.send_response(status)
                if content_type:
                    self.send_header("Content-Type", content_type)
                if 300 <= status < 400:
                    self.send_header("Location", "https://registry.invalid/elsewhere")
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.adapter = adapters.HttpRegistry(
            base_url=f"http://127.0.0.1:{self.server.server_address[1]}",
            token="t",
            # Bounds a hung server's test would reach, never a loaded machine's: the request's
            # deadline runs from before the connect, and a process not scheduled for 2 s made a
            # row's outcome a timeout's ("failed" before it was sent, "unknown" after).
            timeout=60,
            lookup_seconds=60,
        )

    def close(self):
        self.adapter.close()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry():
    server = Registry()
    yield server
    server.close()


def timed_out(exc: Exception) -> str | None:
    """The outcome if `exc` says the request (or the lookup) ran out of time: no row's, though its
    class is an "unknown", "failed" or "unreadable" one (no answer was read)."""
    said = str(exc)
    return "timed out" if "timed out after" in said or "not read to its end within" in said else None


def outcome(call: str, adapter, reg=None) -> str:
    """What the adapter made of the answer, in the table's words."""
    try:
        if call == "register":
            answer = adapter.register(reg)
        elif call == "check":
            answer = adapter.check("req-1")
        elif call == "deactivate":
            answer = adapter.deactivate("reg-1")
        else:
            answer = adapter.find_submission("https://id.example.eu/01/1/21/X")
    except adapters.RateLimited:
        return "rate limited"
    except adapters.OutcomeUnknown as exc:
        return timed_out(exc) or "unknown"
    except adapters.UnknownRequest:
        return "failed: unknown request"
    except adapters.Retryable as exc:
        return timed_out(exc) or "failed"
    except adapters.RegistryUnreadable as exc:
        return timed_out(exc) or "unreadable"
    if isinstance(answer, adapters.Accepted):
        return "submitted"
    if isinstance(answer, adapters.Duplicate):
        return "duplicate"
    if isinstance(answer, adapters.Rejected):
        return "rejected"
    if isinstance(answer, adapters.CheckAnswer):
        return answer.status + (", deactivated" if answer.deactivated else "")
    if isinstance(answer, adapters.Unsupported):
        return "cannot be searched"
    if isinstance(answer, adapters.NotFound):
        return f"not found ({'exhaustive' if answer.exhaustive else 'not exhaustive'})"
    return answer  # deactivate: "deactivated" or "already gone"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "call, status, answer, expected",
    ANSWERS,
    ids=[f"{call}-{status}-{answer[0] or 'none'}-{i}" for i, (call, status, answer, _) in enumerate(ANSWERS)],
)
def test_what_an_answer_means(registry, call, status, answer, expected):
    registry.answer = (status, *answer)
    reg = RegistrationFactory() if call == "register" else None

    assert outcome(call, registry.adapter, reg) == expected
    assert len(registry.asked) == 1  # asked once: nothing followed, nothing retried


def test_the_registrys_reads_ask_every_cache_in_front_of_it_to_ask_the_registry(registry):
    """A task list served from a cache in front of the registry (a CDN's "cache everything" rule)
    would be a page of before a register landed, taken by abandon for proof that nothing is held.
    Each read says `Cache-Control: no-cache` (RFC 9111 5.2.1.4: a cache must not answer it
    without asking the origin). Before: no such header."""
    registry.answer = (200, *NO_TASKS)
    registry.adapter.find_submission("https://id.example.eu/01/1/21/X")
    registry.answer = (200, *CHECKING)
    registry.adapter.check("req-1")
    assert [h.get("Cache-Control") for h in registry.headers] == ["no-cache", "no-cache"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status, answer, says",
    [
        (500, (HTML, NGINX_500), "registry answered HTTP 500 to register with content type text/html, not the "
         "registry's own JSON error (a gateway's or a proxy's answer?): the request may have reached the registry: "
         "<html> <head><title>500 Internal Server Error</title>"),
        (503, EMPTY, "registry answered HTTP 503 to register with content type none, not the registry's own JSON "
         "error (a gateway's or a proxy's answer?): the request may have reached the registry"),
        (524, (HTML, CF_524), "registry answered HTTP 524 to register (a gateway's answer: the request may have "
         "reached the registry): <!DOCTYPE html>"),
    ],
)  # fmt: skip
def test_an_unknown_answer_says_what_answered_and_that_the_request_may_have_landed(
    registry, status, answer, says
):
    registry.answer = (status, *answer)
    with pytest.raises(adapters.OutcomeUnknown) as raised:
        registry.adapter.register(RegistrationFactory())
    said = str(raised.value)
    assert said.startswith(says) and said.isprintable() and len(said) < 600, said
    assert not said.endswith(": ")


@pytest.mark.parametrize("status", [201, 202, 206])
def test_a_deactivates_2xx_other_than_200_and_204_is_a_protocol_error_of_unknown_outcome(registry, status):
    """Unknown (refusal's rule would say so too), and told as a protocol error: its attempt line
    counts in registry_protocol_errors_total, as every answer that is not the protocol's."""
    registry.answer = (status, "", b"")
    with pytest.raises(adapters.OutcomeUnknown) as raised:
        registry.adapter.deactivate("reg-1")
    said = str(raised.value)
    assert said.startswith(adapters.PROTOCOL_ERROR) and "(the protocol's are 200 and 204)" in said, said


# -- end to end: the drain, the http adapter, the simulator ----------------------------------------------

NEVER = 600  # seconds: a landing_delay no test reaches; land_pending() lands the request


def published():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    return passport


def reg_of(passport) -> Registration:
    return Registration.objects.select_related("passport").get(passport=passport)


def held(sim, upi) -> list[dict]:
    return [r for r in sim.requests.values() if r["upi"] == upi]


@pytest.fixture
def gateway(registry_sim, settings):
    """The simulator's next register is answered by its gateway and lands later; a failed attempt
    backs off past the test, and the settle window outlasts it."""
    settings.ODAL_BACKOFF_BASE_SECONDS = 600
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 600
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER)
    return registry_sim


@pytest.mark.django_db
@pytest.mark.parametrize("answer", sorted(GATEWAY_ANSWERS))
def test_abandon_after_a_register_a_gateway_answered_is_409_outcome_unknown_not_200(
    admin_api, gateway, answer
):
    """The issue: a register answered by Cloudflare's 524 (or a 520, an HTML 500) was `failed`,
    abandon answered 200 abandoned at once, and the request landed at the registry 9 s later."""
    sim = gateway
    sim.faults["gateway_answer"] = answer
    passport = published()

    report = drain_once()
    reg = reg_of(passport)
    before = Registration.objects.filter(pk=reg.pk).values().get(), AuditEntry.objects.count()

    response = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "the registry refused it"})

    assert response.status_code == 409, response.json()
    assert response.json()["code"] == "outcome_unknown" and "retryAfter" in response.json()
    assert (Registration.objects.filter(pk=reg.pk).values().get(), AuditEntry.objects.count()) == before
    assert (report.unknown, report.failed) == (1, 0), reg.last_error
    assert sim.gateway_answered == {answer: 1}
    assert (reg.status, reg.attempts, reg.claim_token) == ("pending", 1, None)
    assert reg.last_unknown_at is not None
    [line] = reg.attempt_log.all()
    assert (
        line.outcome == RegistrationAttempt.Outcome.UNKNOWN
        and f"HTTP {GATEWAY_ANSWERS[answer][0]}" in line.answer
    )
    assert held(sim, passport.upi) == [] and sim.landing(passport.upi) == 1  # on its way
    sim.land_pending()  # the request lands, as the issue saw it 9 s later
    assert len(held(sim, passport.upi)) == 1
    response = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "the registry refused it"})
    assert (response.status_code, response.json()["code"]) == (409, "registry_holds_submission")


@pytest.mark.django_db
def test_a_suspend_after_a_register_a_gateway_answered_deactivates_what_lands(gateway, settings):
    """The issue: the suspend ended `suspended`, and what landed was never deactivated."""
    sim = gateway
    sim.faults["gateway_answer"] = "520"
    settings.ODAL_REGISTRY_SETTLE_SECONDS = 3
    passport = published()
    report = drain_once()

    lifecycle.suspend(passport.pk, actor="test")
    assert (reg_of(passport).status, reg_of(passport).operation) == ("pending", "deactivate")
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    drain_once()  # the finding, while the request is still on its way: the task list shows nothing
    sim.land_pending()  # then it lands
    drain_until_idle(max_seconds=30, linger_seconds=10)

    reg = reg_of(passport)
    assert reg.status == "deactivated", (reg.status, reg.last_error)
    assert report.unknown == 1
    [request] = held(sim, passport.upi)
    assert request["status"] == "registered" and not sim.registrations[request["registrationId"]]["active"]


# -- item 4: a task list answering 501 cannot be searched ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", [404, 405, 501])
def test_abandon_against_a_task_list_answering_404_405_or_501_is_422_cannot_be_searched(
    admin_api, registry_sim, settings, status
):
    """The issue: 501 answered `502 registry_unreadable … safe to retry`, where 404 and 405 were 422."""
    settings.ODAL_BACKOFF_BASE_SECONDS = 600
    registry_sim.faults.update(register_5xx=1, unsearchable=True, unsearchable_status=status)
    passport = published()
    assert drain_once().failed == 1
    before = Registration.objects.filter(passport=passport).values().get()

    response = admin_api.post(f"dpp/{passport.pk}/registry/abandon", {"reason": "the registry refused it"})

    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "registry_unsearchable"
    assert f"HTTP {status}" in response.json()["detail"]
    assert Registration.objects.filter(passport=passport).values().get() == before


@pytest.mark.django_db
def test_a_suspends_finding_against_a_task_list_answering_501_says_it_cannot_be_searched(registry_sim):
    registry_sim.faults["register_5xx"] = 1
    passport = published()
    assert drain_once().failed == 1
    lifecycle.suspend(passport.pk, actor="test")
    registry_sim.faults.update(unsearchable=True, unsearchable_status=501)

    assert drain_once().failed == 1

    reg = reg_of(passport)
    assert (reg.status, reg.operation, reg.handle) == ("pending", "deactivate", "")
    assert reg.last_error.startswith("the registry cannot be searched (")
    assert "HTTP 501" in reg.last_error and "task list could not be read" not in reg.last_error
