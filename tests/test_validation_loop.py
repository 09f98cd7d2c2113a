"""Validation inside the recipe process (issue 42 §2, §4, §6): the held-out loss measured at
step 0, every N steps, each epoch's end and the run's last step, recorded, changing nothing
about training, resuming exactly, the same on 1 process, 2 processes and 2 nodes, and an
early stop that ends the run as completed.

The held-out set is given as torchtune main's ``dataset_val`` (a second file set) with
``kubetune.validation`` as the contract fixes it; the training rows are the same with and
without it. Every run is fp32, seeded, one thread: deterministic on CPU.
"""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from kubetune.tools.demo import write_tiny_dataset
from kubetune.workspace import validation_record
from kubetune.workspace.validation_record import ValidationRecord
from kubetune.trainer.validation import val_loop
from kubetune.trainer.validation.early_stop import EarlyStop
from kubetune.trainer.validation.schedule import Schedule, every_n_steps
from tests.support.trainer import Pvc, make_pvc, start_tune_run, tune_run
# A stopped run resumes to the uninterrupted run's held-out losses: proven with the
# LoRA run stopped three times, test_trainer_resume.py (one run read by both claims).
from tests.test_trainer_resume import (COSINE, VAL_ROWS, deterministic_env, final_weights,
                                       held_out, trained_steps, val_lines)

ROWS = 24  # batch 4 x 1 process: 6 steps per epoch


# -- the parts, without a run ---------------------------------------------------------


def boundaries(schedule: Schedule) -> list[int]:
    """The steps measured when a run passes every boundary, each epoch's end twice (the
    loader's boundary, then the epoch save's), as a recipe can."""
    measured = []
    for step in range(schedule.total_steps + 1):
        epoch_end = step > 0 and step % schedule.steps_per_epoch == 0
        for _ in range(2 if epoch_end else 1):
            if schedule.due(step, epoch_end):
                schedule.mark(step)
                measured.append(step)
    return measured


def test_the_schedule_measures_base_every_n_epoch_ends_and_the_last_step_once():
    assert boundaries(Schedule(every_n=4, steps_per_epoch=6, total_epochs=2)) == [0, 4, 6, 8, 12]
    assert boundaries(Schedule(every_n=5, steps_per_epoch=7, total_epochs=1)) == [0, 5, 7]
    resumed = Schedule(every_n=4, steps_per_epoch=6, total_epochs=2, resumed=True, done={0, 4})
    assert boundaries(resumed) == [6, 8, 12]  # no base again, nothing twice


def test_the_default_frequency_is_about_ten_evaluations_and_zero_is_off():
    assert every_n_steps(None, 95) == 10
    assert every_n_steps(None, 3) == 1
    assert every_n_steps(None, 1000) == 100
    assert every_n_steps(7, 1000) == 7
    assert every_n_steps(0, 1000) == 0


def test_early_stop_counts_evaluations_without_a_new_best():
    stop = EarlyStop(patience=2)
    assert [stop.observe(s, v) for s, v in [(0, 3.0), (2, 2.5), (4, 2.6), (6, 2.4), (8, 2.4),
                                            (10, 2.9)]] == [False] * 5 + [True]
    assert (stop.best_step, stop.best_val_loss) == (6, 2.4)
    evaluations = [{"step": s, "val_loss": v} for s, v in [(0, 3.0), (2, 3.1)]]
    assert EarlyStop.replayed(1, evaluations).exhausted
    assert not EarlyStop.replayed(0, evaluations).exhausted  # 0: never


def test_shards_are_disjoint_and_padded_to_the_same_count():
    for rows, world in [(9, 2), (5, 4), (3, 4), (8, 2)]:
        shards = [val_loop.shard(rows, rank, world) for rank in range(world)]
        assert len({len(s) for s in shards}) == 1
        real = sorted(i for s in shards for i in s if i is not None)
        assert real == list(range(rows))


def test_the_record_round_trips_and_names_base_best_last_and_the_best_checkpoint(tmp_path):
    assert validation_record.read(tmp_path) is None
    record = ValidationRecord(source="split", split="test", train_split="train", rows=9,
                              every_n_steps=2, evaluations=[
                                  {"step": s, "epoch": 0, "val_loss": v, "val_tokens": 50}
                                  for s, v in [(0, 3.0), (2, 2.0), (4, 2.5), (6, 2.2)]],
                              checkpoints={"epoch_0": {"step": 4, "val_loss": 2.5},
                                           "epoch_1": {"step": 6, "val_loss": 2.2}})
    validation_record.write(tmp_path, record)
    back = validation_record.read(tmp_path)
    assert back == record
    assert (back.base["step"], back.best["step"], back.last["step"]) == (0, 2, 6)
    assert back.best_checkpoint == "epoch_1" and back.checkpoint_at(4) == "epoch_0"
    back.cut_to(4)
    assert [e["step"] for e in back.evaluations] == [0, 2, 4] and list(back.checkpoints) == [
        "epoch_0"]


