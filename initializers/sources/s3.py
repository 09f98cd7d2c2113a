"""``s3://bucket/prefix``: every object under a prefix, or one object.

Credentials and endpoint: `kubetune.remote.s3` (``ACCESS_KEY_ID`` / ``SECRET_ACCESS_KEY``,
``ROLE_ARN``, ``ENDPOINT``, else boto3's standard chain).

An object is fetched as one stream, hashed as it arrives, unless splitting it adds
parallelism: while at least as many large objects are left as there are download workers,
whole-object streams already keep every worker busy, and ranges would only add requests
and a second read of each part for hashing. The rest (one big shard, or the last few
that would otherwise run alone) come as ranged GETs in parallel, each written at its
offset as it streams in. Either way memory is bounded by (streams x read chunk), not by
an object's size or count.

Every GET carries ``If-Match: <etag>`` so an object replaced mid-download is detected, and
ETags are checked: a single-part one is the MD5 of the content; a multipart one is the MD5
of the parts' MD5s, checked once a HEAD of part 1 gives the upload's part size.

A stream cut off mid-object goes on from the last byte written; a split object cut off
keeps the parts already whole, which are also recorded beside the file for a run after a
kill. So a reset costs the request, not the object.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from botocore.exceptions import ClientError

from kubetune.initializers.checksums import ChecksumMismatch, Hasher, Verified, verify
from kubetune.initializers.filters import keep
from kubetune.initializers.request import InitRequest
from kubetune.initializers.sources.base import ProgressCallback, RemoteFile
from kubetune.initializers.settings import InitializerSettings
from kubetune.initializers.sources.s3_part_state import PartState
from kubetune.staging import part_state_path
from kubetune.initializers.stream_write import write_stream
from kubetune import env, retry, storage_uri
from kubetune.errors import BadInputError
from kubetune.remote import s3 as remote_s3
from kubetune.remote.s3_errors import S3Errors
from kubetune.retry import TransientFailure

CHUNK = 1024 * 1024
MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
MULTIPART_ETAG = re.compile(r"^[0-9a-f]{32}-([0-9]+)$")
# What a store that does not implement a request parameter answers (bad request, method
# not allowed, not implemented).
UNSUPPORTED_STATUS = (400, 405, 501)

log = logging.getLogger("initializer")


def _chunks(body):
    """The body in views of one reused buffer: no allocation per chunk, so the heap of
    every download thread stays at one CHUNK however much passes through it."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while n := body.readinto(buffer):
        yield view[:n]


def _hash_range(hasher: Hasher, fd: int, start: int, end: int, buffer: bytearray) -> None:
    # Into one reused buffer: a fresh multi-MB bytes per read costs a page fault per 4 KiB,
    # which on a GB object is more CPU than the hashing itself.
    view = memoryview(buffer)
    while start < end:
        n = os.preadv(fd, [view[:min(len(buffer), end - start)]], start)
        if not n:
            raise TransientFailure("a part is shorter on disk than it was downloaded")
        hasher.update(view[:n])
        start += n


def _etag_proves(remote: RemoteFile) -> bool:
    """Whether the ETag check will cover every byte of the file (so old bytes may be kept)."""
    return bool(remote.md5 or (remote.multipart_etag and remote.part_sizes))


def _as_path(rel: str) -> str:
    """The file a key's relative part names (empty and "." segments dropped)."""
    return "/".join(part for part in rel.split("/") if part not in ("", "."))


