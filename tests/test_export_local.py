"""`kubetune export` to a local path (a PVC): what a user finds there, and what is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import warm_start
from tests.support.cli import REPO, error_lines, kubetune
from tests.support.trained import TrainedRun

pytestmark = pytest.mark.slow


def export(run: TrainedRun, dest: Path, *args: str, output_dir: Path | None = None,
           termination_log: Path | None = None, warm: bool = True
           ) -> subprocess.CompletedProcess:
    """`kubetune export` to ``dest``: started warm in the suite (tests/support/
    warm_start.py), or with ``warm=False`` cold, where its start-up (the libraries'
    import-time lines) is what a test reads."""
    extra = {"KUBETUNE_TERMINATION_LOG": str(termination_log)} if termination_log else {}
    if output_dir is not None:
        extra["KUBETUNE_OUTPUT_DIR"] = str(output_dir)
    env = run.env(**extra)
    return kubetune("export", "--export-uri", str(dest), *args,
                    env=env if warm else warm_start.cold(env))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def _weights_dtype(model_dir: Path) -> str:
    """The torch dtype most of a model directory's weights are stored in."""
    from safetensors import safe_open

    counts: dict[str, int] = {}
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                tensor = f.get_slice(name)
                count = 1
                for dim in tensor.get_shape():
                    count *= dim
                dtype = str(f.get_tensor(name).dtype).removeprefix("torch.")
                counts[dtype] = counts.get(dtype, 0) + count
    return max(counts, key=counts.__getitem__)


