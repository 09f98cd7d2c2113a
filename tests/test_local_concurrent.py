"""Two runs on one work directory: the second `kubetune local`, or a second trainer on the
same output_dir, fails at once with one line naming the directory and who holds it (exit
75: it works once the first is done), and touches nothing of the first's, which logs each
step once. A run killed with `kill -9` leaves nothing that blocks the next."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetune.errors import EXIT_TRANSIENT
from tests.support import warm_start
from tests.support.cli import REPO, clean_env, error_lines
from tests.support.processes import assert_no_orphans, processes_mentioning

pytestmark = pytest.mark.slow

TRAIN_ARGS = [
    "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train", "epochs=1",
    "max_steps_per_epoch=6", "batch_size=4", "gradient_accumulation_steps=1",
    "optimizer.lr=3e-3", "lr_scheduler.num_warmup_steps=2", "model.lora_rank=8",
    "model.lora_alpha=16", "seed=0",
]


def local_command(workdir: Path) -> list[str]:
    return [sys.executable, "-m", "kubetune.entrypoints", "local", "--workdir", str(workdir),
            *TRAIN_ARGS]


def start_local(tmp_path: Path, workdir: Path) -> subprocess.Popen:
    with open(tmp_path / "first.out", "w") as out, open(tmp_path / "first.err", "w") as err:
        # Cold: the test stops the first run's processes, found by their command lines.
        return subprocess.Popen(local_command(workdir), env=warm_start.cold(clean_env()),
                                cwd=REPO, stdout=out, stderr=err)


def logged_steps(output: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text()
            .splitlines()]


def freeze_training(tmp_path: Path, proc: subprocess.Popen, workdir: Path) -> list[int]:
    """Wait for the first run's trainer to log a step, then stop its processes (SIGSTOP):
    however fast this machine, it is still training, holding its locks, while the test
    starts the second run. Returns what it stopped."""
    metrics = workdir / "workspace" / "output" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"training never started: exit {proc.poll()}, "
                        f"{(tmp_path / 'first.err').read_text()[-3000:]}")
        time.sleep(0.1)
    stopped = [pid for pid, _ in processes_mentioning(str(workdir)) if pid != proc.pid]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    return stopped


def tree(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in directory.rglob("*") if p.is_file()}


def test_a_second_run_fails_at_once_and_the_first_logs_each_step_once(tmp_path):
    workdir = tmp_path / "run"
    first = start_local(tmp_path, workdir)
    stopped = freeze_training(tmp_path, first, workdir)
    try:
        output = workdir / "workspace" / "output"
        before = tree(workdir / "workspace")
        host = socket.gethostname()

        # A second `kubetune local` there: refused before any step starts.
        second = subprocess.run(local_command(workdir), env=clean_env(), cwd=REPO,
                                capture_output=True, text=True, timeout=300)
        lines = error_lines(second)
        assert second.returncode == EXIT_TRANSIENT, second.stdout[-2000:] + second.stderr
        assert lines == [f"error: local: workdir {workdir} is in use by another kubetune "
                         f"local (pid {first.pid} on {host}): wait for it to finish, or give "
                         "this run another --workdir"], second.stderr
        assert "Traceback" not in second.stderr and "==>" not in second.stdout

        # A second trainer on the same output_dir (by hand, or a pod restarted while the
        # old one still saves): refused, naming the trainer that holds it.
        from kubetune.entrypoints.local import demo_sources, pipeline

        model_uri, dataset_uri = demo_sources(workdir / "sources")
        trainer = pipeline(workdir, model_uri, dataset_uri, "lora", TRAIN_ARGS, None)[1][0]
        launcher = [pid for pid, cmd in processes_mentioning(str(workdir))
                    if "kubetune.entrypoints.tune" in cmd and pid in stopped]
        assert len(launcher) == 1, processes_mentioning(str(workdir))
        term = tmp_path / "trainer-termination-log"
        again = subprocess.run(trainer.command, env=clean_env(
            **trainer.env, KUBETUNE_TERMINATION_LOG=str(term)), cwd=REPO,
            capture_output=True, text=True, timeout=300)
        lines = error_lines(again)
        assert again.returncode == EXIT_TRANSIENT, again.stdout[-2000:] + again.stderr
        assert lines == [f"error: trainer: output_dir {output} is in use by another trainer "
                         f"(pid {launcher[0]} on {host}): wait for it to finish, or give this "
                         "run another output_dir"], again.stderr
        assert term.read_text().strip() == lines[0].removeprefix("error: ")
        assert tree(workdir / "workspace") == before  # nothing of the first's touched
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)

    assert first.wait(timeout=300) == 0, (tmp_path / "first.err").read_text()[-3000:]
    assert logged_steps(output) == list(range(1, 7))
    assert (workdir / "workspace" / "export" / "manifest.json").is_file()


def test_a_run_killed_with_sigkill_does_not_block_the_next(tmp_path):
    workdir = tmp_path / "run"
    first = start_local(tmp_path, workdir)
    freeze_training(tmp_path, first, workdir)
    first.kill()  # kill -9: no handler runs, no lock file is removed
    first.wait()
    # Its steps go with it: the kernel kills them when their parent dies.
    assert_no_orphans(workdir)

    second = subprocess.run(local_command(workdir), env=clean_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert logged_steps(workdir / "workspace" / "output") == list(range(1, 7))
