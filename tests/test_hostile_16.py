"""Issue 16 under attack: what a hostile review of bulk intake, the concurrent drain and its pace
found, each a test that failed before its fix."""

import io
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from odal.core.models import Passport
from odal.surfaces import lifecycle
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from registry import adapters
from registry.drain import drain_once, drain_until_idle
from registry.models import Registration, RegistrationAttempt, RegistryPace
from registry.pace import Pace
from tests.factories import PassportFactory, WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db

HOSTILE = "https://id.example.eu/01/HOSTILE"


def published(upi: str):
    passport = PassportFactory(upi=upi)
    lifecycle.publish(passport.pk, actor="test")
    return passport


class TricklingRegistry:
    """A registry that answers register at once (202), except for a UPI holding HOSTILE: then its
    status line and headers come a byte every 0.2 s, never ending (httpx's timeout holds for each
    read, and each read gets a byte)."""

    def __init__(self):
        self.stop = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()
        self.server.close()

    def _talk(self, conn):
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
                while len(body) < length:
                    body += conn.recv(65536)
                if b"HOSTILE" in body:
                    for byte in b"HTTP/1.1 202 Accepted\r\nx-slow: " + b"x" * 10_000:
                        if self.stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(0.2)
                    return
                answer = json.dumps({"requestId": f"req-{json.loads(body)['upi'][-1]}", "status": "checking"})
                conn.sendall(
                    b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    + f"content-length: {len(answer)}\r\n\r\n{answer}".encode()
                )
            except OSError:
                pass

    def close(self):
        self.stop.set()


@pytest.fixture
def trickling_registry(settings):
    registry = TricklingRegistry()
    settings.ODAL_REGISTRY_ADAPTER = "http"
    settings.ODAL_REGISTRY_URL = f"http://127.0.0.1:{registry.port}"
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 1
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    yield registry
    registry.close()


def test_a_registry_trickling_its_headers_fails_only_its_own_row_within_the_timeout(trickling_registry):
    # Before: httpx's timeout holds for each read, read_answer's deadline only once the headers
    # are in, so the request (and the pass waiting for it, and so the drain) never ended.
    bad = published(HOSTILE)
    others = [published(f"https://id.example.eu/01/{n}") for n in range(3)]
    # (The registry stops trickling after 6 s, or a failing test would hang for ever.)
    threading.Timer(6, trickling_registry.close).start()
    started = time.monotonic()
    report = drain_once()
    assert time.monotonic() - started < 4, "the pass waited for the trickling answer"
    assert (report.claimed, report.submitted, report.unknown) == (4, 3, 1)
    for passport in others:
        assert Registration.objects.get(passport=passport).status == "submitted"
    reg = Registration.objects.get(passport=bad)
    assert reg.status == "pending" and reg.claim_token is None
    assert reg.last_error == "registry timed out after 1s; the request may have reached it"


