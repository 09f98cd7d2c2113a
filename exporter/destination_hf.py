"""A Hugging Face Hub destination: one commit holds every file, ``manifest.json`` included.

A hub commit is atomic, so a reader of the branch sees the previous export or the new
one, never a mix. The repository (and branch) are created when absent and the token
allows it. After the commit, the hub's listing of the branch is checked against the
manifest: sizes, and each file's sha256 (LFS) or git blob id, which the hub computed
from the bytes it stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path

# First: it sets huggingface_hub's environment before huggingface_hub reads it.
from kubetune.remote import hub  # isort: skip

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, hf_hub_url  # noqa: E402
from huggingface_hub.errors import HfHubHTTPError  # noqa: E402
from huggingface_hub.utils import build_hf_headers, get_session  # noqa: E402

from kubetune import retry  # noqa: E402
from kubetune.errors import BadInputError, TransientError  # noqa: E402
from kubetune.exporter import export_manifest  # noqa: E402
from kubetune.exporter.build_tree import build_tree  # noqa: E402
from kubetune.remote import hub_errors  # noqa: E402
from kubetune.storage_uri import HubUri  # noqa: E402
from kubetune.workspace import EXPORT_MANIFEST_NAME  # noqa: E402

log = logging.getLogger("exporter")


def git_blob_oid(path: Path) -> str:
    sha = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


class HubDestination:
    def __init__(self, where: HubUri, revision: str | None, work_dir: Path,
                 probe_timeout_s: float | None = None) -> None:
        """``probe_timeout_s``: a quick check (one attempt per call, requests bounded by
        it), not an export."""
        self.repo_id = where.repo_id
        self.revision = revision or "main"
        self.description = f"hf://{self.repo_id}@{self.revision}"
        self.work_dir = Path(work_dir)
        self.token = hub.token()
        if not self.token:
            raise BadInputError(f"uploading to {self.description} needs a token with write "
                                "access: set ACCESS_TOKEN or HF_TOKEN (or ACCESS_TOKEN_FILE)")
        # No timeout on the shared client (as before): a commit of large files may take
        # the hub longer than a download's request would be allowed. A probe commits nothing.
        self.api = hub.api(self.token, bounded=probe_timeout_s is not None,
                           timeout_s=probe_timeout_s)
        self._policy = retry.RetryPolicy(max_attempts=1) if probe_timeout_s else None
        self.endpoint = self.api.endpoint

    # -- plumbing ----------------------------------------------------------------------
    def _classify(self, exc: BaseException) -> retry.TransientFailure | None:
        if isinstance(exc, HfHubHTTPError) and hub_errors.status_of(exc) is not None:
            return hub_errors.http_transient(exc)
        return hub_errors.transport_failure(exc, self.endpoint)

    def _call(self, what: str, func):
        try:
            return retry.call(func, f"{what} {self.description}", policy=self._policy,
                              classify=self._classify)
        except HfHubHTTPError as exc:
            status = hub_errors.status_of(exc)
            if status == 401:
                raise BadInputError(f"the hub rejected the token for {self.description} (401): "
                                    "set ACCESS_TOKEN / HF_TOKEN to a valid token") from None
            if status == 403:
                raise BadInputError(f"the token may not write to {self.description} (403): use "
                                    "a token with write access to that repo or org") from None
            raise BadInputError(f"the hub refused to {what} {self.description} ({status}): "
                                f"{str(exc).splitlines()[0]}") from None

    # -- the four steps ----------------------------------------------------------------
    def check(self) -> None:
        who = self._call("authenticate for", lambda: self.api.whoami())
        role = (((who or {}).get("auth") or {}).get("accessToken") or {}).get("role")
        if role == "read":
            raise BadInputError(f"the token is read-only; {self.description} needs a token with "
                                "write access (ACCESS_TOKEN / HF_TOKEN)")

    def build_dir(self) -> contextlib.AbstractContextManager[Path]:
        return build_tree(self.work_dir, self.description)

    def read_manifest(self) -> dict | None:
        url = hf_hub_url(self.repo_id, EXPORT_MANIFEST_NAME, revision=self.revision,
                         endpoint=self.api.endpoint)

        def get():
            response = get_session().get(url, headers=build_hf_headers(token=self.token),
                                         follow_redirects=True)
            if response.status_code in (401, 403, 404):
                return None  # no repo, branch or manifest yet, or not readable: export anew
            if response.status_code == 429 or response.status_code >= 500:
                raise retry.TransientFailure(f"the hub answered {response.status_code}")
            return response.content if response.status_code == 200 else None

        raw = self._call("read", get)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def publish(self, tree: Path, manifest: dict, previous: dict | None) -> None:
        export_manifest.write(tree, manifest)
        self._call("create", lambda: self.api.create_repo(self.repo_id, exist_ok=True))
        if self.revision != "main":
            self._call("create", lambda: self.api.create_branch(
                self.repo_id, branch=self.revision, exist_ok=True))
        paths = [e["path"] for e in manifest["files"]] + [EXPORT_MANIFEST_NAME]
        stale = sorted({e["path"] for e in (previous or {}).get("files", [])} - set(paths))

        def commit():
            # Operations are single-use: build them afresh for every attempt.
            ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(tree / p))
                   for p in paths]
            ops += [CommitOperationDelete(path_in_repo=p) for p in stale]
            return self.api.create_commit(
                self.repo_id, ops, revision=self.revision,
                commit_message=f"kubetune export ({manifest['format']}) of "
                               f"{manifest['base_model'].get('name')}")

        info = self._call("commit to", commit)
        log.info("committed %d files to %s as %s", len(paths), self.description,
                 getattr(info, "oid", "?"))
        self._check_remote(tree, paths)

    def _check_remote(self, tree: Path, paths: list[str]) -> None:
        listed = self._call("list", lambda: {
            f.path: f for f in self.api.list_repo_tree(self.repo_id, revision=self.revision,
                                                       recursive=True)
            if hasattr(f, "size")})
        for path in paths:
            local = tree / path
            remote = listed.get(path)
            if remote is None or remote.size != local.stat().st_size:
                raise TransientError(f"{self.description} lacks {path} after the commit; re-run "
                                     "the export")
            lfs_sha = (remote.lfs or {}).get("sha256") if isinstance(remote.lfs, dict) \
                else getattr(remote.lfs, "sha256", None)
            want = export_manifest.file_sha256(local) if lfs_sha else git_blob_oid(local)
            if (lfs_sha or remote.blob_id) != want:
                raise TransientError(f"{path} on {self.description} differs from what was "
                                     "uploaded; re-run the export")

