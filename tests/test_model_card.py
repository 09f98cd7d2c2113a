"""The export's model card as the hub reads it (huggingface_hub's ModelCard), and the run
report carried into the export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import status_server
from tests.support.cli import kubetune

pytestmark = pytest.mark.slow


def _as_from_hub(tree: Path, uri: str) -> None:
    """Rewrite an initializer's record as if ``tree`` had come from ``uri``."""
    record_path = tree / ".kubetune-manifest.json"
    record = json.loads(record_path.read_text())
    record.update(storage_uri=uri, requested_revision="main",
                  resolved_revision="0123456789abcdef0123456789abcdef01234567")
    record_path.write_text(json.dumps(record))


def test_model_card_metadata_as_huggingface_hub_parses_it(trained_run, tmp_path):
    from huggingface_hub import ModelCard

    model = Path(shutil.copytree(trained_run.model_dir, tmp_path / "model"))
    dataset = Path(shutil.copytree(trained_run.dataset_dir, tmp_path / "dataset"))
    _as_from_hub(model, "hf://kubetune/tiny-llama3")
    _as_from_hub(dataset, "hf://kubetune/tiny-addition/data")
    # The base model's own card, as the initializer fetches it with the weights.
    (model / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny llama\n")
    dest = tmp_path / "export"
    result = kubetune("export", "--export-uri", str(dest), "--model-dir", str(model),
                      "--dataset-dir", str(dataset),
                      env=trained_run.env(KUBERNETES_SERVICE_HOST="10.96.0.1"))
    assert result.returncode == 0, result.stderr[-2000:]

    card = ModelCard.load(dest / "README.md")
    assert card.data.base_model == "kubetune/tiny-llama3"
    assert card.data.datasets == ["kubetune/tiny-addition"]
    assert card.data.library_name == "peft"
    assert card.data.license == "apache-2.0"
    assert {"kubetune", "torchtune", "lora"} <= set(card.data.tags)
    summary = json.loads((trained_run.output_dir / "summary.json").read_text())
    assert f"- final loss: {summary['last_loss']:.4f}" in card.text
    assert "| LoRA rank | `8` |" in card.text and "| learning rate | `0.003` |" in card.text
    # A card a person would publish: named by the base model, in the names PEFT uses, loadable
    # from where the export went.
    assert card.text.strip().splitlines()[0] == "# tiny-llama3 (LoRA fine-tune of kubetune/tiny-llama3)"
    adapter = json.loads((dest / "adapter_config.json").read_text())
    modules = ", ".join(f"`{m}`" for m in adapter["target_modules"])
    assert f"- target modules: {modules}" in card.text
    assert "output_proj" not in card.text and "lora_attn_modules" not in card.text
    assert "- method: LoRA" in card.text
    assert "<this export>" not in card.text
    assert f'PeftModel.from_pretrained(base, "{dest}")' in card.text
    assert 'from_pretrained("kubetune/tiny-llama3")' in card.text
    assert "![loss and learning rate by step](kubetune-curves.png)" in card.text
    assert "from a torchtune run on Kubeflow Trainer;" in card.text

    # The run report travels with the export, listed in its manifest like every file.
    assert (dest / "kubetune-curves.png").read_bytes() == \
        (trained_run.output_dir / "kubetune-curves.png").read_bytes()
    assert "**completed**" in (dest / "kubetune-report.md").read_text()
    listed = {f["path"] for f in json.loads((dest / "manifest.json").read_text())["files"]}
    assert {"kubetune-curves.png", "kubetune-report.md", "README.md"} <= listed


def test_a_local_run_claims_no_kubeflow_and_the_exporter_reports_its_files(trained_run,
                                                                          tmp_path):
    from huggingface_hub import ModelCard

    server = status_server.start(tmp_path / "status")
    # `kubetune local` marks its steps, even when it runs inside some pod.
    dest = tmp_path / "export"
    try:
        result = kubetune("export", "--export-uri", str(dest), "--no-verify-logits",
                          env=trained_run.env(KUBERNETES_SERVICE_HOST="10.96.0.1",
                                              KUBETUNE_LOCAL_RUN="1", **server.env()))
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr[-2000:]
    [request] = server.requests
    metrics = {m["name"]: m["value"] for m in request.body["trainerStatus"]["metrics"]}
    files = json.loads((dest / "manifest.json").read_text())["files"]
    assert metrics["phase"] == "exporter" and metrics["transfer_percent"] == "100.0"
    assert metrics["transfer_files"] == str(len(files))
    card = ModelCard.load(dest / "README.md")
    assert "Kubeflow" not in card.text
    # The base is a path: the card is named by the export, never by a path.
    assert card.text.strip().splitlines()[0] == "# export (LoRA fine-tune)"
    assert card.data.base_model is None  # a path, not a hub id
    assert card.data.license is None  # the tiny base declares none
    # The local pipeline's own export says the same.
    assert "Kubeflow" not in (trained_run.workspace / "export" / "README.md").read_text()


@pytest.mark.parametrize("destination, loads", [
    ("hf://acme/tiny-llama3-lora", 'PeftModel.from_pretrained(base, "acme/tiny-llama3-lora")'),
    ("s3://models/runs/tiny-lora/", "# first: aws s3 sync s3://models/runs/tiny-lora ./tiny-lora"),
    ("/exports/tiny-lora", 'PeftModel.from_pretrained(base, "/exports/tiny-lora")'),
])
def test_the_load_snippet_names_where_the_export_went(destination, loads):
    from kubetune.exporter import model_card

    text = model_card.render("adapter", {"name": "/pvc/model", "source": "file:///pvc/model"},
                             {"source": "file:///pvc/data"}, {"steps": 3, "last_loss": 0.46931},
                             "", None, "lora", destination=destination,
                             target_modules=["q_proj", "v_proj"], environ={})
    assert loads in text
    assert "- target modules: `q_proj`, `v_proj`" in text and "- final loss: 0.4693" in text
    assert text.split("\n# ", 1)[1].startswith("tiny-lora (LoRA fine-tune)") or \
        destination.startswith("hf://")
