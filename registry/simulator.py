"""A registry simulator speaking CONTRACT.md's wire protocol, with fault injection, for demos
and tests (`odal registry simulate --port 8100`).

Faults are switched on at start (`--fault name=value`) or at run time with
`POST /_faults {"name": value, ...}` (`GET /_faults` shows them, `POST /_reset` forgets
everything). The faults:

- latency (seconds): every answer waits this long first (`--latency-ms N` sets it, with a jitter
  of 20 %);
- latency_jitter (fraction, 0 to 1): each wait is latency times a random 1 ± this (default 0);
- rate_limit (requests per second; 0, the default: none): past this many requests admitted in the
  last second, the registry answers 429 with Retry-After, at once and doing nothing (`--rate-limit
  N/s` sets it). What arrived is counted (RegistryState.rate_seen, GET /_stats) whether admitted
  or not, so a test or the bench can read the rate the registry actually saw;
- retry_after (seconds; 0, the default: until the last second's window frees, at least 1): what a
  429's Retry-After says;
- retry_after_http_date (bool): Retry-After as an HTTP-date instead of seconds;
- register_5xx (count): the next N register calls answer 503 and keep nothing;
- lost_reply (count): the next N register calls keep the request but answer 503, as if the
  reply was lost on the way back;
- refuse_upi_containing (text): register calls for such UPIs always answer 503 UNAVAILABLE and
  keep nothing (a registry unavailable for them, every time: the case for abandon; `make run`'s
  demo passport OUTAGE-0503);
- reject_upi_containing (text): register calls for such UPIs answer 422 VALIDATION_FAILED with
  its errors, as the registry refuses a product (`make run`'s demo passport REFUSE-0666);
- checks_until_registered (count): a request is registered on this check (default 1);
- partial_task_list (bool): the task list also shows a task still `received` (upi unknown);
- unsearchable (bool): the task list answers unsearchable_status (the registry cannot be searched);
- unsearchable_status (404, 405 or 501; default 404): the status an unsearchable task list answers;
- task_list_5xx (bool): the task list's second page answers 503;
- page_size (count): the task list's largest page (default 50);
- task_list_newest_first (bool): the task list lists the newest request first (a request made
  while someone reads the list lands on its first page, which they may have read already);
- task_list_latency (seconds): every task-list page waits this long before it is read;
- honour_idempotency_key (bool): a repeated Idempotency-Key answers 202 with the request it
  made before (off by default, so a retry after a lost reply meets DUPLICATE_UPI);
- task_list_repeat_cursor (bool): the task list answers the same nextCursor on every page (read
  on, it would never end);
- request_id_length (count): requestIds and registrationIds made from now on are padded to this
  many characters (0: their usual dozen or so);
- upi_spelling (text, one of UPI_SPELLINGS; empty: as submitted): how the task list spells UPIs:
    upper    scheme and host in upper case, with the default port (HTTPS://ID.EXAMPLE.EU:443/…);
    escaped  the path's letters and digits percent-encoded, in lower-case hex (/%30%31/…);
- hostile_answer (text, one of HOSTILE_ANSWERS; empty: off): the registry does its work as
  usual, but its answer is spoiled on the way back:
    nul                 a NUL character (U+0000) at the end of every string in the JSON;
    invalid_utf8        bytes that are not UTF-8 at the end of every string in the JSON;
    huge                the answer padded to 10 MB;
    trickle             the body sent one byte every 0.25 s (after 100 bytes of leading blanks);
    redirect            307 to https://registry.invalid/… instead of the answer;
    reset               half the body, then a TCP reset;
    malformed_json      the JSON cut in half;
    wrong_content_type  the JSON labelled text/html;
    wrong_shape         every string in the JSON a number, every list an object;
    deep_json           a JSON array nested 100,000 deep instead of the answer;
- hostile_on (text): which answers hostile_answer spoils, a comma-separated list of register,
  check and task_list (default all three);
- hostile_upi_containing (text): only register and check answers for such UPIs are spoiled
  (the task list, which names many UPIs, is spoiled whenever it is in hostile_on);
- hostile_count (count): only the next N answers are spoiled, then hostile_answer switches
  itself off; 0 (the default) spoils every one;
- late_landing (count): the next N register calls land late, as behind a gateway that passes a
  request on after its client gave up: the registry stores nothing now, holds the connection
  until the request lands and then answers 504 GATEWAY_TIMEOUT (which the client, its timeout
  shorter than landing_delay, no longer reads);
- late_landing_upi_containing (text): the first register call for each UPI containing this lands
  late too (the UPI's later calls are answered as usual);
- landing_delay (seconds, default 15: longer than odal's default ODAL_REGISTRY_TIMEOUT_SECONDS):
  how long after it arrived a late register lands. It then meets the registry as a register
  arriving at that moment would: a request held for its UPI (a retry that came meanwhile, say)
  makes it DUPLICATE_UPI and it stores nothing, as does its Idempotency-Key under
  honour_idempotency_key or reject_upi_containing; register_5xx, lost_reply and
  refuse_upi_containing, the registry being unavailable when a request arrives, do not refuse it
  (it got through, later). The answer it gets there reaches nobody (RegistryState.landings keeps
  it, for tests). RegistryState.land_pending() lands every late register now, and reset()
  forgets them: none lands after it;
- late_landing_reset (bool): a late register's connection is reset at once instead of held (a
  connection broken after the request was sent); it still lands landing_delay later;
- gateway_answer (text, one of GATEWAY_ANSWERS; empty: off): a late register is answered at once
  by the gateway in front of the registry instead of held, with one of its own pages (not the
  registry's JSON), and still lands landing_delay later:
    520       Cloudflare's "Web server is returning an unknown error" (HTML);
    524       Cloudflare's "A timeout occurred" (HTML): the origin took the request, no answer in time;
    html_500  a proxy's HTML "500 Internal Server Error";
  (late_landing_reset, when on, wins: the connection is reset.) RegistryState.gateway_answered
  counts the answers given;
- duplicate_deactivated (bool): a register for a UPI whose registration the registry deactivated
  answers DUPLICATE_UPI naming that request, as a registry that still holds a deactivated
  registration would (odal does not adopt it). Off, the default: a deactivated registration is
  not held, and the register makes a fresh request.
Duplicates need no switch: a second request for a UPI the registry holds answers 409
DUPLICATE_UPI with the held requestId (not for a request rejected, or whose registration was
deactivated). A check of a request whose registration was deactivated says so ("deactivated":
true beside its registrationId).
"""

