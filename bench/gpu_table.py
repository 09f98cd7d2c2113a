"""bench/gpu.py's one table, as Markdown: a row per case, each with its number or the
reason it has none."""

from __future__ import annotations

HEADER = ("| case | measured | target | met | ours / plain torchtune "
          "| ours / transformers + PEFT | peak memory | `kubetune size` | s | note |")


def _tps(value: float | None) -> str:
    return f"{value:,.0f} tokens/s" if value is not None else "—"


def _measured(row) -> str:
    if row.measured is None:
        return "—"
    if row.case == "validation":
        return f"{row.measured:.1%} of the steps' time"
    return _tps(row.measured)


def _target(row) -> str:
    if row.target is None:
        return "—"
    if row.case == "validation":
        return f"≤ {row.target:.0%}"
    return f"≥ {row.target:,.0f}"


def _ratio(row) -> str:
    if row.ratio is None:
        return "—"
    spread = (f" ({row.ratio_range[0]:.2f}–{row.ratio_range[1]:.2f})"
              if row.ratio_range and row.ratio_range[0] != row.ratio_range[1] else "")
    return f"{row.ratio:.2f}x{spread} of {_tps(row.plain)}"


def _peft(row) -> str:
    """Ours over transformers + PEFT's same run: tokens/s, then peak memory (CUDA reserved;
    resident memory on CPU); the baseline's reason where it has no number; a dash for a
    case with no baseline."""
    note = f" ({row.peft_note})" if row.peft_note and row.peft is not None else ""
    if row.peft is None:
        return row.peft_note or "—"
    speed = f"{row.peft_ratio:.2f}x" if row.peft_ratio is not None else "—"
    memory = (f"; memory {row.peft_memory_ratio:.2f}x" if row.peft_memory_ratio is not None
              else "")
    return f"{speed} of {_tps(row.peft)}{memory}{note}"


def _peak(row, card: dict) -> str:
    if row.peak_gib is None:
        return "— (CPU)" if card["memory_gib"] is None and row.measured is not None else "—"
    return f"{row.peak_gib:.1f} GiB ({row.peak_gib / card['memory_gib']:.0%} of the card)"


def _size(row) -> str:
    if row.size_gib is None:
        return "—"
    # The run's own plan, where it differs: `kubetune size` knows no accumulation steps
    # or recipe, so a gap between the two says which side a miss comes from.
    own = (row.raw or {}).get("run_plan_gib")
    own = f"; the run's own plan {own:.1f} GiB" if own is not None and own != row.size_gib else ""
    if row.peak_gib:
        return (f"{row.size_gib:.1f} GiB ({row.size_gib / row.peak_gib - 1:+.0%} of the "
                f"peak{own})")
    return f"{row.size_gib:.1f} GiB (no CUDA peak to compare{own})"


def _met(row) -> str:
    return {True: "yes", False: "NO", None: "—"}[row.met]


def markdown(rows: list, card: dict, total_s: float, budget_s: float) -> str:
    lines = [f"Card: {card['name']}; bf16 peak {card['peak_text']}; tokens/s targets are "
             f"stated for an H100-class card and scaled here by {card['scale']:.2f}. "
             f"{total_s:.0f} s of a {budget_s:.0f} s budget.", "", HEADER,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row.case, _measured(row), _target(row), _met(row), _ratio(row),
                 _peft(row).replace("|", "/"), _peak(row, card), _size(row), f"{row.seconds:.0f}",
                 row.note.replace("|", "/") or ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
