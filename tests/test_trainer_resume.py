"""Preemption loses nothing: a run SIGTERMed (the kubelet's eviction) saves a resumable
checkpoint and exits 75; the restarted pod (same command) resumes exactly where it stopped.

Exact means what a user checks against a run that was never interrupted: the same number
of optimizer steps, each logged once, each trained on the same samples in the same order
(the digest of each step's token ids in metrics.jsonl), the same learning rates, and the
same final weights within 1e-5. The CPU runs are deterministic: fp32, seeded, one thread.

Each uninterrupted reference is trained once for every test that reads it (a run is two
processes importing torchtune: the suite's cost, docs/testing.md); the stopped and killed
runs are real processes, signalled as a kubelet or the OOM killer would.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kubetune.tools.demo import write_tiny_dataset
from kubetune.errors import EXIT_KILLED, EXIT_TRANSIENT
from kubetune.workspace import validation_record
from tests.support.trainer import (Pvc, make_pvc, plain_torchtune_run, start_tune_run,
                                   tune_run)

pytestmark = pytest.mark.slow

ROWS = 24  # batch 4 x 1 process: 6 steps per epoch
VAL_ROWS = 9  # odd: two processes get shards of 5 and 4 (+ a pad row)
COSINE = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"


@pytest.fixture(scope="module")
def small_dataset_dir(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "small", rows=ROWS)


@pytest.fixture(scope="module")
def val_dir(tmp_path_factory) -> Path:
    # Other rows of the same task: a held-out set the run never trains on.
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "val", rows=VAL_ROWS,
                              seed=7)


def held_out(val: Path, *extra: str) -> list[str]:
    """torchtune main's keys for a held-out set (``dataset_val``), and the contract's
    kubetune.validation."""
    return ["dataset_val._component_=torchtune.datasets.instruct_dataset",
            "dataset_val.source=parquet", f"dataset_val.data_dir={val / 'data'}",
            "kubetune.validation.source=config", *extra]


def val_lines(pvc: Pvc) -> list[dict]:
    return [m for m in pvc.metrics() if "val_loss" in m]


def deterministic_env(pvc: Pvc, **extra: str) -> dict[str, str]:
    return pvc.env(OMP_NUM_THREADS="1", **extra)


def train_args(pvc: Pvc, *extra: str) -> list[str]:
    warmup = [] if any(e.startswith("lr_scheduler.num_warmup_steps=") for e in extra) \
        else ["lr_scheduler.num_warmup_steps=2"]
    return [*pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
            "dataset.source=parquet", f"dataset.data_dir={pvc.dataset / 'data'}",
            "batch_size=4", "gradient_accumulation_steps=1", "seed=1", "dtype=fp32",
            # Large enough steps that a wrong resume moves the weights by far more than 1e-5.
            "optimizer.lr=3e-3", f"lr_scheduler._component_={COSINE}", *warmup, *extra]


def trained_steps(pvc: Pvc) -> list[dict]:
    return [m for m in pvc.metrics() if "loss" in m]


def stop_after(tmp_path: Path, pvc: Pvc, args: list[str], env: dict, step: int,
               attempt: str) -> int:
    """Start the run, SIGTERM it once metrics.jsonl shows ``step``; return the last step
    the stopped run logged."""
    log = tmp_path / f"{attempt}.log"
    # Each step pauses a little: the tiny model's steps can come faster than the SIGTERM
    # travels (poll, launcher, stop file), and the run would end before the stop lands.
    run = start_tune_run(pvc, *args, env={**env, "KUBETUNE_TEST_STEP_PAUSE": "0.3"}, log=log)
    deadline = time.monotonic() + 300
    # metrics.jsonl still holds the previous attempt's steps until this run's launcher has
    # cut them back to its checkpoint, which it does before "launching:"; a SIGTERM before
    # then would hit a launcher that has not installed its handler yet.
    while (not (log.is_file() and "launching: " in log.read_text(errors="replace")
                and any(m["step"] >= step for m in trained_steps(pvc)))
           and run.poll() is None and time.monotonic() < deadline):
        time.sleep(0.05)
    run.terminate()  # SIGTERM, as the kubelet sends on eviction
    assert run.wait(timeout=120) == EXIT_TRANSIENT, log.read_text()[-3000:]
    report = pvc.termination_log.read_text()
    assert "resumable checkpoint" in report and len(report.strip().splitlines()) == 1
    assert not pvc.complete()
    return trained_steps(pvc)[-1]["step"]


def final_weights(pvc: Pvc, epoch_dir: str, adapter: bool) -> dict[str, torch.Tensor]:
    if adapter:
        return torch.load(pvc.output / epoch_dir / "adapter_model.pt", weights_only=True)
    weights = {}
    for shard in sorted((pvc.output / epoch_dir).glob("model-*.safetensors")):
        weights.update(load_file(shard))
    return weights


def assert_same_training(pvc: Pvc, reference: Pvc, epoch_dir: str, adapter: bool) -> None:
    """What each step trained on, its loss and LR, and the final weights, as uninterrupted."""
    got, want = trained_steps(pvc), trained_steps(reference)
    assert [m["step"] for m in got] == [m["step"] for m in want]  # each step once
    assert [(m["epoch"], m["batch_digest"]) for m in got] == \
        [(m["epoch"], m["batch_digest"]) for m in want]  # same samples, same order
    assert [m["lr"] for m in got] == pytest.approx([m["lr"] for m in want], rel=1e-6)
    assert [m["loss"] for m in got] == pytest.approx([m["loss"] for m in want], abs=1e-5)
    assert pvc.summary()["steps"] == reference.summary()["steps"] == len(want)
    assert pvc.summary()["exit_reason"] == "completed" and pvc.complete()
    mine, theirs = final_weights(pvc, epoch_dir, adapter), final_weights(reference, epoch_dir,
                                                                          adapter)
    assert mine.keys() == theirs.keys() and mine
    for name, tensor in theirs.items():
        assert torch.allclose(mine[name], tensor, rtol=0, atol=1e-5), name


def reference_run(tmp_path: Path, model: Path, dataset: Path, args, env_extra: dict) -> Pvc:
    reference = make_pvc(tmp_path / "reference", model, dataset)
    result = tune_run(reference, *args(reference), env=deterministic_env(reference, **env_extra))
    assert result.returncode == 0, result.stderr[-3000:]
    return reference


def test_lora_stopped_three_times_resumes_exactly_with_its_validation(
        tmp_path, tiny_model_dir, small_dataset_dir, val_dir):
    """2 epochs x 6 steps, a periodic save every 4 steps, the held-out loss measured every
    4 steps; SIGTERM mid-epoch 0, just after the step-4 save, and in the last epoch; each
    restart resumes from its checkpoint without measuring the base again; the result, the
    validation record and the val lines included, is the uninterrupted run's."""

    def args(pvc):
        return ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                *train_args(pvc, "epochs=2", *held_out(val_dir), "run_val_every_n_steps=4")]

    env = {"KUBETUNE_SAVE_EVERY_N_STEPS": "4"}
    reference = reference_run(tmp_path, tiny_model_dir, small_dataset_dir, args, env)
    assert len(trained_steps(reference)) == 12
    # Measured when scheduled: the base (0), every 4 steps, and each epoch's end, where
    # epoch 0's (6) is its loader's boundary, no multiple of 4.
    want = validation_record.read(reference.output)
    assert [e["step"] for e in want.evaluations] == [0, 4, 6, 8, 12]
    assert [e["epoch"] for e in want.evaluations] == [0, 0, 0, 1, 1]
    assert want.checkpoints == {
        "epoch_0": {"step": 6, "val_loss": want.evaluation_at(6)["val_loss"]},
        "epoch_1": {"step": 12, "val_loss": want.evaluation_at(12)["val_loss"]}}

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset_dir)
    stops = []
    for attempt, at in (("mid-epoch", 1), ("after-periodic-save", 4), ("last-epoch", 8)):
        stops.append(stop_after(tmp_path, pvc, args(pvc), deterministic_env(pvc, **env), at,
                                attempt))
    assert stops[0] < 6 and stops[1] >= 4 and 6 <= stops[2] < 12, stops
    second = tune_run(pvc, *args(pvc), env=deterministic_env(pvc, **env))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"step(s) done (global step {stops[-1]}" in second.stderr
    assert_same_training(pvc, reference, "epoch_1", adapter=True)
    # Finished: the resumable checkpoints are gone; the epochs' outputs stay.
    assert not (pvc.output / "checkpoints").exists()
    assert (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()

    got = validation_record.read(pvc.output)
    assert [e["step"] for e in got.evaluations] == [e["step"] for e in want.evaluations]
    assert [e["val_loss"] for e in got.evaluations] == pytest.approx(
        [e["val_loss"] for e in want.evaluations], abs=1e-5)
    assert got.checkpoints.keys() == want.checkpoints.keys() == {"epoch_0", "epoch_1"}
    assert [m["step"] for m in val_lines(pvc)] == [m["step"] for m in val_lines(reference)]


def test_full_finetune_on_two_processes_resumes_exactly(tmp_path, tiny_model_dir,
                                                       small_dataset_dir):
    """Distributed (gloo, 2 processes via our launcher) full fine-tune with an epoch cut
    short by max_steps_per_epoch: stopped mid-epoch 0 and in the last epoch."""

    def args(pvc):
        return ["full_finetune_distributed", "--config", "llama3_2/1B_full",
                *train_args(pvc, "epochs=2", "max_steps_per_epoch=2")]

    env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0"}
    reference = reference_run(tmp_path, tiny_model_dir, small_dataset_dir, args, env)
    assert len(trained_steps(reference)) == 4

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset_dir)
    first = stop_after(tmp_path, pvc, args(pvc), deterministic_env(pvc, **env), 1, "first")
    assert first < 4
    result = tune_run(pvc, *args(pvc), env=deterministic_env(pvc, **env))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training(pvc, reference, "epoch_1", adapter=False)


