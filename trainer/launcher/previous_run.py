"""Another run's output in the output_dir a fresh run is about to write: named in one
line ("a new run: …", what changed) and moved aside whole, so nothing stale stays beside
the new run's output (an earlier, longer run's ``epoch_2/`` beside this run's ``epoch_0/``
is where the exporter or a reader would take the wrong weights).

Called only for a run that neither resumes nor finds itself complete: the same config and
inputs resume (or are done) instead. Output of this same run (its fingerprint in the
marker, the resume record or the saved config: a restart after a kill before any save was
vouched for) is not another run's and stays. The earlier output is kept, not deleted, beside the
output_dir as ``<output_dir>.previous-<UTC time>/`` (inside it, hidden, where the parent
is not ours to write or is another filesystem: an output_dir that is a mount)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from kubetune.workspace import COMPLETION_MARKER_NAME, TRAINER_CONFIG_NAME, TRAINER_LOCK_NAME
from kubetune.workspace.trainer_output import (completed_fingerprint, parse_config,
                                               read_config_text)
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.config.saved_config import as_planned, without_credentials
from kubetune.trainer.planning.plan import RunPlan

log = logging.getLogger("trainer")

PREVIOUS_SUFFIX = ".previous-"


def _earlier_output(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds what a run trains: weights, checkpoints, its record."""
    return any((output_dir / name).exists() for name in (
        COMPLETION_MARKER_NAME, resume.RESUME_RECORD_NAME, resume.CHECKPOINTS_DIR)) or any(
        p.is_dir() for p in output_dir.glob("epoch_*"))


def _earlier_fingerprint(output_dir: Path) -> str | None:
    """Whose output it is: the completion marker's run, else the resume record's, else
    the saved config's (None: no record of ours says)."""
    record = resume.read_record(output_dir)
    saved = parse_config(read_config_text(output_dir, TRAINER_CONFIG_NAME))
    return (completed_fingerprint(output_dir) or (record.fingerprint if record else None)
            or (saved.get("kubetune") or {}).get("fingerprint"))


def _method_before(output_dir: Path) -> str | None:
    try:
        return json.loads((output_dir / COMPLETION_MARKER_NAME).read_text()).get("method")
    except (OSError, ValueError, AttributeError):
        return None


def _inputs(text: object) -> dict[str, str]:
    return dict(part.split("=", 1) for part in str(text or "").split() if "=" in part)


def what_changed(plan_: RunPlan) -> str:
    """The differences between the earlier run in plan_.output_dir and this one, a few."""
    output_dir = plan_.output_dir
    saved = as_planned(parse_config(read_config_text(output_dir, TRAINER_CONFIG_NAME)))
    changes = []
    method = _method_before(output_dir)
    if method and method != plan_.method:
        changes.append(f"method {method} -> {plan_.method}")
    before = _inputs((saved.get("kubetune") or {}).get("inputs"))
    now = _inputs(plan_.cfg.kubetune.get("inputs"))
    changes += [f"the {name}'s files changed" for name in ("model", "dataset")
                if before.get(name) and now.get(name) and before[name] != now[name]]
    # Against the config as saved (URL credentials masked): this line goes to the log.
    settings = resume.config_changes(saved, without_credentials(plan_.cfg)) if saved else ""
    changes += [settings] if settings else []
    return "; ".join(changes) or "another config or inputs"


def _destination(output_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    parent = output_dir.resolve().parent
    beside = (os.access(parent, os.W_OK)
              and parent.stat().st_dev == output_dir.stat().st_dev)
    base = parent / f"{output_dir.name}{PREVIOUS_SUFFIX}{stamp}" if beside \
        else output_dir / f"{PREVIOUS_SUFFIX.lstrip('-')}{stamp}"
    dest, n = base, 1
    while dest.exists():
        dest, n = base.with_name(f"{base.name}-{n}"), n + 1
    return dest


def set_aside(plan_: RunPlan) -> Path | None:
    """Move another run's output out of plan_.output_dir (rank 0's node, holding the
    output_dir's lock); the place it went, or None when there was none."""
    output_dir = plan_.output_dir
    if not output_dir.is_dir() or not _earlier_output(output_dir):
        return None
    if _earlier_fingerprint(output_dir) == plan_.fingerprint:
        return None  # this run's own, cut short before its checkpoint was vouched for
    changed = what_changed(plan_)
    dest = _destination(output_dir)
    dest.mkdir()
    for entry in output_dir.iterdir():
        if entry.name != TRAINER_LOCK_NAME and entry != dest:
            entry.rename(dest / entry.name)
    log.info("a new run: %s; the earlier run's output in %s is moved to %s", changed,
             output_dir, dest)
    return dest
