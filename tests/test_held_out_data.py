"""Issue 42: the train split, and only it, on every path the data comes by; a held-out set
(the data's validation or test split, a fraction chosen by content, or the user's own
dataset_val) planned into the merged config; bad held-out input refused before launch.

The data is laid out as hub datasets are (data/train-00000-of-00001.parquet beside
data/test-00000-of-00001.parquet), generated here; each split's rows are told apart by
their size (train: two-digit sums, test: three-digit, validation: four-digit)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetune.trainer.data import held_out_rows
from kubetune.workspace import DATASET_DESCRIPTOR_NAME
from kubetune.trainer.data.split_files import splits_of
from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.trainer import Pvc, make_pvc

TRAIN_ROWS, TEST_ROWS, VALIDATION_ROWS = 128, 32, 24
SHARD = "{split}-00000-of-00001.parquet"


def _rows(n: int, digits: int, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10 ** digits - 1
    pairs = [(rng.randint(low, high), rng.randint(low, high)) for _ in range(n)]
    return {"input": [f"{a}+{b}=" for a, b in pairs], "output": [str(a + b) for a, b in pairs]}


def _write(path: Path, columns: dict[str, list[str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def hub_dataset(root: Path, train: int = TRAIN_ROWS, test: int | None = TEST_ROWS,
                validation: int | None = None) -> Path:
    """A dataset directory in the hub's layout: data/<split>-00000-of-00001.parquet."""
    _write(root / "data" / SHARD.format(split="train"), _rows(train, 2, 0))
    if test is not None:
        _write(root / "data" / SHARD.format(split="test"), _rows(test, 3, 1))
    if validation is not None:
        _write(root / "data" / SHARD.format(split="validation"), _rows(validation, 4, 2))
    return root