# No warm-up: this run's steps are compared with plain torchtune's, whose warm-up runs step
# 1 at a learning rate of 0 where ours starts above it (warmup_cap.py).
PACKED = ["epochs=2", "dataset.packed=True", "tokenizer.max_seq_len=96", "batch_size=2",
          "lr_scheduler.num_warmup_steps=0"]


def packed_lora(pvc: Pvc) -> list[str]:
    """Packed: 12 packs of 96 tokens made from the 24 rows (6 steps per epoch)."""
    return ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
            *train_args(pvc, *PACKED)]


@pytest.fixture(scope="module")
def packed_reference(tmp_path_factory, tiny_model_dir, small_dataset_dir
                     ) -> tuple[Pvc, subprocess.CompletedProcess]:
    """The packed LoRA run, uninterrupted: the exact resume's reference, and the run whose
    steps are compared with plain torchtune's."""
    pvc = make_pvc(tmp_path_factory.mktemp("packed") / "reference", tiny_model_dir,
                   small_dataset_dir)
    result = tune_run(pvc, *packed_lora(pvc), env=deterministic_env(pvc))
    assert result.returncode == 0, result.stderr[-3000:]
    return pvc, result


def test_packed_lora_resumes_exactly_from_the_token_cache(tmp_path, tiny_model_dir,
                                                           small_dataset_dir, packed_reference):
    """Packed: the rows tokenized once into the volume's cache, 12 packs of 96 tokens
    made from it (6 steps per epoch); stopped twice, each restart maps the cache and
    trains the same packs in the same order to the same weights."""
    reference, _ = packed_reference
    assert len(trained_steps(reference)) == 12

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset_dir)
    stops = [stop_after(tmp_path, pvc, packed_lora(pvc), deterministic_env(pvc), at, attempt)
             for attempt, at in (("mid-epoch", 2), ("last-epoch", 7))]
    assert stops[0] < 6 <= stops[1] < 12, stops
    result = tune_run(pvc, *packed_lora(pvc), env=deterministic_env(pvc))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "token cache: 24 rows mapped from" in result.stderr
    assert "token cache: tokenized" not in result.stderr
    assert_same_training(pvc, reference, "epoch_1", adapter=True)