class S3Source:
    def __init__(self, request: InitRequest) -> None:
        self.request = request
        where = storage_uri.s3(request.uri, env.STORAGE_URI)
        self.bucket, self.prefix = where.bucket, where.prefix
        self.errors = S3Errors(self.bucket, self.prefix)
        settings = InitializerSettings()
        self.part_size = settings.s3_part_size
        self.part_workers = settings.s3_part_workers
        self._part_pool: ThreadPoolExecutor | None = None
        # Keys of the objects to fetch in ranged parts; None until `plan` (then: all large).
        self._split: set[str] | None = None
        # (key, etag, size) -> {part start: response headers} of parts written this run.
        self._done_parts: dict[tuple, dict[int, dict]] = {}
        # (key, etag, size) of whole-object streams begun this run: their bytes so far are
        # that version's, so a retry goes on from them.
        self._streams: set[tuple] = set()
        # (key, etag) -> (part sizes of a multipart upload, whether each part was asked
        # rather than guessed); no sizes when the store does not tell them.
        self._upload_parts: dict[tuple, tuple[tuple[int, ...], bool]] = {}
        self._lock = threading.Lock()
        self.client = remote_s3.client(
            "kubetune-initializer", max_pool_connections=self.part_workers + 16,
            # Checksum validation of ranged GETs is not possible; we check ETags ourselves.
            response_checksum_validation="when_required")

    def classify(self, exc: BaseException) -> TransientFailure | None:
        return self.errors.classify(exc)

    def _parts(self) -> ThreadPoolExecutor:
        # One pool for the parts of every object: the number of open streams (and so the
        # memory) stays fixed however many large files are fetched at once. Part tasks
        # never wait on other tasks, so file workers waiting on parts cannot deadlock it.
        with self._lock:
            if self._part_pool is None:
                self._part_pool = ThreadPoolExecutor(max_workers=self.part_workers,
                                                     thread_name_prefix="part")
            return self._part_pool

    def resolved_revision(self) -> str | None:
        return None  # S3 has no tree-wide version (each GET is pinned to its ETag instead)

    def _list(self) -> list[dict]:
        paginator = self.client.get_paginator("list_objects_v2")
        objects = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            objects.extend(page.get("Contents", []))
        return objects

    def list_files(self) -> list[RemoteFile]:
        objects = retry.call(self._list, f"list s3://{self.bucket}/{self.prefix}",
                             classify=self.classify)
        exact = [o for o in objects if o["Key"] == self.prefix]
        if exact and self.prefix:
            chosen = [(exact[0], self.prefix.rsplit("/", 1)[-1])]
        else:
            # "models/tiny" must not pull in "models/tiny-2/...": only whole path segments.
            base = self.prefix.rstrip("/") + "/" if self.prefix else ""
            chosen = [(o, o["Key"][len(base):]) for o in objects
                      if o["Key"].startswith(base) and not o["Key"].endswith("/")]
        files = []
        # Keys are strings, paths are not: "m/./a", "m//a" and "m/a" are one file on disk.
        by_path: dict[str, str] = {}
        for obj, rel in chosen:
            if not keep(rel, self.request.allow_patterns, self.request.ignore_patterns):
                continue
            same = by_path.setdefault(_as_path(rel), obj["Key"])
            if same != obj["Key"]:
                raise BadInputError(
                    f"s3://{self.bucket}: keys {same!r} and {obj['Key']!r} name the same file "
                    f"{_as_path(rel)!r}: delete or rename one, or exclude it with "
                    "IGNORE_PATTERNS")
            etag = obj.get("ETag", "").strip('"')
            files.append(RemoteFile(
                path=rel, size=obj.get("Size"), etag=etag or None, key=obj["Key"],
                md5=etag if MD5_ETAG.match(etag) else None,
                multipart_etag=etag if MULTIPART_ETAG.match(etag) else None))
        return files

    def plan(self, files: list[RemoteFile], workers: int) -> None:
        """Choose the objects to split into ranged parts; ``files`` come in fetch order."""
        large = [f for f in files if (f.size or 0) > self.part_size]
        # The first objects fill every worker with a whole stream each; those left over
        # when the workers outnumber what remains would run alone, so they are split.
        whole = len(large) - len(large) % max(1, workers)
        self._split = {f.key for f in large[whole:]}

    def _splits(self, remote: RemoteFile) -> bool:
        if (remote.size or 0) <= self.part_size:
            return False
        return self._split is None or remote.key in self._split

    def _get(self, key: str, etag: str | None, byte_range: str | None = None):
        kwargs = {"Bucket": self.bucket, "Key": key}
        if etag:
            kwargs["IfMatch"] = f'"{etag}"'
        if byte_range:
            kwargs["Range"] = byte_range
        try:
            return self.client.get_object(**kwargs)
        except ClientError as exc:
            mapped = self.errors.client_error(exc, key)
            raise mapped from None

    def _fetch_range(self, fd: int, remote: RemoteFile, start: int, end: int,
                     progress: ProgressCallback | None, done: dict[int, dict],
                     state: PartState) -> dict:
        response = self._get(remote.key, remote.etag, f"bytes={start}-{end}")
        offset = start
        for chunk in _chunks(response["Body"]):
            os.pwrite(fd, chunk, offset)
            offset += len(chunk)
            if progress:
                progress(len(chunk))
        if offset != end + 1:
            raise TransientFailure(f"{remote.path}: a part ended after {offset - start} of "
                                   f"{end + 1 - start} bytes")
        # What the hasher needs of a response (the encryption headers), not its body.
        done[start] = {k: v for k, v in response.items() if k != "Body"}
        state.record(start, end)
        return response

    @staticmethod
    def _checked(remote: RemoteFile, response: dict) -> RemoteFile:
        # With SSE-KMS or SSE-C the ETag is not the content's MD5: drop that check.
        if (remote.md5 or remote.multipart_etag) and (
                response.get("ServerSideEncryption") == "aws:kms"
                or response.get("SSECustomerAlgorithm")):
            return replace(remote, md5=None, multipart_etag=None)
        return remote

    def _head_part(self, key: str, number: int) -> dict:
        """The part's HEAD; {} from a store that refuses PartNumber (as if it ignored it)."""
        try:
            # No If-Match: a store may compare it with the part's own ETag; an object
            # replaced before this fails the pinned GETs that follow anyway.
            return self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=number)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in UNSUPPORTED_STATUS:
                return {}
            raise self.errors.client_error(exc, key) from None

    def _exact_part_sizes(self, remote: RemoteFile, parts: int) -> tuple[int, ...]:
        heads = self._parts().map(lambda n: self._head_part(remote.key, n), range(1, parts + 1))
        return tuple(head.get("ContentLength") or 0 for head in heads)

    def _with_upload_parts(self, remote: RemoteFile) -> RemoteFile:
        """``remote`` with the part sizes its multipart ETag is checked by, or without that
        ETag when the store does not tell them (it ignores PartNumber): its size is then
        all that is checked, which the log says."""
        if not remote.multipart_etag or remote.part_sizes:
            return remote
        version = (remote.key, remote.etag)
        if version not in self._upload_parts:
            parts = int(MULTIPART_ETAG.match(remote.multipart_etag).group(1))
            size = remote.size or 0
            first = self._head_part(remote.key, 1)
            part_size = first.get("ContentLength") or 0
            if first.get("PartsCount") != parts or not part_size:
                log.info("%s: the store does not say how this multipart upload was cut: only "
                         "its size is checked", remote.path)
                self._upload_parts[version] = ((), True)
            elif -(-size // part_size) == parts:
                # Every common uploader (aws cli, boto3, mc, rclone) cuts equal parts but the
                # last: one HEAD instead of one per part, confirmed only if the ETag differs.
                sizes = (part_size,) * (parts - 1) + (size - part_size * (parts - 1),)
                self._upload_parts[version] = (sizes, False)
            else:
                self._upload_parts[version] = (self._exact_part_sizes(remote, parts), True)
        sizes, _ = self._upload_parts[version]
        if not sizes:
            return replace(remote, multipart_etag=None)
        return replace(remote, part_sizes=sizes)

    def _recheck_with_exact_parts(self, remote: RemoteFile, destination: Path,
                                  mismatch: ChecksumMismatch) -> Verified:
        """A multipart ETag that differs under the equal-parts guess: learn every part's
        size, and check the file again if the guess was wrong."""
        version = (remote.key, remote.etag)
        guessed, exact = self._upload_parts.get(version, ((), True))
        if mismatch.check != "multipart etag" or exact:
            raise mismatch
        sizes = self._exact_part_sizes(remote, len(guessed))
        self._upload_parts[version] = (sizes, True)
        if sizes == guessed:
            raise mismatch
        return verify(destination, replace(remote, part_sizes=sizes))

    def _resume_point(self, remote: RemoteFile, destination: Path) -> int:
        """How many leading bytes of ``destination`` a whole-object stream can keep."""
        version = (remote.key, remote.etag, remote.size)
        try:
            have = destination.stat().st_size
        except FileNotFoundError:
            return 0
        if not 0 < have < (remote.size or 0):
            return 0
        # Bytes written earlier in this run are of this very version (every GET is pinned
        # to the ETag). Those left by a killed run may be of an object since replaced: kept
        # only when the ETag will prove the whole (a mismatch starts over).
        return have if version in self._streams or _etag_proves(remote) else 0

    def _fetch_whole(self, remote: RemoteFile, destination: Path,
                     progress: ProgressCallback | None) -> Verified:
        have = self._resume_point(remote, destination)
        self._streams.add((remote.key, remote.etag, remote.size))
        response = self._get(remote.key, remote.etag, f"bytes={have}-" if have else None)
        if have and not response.get("ContentRange"):
            have = 0  # the store ignored the range and sent the whole object
        return write_stream(_chunks(response["Body"]), destination, remote,
                            Hasher(self._checked(remote, response)), have, progress)

    def fetch(self, remote: RemoteFile, destination: Path,
              progress: ProgressCallback | None = None) -> Verified:
        remote = self._with_upload_parts(remote)
        try:
            if not self._splits(remote):
                return self._fetch_whole(remote, destination, progress)
            return self._fetch_ranged(remote, destination, progress)
        except ChecksumMismatch as mismatch:
            return self._recheck_with_exact_parts(remote, destination, mismatch)

    def _fetch_ranged(self, remote: RemoteFile, destination: Path,
                      progress: ProgressCallback | None) -> Verified:
        size = remote.size or 0
        # Even parts no larger than part_size: no tail part of a few bytes.
        count = -(-size // self.part_size)
        bounds = [size * i // count for i in range(count + 1)]
        ranges = [(start, end - 1) for start, end in zip(bounds, bounds[1:])]
        # Parts already written by an earlier attempt in this run are kept: one reset on
        # a 10 GB object costs one part again, not the object; so are those a killed run
        # recorded, where the ETag will prove the result. (They are hashed again from disk
        # like the others, so a bad part still fails the checksum.)
        version = (remote.key, remote.etag, size)
        with self._lock:
            done = self._done_parts.setdefault(version, {})
        state = PartState(part_state_path(destination), remote, size)
        full_size = destination.is_file() and destination.stat().st_size == size
        resume = bool(done) and full_size
        if not resume and full_size and _etag_proves(remote):
            recorded = state.recorded(ranges)
            if recorded:
                log.info("%s: %d of %d parts are already here from an earlier run",
                         remote.path, len(recorded), len(ranges))
                done.update({start: {} for start in recorded})
                resume = True
        if not resume:
            done.clear()
            state.begin()
        # 0o666: the umask decides, as for every file we write (0664 under umask 002).
        fd = os.open(destination, os.O_RDWR | os.O_CREAT | (0 if resume else os.O_TRUNC),
                     0o666)
        try:
            os.ftruncate(fd, size)
            futures = [None if s in done else
                       self._parts().submit(self._fetch_range, fd, remote, s, e, progress,
                                            done, state)
                       for s, e in ranges]
            try:
                hasher, buffer = None, bytearray(CHUNK)
                # Hash each part as soon as it and all before it have landed (from the page
                # cache), overlapping the hashing with the parts still downloading.
                for (start, end), future in zip(ranges, futures):
                    response = future.result() if future else done[start]
                    hasher = hasher or Hasher(self._checked(remote, response))
                    _hash_range(hasher, fd, start, end + 1, buffer)
            except BaseException:
                pending = [f for f in futures if f is not None]
                for future in pending:
                    future.cancel()
                wait(pending)  # no part may still write to fd once it is closed
                raise
        finally:
            os.close(fd)
        done.clear()
        return hasher.verified()