def _dry_run(model_dir: Path, dataset_dir: Path, tmp_path: Path, *args: str,
             **env: str) -> subprocess.CompletedProcess:
    return kubetune("train", "--dry-run", "--epochs", "1", *args, env=clean_env(
        KUBETUNE_MODEL_DIR=str(model_dir), KUBETUNE_DATASET_DIR=str(dataset_dir),
        KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"), **env))


def planned(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    return yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])


def _split_of(path: str) -> str:
    return Path(path).name.split("-", 1)[0]


def assert_trains_on_train_only(config: dict, held: str) -> None:
    dataset, val = config["dataset"], config["dataset_val"]
    assert dataset["split"] == "train"
    files = dataset["data_files"]
    assert isinstance(files, dict), files
    assert [_split_of(f) for f in files["train"]] == ["train"]
    assert {split: [_split_of(f) for f in fs] for split, fs in files.items()} == {
        split: [split] for split in files}
    assert config["kubetune"]["data"] == {"split": "train", "rows": TRAIN_ROWS,
                                          "rows_exact": True}
    assert val["split"] == held and val["packed"] is False
    assert val["data_files"] == files
    assert config["kubetune"]["validation"] == {
        "source": "split", "split": held, "train_split": "train", "fraction": None,
        "early_stop_patience": 0, "prompts": 3, "max_new_tokens": 64}
    assert config["run_val_every_n_steps"] is None
    assert "holdout" not in config["kubetune"]


def _initialized(tmp_path: Path, model_dir: Path, source: Path) -> Pvc:
    """A workspace whose dataset directory the dataset initializer filled for ``source``
    (a file:// STORAGE_URI): its files and its descriptor."""
    pvc = make_pvc(tmp_path / "pvc", model_dir, None)
    init = subprocess.run([sys.executable, "-m", "kubetune.entrypoints", "init-dataset"],
                          env=pvc.env(STORAGE_URI=f"file://{source}"), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    assert (pvc.dataset / DATASET_DESCRIPTOR_NAME).is_file()
    return pvc


def test_splits_of_names_files_as_datasets_does():
    assert splits_of(["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
                      "data/test-00000-of-00001.parquet"]) == {
        "train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
        "test": ["data/test-00000-of-00001.parquet"]}
    assert splits_of(["train.jsonl", "valid.jsonl", "test.jsonl"]) == {
        "train": ["train.jsonl"], "validation": ["valid.jsonl"], "test": ["test.jsonl"]}
    assert splits_of(["data/a.parquet", "data/b.parquet"]) == {
        "train": ["data/a.parquet", "data/b.parquet"]}


@pytest.mark.parametrize("path", ["descriptor", "scan", "data_dir"])
def test_every_path_trains_on_train_and_holds_out_test(tmp_path, tiny_model_dir, path):
    source = hub_dataset(tmp_path / "hub")
    args: list[str] = []
    dataset_dir = source  # no descriptor: the trainer scans the directory
    if path == "descriptor":
        dataset_dir = _initialized(tmp_path, tiny_model_dir, source).dataset
    elif path == "data_dir":
        dataset_dir = tmp_path / "elsewhere"
        args = [f"dataset.data_dir={source / 'data'}"]
    result = _dry_run(tiny_model_dir, dataset_dir, tmp_path, *args)
    assert_trains_on_train_only(planned(result), "test")
    assert (f"dataset: training on split 'train' ({TRAIN_ROWS} rows); validation on split "
            f"'test' ({TEST_ROWS} rows)") in result.stdout


@pytest.mark.parametrize("path", ["descriptor", "data_dir"])
def test_a_validation_split_is_held_out_before_test(tmp_path, tiny_model_dir, path):
    source = hub_dataset(tmp_path / "hub", validation=VALIDATION_ROWS)
    if path == "descriptor":
        result = _dry_run(tiny_model_dir,
                          _initialized(tmp_path, tiny_model_dir, source).dataset, tmp_path)
    else:
        result = _dry_run(tiny_model_dir, tmp_path / "elsewhere", tmp_path,
                          f"dataset.data_dir={source / 'data'}")
    config = planned(result)
    assert_trains_on_train_only(config, "validation")
    assert set(config["dataset"]["data_files"]) == {"train", "validation", "test"}
    assert f"validation on split 'validation' ({VALIDATION_ROWS} rows)" in result.stdout


def test_split_test_trains_on_test_and_a_missing_split_names_those_there(
        tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub")
    config = planned(_dry_run(tiny_model_dir, source, tmp_path, "--split", "test"))
    assert config["dataset"]["split"] == "test"
    assert config["kubetune"]["data"]["rows"] == TEST_ROWS
    assert "dataset_val" not in config  # train is no held-out split: nothing to hold out
    result = _dry_run(tiny_model_dir, source, tmp_path, "dataset.split=validation")
    assert result.returncode == 65, result.stderr
    assert error_lines(result) == [
        "error: trainer: dataset.split=validation: the dataset has no split 'validation'; "
        "its files give train, test: use one of them, e.g. dataset.split=train"]
    # Set by its variable, the split is named by the variable (issue 53).
    result = _dry_run(tiny_model_dir, source, tmp_path, KUBETUNE_DATASET_SPLIT="validation")
    assert result.returncode == 65, result.stderr
    assert error_lines(result) == [
        "error: trainer: KUBETUNE_DATASET_SPLIT=validation: the dataset has no split "
        "'validation'; its files give train, test: use one of them, e.g. "
        "KUBETUNE_DATASET_SPLIT=train"]


def test_a_fraction_holds_out_rows_by_content(tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub", train=300, test=None)
    import pyarrow.parquet as pq

    rows = pq.read_table(source / "data" / SHARD.format(split="train")).to_pylist()
    held = sum(held_out_rows.held_out(row, 0.2) for row in rows)
    result = _dry_run(tiny_model_dir, source, tmp_path, "--val-fraction", "0.2")
    config = planned(result)
    assert config["kubetune"]["holdout"] == {"fraction": 0.2}
    assert config["kubetune"]["validation"]["source"] == "fraction"
    assert config["kubetune"]["validation"]["fraction"] == 0.2
    assert config["kubetune"]["validation"]["split"] is None
    assert config["dataset_val"]["split"] == "train" and config["dataset_val"]["packed"] is False
    assert config["kubetune"]["data"] == {"split": "train", "rows": 300 - held,
                                          "rows_exact": True}
    assert (f"training on split 'train' ({300 - held} of its 300 rows); validation on a "
            f"held-out 20% of it ({held} rows, chosen by content)") in result.stdout


def test_fraction_is_deterministic_disjoint_and_about_its_size():
    from datasets import Dataset

    columns = _rows(400, 3, 7)
    data = Dataset.from_dict(columns)
    train = held_out_rows.keep_indices(data, 0.1, "train")
    val = held_out_rows.keep_indices(data, 0.1, "val")
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(400))
    assert 20 <= len(val) <= 60  # 40 expected; a binomial's spread is about 6
    assert held_out_rows.keep_indices(data, 0.1, "val") == val
    # Chosen by content, not by position: the same rows in another order.
    order = list(range(400))
    random.Random(3).shuffle(order)
    shuffled = data.select(order)
    again = held_out_rows.keep_indices(shuffled, 0.1, "val")
    assert sorted(order[i] for i in again) == val
    # A larger fraction holds out a superset: a run with more held out never trains on less.
    assert set(val) <= set(held_out_rows.keep_indices(data, 0.3, "val"))


@pytest.mark.parametrize("value", ["0.7", "0", "-0.1", "1"])
def test_a_fraction_outside_its_range_is_refused(tmp_path, tiny_model_dir, value):
    source = hub_dataset(tmp_path / "hub", test=None)
    result = _dry_run(tiny_model_dir, source, tmp_path, KUBETUNE_VAL_FRACTION=value)
    assert result.returncode == 65, result.stderr
    # click reads the variable as a number (0 -> 0.0).
    assert error_lines(result) == [
        f"error: trainer: KUBETUNE_VAL_FRACTION={float(value)}: the held-out fraction must be "
        "more than 0 and at most 0.5, e.g. KUBETUNE_VAL_FRACTION=0.1"]


def test_an_empty_validation_split_is_refused_naming_it(tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub", test=None)
    _write(source / "data" / SHARD.format(split="validation"), {"input": [], "output": []})
    result = _dry_run(tiny_model_dir, tmp_path / "elsewhere", tmp_path,
                      f"dataset.data_dir={source / 'data'}")
    assert result.returncode == 65, result.stderr
    assert "the held-out split 'validation' holds no rows" in error_lines(result)[0]


def test_a_held_out_set_larger_than_training_is_a_warning(tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub", train=16, test=TEST_ROWS)
    result = _dry_run(tiny_model_dir, source, tmp_path, "--batch-size", "4",
                      "--gradient-accumulation-steps", "1")
    planned(result)
    assert (f"warning: the held-out set ({TEST_ROWS} rows) is larger than the training set "
            "(16 rows)") in result.stdout


def test_torchtune_mains_keys_are_accepted(tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub", validation=VALIDATION_ROWS)
    config = planned(_dry_run(
        tiny_model_dir, source, tmp_path, "dataset_val=torchtune.datasets.instruct_dataset",
        "dataset_val.split=test", "run_val_every_n_steps=2", "--early-stop-patience", "3",
        "--val-prompts", "0", "kubetune.val_max_new_tokens=8"))
    assert config["dataset_val"]["_component_"] == "torchtune.datasets.instruct_dataset"
    assert config["dataset_val"]["split"] == "test"
    assert [_split_of(f) for f in config["dataset_val"]["data_files"]["test"]] == ["test"]
    assert config["run_val_every_n_steps"] == 2
    validation = config["kubetune"]["validation"]
    assert (validation["source"], validation["split"]) == ("config", "test")
    assert (validation["early_stop_patience"], validation["prompts"]) == (3, 0)
    assert validation["max_new_tokens"] == 8  # a real model on CPU answers in minutes
    result = _dry_run(tiny_model_dir, source, tmp_path,
                      "dataset_val=torchtune.datasets.instruct_dataset", "dataset_val.splt=test")
    assert result.returncode == 65
    assert error_lines(result) == [
        "error: trainer: unknown key dataset_val.splt (did you mean dataset_val.split?)"]
    result = _dry_run(tiny_model_dir, source, tmp_path,
                      "dataset_val=torchtune.datasets.instruct_dataset")  # its default: train
    assert planned(result)["kubetune"]["validation"]["source"] == "config"
    assert "warning: dataset_val reads the files trained on (split 'train')" in result.stdout
    result = _dry_run(tiny_model_dir, source, tmp_path, "dataset_val.split=test")
    assert result.returncode == 65
    assert "dataset_val names no builder" in error_lines(result)[0]
    result = _dry_run(tiny_model_dir, source, tmp_path,
                      "dataset_val=torchtune.datasets.instruct_dataset",
                      "dataset_val.split=dev")
    assert result.returncode == 65
    assert "dataset_val.split=dev: the dataset has no split 'dev'" in result.stderr


@pytest.mark.slow
def test_a_run_tokenizes_the_train_split_only(tmp_path, tiny_model_dir):
    source = hub_dataset(tmp_path / "hub")
    pvc = _initialized(tmp_path, tiny_model_dir, source)
    result = kubetune("train", "--epochs", "1", "--max-steps", "2", "--batch-size", "8",
                      "--gradient-accumulation-steps", "1", "dtype=fp32", env=pvc.env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"token cache: tokenized {TRAIN_ROWS} rows" in result.stderr
    merged = yaml.safe_load((pvc.output / "kubetune-config.yaml").read_text())
    assert merged["kubetune"]["data"]["rows"] == TRAIN_ROWS
    samples = json.loads((pvc.output / "kubetune-samples.json").read_text())["samples"]
    prompts = [m["content"] for s in samples for m in s["messages"] if m["role"] == "user"]
    test_prompts = set(_rows(TEST_ROWS, 3, 1)["input"])
    assert prompts and not test_prompts & set(prompts)
    assert all(len(p) == len("12+34=") for p in prompts)  # two-digit sums: train rows


def test_the_recipe_process_trains_on_one_side_and_measures_the_other(
        tmp_path, tiny_model_dir):
    """The recipe's own ``_setup_data`` (as the bootstrap wraps it) trains on the rows at
    or above the fraction; ``build_held_out`` measures on exactly the others; each side
    is a cache entry of its own."""
    from types import SimpleNamespace

    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from torchtune import config
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    from kubetune.trainer.data.token_cache.settings import CacheSettings
    from kubetune.trainer.recipe_process import tokenized_data
    from tests.support.token_cache import entries, recipe_cls, tokenizer_cfg

    source = hub_dataset(tmp_path / "hub", train=300)
    tok = tokenizer_cfg(tiny_model_dir, 512)
    recipe = SimpleNamespace(_tokenizer=config.instantiate(OmegaConf.create(tok)),
                             _loss_fn=CEWithChunkedOutputLoss())
    data_files = {split: [str(source / "data" / SHARD.format(split=split))]
                  for split in ("train", "test")}
    dataset = OmegaConf.create({"_component_": "torchtune.datasets.instruct_dataset",
                                "source": "parquet", "data_files": data_files,
                                "split": "train"})

    def settings(fraction: float | None) -> CacheSettings:
        return CacheSettings(root=tmp_path / "cache", tokenizer_cfg=tok, report_cuts=False,
                             primary=True, cores=1, local_processes=1,
                             holdout_fraction=fraction)

    def prompts(rows) -> set[str]:
        texts = [recipe._tokenizer.decode([t for t in row["tokens"] if t < 256])
                 for row in rows]
        return {text.split("=")[0].split()[-1] + "=" for text in texts}

    setup = tokenized_data.wrap_setup_data(recipe_cls()._setup_data, settings(0.2))
    loader = setup(recipe, cfg_dataset=dataset, shuffle=False, batch_size=4,
                   collate_fn="torchtune.data.padded_collate_sft")
    val = tokenized_data.build_held_out(recipe, OmegaConf.create(dataset), settings(0.2))
    rows = pq.read_table(data_files["train"][0]).to_pylist()
    held = {r["input"] for r in rows if held_out_rows.held_out(r, 0.2)}
    trained = {r["input"] for r in rows if not held_out_rows.held_out(r, 0.2)}
    assert 0 < len(held) < 100
    assert prompts(val[i] for i in range(len(val))) == held
    assert prompts(loader.dataset[i] for i in range(len(loader.dataset))) == trained
    assert len(loader.dataset) + len(val) == 300
    assert len(entries(tmp_path / "cache")) == 2
    # A split held out: all of its rows, none of the training split's.
    test_split = OmegaConf.create({**OmegaConf.to_container(dataset), "split": "test"})
    measured = tokenized_data.build_held_out(recipe, test_split, settings(None))
    assert prompts(measured[i] for i in range(len(measured))) == set(
        _rows(TEST_ROWS, 3, 1)["input"])


def test_kubetune_local_passes_the_validation_options_to_the_trainer(tmp_path, tiny_model_dir):
    """Checked before any step, by the trainer's own rules, naming the option as typed
    (issue 53: not kubetune.val_fraction); the option wins over its variable and reaches
    the trainer's arguments."""
    source = hub_dataset(tmp_path / "hub", test=None)
    sources = ["--model", f"file://{tiny_model_dir}", "--dataset", f"file://{source}"]
    result = kubetune("local", "--workdir", str(tmp_path / "run"), *sources,
                      "--val-fraction", "0.7", "--val-prompts", "2",
                      env=clean_env(KUBETUNE_VAL_FRACTION="0.1"))
    assert result.returncode == 65, result.stderr[-3000:]
    assert error_lines(result) == [
        "error: local: --val-fraction 0.7: the held-out fraction must be more than 0 "
        "and at most 0.5"]
    assert not (tmp_path / "run").exists()
    # A plan that refuses a later argument shows what the trainer was given.
    result = kubetune("local", "--workdir", str(tmp_path / "run"), *sources,
                      "--val-fraction", "0.3", "--val-prompts", "2", "epochs=0",
                      env=clean_env(KUBETUNE_VAL_FRACTION="0.1"))
    assert result.returncode == 65, result.stderr[-3000:]
    arguments = next(line for line in result.stderr.splitlines()
                     if "trainer arguments:" in line)
    assert "kubetune.val_fraction=0.3" in arguments and "kubetune.val_prompts=2" in arguments
    assert "kubetune.val_fraction=0.1" not in arguments
    assert error_lines(result) == ["error: local: epochs=0: must be a whole number >= 1"]
    assert not (tmp_path / "run" / "workspace" / "output").exists()
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(REPO / "runtimes" / "base" / "kubetune-byo-model.yaml"),
                      "--val-fraction", "0.1")
    assert result.returncode == 65
    assert "with --runtime, --val-fraction would be ignored" in error_lines(result)[0]


def test_a_held_out_set_tokenization_empties_is_refused_naming_it(tmp_path, tiny_model_dir):
    """Every held-out answer cut away by max_seq_len: nothing to measure, exit 65's error."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from torchtune import config

    from kubetune.trainer.data.token_cache.settings import CacheSettings
    from kubetune.trainer.recipe_process import tokenized_data
    from kubetune.trainer.recipe_process.run_sanity import RunRefused
    from tests.support.token_cache import tokenizer_cfg

    source = hub_dataset(tmp_path / "hub")
    tok = tokenizer_cfg(tiny_model_dir, 8)  # shorter than every prompt
    recipe = SimpleNamespace(_tokenizer=config.instantiate(OmegaConf.create(tok)))
    settings = CacheSettings(root=None, tokenizer_cfg=tok, report_cuts=False, primary=True,
                             cores=1, local_processes=1)
    test_split = OmegaConf.create({
        "_component_": "torchtune.datasets.instruct_dataset", "source": "parquet",
        "data_files": {"test": [str(source / "data" / SHARD.format(split="test"))]},
        "split": "test"})
    with pytest.raises(RunRefused) as refused:
        tokenized_data.build_held_out(recipe, test_split, settings)
    assert str(refused.value).startswith(
        f"the held-out set (dataset_val split 'test') has no usable row: {TEST_ROWS} read")


def test_tune_run_takes_torchtune_mains_keys_and_the_variables(tmp_path, tiny_model_dir):
    """As Kubeflow Trainer sends it: `tune run` with the runtime's args, the held-out keys
    as overrides, the settings from the pod's env."""
    from tests.support.trainer import tune_run

    pvc = _initialized(tmp_path, tiny_model_dir, hub_dataset(tmp_path / "hub", test=None))
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      "dataset.split=train", "run_val_every_n_steps=4", "--kubetune-dry-run",
                      env=pvc.env(KUBETUNE_VAL_FRACTION="0.25",
                                  KUBETUNE_EARLY_STOP_PATIENCE="2"))
    config = planned(result)
    assert config["run_val_every_n_steps"] == 4
    assert config["kubetune"]["holdout"] == {"fraction": 0.25}
    validation = config["kubetune"]["validation"]
    assert (validation["source"], validation["early_stop_patience"]) == ("fraction", 2)
    assert config["dataset_val"]["split"] == "train"