def test_a_packed_cpu_batch_runs_pack_by_pack_to_torchtunes_weights(
        tmp_path, tiny_model_dir, small_dataset_dir, packed_reference):
    """On CPU a packed batch of 2 runs as 2 micro-batches of one pack (speed plan): every
    step's loss, and the weights, are plain torchtune's with the whole batch in one
    forward (its dense block-causal mask), on the same packs. Epoch 0 is compared: at its
    save torchtune 0.6.1 on CPU folds the adapter into the live base weights (which ours
    does not, cpu_adapt.py), so upstream's epoch 1 trains on another model."""
    ours, result = packed_reference
    assert "one pack per forward on cpu: batch_size=2 gradient_accumulation_steps=1 runs " \
        "as 1 x 2" in result.stderr
    saved = (ours.output / "kubetune-config.yaml").read_text()
    assert re.search(r"^batch_size: 1$", saved, re.M) \
        and re.search(r"^gradient_accumulation_steps: 2$", saved, re.M)

    theirs = make_pvc(tmp_path / "theirs", tiny_model_dir, small_dataset_dir)
    plain = plain_torchtune_run(theirs, "lora_finetune_single_device",
                                "llama3_2/1B_lora_single_device", *train_args(theirs, *PACKED),
                                env=deterministic_env(theirs))
    assert plain.returncode == 0, plain.stderr[-3000:]
    their_log = "".join(p.read_text() for p in (theirs.output / "logs").glob("*.txt"))
    their_losses = [float(v) for v in re.findall(r"\bloss:([0-9.]+)", their_log)]
    our_losses = [m["loss"] for m in trained_steps(ours)]
    assert len(our_losses) == len(their_losses) == 12, their_losses
    assert our_losses[:6] == pytest.approx(their_losses[:6], abs=1e-5)
    mine, upstream = final_weights(ours, "epoch_0", True), final_weights(theirs, "epoch_0", True)
    assert mine.keys() == upstream.keys() and mine
    for name, tensor in upstream.items():
        assert torch.allclose(mine[name], tensor, rtol=0, atol=1e-5), name


