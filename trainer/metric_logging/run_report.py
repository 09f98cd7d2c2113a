"""The run report in the output dir: ``kubetune-report.md`` (what ran, on what, how fast,
how it ended; with a held-out set, its loss from the base model to the last step:
``validation_report``) and ``kubetune-curves.png`` (loss, learning rate and tokens/s by
step; validation loss on the loss axis, the base marked).

Written by rank 0 after every resumable checkpoint (the run so far) and by the launcher
at the end (with ``summary.json``'s numbers); the exporter carries both into the export.
Each file is replaced by rename, so a reader never sees half of one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from omegaconf import OmegaConf

from kubetune.atomic_write import atomic_path, write_atomic

from kubetune.trainer.metric_logging import curves, validation_report
from kubetune.workspace import answers_record
# The workspace's names: the exporter carries the report and curves into the export.
from kubetune.workspace import CURVES_NAME, METRICS_NAME, RUN_REPORT_NAME, TRAINER_CONFIG_NAME
from kubetune.trainer.metric_logging.metric_logger import read_metrics
from kubetune.trainer.objectives.distill import CE_METRIC as CLASS_LOSS, KD_METRIC as KD_LOSS
from kubetune.trainer.objectives.dpo import REWARD_ACCURACY, REWARD_MARGIN

log = logging.getLogger("trainer")


def loss_steps(output_dir: Path) -> list[dict]:
    """The logged steps, the last record of each (a resumed run repeats steps)."""
    by_step = {r["step"]: r for r in read_metrics(output_dir) if "loss" in r}
    return [by_step[s] for s in sorted(by_step)]


def eval_records(output_dir: Path) -> list[dict]:
    """The records of an eval pass (our validation loop, or a recipe that validates, logs
    them without "loss"), the last record of each step."""
    by_step = {r["step"]: r for r in read_metrics(output_dir)
               if "loss" not in r and any(k in r for k in curves.EVAL_KEYS)}
    return [by_step[s] for s in sorted(by_step)]


def write_curves(output_dir: Path, steps: list[dict]) -> Path:
    path = Path(output_dir) / CURVES_NAME
    with atomic_path(path) as tmp:
        curves.save(tmp, steps, eval_records(output_dir))
    return path


def _config_facts(output_dir: Path) -> list[str]:
    try:
        cfg = OmegaConf.load(Path(output_dir) / TRAINER_CONFIG_NAME)
    except Exception:
        return []
    facts = []
    sel = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731
    model = sel("model._component_")
    if model:
        facts.append(f"model: `{model}` from `{sel('checkpointer.checkpoint_dir')}`")
    dataset = sel("dataset._component_") or sel("dataset.source")
    where = sel("dataset.data_dir") or sel("dataset.data_files") or sel("dataset.source")
    if dataset:
        facts.append(f"dataset: `{dataset}`" + (f" (`{where}`)" if where != dataset else ""))
    if sel("model.lora_rank") is not None:
        facts.append(f"LoRA rank {sel('model.lora_rank')}, alpha {sel('model.lora_alpha')}")
    facts.append(f"epochs {sel('epochs')}, batch size {sel('batch_size')}, gradient "
                 f"accumulation {sel('gradient_accumulation_steps')}, learning rate "
                 f"{sel('optimizer.lr')}, dtype {sel('dtype')}")
    return facts


def _fmt(value, spec: str = "") -> str:
    return "?" if value is None else format(value, spec)


def _preference_facts(steps: list[dict]) -> list[str]:
    """A DPO run's reward accuracy and margin, first step -> last."""
    first = next((s for s in steps if REWARD_ACCURACY in s), None)
    if first is None:
        return []
    last = steps[-1]
    return [f"- reward accuracy: {first[REWARD_ACCURACY]:.2f} -> "
            f"{last.get(REWARD_ACCURACY, float('nan')):.2f}; reward margin: "
            f"{first.get(REWARD_MARGIN, float('nan')):.4f} -> "
            f"{last.get(REWARD_MARGIN, float('nan')):.4f} (how far the tuned model prefers "
            "the chosen answers over the rejected, beyond the reference)"]


def _distillation_facts(steps: list[dict]) -> list[str]:
    """A distillation run's loss parts, first step -> last."""
    logged = [s for s in steps if KD_LOSS in s]
    if not logged:
        return []
    first, last = logged[0], logged[-1]
    return [f"- loss parts: cross-entropy {_fmt(first.get(CLASS_LOSS), '.4f')} -> "
            f"{_fmt(last.get(CLASS_LOSS), '.4f')} (against the labels); KD "
            f"{_fmt(first.get(KD_LOSS), '.4f')} -> {_fmt(last.get(KD_LOSS), '.4f')} (the "
            "student's divergence from the teacher)"]


