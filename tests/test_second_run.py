"""A second run in the same place (issue 43 §4): another dataset, model, method or fewer
epochs is said in one line ("a new run: …") and the earlier run's output is moved aside
whole, so no stale epoch_N/ stands beside the new run's output for the exporter or a
reader to take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubetune.tools.demo import write_tiny_dataset
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.trainer import make_pvc, tune_run




QUICK = ["max_steps_per_epoch=2", "batch_size=4", "gradient_accumulation_steps=1"]


def _new_run_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "a new run: " in line]


def _previous(output: Path) -> list[Path]:
    return sorted(output.parent.glob(f"{output.name}.previous-*"))


@pytest.mark.slow
def test_tune_run_with_another_method_and_fewer_epochs_sets_the_earlier_run_aside(
        tmp_path, tiny_model_dir):
    """Then the same command again (complete: nothing moved), then restarted (not a new
    run: trained again in place): one PVC for the three, the later checks on the run the
    earlier leave."""
    dataset = write_tiny_dataset(tmp_path / "data", rows=16)
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, dataset)
    data = ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", *QUICK]
    first = tune_run(pvc, "lora_finetune_single_device", "--config", "llama3_2/1B_lora",
                     *pvc.runtime_args(), *data, "epochs=2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert _new_run_lines(first.stderr) == [] and _previous(pvc.output) == []
    second = tune_run(pvc, "full_finetune_single_device", "--config", "llama3_2/1B_full",
                      *pvc.runtime_args(), *data, "epochs=1")
    assert second.returncode == 0, second.stderr[-3000:]
    said = _new_run_lines(second.stderr)
    assert len(said) == 1, second.stderr[-3000:]
    assert "method lora -> full" in said[0] and "epochs: 2 -> 1" in said[0], said
    [previous] = _previous(pvc.output)
    assert str(previous) in said[0]
    # The earlier run, whole, under a name that says so; nothing of it beside the new one.
    assert sorted(p.name for p in previous.glob("epoch_*")) == ["epoch_0", "epoch_1"]
    assert json.loads((previous / "kubetune-complete.json").read_text())["method"] == "lora"
    assert sorted(p.name for p in pvc.output.glob("epoch_*")) == ["epoch_0"]
    assert not (pvc.output / "epoch_0" / "adapter_model.safetensors").exists()
    marker = json.loads((pvc.output / "kubetune-complete.json").read_text())
    assert marker["method"] == "full" and marker["checkpoint"] == "epoch_0"
    # The same command again: complete, nothing moved.
    again = tune_run(pvc, "full_finetune_single_device", "--config", "llama3_2/1B_full",
                     *pvc.runtime_args(), *data, "epochs=1")
    assert again.returncode == 0 and "already holds this run's completed training" in \
        again.stderr, again.stderr[-3000:]
    assert len(_previous(pvc.output)) == 1
    # The same run restarted with nothing vouched to resume from (killed after its
    # epoch_0/ was published, before the record named it): its own output, trained again
    # in place, not set aside.
    (pvc.output / "kubetune-complete.json").unlink()
    restarted = tune_run(pvc, "full_finetune_single_device", "--config", "llama3_2/1B_full",
                         *pvc.runtime_args(), *data, "epochs=1")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "already holds" not in restarted.stderr, restarted.stderr[-3000:]
    assert _new_run_lines(restarted.stderr) == [] and len(_previous(pvc.output)) == 1
    assert (pvc.output / "kubetune-complete.json").is_file()


@pytest.fixture(scope="module")
def local_second_run(tmp_path_factory):
    """`kubetune local` on one dataset (2 epochs), then, that dataset edited in place under
    the same file:// URI (16 -> 24 rows, issue 52 §5), again with 1 epoch in the same
    workdir; the second is also the finished run test_continuing_… continues from."""
    tmp_path = tmp_path_factory.mktemp("second-run")
    data = write_tiny_dataset(tmp_path / "a", rows=16)
    workdir = tmp_path / "run"
    env = clean_env(KUBETUNE_TERMINATION_LOG=str(tmp_path / "term"))
    first = kubetune("local", "--workdir", str(workdir), "--dataset", f"file://{data}",
                     "epochs=2", *QUICK, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    write_tiny_dataset(data, rows=24)
    args = ["--dataset", f"file://{data}", "epochs=1", *QUICK]
    second = kubetune("local", "--workdir", str(workdir), *args, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    return workdir, args, env, second


@pytest.mark.slow
def test_kubetune_local_with_other_data_and_fewer_epochs_is_a_new_run(local_second_run):
    workdir, _, _, second = local_second_run
    output = workdir / "workspace" / "output"
    said = _new_run_lines(second.stdout)
    assert len(said) == 1, second.stdout[-3000:]
    assert "the dataset's files changed" in said[0] and "epochs: 2 -> 1" in said[0], said
    # The edit is fetched again (the model, unchanged, is not) and trained on.
    assert second.stdout.count("nothing to download") == 1, second.stdout[-3000:]
    assert "changed since it was staged" in second.stdout
    staged = workdir / "workspace" / "dataset" / ".kubetune-dataset.json"
    assert json.loads(staged.read_text())["rows"] == 24
    [previous] = _previous(output)
    assert sorted(p.name for p in previous.glob("epoch_*")) == ["epoch_0", "epoch_1"]
    # Issue 52 §7: a LoRA run's earlier epoch holds its adapter, no merged copy of the
    # model; its last save holds both (the exporter's reference).
    assert (previous / "epoch_0" / "adapter_model.safetensors").is_file()
    assert not list((previous / "epoch_0").glob("model*.safetensors"))
    assert list((previous / "epoch_1").glob("model*.safetensors"))
    assert sorted(p.name for p in output.glob("epoch_*")) == ["epoch_0"]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["checkpoint"] == "epoch_0" and summary["steps"] == 2
    # The export is the new run's: its manifest names the new run's checkpoint.
    assert "checkpoint: " + str(output / "epoch_0") in second.stdout


def _adapter_export(root: Path) -> Path:
    """An adapter export as ours are laid out: PEFT files and the manifest naming the base."""
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "base_model_name_or_path": "/models/tiny-base"}))
    (root / "adapter_model.safetensors").write_bytes(b"")
    (root / "manifest.json").write_text(json.dumps(
        {"version": 1, "format": "adapter", "files": [],
         "base_model": {"name": "tiny-base", "source": "hf://acme/tiny-base"}}))
    return root


def test_an_adapter_export_as_the_model_says_how_to_continue(tmp_path):
    export = _adapter_export(tmp_path / "export")
    workdir = tmp_path / "run"
    term = tmp_path / "term"
    result = kubetune("local", "--workdir", str(workdir), "--model", f"file://{export}",
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(term)))
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert line.startswith(f"error: local: --model {export}: this is an adapter export "
                           "(a LoRA adapter trained on hf://acme/tiny-base)"), line
    assert "EXPORT_FORMAT=merged" in line and "--model file://" in line, line
    assert not (workdir / "workspace").exists() and not (workdir / "sources").exists()
    # The model initializer (a TrainJob's storageUri) says the same, the base from
    # adapter_config.json where the export has no manifest of ours.
    (export / "manifest.json").unlink()
    init = kubetune("init-model", env=clean_env(
        STORAGE_URI=f"file://{export}", OUTPUT_PATH=str(tmp_path / "model"),
        KUBETUNE_TERMINATION_LOG=str(term)))
    assert init.returncode == 65, init.stderr[-2000:]
    assert "adapter export (a LoRA adapter trained on /models/tiny-base)" in \
        term.read_text(), term.read_text()


@pytest.mark.slow
def test_continuing_a_finished_run_from_its_merged_export(local_second_run, tmp_path):
    """docs/cli.md's way: the same arguments again with EXPORT_FORMAT=merged (nothing is
    trained again), then that export as --model: training starts where the first run's
    weights ended, not from the base."""
    round1, args, env, _ = local_second_run
    merged = tmp_path / "round1-merged"
    again = kubetune("local", "--workdir", str(round1), *args, "--export-uri",
                     str(merged), env={**env, "EXPORT_FORMAT": "merged"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "already holds this run's completed training" in again.stdout
    assert (merged / "config.json").is_file()
    round2 = tmp_path / "round2"
    second = kubetune("local", "--workdir", str(round2), "--model", f"file://{merged}", *args,
                      env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    losses = [json.loads((run / "workspace" / "output" / "summary.json").read_text())
              ["first_loss"] for run in (round1, round2)]
    assert losses[1] < losses[0], losses