@pytest.mark.parametrize("recipe,config,processes,extra", [
    ("full_finetune_single_device", "llama3_2/1B_full_single_device", 1,
     ["gradient_accumulation_steps=2", "optimizer_in_bwd=False"]),
    ("lora_finetune_distributed", "llama3_2/1B_lora", 2, []),
    # The Kubeflow shape on one device: a one-process group the launcher starts itself.
    ("lora_finetune_distributed", "llama3_2/1B_lora", 1, ["gradient_accumulation_steps=2"]),
], ids=["full-1-process-accumulating", "lora-2-processes", "lora-1-process-group"])
def test_the_other_recipes_resume_exactly(tmp_path, tiny_model_dir, small_dataset_dir, recipe,
                                          config, processes, extra):
    """The remaining method x topology pairs, stopped once in epoch 0 of 2."""

    def args(pvc):
        return [recipe, "--config", config, *train_args(pvc, "epochs=2", *extra)]

    env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": str(processes), "PET_NODE_RANK": "0"}
    reference = reference_run(tmp_path, tiny_model_dir, small_dataset_dir, args, env)
    assert len(trained_steps(reference)) == 6  # 24 rows, 8 per step: 3 steps x 2 epochs
    # The warm-up of 2 starts above zero (warmup_cap.py): steps 1 and 2 at 1/2 and 2/2 of
    # the peak, where torchtune's own schedule runs step 1 at 0.
    lrs = [m["lr"] for m in trained_steps(reference)]
    assert lrs[:3] == pytest.approx([1.5e-3, 3e-3, 3e-3]), lrs

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset_dir)
    assert stop_after(tmp_path, pvc, args(pvc), deterministic_env(pvc, **env), 1, "first") < 6
    result = tune_run(pvc, *args(pvc), env=deterministic_env(pvc, **env))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training(pvc, reference, "epoch_1", adapter=recipe.startswith("lora"))


