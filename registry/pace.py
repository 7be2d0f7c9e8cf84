"""How fast the drain sends to the registry: `ODAL_REGISTRY_RATE_PER_SECOND` and the pauses the
registry asks for (429 with Retry-After), held for every drain process on every machine in one
row of the database (registry.models.RegistryPace), not in process memory.

The rate limit is a schedule of send times ("slots") 1/rate apart. A process books a few slots
at once with one UPDATE of the row (BOOK_SECONDS' worth of the rate: at 100/s, 25 slots, so two
processes take the row about four times a second each), and gives each request the next one; the
request waits for its slot on its thread. A slot not given out within SLOT_LATENESS of its time is
dropped, never used late together with the next ones: so over any window the registry sees at
most the rate times the window (plus SLOT_LATENESS), however many processes share it.

A 429 pauses every drain. The pass that got it stops its process's requests at once (the
request threads read the pause in memory) and writes the pause's end to the row (a pause is only
ever lengthened); every other process reads the row at most PAUSE_REFRESH_SECONDS apart while it
has requests waiting, and before it starts one. While a pause holds a drain claims nothing, and a claimed row whose request has not gone
out yet is given back (registry.drain), not held through it.

Only the pass's own thread uses the database here; the request threads only read the pause, in
memory.
"""

import threading
import time
from collections import deque
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from registry.models import RegistryPace

BOOK_SECONDS = 0.25  # a booking takes this much of the rate's slots
MAX_BOOKING = 64  # ...and never more slots than this at once
SLOT_LATENESS = 0.1  # seconds a slot may be late before it is dropped
PAUSE_REFRESH_SECONDS = 0.1  # how stale this process's idea of a pause may be


def monotonic_at(when: datetime) -> float:
    """A wall-clock moment as a time.monotonic() reading."""
    return time.monotonic() + (when - timezone.now()).total_seconds()


class Pace:
    """One drain process's side of the registry's pace."""

    def __init__(self, rate: float | None = None):
        self.rate = settings.ODAL_REGISTRY_RATE_PER_SECOND if rate is None else rate
        self.lock = threading.Lock()  # resume_at is read and set by the request threads too
        self.slots: deque[float] = deque()  # booked send times (time.monotonic()), soonest first
        self.resume_at = float("-inf")  # time.monotonic(): nothing is sent before (a pause)
        self.read_at = float("-inf")  # when the row's pause was last read
        self.full_until = float("-inf")  # time.monotonic(): the schedule is booked past a hold

    # -- the pass's thread ------------------------------------------------------------------------

    def paused_for(self) -> float:
        """Seconds until this drain may claim and start requests (0: now), as the row said at most
        PAUSE_REFRESH_SECONDS ago: until a pause ends, and until the rate limit's schedule comes
        within a claim's hold (drains booked it further ahead: a row claimed now could not be sent
        before its hold ran out, and would only be claimed, given back and claimed again)."""
        now = time.monotonic()
        if now - self.read_at >= PAUSE_REFRESH_SECONDS:
            self.read_at = now
            paused_until, next_slot_at = RegistryPace.objects.schedule()
            self.stop_until(monotonic_at(paused_until))
            if self.rate is not None:
                self.full_until = monotonic_at(next_slot_at) - settings.ODAL_CLAIM_HOLD_SECONDS
        return max(0.0, max(self.resume_at, self.full_until) - time.monotonic())

    def pause(self, seconds: float, reason: str) -> None:
        """The registry answered 429: this process stops at once, and the row tells the others."""
        until = timezone.now() + timedelta(seconds=seconds)
        self.stop_until(monotonic_at(until))
        RegistryPace.objects.pause(until=until, reason=reason)

    def next_slot(self, before: float) -> float | None:
        """When the next request may go out (a time.monotonic() reading): now without a rate
        limit, else its slot of the schedule every drain shares; None when the schedule has no
        slot left before `before` (the claim's hold ends first), and then nothing is booked."""
        if self.rate is None:
            return time.monotonic()
        with self.lock:
            slot = self._take()
        if slot is None:
            if not self._book(before):
                self.read_at = float("-inf")  # paused_for reads how far ahead the schedule is
                return None
            with self.lock:
                slot = self._take()
        return time.monotonic() if slot is None else slot  # (none left: a pause came meanwhile)

    def _take(self) -> float | None:
        now = time.monotonic()
        while self.slots and self.slots[0] < now - SLOT_LATENESS:
            self.slots.popleft()  # not given out in time: dropped, never used late in a bunch
        return self.slots.popleft() if self.slots else None

    def _book(self, before: float) -> bool:
        count = max(1, min(MAX_BOOKING, round(self.rate * BOOK_SECONDS)))
        interval = 1 / self.rate
        now = timezone.now()
        first = RegistryPace.objects.book(
            slots=count, interval=timedelta(seconds=interval), now=now,
            before=now + timedelta(seconds=before - time.monotonic()),
        )  # fmt: skip
        if first is None:
            return False
        start = monotonic_at(first)
        with self.lock:
            self.slots.extend(start + i * interval for i in range(count))
        return True

    # -- any thread -------------------------------------------------------------------------------

    def stop_until(self, resume: float) -> None:
        with self.lock:
            if resume > self.resume_at:
                self.resume_at = resume
                while self.slots and self.slots[0] < resume:
                    self.slots.popleft()  # booked inside the pause: never used

    def held_back(self) -> bool:
        """Whether a pause holds now, as this process knows it (no database)."""
        return time.monotonic() < self.resume_at
