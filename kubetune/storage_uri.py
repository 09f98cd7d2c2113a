"""A storage URI, parsed once into typed values: a hub repo, an S3 prefix, a local path.

The initializers (``STORAGE_URI``) and the exporter (``EXPORT_URI``) name places the same
way, so both read them here. The names inside a URI (a hub repo id, an S3 bucket) are
checked before any request: a malformed one would otherwise reach huggingface_hub's or
botocore's own validation, whose exceptions are not ours to classify (exit 70 with a
traceback); checked here, it is one line naming the variable to fix.

A scheme without a typed form here (a plugin's, see the ``kubetune.storage`` entry
points) stays a generic `StorageUri` for its source to read.

A local path may be relative (``./my-model``, ``../data``, ``file://./my-model``): it means
the working directory of whoever wrote it, so `absolute` makes it absolute once, where the
URI is first read (a step's own parse; `kubetune local` before it hands the URI to a step
that runs elsewhere: another cwd, a container). Absolute paths and remote schemes are
left as written. A bare ``my-model`` stays malformed: it reads as a hub repo id as much as
a directory, and guessing would fetch the wrong thing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.redact import has_userinfo, strip_userinfo

# The hub's rule (huggingface_hub.utils.validate_repo_id): letters, digits, '-', '_', '.';
# not starting or ending with '-' or '.', no '--' or '..', at most 96 characters.
_HUB_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?")
HUB_ID_MAX = 96
# S3's rule, kept as loose as the stores we meet (legacy buckets may hold '_' and be long):
# lowercase letters, digits, '.', '-', '_'; starts and ends with a letter or digit; no '..'.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]")

FILE_FORMS = "/abs/path, ./rel/path or file:///abs/path"
EXPORT_FORMS = f"{FILE_FORMS}, s3://bucket/prefix or hf://org/repo"
# How a path relative to the working directory starts, bare or after "file://".
_RELATIVE_STARTS = ("./", "../")


@dataclass(frozen=True)
class StorageUri:
    """Any URI, split at its scheme: what a plugin's source reads."""

    raw: str
    scheme: str  # "file" for local paths
    location: str  # everything after "scheme://" (for file: an absolute path)


@dataclass(frozen=True)
class HubUri:
    raw: str
    repo_id: str  # org/name, or a legacy bare name
    sub_path: str = ""  # a file or folder inside the repo ("" for the whole repo)
    repo_type: str | None = None  # "model" or "dataset" where the step knows it
    scheme: ClassVar[str] = "hf"


@dataclass(frozen=True)
class S3Uri:
    raw: str
    bucket: str
    prefix: str  # as written after the bucket (a trailing "/" kept)
    scheme: ClassVar[str] = "s3"


@dataclass(frozen=True)
class FileUri:
    raw: str
    path: Path  # absolute
    scheme: ClassVar[str] = "file"


TypedUri = HubUri | S3Uri | FileUri


def check_hub_repo_id(repo_id: str, uri: str, variable: str) -> str:
    """``repo_id`` (``org/name`` or a legacy ``name``), or one line saying what is wrong."""
    parts = repo_id.split("/")
    bad = next((p for p in parts if not _HUB_PART.fullmatch(p) or "--" in p or ".." in p),
               None)
    if bad is not None or len(repo_id) > HUB_ID_MAX:
        why = (f"{bad!r} may hold only letters, digits, '-', '_' and '.', not start or end "
               "with '-' or '.', nor hold '--' or '..'" if bad is not None else
               f"it is longer than {HUB_ID_MAX} characters")
        raise BadInputError(f"{variable} {uri!r} names no valid hub repo id ({why}): expected "
                            "hf://org/name")
    return repo_id


def check_s3_bucket(bucket: str, uri: str, variable: str) -> str:
    if not _BUCKET.fullmatch(bucket or "") or ".." in bucket:
        raise BadInputError(f"{variable} {uri!r} names no valid bucket ({bucket!r}: 3 to 255 "
                            "lowercase letters, digits, '.', '-', starting and ending with a "
                            "letter or digit): expected s3://bucket/prefix")
    return bucket


def _relative_part(uri: str) -> str | None:
    """The relative path ``uri`` names (``./x``, ``../x``, ``.``, ``file://./x``), or None."""
    path = uri[len("file://"):] if uri.lower().startswith("file://") else uri
    if path in (".", "..") or path.startswith(_RELATIVE_STARTS):
        return path
    return None


def absolute(uri: str, base: Path | None = None) -> str:
    """``uri`` with a relative local path made absolute against ``base`` (default: the
    working directory), in the form it was written (``./m`` -> ``/cwd/m``, ``file://./m``
    -> ``file:///cwd/m``); anything else unchanged."""
    stripped = (uri or "").strip()
    relative = _relative_part(stripped)
    if relative is None:
        return uri
    # abspath, not resolve(): ".." is folded but a symlink the user named stays as named.
    path = os.path.abspath(os.path.join(base or Path.cwd(), relative))
    return f"file://{path}" if stripped.lower().startswith("file://") else path


