"""Every trainer setting acts on every path that documents it, or is refused in one line.

The variables `kubetune train --help` lists (``KUBETUNE_LORA_RANK``, ``KUBETUNE_EPOCHS``,
...) act under `kubetune local` and `tune run` (a TrainJob that says `tune run`, the
drop-in runtimes) as they do under `kubetune train`; a command's own key=value arguments
win over them. A LoRA rank set alone keeps the config's LoRA scale; a warm-up the user did
not set never outlasts the run. Checked where a user looks: the adapter the export
publishes, the learning rate in metrics.jsonl, the config the trainer plans.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kubetune.tools.demo.alpaca_like import write_alpaca_like
from kubetune.trainer.config.recipe_config import load_config
from kubetune.workspace import validation_record
from tests.support.cli import clean_env, kubetune
from tests.support.runtimes import runtime_file, write_trainjob
from tests.support.trainer import Pvc, make_pvc, tune_run
from tests.test_trainer_config_checks import _dry_run_trainer

# The SDK 0.5.0's own pydantic models warn on import; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

LORA_CONFIG = "llama3_2/1B_lora_single_device"  # what `--method lora` and byo-model run
RECIPE = ["lora_finetune_single_device", "--config", LORA_CONFIG,
          "dataset=torchtune.datasets.instruct_dataset"]


def planned_config(stdout: str) -> dict:
    """The merged config a `--kubetune-dry-run` / `--dry-run` prints."""
    return yaml.safe_load(stdout.split("config:\n", 1)[1].split("\ncommand:", 1)[0])


def adapter_config(workspace: Path) -> dict:
    return json.loads((workspace / "export" / "adapter_config.json").read_text())


@pytest.fixture(scope="module")
def local_run_from_env(tmp_path_factory):
    """`kubetune -q local` on the demo, its trainer settings all from the environment."""
    workdir = tmp_path_factory.mktemp("local-env") / "run"
    result = kubetune("-q", "local", "--workdir", str(workdir), env=clean_env(
        KUBETUNE_LORA_RANK="2", KUBETUNE_EPOCHS="1", KUBETUNE_MAX_STEPS="2",
        KUBETUNE_DTYPE="fp32"), timeout=900)
    return result, workdir / "workspace"


@pytest.mark.slow
def test_settings_in_the_environment_act_under_kubetune_local(local_run_from_env):
    result, workspace = local_run_from_env
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((workspace / "output" / "summary.json").read_text())["steps"] == 2
    published = adapter_config(workspace)
    # The rank the variable asked for; the alpha keeps the config's ratio (2).
    assert (published["r"], published["lora_alpha"]) == (2, 4)


@pytest.mark.slow
def test_quiet_leaves_out_torchtunes_info_lines_too(local_run_from_env):
    result, _ = local_run_from_env
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    for chatter in ("Model is initialized", "Setting manual seed", "Tokenizer is initialized",
                    "Learning rate scheduler is initialized", "Starting checkpoint save"):
        assert chatter not in said, chatter
    assert " INFO " not in said


def test_settings_in_the_environment_act_under_tune_run(tmp_path, tiny_model_dir,
                                                        tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    env = pvc.env(KUBETUNE_LORA_RANK="4", KUBETUNE_LEARNING_RATE="1e-3",
                  KUBETUNE_WARMUP_STEPS="3", KUBETUNE_TRAIN_OVERRIDES="epochs=2")
    # The command's own argument wins over its variable, as an option does.
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), "optimizer.lr=2e-3",
                      "--kubetune-dry-run", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = planned_config(result.stdout)
    assert (cfg["model"]["lora_rank"], cfg["model"]["lora_alpha"]) == (4, 8)
    assert cfg["optimizer"]["lr"] == 2e-3 and cfg["epochs"] == 2
    assert cfg["lr_scheduler"]["num_warmup_steps"] == 3


def test_an_alpha_the_user_sets_stays_as_given(tmp_path, tiny_model_dir, tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), "model.lora_alpha=5",
                      "--kubetune-dry-run", env=pvc.env(KUBETUNE_LORA_RANK="8"))
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = planned_config(result.stdout)
    assert (cfg["model"]["lora_rank"], cfg["model"]["lora_alpha"]) == (8, 5)


def test_a_drop_in_runtimes_trainjob_env_acts_on_its_tune_run(tmp_path, tiny_model_dir,
                                                              tiny_dataset_dir):
    spec = {"trainer": {"command": ["tune", "run"],
                        "args": ["dataset=torchtune.datasets.instruct_dataset",
                                 "model.lora_attn_modules=[q_proj,v_proj]"],
                        "env": [{"name": "KUBETUNE_LORA_RANK", "value": "4"},
                                {"name": "KUBETUNE_EPOCHS", "value": "3"}]}}
    result = _dry_run_trainer("torchtune-llama3.2-1b.yaml", spec, tiny_model_dir,
                             tiny_dataset_dir, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cfg = planned_config(result.stdout)
    assert cfg["model"]["lora_rank"] == 4 and cfg["epochs"] == 3


@pytest.fixture(scope="module")
def byo_model_run(tmp_path_factory, tiny_model_dir):
    """The byo-model runtime on its defaults, 40 alpaca-like rows (a tenth held out), the
    rank set alone."""
    root = tmp_path_factory.mktemp("byo-40")
    dataset = root / "rows-40"
    # Alpaca's token counts for the tiny models' byte-level tokenizer.
    write_alpaca_like(dataset, rows=40, scale=0.25)
    job = write_trainjob(root / "job.yaml", "kubetune-byo-model", {
        "initializer": {"model": {"storageUri": f"file://{tiny_model_dir}"},
                        "dataset": {"storageUri": f"file://{dataset}"}},
        "trainer": {"env": [{"name": "KUBETUNE_LORA_RANK", "value": "8"},
                            {"name": "KUBETUNE_DTYPE", "value": "fp32"},
                            # A held-out set on the runtime's cadence (null: resolved by
                            # the recipe, which the saved config must then say).
                            {"name": "KUBETUNE_VAL_FRACTION", "value": "0.1"},
                            # Its losses only: no answers generated (the costly part).
                            {"name": "KUBETUNE_VAL_PROMPTS", "value": "0"}]}})
    result = kubetune("local", "--workdir", str(root / "run"), "--runtime",
                      str(runtime_file("kubetune-byo-model")), "--trainjob", str(job),
                      env=clean_env(), timeout=900)
    return result, Pvc(root / "run" / "workspace")


@pytest.mark.slow
def test_a_rank_set_alone_keeps_the_configs_lora_scale(byo_model_run):
    result, pvc = byo_model_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    base = load_config(LORA_CONFIG).model
    published = adapter_config(pvc.root)
    assert published["r"] == 8
    assert published["lora_alpha"] / published["r"] == base.lora_alpha / base.lora_rank
    said = [line for line in result.stdout.splitlines() if "model.lora_alpha=16" in line]
    assert len(said) == 1 and "keeps config" in said[0], said


@pytest.mark.slow
def test_a_short_run_on_the_runtimes_defaults_reaches_its_learning_rate(byo_model_run):
    result, pvc = byo_model_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    peak = load_config(LORA_CONFIG).optimizer.lr
    steps = [m for m in pvc.metrics() if "loss" in m]
    assert steps and max(m["lr"] for m in steps) == pytest.approx(peak)
    capped = [line for line in result.stdout.splitlines()
              if "lr_scheduler.num_warmup_steps: 100 -> " in line]
    assert len(capped) == 1, result.stdout[-3000:]
    assert "warm-up (lr_scheduler.num_warmup_steps" not in result.stdout  # no warning left


@pytest.mark.slow
def test_the_saved_config_and_card_hold_what_the_recipe_ran(byo_model_run):
    """Issue 62: the fits the recipe made (the warm-up capped to the run, the held-out
    cadence resolved from null) are what kubetune-config.yaml and the card say, and step
    1 trains at a learning rate above zero."""
    result, pvc = byo_model_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = re.search(r"lr_scheduler\.num_warmup_steps: 100 -> (\d+)", result.stdout)
    assert said, result.stdout[-3000:]
    warmup = int(said.group(1))
    saved = yaml.safe_load((pvc.output / "kubetune-config.yaml").read_text())
    assert saved["lr_scheduler"]["num_warmup_steps"] == warmup
    assert {"key": "lr_scheduler.num_warmup_steps", "planned": 100,
            "ran": warmup} in saved["kubetune"]["fitted"]
    # What ran, from the steps' own learning rates: the warm-up the config names (this
    # run's few steps cap it to none), so step 1 at the peak (tests/test_trainer_resume.py
    # checks a warm-up of 2 steps).
    peak = saved["optimizer"]["lr"]
    lrs = [m["lr"] for m in pvc.metrics() if "loss" in m]
    assert len(lrs) > warmup
    assert lrs[:warmup + 1] == pytest.approx(
        [peak * (i + 1) / warmup for i in range(warmup)] + [peak])
    # The held-out cadence the runtime leaves null: the one the evaluations kept.
    record = validation_record.read(pvc.output)
    assert record is not None and record.evaluations
    assert saved["run_val_every_n_steps"] == record.every_n_steps > 0
    assert {"key": "run_val_every_n_steps", "planned": None,
            "ran": record.every_n_steps} in saved["kubetune"]["fitted"]
    steps = [int(e["step"]) for e in record.evaluations]
    assert any(step % record.every_n_steps == 0 for step in steps if step), steps
    card = (pvc.root / "export" / "README.md").read_text()
    assert f"| warmup steps | `{warmup}` |" in card, card
    assert f"| evaluated every (optimizer steps) | `{record.every_n_steps}` |" in card, card


@pytest.mark.slow
def test_one_line_names_the_lora_settings_and_dtype_with_why(byo_model_run):
    result, _ = byo_model_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if "training with lora:" in line]
    assert len(said) == 1, result.stdout[-3000:]
    assert re.search(r"rank 8 \(set by [^)]*LORA_RANK[^)]*\), alpha 16 \(the config's "
                     r"alpha/rank ratio kept for the rank set\), on q_proj, v_proj[^(]* "
                     r"\(the config's\); dtype fp32 \(set by [^)]*DTYPE[^)]*\)", said[0]), said
    # Before the recipe starts (its setup's warm-up line comes before step 1).
    assert result.stdout.index(said[0]) < result.stdout.index("lr_scheduler.num_warmup_steps:")
