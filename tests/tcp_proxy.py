"""A TCP proxy on a free loopback port that a test can take down: in front of a Redis
(tests/test_redis_broker.py) or a PostgreSQL (tests/test_reconnect.py)."""

import socket
import threading


def cut(*sockets):
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv or accept on it
        except OSError:
            pass
        s.close()


class TcpProxy:
    """A TCP proxy on a free loopback port in front of a server (a Redis, a PostgreSQL), which the test takes
    down in two ways. refuse(): its port refuses connections and every connection is cut, as when the server
    stops. silence(): connections are taken again but nothing is ever forwarded on them, nor on
    those already open, as with a hung server or a partitioned network; they never hear back, even
    after restore(). restore(): new connections are forwarded again."""

    def __init__(self, upstream):
        self.upstream = upstream
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.lock = threading.Lock()
        self.silent = False
        self.pairs = set()  # (client, server) sockets being forwarded
        self.held = []  # client sockets that will never hear back
        self.listener = None
        self.listen()

    def listen(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self.accept, args=(listener,), daemon=True).start()

    def accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # refuse() closed it
            with self.lock:
                if self.silent:
                    self.held.append(client)
                    continue
                try:
                    server = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                pair = (client, server)
                self.pairs.add(pair)
            for src, dst in (pair, pair[::-1]):
                threading.Thread(target=self.pump, args=(pair, src, dst), daemon=True).start()

    def pump(self, pair, src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with self.lock:  # one side ended: end the other too, unless silence() holds it
            if pair not in self.pairs:
                return
            self.pairs.discard(pair)
        cut(*pair)

    def refuse(self):
        with self.lock:
            listener, self.listener = self.listener, None
            pairs, self.pairs = self.pairs, set()
        cut(listener, *[s for pair in pairs for s in pair])

    def silence(self):
        with self.lock:
            self.silent = True
            pairs, self.pairs = self.pairs, set()
            self.held.extend(client for client, _ in pairs)
        cut(*[server for _, server in pairs])
        if self.listener is None:
            self.listen()

    def restore(self):
        with self.lock:
            self.silent = False
        if self.listener is None:
            self.listen()

    def close(self):
        if self.listener is not None:
            self.refuse()
        with self.lock:
            held, self.held = self.held, []
        cut(*held)