import bisect
import json
import math
import os
import random
import re
import socket
import struct
import sys
import threading
import time
import uuid
from collections import Counter, deque
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DEFAULT_FAULTS = {
    "latency": 0.0,
    "latency_jitter": 0.0,
    "rate_limit": 0,
    "retry_after": 0,
    "retry_after_http_date": False,
    "register_5xx": 0,
    "lost_reply": 0,
    "refuse_upi_containing": "",
    "reject_upi_containing": "",
    "checks_until_registered": 1,
    "partial_task_list": False,
    "unsearchable": False,
    "unsearchable_status": 404,
    "task_list_5xx": False,
    "page_size": 50,
    "task_list_newest_first": False,
    "task_list_latency": 0.0,
    "honour_idempotency_key": False,
    "task_list_repeat_cursor": False,
    "request_id_length": 0,
    "upi_spelling": "",
    "hostile_answer": "",
    "hostile_on": "register,check,task_list",
    "hostile_upi_containing": "",
    "hostile_count": 0,
    "late_landing": 0,
    "late_landing_upi_containing": "",
    "landing_delay": 15.0,
    "late_landing_reset": False,
    "gateway_answer": "",
    "duplicate_deactivated": False,
}
HOSTILE_ANSWERS = (
    "nul", "invalid_utf8", "huge", "trickle", "redirect", "reset", "malformed_json",
    "wrong_content_type", "wrong_shape", "deep_json",
)  # fmt: skip
UPI_SPELLINGS = ("upper", "escaped")
UNSEARCHABLE_STATUSES = (404, 405, 501)
# What the gateway in front of the registry answers a register it passed on late (gateway_answer):
# status and an HTML page of its own, never the registry's JSON.
GATEWAY_ANSWERS = {
    "520": (
        520,
        b"<!DOCTYPE html><html><head><title>registry.example.eu | 520: Web server is returning an unknown "
        b"error</title></head><body><h1>Web server is returning an unknown error</h1>"
        b"<p>Error code 520</p><p>Cloudflare Ray ID: 8f1c2a3b4c5d6e7f</p></body></html>",
    ),
    "524": (
        524,
        b"<!DOCTYPE html><html><head><title>registry.example.eu | 524: A timeout occurred</title></head>"
        b"<body><h1>A timeout occurred</h1><p>Error code 524</p><p>The origin web server timed out "
        b"responding to this request.</p><p>Cloudflare Ray ID: 8f1c2a3b4c5d6e80</p></body></html>",
    ),
    "html_500": (
        500,
        b"<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
        b"<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
    ),
}
HEEDED_WITHIN = 0.25  # seconds after a 429 that requests already on their way may still arrive


