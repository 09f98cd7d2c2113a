"""A recording HTTP reverse proxy on 127.0.0.1, in front of a real server (moto_server).

Clients talk to it exactly as to the server behind it; it records every request's method
and path, so a test can count what a client sent, and can slow chosen methods down so a
test can kill a client in the middle of an upload.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection",
               "te", "trailer", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    server: "RecordingProxy"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:
        pass

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        body = self._read_body()
        path = urlsplit(self.path).path
        with self.server.lock:
            self.server.requests.append((self.command, path))
            self.server.in_flight += 1
        try:
            self._relay(body)
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _relay(self, body: bytes) -> None:
        delay = self.server.delays.get(self.command, 0.0)
        if delay:
            time.sleep(delay)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.server.upstream_host,
                                              self.server.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed mid-request: what the tests do on purpose
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = lambda self: self._forward()  # noqa: E731


class RecordingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.requests: list[tuple[str, str]] = []
        self.delays: dict[str, float] = {}
        self.in_flight = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, method: str | None = None) -> int:
        with self.lock:
            return sum(1 for m, _ in self.requests if method is None or m == method)

    def settle(self, timeout: float = 30) -> None:
        """Wait until requests already received have been relayed (a killed client's too)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def start(upstream: str) -> RecordingProxy:
    proxy = RecordingProxy(upstream)
    proxy.thread.start()
    return proxy
