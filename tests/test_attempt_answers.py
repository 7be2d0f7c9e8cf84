"""The attempt log keeps what a consumer answered: a bounded, storable excerpt of the body and
its Content-Type, for successes as well as failures, over real HTTP against PostgreSQL."""

import re
import socket
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from django.utils import timezone

from odal.core.text import MAX_STORED
from outbox import consumers, webhook_client
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from tests.factories import ConsumerFactory, UserFactory, WebhookConsumerFactory
from tests.webhook_server import Answer, WebhookServer

pytestmark = pytest.mark.django_db

TEN_MB = 10_000_000
JSON = [("content-type", "application/json")]


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0


def sweep_against(answer: Answer):
    """One delivery to a webhook answering `answer`, swept once: the delivery and its one line."""
    with WebhookServer([answer]) as server:
        WebhookConsumerFactory(url=server.url, timeout_seconds=1)
        emit("passport.published", {"n": 1})
        report = sweep_once()
    assert report.claimed == 1 and report.write_errors == 0
    delivery = Delivery.objects.get()
    return delivery, delivery.attempt_log.get()


def assert_storable(text: str, limit: int) -> None:
    assert "\x00" not in text and len(text) <= limit, (len(text), text[:80])
    text.encode("utf-8")  # no lone surrogate


# -- webhooks -------------------------------------------------------------------------------------


def test_a_2xx_json_answer_is_kept_with_its_content_type(api_as):
    body = b'{"received": true, "ticket": "T-42"}'
    delivery, line = sweep_against(Answer(200, body, JSON))
    assert delivery.status == "delivered"
    assert (line.outcome, line.http_status, line.error) == ("delivered", 200, "")
    assert (line.answer, line.content_type) == (body.decode(), "application/json")

    [shown] = api_as("read").get(f"outbox/deliveries/{delivery.pk}").json()["attemptLog"]
    assert (shown["answer"], shown["contentType"]) == (body.decode(), "application/json")


def test_a_5xx_text_answer_is_kept_whole_beside_the_one_line_error():
    body = "upstream exploded\n  retry after 30s\n"
    delivery, line = sweep_against(
        Answer(500, body.encode(), [("content-type", "text/plain; charset=utf-8")])
    )
    assert delivery.status == "pending"
    assert line.error == "HTTP 500: upstream exploded retry after 30s"
    assert (line.answer, line.content_type) == (body, "text/plain; charset=utf-8")


def test_an_answer_without_a_body_or_content_type_is_kept_empty():
    delivery, line = sweep_against(Answer(204))
    assert delivery.status == "delivered" and (line.answer, line.content_type) == ("", "")


def test_a_redirect_keeps_its_body_and_content_type():
    headers = [("location", "https://elsewhere.example/hooks"), ("content-type", "text/html")]
    delivery, line = sweep_against(
        Answer(302, b'<a href="https://elsewhere.example/hooks">moved</a>', headers)
    )
    assert delivery.status == "pending" and line.error.startswith("HTTP 302 redirect")
    assert line.answer == '<a href="https://elsewhere.example/hooks">moved</a>'
    assert line.content_type == "text/html"


def test_a_timeout_keeps_what_was_read_before_it():
    answer = Answer(200, b"z" * 100, [("content-type", "text/plain")], trickle=0.05)
    delivery, line = sweep_against(answer)
    assert delivery.status == "pending" and line.error.startswith("timed out after 1s while reading the body")
    assert 0 < len(line.answer) < 100 and set(line.answer) == {"z"}
    assert line.content_type == "text/plain"


def test_a_refused_connection_has_no_answer():
    WebhookConsumerFactory(url="http://127.0.0.1:9/hooks")
    emit("passport.published", {})
    sweep_once()
    line = Delivery.objects.get().attempt_log.get()
    assert line.error.startswith("connection error") and (line.answer, line.content_type) == ("", "")


