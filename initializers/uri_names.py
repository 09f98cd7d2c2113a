"""The names inside a URI (a hub repo id, an S3 bucket), checked before any request.

A malformed name would otherwise reach huggingface_hub's or botocore's own validation,
whose exceptions are not ours to classify (exit 70 with a traceback); checked here, it is
one line naming the variable to fix. Shared by the initializers (STORAGE_URI) and the
exporter (EXPORT_URI).
"""

from __future__ import annotations

import re

from kubetune.errors import BadInputError

# The hub's rule (huggingface_hub.utils.validate_repo_id): letters, digits, '-', '_', '.';
# not starting or ending with '-' or '.', no '--' or '..', at most 96 characters.
_HUB_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?")
HUB_ID_MAX = 96
# S3's rule, kept as loose as the stores we meet (legacy buckets may hold '_' and be long):
# lowercase letters, digits, '.', '-', '_'; starts and ends with a letter or digit; no '..'.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]")


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
