"""Run kubetune's commands the way a pod does: a fresh process with an environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment minus anything kubetune or Kubeflow would read."""
    prefixes = ("KUBETUNE_", "PET_", "HF_", "AWS_")
    names = {"STORAGE_URI", "OUTPUT_PATH", "ACCESS_TOKEN", "IGNORE_PATTERNS", "ALLOW_PATTERNS",
             "REVISION", "ENDPOINT", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION",
             "ROLE_ARN", "EXPORT_URI", "EXPORT_FORMAT"}
    env = {k: v for k, v in os.environ.items()
           if k not in names and not k.startswith(prefixes)}
    env.update(extra)
    return env


def kubetune(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 600, umask: int = -1) -> subprocess.CompletedProcess:
    """``umask``: the child's (-1: this process's)."""
    return subprocess.run([sys.executable, "-m", "kubetune.entrypoints", *args], env=env or clean_env(),
                          cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout,
                          umask=umask)


def tune(*args: str, env: dict[str, str] | None = None, timeout: float = 600
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubetune.entrypoints.tune", *args],
                          env=env or clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]