def test_the_launcher_reads_an_early_stop_as_its_summary_reason(tmp_path):
    from kubetune.trainer.launcher.finish import early_stop_reason

    assert early_stop_reason(tmp_path) is None  # no held-out set
    record = ValidationRecord(evaluations=[{"step": 0, "epoch": 0, "val_loss": 2.5,
                                            "val_tokens": 9}])
    validation_record.write(tmp_path, record)
    assert early_stop_reason(tmp_path) is None  # validated, not stopped
    record.early_stop = {"patience": 3, "step": 20, "best_step": 8, "best_val_loss": 1.70004}
    validation_record.write(tmp_path, record)
    assert early_stop_reason(tmp_path) == (
        "early stop: no improvement in 3 evaluations (best val_loss 1.7000 at step 8)")


def test_validation_leaves_every_rng_and_train_flag_as_it_found_them():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5),
                                torch.nn.Linear(4, 2))
    model[2].eval()  # a module the recipe keeps in eval mode stays so
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    with val_loop.training_state_kept(model, torch.device("cpu")):
        assert not model.training and not torch.is_grad_enabled()
        model(torch.randn(2, 4)), random.random(), np.random.rand()
    after = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    assert torch.equal(after[0], torch.rand(3)) and after[1:] == (random.random(),
                                                                  np.random.rand())
    assert [m.training for m in model.modules()] == [True, True, True, False]


# -- runs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "train", rows=ROWS)


@pytest.fixture(scope="module")
def val_dir(tmp_path_factory) -> Path:
    # Other rows of the same task: a held-out set the run never trains on.
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "val", rows=VAL_ROWS,
                              seed=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lora(pvc: Pvc, *extra: str) -> list[str]:
    return ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
            *pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
            "dataset.source=parquet", f"dataset.data_dir={pvc.dataset / 'data'}",
            "batch_size=4", "gradient_accumulation_steps=1", "seed=1", "dtype=fp32",
            "optimizer.lr=3e-3", f"lr_scheduler._component_={COSINE}",
            "lr_scheduler.num_warmup_steps=2", *extra]


def run_ok(pvc: Pvc, args: list[str], **env: str) -> str:
    result = tune_run(pvc, *args, env=deterministic_env(pvc, **env))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.mark.slow
def test_validation_changes_nothing_about_training_and_runs_when_scheduled(
        tmp_path, tiny_model_dir, train_dir, val_dir):
    """2 epochs cut to 5 steps each, every 3 steps: measured at 0, 3, 5 (epoch 0's end, a
    break with no loader boundary after it: its save measures it), 6, 9 and 10; each step's
    loss, what it trained on and the final weights are those of the same run without a
    held-out set, bit for bit (dropout on: the RNG is untouched). An epoch's end at its
    loader's boundary is measured in test_trainer_resume.py's LoRA run."""
    plain = make_pvc(tmp_path / "plain", tiny_model_dir, train_dir)
    run_ok(plain, lora(plain, "epochs=2", "max_steps_per_epoch=5", "model.lora_dropout=0.1"))
    pvc = make_pvc(tmp_path / "validated", tiny_model_dir, train_dir)
    run_ok(pvc, lora(pvc, "epochs=2", "max_steps_per_epoch=5", "model.lora_dropout=0.1",
                     *held_out(val_dir), "run_val_every_n_steps=3"))

    got, want = trained_steps(pvc), trained_steps(plain)
    assert [(m["step"], m["batch_digest"], m["loss"], m["lr"]) for m in got] == \
        [(m["step"], m["batch_digest"], m["loss"], m["lr"]) for m in want]
    assert len(got) == 10
    for epoch in ("epoch_0", "epoch_1"):
        mine, theirs = final_weights(pvc, epoch, True), final_weights(plain, epoch, True)
        assert mine.keys() == theirs.keys() and mine
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), epoch
    assert validation_record.read(plain.output) is None

    record = validation_record.read(pvc.output)
    steps = [e["step"] for e in record.evaluations]
    assert steps == [0, 3, 5, 6, 9, 10]
    assert [(m["step"], m["val_loss"], m["val_tokens"]) for m in val_lines(pvc)] == \
        [(e["step"], e["val_loss"], e["val_tokens"]) for e in record.evaluations]
    assert [e["epoch"] for e in record.evaluations] == [0, 0, 0, 1, 1, 1]
    assert record.rows == VAL_ROWS and record.tokens > 0 and record.every_n_steps == 3
    assert record.base["val_loss"] > record.last["val_loss"]  # it learned the task
    assert record.checkpoints == {
        "epoch_0": {"step": 5, "val_loss": record.evaluation_at(5)["val_loss"]},
        "epoch_1": {"step": 10, "val_loss": record.evaluation_at(10)["val_loss"]}}
    assert record.early_stop is None and pvc.summary()["exit_reason"] == "completed"


