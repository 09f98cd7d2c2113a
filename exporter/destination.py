"""Where an export goes, chosen by EXPORT_URI's scheme.

Every destination offers the same four methods, so the flow never knows which it has:
``check`` (fail fast on a bad location or credentials), ``build_dir`` (a context holding
a local tree to write the export into, removed when it ends unless published),
``read_manifest`` (the export already there, if any) and ``publish`` (make the tree
visible atomically, then read back what was written).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

from kubetune import storage_uri


class Destination(Protocol):
    description: str

    def check(self) -> None: ...

    def build_dir(self) -> contextlib.AbstractContextManager[Path]: ...

    def read_manifest(self) -> dict | None: ...

    def publish(self, tree: Path, manifest: dict, previous: dict | None) -> None: ...


# A probe's bound on one request (connect, answer), in seconds: a check made before the
# run, where waiting out the export's own timeouts and retries would hold up every step.
PROBE_TIMEOUT_S = 10.0


def open_destination(uri: str, revision: str | None, work_dir: Path,
                     probe: bool = False) -> Destination:
    """The destination ``uri`` names; ``work_dir`` holds the build tree of remote ones.
    ``probe``: for ``check`` alone, ahead of the run (`kubetune local`'s preflight): each
    call is one attempt bounded by PROBE_TIMEOUT_S."""
    where = storage_uri.export_destination(uri)
    # Imported on use: an export to a PVC never loads boto3 or huggingface_hub.
    if isinstance(where, storage_uri.S3Uri):
        from kubetune.exporter.destination_s3 import S3Destination

        return S3Destination(where, work_dir, PROBE_TIMEOUT_S if probe else None)
    if isinstance(where, storage_uri.HubUri):
        from kubetune.exporter.destination_hf import HubDestination

        return HubDestination(where, revision, work_dir, PROBE_TIMEOUT_S if probe else None)
    from kubetune.exporter.destination_local import LocalDestination

    return LocalDestination(where)
