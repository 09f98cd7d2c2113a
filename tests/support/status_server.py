"""A stand-in for Kubeflow Trainer's TrainJob status endpoint: HTTPS on 127.0.0.1 with a
certificate from a CA made here, a token file, and what the controller injects.

It records every request (path, headers, JSON body) and answers as told: 200, 500, or
not at all (``hang``: the connection stays open, unanswered, until the server stops).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/tune/status"


def make_ca_and_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server-key.pem): a self-signed CA and a leaf for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubetune test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@dataclass
class Recorded:
    path: str
    headers: dict
    body: dict | None


@dataclass
class StatusServer:
    url: str
    ca_file: Path
    token_file: Path
    server: ThreadingHTTPServer
    behaviour: list  # one-element list: "ok", "500" or "hang" (changeable while running)
    requests: list[Recorded] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def env(self) -> dict[str, str]:
        """What the controller injects into a trainer container."""
        return {"KUBEFLOW_TRAINER_SERVER_URL": self.url,
                "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(self.ca_file),
                "KUBEFLOW_TRAINER_SERVER_TOKEN": str(self.token_file)}

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


def start(directory: Path, behaviour: str = "ok", token: str = "kt-status-token-1") -> StatusServer:
    ca, cert, key = make_ca_and_cert(directory / "tls")
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    state: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            server = state["server"]
            server.requests.append(Recorded(self.path, dict(self.headers), body))
            mode = server.behaviour[0]
            if mode == "hang":
                server.stopping.wait(120)
                return
            code = 500 if mode == "500" else 200
            reply = b"{}"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    port = httpd.server_address[1]
    server = StatusServer(f"https://127.0.0.1:{port}{STATUS_PATH}", ca, token_file, httpd,
                          [behaviour])
    state["server"] = server
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return server
