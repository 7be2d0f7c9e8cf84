"""What gunicorn answers itself under `odal serve` (issue 37, item 7): a request it cannot read
(a request line over 4 KB, a raw non-ASCII byte in the path, `Content-Length: -1`, a lower-case
method…) never reaches Django, and gunicorn's own answer was an HTML page. Under odal serve it is
the API's JSON `{detail, code}`; and `HEAD` on a GET route answers as GET, without a body.

A real `odal serve` subprocess, spoken to through raw sockets: an HTTP client would not send
these requests."""

import json
import socket

import pytest

from odal.core.models import Passport
from tests.factories import issue_token
from tests.pg import free_port
from tests.test_serve import HOST, production, serving

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """`request` sent as it is; the answer's status, headers (lower-case names) and body, read to
    the end of the connection or of its Content-Length."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", -1))
        while length < 0 or len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        if headers.get("transfer-encoding") == "chunked":
            body = unchunked(body)
        return status, headers, body


def unchunked(data: bytes) -> bytes:
    body = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        size = int(size, 16)
        body, data = body + data[:size], data[size + 2 :]
        if size == 0:
            break
    return body


def request(line: bytes, *headers: bytes, body: bytes = b"") -> bytes:
    head = [line, b"Host: " + HOST.encode(), b"X-Forwarded-Proto: https", *headers, b"Connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


GUNICORNS_OWN = {
    "a request line over 4 KB": (
        request(b"GET /vault/api/v1/dpp?cursor=" + b"a" * 5000 + b" HTTP/1.1"),
        414,
        "uri_too_long",
    ),
    "a raw non-ASCII byte in the path": (request(b"GET /vault/api/v1/d\xffp HTTP/1.1"), 400, "bad_request"),
    "Content-Length: -1": (
        request(b"POST /vault/api/v1/dpp HTTP/1.1", b"Content-Length: -1", b"Content-Type: application/json"),
        400,
        "bad_request",
    ),
    "a lower-case method": (request(b"get /vault/api/v1/registry HTTP/1.1"), 400, "bad_request"),
    "a header name with a space": (
        request(b"GET /vault/api/v1/registry HTTP/1.1", b"Bad Name: 1"),
        400,
        "bad_request",
    ),
    "an unknown transfer coding": (
        request(b"POST /vault/api/v1/dpp HTTP/1.1", b"Transfer-Encoding: bogus, chunked"),
        501,
        "not_implemented",
    ),
    "more than 100 headers": (
        request(b"GET /vault/api/v1/registry HTTP/1.1", *(b"X-%d: 1" % n for n in range(120))),
        431,
        "headers_too_large",
    ),
}


@pytest.fixture(scope="module")
def odal_serve(tmp_path_factory, django_db_setup, django_db_blocker):
    """One `odal serve` in production, on the test database, for the module's tests."""
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    with (
        django_db_blocker.unblock(),
        (tmp / "serve.log").open("w+") as log,
        serving(port, production(tmp / "static"), log, workers=1),
    ):
        yield port, log


@pytest.mark.parametrize("raw, status, code", GUNICORNS_OWN.values(), ids=GUNICORNS_OWN.keys())
def test_what_gunicorn_answers_itself_is_json(odal_serve, raw, status, code):
    port, _ = odal_serve
    got, headers, body = exchange(port, raw)
    assert got == status, body[:300]
    assert headers["content-type"] == "application/json", body[:300]
    answer = json.loads(body)
    assert set(answer) == {"detail", "code"} and answer["code"] == code, answer
    assert answer["detail"].endswith(".") and "<" not in answer["detail"]
    assert int(headers["content-length"]) == len(body)


def test_what_django_answers_is_json_still(odal_serve):
    port, _ = odal_serve
    status, headers, body = exchange(port, request(b"GET /vault/api/v1/nope HTTP/1.1"))
    assert (status, headers["content-type"], json.loads(body)["code"]) == (
        404,
        "application/json",
        "not_found",
    )


@pytest.mark.parametrize("path", ["registry", "dpp?limit=5", "outbox", "outbox/consumers", "openapi.json"])
def test_head_on_a_get_route_answers_as_get_without_a_body(odal_serve, path):
    port, _ = odal_serve
    token = issue_token("read")
    auth = b"Authorization: Bearer " + token.encode()
    Passport.objects.create(upi="https://id.example.eu/01/09506000134352/21/HEAD-1", operator_id="OP")
    get = exchange(port, request(b"GET /vault/api/v1/" + path.encode() + b" HTTP/1.1", auth))
    head = exchange(port, request(b"HEAD /vault/api/v1/" + path.encode() + b" HTTP/1.1", auth))
    assert get[0] == head[0] == 200, (get, head)
    assert head[2] == b""
    assert head[1]["content-type"] == get[1]["content-type"]
    assert head[1].get("content-length") in (None, str(len(get[2])))
