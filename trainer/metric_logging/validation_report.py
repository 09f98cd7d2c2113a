"""The run report's validation section: what was trained on and held out, and a short
table of the held-out loss (the base model at step 0, the best and the last), read from
the validation record so that a report written at a checkpoint has it too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune.trainer.metric_logging.validation_numbers import (loss_change, train_data,
                                                                 validation_summary)


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


def _row(name: str, step: Any, loss: Any) -> str:
    return f"| {name} | {'?' if step is None else step} | " \
           f"{'?' if loss is None else format(loss, '.4f')} |"


def facts(output_dir: Path) -> list[str]:
    """The report's bullet lines: the split and rows trained on, the held-out set and how
    its loss moved (none for a run without either record)."""
    lines: list[str] = []
    data = train_data(output_dir)
    if data and data.get("split") is not None:
        rows = f", {data['rows']} rows" if data.get("rows") is not None else ""
        lines.append(f"- trained on: split `{data['split']}`{rows}")
    v = validation_summary(output_dir)
    if v is not None:
        lines.append(f"- held out: {held_out(v)}")
        change = loss_change(v)
        if change:
            lines.append(f"- validation loss: {change}")
    return lines


def table(output_dir: Path) -> list[str]:
    """The validation section: base, best and last; the best checkpoint; an early stop."""
    v = validation_summary(output_dir)
    if v is None or v["last_val_loss"] is None:
        return []
    lines = ["", "## Validation", "", "| | step | val loss |", "|---|---|---|",
             _row("base", 0 if v["base_val_loss"] is not None else None, v["base_val_loss"]),
             _row("best", v["best_step"], v["best_val_loss"]),
             _row("last", v["last_step"], v["last_val_loss"])]
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
