"""The held-out numbers as ``summary.json``, the run report and the launcher's last line
give them: from the validation record (``kubetune.workspace.validation_record``), and which
split and how many rows the run trained on (the merged config's ``kubetune.data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.data import row_counts
from kubetune.trainer.metric_logging import held_out_numbers
from kubetune.workspace import TRAINER_CONFIG_NAME, validation_record


def validation_summary(output_dir: Path) -> dict[str, Any] | None:
    """``summary.json``'s ``validation``: None when the run had no held-out set."""
    record = validation_record.read(output_dir)
    if record is None:
        return None
    base, best, last = record.base, record.best, record.last
    loss = lambda e: float(e["val_loss"]) if e else None  # noqa: E731
    return {
        "source": record.source, "split": record.split, "train_split": record.train_split,
        "fraction": record.fraction, "rows": record.rows, "tokens": record.tokens,
        "every_n_steps": record.every_n_steps,
        "base_val_loss": loss(base),
        "best_val_loss": loss(best), "best_step": int(best["step"]) if best else None,
        "best_checkpoint": record.best_checkpoint,
        "last_val_loss": loss(last), "last_step": int(last["step"]) if last else None,
        "evaluations": len(record.by_step()),
        "checkpoints": record.checkpoints,
        "early_stop": record.early_stop,
        # An objective's own: a DPO run's base_reward_accuracy ..., a distillation's kd_loss.
        **held_out_numbers.summary_fields(record),
    }


def train_data(output_dir: Path, cfg: DictConfig | None = None) -> dict[str, Any] | None:
    """``{"split", "rows"}`` the run trained on, as the plan recorded them in the merged
    config (``kubetune.data``); None where it did not."""
    data = _data_section(cfg)
    if data is None:
        try:
            data = _data_section(OmegaConf.load(Path(output_dir) / TRAINER_CONFIG_NAME))
        except Exception:  # no config, or a broken one: the summary says less, never fails
            return None
    if data is None:
        return None
    counted = (row_counts.read(output_dir) or {}).get("train") or {}
    # The rows trained on as the recipe counted them (after the rows it dropped), else as
    # the plan counted the split.
    rows = counted.get("kept") if counted.get("kept") is not None else data.get("rows")
    return {"split": data.get("split"), "rows": rows}


def row_summary(output_dir: Path) -> dict[str, Any] | None:
    """``summary.json``'s ``rows``: per side (train, val) the rows or pairs read, dropped
    (by reason, the first named by file and row), held out and kept."""
    return row_counts.read(output_dir)


def _data_section(cfg: Any) -> DictConfig | None:
    data = OmegaConf.select(cfg, "kubetune.data", default=None) \
        if isinstance(cfg, DictConfig) else None
    return data if isinstance(data, DictConfig) else None


def loss_change(summary_validation: dict[str, Any] | None) -> str | None:
    """``base x -> last y (best z @ step s)`` for a person, or None without a base and a
    last loss."""
    v = summary_validation or {}
    if v.get("base_val_loss") is None or v.get("last_val_loss") is None:
        return None
    text = f"{v['base_val_loss']:.4f} -> {v['last_val_loss']:.4f}"
    if v.get("best_val_loss") is not None and v.get("best_step") != v.get("last_step"):
        text += f" (best {v['best_val_loss']:.4f} @ step {v['best_step']})"
    return text
