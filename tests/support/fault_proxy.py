"""An HTTP proxy on 127.0.0.1 in front of a real server (moto_server), injecting faults.

moto gives S3's semantics; this adds what a real network and a busy S3 do to a client:
503 SlowDown, 403 AccessDenied, 429 with Retry-After, a connection reset or a truncated
body mid-object, flipped bytes. It also records every request (method, path, Range).
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from tests.support.faults import FaultBook

S3_ERROR = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            "<Message>injected</Message><RequestId>kubetune-test</RequestId></Error>")


@dataclass
class ProxyFault:
    kind: str  # "status" | "reset" | "truncate" | "corrupt" | "slow"
    match: str  # glob on the unquoted path, e.g. "/bucket/big/*"
    times: int = 1
    method: str | None = None
    status: int = 503
    code: str = "SlowDown"
    headers: dict[str, str] = field(default_factory=dict)
    ranged_only: bool = False  # only requests carrying a Range header
    bytes_per_s: int = 0  # "slow": the body's pace


@dataclass
class ProxiedRequest:
    method: str
    path: str
    range: str | None
    access_key_id: str | None = None  # whose credentials signed it (SigV4)


class FaultProxy(FaultBook):
    fault_type = ProxyFault

    def __init__(self, target: str) -> None:
        super().__init__()
        parts = urlsplit(target)
        self.target_host, self.target_port = parts.hostname, parts.port
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    endpoint = url  # as `http_proxy.RecordingProxy` names it: one env helper serves both

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def take(self, method: str, path: str, ranged: str | None,
             authorization: str | None = None) -> ProxyFault | None:
        signer = re.search(r"Credential=([^/,\s]+)/", authorization or "")
        request = ProxiedRequest(method, path, ranged, signer.group(1) if signer else None)
        return self._take(method, path, request,
                          applies=lambda fault: bool(ranged) or not fault.ranged_only)


def _handler(proxy: FaultProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _forward(self) -> None:
            path = unquote(urlsplit(self.path).path)
            fault = proxy.take(self.command, path, self.headers.get("Range"),
                               self.headers.get("Authorization"))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if fault is not None and fault.kind == "status":
                payload = S3_ERROR.format(code=fault.code).encode()
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload) if self.command != "HEAD" else 0))
                for k, v in fault.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return
            upstream = http.client.HTTPConnection(proxy.target_host, proxy.target_port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # A HEAD's length is the object's, not that of its empty body.
                self.send_header("Content-Length", response.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
            finally:
                upstream.close()
            if self.command == "HEAD":
                return
            kind = fault.kind if fault else None
            if kind in ("reset", "truncate") and len(data) > 1:
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                if kind == "reset":
                    time.sleep(0.3)  # let the client read it; an RST discards unread data
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                else:
                    self.connection.shutdown(socket.SHUT_WR)
                self.close_connection = True
                return
            if kind == "corrupt":
                data = bytes(b ^ 0xFF for b in data[:16]) + data[16:]
            if kind == "slow":
                step = max(1, fault.bytes_per_s // 20)
                try:
                    for start in range(0, len(data), step):
                        self.wfile.write(data[start:start + step])
                        self.wfile.flush()
                        time.sleep(step / fault.bytes_per_s)
                except OSError:
                    self.close_connection = True  # the client went away (killed)
                return
            try:
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client went away (killed)

        # Every method goes through the same forwarding (as in http_proxy).
        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler
