"""What a recipe process reads from the environment torchrun and the launcher gave it, in
one place: its rank, whether torchrun started it and how many processes share the node,
the launcher's stop file and quiet progress bars, the compile backend, and the test-only
hooks (inert unless set).

These are not the user's settings (the launcher parsed those into the merged config's
``kubetune`` section): they are how the processes above this one speak to it, so they are
read where the process needs them, from the environment it was started with."""

from __future__ import annotations

import os
from typing import Mapping

from kubetune import env
from kubetune.env_numbers import env_float

DEFAULT_COMPILE_BACKEND = "inductor"  # torchtune's, when TORCH_COMPILE_BACKEND is unset


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    # This process's own environment, as torchrun and the launcher set it.
    return os.environ if environ is None else environ


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank (torchrun's ``RANK``; 0 for a single-device recipe)."""
    return int(_environ(environ).get(env.RANK, "0"))


def is_primary(environ: Mapping[str, str] | None = None) -> bool:
    """Rank 0: the one process that reports (progress, the status, cut samples)."""
    return _environ(environ).get(env.RANK, "0") == "0"


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Processes of this run on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 without)."""
    value = _environ(environ).get(env.LOCAL_WORLD_SIZE, "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def under_torchrun() -> bool:
    """Started as a process-group worker: by torchrun, or by the launcher for a
    one-process group (either sets ``LOCAL_RANK``)."""
    return _environ(None).get(env.LOCAL_RANK) is not None


def progress_bars_off() -> bool:
    """The launcher asked for no tqdm bars (our metric logger reports progress)."""
    return _environ(None).get(env.TQDM_DISABLE) == "1"


def progress_tty(environ: Mapping[str, str] | None = None) -> str | None:
    """The launcher's terminal, passed down for the live progress bar; None: no terminal."""
    return _environ(environ).get(env.PROGRESS_TTY) or None


def stop_file() -> str | None:
    """The file whose existence asks the recipe to stop at the next step."""
    return _environ(None).get(env.STOP_FILE)


def compile_backend() -> str:
    """The backend torchtune's compile helpers use (and so the compile probe)."""
    return _environ(None).get(env.TORCH_COMPILE_BACKEND, DEFAULT_COMPILE_BACKEND)


def test_failing_compile_backend() -> str | None:
    """Tests only: the name of a dynamo backend to register that raises."""
    return _environ(None).get(env.TEST_FAILING_COMPILE_BACKEND) or None


def test_oom_above_batch() -> str | None:
    """Tests only: a micro-batch above this raises ``torch.OutOfMemoryError``."""
    return _environ(None).get(env.TEST_OOM_ABOVE_BATCH) or None


def test_kill_at() -> int | None:
    """Tests only: SIGKILL at the N-th checkpoint write."""
    value = _environ(None).get(env.TEST_KILL_AT, "")
    return int(value) if value.isdigit() else None


def failure_dir() -> str | None:
    """Where this process leaves its failure record if it fails for a known reason
    (``kubetune.trainer.failures``); None: not started by the launcher, no record."""
    return _environ(None).get(env.FAILURE_DIR) or None


def test_kill_token_cache_at() -> str | None:
    """Tests only: the point of a token cache build at which its builder SIGKILLs itself."""
    return _environ(None).get(env.TEST_KILL_TOKEN_CACHE_AT) or None


def test_step_pause() -> float:
    """Tests only: seconds to pause after each optimizer step (0: none)."""
    return env_float(env.TEST_STEP_PAUSE, 0.0, minimum=0.0, environ=_environ(None))