HOSTILE_BODIES = {
    # name: (answer, settles as, the answer kept)
    "nul_2xx": (Answer(200, b"ok\x00done", JSON), "delivered", "ok\ufffddone"),
    "nul_5xx": (Answer(500, b"upstream\x00exploded"), "pending", "upstream\ufffdexploded"),
    "invalid_utf8": (Answer(500, b"bad \xff\xfe bytes \xed\xa0\x80"), "pending", "bad \ufffd\ufffd bytes \ufffd\ufffd\ufffd"),
    "huge_2xx": (Answer(200, b"x" * TEN_MB), "delivered", "x" * (MAX_STORED - 1) + "…"),
    "huge_nul_5xx": (Answer(500, b"\x00" * TEN_MB), "pending", "\ufffd" * (MAX_STORED - 1) + "…"),
}  # fmt: skip


@pytest.mark.parametrize("answer, status, kept", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES)
def test_a_hostile_body_is_kept_bounded_and_storable_and_the_delivery_settles(answer, status, kept):
    delivery, line = sweep_against(answer)
    assert delivery.status == status and line.outcome == ("delivered" if status == "delivered" else "failed")
    assert line.answer == kept
    assert_storable(line.answer, MAX_STORED)


HOSTILE_CONTENT_TYPES = {
    # name: (the header as sent, as kept)
    "10_kb": ("text/plain; note=" + "x" * 10_000, "text/plain; note=" + "x" * 182 + "…"),
    "not_utf8": ("text/pl\xffain", "text/plÿain"),  # sent as the byte 0xff: read as Latin-1
}


@pytest.mark.parametrize("sent, kept", HOSTILE_CONTENT_TYPES.values(), ids=HOSTILE_CONTENT_TYPES)
def test_a_hostile_content_type_is_kept_bounded_and_storable(sent, kept):
    delivery, line = sweep_against(Answer(200, b"{}", [("content-type", sent)]))
    assert delivery.status == "delivered" and line.answer == "{}"
    assert line.content_type == kept
    assert_storable(line.content_type, consumers.MAX_CONTENT_TYPE)


def test_a_content_type_with_a_nul_byte_fails_the_attempt_and_the_delivery_settles():
    """The parser refuses a header with NUL in it as a protocol error: the attempt fails like a
    broken connection, with nothing kept of an answer it never accepted."""
    delivery, line = sweep_against(Answer(200, b"{}", [("content-type", "application/\x00json")]))
    assert delivery.status == "pending" and line.error.startswith("connection error")
    assert (line.answer, line.content_type) == ("", "")


def test_a_content_type_is_made_storable_where_it_is_read():
    """What another HTTP stack might let through (a NUL, invalid UTF-8, any length) comes out
    of answer_content_type storable and at most 200 characters long."""
    answer = webhook_client.Answer(200, {b"content-type": b"text/\x00pl\xffain; x=" + b"y" * 10_000})
    kept = consumers.answer_content_type(answer)
    assert kept.startswith("text/\ufffdplÿain; x=yyy") and kept.endswith("…")
    assert_storable(kept, consumers.MAX_CONTENT_TYPE)


def test_the_admin_shows_the_answer_and_its_content_type(client):
    delivery, _ = sweep_against(Answer(200, b'{"ticket": "T-42"}', JSON))
    client.force_login(UserFactory(is_superuser=True))
    page = client.get(f"/admin/outbox/delivery/{delivery.pk}/change/")
    assert page.status_code == 200
    assert b"application/json" in page.content and b"T-42" in page.content


# -- python consumers -------------------------------------------------------------------------------


class Unprintable:
    def __str__(self):
        raise RuntimeError("no")


RETURNED = {"value": None}


def returns(event, delivery_id):
    return RETURNED["value"]


PYTHON_ANSWERS = {
    # name: (what the callable returns, the answer kept)
    "none": (None, ""),
    "dict": ({"accepted": True}, "{'accepted': True}"),
    "text_with_nul": ("ok\x00\ud800", "ok\ufffd\ufffd"),
    "huge": ("x" * TEN_MB, "x" * (MAX_STORED - 1) + "…"),
    "unprintable": (Unprintable(), "<unprintable Unprintable: RuntimeError>"),
}


@pytest.mark.parametrize("value, kept", PYTHON_ANSWERS.values(), ids=PYTHON_ANSWERS)
def test_a_python_consumer_answer_is_what_it_returned_bounded(value, kept, settings):
    settings.ODAL_PYTHON_CONSUMERS = (*settings.ODAL_PYTHON_CONSUMERS, f"{__name__}.returns")
    RETURNED["value"] = value
    ConsumerFactory(target=f"{__name__}.returns")
    emit("passport.published", {})
    report = sweep_once()
    assert (report.delivered, report.write_errors) == (1, 0)
    line = Delivery.objects.get().attempt_log.get()
    assert (line.outcome, line.answer, line.content_type) == ("delivered", kept, "")


