"""A real Hugging Face Hub on 127.0.0.1, for the endpoints `huggingface_hub` 2.4 calls.

Reached through ``HF_ENDPOINT``. It serves model and dataset repos with branches, tags
and commits, LFS and regular files (with the hub's checksums: sha256 for LFS, git blob
sha1 for the rest), and lets a test inject faults and count requests:

- ``GET /api/{models,datasets}/{repo}[/revision/{rev}]`` (repo info: the resolved ``sha``)
- ``GET /api/{models,datasets}/{repo}/tree/{rev}[/{path}]?recursive=..`` (listing)
- ``POST /api/{models,datasets}/{repo}/paths-info/{rev}`` (form field ``paths``)
- ``HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}`` with ``ETag``, ``X-Repo-Commit``,
  ``X-Linked-Etag``, ``X-Linked-Size``, ``Accept-Ranges`` and ``Range`` support.

Run standalone (the bench does, so the server does not share the client's GIL):
``python -m tests.support.hub_server --model org/name=DIR --dataset org/name=DIR``
prints the endpoint URL on its first line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.faults import FaultBook

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".parquet", ".arrow", ".h5", ".msgpack",
                ".model", ".gguf")
LFS_MIN_SIZE = 10 * 1024
CHUNK = 1024 * 1024


@dataclass
class HubFile:
    path: str
    size: int
    sha256: str
    blob_sha1: str
    lfs: bool
    data: bytes | None = None  # in memory, or
    source: Path | None = None  # served from disk (large bench files)

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)


def _hash_file(content: bytes | Path) -> tuple[int, str, str]:
    sha256 = hashlib.sha256()
    if isinstance(content, bytes):
        size = len(content)
        sha256.update(content)
        blob = hashlib.sha1(f"blob {size}\0".encode() + content).hexdigest()
        return size, sha256.hexdigest(), blob
    size = content.stat().st_size
    blob = hashlib.sha1(f"blob {size}\0".encode())
    with open(content, "rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            blob.update(chunk)
    return size, sha256.hexdigest(), blob.hexdigest()


def make_file(path: str, content: bytes | Path) -> HubFile:
    size, sha256, blob = _hash_file(content)
    lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
    return HubFile(path=path, size=size, sha256=sha256, blob_sha1=blob, lfs=lfs,
                   data=content if isinstance(content, bytes) else None,
                   source=None if isinstance(content, bytes) else content)


@dataclass
class Repo:
    repo_id: str
    repo_type: str  # "model" or "dataset"
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    private: bool = False
    gated: bool = False

    def resolve(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        if revision in self.commits:
            return revision
        return None


@dataclass
class Fault:
    """Applied to the next ``times`` requests whose path matches ``match`` (a glob)."""

    # "status" | "reset" | "truncate" | "corrupt" | "slow" | "slow_reset" | "stall" | "stall_api"
    kind: str
    match: str
    times: int = 1
    method: str | None = None  # None: any
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    bytes_per_s: int = 64 * 1024  # for "slow"
    stall_s: float = 5.0  # for "stall": headers, then silence


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


def local_tree(directory: Path, in_memory_below: int = 1 << 20) -> dict[str, bytes | Path]:
    """Every file under ``directory``: small ones as bytes, large ones served from disk."""
    files: dict[str, bytes | Path] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            rel = path.relative_to(directory).as_posix()
            files[rel] = path.read_bytes() if path.stat().st_size < in_memory_below else path
    return files


class HubServer(FaultBook):
    fault_type = Fault

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.token = token  # the one token the hub accepts
        self.page_size = 1000  # tree entries per page
        self.repos: dict[tuple[str, str], Repo] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # Content.
    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], repo_type: str = "model",
                 branch: str = "main", tags: tuple[str, ...] = (), private: bool = False,
                 gated: bool = False) -> str:
        """Commit ``files`` as the new head of ``branch``; return the commit sha."""
        built = {p: make_file(p, c) for p, c in files.items()}
        listing = json.dumps(sorted((p, f.blob_sha1) for p, f in built.items()))
        repo = self.repos.setdefault((repo_type, repo_id), Repo(repo_id, repo_type))
        sha = hashlib.sha1(f"{repo_id}\0{branch}\0{len(repo.commits)}\0{listing}".encode()
                           ).hexdigest()
        repo.commits[sha] = built
        repo.refs[branch] = sha
        for tag in tags:
            repo.refs[tag] = sha
        repo.private = repo.private or private
        repo.gated = repo.gated or gated
        return sha

    # Counting (faults: FaultBook).
    def count(self, method: str | None = None, contains: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if (method is None or r.method == method) and contains in r.path)

    def _find_repo(self, repo_type: str, rest: str) -> tuple[Repo, str] | None:
        """The repo whose id starts ``rest``, and what follows it."""
        for (kind, repo_id), repo in self.repos.items():
            if kind == repo_type and (rest == repo_id or rest.startswith(repo_id + "/")):
                return repo, rest[len(repo_id):].lstrip("/")
        return None


def _entries(files: dict[str, HubFile], base: str, recursive: bool) -> list[dict]:
    prefix = base.strip("/") + "/" if base.strip("/") else ""
    out, folders = [], set()
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):]
        if "/" in rest:
            parts = rest.split("/")
            depth = len(parts) - 1 if recursive else 1
            for i in range(1, depth + 1):
                folders.add(prefix + "/".join(parts[:i]))
            if not recursive:
                continue
        out.append(_file_entry(files[path]))
    out += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "path": f}
            for f in sorted(folders)]
    return out


def _file_entry(f: HubFile) -> dict:
    entry = {"type": "file", "oid": f.blob_sha1, "size": f.size, "path": f.path}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return entry


def _make_handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: tests read our own output
            pass

        # Plumbing.
        def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
                  content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, payload, headers: dict | None = None) -> None:
            self._send(status, json.dumps(payload).encode(), headers)

        def _error(self, status: int, code: str | None, message: str,
                   extra: dict | None = None) -> None:
            headers = {"X-Error-Message": message, **(extra or {})}
            if code:
                headers["X-Error-Code"] = code
            self._json(status, {"error": message}, headers)

        def _auth_ok(self, repo: Repo) -> bool:
            auth = self.headers.get("Authorization")
            if auth and (hub.token is None or auth != f"Bearer {hub.token}"):
                self._error(401, None, "Invalid credentials in Authorization header")
                return False
            if repo.gated and not auth:
                self._error(401, "GatedRepo", "Access to this repo is restricted: log in")
                return False
            if repo.private and not auth:
                self._error(401, "RepoNotFound", "Repository not found")
                return False
            return True

        def _commit(self, repo: Repo, revision: str) -> str | None:
            sha = repo.resolve(unquote(revision))
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return sha

        # Dispatch: every method the hub client sends.
        def _dispatch(self) -> None:
            split = urlsplit(self.path)
            path = split.path
            fault = hub._take(self.command, unquote(path),
                              Request(self.command, unquote(path), self.headers.get("Range"),
                                      self.headers.get("Authorization")))
            if fault is not None and fault.kind == "stall_api":
                time.sleep(fault.stall_s)  # say nothing at all, then hang up
                self.close_connection = True
                return
            if fault is not None and fault.kind == "status":
                extra = {k: v for k, v in fault.headers.items() if k != "X-Error-Code"}
                self._error(fault.status, fault.headers.get("X-Error-Code"),
                            f"injected {fault.status}", extra)
                return
            try:
                if path.startswith("/api/"):
                    self._api(path[len("/api/"):], parse_qs(split.query))
                else:
                    self._resolve(path.lstrip("/"), fault)
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_HEAD = do_GET = do_POST = _dispatch

        def _api(self, rest: str, query: dict) -> None:
            kind, _, rest = rest.partition("/")
            repo_type = {"models": "model", "datasets": "dataset"}.get(kind)
            found = hub._find_repo(repo_type, unquote(rest)) if repo_type else None
            if found is None:
                self._error(404 if not self.headers.get("Authorization") else 401,
                            "RepoNotFound", "Repository not found")
                return
            repo, tail = found
            if not self._auth_ok(repo):
                return
            # The revision is quoted with safe="" by the client: split the raw path.
            raw_tail = rest.split("/", 2)[2] if rest.count("/") >= 2 else ""
            head, _, after = raw_tail.partition("/")
            if not tail or head == "revision":
                sha = self._commit(repo, unquote(after) if head == "revision" else "main")
                if sha:
                    self._json(200, {"id": repo.repo_id, "sha": sha, "private": repo.private,
                                     "gated": "manual" if repo.gated else False,
                                     "siblings": [{"rfilename": p}
                                                  for p in sorted(repo.commits[sha])]})
                return
            if head == "tree":
                revision, _, sub = after.partition("/")
                sha = self._commit(repo, revision)
                if not sha:
                    return
                files = repo.commits[sha]
                sub = unquote(sub)
                if sub and sub in files:
                    self._error(404, "EntryNotFound", f"{sub} is a file, not a folder")
                    return
                if sub and not any(p.startswith(sub.rstrip("/") + "/") for p in files):
                    self._error(404, "EntryNotFound", f"{sub} does not exist")
                    return
                recursive = query.get("recursive", ["False"])[0].lower() == "true"
                entries = _entries(files, sub, recursive)
                # Cursor paging with a Link header, as the hub does past 1000 entries.
                start = int(query.get("cursor", ["0"])[0])
                page = entries[start:start + hub.page_size]
                headers = {}
                if start + hub.page_size < len(entries):
                    base = f"{hub.url}{urlsplit(self.path).path}"
                    headers["Link"] = (f'<{base}?recursive={str(recursive)}&expand=False&'
                                       f'cursor={start + hub.page_size}>; rel="next"')
                self._json(200, page, headers)
                return
            if head == "paths-info" and self.command == "POST":
                sha = self._commit(repo, after)
                if not sha:
                    return
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                files = repo.commits[sha]
                out = []
                for wanted in form.get("paths", []):
                    wanted = wanted.strip("/")
                    if wanted in files:
                        out.append(_file_entry(files[wanted]))
                    elif any(p.startswith(wanted + "/") for p in files):
                        out.append({"type": "directory", "path": wanted,
                                    "oid": hashlib.sha1(wanted.encode()).hexdigest()})
                self._json(200, out)
                return
            self._error(404, None, "Not found")

        def _resolve(self, rest: str, fault: Fault | None) -> None:
            repo_type = "model"
            if rest.startswith("datasets/"):
                repo_type, rest = "dataset", rest[len("datasets/"):]
            found = hub._find_repo(repo_type, unquote(rest))
            if found is None:
                self._error(404 if not self.headers.get("Authorization") else 401,
                            "RepoNotFound", "Repository not found")
                return
            repo, _ = found
            if not self._auth_ok(repo):
                return
            raw = rest.split("/")
            id_len = len(repo.repo_id.split("/"))
            if len(raw) < id_len + 3 or raw[id_len] != "resolve":
                self._error(404, None, "Not found")
                return
            sha = self._commit(repo, unquote(raw[id_len + 1]))
            if not sha:
                return
            name = unquote("/".join(raw[id_len + 2:]))
            f = repo.commits[sha].get(name)
            if f is None:
                self._error(404, "EntryNotFound", f"{name} does not exist at {sha}")
                return
            self._serve_file(f, sha, fault)

        def _serve_file(self, f: HubFile, sha: str, fault: Fault | None) -> None:
            etag = f'"{f.sha256 if f.lfs else f.blob_sha1}"'
            headers = {"ETag": etag, "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
            if f.lfs:
                headers["X-Linked-Etag"] = etag
                headers["X-Linked-Size"] = str(f.size)
            start, end, status = 0, f.size, 200
            wanted = self.headers.get("Range")
            if wanted and wanted.startswith("bytes="):
                first, _, last = wanted[len("bytes="):].partition("-")
                start = int(first or 0)
                end = min(int(last) + 1, f.size) if last else f.size
                if start >= f.size:
                    self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command == "HEAD":
                return
            kind = fault.kind if fault else None
            if kind in ("reset", "truncate", "slow_reset"):
                half = start + (end - start) // 2
                if kind == "slow_reset":  # a long transfer that drops: half at bytes_per_s
                    step = max(fault.bytes_per_s // 10, 1)
                    for position in range(start, half, step):
                        self.wfile.write(f.read(position, min(position + step, half)))
                        self.wfile.flush()
                        time.sleep(0.1)
                else:
                    self.wfile.write(f.read(start, half))
                self.wfile.flush()
                if kind in ("reset", "slow_reset"):
                    # Let the client read what was sent (an RST discards unread data),
                    # then SO_LINGER 0: close with RST, as a dropped connection looks.
                    time.sleep(1.0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                else:
                    self.connection.shutdown(socket.SHUT_WR)
                self.close_connection = True
                return
            if kind == "stall":
                time.sleep(fault.stall_s)
                self.close_connection = True
                return
            position = start
            while position < end:
                size = min(CHUNK if kind != "slow" else max(fault.bytes_per_s // 10, 1),
                           end - position)
                chunk = f.read(position, position + size)
                if kind == "corrupt":
                    chunk = bytes(b ^ 0xFF for b in chunk[:16]) + chunk[16:]
                    kind = None  # one flipped run is enough
                self.wfile.write(chunk)
                position += size
                if kind == "slow":
                    time.sleep(0.1)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], metavar="ID=DIR")
    parser.add_argument("--dataset", action="append", default=[], metavar="ID=DIR")
    args = parser.parse_args(argv)
    hub = HubServer()
    for kind, specs in (("model", args.model), ("dataset", args.dataset)):
        for spec in specs:
            repo_id, _, directory = spec.partition("=")
            hub.add_repo(repo_id, local_tree(Path(directory)), repo_type=kind)
    hub.start()
    print(hub.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