# The write points of the run below, in the order KillHook (checkpoint_store.py) counts
# them: the step-1 resumable save writes 1 adapter_model.pt, 2 adapter_model.safetensors,
# 3 the config copies, 4 recipe_state.pt into the staging directory, then commits: 5 staged
# files fsynced, 6 checkpoint renamed into place, 7 resume record written; 8 is the final
# save's first write. A kill at 1-4 leaves one state: a staging directory holding a cut
# file and no record naming it; the next start deletes it and starts over, whichever file
# was cut (the files are torchtune's writers, the hook only cuts them). So 4, the cut
# recipe_state.pt (the file a wrong resume would read), stands for 1-3; 5 (a whole but
# unvouched staging directory), 6 (an unvouched checkpoint in checkpoints/), 7 (vouched)
# and 8 (vouched, the final save cut) are each a state of their own. A write point added
# or moved shifts these numbers and fails the name checks: then choose again.
KILL_POINTS = {4: "recipe_state.pt", 5: "staged files fsynced",
               6: "checkpoint renamed into place", 7: "resume record written",
               8: "epoch_0/adapter_model.pt"}


def test_sigkill_at_each_checkpoint_write_then_restart_completes(tmp_path, tiny_model_dir,
                                                                 small_dataset_dir):
    """kill -9 (KUBETUNE_TEST_KILL_AT=N: the trainer SIGKILLs itself at its N-th write
    point: in the middle of each file torchtune writes, and between the steps that make a
    checkpoint durable and vouched for) at each kind of point of a resumable save
    (KILL_POINTS) and in the final one. Each time the launcher reports the signal (exit
    76), and the restart ends with the uninterrupted run's steps and adapter, resuming
    only from a vouched save."""

    def args(pvc):
        return ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                *train_args(pvc, "epochs=1", "max_steps_per_epoch=2",
                            "save_adapter_weights_only=True")]

    env = {"KUBETUNE_SAVE_EVERY_N_STEPS": "1"}  # a resumable save after step 1
    reference = reference_run(tmp_path, tiny_model_dir, small_dataset_dir, args, env)
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset_dir)
    killed_at = []
    for n, point in KILL_POINTS.items():
        shutil.rmtree(pvc.output, ignore_errors=True)
        killed = tune_run(pvc, *args(pvc), env=deterministic_env(pvc, KUBETUNE_TEST_KILL_AT=str(n),
                                                                  **env))
        assert killed.returncode == EXIT_KILLED, killed.stderr[-3000:]
        killed_at.append(re.search(r"killing the trainer at (.*)", killed.stderr).group(1))
        assert killed_at[-1].endswith(point), (n, killed_at[-1])
        report = pvc.termination_log.read_text().strip()
        assert report.startswith("trainer: recipe lora_finetune_single_device was killed by "
                                  "signal 9 (SIGKILL), likely the out-of-memory killer: raise "
                                  "the container's memory limit"), report
        assert f"error: {report}" in killed.stderr.splitlines()

        again = tune_run(pvc, *args(pvc), env=deterministic_env(pvc, **env))
        assert again.returncode == 0, (killed_at[-1], again.stderr[-3000:])
        vouched = "resume record written" in killed_at
        assert ("global step 1, saved on step" in again.stderr) == vouched, killed_at[-1]
        assert_same_training(pvc, reference, "epoch_0", adapter=True)