def test_a_failing_python_consumer_has_no_answer():
    ConsumerFactory(target="tests.consumers.explode")
    emit("passport.published", {})
    sweep_once()
    line = Delivery.objects.get().attempt_log.get()
    assert (line.outcome, line.error, line.answer) == ("failed", "ValueError: boom", "")


def raises_hostile(event, delivery_id):
    raise ValueError("bad\x00text\ud800" + "y" * 100_000)


def test_a_python_consumer_raising_hostile_text_fails_its_attempt_storably(settings):
    """The attempt log is one COPY of a flush's lines and the failures one UPDATE of them: an
    error with NUL, a lone surrogate and 100,000 characters is made storable before either."""
    settings.ODAL_PYTHON_CONSUMERS = (*settings.ODAL_PYTHON_CONSUMERS, f"{__name__}.raises_hostile")
    ConsumerFactory(target=f"{__name__}.raises_hostile")
    emit("passport.published", {})
    report = sweep_once()
    assert (report.failed, report.write_errors) == (1, 0)
    delivery = Delivery.objects.get()
    line = delivery.attempt_log.get()
    assert line.outcome == "failed" and line.error.startswith("ValueError: bad\ufffdtext\ufffdyyy")
    assert delivery.status == "pending" and delivery.last_error.startswith("ValueError: bad\ufffdtext\ufffd")
    assert_storable(line.error, MAX_STORED)


def test_an_answer_past_the_cap_ends_its_connection():
    """No more than ANSWER_CAP bytes of a body are read: the rest, left on the connection, would
    be read as the next answer on it, so that connection is closed, not kept alive."""
    big = Answer(200, b"x" * (consumers.ANSWER_CAP * 4))
    with WebhookServer([big]) as server, consumers.webhook_client() as client:
        consumer = WebhookConsumerFactory(url=server.url)
        event, _ = emit("passport.published", {})
        delivery = Delivery.objects.get()
        outcomes = [consumers.call(consumer, delivery.pk, event, client) for _ in range(2)]
    assert [(o.ok, o.http_status) for o in outcomes] == [(True, 200)] * 2, [o.error for o in outcomes]


class RawPeer:
    """A TCP server answering every request on a connection with `answer`, bytes as they are
    (what a hand-written or an old server sends; a tuple: its parts 0.2 s apart, so that the
    client reads them apart), and closing the connection after it if `close`. Counts its
    connections."""

    def __init__(self, answer: bytes, close: bool):
        self.answer, self.close, self.connections = answer, close, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.talk, args=(conn,), daemon=True).start()

    def talk(self, conn):
        try:
            self.answer_all(conn)
        except OSError:  # (the client aborted the connection: a reset)
            pass

    def answer_all(self, conn):
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                for n, part in enumerate(self.answer if isinstance(self.answer, tuple) else (self.answer,)):
                    if n:
                        time.sleep(0.2)
                    conn.sendall(part)
                if self.close:
                    return