def test_merged_config_says_the_dtype_its_weights_are_in(tmp_path):
    """A bf16 run from an fp32 base: torchtune copies the base's config.json, whose
    float32 would make transformers load the bf16 weights as fp32."""
    import torch
    from safetensors.torch import save_file

    from kubetune.exporter.artifact import match_torch_dtype

    save_file({"model.embed_tokens.weight": torch.zeros(8, 4, dtype=torch.bfloat16),
               "model.norm.weight": torch.ones(4, dtype=torch.float32)},
              str(tmp_path / "model.safetensors"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    match_torch_dtype(config, [tmp_path / "model.safetensors"])
    assert json.loads(config.read_text())["torch_dtype"] == "bfloat16" == \
        _weights_dtype(tmp_path)


@pytest.fixture(scope="module")
def both_export(trained_run, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    dest = tmp_path_factory.mktemp("local") / "export"
    # Its own process: test_known_library_warnings reads what its imports printed.
    result = export(trained_run, dest, "--export-format", "both", warm=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return dest, result


def test_both_formats_land_in_hf_layout_with_a_manifest_of_every_file(trained_run, both_export):
    dest, _ = both_export
    adapter_config = json.loads((dest / "adapter" / "adapter_config.json").read_text())
    # The base is a PVC source: PEFT must be able to load it by that name.
    assert adapter_config["base_model_name_or_path"] == str(trained_run.base_source.resolve())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["task_type"] == "CAUSAL_LM"
    assert {"q_proj", "v_proj", "o_proj", "lm_head"} <= set(adapter_config["target_modules"])
    merged = dest / "merged"
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "model.safetensors.index.json"):
        assert (merged / name).is_file(), name
    index = json.loads((merged / "model.safetensors.index.json").read_text())
    assert all((merged / shard).is_file() for shard in index["weight_map"].values())
    assert json.loads((merged / "config.json").read_text())["torch_dtype"] == \
        _weights_dtype(merged)

    manifest = json.loads((dest / "manifest.json").read_text())
    on_disk = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")
                     if p.is_file() and p.name != "manifest.json")
    assert [f["path"] for f in manifest["files"]] == on_disk
    for entry in manifest["files"]:
        assert sha256(dest / entry["path"]) == entry["sha256"]
        assert (dest / entry["path"]).stat().st_size == entry["size"]
    summary = json.loads((trained_run.output_dir / "summary.json").read_text())
    assert manifest["metrics"]["last_loss"] == summary["last_loss"]
    assert manifest["base_model"]["source"] == f"file://{trained_run.base_source.resolve()}"
    assert manifest["dataset"]["source"].endswith("tiny-addition")
    assert "lora_rank: 8" in manifest["training_config"]
    logits = manifest["verification"]["logits"]
    assert logits["max_abs_diff"] <= logits["tolerance"] * logits["logit_scale"]
    assert "PeftModel.from_pretrained" in (dest / "README.md").read_text()


# torchao's warnings at import, in every process that imports torchtune (the exporter's own).
TORCHAO_NOISE = ("Skipping import of cpp extensions", "Detected no triton")


def test_known_library_warnings_only_at_debug_level(trained_run, both_export, tmp_path):
    _, quiet = both_export
    assert not [n for n in TORCHAO_NOISE if n in quiet.stdout + quiet.stderr], quiet.stderr
    debug = kubetune("export", "--export-uri", str(tmp_path / "export"),
                     env=trained_run.env(KUBETUNE_LOG_LEVEL="debug"))
    assert debug.returncode == 0, debug.stderr[-2000:]
    assert "exporter WARNING Skipping import of cpp extensions" in debug.stderr


def test_rerun_with_a_matching_manifest_writes_nothing(trained_run, both_export):
    dest, _ = both_export
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    result = export(trained_run, dest, "--export-format", "both")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "nothing to upload" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before


def test_adapter_gets_the_base_name_when_torchtune_wrote_null(trained_run, tmp_path):
    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output", symlinks=True))
    checkpoint = output / json.loads((output / "kubetune-complete.json").read_text())["checkpoint"]
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (checkpoint / "adapter_config.json").write_text(json.dumps(config))
    result = export(trained_run, tmp_path / "export", "--no-verify-logits", output_dir=output)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((tmp_path / "export" / "adapter_config.json").read_text())
    assert written["base_model_name_or_path"] == str(trained_run.base_source.resolve())
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["verification"]["logits"] == "skipped: turned off"


def test_an_adapter_that_does_not_reproduce_the_merged_model_is_refused(trained_run, tmp_path):
    from safetensors.torch import load_file, save_file

    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output"))
    checkpoint = output / json.loads((output / "kubetune-complete.json").read_text())["checkpoint"]
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    # Same keys and shapes, wrong values: only the logits check can tell.
    weights = {k: v * 1.5 if "lora_B" in k else v for k, v in weights.items()}
    save_file(weights, str(checkpoint / "adapter_model.safetensors"))
    log = tmp_path / "termination-log"
    # Cold: the exporter's refusal as a pod sees it, exit code and termination log, from
    # the process's start (the other refusals here start warm).
    result = export(trained_run, tmp_path / "dest" / "export", output_dir=output,
                    termination_log=log, warm=False)
    assert result.returncode == 65
    [line] = error_lines(result)
    assert "does not reproduce the merged model" in line
    assert log.read_text().strip() == line.removeprefix("error: ")
    assert not (tmp_path / "dest").exists() or visible(tmp_path / "dest") == []


@pytest.mark.parametrize("case", ["no output", "incomplete epoch", "unwritable", "not ours"])
def test_bad_input_is_one_actionable_line_and_exit_65(trained_run, tmp_path, case):
    output, dest = trained_run.output_dir, tmp_path / "export"
    if case == "no output":
        output = tmp_path / "missing"
    elif case == "incomplete epoch":
        output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output"))
        (output / "kubetune-complete.json").unlink()  # the trainer writes it last
    elif case == "unwritable":
        (tmp_path / "a-file").write_text("")
        dest = tmp_path / "a-file" / "export"
    else:
        dest.mkdir()
        (dest / "notes.txt").write_text("a user's own files")
    result = export(trained_run, dest, output_dir=output)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    expected = {"no output": "run the trainer first", "incomplete epoch": "did not finish",
                "unwritable": "not writable", "not ours": "not a kubetune export"}[case]
    assert expected in line
    if case == "not ours":
        assert visible(dest) == ["notes.txt"]
    elif case != "unwritable":
        assert not dest.exists()


def test_a_user_s_file_beside_an_earlier_export_is_kept_and_named(trained_run, tmp_path):
    dest = tmp_path / "export"
    assert export(trained_run, dest).returncode == 0
    (dest / "notes.txt").write_text("how I evaluated it")
    earlier = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    log = tmp_path / "termination-log"
    again = export(trained_run, dest, "--export-format", "both", termination_log=log)
    assert again.returncode == 65, again.stderr[-2000:]
    [line] = error_lines(again)
    assert "notes.txt" in line and "not a kubetune export" in line
    assert log.read_text().strip() == line.removeprefix("error: ")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == earlier
    assert (dest / "notes.txt").read_text() == "how I evaluated it"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kubetune-staging")]


def test_killed_export_leaves_nothing_visible_and_a_rerun_completes(trained_run, tmp_path):
    dest = tmp_path / "export"
    env = trained_run.env()
    process = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "export", "--export-uri",
                                str(dest), "--export-format", "both"], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged = tmp_path / ".kubetune-staging-export"
    deadline = time.monotonic() + 120
    while not (staged / "merged").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the export finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert visible(tmp_path) == []
    result = export(trained_run, dest, "--export-format", "both")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (dest / "manifest.json").is_file()
    assert visible(tmp_path) == ["export"] and not staged.exists()


def test_logits_check_is_skipped_for_a_base_model_over_the_size_bound(trained_run, tmp_path):
    dest = tmp_path / "export"
    result = kubetune("export", "--export-uri", str(dest),
                      env=trained_run.env(KUBETUNE_EXPORT_VERIFY_MAX_BYTES="1000"))
    assert result.returncode == 0, result.stderr[-2000:]
    verification = json.loads((dest / "manifest.json").read_text())["verification"]
    assert verification["logits"].startswith("skipped: the base model takes")
    assert verification["adapter_pairs"] > 0  # the structural check still ran


def test_a_full_fine_tune_exports_merged_by_default_and_refuses_an_adapter(trained_run,
                                                                          tmp_path):
    # A full fine-tune's checkpoint is the merged shards alone.
    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output"))
    marker = json.loads((output / "kubetune-complete.json").read_text())
    checkpoint = output / marker["checkpoint"]
    for name in ("adapter_model.safetensors", "adapter_config.json", "adapter_model.pt"):
        (checkpoint / name).unlink(missing_ok=True)
    # ... and its completion marker says so.
    (output / "kubetune-complete.json").write_text(json.dumps({**marker, "method": "full"}))
    refused = export(trained_run, tmp_path / "adapter", "--export-format", "adapter",
                     output_dir=output)
    assert refused.returncode == 65
    assert "EXPORT_FORMAT=merged" in error_lines(refused)[0]
    result = export(trained_run, tmp_path / "export", output_dir=output)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["format"] == "merged"
    assert (tmp_path / "export" / "config.json").is_file()
    assert not (tmp_path / "export" / "adapter_config.json").exists()


def test_an_older_marker_without_the_method_exports_as_before(trained_run, tmp_path):
    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output"))
    marker = json.loads((output / "kubetune-complete.json").read_text())
    del marker["method"]  # written before the marker named the method
    (output / "kubetune-complete.json").write_text(json.dumps(marker))
    result = export(trained_run, tmp_path / "export", "--no-verify-logits", output_dir=output)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["format"] == "adapter"  # the checkpoint's adapter makes it a LoRA run
    assert "- lora" in (tmp_path / "export" / "README.md").read_text()  # the card's tag


@pytest.mark.parametrize("case", ["unknown method", "adapter missing"])
def test_a_marker_the_checkpoint_contradicts_is_refused(trained_run, tmp_path, case):
    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output"))
    marker = json.loads((output / "kubetune-complete.json").read_text())
    if case == "unknown method":
        marker["method"] = "sft"
    else:
        (output / marker["checkpoint"] / "adapter_model.safetensors").unlink()
    (output / "kubetune-complete.json").write_text(json.dumps(marker))
    result = export(trained_run, tmp_path / "export", output_dir=output)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert {"unknown method": "names method 'sft'",
            "adapter missing": "lacks adapter_model.safetensors"}[case] in line
    assert "re-run the trainer" in line
    assert not (tmp_path / "export").exists()


def test_a_volume_mounted_at_the_destination_is_exported_into(trained_run, tmp_path):
    volume = tmp_path / "export-pvc"
    volume.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(volume)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root in a container that allows it)")
    try:
        (volume / "lost+found").mkdir()
        first = export(trained_run, volume, "--no-verify-logits")
        assert first.returncode == 0, first.stderr[-2000:]
        second = export(trained_run, volume, "--export-format", "merged")
        assert second.returncode == 0, second.stderr[-2000:]
        manifest = json.loads((volume / "manifest.json").read_text())
        assert manifest["format"] == "merged"
        # The old adapter is gone, the volume's own lost+found and nothing else stays.
        assert visible(volume) == sorted({"lost+found", "manifest.json"} | {
            f["path"].split("/")[0] for f in manifest["files"]})
        assert not any(p.name.startswith(".kubetune") for p in volume.iterdir())
        assert visible(tmp_path) == ["export-pvc"]
    finally:
        subprocess.run(["umount", str(volume)], check=False)


