"""The benchmark's webhook consumer: a small asyncio HTTP/1.1 server (keep-alive) that answers
every POST with 204 (500 to a path starting /fail) and notes when each one arrived, so the benchmark measures odal rather than
a slow receiver. It does not verify signatures (the test suite does, with the standardwebhooks
package); a consumer that does spends its own CPU, not odal's.

    python bench/receiver.py --port 0      prints "listening on <port>", then serves

GET /stats answers {"count": n, "arrivals": [[n, unix_time], …]} where n is the event payload's
"n" (when the body has one), and POST /reset forgets everything.
"""

import argparse
import asyncio
import json
import re
import time

CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
SEQUENCE = re.compile(rb'"data":\{[^}]*"n":(\d+)')

count = 0
arrivals: list[tuple[int, float]] = []


class Http(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        global count
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            match = CONTENT_LENGTH.search(head)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith(b"GET /stats"):
                payload = json.dumps({"count": count, "arrivals": arrivals}).encode()
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(payload)).encode()
                    + b"\r\n\r\n"
                    + payload
                )
                continue
            if head.startswith(b"POST /reset"):
                count = 0
                arrivals.clear()
            else:
                now = time.time()
                count += 1
                sequence = SEQUENCE.search(body)
                if sequence:
                    arrivals.append((int(sequence.group(1)), now))
            if head.startswith(b"POST /fail"):  # the failing endpoint of the pipeline rows
                self.transport.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 6\r\n\r\nfailed")
            else:
                self.transport.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Http, "127.0.0.1", port)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    try:  # libuv's loop where it is (odal's webhook client has it): the receiver's CPU is not odal's
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(parser.parse_args().port))
