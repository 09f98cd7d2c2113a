"""`kubetune local` under signals: a SIGTERM reaches the running steps as the kubelet's
would, and a step killed by a signal is reported with the signal's name and 128 + N.
Ctrl-C on `kubetune local | tee log` (which kills tee too) or `| head -1`, a SIGTERM, a
closed terminal: the steps stop as in a pod, and none outlives `kubetune local`."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubetune.errors import EXIT_TRANSIENT
from kubetune.tools.local.steps import Step, run_process
from kubetune.trainer.checkpointing import resume
from tests.support import warm_start
from tests.support.cli import REPO, clean_env, error_lines
from tests.support.processes import assert_no_orphans, processes_mentioning

pytestmark = pytest.mark.slow

# Enough steps that a signal lands mid-training (the run is stopped long before its end).
TRAIN_ARGS = [
    "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train", "epochs=2",
    "max_steps_per_epoch=40", "batch_size=4", "gradient_accumulation_steps=1",
    "optimizer.lr=3e-3", "lr_scheduler.num_warmup_steps=2", "model.lora_rank=8",
    "model.lora_alpha=16", "seed=0",
]


def local_env(term: Path) -> dict[str, str]:
    # Cold: what these tests check is processes, their signals and what `ps` shows left.
    return warm_start.cold(clean_env(KUBETUNE_TERMINATION_LOG=str(term)))


def start_local(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    workdir = tmp_path / "run"
    term = tmp_path / "termination-log"
    log = tmp_path / "local.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubetune.entrypoints", "local", "--workdir", str(workdir),
             *TRAIN_ARGS], env=local_env(term), cwd=REPO,
            stdout=out, stderr=subprocess.PIPE, text=True)
    return proc, workdir, term


def wait_for_training(proc: subprocess.Popen, workdir: Path, steps: int = 3) -> None:
    metrics = workdir / "workspace" / "output" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"training never reached step {steps}: exit {proc.poll()}, "
                f"{proc.stderr.read()[-2000:]}")


def test_sigterm_to_local_stops_the_trainer_with_a_resumable_checkpoint(tmp_path):
    proc, workdir, term = start_local(tmp_path)
    wait_for_training(proc, workdir)
    proc.send_signal(signal.SIGTERM)  # what the kubelet sends a pod on eviction
    _, stderr = proc.communicate(timeout=240)
    log = (tmp_path / "local.log").read_text()
    assert proc.returncode == EXIT_TRANSIENT, log[-3000:] + stderr[-2000:]
    # Stopped as asked, not failed; and the way back is the same command.
    assert f"==> trainer: stopped by SIGTERM (exit {EXIT_TRANSIENT})" in log
    assert "==> exporter:" not in log  # nothing starts after a stop
    lines = error_lines(subprocess.CompletedProcess([], proc.returncode, "", stderr))
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert lines[0].startswith("error: local: trainer: stopped by SIGTERM; resumable "
                               "checkpoint ")
    assert lines[0].endswith(": run the same command to resume"), lines[0]
    assert term.read_text().strip() == lines[0].removeprefix("error: ")
    output = workdir / "workspace" / "output"
    saved = [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text()
             .splitlines()]
    assert saved and saved[-1] < 80  # stopped, not run to its end
    assert not (output / "kubetune-complete.json").exists()
    assert_no_orphans(workdir)


def test_a_step_killed_by_sigkill_is_named_and_exits_128_plus_9(tmp_path):
    proc, workdir, term = start_local(tmp_path)
    wait_for_training(proc, workdir)
    launchers = [pid for pid, cmd in processes_mentioning(str(workdir))
                 if "kubetune.entrypoints.tune" in cmd]
    assert len(launchers) == 1, processes_mentioning(str(workdir))
    os.kill(launchers[0], signal.SIGKILL)  # the OOM killer's way
    _, stderr = proc.communicate(timeout=240)
    log = (tmp_path / "local.log").read_text()
    assert proc.returncode == 128 + signal.SIGKILL, log[-3000:] + stderr[-2000:]
    assert "==> trainer: FAILED (exit 137)" in log and "==> exporter:" not in log
    lines = error_lines(subprocess.CompletedProcess([], proc.returncode, "", stderr))
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert lines[0].startswith("error: local: trainer: killed by SIGKILL (exit 137)"), lines
    assert term.read_text().strip() == lines[0].removeprefix("error: ")
    assert_no_orphans(workdir)


@pytest.mark.parametrize("in_container, script, report", [
    (False, "kill -TERM $$", "stopped by SIGTERM (exit 143)"),
    # `podman run` / `docker run` exit 128 + N when their container dies of signal N.
    (True, "exit 143", "stopped by SIGTERM (exit 143)"),
    (True, "exit 137", "killed by SIGKILL (exit 137): the OOM killer, or a kill from outside"),
    # A process's own exit code 143 is no signal: it would have died of it.
    (False, "exit 143", "exited with code 143"),
], ids=["process-signal", "container-sigterm", "container-sigkill", "process-exit-143"])
def test_a_step_ended_by_a_signal_is_named_alike_for_processes_and_containers(
        tmp_path, in_container, script, report):
    result = run_process(Step("trainer", ["sh", "-c", script], in_container=in_container),
                         tmp_path)
    assert (result.exit_code, result.error) == (143 if "143" in report else 137, report)


def start_piped(tmp_path: Path, reader: list[str]) -> tuple[subprocess.Popen, Path]:
    """`kubetune local ... | READER` as a shell runs a job: both in one new process group
    (the one a terminal's Ctrl-C or hang-up signals), the reader on kubetune's stdout."""
    workdir = tmp_path / "run"
    term = tmp_path / "termination-log"
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubetune.entrypoints", "local", "--workdir", str(workdir),
             *TRAIN_ARGS], env=local_env(term), cwd=REPO,
            stdout=subprocess.PIPE, stderr=stderr, process_group=0)
    with open(tmp_path / "reader.out", "w") as out:
        subprocess.Popen(reader, stdin=proc.stdout, stdout=out, cwd=tmp_path,
                         process_group=proc.pid)
    proc.stdout.close()  # the reader's alone now: when it goes, the pipe is broken
    return proc, workdir


@pytest.mark.parametrize("reader, signum, to_group", [
    (["tee", "log"], signal.SIGINT, True),  # Ctrl-C: tee dies with it
    (["head", "-1"], signal.SIGINT, True),  # the pipe broken long before the Ctrl-C
    (["head", "-1"], signal.SIGTERM, False),  # `kill PID`
    (["tee", "log"], signal.SIGHUP, True),  # the terminal closed
], ids=["ctrl-c-tee", "ctrl-c-head", "sigterm-head", "sighup-tee"])
def test_a_stop_with_stdout_gone_stops_every_step_and_the_trainer_saves(
        tmp_path, reader, signum, to_group):
    proc, workdir = start_piped(tmp_path, reader)
    output = workdir / "workspace" / "output"
    deadline = time.monotonic() + 300
    while not ((output / "metrics.jsonl").is_file()
               and len((output / "metrics.jsonl").read_text().splitlines()) >= 3):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"training never reached step 3: exit {proc.poll()}, "
                        f"{(tmp_path / 'stderr').read_text()[-3000:]}")
        time.sleep(0.1)
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    code = proc.wait(timeout=240)
    stderr = (tmp_path / "stderr").read_text()
    # Stopped as in a pod: the trainer saved within its grace period and exited 75.
    assert code == EXIT_TRANSIENT, stderr[-3000:]
    lines = error_lines(subprocess.CompletedProcess([], code, "", stderr))
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith("error: local: trainer: ") and "resumable checkpoint" in lines[0]
    assert (tmp_path / "termination-log").read_text().strip() == lines[0].removeprefix("error: ")
    assert resume.read_record(output) is not None
    assert not (output / "kubetune-complete.json").exists()
    assert not (workdir / "workspace" / "export").exists()  # nothing starts after a stop
    assert (tmp_path / "reader.out").read_text()  # it did read, before it went
    assert_no_orphans(workdir)


def test_ctrl_c_under_tee_names_sigint_on_the_users_terminal(tmp_path):
    """`kubetune local ... 2>&1 | tee log` in a terminal, then Ctrl-C: tee dies with it,
    and the last line still reaches the terminal, naming SIGINT and the way back."""
    workdir, term = tmp_path / "run", tmp_path / "termination-log"
    command = [sys.executable, "-m", "kubetune.entrypoints", "local", "--workdir",
               str(workdir), *TRAIN_ARGS]
    pid, terminal = pty.fork()  # the child's controlling terminal: this pty
    if pid == 0:
        os.chdir(REPO)
        os.execve("/bin/bash", ["bash", "-c", f"{shlex.join(command)} 2>&1 | tee "
                                f"{shlex.quote(str(tmp_path / 'log'))}"],
                  local_env(term))
    shown: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # EIO: every process holding the terminal has gone
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        metrics = workdir / "workspace" / "output" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert time.monotonic() < deadline, b"".join(shown)[-3000:]
            time.sleep(0.1)
        os.write(terminal, b"\x03")  # Ctrl-C: the terminal signals its foreground group
        deadline = time.monotonic() + 240
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, b"".join(shown)[-3000:]
            time.sleep(0.1)
        reader.join(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(terminal)
    seen = b"".join(shown).decode("utf-8", "replace").replace("\r\n", "\n")
    # The terminal echoes the keystroke as "^C" where its line happened to be.
    lines = [line.removeprefix("^C") for line in seen.splitlines()
             if line.removeprefix("^C").startswith("error: ")]
    assert len(lines) == 1, seen[-3000:]
    assert lines[0].startswith("error: local: trainer: stopped by SIGINT (Ctrl-C); "
                               "resumable checkpoint "), lines[0]
    assert lines[0].endswith(": run the same command to resume"), lines[0]
    assert term.read_text().strip() == lines[0].removeprefix("error: ")
    assert resume.read_record(workdir / "workspace" / "output") is not None
    assert_no_orphans(workdir)