def fault_problem(name: str, value) -> str | None:
    """What is wrong with switching fault `name` to `value`, or None if nothing is."""
    if name not in DEFAULT_FAULTS:
        return f"unknown fault {name}"
    if name == "hostile_answer" and value not in ("", *HOSTILE_ANSWERS):
        return f"hostile_answer is one of {', '.join(HOSTILE_ANSWERS)} (or empty: off)"
    if name == "gateway_answer" and value not in ("", *GATEWAY_ANSWERS):
        return f"gateway_answer is one of {', '.join(GATEWAY_ANSWERS)} (or empty: off)"
    if name == "unsearchable_status" and (isinstance(value, bool) or value not in UNSEARCHABLE_STATUSES):
        return f"unsearchable_status is one of {', '.join(map(str, UNSEARCHABLE_STATUSES))}"
    if name == "upi_spelling" and value not in ("", *UPI_SPELLINGS):
        return f"upi_spelling is one of {', '.join(UPI_SPELLINGS)} (or empty: as submitted)"
    if name == "latency_jitter" and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
    ):
        return "latency_jitter is a fraction from 0 to 1 (0.2: each wait 80 % to 120 % of latency)"
    if name in ("rate_limit", "retry_after") and (
        isinstance(value, bool) or not isinstance(value, int) or value < 0
    ):
        return (
            f"{name} is a whole number, 0 or more (0: {'no limit' if name == 'rate_limit' else 'computed'})"
        )
    if name in ("retry_after_http_date", "late_landing_reset", "duplicate_deactivated") and not isinstance(
        value, bool
    ):
        return f"{name} is true or false"
    if name == "late_landing" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        return "late_landing is a whole number, 0 or more (how many register calls land late)"
    if name == "landing_delay" and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600
    ):
        return "landing_delay is seconds, from 0 to 3600"
    if name == "late_landing_upi_containing" and not isinstance(value, str):
        return "late_landing_upi_containing is text (empty: off)"
    return None


def gateway_faults(rng: random.Random) -> dict:
    """One roll of the gateway faults the long runs switch on and off (make torture, make
    partition): the next 0 to 2 register calls are answered by the gateway, one of GATEWAY_ANSWERS
    at random, and land landing_delay later."""
    return {"late_landing": rng.randint(0, 2), "gateway_answer": rng.choice(sorted(GATEWAY_ANSWERS))}


def spelt(upi, spelling: str):
    """`upi` as the task list spells it under the fault upi_spelling (another spelling of the same
    UPI: odal must read it as the same)."""
    if not isinstance(upi, str) or not spelling:
        return upi
    scheme, sep, rest = upi.partition("://")
    host, slash, path = rest.partition("/")
    if spelling == "upper":
        return f"{scheme.upper()}{sep}{host.upper()}{'' if ':' in host else ':443'}{slash}{path}"
    return (
        f"{scheme}{sep}{host}{slash}"
        + re.sub("[A-Za-z0-9]", lambda m: f"%{ord(m.group()):02x}", path.partition("?")[0])
        + "".join(path.partition("?")[1:])
    )


