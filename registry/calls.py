"""What the drain asks of the registry (a RegistryCall, sent on a pool thread in its slot of the
pace) and what it gets (a CallResult). No database here."""

import enum
import logging
import threading
import time
from dataclasses import dataclass, field

from odal.core import stopping
from odal.core.text import error_text, storable
from registry import adapters
from registry.finding import find_held
from registry.models import Registration
from registry.pace import PAUSE_REFRESH_SECONDS, Pace

log = logging.getLogger("registry.drain")  # (the drain's lines, wherever written, are the drain's)


class Ask(enum.Enum):
    """Which adapter call a RegistryCall makes (SENDS)."""

    REGISTER = "register"  # and a check of the request a DUPLICATE_UPI names (register, below)
    CHECK = "check"
    DEACTIVATE = "deactivate"
    FIND = "find"  # find_held: lookup, check, deactivate


@dataclass
class CallResult:
    """What a RegistryCall got: the registry's answer, or what it raised."""

    answer: object = None
    error: Exception | None = None

    def failed(self, attempt, operation: str) -> bool:
        """End the attempt (registry.settling.Attempt) if its call failed (a 429 gives it back); True if it did."""
        if self.error is None:
            return False
        if isinstance(self.error, adapters.RateLimited):
            attempt.rate_limited(operation, self.error)
        elif isinstance(self.error, adapters.OutcomeUnknown):
            attempt.unknown(operation, storable(self.error))
        elif isinstance(self.error, adapters.Retryable):
            attempt.failed(operation, storable(self.error))
        else:
            log.error(
                "registration %s: attempt raised", attempt.reg.pk, exc_info=self.error,
                extra=attempt.ids(),
            )  # fmt: skip
            attempt.failed(operation, error_text(self.error))
        return True


@dataclass
class NotAdopted:
    """register answered DUPLICATE_UPI naming `request_id`, whose registration the registry has
    deactivated (`registration_id`): a deactivated registration is not held, so it is not taken
    for this row's."""

    request_id: str
    registration_id: str


def register(adapter, reg: Registration):
    """On a pool thread: the register, and for a DUPLICATE_UPI a check of the request it names
    before it is adopted (NotAdopted if the registry has deactivated its registration). A check
    that fails leaves the duplicate undecided: the attempt fails (the registry kept nothing of
    this register), or is given back if the check was rate-limited."""
    answer = adapter.register(reg)
    if not isinstance(answer, adapters.Duplicate):
        return answer
    try:
        named = adapter.check(answer.request_id)
    except adapters.RateLimited:
        raise
    except adapters.Retryable as exc:
        raise adapters.Retryable(
            f"the registry answered DUPLICATE_UPI naming request {answer.request_id}, and its check failed "
            f"(it is adopted once a check shows it is not deactivated): {exc}"
        ) from None
    if named.status == "registered" and named.deactivated:
        return NotAdopted(answer.request_id, named.registration_id)
    return answer


@dataclass
class RegistryCall:
    """The call an attempt sends: what it asks, with what. A register is sent only while its
    passport is published: `withdrawn` is set (by the pass's thread, which reads the passports
    of the registers waiting for their turn) when it no longer is."""

    ask: Ask
    arg: object
    withdrawn: threading.Event = field(default_factory=threading.Event)
    sending: bool = False  # past its last look at `withdrawn`

    def send(self, adapter) -> CallResult:
        self.sending = True
        try:
            return CallResult(answer=SENDS[self.ask](adapter, self.arg))
        except Exception as exc:  # a Retryable, or a bug of ours: the attempt fails, not the drain
            return CallResult(error=exc)


SENDS = {
    Ask.REGISTER: register,
    Ask.CHECK: lambda adapter, request_id: adapter.check(request_id),
    Ask.DEACTIVATE: lambda adapter, handle: adapter.deactivate(handle),
    Ask.FIND: find_held,
}


# The request never went out (a pause came while it waited for its slot, the hold ran out, the
# process is stopping): the row is given back.
GIVEN_BACK = CallResult()
# The register never went out: its passport was withdrawn while it waited for its slot.
WITHDRAWN = CallResult()


def send_in_turn(request: "RegistryCall", adapter, pace: Pace, slot: float, deadline: float) -> CallResult:
    """On a pool thread: wait for the request's slot, then send it, unless its passport was
    withdrawn meanwhile, a 429 paused every drain, or the claim's hold has run out by the time
    this thread got to it (a pool thread may come free late: one still busy with a request of a
    pass that ended early). No database here."""
    while (delay := slot - time.monotonic()) > 0 and not (request.withdrawn.is_set() or stopping.requested()):
        request.withdrawn.wait(min(delay, PAUSE_REFRESH_SECONDS))  # (a stop is looked at as often)
    if request.withdrawn.is_set():
        return WITHDRAWN
    if pace.held_back() or time.monotonic() >= deadline or stopping.requested():
        return GIVEN_BACK
    return request.send(adapter)
