"""Atomic checkpoints around torchtune's checkpointer (rank 0, inside the recipe process).

torchtune's checkpointer writes in place: ``output_dir/epoch_N/`` (weights, adapter,
configs) and ``output_dir/recipe_state/recipe_state.pt``, file after file. A kill between
two of those writes leaves a mix of two saves that still looks complete. So each save is
redirected, unchanged otherwise:

1. ``begin``: the checkpointer's output directory is pointed at a fresh staging directory,
   ``output_dir/.kubetune-checkpoint-staging/`` (same volume, so renames are atomic),
   for the length of one save; whatever an earlier killed save left there is deleted.
2. torchtune writes its files there as it always does.
3. ``commit``: every staged file and directory is fsynced and listed with its size. A
   resumable save is renamed to ``checkpoints/<name>/``; an epoch's save is also
   published as ``output_dir/epoch_N/`` (hard links of the same files, swapped in by
   rename), where users and the exporter look. Then, last, ``kubetune-resume.json``
   (``kubetune.trainer.checkpointing.resume``) is replaced atomically to name the new checkpoint and its files;
   only then are older checkpoints deleted.

So at every instant the record names a checkpoint that was fsynced whole before the record
was written: the previous good one until the new one is vouched for. A kill at any point
leaves at worst an unvouched staging or checkpoint directory, which the next save deletes;
the restart resumes from the record's checkpoint (``resume.apply`` re-checks every listed
file's size). The final epoch's save (no recipe state) is published as ``epoch_N/`` only.

``KUBETUNE_TEST_KILL_AT=N`` (tests only) SIGKILLs the process at the N-th write point of
this process's saves: each file torchtune writes (killed after half its bytes) and each
step of ``commit``, so a test can show that a kill at any of them loses nothing.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
from pathlib import Path

from kubetune.atomic_write import fsync_path, umask_mode
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.recipe_process import passed_env

STAGING_NAME = ".kubetune-checkpoint-staging"
_OLD_SUFFIX = ".kubetune-old"


def staged_files(root: Path) -> dict[str, int]:
    """fsync every file and directory under ``root``, each file with the umask's mode;
    return each file's size by path."""
    files: dict[str, int] = {}
    # torchtune's safetensors weights are written 0600 (safetensors' own temporary file):
    # the exporter or a serving pod running as another uid must read them too.
    mode = umask_mode()
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.stat().st_mode & 0o777 != mode:
                path.chmod(mode)
            fsync_path(path)
            files[path.relative_to(root).as_posix()] = path.stat().st_size
        fsync_path(Path(dirpath))
    return files


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` gets ``src``'s files as hard links (a copy where the volume has none)."""
    try:
        shutil.copytree(src, dest, copy_function=os.link)
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)


def publish_dir(src: Path, dest: Path) -> None:
    """Put the directory ``src`` at ``dest``, replacing what is there, by renames."""
    old = dest.with_name(dest.name + _OLD_SUFFIX)
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(src, dest)
    fsync_path(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


class CheckpointStore:
    """Stages, commits and prunes the checkpoints of one output directory."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)
        self.staging = self.output_dir / STAGING_NAME
        self.kill_hook = KillHook.from_env()

    def begin(self) -> Path:
        # Whatever a killed save left: never vouched for, never read.
        for leftover in [self.staging, *self.output_dir.glob(".kubetune-epoch_*-staging"),
                         *self.output_dir.glob(f"epoch_*{_OLD_SUFFIX}")]:
            shutil.rmtree(leftover, ignore_errors=True)
        self.staging.mkdir(parents=True)
        return self.staging

    def commit(self, record: resume.ResumeRecord, epoch: int, resumable: bool,
               publish_epoch: bool) -> None:
        """Make the staged save durable; publish and vouch for it as asked (see above)."""
        epoch_name = f"epoch_{epoch}"
        files = staged_files(self.staging)
        self.kill_hook.point("staged files fsynced")
        if not resumable:
            publish_dir(self.staging / epoch_name, self.output_dir / epoch_name)
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        current = resume.read_record(self.output_dir)
        name = self._new_name(record.global_step, current)
        checkpoints = self.output_dir / resume.CHECKPOINTS_DIR
        checkpoints.mkdir(exist_ok=True)
        shutil.rmtree(checkpoints / name, ignore_errors=True)  # an unvouched leftover
        os.replace(self.staging, checkpoints / name)
        fsync_path(checkpoints)
        self.kill_hook.point("checkpoint renamed into place")
        if publish_epoch:
            linked = self.output_dir / f".kubetune-{epoch_name}-staging"
            shutil.rmtree(linked, ignore_errors=True)
            _link_tree(checkpoints / name / epoch_name, linked)
            publish_dir(linked, self.output_dir / epoch_name)
            self.kill_hook.point(f"{epoch_name} published")
        record.checkpoint = f"{resume.CHECKPOINTS_DIR}/{name}"
        record.epoch_dir = f"{record.checkpoint}/{epoch_name}"
        record.files = files
        resume.write_record(self.output_dir, record)
        self.kill_hook.point("resume record written")
        for old in checkpoints.iterdir():
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)

    def _new_name(self, global_step: int, current: resume.ResumeRecord | None) -> str:
        vouched = Path(current.checkpoint).name if current is not None else None
        name, n = f"step_{global_step:07d}", 0
        while name == vouched:  # never overwrite the checkpoint the record names
            n += 1
            name = f"step_{global_step:07d}.{n}"
        return name


class KillHook:
    """Tests only: SIGKILL this process at its N-th checkpoint write point."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.count = 0
        if kill_at:
            self._wrap_writers()

    @classmethod
    def from_env(cls) -> "KillHook":
        return cls(passed_env.test_kill_at())

    def point(self, what: str, partial: tuple[Path, bytes] | None = None) -> None:
        if not self.kill_at:
            return
        self.count += 1
        if self.count != self.kill_at:
            return
        if partial is not None:  # die in the middle of the file, as a real kill would
            path, data = partial
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
        print(f"KUBETUNE_TEST_KILL_AT={self.kill_at}: killing the trainer at {what}",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def _wrap_writers(self) -> None:
        """Route torchtune's checkpoint file writes through ``point``."""
        import safetensors.torch
        import torch
        from torchtune.training.checkpointing import _checkpointer

        hook = self
        torch_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                buffer = io.BytesIO()
                torch_save(obj, buffer, *args, **kwargs)
                hook.point(f"writing {f}", (Path(f), buffer.getvalue()))
            return torch_save(obj, f, *args, **kwargs)

        def save_file(tensors, filename, metadata=None):
            data = safetensors.torch.save(tensors, metadata=metadata)
            hook.point(f"writing {filename}", (Path(filename), data))
            Path(filename).write_bytes(data)

        copy_files = _checkpointer.copy_files

        def copy(*args, **kwargs):
            hook.point("copying the model's config files")
            return copy_files(*args, **kwargs)

        torch.save = save
        _checkpointer.save_file = save_file
        _checkpointer.copy_files = copy