class LateRegister:
    """A register call that lands late (the fault late_landing): what it asked, and when."""

    def __init__(self, body: dict, key: str | None, delay: float, reset: bool, gateway: str = ""):
        self.body, self.key, self.reset, self.gateway = body, key, reset, gateway
        self.upi = body.get("upi")
        self.arrived = time.monotonic()
        self.lands_at = self.arrived + delay
        self.done = False  # landed, or forgotten by a reset
        self.woken = threading.Event()  # set by land_pending and reset: stop waiting


class RegistryState:
    def __init__(self, token: str, faults: dict | None = None):
        self.token = token
        self.lock = threading.Lock()
        self.faults = {**DEFAULT_FAULTS, **(faults or {})}
        self.requests: dict[str, dict] = {}  # requestId -> request
        self.by_key: dict[str, str] = {}  # Idempotency-Key -> requestId
        self.registrations: dict[str, dict] = {}  # registrationId -> {"requestId", "active"}
        self.calls: list[tuple[str, str]] = []
        self.generation = 0  # bumped by reset()
        self.late: list[LateRegister] = []  # late registers on their way (not yet landed)
        self.late_upis: set[str] = set()  # UPIs whose first register late_landing_upi_containing took
        # How each late register landed: {"upi", "status" (what the registry answered then),
        # "requestId" (the one it made, or met: DUPLICATE_UPI, its Idempotency-Key; None if
        # refused), "afterSeconds" (since it arrived)}
        self.landings: list[dict] = []
        self.gateway_answered: Counter[str] = Counter()  # gateway_answer: the answers given, by kind
        self._forget_traffic()

    def _forget_traffic(self) -> None:
        self.arrivals: list[float] = []  # time.monotonic() of every protocol request
        self.admitted: deque[float] = deque()  # ...of those admitted in the last second (rate_limit)
        self.refusals: list[tuple[float, float]] = []  # (when, Retry-After seconds) of every 429
        self.in_flight = 0
        self.most_in_flight = 0

    def reset(self) -> None:
        with self.lock:
            self.generation += 1  # a request that arrived before the reset changes nothing after it
            self.faults = dict(DEFAULT_FAULTS)
            self.requests.clear()
            self.by_key.clear()
            self.registrations.clear()
            self.calls.clear()
            for late in self.late:  # forgotten: it lands in no later test or demo
                late.done = True
                late.woken.set()
            self.late.clear()
            self.late_upis.clear()
            self.landings.clear()
            self.gateway_answered.clear()
            self._forget_traffic()

    def arrive(self) -> tuple[int, dict, float] | None:
        """A protocol request arrives: counted, and over rate_limit refused with a 429 (its
        status, body and Retry-After seconds); None when it is admitted (and then in flight until
        `leave`)."""
        now = time.monotonic()
        with self.lock:
            self.arrivals.append(now)
            limit = int(self.faults["rate_limit"])
            if limit:
                while self.admitted and self.admitted[0] <= now - 1.0:
                    self.admitted.popleft()
                if len(self.admitted) >= limit:
                    frees_in = self.admitted[0] + 1.0 - now
                    retry_after = int(self.faults["retry_after"]) or max(1, math.ceil(frees_in))
                    self.refusals.append((now, retry_after))
                    return 429, {"code": "RATE_LIMITED"}, retry_after
                self.admitted.append(now)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return None

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def rate_seen(self, window: float = 10.0, heeded_within: float = HEEDED_WITHIN) -> dict:
        """What the registry saw: requests (admitted or not), 429s, the most requests that
        arrived within any `window` seconds (and that over the window: the highest rate it saw
        over any such window), the most in flight at once,
        and the requests that arrived while a 429's Retry-After ran, more than `heeded_within`
        after it (requests already on their way may arrive that late): unheeded."""
        with self.lock:
            arrivals, refusals = sorted(self.arrivals), list(self.refusals)
            most_in_flight = self.most_in_flight
        most, first = 0, 0
        for last, at in enumerate(arrivals):
            while arrivals[first] <= at - window:
                first += 1
            most = max(most, last - first + 1)
        paused = sorted((t + heeded_within, t + r) for t, r in refusals if r > heeded_within)
        unheeded, spans = 0, []
        for start, end in paused:  # the union of the pauses, then the arrivals inside it
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        for start, end in spans:
            unheeded += bisect.bisect_left(arrivals, end) - bisect.bisect_right(arrivals, start)
        return {
            "requests": len(arrivals),
            "refused": len(refusals),
            "unheeded": unheeded,
            "window": window,
            "mostInWindow": most,
            "maxRatePerSecond": most / window,
            "seconds": arrivals[-1] - arrivals[0] if arrivals else 0.0,
            "mostInFlight": most_in_flight,
        }

    def hold(self, upi: str, request_id: str, status: str = "checking") -> None:
        """Make the registry hold a request for `upi` (as if someone had submitted it), for tests
        and demos of abandon's answers."""
        with self.lock:
            self.requests[request_id] = {
                "requestId": request_id, "upi": upi, "status": status, "checks": 0, "registrationId": None,
            }  # fmt: skip

    def hostile(self, route: str, upi=None) -> str:
        """The hostile answer this `route`'s answer gets (for a request about `upi`), or ""."""
        with self.lock:
            kind = self.faults["hostile_answer"]
            if not kind or route not in self.faults["hostile_on"].split(","):
                return ""
            marker = self.faults["hostile_upi_containing"]
            if marker and route != "task_list" and not (isinstance(upi, str) and marker in upi):
                return ""
            if self.faults["hostile_count"]:
                self.faults["hostile_count"] -= 1
                if not self.faults["hostile_count"]:
                    self.faults["hostile_answer"] = ""
            return kind

    def _new_id(self, prefix: str) -> str:
        """A fresh id, padded to request_id_length characters if that fault is on."""
        made = f"{prefix}-{uuid.uuid4().hex[:12]}"
        return made.ljust(int(self.faults["request_id_length"]), "x")

    def _take(self, name: str) -> bool:
        if self.faults.get(name, 0) > 0:
            self.faults[name] -= 1
            return True
        return False

    def _holds(self, request: dict) -> bool:
        """Whether the registry still holds `request` for its UPI (a later register for it is a
        duplicate): not if it rejected it, nor if it deactivated the registration it granted
        (unless duplicate_deactivated)."""
        if request["status"] == "rejected":
            return False
        return self.faults["duplicate_deactivated"] or self._active(request)

    def _active(self, request: dict) -> bool:
        """False once the registration granted for `request` was deactivated."""
        granted = request.get("registrationId")
        return not granted or self.registrations.get(granted, {}).get("active", True)

    def register(self, body: dict, key: str | None) -> tuple[int, dict]:
        with self.lock:
            return self._register(body, key)

    def _register(self, body: dict, key: str | None, *, landing: bool = False) -> tuple[int, dict]:
        """A register call, under the lock. One `landing` late got through: the faults of a
        registry unavailable when a request arrives (register_5xx, refuse_upi_containing,
        lost_reply) are not its."""
        upi = body.get("upi")
        if not isinstance(upi, str) or not upi or not body.get("operatorId"):
            return 422, {
                "code": "INVALID_REQUEST",
                "errors": [{"message": "upi and operatorId are required"}],
            }
        honour = self.faults["honour_idempotency_key"]
        if honour and key in self.by_key and self._holds(self.requests[self.by_key[key]]):
            held = self.requests[self.by_key[key]]
            if held["upi"] == upi:
                return 202, {"requestId": held["requestId"], "status": held["status"]}
        refuse = self.faults["refuse_upi_containing"]
        if not landing and ((refuse and refuse in upi) or self._take("register_5xx")):
            return 503, {"code": "UNAVAILABLE"}
        reject = self.faults["reject_upi_containing"]
        if reject and reject in upi:
            return 422, {
                "code": "VALIDATION_FAILED",
                "errors": [{"message": f"upi {upi} fails validation"}],
            }
        for held in self.requests.values():
            if held["upi"] == upi and self._holds(held):
                return 409, {"code": "DUPLICATE_UPI", "requestId": held["requestId"]}
        request_id = self._new_id("req")
        self.requests[request_id] = {
            "requestId": request_id, "upi": upi, "status": "checking", "checks": 0, "registrationId": None,
        }  # fmt: skip
        if key:
            self.by_key[key] = request_id
        if not landing and self._take("lost_reply"):
            return 503, {"code": "UNAVAILABLE"}
        return 202, {"requestId": request_id, "status": "checking"}

    # -- late landings (the fault late_landing) -------------------------------------------------

    def lands_late(self, body: dict, key: str | None) -> LateRegister | None:
        """Whether this register call lands late (late_landing, late_landing_upi_containing):
        the late register, now on its way, or None."""
        upi = body.get("upi")
        with self.lock:
            marker = self.faults["late_landing_upi_containing"]
            if marker and isinstance(upi, str) and marker in upi and upi not in self.late_upis:
                self.late_upis.add(upi)
            elif not self._take("late_landing"):
                return None
            late = LateRegister(
                body, key, float(self.faults["landing_delay"]), bool(self.faults["late_landing_reset"]),
                self.faults["gateway_answer"],
            )  # fmt: skip
            self.late.append(late)
            return late

    def await_landing(self, late: LateRegister) -> None:
        """Wait until `late` is due to land (or land_pending or reset says so), then land it."""
        while not late.woken.is_set() and (left := late.lands_at - time.monotonic()) > 0:
            late.woken.wait(left)
        self.land(late)

    def land(self, late: LateRegister) -> bool:
        """`late` reaches the registry now, unless it landed already or a reset forgot it."""
        with self.lock:
            if late.done:
                return False
            late.done = True
            self.late.remove(late)
            status, answer = self._register(late.body, late.key, landing=True)
            self.landings.append({
                "upi": late.upi, "status": status, "requestId": answer.get("requestId"),
                "afterSeconds": round(time.monotonic() - late.arrived, 3),
            })  # fmt: skip
            return True

    def land_pending(self) -> int:
        """Land every late register still on its way, now (a test need not wait landing_delay for
        it); returns how many landed."""
        with self.lock:
            pending = list(self.late)
        landed = 0
        for late in pending:
            landed += self.land(late)
            late.woken.set()
        return landed

    def landing(self, upi: str | None = None) -> int:
        """How many late registers (for `upi`, if given) are still on their way."""
        with self.lock:
            return sum(1 for late in self.late if upi is None or late.upi == upi)

    def check(self, request_id: str) -> tuple[int, dict]:
        with self.lock:
            held = self.requests.get(request_id)
            if held is None:
                return 404, {"code": "NOT_FOUND"}
            if held["status"] == "checking":
                held["checks"] += 1
                if held["checks"] >= self.faults["checks_until_registered"]:
                    held["status"] = "registered"
                    held["registrationId"] = self._new_id("reg")
                    self.registrations[held["registrationId"]] = {"requestId": request_id, "active": True}
            answer = {k: held[k] for k in ("requestId", "upi", "status")}
            if held["registrationId"]:
                answer["registrationId"] = held["registrationId"]
                if not self._active(held):
                    answer["deactivated"] = True
            return 200, answer

    def task_list(self, cursor: str | None, limit: int) -> tuple[int, dict]:
        time.sleep(float(self.faults["task_list_latency"]))  # not under the lock: others go on
        with self.lock:
            if self.faults["unsearchable"]:
                return int(self.faults["unsearchable_status"]), {"code": "NOT_SUPPORTED"}
            spelling = self.faults["upi_spelling"]
            items = [
                {"requestId": r["requestId"], "upi": spelt(r["upi"], spelling), "status": r["status"]}
                for r in self.requests.values()
            ]
            if self.faults["task_list_newest_first"]:
                items.reverse()
            if self.faults["partial_task_list"]:
                items.append({"requestId": "req-unread", "upi": None, "status": "received"})
            start = int(cursor) if cursor and cursor.isdigit() else 0
            if start and self.faults["task_list_5xx"]:
                return 503, {"code": "UNAVAILABLE"}
            size = max(1, min(limit, int(self.faults["page_size"])))
            page = items[start : start + size]
            next_cursor = str(start + size) if start + size < len(items) else None
            if self.faults["task_list_repeat_cursor"]:
                next_cursor = "again"
            return 200, {"items": page, "nextCursor": next_cursor}

    def deactivate(self, registration_id: str) -> tuple[int, dict]:
        with self.lock:
            held = self.registrations.get(registration_id)
            if held is None or not held["active"]:
                return 404, {"code": "NOT_FOUND"}
            held["active"] = False
            return 204, {}


