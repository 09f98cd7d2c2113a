"""The run report's validation section: what was trained on and held out, and a short
table of the held-out loss (the base model at step 0, the best and the last), read from
the validation record so that a report written at a checkpoint has it too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune.trainer.metric_logging import held_out_numbers
from kubetune.trainer.data.row_counts import Drops
from kubetune.trainer.metric_logging.validation_numbers import (loss_change, row_summary,
                                                                 train_data, validation_summary)


def held_out(v: dict[str, Any]) -> str:
    """Where the held-out rows came from, in a few words."""
    if v.get("source") == "fraction":
        what = f"a {v.get('fraction')} fraction of split `{v.get('train_split')}`, by content"
    elif v.get("source") == "config":
        what = "the config's `dataset_val`"
    else:
        what = f"split `{v.get('split')}`"
    size = [f"{v['rows']} rows" if v.get("rows") is not None else None,
            f"{v['tokens']} tokens" if v.get("tokens") is not None else None]
    size = [s for s in size if s]
    return what + (f" ({', '.join(size)})" if size else "")


def _counts_text(side: str, c: dict[str, Any]) -> str:
    """``training data: 60 preference pairs read, 3 dropped (2 missing chosen (train.jsonl
    rows 4, 9), ...), 57 trained``."""
    dropped = f"{c.get('dropped', 0)} dropped"
    if c.get("dropped"):
        dropped += f" ({Drops(c.get('dropped_by') or {}).text()})"
    held = f", {c['held_out']} held out for validation" if c.get("held_out") else ""
    what = "training data" if side == "train" else "held-out data"
    kept = "trained" if side == "train" else "measured"
    return f"{what}: {c.get('read')} {c.get('unit')} read, {dropped}{held}, {c.get('kept')} {kept}"


def _row(name: str, step: Any, loss: Any, more: list[str] = ()) -> str:
    return f"| {name} | {'?' if step is None else step} | " \
           f"{'?' if loss is None else format(loss, '.4f')} |" + "".join(f" {c} |" for c in more)


def facts(output_dir: Path) -> list[str]:
    """The report's bullet lines: the split and rows trained on, the held-out set and how
    its loss moved (none for a run without either record)."""
    lines: list[str] = []
    data = train_data(output_dir)
    counted = row_summary(output_dir) or {}
    if data and data.get("split") is not None:
        unit = (counted.get("train") or {}).get("unit") or "rows"
        rows = f", {data['rows']} {unit}" if data.get("rows") is not None else ""
        lines.append(f"- trained on: split `{data['split']}`{rows}")
    lines += [f"- {_counts_text(side, counted[side])}" for side in ("train", "val")
              if isinstance(counted.get(side), dict)]
    v = validation_summary(output_dir)
    if v is not None:
        lines.append(f"- held out: {held_out(v)}")
        change = loss_change(v)
        if change:
            lines.append(f"- validation loss: {change}")
        own = held_out_numbers.change_text(v)
        if own:
            lines.append(f"- held out, base -> last: {own}")
    return lines


def table(output_dir: Path) -> list[str]:
    """The validation section: base, best and last; the best checkpoint; an early stop."""
    v = validation_summary(output_dir)
    if v is None or v["last_val_loss"] is None:
        return []
    heads = held_out_numbers.table_heads(v)
    cells = lambda when: held_out_numbers.table_cells(v, when)  # noqa: E731
    lines = ["", "## Validation", "",
             "| | step | val loss |" + "".join(f" {h} |" for h in heads),
             "|---|---|---|" + "---|" * len(heads),
             _row("base", 0 if v["base_val_loss"] is not None else None, v["base_val_loss"],
                  cells("base")),
             _row("best", v["best_step"], v["best_val_loss"], cells("best")),
             _row("last", v["last_step"], v["last_val_loss"], cells("last"))]
    if held_out_numbers.is_preference(v):
        lines += ["", "The held-out val loss is the DPO loss on the held-out pairs. "
                  + held_out_numbers.PREFERENCE_BASE_NOTE]
    best = v.get("best_checkpoint")
    if best:
        loss = (v.get("checkpoints") or {}).get(best, {}).get("val_loss")
        lines += ["", f"Saved checkpoint with the lowest validation loss: `{best}`"
                  + (f" ({loss:.4f})" if isinstance(loss, (int, float)) else "")
                  + "; `kubetune export --checkpoint best` exports it."]
    stop = v.get("early_stop")
    if isinstance(stop, dict):
        best_loss = stop.get("best_val_loss")
        best_loss = f"{best_loss:.4f}" if isinstance(best_loss, (int, float)) else best_loss
        lines += ["", f"Stopped early at step {stop.get('step')}: no improvement in "
                  f"{stop.get('patience')} evaluations (best {best_loss} at step "
                  f"{stop.get('best_step')})."]
    return lines
