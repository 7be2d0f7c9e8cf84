"""Issue 24: every answer under the API root is the contract's JSON, also those no API handler
writes (an unknown route, a wrong method, a Host not served), and a body sent chunked is read up
to its limit or refused, through the test client (as gunicorn hands a chunked body on, and as
Django's development server does) and under `odal serve` itself."""

import io
import json
from contextlib import contextmanager

import httpx
import pytest
from django.test import Client

from odal.core.models import Passport
from outbox.models import Event
from tests.factories import issue_token
from tests.pg import free_port
from tests.test_serve import HOST, answering, production, serving

pytestmark = pytest.mark.django_db

API = "/vault/api/v1/"
UPI = "https://id.example.eu/01/09506000134352/21/CHUNKED-{}"
NOT_FOUND = {
    "detail": "No route of the API has this path. The routes are listed at /vault/api/v1/docs.",
    "code": "not_found",
}


@pytest.fixture(params=[False, True], ids=["production", "debug"])
def debug(request, settings):
    """Both ways Django answers what no view answered: in development (DEBUG) its debug pages."""
    settings.DEBUG = request.param
    return request.param


@pytest.mark.parametrize(
    "path",
    ["nope", "dpp/", "dpp/00000000-0000-0000-0000-000000000000/nope", "outbox/deliveries/1/nope", "v2"],
)
def test_an_unknown_route_is_a_json_404(debug, path):
    response = Client().get(API + path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == NOT_FOUND  # not the debug page listing every URL pattern


@pytest.mark.parametrize(
    "method, path, allowed",
    [("delete", "registry", "GET, HEAD"), ("put", "dpp", "GET, HEAD, POST"), ("get", "events", "POST")],
)
def test_a_method_the_route_does_not_take_is_a_json_405_with_allow(debug, method, path, allowed):
    response = getattr(Client(), method)(API + path, headers={"Authorization": f"Bearer {issue_token()}"})
    assert response.status_code == 405
    assert response["Allow"] == allowed
    assert response.json() == {
        "detail": f"This route does not take {method.upper()}; it takes {allowed}.",
        "code": "method_not_allowed",
    }


def test_a_host_not_served_is_a_json_400_under_the_api_only(debug):
    response = Client().get(API + "registry", HTTP_HOST="elsewhere.example")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "The Host header names no host this node serves (ALLOWED_HOSTS).",
        "code": "disallowed_host",
    }
    # Outside the API it stays Django's own answer (a page, in development the debug page).
    outside = Client().get("/admin/login/", HTTP_HOST="elsewhere.example")
    assert outside.status_code == 400 and not outside["Content-Type"].startswith("application/json")


def test_an_error_raised_before_the_api_is_a_json_500_never_a_traceback(debug, monkeypatch, caplog):
    def broken(request):
        raise RuntimeError("a middleware's bug")

    monkeypatch.setattr("odal.core.middleware.find_problem", broken)  # (UnstorableInputMiddleware's)
    response = Client(raise_request_exception=False).get(API + "registry")
    assert response.status_code == 500
    body = response.json()
    assert body == {
        "detail": f"Something went wrong on our side; it was logged as error {body['errorId']}. "
        "Try again later, or quote that id to the node's operator.",
        "code": "internal_error",
        "errorId": body["errorId"],
    }
    assert b"Traceback" not in response.content and b"a middleware" not in response.content
    assert any(body["errorId"] in record.getMessage() for record in caplog.records)


def chunked(client: Client, path: str, body: bytes, *, server_decodes: bool = True, **headers):
    """POST `body` as a server hands a chunked one to Django: no CONTENT_LENGTH, the decoded body
    in wsgi.input, `wsgi.input_terminated` from a server that decodes it (gunicorn); none from
    Django's development server, whose wsgi.input then holds nothing for Django."""
    environ = {
        "CONTENT_LENGTH": "",
        "HTTP_TRANSFER_ENCODING": "chunked",
        "wsgi.input": io.BytesIO(body if server_decodes else b""),
    }
    if server_decodes:
        environ["wsgi.input_terminated"] = True
    return client.post(path, body, content_type="application/json", headers=headers, **environ)


def test_a_chunked_body_is_read(client):
    token = issue_token("write")
    body = json.dumps({"type": "passport.published", "payload": {"n": 1}}).encode()
    response = chunked(client, API + "events", body, Authorization=f"Bearer {token}")
    assert response.status_code == 201, response.content  # it was: 422 "request: Field required"
    assert Event.objects.get().payload == {"n": 1}


def test_a_chunked_body_over_the_limit_is_413_as_a_sized_one_is(client, settings):
    settings.ODAL_MAX_BODY_BYTES = 2048
    settings.ODAL_MAX_BULK_BODY_BYTES = 8192
    token = issue_token("write")
    big = json.dumps({"type": "passport.published", "payload": {"s": "x" * 3000}}).encode()
    response = chunked(client, API + "events", big, Authorization=f"Bearer {token}")
    assert response.status_code == 413
    assert response.json() == {
        "detail": "The request body is larger than 2048 bytes.",
        "code": "body_too_large",
    }
    assert not Event.objects.exists()
    # POST dpp/bulk has its own limit, for chunked bodies too.
    items = [{"upi": UPI.format(n), "operatorId": "OP", "data": {"note": "x" * 600}} for n in range(5)]
    response = chunked(
        client, API + "dpp/bulk", json.dumps({"items": items}).encode(), Authorization=f"Bearer {token}"
    )
    assert response.status_code == 200 and Passport.objects.count() == 5