def write_answer(
    handler, status: int, data: bytes = b"", headers=(), *, trickle=0.0, chunk=1, reset_after=None
):
    """Send an answer from a BaseHTTPRequestHandler, the hostile ways too: the body `chunk` bytes
    every `trickle` seconds, or cut off after `reset_after` bytes by a TCP reset."""
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    if reset_after is not None:
        handler.wfile.write(data[:reset_after])
        time.sleep(0.05)  # let the client read the status line first: the reset comes mid-body
        reset_connection(handler)
    elif trickle:
        for i in range(0, len(data), chunk):
            handler.wfile.write(data[i : i + chunk])
            time.sleep(trickle)
    else:
        handler.wfile.write(data)


def reset_connection(handler) -> None:
    """End a BaseHTTPRequestHandler's connection with a TCP reset."""
    handler.close_connection = True
    sock = handler.connection
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # Close the descriptor itself now (the handler's files still hold the socket object);
    # with a zero linger that sends a reset rather than a FIN.
    os.close(sock.detach())


def _spiked(value, spike: str):
    """`value` with `spike` at the end of every string in it."""
    if isinstance(value, dict):
        return {k: _spiked(v, spike) for k, v in value.items()}
    if isinstance(value, list):
        return [_spiked(v, spike) for v in value]
    return value + spike if isinstance(value, str) else value


