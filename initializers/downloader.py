"""Fetch a listing into the staging tree: in parallel, resumable, every file verified.

Each file is one retried unit: fetch into ``<name>.part`` (resuming where the source can),
check size and every checksum the source published, then rename to its name. A file
already whole in the staging tree (from a killed run) is re-verified, not re-fetched.
"""

from __future__ import annotations

import errno
import inspect
import logging
import shutil
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

from kubetune import staging
from kubetune.initializers import checksums
from kubetune.initializers.progress import Cancelled, Progress
from kubetune.initializers.safe_paths import safe_join
from kubetune.initializers.settings import InitializerSettings
from kubetune.initializers.sources.base import RemoteFile
from kubetune import retry
from kubetune.errors import BadInputError, KubetuneError

log = logging.getLogger("initializer")

def disk_full(path: Path, needed: int | None = None) -> BadInputError:
    free = shutil.disk_usage(path).free
    need = f"; the download needs {needed / 1e6:.1f} MB more" if needed else ""
    return BadInputError(f"no space left on the volume of {path} ({free / 1e6:.1f} MB free{need}): "
                         "enlarge the PVC or narrow the download with ALLOW_PATTERNS")


def _bytes_on_disk(path: Path) -> int:
    # Ranged writes leave sparse files: count the blocks really there.
    try:
        stat = path.stat()
    except FileNotFoundError:
        return 0
    return min(stat.st_size, stat.st_blocks * 512)


def check_space(staged: Path, files: list[RemoteFile]) -> None:
    """Fail before the first byte when the listed sizes cannot fit."""
    needed = 0
    for remote in files:
        if remote.size is None:
            continue
        target = safe_join(staged, remote.path)
        have = target.stat().st_size if target.is_file() else 0
        part = target.with_name(target.name + staging.PART_SUFFIX)
        have = max(have, _bytes_on_disk(part))
        needed += max(remote.size - have, 0)
    if needed > shutil.disk_usage(staged).free:
        raise disk_full(staged, needed)


def _accepts_progress(fetch: Callable) -> bool:
    try:
        return "progress" in inspect.signature(fetch).parameters
    except (TypeError, ValueError):
        return False


def _default_classify(exc: BaseException) -> retry.TransientFailure | None:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return retry.TransientFailure(f"{type(exc).__name__}: {exc}")
    return None


class Downloader:
    def __init__(self, source, staged: Path, progress: Progress,
                 settings: InitializerSettings | None = None) -> None:
        self.source = source
        self.settings = settings or InitializerSettings()
        self.staged = staged
        self.progress = progress
        self.with_progress = _accepts_progress(source.fetch)
        self.classify = getattr(source, "classify", None) or _default_classify

    def _classify(self, exc: BaseException) -> retry.TransientFailure | None:
        if isinstance(exc, checksums.ChecksumMismatch):
            return retry.TransientFailure(str(exc))
        if isinstance(exc, (KubetuneError, Cancelled)):
            return None
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(self.staged) from None
        return self.classify(exc)

    def fetch_one(self, remote: RemoteFile) -> tuple[str, int, str]:
        """Fetch and verify one file; return (path, size, sha256) for the manifest."""
        target = safe_join(self.staged, remote.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + staging.PART_SUFFIX)
        part_state = staging.part_state_path(part)
        # A whole file left by a killed run is kept only if a checksum from the source
        # proves it is the listed version; a size alone (a re-uploaded object) does not.
        if target.is_file() and not target.is_symlink() and (
                remote.sha256 or remote.git_sha1 or remote.md5):
            try:
                verified = checksums.verify(target, remote)
                part_state.unlink(missing_ok=True)  # killed before it went: not for the tree
                self.progress.file_done(remote.path, target.stat().st_size)
                return remote.path, target.stat().st_size, verified.sha256
            except checksums.ChecksumMismatch:
                pass
        if target.is_file() or target.is_symlink():
            target.unlink()
        for path in (part, part_state):
            if path.is_symlink():
                path.unlink()

        # How far the file got: an attempt that drops after getting further than any
        # before it restarts the retry budget (a long transfer is not a failing one).
        reached = retry.Progress(_bytes_on_disk(part))

        def attempt() -> str:
            self.progress.restart_file(remote.path, _bytes_on_disk(part))
            callback = self.progress.callback(remote.path)
            try:
                if self.with_progress:
                    learnt = self.source.fetch(remote, part, progress=callback)
                else:
                    learnt = self.source.fetch(remote, part)
                    callback(0)  # still honours cancellation
                if isinstance(learnt, checksums.Verified):
                    verified = learnt  # hashed on the way in: no second read
                else:
                    verified = checksums.verify(part, learnt if isinstance(learnt, RemoteFile)
                                                else remote)
            except checksums.ChecksumMismatch:
                # A resumed prefix may be the bad part: the next attempt starts over.
                part.unlink(missing_ok=True)
                part_state.unlink(missing_ok=True)
                raise
            except Exception:
                reached.reached(_bytes_on_disk(part))
                raise
            part.replace(target)
            part_state.unlink(missing_ok=True)
            return verified.sha256

        digest = retry.call(attempt, f"download {remote.path}", classify=self._classify,
                            progress=reached)
        size = target.stat().st_size
        self.progress.file_done(remote.path, size)
        return remote.path, size, digest

    def fetch_all(self, files: list[RemoteFile]) -> list[tuple[str, int, str]]:
        # Largest first: a big file started last would leave one stream running alone.
        ordered = sorted(files, key=lambda f: -(f.size or 0))
        budget = self.settings.download_workers
        count = min(budget, len(files))
        plan = getattr(self.source, "plan", None)
        if plan is not None:
            # The configured budget, not the threads this listing fills: one big file
            # alone leaves budget - 1 streams free, which its ranged parts take.
            plan(ordered, budget)
        results: list[tuple[str, int, str]] = []
        with ThreadPoolExecutor(max_workers=count,
                                thread_name_prefix="fetch") as pool:
            futures = [pool.submit(self.fetch_one, f) for f in ordered]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                # One file failed for good: stop the others at their next chunk.
                self.progress.cancelled.set()
                for future in pending:
                    future.cancel()
                wait(pending)
                raise failed.exception()
            results = [f.result() for f in futures]
        return results
