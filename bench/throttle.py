"""A TCP relay on 127.0.0.1 that caps each connection's download rate.

On loopback one stream is as fast as the CPU; a real object store is not: per-connection
throughput is bounded by the round trip and the store's per-stream limits (tens of MB/s
per S3 connection), and parallel streams are how clients go faster. This relay puts that
cap back, per connection, so the benchmark can show what parallel ranged GETs buy.
"""

from __future__ import annotations

import socket
import threading
import time

CHUNK = 64 * 1024
BURST = 1024 * 1024


class ThrottledRelay:
    def __init__(self, target_port: int, mb_per_s: float) -> None:
        self.target_port = target_port
        self.rate = mb_per_s * 1024 * 1024
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, None),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.rate),
                             daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, rate: float | None) -> None:
        # A token bucket with a small burst: an idle kept-alive connection must not save
        # up credit for a later object.
        tokens, last = 0.0, time.monotonic()
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
                if rate:
                    now = time.monotonic()
                    tokens = min(BURST, tokens + (now - last) * rate) - len(data)
                    last = now
                    if tokens < 0:
                        time.sleep(-tokens / rate)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
