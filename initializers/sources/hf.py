"""``hf://org/name[/sub/path]``: a model or dataset repo on the Hugging Face Hub.

The revision (``REVISION``: branch, tag or commit; default ``main``) is resolved to a
commit once, and every listing and download names that commit, so a push during the
download cannot mix two versions. Files keep their repo-relative paths (the SDK points the
trainer at ``/workspace/dataset/<sub/path>``). Downloads stream to disk, resume with a
Range request after a dropped connection, and are checked against the hub's sha256 (LFS
files) or git blob id (the rest).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

# First: it sets huggingface_hub's environment before huggingface_hub reads it.
from kubetune.remote import hub  # isort: skip

from huggingface_hub.hf_api import RepoFile  # noqa: E402
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # noqa: E402

from kubetune.initializers.checksums import Hasher, Verified
from kubetune.initializers.filters import keep
from kubetune.initializers.request import InitRequest
from kubetune.initializers.sources.base import ProgressCallback, RemoteFile
from kubetune.initializers.stream_write import write_stream
from kubetune import env, retry, storage_uri
from kubetune.errors import BadInputError
from kubetune.remote.hub_errors import HubErrors
from kubetune.retry import TransientFailure


class HuggingFaceSource:
    def __init__(self, request: InitRequest) -> None:
        self.request = request
        repo = storage_uri.hub(request.uri, env.STORAGE_URI,
                               repo_type="dataset" if request.kind == "dataset" else "model")
        self.repo_id, self.sub_path, self.repo_type = repo.repo_id, repo.sub_path, repo.repo_type
        self.endpoint = hub.endpoint()
        self.token = hub.token(request.token)
        self.api = hub.api(self.token)
        self.errors = HubErrors(self.repo_id, self.repo_type, self.endpoint, request.revision,
                                bool(self.token))
        self.commit: str | None = None

    def classify(self, exc: BaseException) -> TransientFailure | None:
        return self.errors.classify(exc)

    def _call(self, func, what: str):
        return retry.call(func, f"{what} {self.repo_id}", classify=self.classify)

    def resolved_revision(self) -> str | None:
        if self.commit is None:
            info = self._call(lambda: self.api.repo_info(
                self.repo_id, repo_type=self.repo_type, revision=self.request.revision),
                "resolve the revision of")
            if not info.sha:
                raise BadInputError(f"the hub at {self.endpoint} returned no commit for "
                                    f"{self.repo_id}")
            self.commit = info.sha
        return self.commit

    def _entries(self) -> list[RepoFile]:
        commit = self.resolved_revision()
        if self.sub_path:
            # paths-info says whether the sub-path is a file or a folder (a tree listing of
            # a file path is an error on the hub).
            found = self._call(lambda: self.api.get_paths_info(
                self.repo_id, [self.sub_path], repo_type=self.repo_type, revision=commit),
                "look up the path in")
            if not found:
                raise BadInputError(f"{self.sub_path!r} not found in {self.repo_type} repo "
                                    f"{self.repo_id} at {self.request.revision or 'main'}")
            if isinstance(found[0], RepoFile):
                return [found[0]]
        return self._call(lambda: self._tree(commit), "list the files of")

    def _tree(self, commit: str) -> list[RepoFile]:
        # Our own paging loop: HfApi.list_repo_tree retries 5xx/429 on its own, and
        # kubetune.retry is to be the one retry loop (one budget, one log line per retry).
        url = (f"{self.endpoint}/api/{self.repo_type}s/{self.repo_id}/tree/"
               f"{quote(commit, safe='')}")
        if self.sub_path:
            url += "/" + quote(self.sub_path, safe="")
        params: dict | None = {"recursive": "true", "expand": "false"}
        headers = build_hf_headers(token=self.token or False)
        files: list[RepoFile] = []
        while url:
            response = get_session().get(url, params=params, headers=headers,
                                         timeout=hub.http_timeout())
            hf_raise_for_status(response)
            files += [RepoFile(**e) for e in response.json() if e.get("type") == "file"]
            url, params = response.links.get("next", {}).get("url"), None
        return files

    def list_files(self) -> list[RemoteFile]:
        files = []
        for entry in self._entries():
            if not keep(entry.path, self.request.allow_patterns, self.request.ignore_patterns):
                continue
            lfs = entry.lfs
            files.append(RemoteFile(
                path=entry.path,
                size=lfs.size if lfs is not None else entry.size,
                sha256=lfs.sha256 if lfs is not None else None,
                git_sha1=None if lfs is not None else entry.blob_id,
            ))
        return files

    def _url(self, path: str) -> str:
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        return (f"{self.endpoint}/{prefix}{self.repo_id}/resolve/"
                f"{quote(self.resolved_revision(), safe='')}/{quote(path)}")

    def fetch(self, remote: RemoteFile, destination: Path,
              progress: ProgressCallback | None = None) -> Verified:
        have = destination.stat().st_size if destination.is_file() else 0
        if remote.size is not None and have >= remote.size:
            have = 0  # whole (or too long) yet unverified: the caller found it bad
        headers = build_hf_headers(token=self.token or False)
        headers["Accept-Encoding"] = "identity"  # sizes and checksums are of the raw bytes
        if have:
            headers["Range"] = f"bytes={have}-"
        # httpx2 drops Authorization when a redirect leaves the hub's host (the CDN).
        with get_session().stream("GET", self._url(remote.path), headers=headers,
                                  follow_redirects=True, timeout=hub.http_timeout()) as response:
            if response.status_code == 416:
                destination.unlink(missing_ok=True)
                raise TransientFailure(f"{remote.path}: the hub refused to resume; starting over")
            hf_raise_for_status(response)
            resumed = response.status_code == 206
            # As received: a drop keeps what came.
            return write_stream(response.iter_bytes(), destination, remote, Hasher(remote),
                                have if resumed else 0, progress)
