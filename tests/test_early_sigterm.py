"""A SIGTERM just after a step starts (a pod evicted while it imports or plans) still
leaves the one line a user reads with `kubectl describe pod`: the termination log.

The signal is sent as soon as the process has a SIGTERM handler (its SigCgt mask in
/proc), or after one second if it never gets one that early (the old behaviour: Python's
default action, a silent exit).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import warm_start
from tests.support.cli import REPO, clean_env
from tests.support.trainer import make_pvc

TRANSIENT = 75


def catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def terminate_early(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    while not catches_sigterm(process.pid) and time.monotonic() - started < 1.0:
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize("how", ["tune run", "kubetune init-model"])
def test_a_sigterm_just_after_launch_leaves_one_termination_line(how, tmp_path, tiny_model_dir,
                                                                 tiny_dataset_dir):
    term = tmp_path / "termination-log"
    if how == "tune run":
        pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
        command = [sys.executable, "-m", "kubetune.entrypoints.tune", "run",
                   "lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                   "dataset=torchtune.datasets.instruct_dataset", *pvc.runtime_args()]
        env, term = pvc.env(), pvc.termination_log
        step = "trainer"
    else:
        command = [sys.executable, "-m", "kubetune.entrypoints", "init-model"]
        env = clean_env(STORAGE_URI=str(tiny_model_dir), OUTPUT_PATH=str(tmp_path / "model"),
                        KUBETUNE_TERMINATION_LOG=str(term))
        step = "model-initializer"
    # Cold: the subject is the process's start, which a warm start skips.
    result = terminate_early(command, warm_start.cold(env))
    assert result.returncode == TRANSIENT, (result.returncode, result.stderr[-2000:])
    assert term.is_file(), result.stderr[-2000:]
    [line] = term.read_text().splitlines()
    assert line.startswith(f"{step}: stopped by SIGTERM"), line
    assert f"error: {line}" in result.stderr
    assert "Traceback" not in result.stderr
    if how == "kubetune init-model":
        assert not (tmp_path / "model" / ".kubetune-manifest.json").exists()
