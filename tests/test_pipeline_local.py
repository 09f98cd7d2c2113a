"""`kubetune local` end to end on the embedded tiny model: what a newcomer sees and checks,
read from README's `make demo` (`kubetune local --workdir kubetune-local`, run once per
session for this file and test_docs_commands: tests/support/readme_demo.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.support.cli import kubetune
from tests.support.readme_demo import readme_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """(its workdir, its exit code and output, its termination log)."""
    demo = readme_demo(tmp_path_factory)
    result = subprocess.CompletedProcess(["make", "demo"], demo.returncode, demo.output)
    return demo.workdir, result, demo.termination_log


def _summary(stdout: str) -> dict[str, str]:
    lines = stdout[stdout.index("\nsummary\n"):].splitlines()[2:]
    return dict(line.strip().split(": ", 1) for line in lines if ": " in line)


def test_pipeline_succeeds_and_reports_each_step_with_its_time(demo_run):
    workdir, result, term = demo_run
    assert result.returncode == 0, result.stdout[-6000:]
    for step in ("dataset-initializer", "model-initializer", "trainer", "exporter"):
        assert re.search(rf"^==> {step}: ok in \d+\.\ds$", result.stdout, re.M), step
    assert not term.exists()  # nothing failed, nothing reported


def test_initializers_run_in_parallel_before_the_trainer(demo_run):
    _, result, _ = demo_run
    order = re.findall(r"^==> ([a-z-]+):", result.stdout, re.M)
    assert order[2:] == ["trainer", "exporter"]
    assert set(order[:2]) == {"dataset-initializer", "model-initializer"}


def test_summary_numbers_are_those_the_logs_show(demo_run):
    workdir, result, _ = demo_run
    output = workdir / "workspace" / "output"
    metrics = [m for m in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())
               if "loss" in m]  # the steps' lines (an evaluation's has val_loss)
    summary_json = json.loads((output / "summary.json").read_text())
    printed = _summary(result.stdout)

    assert int(printed["steps"]) == len(metrics) == summary_json["steps"]
    first, last = re.match(r"([\d.]+) \(first\) -> ([\d.]+) \(last\)", printed["loss"]).groups()
    assert float(first) == pytest.approx(metrics[0]["loss"], abs=1e-4)
    assert float(last) == pytest.approx(metrics[-1]["loss"], abs=1e-4)
    # tokens/s: the mean over logged steps, leaving out the first (warm-up) step.
    timed = metrics[1:]
    mean_tps = sum(m["tokens_per_second"] for m in timed) / len(timed)
    assert float(printed["tokens/s"]) == pytest.approx(mean_tps, abs=1)
    assert summary_json["tokens"] == sum(m["tokens"] for m in metrics)
    # Every logged step is also a progress line readable in `kubectl logs` (no \r bars).
    assert "\r" not in result.stdout


def test_loss_falls_clearly(demo_run):
    workdir, _, _ = demo_run
    summary = json.loads((workdir / "workspace" / "output" / "summary.json").read_text())
    assert summary["last_loss"] < 0.5 * summary["first_loss"]


def test_adapter_is_where_the_summary_says_and_fits_the_base_model(demo_run):
    workdir, result, _ = demo_run
    adapter_dir = Path(_summary(result.stdout)["adapter"])
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert config["base_model_name_or_path"]  # upstream leaves it null

    with safe_open(str(workdir / "workspace" / "model" / "model.safetensors"), "pt") as f:
        base = {k: f.get_slice(k).get_shape() for k in f.keys()}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        adapter = {k: f.get_slice(k).get_shape() for k in f.keys()}
    modules = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in adapter}
    layers = json.loads((workdir / "workspace" / "model" / "config.json").read_text())[
        "num_hidden_layers"]
    # q, v, o projections and the three MLP projections of every layer, plus the output.
    assert len(modules) == 6 * layers + 1
    for module in modules:
        out_dim, in_dim = base[f"{module}.weight"]
        a = adapter[f"base_model.model.{module}.lora_A.weight"]
        b = adapter[f"base_model.model.{module}.lora_B.weight"]
        assert a == [config["r"], in_dim] and b == [out_dim, config["r"]], module


def test_export_manifest_hashes_what_was_written(demo_run):
    import hashlib

    workdir, _, _ = demo_run
    export = workdir / "workspace" / "export"
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["files"]
    for entry in manifest["files"]:
        data = (export / entry["path"]).read_bytes()
        assert len(data) == entry["size"]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]


def test_a_rerun_downloads_nothing_and_goes_straight_to_the_export(demo_run):
    workdir, _, _ = demo_run
    output = workdir / "workspace" / "output"
    before = {name: (output / name).read_text()
              for name in ("kubetune-complete.json", "metrics.jsonl", "summary.json")}
    again = kubetune("local", "--workdir", str(workdir))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("nothing to download") == 2
    # The same config over the same model and data: one line says so, nothing trains.
    said = [line for line in again.stdout.splitlines()
            if "already holds this run's completed training" in line]
    assert len(said) == 1 and "on to the export" in said[0], again.stdout[-3000:]
    assert "train: step" not in again.stdout
    assert "==> exporter: ok" in again.stdout
    assert {name: (output / name).read_text() for name in before} == before


def test_multi_epoch_cpu_adapter_reproduces_the_merged_model(demo_run):
    # Three epochs on CPU: torchtune 0.6.1's checkpoint merge would fold each epoch's
    # adapter into the live base weights (on CPU `.cpu()` does not copy), leaving an
    # adapter that no longer reproduces the merged model; the exporter checks it does.
    workdir, _, _ = demo_run
    manifest = json.loads((workdir / "workspace" / "export" / "manifest.json").read_text())
    assert manifest["metrics"]["epochs"] == 3
    logits = manifest["verification"]["logits"]
    assert logits["max_abs_diff"] <= logits["tolerance"] * max(1.0, logits["logit_scale"])
