"""Parse STORAGE_URI and find the source class that serves its scheme.

Sources are found through the ``kubetune.storage`` entry-point group, so a package
installed beside ours adds a scheme without forking (docs/extending.md). The
parsing itself is `kubetune.storage_uri`'s, shared with the exporter.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from kubetune import env, storage_uri
from kubetune.errors import BadInputError
from kubetune.storage_uri import StorageUri

ENTRY_POINT_GROUP = "kubetune.storage"

__all__ = ["ENTRY_POINT_GROUP", "StorageUri", "parse", "source_class", "supported_schemes"]


def supported_schemes() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def _forms() -> str:
    forms = {"file": storage_uri.FILE_FORMS, "hf": "hf://org/name[/sub/path]",
             "s3": "s3://bucket/prefix"}
    return ", ".join(forms.get(s, f"{s}://...") for s in supported_schemes())


def parse(uri: str) -> StorageUri:
    """Any scheme parses (a plugin's included); `source_class` says whether one serves it."""
    return storage_uri.parse(uri, env.STORAGE_URI, _forms())


def source_class(scheme: str):
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep.load()
    raise BadInputError(f"unsupported storage scheme {scheme!r}; supported forms: {_forms()}")