RAW_ANSWERS = {
    # name: (bytes, closed after, delivered?, status, answer kept, error, connections for 2 requests)
    "http_1_0_body_to_the_end": (b"HTTP/1.0 200 OK\r\n\r\nhello", True, True, 200, "hello", "", 2),
    "close_delimited_body": (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello", True, True, 200, "hello", "", 2),
    "100_continue_first": (
        (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"),
        False, True, 204, "", "", 1,
    ),
    "cut_short": (
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello", True, False, 200, "hello",
        "connection error: ReadError: the peer closed the connection before the answer was whole "
        "while reading the body of an HTTP 200 answer", 2,
    ),
    # A length counted in characters, not bytes: the answer is whole at its length; the byte
    # after it is no answer, and the connection is not kept (it would be read as the next one's).
    "one_byte_past_its_length": (
        b'HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{"ok":"h\xc3\xa9llo"}', False, True, 200,
        '{"ok":"héllo"', "", 2,
    ),
    "a_204_with_a_body": (b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello", False, True, 204, "", "", 2),
    "two_answers_at_once": (
        b"HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nfailHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        False, False, 500, "fail", "HTTP 500: fail", 2,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "raw, close, delivered, status, kept, error, connections", RAW_ANSWERS.values(), ids=RAW_ANSWERS
)
def test_answers_as_http_allows_them_are_read_whole(raw, close, delivered, status, kept, error, connections):
    """A body delimited by the end of the connection is whole at that end; an interim 100
    Continue is not the answer (the one after it is, on a connection still kept); a body cut
    short of its length is a broken connection; the first whole answer is the answer, and a
    connection with bytes after it is not kept."""
    peer = RawPeer(raw, close)
    consumer = WebhookConsumerFactory(url=peer.url)
    event, _ = emit("passport.published", {})
    delivery = Delivery.objects.get()
    with consumers.webhook_client() as client:
        outcomes = [consumers.call(consumer, delivery.pk, event, client) for _ in range(2)]
    peer.sock.close()
    for outcome in outcomes:
        assert (outcome.ok, outcome.http_status, outcome.answer, outcome.error) == (
            delivered,
            status,
            kept,
            error,
        )
    assert peer.connections == connections


def test_an_endless_head_fails_the_attempt_at_its_cap_not_at_the_timeout():
    """The status line and headers are read up to HEAD_CAP bytes: a peer sending one endless
    header (or headers without end) no longer fills the process's memory until the timeout."""
    peer = RawPeer(b"HTTP/1.1 200 OK\r\nx: " + b"a" * (4 * webhook_client.HEAD_CAP), close=False)
    consumer = WebhookConsumerFactory(url=peer.url, timeout_seconds=2)
    event, _ = emit("passport.published", {})
    with consumers.webhook_client() as client:
        outcome = consumers.call(consumer, Delivery.objects.get().pk, event, client)
    peer.sock.close()
    assert outcome.error == (
        "connection error: RemoteProtocolError: the answer's status line and headers ran past 65536 bytes"
    )


def test_a_request_timed_out_while_its_peer_would_not_read_is_not_delivered_later():
    """A timed-out attempt's connection is aborted, not closed: a plain close waits for the
    write buffer to drain, so the request would stay open (a socket and its payload per attempt)
    and arrive whole once the peer read, after the attempt was logged as timed out."""
    sock = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(sock.accept()[0]), daemon=True).start()
    consumer = WebhookConsumerFactory(
        url=f"http://127.0.0.1:{sock.getsockname()[1]}/hooks", timeout_seconds=1
    )
    size = 16_000_000
    big = SimpleNamespace(type="bench.noop", created_at=timezone.now(), payload={"b": "x" * size})
    with consumers.webhook_client() as client:
        outcome = consumers.call(consumer, uuid.uuid4(), big, client)
        assert outcome.error == "timed out after 1s"
        (conn,) = accepted
        conn.settimeout(5)
        got = 0
        try:
            while chunk := conn.recv(1 << 20):
                got += len(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    conn.close()
    sock.close()
    assert got < size  # what the kernel had buffered, not the rest of the request


def test_a_kept_connection_the_peer_wrote_on_while_idle_is_not_reused():
    """Bytes a peer sends on an idle kept connection (a 408, an answer to no request) would be
    read as the next request's answer: that connection is not taken again."""
    peer = RawPeer(
        (b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
         b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n"),
        close=False,
    )  # fmt: skip
    consumer = WebhookConsumerFactory(url=peer.url)
    event, _ = emit("passport.published", {})
    delivery = Delivery.objects.get()
    with consumers.webhook_client() as client:
        first = consumers.call(consumer, delivery.pk, event, client)

        def buffered() -> bool:
            kept = [c for connections in list(client.idle.values()) for c in connections]
            return any(getattr(c.reader, "_buffer", b"") for c in kept)

        deadline = time.monotonic() + 10
        while not buffered() and time.monotonic() < deadline:  # (the 408 has reached the client)
            time.sleep(0.01)
        assert buffered()
        second = consumers.call(consumer, delivery.pk, event, client)
    peer.sock.close()
    assert (first.http_status, second.http_status) == (204, 204), second.error
    assert peer.connections == 2