def _file_path(uri: str, variable: str) -> Path:
    uri = absolute(uri)
    if uri.startswith("/"):
        return Path(uri)
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise BadInputError(f"{variable} {uri!r} must name a local path ({FILE_FORMS}; "
                            "file://./rel/path for one relative to the working directory)")
    return Path(parts.path)


def _no_userinfo(uri: str, variable: str) -> None:
    # Read as a bucket or repo id, "user:pa/ss@bucket" would be cut at its "/" and the
    # pieces printed; credentials have variables of their own.
    if has_userinfo(uri):
        raise BadInputError(f"{variable} {strip_userinfo(uri)!r} holds a user or password: "
                            "remove it and pass credentials through ACCESS_KEY_ID / "
                            "SECRET_ACCESS_KEY or ACCESS_TOKEN (or their *_FILE variants)")


def parse(uri: str, variable: str, forms: str) -> StorageUri:
    """Split ``uri`` at its scheme; ``forms`` lists the accepted ones for the messages."""
    uri = absolute((uri or "").strip())
    if not uri:
        raise BadInputError(f"{variable} is empty; supported forms: {forms}")
    if uri.startswith("/"):
        return StorageUri(raw=uri, scheme="file", location=uri)
    _no_userinfo(uri, variable)
    parts = urlsplit(uri)
    if not parts.scheme or "://" not in uri:
        # A bare name could be a repo id or a directory: say which spelling means the
        # directory, only when there is one.
        hint = f" (for the local {uri} write ./{uri})" if "://" not in uri and \
            Path(uri).exists() else ""
        raise BadInputError(f"storage URI {uri!r} is malformed; supported forms: {forms}"
                            f"{hint}")
    scheme = parts.scheme.lower()
    location = uri.split("://", 1)[1]
    if scheme == "file":
        location = str(_file_path(uri, variable))
    if not location.strip("/"):
        raise BadInputError(f"storage URI {uri!r} names nothing after {scheme}://")
    return StorageUri(raw=uri, scheme=scheme, location=location)


def hub(uri: StorageUri, variable: str, *, repo_type: str | None = None,
        whole_repo: bool = False) -> HubUri:
    """``hf://org/name[/sub/path]``; ``whole_repo``: exactly ``hf://org/name``."""
    parts = [p for p in uri.location.strip("/").split("/") if p]
    if whole_repo and len(parts) != 2:
        raise BadInputError(f"{variable} {uri.raw!r} must be hf://<org or user>/<repo>")
    if not whole_repo and (not parts or any(p in (".", "..") for p in parts)):
        raise BadInputError(f"hf URI names no repo: expected hf://org/name[/sub/path], got "
                            f"hf://{uri.location}")
    repo_id = parts[0] if len(parts) == 1 else f"{parts[0]}/{parts[1]}"
    check_hub_repo_id(repo_id, uri.raw if whole_repo else f"hf://{uri.location}", variable)
    return HubUri(raw=uri.raw, repo_id=repo_id, sub_path="/".join(parts[2:]),
                  repo_type=repo_type)


def s3(uri: StorageUri, variable: str) -> S3Uri:
    """``s3://bucket[/prefix]``."""
    bucket, _, prefix = uri.location.partition("/")
    check_s3_bucket(bucket, uri.raw, variable)
    return S3Uri(raw=uri.raw, bucket=bucket, prefix=prefix)


def local(uri: StorageUri) -> FileUri:
    return FileUri(raw=uri.raw, path=Path(uri.location))


def export_destination(uri: str) -> TypedUri:
    """``EXPORT_URI`` as one of the three places an export can go."""
    uri = absolute((uri or "").strip())
    _no_userinfo(uri, env.EXPORT_URI)
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if uri.startswith("/") or scheme == "file":
        return FileUri(raw=uri, path=_file_path(uri, env.EXPORT_URI))
    generic = StorageUri(raw=uri, scheme=scheme, location=uri.split("://", 1)[-1])
    if scheme == "s3":
        return s3(generic, env.EXPORT_URI)
    if scheme == "hf":
        return hub(generic, env.EXPORT_URI, whole_repo=True)
    raise BadInputError(f"{env.EXPORT_URI} {uri!r} is not supported: use {EXPORT_FORMS}")


def recorded(uri: str) -> TypedUri | None:
    """A URI a finished step wrote down (a manifest's ``storage_uri``), typed; None when it
    is none of ours (a plugin's scheme, or damaged)."""
    try:
        generic = parse(uri, env.STORAGE_URI, "")
        if generic.scheme == "hf":
            return hub(generic, env.STORAGE_URI)
        if generic.scheme == "s3":
            return s3(generic, env.STORAGE_URI)
        if generic.scheme == "file":
            return local(generic)
    except BadInputError:
        pass
    return None
