"""Progress of a running recipe, from rank 0's metric logger: in a terminal, one live
tqdm bar (step/total, rate, ETA, loss, lr, tokens/s) redrawn each step; otherwise (a pod's
log, a pipe, JSON mode) one line per logged step (step/total, %, ETA, loss, lr, tokens/s,
a timestamp). Each held-out evaluation gets a line of its own (``validation: step N |
val_loss x | base y | best z @ step s``), above the bar in a terminal. And the TrainJob
status either way, the latest ``val_loss`` beside the training loss.

Total steps come from the recipe after its setup (epochs x optimizer steps per epoch,
``max_steps_per_epoch`` included), handed over by ``kubetune.trainer.recipe_process.bootstrap``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Mapping

from omegaconf import OmegaConf

from kubetune import logs
from kubetune.phase_progress import format_duration
from kubetune.remote.trainjob_status import StatusReporter
from kubetune.trainer.metric_logging.validation_progress import ValidationProgress
from kubetune.trainer.objectives import registry
from kubetune.trainer.request import passed_env
from kubetune.workspace import held_out_keys

COMPONENT = "trainer"
_drawn: "TrainProgress | None" = None  # the bar on the terminal, in this process


def end_bar_line() -> None:
    """End the bar's line on the terminal before other output reaches it: the bar is
    drawn with a carriage return and no newline, so a line the recipe prints ("Starting
    checkpoint save...") would land glued to its end. The next step draws the bar anew
    on the line below."""
    bar = getattr(_drawn, "_bar", None)
    if bar is None or not _drawn._mid_line:
        return
    _drawn._mid_line = False
    try:
        bar.fp.write("\n")
        bar.fp.flush()
    except (OSError, ValueError, AttributeError):
        pass  # the terminal went away: nobody is watching


class _EndsBarLine:
    """A stream (the recipe's stdout or stderr) that ends the bar's line before a write."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text:
            end_bar_line()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_output_off_the_bar(environ: Mapping[str, str] | None = None) -> None:
    """In the recipe process, before the recipe makes its loggers (their handlers keep
    the stream they were made with): where a bar may be drawn, stdout and stderr end the
    bar's line before they write."""
    if passed_env.progress_tty(environ) and not logs.json_mode(environ) \
            and not isinstance(sys.stderr, _EndsBarLine):
        sys.stdout = _EndsBarLine(sys.stdout)
        sys.stderr = _EndsBarLine(sys.stderr)


def recipe_plan(recipe: Any) -> tuple[int | None, int | None]:
    """(total optimizer steps, total epochs) of a set-up torchtune recipe, where it says."""
    epochs = getattr(recipe, "total_epochs", None)
    per_epoch = getattr(recipe, "_steps_per_epoch", None)
    if not isinstance(epochs, int) or not isinstance(per_epoch, int):
        return None, epochs if isinstance(epochs, int) else None
    return epochs * per_epoch, epochs


# What an objective's recipes log beside the loss, as its ``Objective.logged_parts`` name
# them (a DPO recipe's rewards, a distillation recipe's cross-entropy and KD terms): each
# shown where a record holds it.
LOGGED_PARTS = registry.logged_parts()


def objective_parts(record: Mapping[str, Any]) -> list[str]:
    """The numbers an objective's step logged beside its loss, as the progress line shows
    them."""
    return [shown for part in LOGGED_PARTS if (shown := part.shown(record)) is not None]


class TrainProgress:
    """Fed one metrics record per logged step (rank 0 only: the recipes log there)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.total_steps: int | None = None
        self.total_epochs: int | None = None
        # The first logged step and when: the rate after it gives the ETA (the first step
        # pays for warm-up, so it is not part of the rate).
        self._origin: tuple[int, float] | None = None
        self.json = logs.json_mode(environ)
        self.quiet = logs.quiet_mode(environ)  # -q: the status still goes, no lines or bar
        self.reporter = StatusReporter.from_env(environ, source="trainer") \
            if passed_env.is_primary(environ) else None
        # The launcher hands its terminal down only to a process that may draw on it.
        self._tty = passed_env.progress_tty(environ) \
            if passed_env.is_primary(environ) and not self.json else None
        self._bar: Any = None
        self.validation = ValidationProgress()
        # The last numbers sent to the status: an evaluation adds to them, a step keeps
        # the last evaluation's.
        self._status: dict[str, object] = {}
        self._val_status: dict[str, object] = {}
        self._percent: int | None = None
        self._eta: float | None = None
        self._mid_line = False  # the bar is the terminal's last output, with no newline

    def set_plan(self, total_steps: int | None, total_epochs: int | None) -> None:
        self.total_steps, self.total_epochs = total_steps, total_epochs

    def percent(self, step: int) -> int | None:
        if not self.total_steps:
            return None
        # 100 means done (the checkpoint saved): the launcher sends it, not a step.
        return min(99, int(100 * step / self.total_steps))

    def eta_s(self, step: int, now: float) -> float | None:
        if self._origin is None or not self.total_steps:
            return None
        first_step, first_time = self._origin
        if step <= first_step:
            return None
        per_step = (now - first_time) / (step - first_step)
        return max(0, self.total_steps - step) * per_step

    def on_step(self, record: Mapping[str, Any]) -> None:
        """One logged step: a pod-log line and the TrainJob status (never raises)."""
        if "loss" not in record:
            return
        now = time.monotonic()
        step = int(record["step"])
        if self._origin is None:
            self._origin = (step, now)
        percent, eta = self.percent(step), self.eta_s(step, now)
        self._percent, self._eta = percent, eta
        if not self.quiet:
            # A person reads "192/192 (100%)" as the last step; only the status holds
            # back 100 until the checkpoint is saved.
            shown = int(100 * step / self.total_steps) if self.total_steps else None
            self._show(record, shown, eta)
        if self.reporter is not None:
            self._status = self.status_metrics(record)
            self.reporter.update(percent, eta, {**self._status, **self._val_status})

    def on_validation(self, record: Mapping[str, Any]) -> None:
        """One held-out evaluation: its line (never raises) and the status."""
        self.validation.add(record)
        if not self.quiet:
            self._show_line(self.validation_line(record))
        if self.reporter is not None:
            self._val_status = self.validation.status_metrics(record)
            metrics = {**self._status, **self._val_status}
            metrics.setdefault("step", int(record["step"]))
            self.reporter.update(self._percent, self._eta, metrics)

    def validation_line(self, record: Mapping[str, Any]) -> str:
        text = self.validation.text(record)
        if not self.json:
            return f"{logs.timestamp()} {text}"
        return logs.json_line(COMPONENT, "INFO", text, self.validation.fields(record))

    def _show_line(self, line: str) -> None:
        if self._bar is not None:
            try:
                # Above the bar, which tqdm redraws below it.
                self._bar.write(line, file=self._bar.fp)
                return
            except (OSError, ValueError, AttributeError):
                return  # the terminal went away mid-run: nobody is watching
        try:
            print(line, file=sys.stdout, flush=True)
        except (OSError, ValueError):
            pass  # a closed stdout must not stop training

    def _show(self, record: Mapping[str, Any], percent: int | None, eta: float | None) -> None:
        if self._tty is not None:
            try:
                self._draw(record)
                return
            except (OSError, ValueError):
                if self._bar is not None:
                    return  # the terminal went away mid-run: nobody is watching
                self._tty = None  # a terminal we cannot open: lines instead, from this one
        try:
            print(self.line(record, percent, eta), file=sys.stdout, flush=True)
        except (OSError, ValueError):
            pass  # a closed stdout must not stop training

    def _draw(self, record: Mapping[str, Any]) -> None:
        """The live bar: tqdm measures the rate and ETA; the postfix carries the numbers."""
        # tqdm.std's class, not tqdm.tqdm: the recipe process swaps that one for a class
        # that never draws (torchtune's own bars stay off).
        from tqdm.std import tqdm

        step = int(record["step"])
        if self._bar is None:
            # O_NOCTTY: the recipe leads its own session, and a terminal it opened would
            # become its controlling one, hung up (for the user's shell too) when it exits.
            fd = os.open(self._tty, os.O_WRONLY | os.O_NOCTTY)
            stream = os.fdopen(fd, "w", encoding="utf-8")
            # A terminal that reports no size yet (0 columns) would get an empty bar.
            sized = os.get_terminal_size(fd).columns > 0
            self._bar = tqdm(total=self.total_steps, initial=step - 1, desc="train",
                             unit="step", file=stream, dynamic_ncols=sized,
                             ncols=None if sized else 100, leave=True, disable=False,
                             # Every optimizer step redrawn: tqdm's default 0.1 s throttle
                             # would skip the steps of a fast run (a tiny model on CPU).
                             mininterval=0, miniters=1)
        self._bar.set_postfix_str(self.postfix(record), refresh=False)
        self._bar.update(step - self._bar.n)
        global _drawn
        _drawn, self._mid_line = self, True

    def postfix(self, record: Mapping[str, Any]) -> str:
        parts = [f"loss {float(record['loss']):.4f}", *objective_parts(record)]
        if "epoch" in record:
            epoch = int(record["epoch"]) + 1
            parts.insert(0, f"epoch {epoch}/{self.total_epochs}" if self.total_epochs
                         else f"epoch {epoch}")
        if "lr" in record:
            parts.append(f"lr {float(record['lr']):.2e}")
        if "tokens_per_second" in record:
            parts.append(f"{float(record['tokens_per_second']):.0f} tok/s")
        return ", ".join(parts)

    def status_metrics(self, record: Mapping[str, Any]) -> dict[str, object]:
        metrics: dict[str, object] = {"loss": f"{float(record['loss']):.6g}"}
        if "lr" in record:
            metrics["lr"] = f"{float(record['lr']):.6g}"
        if "tokens_per_second" in record:
            metrics["tokens_per_second"] = f"{float(record['tokens_per_second']):.1f}"
        for part in LOGGED_PARTS:
            if part.key in record:
                metrics[part.status] = f"{float(record[part.key]):.6g}"
        metrics["step"] = int(record["step"])
        if self.total_steps:
            metrics["total_steps"] = self.total_steps
        if "epoch" in record:
            metrics["epoch"] = int(record["epoch"]) + 1
        if self.total_epochs:
            metrics["total_epochs"] = self.total_epochs
        return metrics

    def line(self, record: Mapping[str, Any], percent: int | None, eta: float | None) -> str:
        step = int(record["step"])
        parts = [f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"]
        if percent is not None:
            parts[0] += f" ({percent}%)"
        if "epoch" in record:
            epoch = int(record["epoch"]) + 1
            parts.append(f"epoch {epoch}/{self.total_epochs}" if self.total_epochs
                         else f"epoch {epoch}")
        parts.append(f"loss {float(record['loss']):.4f}")
        parts += objective_parts(record)
        if "lr" in record:
            parts.append(f"lr {float(record['lr']):.2e}")
        if "tokens_per_second" in record:
            parts.append(f"{float(record['tokens_per_second']):.0f} tok/s")
        parts.append(f"eta {format_duration(eta)}" if eta is not None else "eta ?")
        text = "train: " + " | ".join(parts)
        if not self.json:
            return f"{logs.timestamp()} {text}"
        fields = {"step": step, "total_steps": self.total_steps, "percent": percent,
                  "epoch": int(record["epoch"]) + 1 if "epoch" in record else None,
                  "total_epochs": self.total_epochs, "loss": float(record["loss"]),
                  "lr": record.get("lr"), "tokens_per_second": record.get("tokens_per_second"),
                  "eta_s": None if eta is None else round(eta, 1),
                  **{p.status: record[p.key] for p in LOGGED_PARTS if p.key in record}}
        return logs.json_line(COMPONENT, "INFO", text, fields)

    def close(self) -> None:
        """The recipe is done: whatever is pending goes with the launcher's final report."""
        self._mid_line = False  # tqdm's close ends the line
        if self._bar is not None:
            try:
                self._bar.close()
                self._bar.fp.close()
            except (OSError, ValueError, AttributeError):
                pass
            self._bar = None
        if self.reporter is not None:
            self.reporter.close()


def warmup_note(total_steps: int | None, warmup_steps: Any, lr: Any) -> str | None:
    """One line when the learning-rate warm-up does not end before the run does: the
    learning rate never reaches the configured value, and the loss barely moves."""
    if not total_steps or not isinstance(warmup_steps, int) or warmup_steps < total_steps:
        return None
    peak = f" (it peaks at {total_steps / warmup_steps:.0%} of optimizer.lr={lr})" \
        if isinstance(lr, (int, float)) else ""
    return (f"the learning-rate warm-up (lr_scheduler.num_warmup_steps={warmup_steps}) covers "
            f"all {total_steps} steps of this run{peak}: set lr_scheduler.num_warmup_steps "
            f"below {total_steps} or train for more steps")


def warn_about_warmup(recipe: Any, cfg: Any) -> None:
    """Before the first step (rank 0): a warm-up the run never leaves."""
    if not passed_env.is_primary():
        return
    select = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731
    note = warmup_note(recipe_plan(recipe)[0], select("lr_scheduler.num_warmup_steps"),
                       select("optimizer.lr"))
    if note is not None:
        logging.getLogger("trainer").warning(note)


def hand_plan_to_logger(recipe: Any) -> None:
    """After the recipe's setup: tell our metric logger the run's total steps and epochs."""
    logger = getattr(recipe, "_metric_logger", None)
    if hasattr(logger, "set_plan"):
        logger.set_plan(*recipe_plan(recipe))


def report_finished(summary: Mapping[str, Any], environ: Mapping[str, str] | None = None
                    ) -> None:
    """From the launcher, once the run's checkpoint and marker are written: 100 %, with
    the summary's numbers (MFU where measured). Waits one request's timeout at most.
    Quiet on failure: the recipe's reporter already warned once for this run."""
    reporter = StatusReporter.from_env(environ, source="trainer", warn=False)
    if reporter is None:
        return
    metrics: dict[str, object] = {}
    if summary.get("last_loss") is not None:
        metrics["loss"] = f"{float(summary['last_loss']):.6g}"
    metrics["step"] = summary.get("last_step")
    metrics["total_steps"] = summary.get("last_step")
    metrics["epoch"] = summary.get("epochs")
    if summary.get("tokens_per_second"):
        metrics["tokens_per_second"] = f"{float(summary['tokens_per_second']):.1f}"
    if summary.get("mfu"):
        metrics["mfu"] = f"{float(summary['mfu']):.4f}"
    validation = summary.get("validation") or {}
    for key, name in (("last_val_loss", "val_loss"), ("best_val_loss", "best_val_loss"),
                      ("base_val_loss", "base_val_loss")):
        if validation.get(key) is not None:
            metrics[name] = f"{float(validation[key]):.6g}"
    for number in held_out_keys.ALL:  # an objective's own, as the last evaluation's
        if validation.get(f"last_{number.stem}") is not None:
            metrics[number.key] = f"{float(validation[f'last_{number.stem}']):.6g}"
    metrics["wall_time_s"] = summary.get("wall_time_s")
    reporter.finish(100, 0, metrics)
