"""The values that point a client at a store, checked where they are read: an endpoint URL
(``HF_ENDPOINT``, ``ENDPOINT`` / ``AWS_ENDPOINT_URL``), an S3 region, a role ARN.

Unchecked, a malformed one reaches httpx or botocore, whose exceptions are not ours to
classify: a scheme-less endpoint was retried as a transient failure, a bad region or ARN
ended as exit 70 with a traceback, and a password holding "/" made urllib read part of it
as a port and print it. Checked here, it is one line naming the variable to fix, with
the URL's user and password masked.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from kubetune.errors import BadInputError
from kubetune.redact import strip_userinfo

# botocore's own rule for a region (a DNS label): letters, digits, '-', not at the ends.
_REGION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?")
# arn:partition:service:region:account:resource (AWS ``arn:aws:iam::123456789012:role/x``,
# MinIO ``arn:minio:iam:::role/x``); STS refuses one shorter than 20 characters.
_ARN = re.compile(r"arn:[A-Za-z0-9\-]+:[A-Za-z0-9\-]+:[^:\s]*:[^:\s]*:\S+")
ARN_MIN = 20


def endpoint_url(value: str, variable: str) -> str:
    """``value`` as an ``http(s)://host[:port][/path]`` URL without a trailing "/", or one
    line naming ``variable``."""
    value = value.strip()
    shown = strip_userinfo(value)

    def bad(why: str) -> BadInputError:
        return BadInputError(f"{variable}={shown!r} is not a usable endpoint: {why} "
                             "(expected http(s)://host[:port])")

    if any(c.isspace() for c in value):
        raise bad("it holds whitespace")
    if "://" not in value:
        raise bad("it has no scheme")
    try:
        parts = urlsplit(value)
    except ValueError:  # an unclosed "[" of an IPv6 address
        raise bad("it does not parse as a URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise bad(f"the scheme {parts.scheme or '(none)'!r} is not http or https")
    authority = value.split("://", 1)[1]
    if "@" in authority and "@" not in parts.netloc or authority.count("@") > 1:
        # The user or password holds a "/" or "@": every parser cuts it somewhere else.
        raise bad("a '/' or '@' in its user or password must be percent-encoded "
                  "(%2F, %40)")
    if not parts.hostname:
        raise bad("it names no host")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise bad("its port is not a number from 1 to 65535")
    return value.rstrip("/")


def region(value: str, variable: str) -> str:
    """``value`` if botocore would take it as a region name, else one line."""
    value = value.strip()
    if not _REGION.fullmatch(value):
        raise BadInputError(f"{variable}={value!r} is not a region name (letters, digits and "
                            "'-', e.g. us-east-1)")
    return value


def role_arn(value: str, variable: str) -> str:
    """``value`` if it has an ARN's shape, else one line (before STS sees it)."""
    value = value.strip()
    if not _ARN.fullmatch(value) or len(value) < ARN_MIN:
        raise BadInputError(f"{variable}={value!r} is not a role ARN (expected "
                            "arn:aws:iam::<account>:role/<name>)")
    return value