@pytest.mark.slow
def test_an_epoch_cut_short_is_measured_at_its_save_and_the_default_is_ten_a_run(
        tmp_path, tiny_model_dir, train_dir, val_dir):
    """max_steps_per_epoch ends each epoch at a break (no boundary after its last step):
    the epoch save measures it. 2 x 5 steps, no N set: every round(10 / 10) = 1 step;
    N = 0: no validation at all. (N = 3 on the same 2 x 5 steps: the validated run of
    test_validation_changes_nothing_about_training_and_runs_when_scheduled.)"""
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, train_dir)
    run_ok(pvc, lora(pvc, "epochs=2", "max_steps_per_epoch=5", *held_out(val_dir)))
    record = validation_record.read(pvc.output)
    assert [e["step"] for e in record.evaluations] == list(range(11))
    assert record.every_n_steps == 1
    assert {n: c["step"] for n, c in record.checkpoints.items()} == {"epoch_0": 5,
                                                                      "epoch_1": 10}
    off = make_pvc(tmp_path / "off", tiny_model_dir, train_dir)
    run_ok(off, lora(off, "epochs=1", "max_steps_per_epoch=2", *held_out(val_dir),
                     "run_val_every_n_steps=0"))
    assert validation_record.read(off.output) is None and val_lines(off) == []


def full(pvc: Pvc, recipe: str, config: str, val: Path) -> list[str]:
    # One step: the base is measured before it; 9 rows -> shards of 5 and 4 + a pad row.
    return [recipe, "--config", config, *pvc.runtime_args(),
            "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", "dataset.packed=False", "epochs=1",
            "batch_size=2", "max_steps_per_epoch=1", "gradient_accumulation_steps=1",
            "seed=1", "dtype=fp32", *held_out(val)]


