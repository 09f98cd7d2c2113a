"""Keep secrets out of everything kubetune prints or writes.

Secrets are the values of the credential variables below, whether given inline or read
from a mounted file, and the user and password of any URL (``http://user:pass@host``,
``s3://key:secret@bucket/...``). Every line that leaves the process through our logging
or error reporting passes through `redact`, and so does every URI we record in a file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from kubetune import env

# Variables whose values are secrets. *_FILE variants name a file holding the secret.
SECRET_VARIABLES = (
    env.ACCESS_TOKEN,
    env.HF_TOKEN,
    env.HUGGING_FACE_HUB_TOKEN,
    env.S3_SECRET_ACCESS_KEY,
    env.AWS_SECRET_ACCESS_KEY,
    env.AWS_SESSION_TOKEN,
    env.S3_ACCESS_KEY_ID,
    env.AWS_ACCESS_KEY_ID,
)
FILE_SUFFIX = "_FILE"
# Variables naming a file that holds a secret, beyond the *_FILE variants above.
SECRET_FILE_VARIABLES = (env.HF_TOKEN_PATH,)
# A secret file is a token or a key: anything larger is not one (and is not read whole).
_MAX_SECRET_FILE = 64 * 1024
# Shorter fragments (a two-letter line of a token file) would mask ordinary words.
_MIN_LEN = 4

_registered: set[str] = set()
_TOKEN_PATTERNS = (
    re.compile(r"hf_[A-Za-z0-9]{8,}"),
    re.compile(r"(?i)(authorization:\s*(?:bearer|basic)\s+)\S+"),
)
# The userinfo of a URL: ``scheme://user:password@`` or ``scheme://user@``. A password
# may hold "/" and "@" unencoded (AWS secret keys hold "/"): it runs to the last "@" of
# the word, so no piece of it is left after the mask; a user part before the colon may
# hold neither. Quotes and backticks end it: messages quote URLs with them. One slash
# after the scheme is enough: a URL passed where a path is expected comes back from
# pathlib or os.path normalised to ``http:/user:password@host`` (torchtune's DiskLogger
# prints its log_dir so), and the credentials are in it all the same.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*:/+)([^\s@/:'\"`]*:[^\s'\"`]*|[^\s@/:'\"`]+)@")
# Where a parser that splits the authority at the first "/" or "@" cuts a password, the
# pieces reach messages on their own (urllib reads "pa" of "u:pa/ss@host" as a port).
_PASSWORD_CUTS = re.compile(r"[/@:]")
MASK = "***"


def _parts(value: str) -> set[str]:
    """``value`` and each of its lines and words: a token file with a stray newline or a
    second line is printed piecewise by whatever splits it."""
    value = value.strip()
    found = {value, *value.splitlines(), *value.split()}
    return {part.strip() for part in found if len(part.strip()) >= _MIN_LEN}


def register_secret(value: str | None) -> None:
    """Mask ``value`` (and each line or word of it) wherever it appears from now on."""
    if value:
        _registered.update(_parts(value))


def url_credentials(text: str) -> set[str]:
    """The users and passwords of every URL in ``text``, as written and percent-decoded."""
    found: set[str] = set()
    for match in _URL_USERINFO.finditer(text):
        user, _, password = match.group(2).partition(":")
        for part in (user, password, *_PASSWORD_CUTS.split(password)):
            found |= _parts(part) | _parts(unquote(part))
    return found


_file_cache: dict[tuple, str] = {}


def _file_secret(path: str) -> str:
    # Every printed line is redacted: read a Secret file again only when it changed.
    try:
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in _file_cache:
            with open(Path(path), "rb") as handle:
                _file_cache[key] = handle.read(_MAX_SECRET_FILE).decode("utf-8", "replace")
        return _file_cache[key]
    except OSError:
        return ""


def _known_secrets() -> set[str]:
    found = set(_registered)
    # Every secret the environment holds, whoever reads it (a library may print it before
    # kubetune.remote.credentials ever does): the whole environment, not our settings.
    for name in SECRET_VARIABLES:
        found |= _parts(os.environ.get(name) or "")
        if os.environ.get(name + FILE_SUFFIX):
            found |= _parts(_file_secret(os.environ[name + FILE_SUFFIX]))
    for name in SECRET_FILE_VARIABLES:
        if os.environ.get(name):
            found |= _parts(_file_secret(os.environ[name]))
    # Credentials given inside any endpoint or URI variable (HF_ENDPOINT, ENDPOINT,
    # STORAGE_URI, EXPORT_URI, ...): masked even where the URL is printed cut or decoded.
    for value in os.environ.values():
        if "@" in value and ":/" in value:
            found |= url_credentials(value)
    return found


def strip_userinfo(text: str) -> str:
    """``text`` with the user and password of every URL replaced by the mask."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)


def has_userinfo(text: str) -> bool:
    """Whether a URL in ``text`` carries a user or password."""
    return _URL_USERINFO.search(text) is not None


def without_userinfo(text: str) -> str:
    """``text`` with the user and password of every URL removed (not masked): a URL that
    still works where its credentials were never needed (the store ignores them)."""
    return _URL_USERINFO.sub(lambda m: m.group(1), text)


def redact(text: str) -> str:
    text = strip_userinfo(text)
    for secret in sorted(_known_secrets(), key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + MASK, text)
    return text


class RedactingStream:
    """A text stream that passes each line through `redact` before the one it wraps:
    what Python itself prints (a warning, a library's print, a traceback) is masked too.

    Lines are held until their end ("\\n" or a progress bar's "\\r") or a flush, so a
    secret split across two writes of one line is still whole when it is matched.
    """

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
        if cut >= 0:
            self.wrapped.write(redact(self._pending[:cut + 1]))
            self._pending = self._pending[cut + 1:]
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.wrapped.write(redact(self._pending))
            self._pending = ""
        self.wrapped.flush()

    def __getattr__(self, name: str):
        return getattr(self.wrapped, name)


def redact_std_streams() -> None:
    """Route this process's sys.stdout and sys.stderr through `redact` (once)."""
    import sys

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
