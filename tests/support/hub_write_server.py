"""A writable Hugging Face Hub stand-in on 127.0.0.1: the calls huggingface_hub 2.4.0 makes
to create a repo or a branch, pre-upload and commit files, list a tree and resolve a file.

Every file is answered ``uploadMode: "regular"`` at pre-upload, so its bytes travel inline
(base64) in the commit payload and no LFS/Xet storage is needed. Commits are applied
whole or not at all, as the Hub does. Requests are recorded so tests can count them, and
a commit can be held (``hold_commits``) to kill a client in the middle of an upload.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_BRANCH = "main"


def git_blob_oid(content: bytes) -> str:
    """The git object id of a file's content, what the Hub reports as a file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit oid
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # oid -> tree

    def tree(self, revision: str) -> dict[str, bytes] | None:
        oid = self.branches.get(revision, revision)
        return self.commits.get(oid)


@dataclass
class HubState:
    # token -> (user name, may write); roles: what whoami says of a token
    tokens: dict[str, tuple[str, bool]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    # Answer this many commits with 503 before accepting one, as an overloaded hub does.
    fail_commits: int = 0
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    hold_commits: threading.Event = field(default_factory=threading.Event)
    # A held commit released with this set is dropped, as when its sender died mid-upload.
    abandon_held: bool = False
    commit_received: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count = field(default_factory=itertools.count)

    def new_commit(self, repo: Repo, tree: dict[str, bytes]) -> str:
        oid = hashlib.sha1(f"commit {next(self._ids)} {sorted(tree)}".encode()).hexdigest()
        repo.commits[oid] = tree
        return oid

    def create_repo(self, repo_id: str) -> Repo:
        repo = Repo()
        repo.branches[DEFAULT_BRANCH] = self.new_commit(repo, {})
        self.repos[repo_id] = repo
        return repo


_API_REPO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<rest>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _Handler(BaseHTTPRequestHandler):
    server: "HubWriteServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # quiet: tests read the request log
        pass

    # -- plumbing ------------------------------------------------------------------
    @property
    def state(self) -> HubState:
        return self.server.state

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        try:
            self._write(status, body, headers or {}, content_type)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed mid-request: what the tests do on purpose

    def _write(self, status: int, body: bytes, headers: dict[str, str], content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _user(self) -> tuple[str, bool] | None | bool:
        """(user, may write); None without a token; False for an unknown token."""
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return None
        return self.state.tokens.get(auth[len("Bearer "):], False)

    def _require_write(self, repo_id: str) -> bool:
        user = self._user()
        if user is None or user is False:
            self._error(401, "Invalid credentials in Authorization header")
            return False
        if not user[1]:
            self._error(403, f"You don't have the rights to write to {repo_id}: "
                             "the token is read-only")
            return False
        return True

    def _route(self) -> None:
        url = urlsplit(self.path)
        with self.state.lock:
            self.state.requests.append((self.command, url.path))
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/api/whoami-v2" and self.command == "GET":
            return self._whoami()
        if url.path == "/api/repos/create" and self.command == "POST":
            return self._create_repo()
        if url.path == "/api/validate-yaml" and self.command == "POST":
            self._body()
            return self._json(200, {"errors": [], "warnings": []})
        match = _API_REPO.match(url.path)
        if match:
            return self._repo_api(match["repo"], match["rest"] or "", query)
        match = _RESOLVE.match(url.path)
        if match and self.command in ("GET", "HEAD"):
            return self._resolve(match["repo"], unquote(match["rev"]), unquote(match["path"]))
        self._error(404, f"no route for {self.command} {url.path}")

    do_GET = do_POST = do_HEAD = lambda self: self._route()  # noqa: E731

    # -- endpoints -----------------------------------------------------------------
    def _whoami(self) -> None:
        user = self._user()
        if not user:
            return self._error(401, "Invalid credentials in Authorization header")
        token = self.headers["Authorization"][len("Bearer "):]
        role = self.state.roles.get(token) or ("write" if user[1] else "read")
        self._json(200, {"type": "user", "name": user[0],
                         "auth": {"accessToken": {"displayName": "test", "role": role}}})

    def _create_repo(self) -> None:
        payload = json.loads(self._body() or b"{}")
        repo_id = f"{payload.get('organization') or ''}/{payload['name']}".lstrip("/")
        if "/" not in repo_id:
            user = self._user()
            repo_id = f"{user[0] if user else 'anonymous'}/{repo_id}"
        if not self._require_write(repo_id):
            return
        with self.state.lock:
            if repo_id in self.state.repos:
                message = "You already created this model repo"
                # huggingface_hub reads the existing repo's url from the 409 body.
                url = f"{self.server.endpoint}/{repo_id}"
                return self._json(409, {"error": message, "url": url},
                                  {"X-Error-Message": message})
            self.state.create_repo(repo_id)
        self._json(200, {"url": f"{self.server.endpoint}/{repo_id}", "name": repo_id})

    def _repo_api(self, repo_id: str, rest: str, query: dict) -> None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            self._body()
            return self._error(404, f"Repository not found: {repo_id}", "RepoNotFound")
        parts = rest.split("/", 1) if rest else []
        action = parts[0] if parts else ""
        arg = unquote(parts[1]) if len(parts) > 1 else DEFAULT_BRANCH
        if self.command == "GET" and action in ("", "revision"):
            return self._info(repo_id, repo, arg)
        if self.command == "GET" and action == "tree":
            return self._tree(repo, arg, query)
        if self.command == "POST" and action == "preupload":
            return self._preupload(repo_id, repo, arg)
        if self.command == "POST" and action == "commit":
            return self._commit(repo_id, repo, arg)
        if self.command == "POST" and action == "branch":
            return self._branch(repo_id, repo, arg)
        self._error(404, f"no route for {self.command} {self.path}")

    def _info(self, repo_id: str, repo: Repo, revision: str) -> None:
        tree = repo.tree(revision)
        if tree is None:
            return self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        self._json(200, {"id": repo_id, "modelId": repo_id,
                         "sha": repo.branches.get(revision, revision),
                         "siblings": [{"rfilename": p} for p in sorted(tree)]})

    def _tree(self, repo: Repo, rev_and_path: str, query: dict) -> None:
        revision, _, prefix = rev_and_path.partition("/")
        tree = repo.tree(revision)
        if tree is None:
            return self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        prefix = prefix.strip("/")
        recursive = query.get("recursive", "").lower() in ("1", "true")
        entries, folders = [], set()
        for path in sorted(tree):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rel = path[len(prefix) + 1:] if prefix else path
            if "/" in rel and not recursive:
                folders.add(f"{prefix}/{rel.split('/')[0]}".lstrip("/"))
                continue
            for i, _ in enumerate(rel.split("/")[:-1]):
                folders.add(f"{prefix}/{'/'.join(rel.split('/')[:i + 1])}".lstrip("/"))
            content = tree[path]
            entries.append({"type": "file", "path": path, "size": len(content),
                            "oid": git_blob_oid(content)})
        entries += [{"type": "directory", "path": f, "oid": "0" * 40} for f in sorted(folders)]
        self._json(200, entries)

    def _preupload(self, repo_id: str, repo: Repo, revision: str) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._require_write(repo_id):
            return
        tree = repo.tree(revision) or {}
        files = []
        for entry in payload.get("files", []):
            existing = tree.get(entry["path"])
            files.append({"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False,
                          "oid": git_blob_oid(existing) if existing is not None else None})
        self._json(200, {"files": files, "commitOid": repo.branches.get(revision)})

    def _commit(self, repo_id: str, repo: Repo, revision: str) -> None:
        body = self._body()
        if not self._require_write(repo_id):
            return
        with self.state.lock:
            failing = self.state.fail_commits > 0
            self.state.fail_commits -= 1 if failing else 0
        if failing:
            return self._error(503, "Service temporarily unavailable")
        self.state.commit_received.set()
        held = self.state.hold_commits.is_set()
        while self.state.hold_commits.is_set():
            # Held: the client sees a commit that never returns, as on a stalled link.
            threading.Event().wait(0.05)
        if held and self.state.abandon_held:
            return self._error(500, "commit abandoned: its sender went away")
        if revision not in repo.branches:
            return self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        with self.state.lock:
            tree = dict(repo.commits[repo.branches[revision]])
            summary = ""
            for line in body.splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "header":
                    summary = value.get("summary", "")
                elif item["key"] == "file":
                    tree[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] == "deletedFile":
                    tree.pop(value["path"], None)
                elif item["key"] == "deletedFolder":
                    for path in [p for p in tree if p.startswith(value["path"].rstrip("/") + "/")]:
                        del tree[path]
                else:
                    return self._error(400, f"this test hub accepts no {item['key']} operations")
            oid = self.state.new_commit(repo, tree)
            repo.branches[revision] = oid
        self._json(200, {"commitUrl": f"{self.server.endpoint}/{repo_id}/commit/{oid}",
                         "commitOid": oid, "commitMessage": summary, "pullRequestUrl": None})

    def _branch(self, repo_id: str, repo: Repo, branch: str) -> None:
        payload = json.loads(self._body() or b"{}")
        if not self._require_write(repo_id):
            return
        with self.state.lock:
            if branch in repo.branches:
                return self._error(409, f"Branch {branch} already exists")
            start = payload.get("startingPoint") or DEFAULT_BRANCH
            repo.branches[branch] = repo.branches.get(start, start)
        self._json(200, {})

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            return self._error(404, f"Repository not found: {repo_id}", "RepoNotFound")
        tree = repo.tree(revision)
        if tree is None:
            return self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        if path not in tree:
            return self._error(404, f"Entry not found: {path}", "EntryNotFound")
        content = tree[path]
        oid = git_blob_oid(content)
        self._send(200, content, {"X-Repo-Commit": repo.branches.get(revision, revision),
                                  "ETag": f'"{oid}"'}, "application/octet-stream")


class HubWriteServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = HubState()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_token(self, token: str, user: str = "kubetune-test", write: bool = True,
                  role: str | None = None) -> None:
        """``role``: what whoami reports, e.g. "fineGrained" for a token whose rights only
        show when it is used."""
        self.state.tokens[token] = (user, write)
        if role:
            self.state.roles[token] = role

    def files(self, repo_id: str, revision: str = DEFAULT_BRANCH) -> dict[str, bytes]:
        repo = self.state.repos.get(repo_id)
        return dict(repo.tree(revision) or {}) if repo else {}

    def count(self, method: str | None = None, contains: str = "") -> int:
        with self.state.lock:
            return sum(1 for m, p in self.state.requests
                       if (method is None or m == method) and contains in p)

    def reset_log(self) -> None:
        with self.state.lock:
            self.state.requests.clear()

    def stop(self) -> None:
        self.state.hold_commits.clear()
        self.shutdown()
        self.server_close()


def start() -> HubWriteServer:
    server = HubWriteServer()
    server.thread.start()
    return server
