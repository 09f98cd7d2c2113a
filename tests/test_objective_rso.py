"""RSO (torchtune's hinge preference loss) as ``--objective rso``: one module
(``kubetune.trainer.objectives.rso``) and one registry entry, on every rail DPO has.
What tells it from DPO: the loss. With the policy equal to the reference (LoRA's B
starts at zero), DPO's first loss is ln 2 and the hinge's is max(0, 1 - gamma * 0) = 1."""

from __future__ import annotations

import json

import pytest
import yaml

from kubetune.errors import EXIT_BAD_INPUT
from kubetune.trainer.objectives import registry
from kubetune.trainer.objectives.rso import RSO_LOSS
from kubetune.trainer.request.topology import Topology
from tests.support.cli import clean_env, kubetune
from tests.support.preference_data import pairs, trl_standard, write_rows
from tests.support.trainer import make_pvc, tune_run
from tests.test_objective_dpo import SHORT


def test_rso_has_dpos_recipes_memory_and_rewards_and_another_loss():
    rso, dpo = registry.get("rso"), registry.get("dpo")
    for method, processes in (("lora", 1), ("lora", 2), ("dora", 2), ("full", 2)):
        topology = Topology(1, processes, 0, None)
        assert rso.recipe_for(method, topology) == dpo.recipe_for(method, topology)
    assert rso.memory_load("full") == dpo.memory_load("full")
    assert rso.logged_parts == dpo.logged_parts
    # A preference objective: its held-out pairs are measured as DPO's, with its own loss.
    assert rso.held_out_metrics == dpo.held_out_metrics == "preference"
    assert registry.of_recipe("lora_dpo_single_device") is dpo  # a drop-in: DPO's loss


@pytest.mark.slow
def test_kubetune_train_objective_rso_trains_with_the_hinge_loss(tmp_path, tiny_model_dir):
    data = write_rows(tmp_path / "data", pairs(trl_standard, 16))
    result = kubetune("train", "--objective", "rso", "--model-dir", str(tiny_model_dir),
                      "--dataset-dir", str(data), "--output-dir", str(tmp_path / "out"),
                      "--val-fraction", "0.25", *SHORT, env=clean_env(KUBETUNE_WORKSPACE=str(tmp_path / "ws"),
                                            KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "lora_dpo_single_device" in result.stderr
    assert f"loss: {RSO_LOSS} (objective rso; the config named " \
           "torchtune.rlhf.loss.DPOLoss)" in result.stderr
    config = yaml.safe_load((tmp_path / "out" / "kubetune-config.yaml").read_text())
    assert config["kubetune"]["objective"] == "rso"
    assert config["loss"] == {"_component_": RSO_LOSS}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    kept = summary["rows"]["train"]["kept"]  # the pairs not held out
    assert kept + summary["validation"]["rows"] == 16
    assert summary["steps"] == kept // 4  # whole batches of 4 (the DPO recipes drop the last)
    assert summary["first_loss"] == pytest.approx(1.0, abs=1e-4)  # the hinge at margin 0
    assert summary["preference"]["first_reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert summary["preference"]["last_reward_accuracy"] is not None
    # Its held-out pairs measured as DPO's are, with the hinge: 1 at the base, where the
    # policy is its reference (rewards and margin 0, accuracy 0 under the strict >).
    assert "validation under RSO: the held-out pairs' RSO loss" in result.stderr
    v = summary["validation"]
    assert v["base_val_loss"] == pytest.approx(1.0, abs=1e-4)
    assert (v["base_reward_accuracy"], v["base_reward_margin"]) == (0.0, 0.0)
    assert v["last_reward_accuracy"] is not None


def test_kubetune_objective_rso_under_tune_run_is_the_dpo_recipe_with_rsos_loss(
        tmp_path, tiny_model_dir):
    # The drop-in path: the runtime's `tune run` of a DPO recipe, the objective from the
    # environment, resolved once by the plan; a user's loss.gamma is kept.
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir,
                   write_rows(tmp_path / "data", pairs(trl_standard, 16)))
    result = tune_run(pvc, "lora_dpo_single_device", "--config",
                      "llama3_1/8B_lora_dpo_single_device", *pvc.runtime_args(), *SHORT,
                      "loss.gamma=0.25", "--kubetune-dry-run",
                      env=pvc.env(KUBETUNE_OBJECTIVE="rso"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"note: loss: {RSO_LOSS} (objective rso" in result.stdout
    config = yaml.safe_load(_dry_run_config(result.stdout))
    assert config["kubetune"]["objective"] == "rso"
    assert config["loss"] == {"_component_": RSO_LOSS, "gamma": 0.25}
    # SFT's recipe does not train it: refused in one line, as DPO is.
    refused = tune_run(pvc, "lora_finetune_single_device", "--config",
                       "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                       "--kubetune-dry-run", env=pvc.env(KUBETUNE_OBJECTIVE="rso"))
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-2000:]
    assert "KUBETUNE_OBJECTIVE=rso, but the command runs lora_finetune_single_device (sft)" \
        in refused.stderr


def _dry_run_config(stdout: str) -> str:
    """The merged config a dry run prints, between ``config:`` and ``command:``."""
    return stdout.split("\nconfig:\n", 1)[1].split("\ncommand: ", 1)[0]