@pytest.mark.slow
def test_the_base_val_loss_is_the_same_on_one_process_two_processes_and_two_nodes(
        tmp_path, tiny_model_dir, train_dir, val_dir):
    one = make_pvc(tmp_path / "one", tiny_model_dir, train_dir)
    run_ok(one, full(one, "full_finetune_single_device", "llama3_2/1B_full_single_device",
                     val_dir))
    two = make_pvc(tmp_path / "two", tiny_model_dir, train_dir)
    run_ok(two, [f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                 *full(two, "full_finetune_distributed", "llama3_2/1B_full", val_dir)],
           PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0")
    nodes = make_pvc(tmp_path / "nodes", tiny_model_dir, train_dir)
    args = [f"--rdzv_endpoint=127.0.0.1:{free_port()}",
            *full(nodes, "full_finetune_distributed", "llama3_3/70B_full_multinode", val_dir)]
    runs = [start_tune_run(nodes, *args, log=tmp_path / f"node{rank}.log",
                           env=deterministic_env(nodes, PET_NNODES="2", PET_NPROC_PER_NODE="1",
                                                 PET_NODE_RANK=str(rank)))
            for rank in (0, 1)]
    assert [r.wait(timeout=600) for r in runs] == [0, 0], (tmp_path / "node0.log").read_text()[
        -3000:]

    bases = [validation_record.read(p.output).base for p in (one, two, nodes)]
    assert len({b["val_tokens"] for b in bases}) == 1 and bases[0]["val_tokens"] > 0
    assert [b["val_loss"] for b in bases[1:]] == pytest.approx([bases[0]["val_loss"]] * 2,
                                                                abs=1e-5)
    assert summary_world_sizes([two, nodes]) == [2, 2]


def summary_world_sizes(pvcs: list[Pvc]) -> list[int]:
    return [p.summary()["world_size"] for p in pvcs]


@pytest.mark.slow
def test_early_stop_ends_the_run_completed_with_its_epoch_saved_and_says_why(
        tmp_path, tiny_model_dir, train_dir, val_dir):
    """A learning rate far too high: the held-out loss soon stops improving; patience 1
    stops at the first evaluation that is no better, mid-epoch 0 of 2. That epoch is saved
    as the run's final checkpoint, the run exits 0 as completed, and the summary says why."""
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, train_dir)
    args = lora(pvc, "epochs=2", "model.lora_dropout=0.1",
                *held_out(val_dir, "kubetune.early_stop_patience=1"),
                "run_val_every_n_steps=2", "optimizer.lr=10", "lr_scheduler.num_warmup_steps=0")
    stderr = run_ok(pvc, args)
    record = validation_record.read(pvc.output)
    assert record.early_stop is not None, json.dumps(record.evaluations)
    stop = record.early_stop["step"]
    evaluations = record.evaluations
    assert 0 < stop < 6 and evaluations[-1]["step"] == stop  # mid-epoch 0; nothing after
    # Patience 1: the evaluation before the stop was the best, the stop's was no better.
    best = evaluations[-2]
    assert best == record.best and evaluations[-1]["val_loss"] >= best["val_loss"]
    assert record.early_stop == {"patience": 1, "step": stop, "best_step": best["step"],
                                 "best_val_loss": best["val_loss"]}
    assert record.checkpoints == {"epoch_0": {"step": stop,
                                              "val_loss": evaluations[-1]["val_loss"]}}
    assert [m["step"] for m in trained_steps(pvc)] == list(range(1, stop + 1))
    summary = pvc.summary()
    assert summary["exit_reason"] == (
        f"early stop: no improvement in 1 evaluations (best val_loss "
        f"{best['val_loss']:.4f} at step {best['step']})")
    assert summary["checkpoint"] == "epoch_0" and pvc.complete()
    marker = json.loads((pvc.output / "kubetune-complete.json").read_text())
    assert marker["checkpoint"] == "epoch_0"
    # A final save: weights to export, no optimizer state left to resume from.
    assert (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()
    assert not (pvc.output / "epoch_1").exists() and not (pvc.output / "checkpoints").exists()
    assert f"early stop at step {stop}" in stderr


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory) -> Path:
    """A hub dataset's layout: data/train-*.parquet beside data/test-*.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kubetune.tools.demo.tiny_dataset import tiny_rows

    root = tmp_path_factory.mktemp("sources") / "hub"
    (root / "data").mkdir(parents=True)
    rows = tiny_rows(ROWS + VAL_ROWS, seed=3)
    pq.write_table(pa.Table.from_pylist(rows[:ROWS]), root / "data/train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[ROWS:]), root / "data/test-00000-of-00001.parquet")
    return root


@pytest.mark.slow
def test_packed_and_unpacked_runs_measure_the_same_held_out_set(tmp_path, tiny_model_dir,
                                                                hub_dir):
    """The test split is held out whether the training rows are packed or not, on 1 and 2
    processes, and a fraction held out of packed rows too: validation is never packed, so
    the base model's held-out loss is the same number on every path."""
    def packed_args(pvc: Pvc, recipe: str, config: str, *extra: str) -> list[str]:
        return [recipe, "--config", config, *pvc.runtime_args(),
                "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                f"dataset.data_dir={pvc.dataset / 'data'}", "tokenizer.max_seq_len=64",
                "epochs=1", "gradient_accumulation_steps=1", "seed=1", "dtype=fp32", *extra]

    runs = {}
    for name, args, env in (
            ("unpacked", ("lora_finetune_single_device", "llama3_2/1B_lora_single_device",
                          "dataset.packed=False", "batch_size=4"), {}),
            ("packed", ("lora_finetune_single_device", "llama3_2/1B_lora_single_device",
                        "dataset.packed=True", "batch_size=1"), {}),
            ("packed, 2 processes", ("lora_finetune_distributed", "llama3_2/1B_lora",
                                     "dataset.packed=True", "batch_size=1"),
             {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0"})):
        pvc = runs[name] = make_pvc(tmp_path / name.replace(" ", "-").replace(",", ""),
                                    tiny_model_dir, hub_dir)
        rdzv = [f"--rdzv_endpoint=127.0.0.1:{free_port()}"] if env else []
        run_ok(pvc, [*rdzv, *packed_args(pvc, *args)], **env)

    records = {name: validation_record.read(pvc.output) for name, pvc in runs.items()}
    for name, record in records.items():
        assert record is not None and record.split == "test" and record.rows == VAL_ROWS, name
        assert record.last["step"] == runs[name].summary()["steps"] > 0, name
    bases = [r.base for r in records.values()]
    assert len({b["val_tokens"] for b in bases}) == 1
    assert [b["val_loss"] for b in bases] == pytest.approx([bases[0]["val_loss"]] * 3,
                                                            abs=1e-5)
    assert runs["packed"].summary()["train_data"] == {"split": "train", "rows": ROWS}

    # A fraction of packed rows held out: the test split removed, the train split cut.
    import shutil

    only_train = tmp_path / "train-only"
    shutil.copytree(hub_dir, only_train)
    (only_train / "data/test-00000-of-00001.parquet").unlink()
    pvc = make_pvc(tmp_path / "fraction", tiny_model_dir, only_train)
    run_ok(pvc, packed_args(pvc, "lora_finetune_single_device",
                            "llama3_2/1B_lora_single_device", "dataset.packed=True",
                            "batch_size=1", "kubetune.val_fraction=0.25"))
    record = validation_record.read(pvc.output)
    assert record.source == "fraction" and 0 < record.rows < ROWS
    assert pvc.summary()["train_data"]["rows"] == ROWS - record.rows
