"""How many rows (or preference pairs) a run read, dropped by reason, held out and kept,
for the training side and the held-out side, with the dropped ones named where the user
finds them ("train.jsonl row 3": the first ``FIRST_NAMED``, then a count).

The recipe process counts each dataset its recipe builds (``tokenized_data``): a builder's
own drops (the preference builder's: "missing chosen", "empty chosen", "chosen ==
rejected"), then the token cache's (rows with nothing to train on), then the rows a
held-out fraction takes. Rank 0 writes ``kubetune-rows.json`` in the output directory;
the launcher reads it into ``summary.json``'s ``train_data`` and the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune.atomic_write import write_atomic

FILE_NAME = "kubetune-rows.json"
FIRST_NAMED = 10  # dropped rows named, over all reasons; the rest counted
# Where a builder leaves its own counts on the dataset it made (``SideCounts``).
COUNTS_ATTRIBUTE = "kubetune_row_counts"


@dataclass
class Drops:
    """reason -> {"count", "rows": the first names}, at most ``FIRST_NAMED`` names in all."""
    by_reason: dict[str, dict] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(int(e["count"]) for e in self.by_reason.values())

    @property
    def named(self) -> int:
        return sum(len(e["rows"]) for e in self.by_reason.values())

    def add(self, reason: str, where: str | None) -> None:
        entry = self.by_reason.setdefault(reason, {"count": 0, "rows": []})
        entry["count"] += 1
        if where is not None and self.named < FIRST_NAMED:
            entry["rows"].append(where)

    def add_counted(self, reason: str, count: int, rows: list[str]) -> None:
        for i in range(count):
            self.add(reason, rows[i] if i < len(rows) else None)

    def text(self) -> str:
        """``2 missing chosen (train.jsonl rows 4, 9), 1 chosen == rejected (...)``, the
        names beyond the first ``FIRST_NAMED`` as a count."""
        parts = []
        for reason, entry in sorted(self.by_reason.items(), key=lambda kv: -kv[1]["count"]):
            rows = entry["rows"]
            more = entry["count"] - len(rows)
            where = ", ".join(rows) + (f" and {more} more" if rows and more else "")
            parts.append(f"{entry['count']} {reason}" + (f" ({where})" if rows else ""))
        return ", ".join(parts)


@dataclass
class SideCounts:
    unit: str  # "rows" or "preference pairs"
    read: int = 0
    drops: Drops = field(default_factory=Drops)
    held_out: int = 0  # rows of the training split a held-out fraction took
    kept: int = 0  # trained on, or measured

    def add(self, other: "SideCounts") -> None:
        """Another dataset of a list, counted together."""
        self.read += other.read
        self.held_out += other.held_out
        self.kept += other.kept
        for reason, entry in other.drops.by_reason.items():
            self.drops.add_counted(reason, entry["count"], entry["rows"])

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "read": self.read, "dropped": self.drops.count,
                "dropped_by": self.drops.by_reason, "held_out": self.held_out,
                "kept": self.kept}

    def line(self, side: str) -> str:
        """One log line: read, dropped (by reason), held out, trained or measured."""
        kept = "trained" if side == "train" else "measured"
        dropped = f"{self.drops.count} dropped" + (f" ({self.drops.text()})"
                                                   if self.drops.count else "")
        held = f", {self.held_out} held out for validation" if self.held_out else ""
        head = "train" if side == "train" else "validation"
        return f"{head}: {self.read} {self.unit} read, {dropped}{held}, {self.kept} {kept}"


def path(output_dir: Path | str) -> Path:
    return Path(output_dir) / FILE_NAME


def write(output_dir: Path | str, side: str, counts: SideCounts) -> None:
    """``side``'s counts into the record (the other side's kept)."""
    record = read(output_dir) or {}
    record[side] = counts.to_dict()
    write_atomic(path(output_dir), json.dumps(record, indent=2) + "\n")


def read(output_dir: Path | str) -> dict[str, dict] | None:
    try:
        data = json.loads(path(output_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove(output_dir: Path | str) -> None:
    """A fresh start of the data: an earlier run's counts never describe this one."""
    path(output_dir).unlink(missing_ok=True)
