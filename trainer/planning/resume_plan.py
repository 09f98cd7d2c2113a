"""Whether a run continues an earlier one: its fingerprint (the config and what the
initializers fetched), the earlier run of the same one to resume, and why one found is
not resumed."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from kubetune.workspace import TRAINER_CONFIG_NAME
from kubetune.workspace.initializer_manifest import InitializerManifest
from kubetune.workspace.trainer_output import parse_config, read_config_text
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.config.saved_config import as_planned, without_credentials

def _not_resumed(earlier: resume.ResumeRecord, cfg: DictConfig) -> str:
    """Why a restart does not continue the checkpoint it finds: never silently."""
    saved = as_planned(parse_config(read_config_text(Path(cfg.output_dir), TRAINER_CONFIG_NAME)))
    changes = resume.config_changes(saved, without_credentials(cfg)) if saved else ""
    where = Path(cfg.output_dir) / (earlier.checkpoint or earlier.epoch_dir)
    return (f"not resuming from {where} ({earlier.epochs_run} epoch(s) + "
            f"{earlier.steps_in_epoch} step(s), global step {earlier.global_step}): the "
            "config changed since it was saved"
            f"{f' ({changes})' if changes else ''}; starting over (the same config as then "
            "would resume)")


def inputs_digest(model_dir: Path, dataset_dir: Path, teacher_dir: Path | None = None) -> str:
    """What the initializers fetched into ``model_dir``, ``dataset_dir`` and a
    distillation run's ``teacher_dir``, by content ("" where none left a manifest: a
    directory given by hand): another teacher is another run, never a resumed one."""
    trees = [("model", model_dir), ("dataset", dataset_dir)]
    trees += [("teacher", teacher_dir)] if teacher_dir is not None else []
    digests = [(name, InitializerManifest.read(tree).content_digest()) for name, tree in trees]
    return " ".join(f"{name}={digest}" for name, digest in digests if digest)


def resume_or_start(cfg: DictConfig, notes: list[str], inputs: str):
    """The run's fingerprint (the config and ``inputs``), and the earlier run of the same
    one to resume, if any."""
    cfg.resume_from_checkpoint = False
    fingerprint = resume.fingerprint(cfg, inputs)
    cfg.kubetune.fingerprint = fingerprint
    cfg.kubetune.inputs = inputs  # the next run in this output_dir says which changed
    earlier = resume.read_record(Path(cfg.output_dir))
    resumed = resume.apply(cfg, Path(cfg.output_dir), fingerprint)
    if resumed is None and earlier is not None and earlier.fingerprint != fingerprint:
        notes.append(_not_resumed(earlier, cfg))
    if resumed is not None:
        cfg.kubetune.resume_steps_in_epoch = resumed.steps_in_epoch
        notes.append(f"resuming from {Path(cfg.output_dir) / resumed.epoch_dir}: "
                     f"{resumed.epochs_run} epoch(s) + {resumed.steps_in_epoch} step(s) done "
                     f"(global step {resumed.global_step}, saved on {resumed.reason})")
    return fingerprint, resumed
