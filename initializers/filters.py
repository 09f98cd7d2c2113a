"""Allow / ignore patterns, with the glob semantics Hugging Face's hub uses."""

from __future__ import annotations

from fnmatch import fnmatch


def _match(path: str, pattern: str) -> bool:
    if pattern.endswith("/"):
        pattern += "*"
    return fnmatch(path, pattern) or fnmatch(path.rsplit("/", 1)[-1], pattern)


def keep(path: str, allow: tuple[str, ...], ignore: tuple[str, ...]) -> bool:
    if allow and not any(_match(path, p) for p in allow):
        return False
    return not any(_match(path, p) for p in ignore)
