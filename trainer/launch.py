"""Run a planned training: write the merged config, run torchtune's recipe (through
``kubetune.trainer.recipe_process.bootstrap``) as a child, turn SIGTERM into a resumable stop, and record the
outcome (``summary.json``, then the completion marker, last)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from omegaconf import OmegaConf

from kubetune import env, file_lock
from kubetune.atomic_write import write_atomic
from kubetune.errors import BadInputError, KilledError, KubetuneError, TransientError
from kubetune.redact import SECRET_VARIABLES, redact, without_userinfo
from kubetune.restart_advice import restart_advice
from kubetune.workspace import (COMPLETION_MARKER_NAME, METRICS_NAME, SUMMARY_NAME,
                                TRAINER_CONFIG_NAME, TRAINER_LOCK_NAME, TRAINING_SAMPLES_NAME)
from kubetune.workspace.model_files import original_repo_id
from kubetune.workspace.trainer_output import (CompletionMarker, completed_fingerprint,
                                               read_marker)
from kubetune.logs import json_mode, wrap_foreign_line
from kubetune.parent_death import die_with_parent
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.metric_logging import run_report, train_progress
from kubetune.trainer.checkpointing.checkpoint_model import SPECIAL_TOKENS_FILE
from kubetune.trainer.config.plan import RunPlan
from kubetune.trainer.config.saved_config import has_credentials, without_credentials
from kubetune.trainer.metric_logging.summary import summarize
from kubetune.trainer.config.validate import check_volume, check_writable

log = logging.getLogger("trainer")

# Variables that keep every library in the recipe process off the network.
OFFLINE_ENV = {env.HF_HUB_OFFLINE: "1", env.HF_DATASETS_OFFLINE: "1", env.TRANSFORMERS_OFFLINE: "1",
               env.HF_HUB_DISABLE_TELEMETRY: "1", env.DO_NOT_TRACK: "1"}


def _child_env(plan_: RunPlan, stop_file: Path) -> dict[str, str]:
    # The recipe's environment is ours minus the secrets (what torchrun and the libraries
    # inside read, and passed_env's values, travel through it).
    # The recipe runs offline: it needs no credential, and a URL's user and password
    # (HF_ENDPOINT, ENDPOINT) would sit in its environment for any library to print.
    child = {k: without_userinfo(v) for k, v in os.environ.items() if k not in SECRET_VARIABLES
             and not k.endswith(tuple(f"{s}_FILE" for s in SECRET_VARIABLES))}
    child.update(OFFLINE_ENV)
    child.update(plan_.worker_env())
    child[env.STOP_FILE] = str(stop_file)
    child[env.PYTHONUNBUFFERED] = "1"
    # torchtune's own bars are off either way: our metric logger draws the one bar (in a
    # terminal, on the fd handed down) or prints a line per step.
    child[env.TQDM_DISABLE] = "1"
    child.pop(env.PROGRESS_TTY, None)
    if _terminal() is not None:
        child[env.PROGRESS_TTY] = _terminal()
    if plan_.cfg.device == "cpu" and plan_.topology.nproc_per_node > 1 \
            and env.OMP_NUM_THREADS not in child:
        # Share the cores between the processes instead of oversubscribing them.
        child[env.OMP_NUM_THREADS] = str(max(1, (os.cpu_count() or 1)
                                           // plan_.topology.nproc_per_node))
    return child


def _terminal() -> str | None:
    """The path of our stdout, when it is a terminal a person watches and lines are not
    asked for (JSON mode). The recipe draws its bar there directly: a bar redraws with
    carriage returns, which the line-by-line redacting pipe would hold back until the epoch
    ends. Only numbers the metric logger computes go that way; everything else still passes
    through redact. A path, not a descriptor: torchrun closes inherited descriptors when it
    starts its workers."""
    try:
        if sys.stdout.isatty() and not json_mode():
            return os.ttyname(sys.stdout.fileno())
    except (AttributeError, ValueError, OSError):
        pass
    return None


def _stream(pipe, sink, tail: collections.deque) -> None:
    for raw in iter(pipe.readline, b""):
        line = redact(raw.decode("utf-8", "replace"))
        sink.write(wrap_foreign_line("trainer", line))
        sink.flush()
        if line.strip():
            tail.append(line.rstrip())


# A job too big for its devices: the user's to fix, and a restart would fail the same way.
_OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory", "can't allocate memory")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s*")
# A speed default failed where it cannot fall back (the recipe process's fallbacks), or the
# run trained nothing, had nothing to train on or diverged (run_sanity): the message is
# already the user's line.
_USER_LINES = ("NoFallbackError: ", "NoStepError: ", "NonFiniteError: ",
               "NoTrainableRowsError: ")
# torchrun's own report of a failed worker: the worker's exception says more.
_WRAPPER_ERRORS = ("ChildFailedError", "SignalException")


# What a signal that kills the recipe usually means, and what to do about it.
_SIGNAL_MEANINGS = {
    signal.SIGKILL: "likely the out-of-memory killer: raise the container's memory limit "
                    "or lower batch_size / tokenizer.max_seq_len",
    signal.SIGSEGV: "a crash in native code (torch, a driver)",
    signal.SIGBUS: "a bus error, often a full /dev/shm: enlarge the pod's shm volume",
    signal.SIGABRT: "an abort in native code (torch, a driver)",
    signal.SIGTERM: "terminated by another process",
}
# torchrun's report of a failed worker ("exitcode  : -9 (pid: 123)"; negative: a signal).
_TORCHRUN_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def _killing_signal(code: int, tail: collections.deque) -> int | None:
    """The signal that killed the recipe, or under torchrun the worker that failed first
    (its report's root cause comes last; the workers torchrun then stopped come before)."""
    if code < 0:
        return -code
    for line in reversed(tail):
        match = _TORCHRUN_EXIT.search(line)
        if match:
            worker_code = int(match.group(1))
            return -worker_code if worker_code < 0 else None
    return None


def _killed_error(signum: int, recipe: str) -> KilledError:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    meaning = _SIGNAL_MEANINGS.get(signum, "sent by the system or another process")
    return KilledError(f"recipe {recipe} was killed by signal {signum} ({name}), {meaning}; "
                       "a restart resumes from the last resumable checkpoint")


def _error_line(tail: collections.deque) -> str:
    """The exception line of the recipe's traceback, else its last line."""
    for line in reversed(tail):
        text = _RANK_PREFIX.sub("", line)
        head = text.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head \
                and not head.endswith(_WRAPPER_ERRORS):
            return text
    return tail[-1] if tail else "the recipe exited without output"


class _Supervisor:
    """SIGTERM (pod eviction) -> ask the recipe to stop at the next step; kill it when
    the grace period runs out."""

    def __init__(self, child: subprocess.Popen, stop_file: Path, grace_s: float) -> None:
        self.child, self.stop_file, self.grace_s = child, stop_file, grace_s
        self.stopped_at: float | None = None
        self.killed = False
        self._previous = {}

    def __enter__(self) -> "_Supervisor":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self.stop_file.unlink(missing_ok=True)

    def _on_signal(self, signum, frame) -> None:
        if self.stopped_at is not None:
            return
        self.stopped_at = time.monotonic()
        log.info("%s: saving a resumable checkpoint at the next step (grace period %.0f s)",
                 signal.Signals(signum).name, self.grace_s)
        self.stop_file.write_text(str(signum))
        threading.Thread(target=self._deadline, daemon=True).start()

    def _deadline(self) -> None:
        try:
            self.child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            self.killed = True
            log.info("grace period over: stopping the recipe without a new checkpoint")
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fix_adapter_configs(output_dir: Path, model_dir: Path) -> None:
    """torchtune writes ``base_model_name_or_path: null`` without original_repo_id.json."""
    name = original_repo_id(model_dir)
    for path in output_dir.glob("epoch_*/adapter_config.json"):
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not config.get("base_model_name_or_path"):
            config["base_model_name_or_path"] = name or str(model_dir)
            write_atomic(path, json.dumps(config, indent=2))


def _final_epoch_dir(plan_: RunPlan) -> str | None:
    """This run's last epoch: the newest epoch_N could be a longer earlier run's leftover."""
    final = f"epoch_{int(plan_.cfg.get('epochs') or 1) - 1}"
    if (plan_.output_dir / final).is_dir():
        return final
    return _latest_epoch_dir(plan_.output_dir)


def _latest_epoch_dir(output_dir: Path) -> str | None:
    epochs = sorted((p for p in output_dir.glob("epoch_*") if p.name[6:].isdigit()),
                    key=lambda p: int(p.name[6:]))
    return epochs[-1].name if epochs else None


def _print_dry_run(plan_: RunPlan, command: list[str]) -> None:
    print(f"recipe: {plan_.request.recipe} ({plan_.recipe_path})")
    print(f"method: {plan_.method}; topology: {plan_.topology.kind} "
          f"({plan_.topology.nnodes} node(s) x {plan_.topology.nproc_per_node} process(es))")
    for note in plan_.notes:
        print(f"note: {note}")
    print("config:")
    print(OmegaConf.to_yaml(plan_.cfg), end="")
    print("command: " + " ".join(command))


def _finished_at(output_dir: Path) -> str:
    try:
        return read_marker(output_dir).finished_at or "earlier"
    except KubetuneError:
        return "earlier"


def _already_complete(plan_: RunPlan) -> bool:
    return completed_fingerprint(plan_.output_dir) == plan_.fingerprint


def run(plan_: RunPlan, dry_run: bool = False) -> int:
    output_dir = plan_.output_dir
    config_path = output_dir / TRAINER_CONFIG_NAME
    command = plan_.command(config_path)
    if dry_run:
        _print_dry_run(plan_, command)
        return 0
    for note in plan_.notes:
        log.info(note)
    check_writable(output_dir)
    with _output_held(plan_):
        return _run_holding_output(plan_, config_path, command)


@contextlib.contextmanager
def _output_held(plan_: RunPlan) -> Iterator[None]:
    """The one trainer on ``output_dir`` (as an initializer holds its output): a second
    one, started by hand, by a second `kubetune local` or by a restarted pod while the old
    one still saves, would log every step twice and write over the first's checkpoints.
    It fails at once, touching nothing; a restart (exit 75) succeeds once the first is gone.
    Rank 0's node holds it for all: every node of one run shares the directory."""
    if not plan_.is_primary_node:
        yield
        return
    try:
        with file_lock.hold(plan_.output_dir / TRAINER_LOCK_NAME, wait=False):
            yield
    except file_lock.LockHeld as held:
        raise TransientError(f"output_dir {plan_.output_dir} is in use by another trainer "
                             f"({held.holder}): wait for it to finish, or give this run "
                             "another output_dir") from None


def _run_holding_output(plan_: RunPlan, config_path: Path, command: list[str]) -> int:
    output_dir = plan_.output_dir
    primary = plan_.is_primary_node
    if _already_complete(plan_):
        # Every node decides the same from the shared volume: a node that went on alone
        # would wait for the others at the rendezvous forever.
        log.info("%s already holds this run's completed training (same config and inputs, "
                 "finished %s): nothing to do, on to the export", output_dir,
                 _finished_at(output_dir))
        return 0
    if primary:
        (output_dir / COMPLETION_MARKER_NAME).unlink(missing_ok=True)
        (output_dir / SUMMARY_NAME).unlink(missing_ok=True)
        # This run records its own (a text-completion run none): never an earlier run's.
        (output_dir / TRAINING_SAMPLES_NAME).unlink(missing_ok=True)
        if plan_.resumed_from is None:
            (output_dir / METRICS_NAME).unlink(missing_ok=True)
            resume.clear(output_dir)
        else:
            # Steps after the checkpoint (a kill -9 leaves them) are trained and logged again.
            resume.trim_metrics(output_dir / METRICS_NAME, plan_.resumed_from.global_step)
    special = plan_.checkpoint.tokenizer.special_tokens
    if special:
        # torchtune reads special-token ids from a tokenizer.json's added_tokens.
        write_atomic(output_dir / SPECIAL_TOKENS_FILE, json.dumps(
            {"added_tokens": [{"id": i, "content": t} for t, i in special.items()]}))
    saved = without_credentials(plan_.cfg)
    write_atomic(config_path, OmegaConf.to_yaml(saved))
    private = None
    if has_credentials(plan_.cfg):
        # URL credentials in an override: the recipe reads them from a copy only this
        # process's user can read, gone when the recipe ends; the volume keeps the masked one.
        private = Path(tempfile.mkdtemp(prefix="kubetune-recipe-config-"))
        write_atomic(private / TRAINER_CONFIG_NAME, OmegaConf.to_yaml(plan_.cfg))
        command = plan_.command(private / TRAINER_CONFIG_NAME)
    try:
        return _launch(plan_, command)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


@dataclasses.dataclass
class _RecipeRun:
    """What one run of the recipe process(es) left for the launcher to judge."""
    code: int
    wall_s: float
    started_at: float  # wall clock, to tell this run's resume record from an older one
    tail: collections.deque  # the recipe's last stderr lines
    signalled: bool  # we forwarded a stop to it
    killed: bool  # its grace period ran out


def _launch(plan_: RunPlan, command: list[str]) -> int:
    """The phases of a launch: run the recipe, judge how it ended, record it, and either
    raise the one-line failure or write the completion marker."""
    ran = _run_recipe(plan_, command)
    stopped = _was_stopped(plan_, ran)
    if ran.code != 0 and not stopped:
        # The whole tail: torch's zip writer reports the full disk as a RuntimeError whose
        # chained OSError (Errno 28) stands lines above the last exception line.
        check_volume("\n".join(ran.tail), plan_.output_dir)  # before writing anything more
    summary = _record_summary(plan_, ran, stopped) if plan_.is_primary_node else None
    if stopped:
        _raise_stopped(plan_)
    if ran.code != 0:
        _raise_failed(plan_, ran)
    if summary is not None:
        _finish(plan_, summary)
    return 0


def _run_recipe(plan_: RunPlan, command: list[str]) -> _RecipeRun:
    """Start the recipe process(es), stream their output through redact, wait for them."""
    log.info("launching: %s", " ".join(command))
    stop_file = Path(tempfile.gettempdir()) / f"kubetune-stop-{os.getpid()}"
    stop_file.unlink(missing_ok=True)
    start, started_at = time.monotonic(), time.time()
    tail: collections.deque = collections.deque(maxlen=200)
    # Both of the recipe's streams pass through redact: it prints configs and URLs too.
    child = subprocess.Popen(command, env=_child_env(plan_, stop_file), stderr=subprocess.PIPE,
                             stdout=subprocess.PIPE, start_new_session=True,
                             preexec_fn=die_with_parent)
    with _Supervisor(child, stop_file, plan_.grace_period_s) as supervisor:
        readers = [threading.Thread(target=_stream, args=(child.stderr, sys.stderr, tail),
                                    daemon=True),
                   threading.Thread(target=_stream, args=(child.stdout, sys.stdout,
                                                          collections.deque(maxlen=1)),
                                    daemon=True)]
        for reader in readers:
            reader.start()
        code = child.wait()
        for reader in readers:
            reader.join(timeout=10)
    return _RecipeRun(code, time.monotonic() - start, started_at, tail,
                      signalled=supervisor.stopped_at is not None, killed=supervisor.killed)


def _was_stopped(plan_: RunPlan, ran: _RecipeRun) -> bool:
    """Stopped by a signal (ours, or another node's: all ranks saved together, exit 75)
    rather than failed."""
    if ran.code == 0:
        return False
    if ran.signalled:
        return True
    record = resume.read_record(plan_.output_dir)
    path = plan_.output_dir / resume.RESUME_RECORD_NAME
    return (record is not None and record.reason == "signal"
            and record.fingerprint == plan_.fingerprint
            and path.stat().st_mtime >= ran.started_at)


def _record_summary(plan_: RunPlan, ran: _RecipeRun, stopped: bool) -> dict:
    """summary.json and the run report, however the run ended (rank 0's node only)."""
    if stopped:
        reason = "stopped by signal" + (" (grace period over)" if ran.killed else "")
    else:
        reason = "completed" if ran.code == 0 else f"failed (exit {ran.code})"
    summary = summarize(plan_.output_dir, ran.wall_s, reason, plan_.checkpoint.architecture.shape,
                        str(plan_.cfg.device), plan_.topology.world_size,
                        _final_epoch_dir(plan_), plan_.method, plan_.cfg)
    write_atomic(plan_.output_dir / SUMMARY_NAME, json.dumps(summary, indent=2))
    run_report.at_end(plan_.output_dir, summary)
    return summary


def _raise_stopped(plan_: RunPlan) -> None:
    """A stop is transient: say whether a restart resumes or starts over."""
    output_dir = plan_.output_dir
    record = resume.read_record(output_dir)
    if record is not None and record.fingerprint == plan_.fingerprint:
        raise TransientError(
            f"stopped by signal; resumable checkpoint {output_dir / record.checkpoint} "
            f"({record.epochs_run} epoch(s) + {record.steps_in_epoch} step(s)): "
            f"{restart_advice(resumes=True)}")
    raise TransientError(f"stopped by signal before any resumable checkpoint within the "
                         f"{plan_.grace_period_s:.0f} s grace period: "
                         f"{restart_advice(resumes=False)}")


def _raise_failed(plan_: RunPlan, ran: _RecipeRun) -> None:
    """The recipe's failure as one line: killed, no fallback left, out of memory, or its
    own error line."""
    signum = _killing_signal(ran.code, ran.tail)
    if signum is not None:
        raise _killed_error(signum, plan_.request.recipe)
    cause = _error_line(ran.tail)
    for marker in _USER_LINES:
        if marker in cause:  # printed with its module path, or by bootstrap without one
            raise BadInputError(cause.split(marker, 1)[1])
    if any(sign in cause for sign in _OUT_OF_MEMORY):
        raise BadInputError(
            f"out of memory ({cause[:160]}): lower batch_size or tokenizer.max_seq_len, "
            "set enable_activation_checkpointing=True, or use method qlora / more devices")
    raise KubetuneError(f"recipe {plan_.request.recipe} failed: {cause}")


def _finish(plan_: RunPlan, summary: dict) -> None:
    """A completed run: adapter configs named, resume record cleared, marker written last."""
    output_dir = plan_.output_dir
    _fix_adapter_configs(output_dir, plan_.checkpoint.model_dir)
    resume.clear(output_dir)
    marker = CompletionMarker(checkpoint=summary["checkpoint"], method=plan_.method,
                              config=TRAINER_CONFIG_NAME, steps=summary["steps"],
                              fingerprint=plan_.fingerprint,
                              finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    # Written last: the exporter trusts only an output_dir that has this marker.
    write_atomic(output_dir / COMPLETION_MARKER_NAME, marker.encode())
    train_progress.report_finished(summary)
    # Rounded for people (summary.json keeps every digit).
    loss = lambda value: "?" if value is None else f"{value:.4f}"  # noqa: E731
    log.info("done: %s steps in %.1f s, loss %s -> %s, %s tokens/s, checkpoint %s",
             summary["steps"], summary["wall_time_s"], loss(summary["first_loss"]),
             loss(summary["last_loss"]),
             f"{summary['tokens_per_second']:.0f}" if summary["tokens_per_second"] else "?",
             output_dir / str(summary["checkpoint"]))
