"""A DPO run as a user meets it (issue 54 §2-§4): its held-out pairs measured from the
base to the end (DPO loss, reward accuracy, margins) in the log, metrics, TrainJob status,
summary.json, report, manifest and model card; the export naming the objective; the pairs
read, dropped (named by file and row) and trained; a line when the data makes few
optimizer steps; early stopping that waits for the warm-up; and the refusal of full DPO
on one process whose hint, run, trains.

One DPO run is shared by the slow assertions here (``dpo_run``): HH-RLHF pairs with bad
rows in a hub layout (``data/train-*.jsonl``, ``data/test-*.jsonl``) served by the local
hub (tests/support/hub_server.py), fetched by the dataset initializer, trained by
`kubetune train --objective dpo` reporting to a local TrainJob status server, exported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kubetune.errors import EXIT_BAD_INPUT, BadInputError
from tests.support import shared_runs, status_server
from tests.support.cli import kubetune
from tests.support.hub_server import HubServer
from tests.support.preference_data import hh_rlhf, pairs, trl_standard, write_rows
from tests.support.trainer import make_pvc

LN2 = math.log(2)
TRAIN_FILE = "train-00000-of-00001.jsonl"
# Where the bad rows sit in the training file (row numbers from 1), and why each drops.
BAD_ROWS = {6: "missing chosen", 22: "empty chosen", 43: "chosen == rejected"}


# -- cheap: the parts, without a run ------------------------------------------------------

def test_a_pair_without_chosen_is_missing_and_one_with_it_empty_is_empty():
    from kubetune.trainer.objectives.preference_rows import row_problem

    assert row_problem({"prompt": "q", "rejected": "no"}) == "missing chosen"
    assert row_problem({"prompt": "q", "chosen": None, "rejected": "no"}) == "missing chosen"
    assert row_problem({"prompt": "q", "chosen": "", "rejected": "no"}) == "empty chosen"
    assert row_problem({"prompt": "q", "chosen": "yes", "rejected": []}) == "empty rejected"
    assert row_problem({"prompt": "q", "chosen": "a", "rejected": "a"}) == "chosen == rejected"
    assert row_problem({"prompt": "q", "chosen": "a", "rejected": "b"}) is None


def test_dropped_pairs_are_named_by_file_and_row_the_first_ten_then_a_count(tmp_path,
                                                                              tiny_model_dir):
    from torchtune.models.llama3 import llama3_tokenizer

    from kubetune.trainer.data.row_counts import COUNTS_ATTRIBUTE
    from kubetune.trainer.objectives.preference_data import preference_dataset

    good = pairs(trl_standard, 4)
    first = [good[0], {"prompt": "q", "rejected": "r"}, good[1]]  # row 2: no chosen
    second = [good[2]] + [trl_standard(1, 1) | {"chosen": ""}] * 11 + [good[3]]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in second))
    tokenizer = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"))
    dataset = preference_dataset(tokenizer, source="json", data_files=[
        str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
    assert len(dataset) == 4
    counts = getattr(dataset, COUNTS_ATTRIBUTE)
    assert (counts.read, counts.drops.count, counts.kept) == (16, 12, 4)
    assert counts.drops.text() == (
        "11 empty chosen (b.jsonl row 2, b.jsonl row 3, b.jsonl row 4, b.jsonl row 5, "
        "b.jsonl row 6, b.jsonl row 7, b.jsonl row 8, b.jsonl row 9, b.jsonl row 10 and 2 "
        "more), 1 missing chosen (a.jsonl row 2)")


def test_the_few_steps_line_says_how_many_will_run_and_what_to_change():
    from kubetune.trainer.recipe_process.few_steps import note

    # The two cases: 57 DPO pairs with the DPO config's accumulation of 8 (batch 4,
    # drop_last: 14 batches), 300 SFT rows with batch 8 and an inherited accumulation of 8.
    dpo = note(57, "preference pairs", 14, 4, 8, 1, 1, None)
    assert dpo.startswith("data: 57 preference pairs make 1 optimizer step (batch_size=4 x "
                          "gradient_accumulation_steps=8 x 1 process = 32 per step, 1 epoch)")
    assert "gradient_accumulation_steps=1 makes 14" in dpo and "epochs=10 makes 10" in dpo
    sft = note(300, "rows", 37, 8, 8, 1, 1, None)
    assert sft.startswith("data: 300 rows make 4 optimizer steps")
    assert "gradient_accumulation_steps=1 makes 37" in sft and "epochs=3 makes 12" in sft
    # Accumulation 1 already: a smaller batch; enough steps, or a run capped on purpose: none.
    assert "batch_size=1 makes about 20; epochs=2 makes 10" in note(20, "rows", 5, 4, 1, 1, 1,
                                                                   None)
    assert note(300, "rows", 37, 8, 1, 1, 1, None) is None
    assert note(300, "rows", 37, 8, 8, 1, 1, 2) is None


def test_early_stopping_counts_its_patience_only_after_the_warm_up():
    from kubetune.trainer.validation.early_stop import EarlyStop

    # Patience 1 with a 2-step warm-up: steps 1 and 2 (the learning rate still rising, 0 at
    # step 1) may not better the base and do not count; step 3 is the first that does.
    stop = EarlyStop(patience=1, warmup_steps=2)
    for step, loss in ((0, 1.0), (1, 1.0), (2, 1.05)):
        assert not stop.observe(step, loss)
    assert stop.observe(3, 1.01) and stop.best_step == 0
    # Without a warm-up, as before: the first evaluation without improvement stops it.
    plain = EarlyStop(patience=1)
    assert not plain.observe(0, 1.0) and plain.observe(1, 1.0)
    replayed = EarlyStop.replayed(1, [{"step": 0, "val_loss": 1.0}, {"step": 1, "val_loss": 1.2}],
                                  warmup_steps=1)
    assert not replayed.exhausted


def test_full_dpo_on_one_process_names_the_hint_of_the_path_the_user_is_on():
    from kubetune.entrypoints.local import LOCAL_SPELLINGS
    from kubetune.trainer.objectives import registry
    from kubetune.trainer.request.topology import Topology

    one = Topology(1, 1, 0, None)
    for name in ("dpo", "rso"):  # RSO refuses as DPO does, through the same door
        with pytest.raises(BadInputError, match=r"\(a TrainJob's numProcPerNode: 2, "
                                                r"PET_NPROC_PER_NODE=2\)$"):
            registry.get(name).recipe_for("full", one)
        with pytest.raises(BadInputError,
                           match=r"available: .*full on 2\+ processes \(--nproc 2\)$"):
            registry.get(name).recipe_for("dora", one, LOCAL_SPELLINGS)


def test_the_status_and_progress_line_carry_the_held_out_rewards():
    from kubetune.trainer.metric_logging.validation_progress import ValidationProgress

    progress = ValidationProgress()
    base = {"step": 0, "val_loss": LN2, "val_reward_accuracy": 0.0, "val_reward_margin": 0.0,
            "val_chosen_reward": 0.0, "val_rejected_reward": 0.0}
    progress.add(base)
    later = {**base, "step": 4, "val_loss": 0.5, "val_reward_accuracy": 0.75,
             "val_reward_margin": 0.25}
    progress.add(later)
    assert progress.text(later) == (
        "validation: step 4 | val_loss 0.5000 | base 0.6931 | best 0.5000 @ step 4 | "
        "reward acc 0.75 | margin 0.2500 | chosen 0.0000 | rejected 0.0000")
    status = progress.status_metrics(later)
    assert (status["val_reward_accuracy"], status["val_reward_margin"]) == ("0.75", "0.25")


# -- one shared DPO run --------------------------------------------------------------------

def _hub_layout() -> dict[str, bytes]:
    good = pairs(hh_rlhf, 40)
    rows = list(good)
    rows.insert(5, {"rejected": hh_rlhf(1, 1)["rejected"]})  # row 6: no chosen at all
    rows.insert(21, hh_rlhf(2, 2) | {"chosen": ""})  # row 22
    rows.append(hh_rlhf(3, 3) | {"rejected": hh_rlhf(3, 3)["chosen"]})  # row 43
    held_out = [hh_rlhf(a, 9) for a in range(8)]
    lines = lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode()  # noqa: E731
    return {"README.md": b"# preference pairs\n", f"data/{TRAIN_FILE}": lines(rows),
            "data/test-00000-of-00001.jsonl": lines(held_out)}


def _build_dpo_run(workdir: Path, model_dir: Path) -> None:
    hub = HubServer().start()
    server = status_server.start(workdir / "status")
    try:
        hub.add_repo("org/prefs", _hub_layout(), repo_type="dataset")
        pvc = make_pvc(workdir / "pvc", model_dir, None)
        env = pvc.env(HF_ENDPOINT=hub.url)
        fetched = kubetune("init-dataset", env={**env, "STORAGE_URI": "hf://org/prefs"},
                           timeout=300)
        # Only the trainer reports to the status server: its last report is the run's end.
        trained = kubetune("train", "--objective", "dpo", "batch_size=4",
                           "gradient_accumulation_steps=4", "dtype=fp32", "seed=0",
                           "optimizer.lr=3e-3", env={**env, **server.env()}, timeout=900)
        exported = kubetune("export", env=env, timeout=600) if trained.returncode == 0 \
            else None
    finally:
        server.stop()
        hub.stop()
    sent = [r.body for r in server.requests if r.body]
    (workdir / "run.json").write_text(json.dumps({
        "init": [fetched.returncode, fetched.stderr[-3000:]],
        "train": [trained.returncode, trained.stdout, trained.stderr],
        "export": [exported.returncode, exported.stderr[-3000:]] if exported else None,
        "status": sent}))


class DpoRun:
    def __init__(self, workdir: Path) -> None:
        self.root = workdir / "pvc"
        self.output = self.root / "output"
        run = json.loads((workdir / "run.json").read_text())
        assert run["init"][0] == 0, run["init"][1]
        self.code, self.stdout, self.stderr = run["train"]
        assert self.code == 0, self.stderr[-3000:]
        assert run["export"] and run["export"][0] == 0, run["export"]
        self.status = run["status"]

    def summary(self) -> dict:
        return json.loads((self.output / "summary.json").read_text())

    def metrics(self) -> list[dict]:
        return [json.loads(x) for x in (self.output / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def dpo_run(tmp_path_factory, tiny_model_dir) -> DpoRun:
    return DpoRun(shared_runs.shared_run(
        tmp_path_factory, "dpo-held-out-hub",
        lambda workdir: _build_dpo_run(workdir, tiny_model_dir)))


@pytest.mark.slow
def test_hh_rlhf_pairs_from_a_hub_layout_train_through_kubetune_train(dpo_run):
    # Was test_objective_dpo.py's test_kubetune_train_objective_dpo_on_hh_rlhf_rows.
    assert "preference data, HH-RLHF" in dpo_run.stderr
    assert "lora_dpo_single_device" in dpo_run.stderr
    assert "dataset: training on split 'train' (43 rows); validation on split 'test' " \
           "(8 rows)" in dpo_run.stderr
    summary = dpo_run.summary()
    assert summary["steps"] == 2 and summary["tokens"] > 0


@pytest.mark.slow
def test_the_held_out_pairs_are_measured_from_the_base_to_the_end(dpo_run):
    evaluations = [r for r in dpo_run.metrics() if "val_loss" in r]
    assert [e["step"] for e in evaluations] == [0, 1, 2]
    base, last = evaluations[0], evaluations[-1]
    # The base is its own reference: rewards 0, loss ln 2, accuracy 0 (strict >).
    assert base["val_loss"] == pytest.approx(LN2, abs=1e-5)
    assert (base["val_reward_accuracy"], base["val_reward_margin"], base["val_chosen_reward"],
            base["val_rejected_reward"]) == (0.0, 0.0, 0.0, 0.0)
    assert base["val_pairs"] == 8
    # A learnable preference: after two steps the held-out pairs prefer the chosen answers.
    assert last["val_loss"] < LN2 and last["val_reward_margin"] > 0
    assert last["val_reward_accuracy"] > 0.5
    assert last["val_chosen_reward"] > last["val_rejected_reward"]
    assert "validation: step 0 | val_loss 0.6931 | base 0.6931 | best 0.6931 @ step 0 | " \
           "reward acc 0.00 | margin 0.0000 | chosen 0.0000 | rejected 0.0000" in dpo_run.stdout
    assert "validation: 8 held-out preference pairs, every 1 step(s) of 2" in dpo_run.stderr
    v = dpo_run.summary()["validation"]
    assert (v["split"], v["base_reward_accuracy"], v["base_reward_margin"]) == ("test", 0.0, 0.0)
    assert v["last_reward_margin"] == pytest.approx(last["val_reward_margin"])
    assert v["last_reward_accuracy"] == pytest.approx(last["val_reward_accuracy"])
    # The best checkpoint is read by the held-out DPO loss.
    assert v["best_checkpoint"] == "epoch_0"
    assert v["checkpoints"]["epoch_0"]["val_loss"] == pytest.approx(last["val_loss"])


@pytest.mark.slow
def test_the_trainjob_status_carries_the_held_out_rewards(dpo_run):
    sent = [{m["name"]: m["value"] for m in body["trainerStatus"].get("metrics", [])}
            for body in dpo_run.status if "trainerStatus" in body]
    measured = [m for m in sent if "val_reward_accuracy" in m]
    assert measured and float(measured[0]["val_reward_accuracy"]) == 0.0
    final = sent[-1]
    assert float(final["val_reward_margin"]) > 0 and float(final["val_loss"]) < LN2


@pytest.mark.slow
def test_the_report_shows_the_held_out_rewards_and_says_why_the_base_is_zero(dpo_run):
    page = (dpo_run.output / "kubetune-report.md").read_text()
    assert "| | step | val loss | held-out reward acc | held-out margin | held-out chosen | " \
           "held-out rejected |" in page
    assert "| base | 0 | 0.6931 | 0.00 | 0.0000 | 0.0000 | 0.0000 |" in page
    assert "every reward and the margin are 0 by construction" in page
    assert "- held out, base -> last: reward acc 0.00 -> " in page
    # The held-out answers side by side, the chosen answer as the reference.
    assert "**Reference (the chosen answer)**" in page and "**Base model (step 0)**" in page
    assert "**Tuned model (step 2)**" in page


@pytest.mark.slow
def test_pairs_read_dropped_by_row_and_trained_are_counted(dpo_run):
    named = ", ".join(f"1 {why} ({TRAIN_FILE} row {row})" for row, why in BAD_ROWS.items())
    assert f"dataset: 3 of 43 preference pairs dropped ({named}); 40 left" in dpo_run.stderr
    assert f"train: 43 preference pairs read, 3 dropped ({named}), 40 trained" \
        in dpo_run.stderr
    summary = dpo_run.summary()
    assert summary["train_data"] == {"split": "train", "rows": 40}
    train = summary["rows"]["train"]
    assert (train["unit"], train["read"], train["dropped"], train["kept"]) == \
        ("preference pairs", 43, 3, 40)
    assert train["dropped_by"] == {why: {"count": 1, "rows": [f"{TRAIN_FILE} row {row}"]}
                                   for row, why in BAD_ROWS.items()}
    assert summary["rows"]["val"]["kept"] == 8
    page = (dpo_run.output / "kubetune-report.md").read_text()
    assert "- trained on: split `train`, 40 preference pairs" in page
    assert f"- training data: 43 preference pairs read, 3 dropped ({named}), 40 trained" in page


@pytest.mark.slow
def test_the_few_steps_line_comes_before_the_first_step(dpo_run):
    line = ("data: 40 preference pairs make 2 optimizer steps (batch_size=4 x "
            "gradient_accumulation_steps=4 x 1 process = 16 per step, 1 epoch): "
            "gradient_accumulation_steps=1 makes 10; epochs=5 makes 10")
    assert line in dpo_run.stderr
    assert dpo_run.stderr.index(line) < dpo_run.stderr.index("held-out answers (base model")


@pytest.mark.slow
def test_the_export_manifest_and_card_name_the_objective(dpo_run):
    export = dpo_run.root / "export"
    manifest = json.loads((export / "manifest.json").read_text())
    objective = manifest["objective"]
    assert (objective["name"], objective["method"], objective["recipe"]) == \
        ("dpo", "lora", "lora_dpo_single_device")
    assert objective["reference"]["kind"].startswith("the base model")
    assert objective["reference"]["checkpoint_dir"] == str(dpo_run.root / "model")
    assert manifest["held_out"]["split"] == "test"
    assert manifest["held_out"]["val_reward_accuracy"]["base"] == 0.0
    card = (export / "README.md").read_text()
    assert "# export (LoRA DPO fine-tune)" in card
    assert "- objective: direct preference optimization (DPO)" in card
    assert "- reference model: the base model (the policy with its adapters off)" in card
    assert "- held-out reward acc: base 0.00, best " in card
    assert "- dpo" in card.split("---")[1]  # the hub's tag


# -- the refusal's hint, run ---------------------------------------------------------------

@pytest.mark.slow
def test_the_refusal_of_full_dpo_on_one_process_names_a_hint_that_trains(tmp_path):
    data = write_rows(tmp_path / "data", pairs(trl_standard, 8))
    (data / "test.jsonl").write_text("".join(json.dumps(trl_standard(9, b)) + "\n"
                                             for b in range(4)))
    args = ["local", "--workdir", str(tmp_path / "wd"), "--objective", "dpo", "--method",
            "full", "--dataset", f"file://{data}", "--val-prompts", "0", "epochs=1",
            "max_steps_per_epoch=1", "batch_size=2", "gradient_accumulation_steps=1",
            "dtype=fp32"]
    refused = kubetune(*args)
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-2000:]
    [line] = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
    assert line.endswith("torchtune has full_dpo_distributed only; available: lora on 1 "
                         "process or more, dora and full on 2+ processes (--nproc 2)"), line
    ran = kubetune(*args, "--nproc", "2", timeout=900)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    summary = json.loads((tmp_path / "wd" / "workspace" / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["objective"]["recipe"] == \
        "full_dpo_distributed"
    # Measured on both ranks, against full DPO's frozen reference copy.
    assert summary["objective"]["reference"]["kind"] == "a frozen copy"
    v = summary["validation"]
    assert v["base_val_loss"] == pytest.approx(LN2, abs=1e-5) and v["base_reward_margin"] == 0
    assert "held out (base -> last): reward acc 0.00 -> " in ran.stdout


# -- distillation's held-out KD term --------------------------------------------------------

class _KdRecipe:
    """What torchtune's KD recipes hold after setup, as the held-out loop reads it: the
    student and the teacher (tiny torchtune decoders), their chunked losses, the label
    cache."""

    def __init__(self, student, teacher, chunks: int = 2) -> None:
        import torch
        from torchtune.modules.loss import CEWithChunkedOutputLoss, ForwardKLWithChunkedOutputLoss

        for model in (student, teacher):
            model.set_num_output_chunks(chunks)
        self._model, self._teacher_model = student, teacher
        self._loss_fn = CEWithChunkedOutputLoss(num_output_chunks=chunks)
        self._kd_loss_fn = ForwardKLWithChunkedOutputLoss(num_output_chunks=chunks)
        self._device = torch.device("cpu")
        self.ignore_labels_cache = torch.full((4, 1), -100)


def _decoder(seed: int):
    import torch
    from torchtune.models.llama3 import llama3

    torch.manual_seed(seed)
    return llama3(vocab_size=64, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16,
                  max_seq_len=32)


def _entropy(rows: list[dict]) -> float:
    """The mean entropy of ``_decoder(0)``'s next-token distribution at the labelled
    positions (the label shifted one left), computed here from its unchunked logits."""
    import torch

    model, total, count = _decoder(0), 0.0, 0
    with torch.no_grad():
        for row in rows:
            logits = model(torch.tensor([row["tokens"]]))[0]
            log_p = torch.log_softmax(logits.double(), dim=-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            for position, label in enumerate(row["labels"][1:]):
                if label != -100:
                    total, count = total + float(entropy[position]), count + 1
    return total / count


def test_the_held_out_kd_term_sits_beside_the_students_cross_entropy():
    import functools

    from torchtune.data import padded_collate_sft

    from kubetune.trainer.validation import distill_held_out, val_loop

    rows = [{"tokens": list(range(1 + i, 9 + i)), "labels": [-100] * 3 + list(range(4 + i, 9 + i))}
            for i in range(5)]
    collate = functools.partial(padded_collate_sft, padding_idx=0, ignore_idx=-100)
    student = _decoder(0)
    same = _decoder(0)  # a teacher with the student's weights
    measured = distill_held_out.measure(_KdRecipe(student, same), rows, 2, collate, 0, 1)
    # torchtune's forward "KL" is the cross-entropy against the teacher's probabilities: for
    # a teacher that is the student, the student's own entropy at each labelled position.
    assert measured["val_kd_loss"] == pytest.approx(_entropy(rows), rel=1e-5)
    # The cross-entropy is SFT's held-out loss, over the same labelled tokens.
    loss, tokens = val_loop.held_out_loss(_KdRecipe(student, same), rows, 2, collate, 0, 1)
    assert measured["val_loss"] == pytest.approx(loss) and measured["val_tokens"] == tokens
    other = distill_held_out.measure(_KdRecipe(student, _decoder(1)), rows, 2, collate, 0, 1)
    assert other["val_kd_loss"] > 1e-3 and other["val_loss"] == pytest.approx(loss)
