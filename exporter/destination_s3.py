"""An S3 destination: data objects first, read back and checked, ``manifest.json`` last.

S3 has no rename, so the manifest is the commit: a reader loads an export only when
``<prefix>/manifest.json`` exists, and it is written after every file it lists has been
uploaded and read back. A previous export's manifest is deleted before its files are
overwritten, so no reader ever pairs an old manifest with new files. Each object carries
its sha256 as metadata: a re-run after a kill skips the objects already whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError

from kubetune import retry
from kubetune.errors import BadInputError, TransientError
from kubetune.exporter import export_manifest
from kubetune.exporter.build_tree import build_tree
from kubetune.remote import s3 as remote_s3
from kubetune.remote import s3_errors
from kubetune.storage_uri import S3Uri
from kubetune.workspace import EXPORT_MANIFEST_NAME

log = logging.getLogger("exporter")

SHA_KEY = "sha256"


class S3Destination:
    def __init__(self, where: S3Uri, work_dir: Path, probe_timeout_s: float | None = None
                 ) -> None:
        """``probe_timeout_s``: a quick check (one attempt per call, requests bounded by
        it), not an export."""
        self.bucket = where.bucket
        self.prefix = where.prefix.strip("/")
        self.description = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.work_dir = Path(work_dir)
        self._client = None
        self._probe_timeout_s = probe_timeout_s
        self._policy = retry.RetryPolicy(max_attempts=1) if probe_timeout_s else None

    # -- plumbing ----------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            # ROLE_ARN is assumed here, under its own retry: `check` asks first, outside
            # any other retry loop.
            bound = self._probe_timeout_s
            self._client = remote_s3.client("kubetune-exporter", **(
                {"connect_timeout": bound, "read_timeout": bound} if bound else {}))
        return self._client

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    @staticmethod
    def _unwrap(exc: BaseException) -> BaseException:
        # upload_file wraps the ClientError that says what went wrong.
        if isinstance(exc, S3UploadFailedError):
            return exc.__cause__ or exc.__context__ or exc
        return exc

    def _classify(self, exc: BaseException) -> retry.TransientFailure | None:
        exc = self._unwrap(exc)
        if isinstance(exc, ClientError):
            return s3_errors.transient(exc, said="S3 answered")
        return s3_errors.transport_failure(exc)

    def _call(self, what: str, func):
        try:
            return retry.call(func, f"{what} ({self.description})", policy=self._policy,
                              classify=self._classify)
        except s3_errors.NO_CREDENTIALS:
            raise BadInputError(f"{s3_errors.NO_CREDENTIALS_MESSAGE} (for "
                                f"{self.description})") from None
        except Exception as raised:
            exc = self._unwrap(raised)
            if not isinstance(exc, ClientError):
                raise
            code = s3_errors.code_of(exc)
            if code in ("404", "NoSuchBucket"):
                raise BadInputError(f"bucket {self.bucket} does not exist: create it or fix "
                                    "EXPORT_URI") from None
            if code in s3_errors.CREDENTIAL_CODES | s3_errors.DENIED_CODES \
                    or s3_errors.status_of(exc) == 403:
                raise BadInputError(f"the S3 credentials may not {what} {self.description} "
                                    f"({code}): grant s3:PutObject/GetObject/ListBucket/"
                                    "DeleteObject on it or fix ACCESS_KEY_ID / "
                                    "SECRET_ACCESS_KEY") from None
            raise BadInputError(f"S3 refused to {what} {self.description}: {code}") from None

    # -- the four steps ----------------------------------------------------------------
    def check(self) -> None:
        client = self.client
        self._call("read", lambda: client.head_bucket(Bucket=self.bucket))

    def build_dir(self) -> contextlib.AbstractContextManager[Path]:
        return build_tree(self.work_dir, self.description)

    def read_manifest(self) -> dict | None:
        def get():
            try:
                body = self.client.get_object(Bucket=self.bucket,
                                              Key=self.key(EXPORT_MANIFEST_NAME))["Body"]
                return body.read()
            except ClientError as exc:
                if s3_errors.is_missing_key(exc):
                    return None
                raise

        raw = self._call("read", get)
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    def _uploaded_sha(self, path: str) -> str | None:
        def head():
            try:
                return self.client.head_object(Bucket=self.bucket, Key=self.key(path))
            except ClientError as exc:
                if s3_errors.is_missing_key(exc):
                    return None
                raise

        found = self._call("read", head)
        return (found or {}).get("Metadata", {}).get(SHA_KEY)

    def _read_back(self, entry: dict) -> None:
        def digest() -> tuple[str, int]:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(entry["path"]))["Body"]
            sha, size = hashlib.sha256(), 0
            for chunk in iter(lambda: body.read(8 << 20), b""):
                sha.update(chunk)
                size += len(chunk)
            return sha.hexdigest(), size

        sha, size = self._call("read", digest)
        if sha != entry["sha256"] or size != entry["size"]:
            raise TransientError(f"s3://{self.bucket}/{self.key(entry['path'])} read back with "
                                 "another sha256 than was uploaded; re-run the export")

    def publish(self, tree: Path, manifest: dict, previous: dict | None) -> None:
        if previous is not None:
            # Readers gate on the manifest: drop the old one before touching its files.
            self._call("delete", lambda: self.client.delete_object(
                Bucket=self.bucket, Key=self.key(EXPORT_MANIFEST_NAME)))
        uploaded = 0
        for entry in manifest["files"]:
            if self._uploaded_sha(entry["path"]) == entry["sha256"]:
                continue  # whole from an earlier, interrupted run
            source = tree / entry["path"]
            self._call("write", lambda: self.client.upload_file(
                str(source), self.bucket, self.key(entry["path"]),
                ExtraArgs={"Metadata": {SHA_KEY: entry["sha256"]}}))
            uploaded += 1
        for entry in manifest["files"]:
            self._read_back(entry)
        body = export_manifest.encode(manifest)
        self._call("write", lambda: self.client.put_object(
            Bucket=self.bucket, Key=self.key(EXPORT_MANIFEST_NAME), Body=body,
            ContentType="application/json"))
        log.info("uploaded %d of %d files to %s, read back and checked, manifest last",
                 uploaded, len(manifest["files"]), self.description)
        stale = {e["path"] for e in (previous or {}).get("files", [])} - {
            e["path"] for e in manifest["files"]}
        for path in sorted(stale):
            self._call("delete", lambda: self.client.delete_object(Bucket=self.bucket,
                                                                   Key=self.key(path)))

