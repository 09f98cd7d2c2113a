"""Resumable checkpoints: the record that vouches for one, and resuming from it.

torchtune saves the weights (``epoch_N/``) and the recipe state (``recipe_state/``:
optimizer, epoch, seed) but nothing that says *which run* they belong to or whether they
were written whole. ``kubetune.trainer.checkpointing.checkpoint_store`` stages each resumable save and renames it
into ``checkpoints/<name>/``; then, last, ``kubetune-resume.json`` is written beside them:
the fingerprint of the merged config, the training position (epochs, steps into the
unfinished epoch, global step) and every file of the checkpoint with its size. A restart
resumes only from a checkpoint the record vouches for: same fingerprint (a changed job
never continues a different one's weights), every listed file present with its size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from omegaconf import DictConfig, OmegaConf

from kubetune.atomic_write import write_atomic

log = logging.getLogger("trainer")

RESUME_RECORD_NAME = "kubetune-resume.json"
CHECKPOINTS_DIR = "checkpoints"  # resumable checkpoints, one directory each
RECIPE_STATE_FILE = "recipe_state/recipe_state.pt"  # torchtune's name, inside a checkpoint
ADAPTER_FILE = "adapter_model.pt"  # what torchtune's LoRA recipes resume from
# Settings that do not change what is trained, so a restart with them changed resumes.
_VOLATILE_KEYS = ("kubetune", "resume_from_checkpoint", "metric_logger", "log_every_n_steps",
                  "profiler", "output_dir")
_VOLATILE_CHECKPOINTER_KEYS = ("adapter_checkpoint", "recipe_checkpoint",
                               "resume_from_checkpoint", "should_load_recipe_state",
                               "checkpoint_files", "output_dir")


@dataclass
class ResumeRecord:
    fingerprint: str
    epochs_run: int  # epochs finished (torchtune's EPOCHS_KEY)
    steps_in_epoch: int  # optimizer steps done in the unfinished epoch
    global_step: int  # optimizer steps done in all
    epoch_dir: str  # the weights or adapter, relative to output_dir
    adapter: bool  # LoRA-style: the base stays in the model dir, the adapter is in epoch_dir
    reason: str  # "epoch", "step" (periodic save) or "signal"
    checkpoint: str = ""  # the checkpoint's directory, relative to output_dir
    files: dict[str, int] = field(default_factory=dict)  # path in checkpoint -> size


def _what_is_trained(data: dict) -> dict:
    """``data`` (a config as a dict) without the settings that do not change what is
    trained."""
    data = dict(data)
    for key in _VOLATILE_KEYS:
        data.pop(key, None)
    if isinstance(data.get("checkpointer"), dict):
        data["checkpointer"] = {k: v for k, v in data["checkpointer"].items()
                                if k not in _VOLATILE_CHECKPOINTER_KEYS}
    return data


def fingerprint(cfg: DictConfig, inputs: str = "") -> str:
    """The run's identity: what the config trains, and ``inputs``, what the model and the
    data hold (the initializers' manifests, where they wrote them): the same paths with
    other files in them are another run."""
    data = _what_is_trained(OmegaConf.to_container(cfg, resolve=False))
    canonical = json.dumps(data, sort_keys=True, default=str) + (f"\n{inputs}" if inputs else "")
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _leaves(data: object, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        found: dict[str, object] = {}
        for key, value in data.items():
            found.update(_leaves(value, f"{prefix}{key}."))
        return found
    return {prefix.rstrip("."): data}


def config_changes(before: dict, after: DictConfig, most: int = 3) -> str:
    """``a.b: old -> new`` for the trained settings that differ, a few of them."""
    old = _leaves(_what_is_trained(before))
    new = _leaves(_what_is_trained(OmegaConf.to_container(after, resolve=False)))
    changed = [f"{key}: {old.get(key, '(unset)')} -> {new.get(key, '(unset)')}"
               for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    more = f" and {len(changed) - most} more" if len(changed) > most else ""
    return "; ".join(changed[:most]) + more


def write_record(output_dir: Path, record: ResumeRecord) -> None:
    write_atomic(Path(output_dir) / RESUME_RECORD_NAME, json.dumps(asdict(record), indent=2))


def read_record(output_dir: Path) -> ResumeRecord | None:
    path = Path(output_dir) / RESUME_RECORD_NAME
    try:
        return ResumeRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clear(output_dir: Path) -> None:
    """Forget every resumable checkpoint (the run finished, or starts over)."""
    (Path(output_dir) / RESUME_RECORD_NAME).unlink(missing_ok=True)
    shutil.rmtree(Path(output_dir) / CHECKPOINTS_DIR, ignore_errors=True)


def unvouched(output_dir: Path, record: ResumeRecord) -> str | None:
    """Why the checkpoint ``record`` names cannot be trusted, or None when it can."""
    if not record.checkpoint or RECIPE_STATE_FILE not in record.files:
        return "the record lists no checkpoint files (written by an older kubetune)"
    if not record.epoch_dir.startswith(record.checkpoint + "/"):
        return f"the record's {record.epoch_dir} is not inside {record.checkpoint}"
    root = Path(output_dir) / record.checkpoint
    for name, size in record.files.items():
        try:
            actual = (root / name).stat().st_size
        except OSError:
            return f"{record.checkpoint}/{name} is missing"
        if actual != size:
            return f"{record.checkpoint}/{name} has {actual} bytes, the record says {size}"
    return None


def apply(cfg: DictConfig, output_dir: Path, run_fingerprint: str) -> ResumeRecord | None:
    """Point ``cfg`` at the resumable checkpoint in ``output_dir`` if it is this run's
    (``run_fingerprint``: its `fingerprint`).

    Returns the record resumed from, or None (nothing to resume, another run's, or a
    checkpoint that is not whole).
    """
    record = read_record(output_dir)
    if record is None or record.fingerprint != run_fingerprint:
        return None
    problem = unvouched(output_dir, record)
    inside = PurePosixPath(record.epoch_dir).relative_to(record.checkpoint) \
        if problem is None else PurePosixPath()
    if problem is None and record.adapter and str(inside / ADAPTER_FILE) not in record.files:
        problem = f"the record lists no {ADAPTER_FILE}"
    shards = sorted(PurePosixPath(n).name for n in record.files
                    if PurePosixPath(n).parent == inside and n.endswith(".safetensors")
                    and not PurePosixPath(n).name.startswith("adapter"))
    if problem is None and not record.adapter and not shards:
        problem = "the record lists no model weights"
    if problem is not None:
        log.warning("not resuming from %s: %s; starting over", record.checkpoint or
                    record.epoch_dir, problem)
        return None
    cfg.resume_from_checkpoint = True
    # torchtune reads everything it resumes from relative to its checkpointer's output_dir
    # (and, for a full fine-tune, looks there for the newest epoch_N/): the checkpoint's
    # own directory. Saves never go there: each is staged (kubetune.trainer.checkpointing.checkpoint_store).
    cfg.checkpointer.output_dir = str(Path(output_dir) / record.checkpoint)
    if record.adapter:
        cfg.checkpointer.adapter_checkpoint = str(inside / ADAPTER_FILE)
    else:
        # Full fine-tuning resumes from the saved weights themselves.
        cfg.checkpointer.checkpoint_files = [str(inside / s) for s in shards]
    cfg.checkpointer.recipe_checkpoint = RECIPE_STATE_FILE
    # For the step guard in the recipe process: where in the run the checkpoint stands.
    cfg.kubetune.resume_steps_in_epoch = record.steps_in_epoch
    cfg.kubetune.resume_global_step = record.global_step
    return record


def trim_metrics(metrics_path: Path, global_step: int) -> None:
    """Drop the metrics of steps after the checkpoint: the resumed run logs them again."""
    try:
        lines = Path(metrics_path).read_text().splitlines(keepends=True)
    except OSError:
        return
    kept = []
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(step, int) and step <= global_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return
    write_atomic(metrics_path, "".join(kept))
