"""A real local HTTP server for webhook tests: answers each request by a script of behaviours
and keeps what it received, so tests can check headers, bodies and signatures."""

import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from registry.simulator import write_answer


@dataclass
class Received:
    headers: dict
    body: str
    at: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class Answer:
    """A scripted answer, hostile ones included: the body `chunk` bytes every `trickle` seconds,
    or a TCP reset after `reset_after` bytes of it."""

    status: int
    body: bytes = b""
    headers: list = field(default_factory=list)
    trickle: float = 0.0
    chunk: int = 1
    reset_after: int | None = None


class WebhookServer:
    """`script` is a list of behaviours, used in order (the last one repeats): an int status,
    ("stall", seconds, status) (seconds may be a threading.Event: until it is set), an Answer, or
    a callable making the Answer from what was Received."""

    def __init__(self, script=(204,)):
        self.script = list(script)
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests it was answering at once
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without TCP_NODELAY each keep-alive answer
            # waits for the client's delayed ACK (about 40 ms).
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
                with server.lock:
                    server.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                    behaviour = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                if isinstance(behaviour, tuple):
                    _, seconds, behaviour = behaviour
                    if isinstance(seconds, threading.Event):  # (held until the test sets it)
                        seconds.wait(30)
                    else:
                        time.sleep(seconds)
                with server.lock:
                    server.in_flight -= 1
                if isinstance(behaviour, int):
                    behaviour = Answer(behaviour, b"" if behaviour < 300 else b"upstream exploded")
                elif callable(behaviour):  # (an answer made from the request: an echo)
                    behaviour = behaviour(server.received[-1])
                write_answer(
                    self, behaviour.status, behaviour.body, behaviour.headers,
                    trickle=behaviour.trickle, chunk=behaviour.chunk, reset_after=behaviour.reset_after,
                )  # fmt: skip

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no news
                    super().handle_error(request, client_address)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks"
        # A short poll: shutdown() waits for it, and tests start and stop many servers.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