class Always429(BaseHTTPRequestHandler):
    """A registry that answers every request 429 with the Retry-After the server says."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.arrivals.append(time.monotonic())
        self.send_response(429)
        self.send_header("retry-after", self.server.retry_after)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("retry_after", ["0", "Tue, 01 Dec 2020 11:00:00 GMT"], ids=["zero", "date_gone_by"])
def test_a_registry_answering_429_with_no_wait_is_not_hammered(settings, retry_after):
    # Before: "Retry-After: 0" (or a date gone by) paused nothing, and a 429 costs no attempt, so
    # the row was due again at once and the drain asked again and again: 261 requests (and
    # attempt-log lines) in 2 s from one registration. A 429 now pauses at least a second.
    server = ThreadingHTTPServer(("127.0.0.1", 0), Always429)
    server.daemon_threads, server.arrivals, server.retry_after = True, [], retry_after
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    settings.ODAL_REGISTRY_ADAPTER = "http"
    settings.ODAL_REGISTRY_URL = f"http://127.0.0.1:{server.server_address[1]}"
    passport = published("https://id.example.eu/01/LIMITED")
    try:
        report = drain_until_idle(max_seconds=1.5, linger_seconds=2)
    finally:
        server.shutdown()
        server.server_close()

    assert 1 <= len(server.arrivals) <= 2, len(server.arrivals)
    assert report.rate_limited == len(server.arrivals) == RegistrationAttempt.objects.count()
    reg = Registration.objects.get(passport=passport)
    assert (reg.status, reg.attempts, reg.claim_token) == ("pending", 0, None)


# -- odal passport import ------------------------------------------------------------------------------

IMPORTED = "https://id.example.eu/01/09506000134352/21/IMP-{}"


def import_file(path) -> tuple[CommandError, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("passport", "import", str(path), stdout=out, stderr=err)
    return caught.value, out.getvalue(), err.getvalue()


def test_a_json_line_longer_than_post_dpps_body_limit_is_refused_unread(tmp_path, settings):
    # Before: a JSON line of any size was read whole and made a passport (50 MB of data took
    # 377 MB of memory), where POST dpp refuses a body over ODAL_MAX_BODY_BYTES with 413 and a CSV
    # row over it is refused too.
    settings.ODAL_MAX_BODY_BYTES = 4096
    path = tmp_path / "long.jsonl"
    rows = [
        {"upi": IMPORTED.format(1), "operatorId": "OP"},
        {"upi": IMPORTED.format(2), "operatorId": "OP", "data": {"x": "y" * 10_000}},
        {
            "upi": IMPORTED.format(3),
            "operatorId": "OP",
            "data": {"x": "é" * 3000},
        },  # 3,000 chars, 6,000 bytes
        {"upi": IMPORTED.format(4), "operatorId": "OP"},
    ]
    path.write_text("\r\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\r\n")

    error, out, err = import_file(path)

    assert error.returncode == 1
    assert "4 rows" in out and "2 created, 0 published, 0 existing, 2 refused." in out
    too_long = (
        "This line is longer than 4,096 bytes (ODAL_MAX_BODY_BYTES), the largest passport POST dpp takes"
    )
    assert err.splitlines() == [
        f"line 2: {too_long}; it was not read.",
        f"line 3: {too_long}; it was not read.",
    ]
    assert set(Passport.objects.values_list("upi", flat=True)) == {IMPORTED.format(1), IMPORTED.format(4)}


def test_a_csv_header_the_csv_module_cannot_read_is_refused_with_a_sentence(tmp_path):
    # Before: a header cell over the csv module's field limit (128 KiB) escaped as a traceback.
    path = tmp_path / "header.csv"
    path.write_text("upi," + "x" * 200_000 + "\n" + IMPORTED.format(1) + ",OP\n")

    error, out, err = import_file(path)

    assert error.returncode == 1 and not out and not err
    assert str(error).startswith(
        f"{path}: the header row cannot be read as CSV (field larger than field limit"
    )
    assert not Passport.objects.exists()


# -- the concurrent drain -----------------------------------------------------------------------------


def test_a_request_whose_thread_comes_free_after_the_hold_is_not_sent(registry_sim, settings):
    # A pass that ended on a lost database leaves its requests still out running on the drain's
    # pool (they keep their claim), so the next pass's requests may wait for a thread. Before: a
    # request was checked against its claim's hold when it was handed to the pool, not when its
    # thread sent it, so it went out after the hold, when the row may be another drain's.
    settings.ODAL_REGISTRY_CONCURRENCY = 1
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    passport = published("https://id.example.eu/01/LATE-THREAD")
    with ThreadPoolExecutor(1) as pool:
        pool.submit(time.sleep, 1.5)  # the one thread, busy past the hold
        report = drain_once(adapter=adapters.get_adapter(), pace=Pace(), pool=pool)

    assert (report.claimed, report.submitted, report.not_started) == (1, 0, 1)
    assert registry_sim.calls == []
    reg = Registration.objects.get(passport=passport)
    assert (reg.status, reg.attempts, reg.claim_token) == ("pending", 0, None)


# -- the same trickle, at a webhook ------------------------------------------------------------------


def test_a_webhook_trickling_its_headers_fails_only_its_own_delivery_within_the_timeout():
    # The sweep waits for its in-flight requests as the drain does: before, one endpoint trickling
    # its status line and headers held the sweep, and so every consumer's deliveries, for ever.
    hostile = TricklingRegistry()  # (it trickles for any request whose body holds HOSTILE)
    threading.Timer(6, hostile.close).start()
    with WebhookServer() as healthy:
        WebhookConsumerFactory(name="hostile", url=f"http://127.0.0.1:{hostile.port}/hook", timeout_seconds=1)
        WebhookConsumerFactory(name="healthy", url=healthy.url, timeout_seconds=1)
        emit("passport.published", {"upi": HOSTILE})
        started = time.monotonic()
        report = sweep_once()
    assert time.monotonic() - started < 4, "the sweep waited for the trickling answer"
    hostile.close()

    assert (report.delivered, report.failed) == (1, 1)
    assert Delivery.objects.get(consumer__name="healthy").status == "delivered"
    bad = Delivery.objects.get(consumer__name="hostile")
    assert (bad.status, bad.last_error) == ("pending", "timed out after 1s")


def test_a_pass_whose_rows_come_after_its_hold_books_no_slot_for_each(registry_sim, settings):
    # Before: every row left when the hold ran out still booked a slot of the rate limit, which
    # every drain shares, and gave it up: one pass of 20 rows at 0.1/s with a 5 s hold sent one
    # request and held every drain back 200 s. Now the pass books no more after the first.
    settings.ODAL_REGISTRY_RATE_PER_SECOND = 0.2
    settings.ODAL_CLAIM_HOLD_SECONDS = 5
    for n in range(20):
        published(f"https://id.example.eu/01/SLOW-{n}")

    report = drain_once(batch=20)

    assert (report.claimed, report.submitted, report.not_started) == (20, 1, 19)
    ahead = (RegistryPace.objects.get().next_slot_at - timezone.now()).total_seconds()
    assert ahead <= 10.5, ahead  # the one slot sent, and the one that came after the hold
