"""The command blocks and links of our Markdown docs, read the way a newcomer follows them.

A fenced block whose info string holds the word ``runnable`` (```` ```console runnable ````)
is a transcript: lines starting with ``$ `` are commands (a line ending in ``\\`` and the
body of a ``<<EOF`` here-document go on to the next line), every other line is output the
commands print. DEVELOPERS.md ("Docs that run") states the rules a block is checked by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(.*)$")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]+)\1")
# What varies from run to run, in a shown line: timestamps, durations and decimal numbers
# (times, rates, losses) match any of their kind; whole numbers (steps, exit codes) are
# checked; anything else that varies is written as an elision.
_VARYING = re.compile(r"(?P<time>\d{4}-\d\d-\d\dT[\d:.]+Z?)|(?P<duration>\d+:\d\d(?::\d\d)?)"
                      r"|(?P<decimal>\d+\.\d+(?:e[-+]\d+)?|\d+e[-+]\d+)|(?P<elision>\.\.\.|…)")
_ANY = {"time": r"\d{4}-\d\d-\d\dT[\d:.]+Z?", "duration": r"\d+:\d\d(?::\d\d)?",
        "decimal": r"\d+(?:\.\d+)?(?:e[-+]\d+)?", "elision": ".*"}
_ELISION = re.compile(r"\.\.\.|…")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class Block:
    path: Path
    line: int                     # the opening fence's line, 1-based
    commands: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def fenced_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(opening line, info string, body lines) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info, start, body = opening.group(1), opening.group(2).strip(), i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].startswith(fence[0] * len(fence))
                                      and not lines[i].strip(fence[0]).strip()):
            body.append(lines[i])
            i += 1
        blocks.append((start, info, body))
        i += 1
    return blocks


def runnable_blocks(path: Path, shown_as: Path | None = None) -> list[Block]:
    """The blocks of ``path`` marked runnable, commands and shown output split."""
    found = []
    for line, info, body in fenced_blocks(path.read_text()):
        if "runnable" not in info.split():
            continue
        block, i = Block(shown_as or path, line), 0
        while i < len(body):
            text = body[i]
            if not text.startswith("$ "):
                block.shown.append(text)
                i += 1
                continue
            command = [text[2:]]
            while command[-1].endswith("\\") and i + 1 < len(body):
                i += 1
                command.append(body[i])
            heredoc = _HEREDOC.search(command[0])
            if heredoc:
                while i + 1 < len(body):
                    i += 1
                    command.append(body[i])
                    if body[i].strip() == heredoc.group(2):
                        break
            block.commands.append("\n".join(command))
            i += 1
        found.append(block)
    return found


def line_pattern(shown: str) -> re.Pattern:
    """A shown output line as a pattern (the rules of _VARYING)."""
    parts, at = [], 0
    shown = shown.rstrip()
    for match in _VARYING.finditer(shown):
        parts += [re.escape(shown[at:match.start()]), _ANY[match.lastgroup]]
        at = match.end()
    return re.compile("".join(parts) + re.escape(shown[at:]))


def missing_shown_line(shown: list[str], output: str) -> str | None:
    """The first shown line the output lacks, in order; None when every one is there.

    Blank lines and lines that are only an elision mark stand for lines left out."""
    lines = [line.rstrip() for line in output.splitlines()]
    at = 0
    for want in shown:
        if not want.strip() or _ELISION.fullmatch(want.strip()):
            continue
        pattern = line_pattern(want)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    code = {n for start, _, body in fenced_blocks(path.read_text())
            for n in range(start, start + len(body) + 2)}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading and number not in code:
            slug = github_anchor(heading.group(1))
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link outside code that names no scheme."""
    code = {n for start, _, body in fenced_blocks(path.read_text())
            for n in range(start, start + len(body) + 2)}
    links = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number in code:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for match in _LINK.finditer(line):
            target = match.group(1) or match.group(2)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                links.append((number, target))
    return links