def _misshapen(value):
    """`value` with every string a number and every list an object."""
    if isinstance(value, dict):
        return {k: _misshapen(v) for k, v in value.items()}
    if isinstance(value, list):
        return {str(i): _misshapen(v) for i, v in enumerate(value)}
    return len(value) if isinstance(value, str) else value


def spoil(kind: str, status: int, body: dict) -> tuple[int, bytes, list, dict]:
    """The hostile answer `kind` made of the answer (status, body): status, body bytes, headers
    and write_answer's options."""
    data, headers, options = json.dumps(body).encode(), [("content-type", "application/json")], {}
    if kind in ("nul", "invalid_utf8"):
        data = json.dumps(_spiked(body, "\x00")).encode()
        if kind == "invalid_utf8":  # json.dumps wrote each NUL as \u0000: put bytes UTF-8 lacks there
            data = data.replace(b"\\u0000", b"\xff\xfe")
    elif kind == "huge":
        data = json.dumps({**body, "padding": "x" * 10_000_000}).encode()
    elif kind == "trickle":
        data, options = b" " * 100 + data, {"trickle": 0.25}
    elif kind == "redirect":
        status, data, headers = 307, b"", [("location", "https://registry.invalid/elsewhere")]
    elif kind == "reset":
        options = {"reset_after": len(data) // 2}
    elif kind == "malformed_json":
        data = data[: len(data) // 2]
    elif kind == "wrong_content_type":
        headers = [("content-type", "text/html")]
    elif kind == "wrong_shape":
        data = json.dumps(_misshapen(body)).encode()
    elif kind == "deep_json":
        data = b"[" * 100_000 + b"]" * 100_000
    else:
        raise ValueError(f"unknown hostile answer {kind!r}")
    return status, data, headers, options


def make_server(host: str = "127.0.0.1", port: int = 8100, *, token: str, faults: dict | None = None):
    state = RegistryState(token, faults)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes: without TCP_NODELAY each keep-alive answer
        # waits for the client's delayed ACK (about 40 ms).
        disable_nagle_algorithm = True

        def _answer(self, status: int, body: dict, hostile: str = "", headers=()) -> None:
            if hostile:
                status, data, headers, options = spoil(hostile, status, body)
                return write_answer(self, status, data, headers, **options)
            data = json.dumps(body).encode() if status != 204 else b""
            write_answer(self, status, data, [("content-type", "application/json"), *headers])

        def _body(self) -> dict | None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return None
            return body if isinstance(body, dict) else None

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            path = url.path.rstrip("/")
            if path == "/_faults" and method == "GET":
                return self._answer(200, state.faults)
            if path == "/_faults" and method == "POST":
                body = self._body() or {}
                problems = [p for name, value in body.items() if (p := fault_problem(name, value))]
                if problems:
                    return self._answer(422, {"code": "UNKNOWN_FAULT", "errors": problems})
                with state.lock:
                    state.faults.update(body)
                return self._answer(200, state.faults)
            if path == "/_reset" and method == "POST":
                state.reset()
                return self._answer(200, state.faults)
            if path == "/_stats" and method == "GET":
                return self._answer(200, state.rate_seen())
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                return self._answer(401, {"code": "UNAUTHORIZED"})
            refused = state.arrive()
            if refused:
                status, body, retry_after = refused
                self.rfile.read(int(self.headers.get("content-length") or 0))  # the connection stays usable
                said = (
                    formatdate(time.time() + retry_after, usegmt=True)
                    if state.faults["retry_after_http_date"]
                    else str(retry_after)
                )
                return self._answer(status, body, headers=[("retry-after", said)])
            try:
                self._protocol(method, url, path)
            finally:
                state.leave()

        def _protocol(self, method: str, url, path: str) -> None:
            generation = state.generation
            state.calls.append((method, path))
            if state.faults["latency"]:
                jitter = float(state.faults["latency_jitter"])
                time.sleep(float(state.faults["latency"]) * random.uniform(1 - jitter, 1 + jitter))
                if generation != state.generation:  # reset while it waited: forgotten with the rest
                    return self._answer(503, {"code": "UNAVAILABLE"})
            if path == "/dpp-registration-requests" and method == "POST":
                body = self._body()
                if body is None:
                    return self._answer(
                        422, {"code": "INVALID_JSON", "errors": ["body is not a JSON object"]}
                    )
                if late := state.lands_late(body, self.headers.get("Idempotency-Key")):
                    return self._late(late)
                answer = state.register(body, self.headers.get("Idempotency-Key"))
                return self._answer(*answer, state.hostile("register", body.get("upi")))
            if path == "/dpp-registration-requests" and method == "GET":
                query = parse_qs(url.query)
                limit = int(query.get("limit", ["50"])[0]) if query.get("limit", ["50"])[0].isdigit() else 50
                answer = state.task_list(query.get("cursor", [None])[0], limit)
                return self._answer(*answer, state.hostile("task_list"))
            if (match := re.fullmatch(r"/dpp-registration-requests/([\w-]+)", path)) and method == "GET":
                upi = state.requests.get(match.group(1), {}).get("upi")
                return self._answer(*state.check(match.group(1)), state.hostile("check", upi))
            if (match := re.fullmatch(r"/registrations/([\w-]+)/deactivate", path)) and method == "POST":
                return self._answer(*state.deactivate(match.group(1)))
            return self._answer(404, {"code": "NOT_FOUND"})

        def _late(self, late: LateRegister) -> None:
            """A register that lands late: its connection held until it lands, then a 504 (the
            gateway's, not the registry's answer), or reset at once (late_landing_reset), or
            answered at once by the gateway with a page of its own (gateway_answer) while the
            request goes on to land."""
            if late.reset:
                reset_connection(self)
            elif late.gateway:
                status, page = GATEWAY_ANSWERS[late.gateway]
                with state.lock:
                    state.gateway_answered[late.gateway] += 1
                threading.Thread(target=state.await_landing, args=(late,), daemon=True).start()
                return write_answer(self, status, page, [("content-type", "text/html; charset=UTF-8")])
            state.await_landing(late)
            if not late.reset:
                self._answer(504, {"code": "GATEWAY_TIMEOUT"})

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # drains open dozens of connections at once (socketserver's 5 resets them)

        def handle_error(self, request, client_address):
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no news
                super().handle_error(request, client_address)

    server = Server((host, port), Handler)
    server.state = state
    return server
