"""A real S3-compatible server on 127.0.0.1 for tests and benchmarks: moto's
server, behind a small proxy that adds latency and fails requests on
purpose. A plain module (bench/store.py imports it too).

    store = ObjectStore.start()              # moto on a free port, the proxy in front
    store.latency_s = 0.02                   # every request waits this long
    store.fail = lambda method, path, n: n % 3 == 0   # which requests get a 503
    store.drop = lambda method, path, n: n == 2       # which answers stop halfway (the socket closed)
    store.cut = lambda method, path, n: 100           # which GET bodies lie, and by how many bytes (below)
    store.garble = lambda method, path, n: n == 2     # which GET bodies have a byte changed (same length)
    store.unframed = True                             # a lying body without Content-Length (ends at close)
    store.sent_bytes                                  # bytes of GET bodies sent, by object path (a Counter)
    Store("s3://bucket", storage_options=store.options())   # conveyor.Store through the proxy
    store.stop()
"""

from __future__ import annotations

import http.client
import http.server
import re
import threading
import time
from collections import Counter
from typing import Callable, Optional

BUCKET = "data"
#: The status recorded for an answer the proxy cut off halfway.
DROPPED = "dropped"
#: The statuses recorded for a body the proxy made shorter or longer, or changed, and sent as whole.
CUT, GARBLED = "cut", "garbled"
_UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>injected by the test</Message></Error>"
)


class ObjectStore:
    def __init__(self, server, proxy, host: str, port: int):
        self._server, self._proxy = server, proxy
        self.host, self.port = host, port
        self.latency_s = 0.0
        #: (method, path, request number) -> whether to answer 503 instead.
        self.fail: Optional[Callable[[str, str, int], bool]] = None
        #: (method, path, request number) -> whether to send half the answer, then close the connection.
        self.drop: Optional[Callable[[str, str, int], bool]] = None
        #: (method, path, request number) -> k: send a GET's body less its last k bytes (k > 0), or with -k
        #: bytes more (k < 0), as if it were the whole answer: Content-Length and Content-Range say so, and
        #: the checksum headers are left out, so that the client has nothing to tell it from a true answer.
        self.cut: Optional[Callable[[str, str, int], int]] = None
        #: (method, path, request number) -> whether to send a GET's body with its middle byte changed.
        self.garble: Optional[Callable[[str, str, int], bool]] = None
        #: Whether a lying body goes without Content-Length (HTTP/1.1: the body ends when the socket closes).
        self.unframed = False
        self.requests: list = []  # (method, path, status)
        #: Bytes of GET bodies sent, by path (without its query): what clients downloaded.
        self.sent_bytes: Counter = Counter()
        self._lock = threading.Lock()

    @classmethod
    def start(cls) -> "ObjectStore":
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # (one line per request otherwise)

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ).create_bucket(Bucket=BUCKET)
        store = cls(server, None, host, port)
        proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
        proxy.daemon_threads = True
        threading.Thread(target=proxy.serve_forever, name="test-s3-proxy", daemon=True).start()
        store._proxy = proxy
        return store

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._proxy.server_address[1]}"

    def options(self) -> dict:
        """s3fs's options to reach the store through the proxy (botocore's own retries off)."""
        return {
            "key": "test",
            "secret": "test",
            "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 1}},
        }

    def record(self, method: str, path: str, status: int) -> int:
        with self._lock:
            self.requests.append((method, path, status))
            return len(self.requests)

    def stop(self) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()
        self._server.stop()


def _handler(store: ObjectStore):
    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if store.latency_s:
                time.sleep(store.latency_s)
            with store._lock:
                number = len(store.requests) + 1
            if store.fail is not None and store.fail(self.command, self.path, number):
                store.record(self.command, self.path, 503)
                self.send_response(503)
                self.send_header("Content-Length", str(len(_UNAVAILABLE)))
                self.end_headers()
                self.wfile.write(_UNAVAILABLE)
                return
            connection = http.client.HTTPConnection(store.host, store.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            connection.close()
            if store.drop is not None and store.drop(self.command, self.path, number) and len(data) > 1:
                self._cut_off(response, data)
                return
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")]
            lie = None
            if self.command == "GET" and response.status in (200, 206):
                headers, data, lie = self._lie(headers, data, number)
            store.record(self.command, self.path, lie or response.status)
            self.send_response(response.status)
            for key, value in headers:
                if key.lower() != "content-length":
                    self.send_header(key, value)
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            if lie is not None and store.unframed:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", length if length is not None else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
                if self.command == "GET":
                    with store._lock:
                        store.sent_bytes[self.path.split("?")[0]] += len(data)

        def _lie(self, headers: list, data: bytes, number: int) -> tuple[list, bytes, Optional[str]]:
            """(headers, body, CUT or GARBLED or None) of a GET's answer as ``store.cut`` and ``store.garble`` want."""
            k = (store.cut(self.command, self.path, number) if store.cut is not None else 0) or 0
            garble = bool(data) and store.garble is not None and store.garble(self.command, self.path, number)
            if not k and not garble:
                return headers, data, None
            if k > 0:
                data = data[: max(0, len(data) - k)]
            elif k < 0:
                data = data + bytes(range(256)) * (-k // 256) + bytes(range(-k % 256))
            if garble:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
            kept = []
            for key, value in headers:
                if key.lower().startswith("x-amz-checksum-"):
                    continue  # (a checksum of the true body would give the lie away)
                if key.lower() == "content-range" and k:
                    first, total = re.fullmatch(r"bytes (\d+)-\d+/(\S+)", value).groups()
                    value = f"bytes {first}-{int(first) + len(data) - 1}/{total}"
                kept.append((key, value))
            return kept, data, CUT if k else GARBLED

        def _cut_off(self, response, data: bytes) -> None:
            """Announce the whole body, send half of it, and close the socket."""
            import socket

            store.record(self.command, self.path, DROPPED)
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    return Proxy
