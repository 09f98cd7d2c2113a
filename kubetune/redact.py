"""Keep secrets out of everything kubetune prints or writes.

Secrets are the values of the credential variables below, whether given inline or read
from a mounted file. Every line that leaves the process through our logging or error
reporting passes through `redact`.
"""

from __future__ import annotations

import os
import re

# Variables whose values are secrets. *_FILE variants name a file holding the secret.
SECRET_VARIABLES = (
    "ACCESS_TOKEN",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "SECRET_ACCESS_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "ACCESS_KEY_ID",
    "AWS_ACCESS_KEY_ID",
)

_registered: set[str] = set()
_TOKEN_PATTERNS = (
    re.compile(r"hf_[A-Za-z0-9]{8,}"),
    re.compile(r"(?i)(authorization:\s*bearer\s+)\S+"),
)
MASK = "***"


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears from now on (values read from files, say)."""
    if value and len(value) >= 4:
        _registered.add(value)


def _known_secrets() -> set[str]:
    found = set(_registered)
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            found.add(value)
    return found


def redact(text: str) -> str:
    for secret in sorted(_known_secrets(), key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + MASK, text)
    return text
