"""Parse a storage URI and find the source class that serves its scheme.

Sources are found through the ``kubetune.storage`` entry-point group, so a package
installed beside ours adds a scheme without forking (see README, "Extending").
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from urllib.parse import urlsplit

from kubetune.errors import BadInputError

ENTRY_POINT_GROUP = "kubetune.storage"


@dataclass(frozen=True)
class StorageUri:
    raw: str
    scheme: str  # "file" for local paths
    location: str  # everything after "scheme://" (for file: an absolute path)


def supported_schemes() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def _forms() -> str:
    forms = {"file": "/abs/path or file:///abs/path", "hf": "hf://org/name[/sub/path]",
             "s3": "s3://bucket/prefix"}
    return ", ".join(forms.get(s, f"{s}://...") for s in supported_schemes())


def parse(uri: str) -> StorageUri:
    uri = (uri or "").strip()
    if not uri:
        raise BadInputError(f"STORAGE_URI is empty; supported forms: {_forms()}")
    if uri.startswith("/"):
        return StorageUri(raw=uri, scheme="file", location=uri)
    parts = urlsplit(uri)
    if not parts.scheme or "://" not in uri:
        raise BadInputError(f"storage URI {uri!r} is malformed; supported forms: {_forms()}")
    scheme = parts.scheme.lower()
    location = uri.split("://", 1)[1]
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadInputError(f"file URI {uri!r} must name an absolute path (file:///abs/path)")
        location = parts.path
    if not location.strip("/"):
        raise BadInputError(f"storage URI {uri!r} names nothing after {scheme}://")
    return StorageUri(raw=uri, scheme=scheme, location=location)


def source_class(scheme: str):
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep.load()
    raise BadInputError(f"unsupported storage scheme {scheme!r}; supported forms: {_forms()}")
