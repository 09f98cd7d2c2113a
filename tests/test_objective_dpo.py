"""Preference tuning (DPO) on the rails SFT has: the data in users' shapes, torchtune's DPO
recipes drop-in and chosen by `--objective dpo`, the rewards on the progress line, the
report and the summary, one loss meaning on 1 and 2 processes, and a tuned export that
prefers the chosen answers more than its base does (measured by transformers)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
from pathlib import Path

import pytest

from kubetune.errors import EXIT_BAD_INPUT, BadInputError
from kubetune.trainer.objectives import dpo, preference_rows
from kubetune.trainer.objectives import registry
from kubetune.trainer.request.topology import Topology
from tests.support.cli import REPO, clean_env, kubetune
from tests.support.preference_data import (REFUSAL, SHAPES, hh_rlhf, pairs, trl_conversational,
                                           trl_standard, whole_conversations, write_rows)
from tests.support.trainer import make_pvc, tune_run
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

LN2 = math.log(2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What every run here keeps short and exact.
SHORT = ["epochs=1", "max_steps_per_epoch=3", "batch_size=4", "gradient_accumulation_steps=1",
         "dtype=fp32", "seed=0"]


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_reads_as_one_prompt_and_two_answers(shape):
    row = SHAPES[shape](2, 3)
    assert preference_rows.shape_name(row) is not None
    pair = preference_rows.pair_of(row)
    assert [t.content for t in pair.prompt if t.role == "user"] == ["What is 2+3?"]
    assert [(t.role, t.content) for t in pair.chosen] == [("assistant", "5")]
    assert [(t.role, t.content) for t in pair.rejected] == [("assistant", REFUSAL)]
    assert preference_rows.problem(pair) is None


def test_sft_rows_are_no_preference_shape_and_bad_pairs_are_named():
    assert preference_rows.shape_name({"input": "1+1", "output": "2"}) is None
    assert preference_rows.shape_name({"messages": [{"role": "user", "content": "x"}]}) is None
    same = preference_rows.pair_of({"prompt": "q", "chosen": "a", "rejected": "a"})
    assert preference_rows.problem(same) == "chosen == rejected"
    empty = preference_rows.pair_of({"prompt": "q", "chosen": "a", "rejected": " "})
    assert preference_rows.problem(empty) == "empty rejected"
    hh_same = hh_rlhf(1, 1) | {"rejected": hh_rlhf(1, 1)["chosen"]}
    assert preference_rows.problem(preference_rows.pair_of(hh_same)) == "chosen == rejected"


@pytest.mark.parametrize("shape", SHAPES)
def test_the_builder_trains_on_the_answers_only_and_drops_bad_pairs(shape, tmp_path,
                                                                    tiny_model_dir):
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX
    from torchtune.models.llama3 import llama3_tokenizer

    from kubetune.trainer.objectives.preference_data import preference_dataset

    good = pairs(SHAPES[shape], 6)
    same = dict(good[0], rejected=good[0]["chosen"])
    empty = dict(good[1], chosen="" if isinstance(good[1]["chosen"], str) else [])
    data = write_rows(tmp_path / "data", [*good, same, empty])
    tokenizer = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"))
    dataset = preference_dataset(tokenizer, source="json",
                                 data_files=str(data / "train.jsonl"))
    assert len(dataset) == len(good)
    row = dataset[0]
    for side, answer in (("chosen", "0"), ("rejected", REFUSAL)):
        trained = [t for t, label in zip(row[f"{side}_input_ids"], row[f"{side}_labels"])
                   if label != CROSS_ENTROPY_IGNORE_IDX]
        # The answer (and the end of the turn), never the question.
        assert answer in tokenizer.decode(trained)
        assert "What is" not in tokenizer.decode(trained)
    # Both sides share the prompt's tokens.
    shared = row["chosen_labels"].index(next(x for x in row["chosen_labels"]
                                             if x != CROSS_ENTROPY_IGNORE_IDX))
    assert row["chosen_input_ids"][:shared] == row["rejected_input_ids"][:shared]


def test_the_token_cache_serves_the_pairs_the_builder_made(tmp_path, tiny_model_dir):
    """Cached pairs are the builder's, token for token (a pair whose answers were cut away
    included: the recipe trains on it uncached), and a second build maps the entry."""
    from torchtune.models.llama3 import llama3_tokenizer

    from kubetune.trainer.data.token_cache import adopt
    from kubetune.trainer.data.token_cache.datasets import CachedPairs
    from kubetune.trainer.data.token_cache.settings import CacheSettings
    from kubetune.trainer.objectives.preference_data import preference_dataset

    long_prompt = "What is " + " + ".join(["1"] * 200) + "?"
    rows = pairs(trl_standard, 6) + [{"prompt": long_prompt, "chosen": "200",
                                            "rejected": REFUSAL}]
    data = write_rows(tmp_path / "data", rows)
    tokenizer = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"),
                                 max_seq_len=64)
    cfg = {"_component_": dpo.PREFERENCE_BUILDER, "source": "json",
           "data_files": str(data / "train.jsonl")}
    settings = CacheSettings(root=tmp_path / "cache", tokenizer_cfg={"max_seq_len": 64},
                             report_cuts=False, primary=True, cores=1, local_processes=1)
    built = preference_dataset(tokenizer, source="json", data_files=cfg["data_files"])
    first = adopt.cached(built, [], cfg, tokenizer, -100, settings, pack_now=None)
    assert isinstance(first, CachedPairs) and first.rows.meta["pairs"] == len(built) == 7
    assert [first[i] for i in range(len(first))] == [built[i] for i in range(len(built))]
    assert len([d for d in (tmp_path / "cache").iterdir() if d.is_dir()]) == 1
    again = adopt.cached(built, [], cfg, tokenizer, -100, settings, pack_now=None)
    assert again.rows.where is not None and again[6] == built[6]
    # Another max_seq_len is another entry.
    longer = CacheSettings(**{**settings.__dict__, "tokenizer_cfg": {"max_seq_len": 128}})
    adopt.cached(built, [], cfg, tokenizer, -100, longer, pack_now=None)
    assert len([d for d in (tmp_path / "cache").iterdir() if d.is_dir()]) == 2


@pytest.mark.parametrize("method, processes, recipe", [
    ("lora", 1, "lora_dpo_single_device"), ("lora", 2, "lora_dpo_distributed"),
    ("dora", 2, "lora_dpo_distributed"), ("full", 2, "full_dpo_distributed")])
def test_objective_dpo_picks_torchtunes_recipe(method, processes, recipe):
    chosen, config, implied = registry.get("dpo").recipe_for(method,
                                                             Topology(1, processes, 0, None))
    assert chosen == recipe and "dpo" in config
    assert ("model.use_dora=True" in implied) == (method == "dora")


@pytest.mark.parametrize("method, processes", [("full", 1), ("qlora", 1), ("qlora", 2),
                                               ("dora", 1)])
def test_a_method_no_dpo_recipe_runs_is_one_line_naming_what_can(method, processes):
    with pytest.raises(BadInputError, match=f"DPO with method {method}.*available: lora"):
        registry.get("dpo").recipe_for(method, Topology(1, processes, 0, None))


def test_the_logger_reads_a_summed_loss_as_the_mean_and_keeps_the_rewards(tmp_path, capsys):
    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger

    logger = JsonLinesMetricLogger(str(tmp_path), loss_summed_over=2)
    logger.log_dict({"loss": 2 * LN2, "lr": 1e-3, "rewards/accuracies": 0.75,
                     "rewards/margins": 0.125}, step=1)
    logger.close()
    [record] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert record["loss"] == pytest.approx(LN2)
    assert "loss 0.6931 | reward acc 0.75 | margin 0.1250" in capsys.readouterr().out
    # The TrainJob status carries them beside the loss.
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    status = TrainProgress(environ={}).status_metrics(record)
    assert (status["reward_accuracy"], status["reward_margin"]) == ("0.75", "0.125")


def test_sft_data_for_dpo_is_refused_naming_the_columns(tmp_path, tiny_model_dir,
                                                        tiny_dataset_dir):
    result = kubetune("train", "--objective", "dpo", "--model-dir", str(tiny_model_dir),
                 "--dataset-dir", str(tiny_dataset_dir), "--output-dir",
                 str(tmp_path / "out"), "--dry-run",
                 env=clean_env(KUBETUNE_WORKSPACE=str(tmp_path / "ws"),
                               KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl")))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-2000:]
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert "has columns input, output: DPO needs preference data, columns chosen and " \
           "rejected" in line


# The drop-in run's two bad pairs, named by row (appended after 30 good ones).
DROPPED = ("dataset: 2 of 32 preference pairs dropped (1 chosen == rejected (train.jsonl row "
           "31), 1 empty rejected (train.jsonl row 32)); 30 left")


def _first_losses(pvc) -> list[float]:
    return [r["loss"] for r in pvc.metrics() if "loss" in r]


@pytest.mark.slow
def test_drop_in_lora_dpo_single_device_on_trl_rows(tmp_path, tiny_model_dir):
    # TRL's commonest shape under the DPO config's own dataset default, with a pair whose
    # answers are equal and one with an empty answer.
    rows = pairs(trl_standard, 30)
    rows += [trl_standard(1, 1) | {"rejected": "1+1"} | {"chosen": "1+1"},
             trl_standard(2, 2) | {"rejected": ""}]
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, write_rows(tmp_path / "data", rows))
    result = tune_run(pvc, "lora_dpo_single_device", "--config",
                      "llama3_1/8B_lora_dpo_single_device", *pvc.runtime_args(), *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRL standard" in result.stderr
    assert DROPPED in result.stderr
    assert "| loss 0.6931 | reward acc 0.00 | margin 0.0000 |" in result.stdout
    # No test split: nothing held out, and the hint to hold a fraction out (DPO measures
    # one: tests/test_dpo_held_out.py).
    assert "; no held-out set (no validation or test split besides the one trained on; " \
           "--val-fraction 0.1" in result.stderr
    assert "validation under DPO" not in result.stderr
    summary = pvc.summary()
    assert summary["steps"] == 3 and summary["tokens"] > 0
    assert summary["first_loss"] == pytest.approx(LN2, abs=1e-4)
    assert summary["preference"]["last_reward_accuracy"] is not None
    digests = [r["batch_digest"] for r in pvc.metrics() if "loss" in r]
    assert len(set(digests)) == 3  # each step digests the pairs it trained on
    assert "- reward accuracy: 0.00 ->" in (pvc.output / "kubetune-report.md").read_text()
    assert pvc.complete() and (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()
    # The pairs went through the token cache onto the volume; the same run again reads them
    # from it, drops and counts the same bad pairs, and trains on the same tokens.
    assert "token cache: tokenized 30 preference pairs (30 kept)" in result.stderr
    losses = _first_losses(pvc)
    # Another run of the same job on the volume (into another output_dir: in the same one
    # it would be this run, done).
    again_output = pvc.root / "output-again"
    again = tune_run(pvc, "lora_dpo_single_device", "--config",
                     "llama3_1/8B_lora_dpo_single_device", *pvc.runtime_args(), *SHORT,
                     f"output_dir={again_output}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "token cache: 30 preference pairs mapped from" in again.stderr
    assert "tokenized" not in again.stderr
    assert DROPPED in again.stderr
    metrics = [json.loads(line) for line in (again_output / "metrics.jsonl").open()]
    assert [r["loss"] for r in metrics if "loss" in r] == losses
    assert [r["batch_digest"] for r in metrics if "loss" in r] == digests


@pytest.mark.slow
def test_lora_dpo_on_two_processes_starts_at_the_loss_one_process_does(tmp_path,
                                                                       tiny_model_dir):
    # At the first step the policy is its reference: the DPO loss is ln 2 on any number of
    # processes (lora_dpo_distributed itself logs the sum over them, 2 ln 2).
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir,
                   write_rows(tmp_path / "data", pairs(whole_conversations, 32)))
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}", "lora_dpo_distributed",
                      "--config", "llama3_1/8B_lora_dpo", *pvc.runtime_args(), *SHORT,
                      env=pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert pvc.summary()["world_size"] == 2
    losses = _first_losses(pvc)
    assert losses[0] == pytest.approx(LN2, abs=1e-4)
    assert all(loss < LN2 + 1e-3 for loss in losses)


@pytest.mark.slow
def test_full_dpo_distributed_gets_the_given_checkpoint_as_its_reference(tmp_path,
                                                                         tiny_model_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir,
                   write_rows(tmp_path / "data", pairs(trl_conversational, 32)))
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}", "full_dpo_distributed",
                      "--config", "llama3_1/8B_full_dpo", *pvc.runtime_args(), *SHORT,
                      env=pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0"))
    assert result.returncode == 0, result.stderr[-3000:]
    import yaml

    config = yaml.safe_load((pvc.output / "kubetune-config.yaml").read_text())
    assert config["ref_checkpointer"]["checkpoint_dir"] == str(pvc.model)
    assert config["ref_checkpointer"]["checkpoint_files"] == \
        config["checkpointer"]["checkpoint_files"]
    assert _first_losses(pvc)[0] == pytest.approx(LN2, abs=1e-4)
    assert pvc.complete()
    # The exporter takes a full DPO run as a full SFT one: a merged model, its chat
    # template checked against the pairs the trainer recorded.
    exported = kubetune("export", env=pvc.env())
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "reproduces the" in exported.stderr and "exported merged" in exported.stderr
    assert (pvc.root / "export" / "model.safetensors.index.json").is_file()


@pytest.mark.slow
def test_a_dpo_tuned_export_prefers_the_chosen_answers_more_than_its_base(
        tmp_path, serving_python):  # noqa: F811
    # A learnable preference: the sum against a refusal. Measured on questions the run
    # never saw, through transformers and PEFT, as serving code scores answers.
    trained = [trl_standard(a, b) for a in range(8) for b in range(8)]
    held_out = [trl_standard(a, b) for a, b in ((9, 3), (8, 9), (1, 9), (9, 9))]
    data = write_rows(tmp_path / "data", trained)
    result = kubetune("local", "--workdir", str(tmp_path / "wd"), "--objective", "dpo",
                      "--dataset", f"file://{data}", "epochs=1", "max_steps_per_epoch=8",
                      "batch_size=8", "gradient_accumulation_steps=1", "optimizer.lr=3e-3",
                      "lr_scheduler.num_warmup_steps=0", "seed=0", "dtype=fp32",
                      timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reward accuracy: 0.00 (first) -> " in result.stdout
    pairs_file = tmp_path / "held-out.json"
    pairs_file.write_text(json.dumps(held_out))
    measured = subprocess.run(
        [str(serving_python), str(REPO / "tests" / "support" / "preference_margin.py"),
         str(tmp_path / "wd" / "workspace" / "export"), str(pairs_file)],
        capture_output=True, text=True, timeout=600)
    assert measured.returncode == 0, measured.stderr[-3000:]
    margins = json.loads(measured.stdout.strip().splitlines()[-1])
    # log p(chosen) - log p(rejected), in nats, averaged over the held-out pairs.
    assert margins["tuned"] > margins["base"] + 1.0, margins


@pytest.mark.slow
def test_lora_dpo_stopped_mid_epoch_resumes_exactly(tmp_path, tiny_model_dir):
    from tests.test_trainer_resume import (assert_same_training, deterministic_env,
                                           reference_run, stop_after, trained_steps)

    data = write_rows(tmp_path / "data", pairs(trl_standard, 24))  # 6 steps of 4

    def args(pvc):
        return ["lora_dpo_single_device", "--config", "llama3_1/8B_lora_dpo_single_device",
                *pvc.runtime_args(), "epochs=1", "batch_size=4", "gradient_accumulation_steps=1",
                "dtype=fp32", "seed=1", "optimizer.lr=3e-3", "lr_scheduler.num_warmup_steps=1"]

    reference = reference_run(tmp_path, tiny_model_dir, data, args, {})
    assert len(trained_steps(reference)) == 6
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, data)
    assert stop_after(tmp_path, pvc, args(pvc), deterministic_env(pvc), 2, "first") < 6
    result = tune_run(pvc, *args(pvc), env=deterministic_env(pvc))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training(pvc, reference, "epoch_0", adapter=True)


def test_kubetune_size_counts_the_pairs_and_full_dpos_reference(tmp_path):
    from tests.test_size import LLAMA_3_1_8B, config_file, size

    model = str(config_file(tmp_path, LLAMA_3_1_8B))
    common = ["--model", model, "--gpu-memory", "80Gi", "--gpus-per-node", "8"]
    sft_full = size(*common, "--method", "full")
    dpo_full = size(*common, "--method", "full", "--objective", "dpo")
    # The frozen reference copy: more memory for the same GPUs, or more GPUs.
    assert dpo_full["gpus_per_node"] >= max(2, sft_full["gpus_per_node"])
    sft_lora = size(*common, "--method", "lora", "--max-seq-len", "2048")
    dpo_lora = size(*common, "--method", "lora", "--max-seq-len", "2048",
                    "--objective", "dpo")
    # Chosen and rejected answers run through the model together: twice the activations.
    assert dpo_lora["gpu_memory_gib_per_device"] > sft_lora["gpu_memory_gib_per_device"]


def test_packing_preference_pairs_is_one_line():
    from omegaconf import OmegaConf

    from kubetune.trainer.data.dataset_check import DatasetSample

    section = OmegaConf.create({"_component_": "torchtune.datasets.stack_exchange_paired_dataset",
                                "packed": True})
    found = DatasetSample(files=[Path("train.jsonl")], columns=["prompt", "chosen", "rejected"],
                          rows=[trl_standard(1, 2)], total_rows=1)
    with pytest.raises(BadInputError, match="do not pack preference pairs"):
        dpo.choose_builder(section, found, builder_named=False)


def test_an_objective_the_tune_run_recipe_does_not_train_is_refused(tmp_path, tiny_model_dir,
                                                                    tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      "dataset=torchtune.datasets.instruct_dataset", "--kubetune-dry-run",
                      env=pvc.env(KUBETUNE_OBJECTIVE="dpo"))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-2000:]
    assert "KUBETUNE_OBJECTIVE=dpo, but the command runs lora_finetune_single_device (sft)" \
        in result.stderr


def test_data_with_no_pair_to_learn_from_is_the_users_line(tmp_path, tiny_model_dir):
    from torchtune.models.llama3 import llama3_tokenizer

    from kubetune.errors import EXIT_BAD_INPUT
    from kubetune.trainer.objectives.preference_data import preference_dataset
    from kubetune.trainer.recipe_process import failure_report

    data = write_rows(tmp_path / "data", [trl_standard(1, 1) | {"rejected": "2"}
                                          | {"chosen": "2"}, trl_standard(2, 2) | {"chosen": ""}])
    tokenizer = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"))
    with pytest.raises(BadInputError) as refused:
        preference_dataset(tokenizer, source="json", data_files=str(data / "train.jsonl"))
    assert "all 2 rows dropped (1 chosen == rejected (train.jsonl row 1), 1 empty chosen " \
           "(train.jsonl row 2))" in str(refused.value)
    # Raised in the recipe process, it is the failure record's one line, exit 65.
    record = failure_report.classify(refused.value)
    assert record.exit_code == EXIT_BAD_INPUT and "no preference pair" in record.message


def test_an_over_long_pair_is_cut_to_the_context_and_its_loss_stays_finite(tmp_path,
                                                                          tiny_model_dir):
    import torch
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX, padded_collate_dpo
    from torchtune.models.llama3 import llama3_tokenizer
    from torchtune.rlhf import get_batch_log_probs
    from torchtune.rlhf.loss import DPOLoss

    from kubetune.trainer.objectives.preference_data import preference_dataset

    long_prompt = "What is " + " + ".join(["1"] * 200) + "?"
    data = write_rows(tmp_path / "data", [{"prompt": long_prompt, "chosen": "200",
                                           "rejected": REFUSAL}])
    tokenizer = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"),
                                 max_seq_len=64)
    row = preference_dataset(tokenizer, source="json", data_files=str(data / "train.jsonl"))[0]
    assert len(row["chosen_input_ids"]) <= 64 and len(row["rejected_input_ids"]) <= 64
    # The answers were cut away: nothing to train on, and a finite loss (ln 2), never NaN.
    assert set(row["chosen_labels"]) == {CROSS_ENTROPY_IGNORE_IDX}
    ids, labels = padded_collate_dpo([row])
    log_probs = get_batch_log_probs(torch.randn(*ids.shape, 300), labels)
    loss, _, _ = DPOLoss()(log_probs[:1], log_probs[1:], log_probs[:1], log_probs[1:])
    assert torch.isfinite(loss).all() and float(loss) == pytest.approx(0.6931, abs=1e-4)
