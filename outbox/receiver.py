"""A tiny webhook receiver for the `make run` demo: verifies each request's Standard Webhooks
signature with the consumer's secret and prints what arrived."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


def make_server(port: int, secret: str, out) -> ThreadingHTTPServer:
    verifier = Webhook(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
            try:
                message = verifier.verify(body, dict(self.headers))
            except WebhookVerificationError as exc:
                out.write(f"receiver: REFUSED a request with a bad signature ({exc})\n")
                self.send_response(401)
                self.end_headers()
                return
            out.write(
                f"receiver: {message['type']} {json.dumps(message['data'], sort_keys=True)} "
                f"(webhook-id {self.headers['webhook-id']}, signature ok)\n"
            )
            out.flush()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)