def render(output_dir: Path, steps: list[dict], summary: dict | None, state: str) -> str:
    lines = ["# Training report", "", f"**{state}**", ""]
    lines += [f"- {fact}" for fact in _config_facts(output_dir)]
    if summary:
        device = summary.get("gpu") or summary.get("device")
        lines.append(f"- on: {device} x {summary.get('world_size')}")
        lines.append(f"- steps: {summary.get('steps')}, tokens: {summary.get('tokens')}, "
                     f"wall time: {_fmt(summary.get('wall_time_s'), '.1f')} s")
        lines.append(f"- speed: {_fmt(summary.get('tokens_per_second'), '.0f')} tokens/s"
                     + (f", MFU {summary['mfu']:.1%}" if summary.get("mfu") else ""))
        peak = summary.get("peak_memory_bytes")
        if peak:
            lines.append(f"- peak memory: {peak / 2**30:.2f} GiB "
                         f"({summary.get('peak_memory_note')})")
    else:
        lines.append(f"- steps so far: {len(steps)}")
    if steps:
        lines.append(f"- loss: {steps[0]['loss']:.4f} (step {steps[0]['step']}) -> "
                     f"{steps[-1]['loss']:.4f} (step {steps[-1]['step']})")
    lines += _preference_facts(steps)
    lines += _distillation_facts(steps)
    lines += validation_report.facts(output_dir)
    if steps:
        lines += ["", f"![loss and learning rate by step]({CURVES_NAME})"]
    lines += validation_report.table(output_dir)
    preference = any(REWARD_ACCURACY in s for s in steps)
    lines += _answers_section(output_dir, "Reference (the chosen answer)" if preference
                              else "Reference")
    lines += ["", f"The full config: `{TRAINER_CONFIG_NAME}`; every logged step: "
              f"`{METRICS_NAME}`.", ""]
    return "\n".join(lines)


_PROMPT_SHOWN = 400  # characters of a prompt's end: the question, after the system prompt
_TEXT_SHOWN = 1500  # characters of a reference or an answer


def _shortened(text: str, keep: int, *, tail: bool = False) -> str:
    if len(text) <= keep:
        return text
    return "…" + text[-keep:] if tail else text[:keep] + "…"


def _fenced(text: str) -> list[str]:
    """``text`` verbatim in a fenced block: the fence is longer than any run of backticks
    inside (CommonMark), control characters other than newline and tab shown escaped."""
    text = "".join(c if c in "\n\t" or c.isprintable() else f"\\x{ord(c):02x}"
                   for c in text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *text.split("\n"), fence]


def _answer_block(title: str, text: str | None, missing: str) -> list[str]:
    if text is None:
        return [f"**{title}**: _{missing}_", ""]
    if not text.strip():
        return [f"**{title}**: _(nothing: it stopped at once)_", ""]
    return [f"**{title}**", "", *_fenced(_shortened(text, _TEXT_SHOWN)), ""]


def _answers_section(output_dir: Path, reference: str = "Reference") -> list[str]:
    """Answers on held-out prompts: each prompt's reference (a DPO pair's chosen answer),
    the base's and the tuned model's greedy answers (``kubetune.workspace.answers_record``);
    none without a record."""
    record = answers_record.read(output_dir)
    if record is None or not record.prompts:
        return []
    base = "base model" + (f" (step {record.base_step})" if record.base_step is not None else "")
    tuned = "tuned model" + (f" (step {record.tuned_step})"
                             if record.tuned_step is not None else "")
    lines = ["", "## Answers on held-out prompts", "",
             "Greedy and bounded, prompted in the chat format the model was trained on "
             "(the one the export carries).", ""]
    for number, entry in enumerate(record.prompts, start=1):
        lines += [f"### Prompt {number}", "",
                  *_fenced(_shortened(entry.prompt, _PROMPT_SHOWN, tail=True)), ""]
        lines += _answer_block(reference, entry.reference, "none")
        lines += _answer_block(base.capitalize(), entry.base, "not recorded")
        lines += _answer_block(tuned.capitalize(), entry.tuned,
                               "not yet: answered after the last step")
    return lines


def write(output_dir: Path, summary: dict | None = None, state: str = "in progress") -> Path:
    output_dir = Path(output_dir)
    steps = loss_steps(output_dir)
    if steps:
        write_curves(output_dir, steps)
    path = output_dir / RUN_REPORT_NAME
    write_atomic(path, render(output_dir, steps, summary, state))
    return path


def on_checkpoint(output_dir: Path, rank: int) -> None:
    """After a resumable checkpoint's save, inside the recipe: the report of the run so
    far (rank 0).
    A report that cannot be written costs a warning, never the run."""
    if rank != 0:
        return
    try:
        steps = loss_steps(output_dir)
        last = f" at step {steps[-1]['step']}" if steps else ""
        write(output_dir, state=f"in progress: checkpoint saved{last}")
    except Exception as exc:
        log.warning("run report not written: %s", exc)


def at_end(output_dir: Path, summary: dict) -> None:
    """At the end, from the launcher, with the run's summary."""
    try:
        write(output_dir, summary, state=f"{summary.get('exit_reason')}")
    except Exception as exc:
        log.warning("run report not written: %s", exc)
