"""A local OpenID Connect provider for the sign-on tests: a real HTTP server in the test process
with discovery, an authorization endpoint that signs whoever `claims` names in at once, a token
endpoint issuing RS256-signed id_tokens, and the JWKS to check them with."""

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

KEY_ID = "stub-key-1"


class OpenIdProvider:
    def __init__(self, *, client_id: str = "odal", client_secret: str = "stub-secret"):
        self.client_id = client_id
        self.client_secret = client_secret
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.claims: dict = {"sub": "person-1"}  # who signs in next (the test sets it)
        self.codes: dict[str, dict] = {}  # code: the authorization request's parameters
        self.token_requests: list[dict] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status: int, body=None, headers=()):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlsplit(self.path)
                query = dict(parse_qsl(url.query))
                if url.path == "/.well-known/openid-configuration":
                    self.answer(200, provider.discovery())
                elif url.path == "/jwks":
                    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(provider.key.public_key()))
                    self.answer(200, {"keys": [{**public, "kid": KEY_ID, "alg": "RS256", "use": "sig"}]})
                elif url.path == "/authorize":
                    if query.get("client_id") != provider.client_id or query.get("response_type") != "code":
                        self.answer(400, {"error": "invalid_request"})
                        return
                    code = secrets.token_urlsafe(16)
                    provider.codes[code] = query
                    back = urlencode({"code": code, "state": query["state"]})
                    self.answer(302, headers=[("Location", f"{query['redirect_uri']}?{back}")])
                else:
                    self.answer(404, {"error": "not_found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(parse_qsl(self.rfile.read(length).decode()))
                provider.token_requests.append(form)
                request = provider.codes.pop(form.get("code", ""), None)
                if (
                    self.path != "/token"
                    or request is None
                    or form.get("client_secret") != provider.client_secret
                    or form.get("redirect_uri") != request["redirect_uri"]
                ):
                    self.answer(400, {"error": "invalid_grant"})
                    return
                self.answer(
                    200,
                    {
                        "access_token": "stub-access",
                        "token_type": "Bearer",
                        "id_token": provider.id_token(request),
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def discovery(self) -> dict:
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "id_token_signing_alg_values_supported": ["RS256"],
        }

    def id_token(self, request: dict) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "aud": self.client_id, "iat": now, "exp": now + 300, **self.claims}
        claims["nonce"] = request.get("nonce")
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": KEY_ID})

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
