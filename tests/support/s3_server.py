"""A real S3 server (moto's `moto_server`) on 127.0.0.1 for the duration of a test session."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen
    access_key_id: str = "kubetune-test-key-id"
    secret_access_key: str = "kubetune-test-secret-key-0123456789"
    region: str = "us-east-1"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key)

    def upload_tree(self, root: Path, bucket: str, prefix: str):
        """A new ``bucket`` holding every file under ``root`` as ``prefix/<its relative
        path>``; returns the client."""
        client = self.client()
        client.create_bucket(Bucket=bucket)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(root).as_posix()}"
                client.upload_file(str(path), bucket, key)
        return client

    def env(self) -> dict[str, str]:
        """The variables Kubeflow Trainer sets on an initializer for S3."""
        return {"ENDPOINT": self.endpoint, "ACCESS_KEY_ID": self.access_key_id,
                "SECRET_ACCESS_KEY": self.secret_access_key, "REGION": self.region}


def start() -> S3Server:
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return S3Server(endpoint=f"http://127.0.0.1:{port}", process=process)
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("moto_server exited at start")
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto_server did not start within 30s")
