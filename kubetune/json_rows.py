"""The rows of a JSON Lines or JSON array data file, read so that a broken file is named by
its own line: json's errors count lines within the text they were given (the second
object on a line reads as "line 2 column 1" of a one-line document, an empty file as
"Expecting value: line 1 column 1"), and pyarrow's name no line at all.

The dataset initializer's check and the trainer's dataset check both read through here,
so the two say the same thing about the same file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from kubetune.errors import BadInputError

_CHUNK = 1 << 16


def is_blank(path: Path) -> bool:
    """Whether ``path`` holds nothing but whitespace (0 bytes included): an export that
    wrote nothing, a file truncated on the way. Every reader fails on it with a message
    about something else (a parquet footer, "Expecting value", "No columns to parse")."""
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            if chunk.strip():
                return False
    return True


def empty_file_error(shown: str) -> BadInputError:
    return BadInputError(f"{shown} is empty: write its rows, or remove it from the dataset")


def starts_with(path: Path) -> bytes:
    """The first non-whitespace byte (b"[" for a JSON array, b"{" for JSON Lines)."""
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            stripped = chunk.lstrip()
            if stripped:
                return stripped[:1]
    return b""


def _why(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        # json's messages end "... starting at" / "... character at" or name no place.
        return f"{exc.msg}{'' if exc.msg.endswith(' at') else ' at'} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return str(exc)


def json_lines(path: Path, shown: str, max_bytes: int | None = None
               ) -> Iterator[tuple[int, dict]]:
    """Each row of the JSON Lines file ``path`` as (bytes read so far, row), stopping
    after ``max_bytes``; a line that is not one JSON object raises one line naming
    ``shown`` and the line's number in the file. Blank lines are skipped, as `datasets`
    skips them."""
    read = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            read += len(line)
            if line.strip():
                try:
                    # Without its line break: a string cut short then reads as
                    # "Unterminated string", not "Invalid control character".
                    row = json.loads(line.rstrip(b"\r\n"))
                except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                    raise BadInputError(f"{shown} line {number} is not valid JSON "
                                        f"({_why(exc)}): fix or remove that line") from None
                if not isinstance(row, dict):
                    raise BadInputError(f"{shown} line {number} is a JSON "
                                        f"{type(row).__name__}, not an object of columns: "
                                        "write one {\"column\": value, ...} object per line")
                yield read, row
            if max_bytes is not None and read >= max_bytes:
                return


def json_document(path: Path, shown: str) -> object:
    """The whole JSON document in ``path`` (an array of rows, or an object holding one);
    a syntax error names its line in the file."""
    try:
        return json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{shown} line {exc.lineno} is not valid JSON ({_why(exc)}): "
                            "fix that line") from None
    except ValueError as exc:
        raise BadInputError(f"{shown} is not valid JSON ({_why(exc)})") from None