def test_a_hub_base_model_is_named_by_repo_id_and_resolved_revision(trained_run, tmp_path):
    # The model initializer's record of an hf:// source, as it writes it for the hub.
    model = Path(shutil.copytree(trained_run.model_dir, tmp_path / "model"))
    record = json.loads((model / ".kubetune-manifest.json").read_text())
    record.update(storage_uri="hf://kubetune/tiny-llama3", requested_revision="main",
                  resolved_revision="0123456789abcdef0123456789abcdef01234567")
    (model / ".kubetune-manifest.json").write_text(json.dumps(record))
    dest = tmp_path / "export"
    result = kubetune("export", "--export-uri", str(dest), "--model-dir", str(model),
                      env=trained_run.env())
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((dest / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "kubetune/tiny-llama3"
    assert config["revision"] == "0123456789abcdef0123456789abcdef01234567"
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["base_model"] == {"name": "kubetune/tiny-llama3",
                                      "source": "hf://kubetune/tiny-llama3",
                                      "revision": "0123456789abcdef0123456789abcdef01234567"}
    from huggingface_hub import ModelCard

    assert ModelCard.load(dest / "README.md").data.base_model == "kubetune/tiny-llama3"


def test_a_checkpoint_saved_without_its_merged_model_is_merged_by_the_exporter(
        trained_run, tmp_path):
    """Issue 52 §7: a LoRA run's saves before its last hold the adapter, not a merged
    copy of the model; a merged export of one (``--checkpoint best``) is made from base +
    adapter with PEFT's rule, and equals the merge torchtune wrote (an fp32 run)."""
    from safetensors.torch import load_file

    output = tmp_path / "output"
    shutil.copytree(trained_run.output_dir, output)
    saved = output / json.loads((output / "kubetune-complete.json").read_text())["checkpoint"]
    trainers: dict = {}
    for shard in saved.glob("model*.safetensors"):
        trainers.update(load_file(shard))
        shard.unlink()
    (saved / "model.safetensors.index.json").unlink(missing_ok=True)
    assert trainers
    dest = tmp_path / "merged"
    result = export(trained_run, dest, "--export-format", "merged", output_dir=output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the checkpoint holds no merged model" in result.stderr
    ours: dict = {}
    for shard in dest.glob("*.safetensors"):
        ours.update(load_file(shard))
    assert ours.keys() == trainers.keys()
    for name, tensor in trainers.items():
        assert ours[name].dtype == tensor.dtype, name
        assert (ours[name].float() - tensor.float()).abs().max() < 1e-5, name
    assert (dest / "config.json").is_file()