def test_a_chunked_body_the_server_cannot_read_is_411(client):
    token = issue_token("write")
    body = json.dumps({"type": "passport.published", "payload": {}}).encode()
    response = chunked(client, API + "events", body, server_decodes=False, Authorization=f"Bearer {token}")
    assert response.status_code == 411
    assert response.json() == {
        "detail": "Send the body with a Content-Length: this server cannot read a chunked body.",
        "code": "length_required",
    }
    assert not Event.objects.exists()


def test_a_chunked_form_over_the_limit_outside_the_api_is_refused_too(client, settings):
    """Outside the API a sized form over the limit is Django's 400, multipart ones aside (Django
    streams their files to disk): a chunked one is held in memory, so it is refused whatever it is,
    not handed on cut at the limit."""
    settings.ODAL_MAX_BODY_BYTES = 2048
    boundary = "odal-boundary"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="username"\r\n\r\n{"u" * 3000}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="password"\r\n\r\npw\r\n--{boundary}--\r\n'
    ).encode()
    response = client.post(
        "/admin/login/",
        form,
        content_type=f"multipart/form-data; boundary={boundary}",
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": io.BytesIO(form), "wsgi.input_terminated": True},
    )
    assert response.status_code == 400


@contextmanager
def development_server(port: int, env: dict, log):
    """`odal runserver` (Django's development server, as `make run` starts it) on `port`."""
    with answering(["runserver", "--noreload", f"127.0.0.1:{port}"], port, env, log) as process:
        yield process


def pieces(body: bytes):
    """`body` as an iterator: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), 100):
        yield body[start : start + 100]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the server reads the token this test commits
def test_the_development_server_refuses_a_chunked_body_with_411(tmp_path):
    token = issue_token("write")
    port = free_port()
    env = production(tmp_path / "static", ODAL_ENV="development", DEBUG="true", ODAL_METRICS_TOKEN=None)
    body = json.dumps({"upi": UPI.format(1), "operatorId": "OP"}).encode()
    with (tmp_path / "runserver.log").open("w+") as log, development_server(port, env, log):
        response = httpx.post(
            f"http://127.0.0.1:{port}{API}dpp",
            content=pieces(body),
            headers={"Host": HOST, "Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 411, response.text  # it was: 422 "request: Field required"
        assert response.json()["code"] == "length_required"
        missing = httpx.get(f"http://127.0.0.1:{port}{API}nope", headers={"Host": HOST})
        assert (missing.status_code, missing.json()) == (404, NOT_FOUND)  # not the debug page
    assert not Passport.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the server's workers read what this test commits
def test_odal_serve_reads_chunked_bodies_and_answers_json_errors(tmp_path):
    token = issue_token("write")
    port = free_port()
    env = production(tmp_path / "static", ODAL_MAX_BODY_BYTES="4096")
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}{API}",
        headers={"Host": HOST, "X-Forwarded-Proto": "https", "Authorization": f"Bearer {token}"},
        timeout=30,
    )

    with (tmp_path / "serve.log").open("w+") as log, serving(port, env, log), api:
        body = json.dumps({"upi": UPI.format(1), "operatorId": "OP"}).encode()
        request = api.build_request("POST", "dpp", content=pieces(body))
        assert request.headers["Transfer-Encoding"] == "chunked" and "Content-Length" not in request.headers
        created = api.send(request)
        assert created.status_code == 201, created.text  # it was: 422 "request: Field required"
        assert Passport.objects.get(pk=created.json()["id"]).upi == UPI.format(1)

        big = json.dumps({"upi": UPI.format(2), "operatorId": "OP", "data": {"s": "x" * 5000}}).encode()
        refused = api.post("dpp", content=pieces(big))
        assert refused.status_code == 413 and refused.json()["code"] == "body_too_large"
        assert Passport.objects.count() == 1

        missing = api.get("nope")
        assert (missing.status_code, missing.json()) == (404, NOT_FOUND)
        wrong = api.delete("registry")
        assert (wrong.status_code, wrong.headers["Allow"], wrong.json()["code"]) == (
            405,
            "GET, HEAD",
            "method_not_allowed",
        )
        stranger = api.get("registry", headers={"Host": "elsewhere.test"})
        assert (stranger.status_code, stranger.json()["code"]) == (400, "disallowed_host")


# -- HEAD (issue 37) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["registry", "dpp?limit=5", "outbox", "outbox/consumers", "dpp/{id}"])
def test_head_on_a_get_route_answers_as_get_without_a_body(path):
    passport = Passport.objects.create(upi=UPI.format("head"), operator_id="OP")
    client = Client(headers={"Authorization": f"Bearer {issue_token('read')}"})
    url = API + path.format(id=passport.pk)
    get, head = client.get(url), client.head(url)
    assert get.status_code == head.status_code == 200, head.content
    assert head.content == b""
    assert head["Content-Type"] == get["Content-Type"] == "application/json; charset=utf-8"
    assert head["Content-Length"] == str(len(get.content))


def test_head_answers_a_refusal_as_get_does_without_a_body():
    unauthenticated = Client().head(API + "registry")
    assert (unauthenticated.status_code, unauthenticated.content) == (401, b"")
    reader = Client(headers={"Authorization": f"Bearer {issue_token('read')}"})
    missing = reader.head(API + "nope")
    assert (missing.status_code, missing.content, missing["Content-Type"]) == (404, b"", "application/json")
    assert missing["Content-Length"] == str(len(reader.get(API + "nope").content))
    post_only = Client(headers={"Authorization": f"Bearer {issue_token('write')}"}).head(API + "events")
    assert (post_only.status_code, post_only["Allow"], post_only.content) == (405, "POST", b"")
