"""A torchtune metric logger (chosen by config) that writes JSON lines a program reads
and, through ``kubetune.trainer.metric_logging.train_progress``, prints one progress line per logged step
(``kubectl logs``, no carriage-return bars) and reports the TrainJob status.

Each line: step, epoch, loss, lr (the learning rate the step trained with: torchtune's
recipes log the one the scheduler has already moved on to, so a run's first step would
show the second's), tokens (this step, all ranks; a DPO step's chosen and rejected answers both), a DPO
recipe's ``rewards/*`` and ``log_probs/*`` as it logged them, tokens_per_second (as
the recipe measured it, per device), batch_digest (of the token ids the step trained on,
all ranks), peak_memory_bytes (CUDA peak reserved on GPU, peak
resident memory on CPU), time_s since the logger started.

A held-out evaluation (``log_dict({"val_loss": x, "val_tokens": n}, step=N)``, from the
validation loop) is a line of its own, ``{"step", "epoch", "val_loss", "val_tokens",
"time_s"}`` (and an objective's own held-out numbers, ``val_reward_accuracy`` ...:
``kubetune.workspace.held_out_keys``), with no training fields: a reader tells the two kinds apart by ``loss`` and
``val_loss``. It prints a progress line of its own too.

A logger the user configured (TensorBoard, W&B, MLflow, torchtune's DiskLogger) comes in
as ``also`` and gets every call too: ours writes beside theirs, never instead.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig

from kubetune.trainer.config.saved_config import without_credentials
from kubetune.trainer.metric_logging.train_progress import TrainProgress
from kubetune.workspace import METRICS_NAME


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value


def peak_memory_bytes() -> int:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_reserved())
    except Exception:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class JsonLinesMetricLogger:
    """Implements torchtune's MetricLoggerInterface (log, log_dict, log_config, close)."""

    def __init__(self, log_dir: str, print_every_s: float = 5.0,
                 also: Mapping[str, Any] | None = None, loss_summed_over: int = 1,
                 **_: Any) -> None:
        # A recipe that sums its logged loss over its processes (lora_dpo_distributed):
        # divided here, so that every reader (ours, the user's logger) gets the mean.
        self._loss_divisor = max(1, int(loss_summed_over))
        self._also = [_instantiate(also)] if also else []
        self._path = Path(log_dir) / METRICS_NAME
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._path, "a", encoding="utf-8")
        self._start = time.monotonic()
        self._print_every_s = print_every_s
        self._progress = TrainProgress()
        # A resumed run appends to the earlier lines: its progress line still knows the
        # base model's loss and the best so far.
        self._progress.validation.seed(read_metrics(self._path.parent))
        self._epoch: int | None = None
        self._step_tokens: int | None = None
        self._step_digest: str | None = None
        self._step_lr: float | None = None
        # Validation inside a step's interval (kubetune.trainer.recipe_process.held_out):
        # the recipe's tokens/s for that step counts those seconds as training's.
        self._paused_s = 0.0
        self._interval_start: float | None = None
        # (step, loss) of the last logged step: step_guard stops the run on a non-finite one.
        self.last_loss: tuple[int, Any] | None = None

    # Called by kubetune.trainer.recipe_process.step_guard, which sees the batches the recipe trains on.
    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        if self._interval_start is None:  # the recipe starts timing its first step here
            self._interval_start = time.monotonic()

    def note_validation_s(self, seconds: float) -> None:
        self._paused_s += max(0.0, float(seconds))

    def note_step_tokens(self, tokens: int) -> None:
        self._step_tokens = int(tokens)

    # Called by kubetune.trainer.recipe_process.bootstrap once the recipe knows its epochs and steps per epoch.
    def set_plan(self, total_steps: int | None, total_epochs: int | None) -> None:
        self._progress.set_plan(total_steps, total_epochs)

    def note_step_digest(self, digest: str) -> None:
        self._step_digest = digest

    def note_step_lr(self, lr: float | None) -> None:
        self._step_lr = lr

    def log(self, name: str, data: Any, step: int) -> None:
        for other in self._also:
            other.log(name, data, step)
        self._write({name: data}, step)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        if self._loss_divisor > 1 and "loss" in payload:
            payload = {**payload, "loss": float(_scalar(payload["loss"])) / self._loss_divisor}
        for other in self._also:
            other.log_dict(payload, step)
        self._write(payload, step)

    def _write(self, payload: Mapping[str, Any], step: int) -> None:
        if "val_loss" in payload:
            self._write_validation(payload, step)
            return
        record: dict[str, Any] = {"step": int(step)}
        if self._epoch is not None:
            record["epoch"] = self._epoch
        for key, value in payload.items():
            key = "tokens_per_second" if key == "tokens_per_second_per_gpu" else key
            record[key] = _scalar(value)
        if "loss" in record:
            self.last_loss = (record["step"], record["loss"])
            if self._step_tokens is not None:
                record["tokens"] = self._step_tokens
                self._step_tokens = None
            if self._step_digest is not None:
                record["batch_digest"] = self._step_digest
                self._step_digest = None
            if self._step_lr is not None and "lr" in record:
                record["lr"] = self._step_lr
                self._step_lr = None
            record["peak_memory_bytes"] = peak_memory_bytes()
            self._discount_validation(record)
        record["time_s"] = round(time.monotonic() - self._start, 3)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._progress.on_step(record)

    def _discount_validation(self, record: dict[str, Any]) -> None:
        """The step's tokens/s over its training seconds only: the interval since the last
        logged step less the validation measured inside it."""
        now = time.monotonic()
        interval = now - self._interval_start if self._interval_start is not None else 0.0
        speed = record.get("tokens_per_second")
        if self._paused_s and isinstance(speed, (int, float)) and interval > self._paused_s:
            record["tokens_per_second"] = speed * interval / (interval - self._paused_s)
        self._paused_s, self._interval_start = 0.0, now

    def _write_validation(self, payload: Mapping[str, Any], step: int) -> None:
        record: dict[str, Any] = {"step": int(step)}
        if self._epoch is not None:
            record["epoch"] = self._epoch
        record["val_loss"] = float(_scalar(payload["val_loss"]))
        if payload.get("val_tokens") is not None:
            record["val_tokens"] = int(_scalar(payload["val_tokens"]))
        for key, value in payload.items():  # an objective's own (held_out_keys)
            if key.startswith("val_") and key not in record and value is not None:
                record[key] = _scalar(value)
        record["time_s"] = round(time.monotonic() - self._start, 3)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._progress.on_validation(record)

    def log_config(self, config: Any) -> None:
        # The launcher already wrote the merged config next to the metrics. Others (wandb,
        # tensorboard's torchtune_config.yaml) get it as the launcher saved it: no URL
        # credentials.
        for other in self._also:
            if hasattr(other, "log_config"):
                other.log_config(without_credentials(config) if isinstance(config, DictConfig)
                                 else config)

    def close(self) -> None:
        progress = getattr(self, "_progress", None)  # None: __init__ failed before it
        if progress is not None:
            progress.close()
        for other in getattr(self, "_also", []):
            other.close()
        self._also = []
        file = getattr(self, "_file", None)  # None: __init__ failed before opening it
        if file is not None and not file.closed:
            file.close()

    def __del__(self) -> None:
        self.close()


def _instantiate(spec: Mapping[str, Any]) -> Any:
    from omegaconf import DictConfig, OmegaConf
    from torchtune import config

    return config.instantiate(spec if isinstance(spec, DictConfig) else OmegaConf.create(spec))


def read_metrics(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / METRICS_NAME
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass  # a line cut short by a kill
    return records
