"""The row counts (``kubetune.trainer.data.row_counts``) of the datasets a recipe builds
through the token cache: what the builder read and dropped (its own counts, where it
leaves them: the preference builder's), what a held-out fraction took, what the cache
dropped (rows with nothing to train on), and what is left; one log line per side and the
record rank 0 writes for ``summary.json`` and the report."""

from __future__ import annotations

import logging
from typing import Any

from kubetune.trainer.data import row_counts
from kubetune.trainer.data.row_counts import COUNTS_ATTRIBUTE, SideCounts
from kubetune.trainer.request import passed_env

log = logging.getLogger("trainer")


def _rows_of(built: Any) -> Any:
    """The builder's rows (a PackedDataset's unpacked ones)."""
    return getattr(built, "ds", built)


def before_hold_out(built: Any) -> int:
    return len(_rows_of(built))


def counted(built: Any, before: int, result: Any, side: str = "train") -> SideCounts:
    """One dataset's counts: ``built`` the builder's dataset (a held-out fraction taken
    already), ``before`` its rows before that, ``result`` what the cache gave the recipe.
    The held-out side of a fraction reads the rows the fraction kept for it (the split's
    whole count, and the builder's drops in it, are the training side's to tell)."""
    own = getattr(_rows_of(built), COUNTS_ATTRIBUTE, None)
    meta = getattr(getattr(result, "rows", None), "meta", None) or {}
    pairs = meta.get("pairs")
    unit = own.unit if own is not None else (
        "preference pairs" if pairs is not None else "rows")
    after = len(_rows_of(built))
    if side == "val" and after < before:
        counts = SideCounts(unit, read=after)
    else:
        counts = SideCounts(unit, read=own.read if own is not None else before,
                            held_out=before - after)
        if own is not None:
            counts.add(SideCounts(unit, drops=own.drops))
    for reason, entry in (meta.get("dropped_by") or {}).items():
        counts.drops.add_counted(reason, int(entry["count"]),
                                 [f"row {r}" for r in entry.get("rows") or []])
    kept = pairs if pairs is not None else meta.get("rows")
    counts.kept = int(kept) if kept is not None else len(_rows_of(result))
    return counts


def report(output_dir: str, side: str, each: list[SideCounts]) -> SideCounts | None:
    """The side's counts, every dataset of a list together: logged and recorded (rank 0)."""
    if not each:
        return None
    total = SideCounts(each[0].unit)
    for counts in each:
        total.add(counts)
    if passed_env.is_primary():
        log.info(total.line(side))
    if passed_env.is_primary() and output_dir:
        try:
            if side == "train":  # the first side counted: nothing of an earlier run stays
                row_counts.remove(output_dir)
            row_counts.write(output_dir, side, total)
        except OSError as exc:  # the counts are told in the log already
            log.warning("row counts not recorded: %s", exc)
    return total
