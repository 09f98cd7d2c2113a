"""`kubetune local`: the whole pipeline on this machine, as the runtime wires it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kubetune import env
from kubetune.local_run import Step, run_stages
from kubetune.workspace import COMPLETION_MARKER_NAME
from trainer.methods import METHODS, recipe_for

# Training arguments for the embedded tiny model: enough steps for the loss to fall
# clearly, in seconds on two CPU cores. One epoch: torchtune 0.6.1 on CPU folds each
# epoch's LoRA into the live base weights when it saves that epoch's checkpoint, so a
# later epoch's adapter no longer matches its merged model and the exporter refuses it.
DEMO_TRAIN_ARGS = [
    "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train",
    "epochs=1", "batch_size=2", "gradient_accumulation_steps=1", "optimizer.lr=3e-3",
    "lr_scheduler.num_warmup_steps=10", "model.lora_rank=8", "model.lora_alpha=16",
    "model.apply_lora_to_output=True", "seed=0",
]


def demo_sources(sources_dir: Path) -> tuple[str, str]:
    """Generate (once) the embedded tiny model and dataset; return their URIs."""
    from kubetune.demo import write_tiny_dataset, write_tiny_model

    model_dir, dataset_dir = sources_dir / "tiny-llama3", sources_dir / "tiny-addition"
    if not (model_dir / "model.safetensors").is_file():
        write_tiny_model(model_dir)
    if not (dataset_dir / "data" / "train.parquet").is_file():
        write_tiny_dataset(dataset_dir)
    return f"file://{model_dir.resolve()}", f"file://{dataset_dir.resolve()}"


def pipeline(workdir: Path, model_uri: str, dataset_uri: str, method: str,
             train_args: list[str], export_uri: str | None) -> list[list[Step]]:
    """The four steps over ``workdir/workspace``, as a ClusterTrainingRuntime wires them."""
    pvc = (workdir / "workspace").resolve()
    py = sys.executable
    pod_env = {env.WORKSPACE: str(pvc)}
    recipe, config, implied = recipe_for(method)
    tune_run = [
        py, "-m", "entrypoints.tune", "run", recipe, "--config", config,
        f"output_dir={pvc / 'output'}",
        f"tokenizer.path={pvc / 'model' / 'original' / 'tokenizer.model'}",
        f"checkpointer.checkpoint_dir={pvc / 'model'}",
        *implied, *train_args,
    ]
    return [
        [Step("dataset-initializer", [py, "-m", "entrypoints", "init-dataset"],
              {**pod_env, env.STORAGE_URI: dataset_uri}),
         Step("model-initializer", [py, "-m", "entrypoints", "init-model"],
              {**pod_env, env.STORAGE_URI: model_uri})],
        [Step("trainer", tune_run, {**pod_env, env.PET_NNODES: "1",
                                    env.PET_NPROC_PER_NODE: "1", env.PET_NODE_RANK: "0"})],
        [Step("exporter", [py, "-m", "entrypoints", "export"],
              {**pod_env, env.EXPORT_URI: export_uri or str(pvc / "export")})],
    ]


def summary_lines(workdir: Path) -> list[str]:
    pvc = workdir / "workspace"
    summary = json.loads((pvc / "output" / "summary.json").read_text())
    export_manifest = json.loads((pvc / "export" / "manifest.json").read_text()) \
        if (pvc / "export" / "manifest.json").is_file() else {}
    adapter = next((f["path"] for f in export_manifest.get("files", [])
                    if f["path"].endswith("adapter_model.safetensors")), None)
    tps = summary.get("tokens_per_second")
    lines = [
        f"steps: {summary['steps']}",
        f"loss: {summary['first_loss']:.4f} (first) -> {summary['last_loss']:.4f} (last)",
        f"tokens/s: {tps:.0f}" if tps else "tokens/s: n/a",
    ]
    if adapter:
        lines.append(f"adapter: {(pvc / 'export' / adapter).parent.resolve()}")
    lines.append(f"checkpoint: {(pvc / 'output' / summary['checkpoint']).resolve()}")
    return lines


def run_local(workdir: Path, model_uri: str | None = None, dataset_uri: str | None = None,
              method: str = "lora", train_args: list[str] | None = None,
              export_uri: str | None = None) -> list[str]:
    """Run the pipeline; return the summary lines."""
    workdir = Path(workdir)
    if model_uri is None or dataset_uri is None:
        demo_model, demo_dataset = demo_sources(workdir / "sources")
        model_uri, dataset_uri = model_uri or demo_model, dataset_uri or demo_dataset
    args = DEMO_TRAIN_ARGS if train_args is None else train_args
    stages = pipeline(workdir, model_uri, dataset_uri, method, args, export_uri)
    (workdir / "workspace" / "output" / COMPLETION_MARKER_NAME).unlink(missing_ok=True)
    run_stages(stages, workdir / "logs")
    return summary_lines(workdir)


@click.command("local", context_settings={"ignore_unknown_options": True})
@click.option("--workdir", envvar="KUBETUNE_LOCAL_DIR", default="kubetune-local",
              type=click.Path(path_type=Path), show_default=True,
              help="Directory for the stand-in PVC (workspace/), sources and logs "
                   "[env: KUBETUNE_LOCAL_DIR]")
@click.option("--model", "model_uri", envvar="KUBETUNE_LOCAL_MODEL", default=None,
              help="Model STORAGE_URI (default: the embedded tiny Llama-3) "
                   "[env: KUBETUNE_LOCAL_MODEL]")
@click.option("--dataset", "dataset_uri", envvar="KUBETUNE_LOCAL_DATASET", default=None,
              help="Dataset STORAGE_URI (default: the embedded addition dataset) "
                   "[env: KUBETUNE_LOCAL_DATASET]")
@click.option("--method", envvar=env.METHOD, default="lora", show_default=True,
              type=click.Choice(sorted(METHODS)), help=f"Fine-tuning method [env: {env.METHOD}]")
@click.option("--export-uri", envvar=env.EXPORT_URI, default=None,
              help=f"Export destination (default: workspace/export) [env: {env.EXPORT_URI}]")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def local(workdir: Path, model_uri, dataset_uri, method, export_uri, train_args) -> None:
    """Run the whole pipeline here: both initializers, trainer, exporter.

    TRAIN_ARGS are `key=value` trainer arguments, as a TrainJob's spec.trainer.args;
    given, they replace the tiny demo's defaults.
    """
    from entrypoints.step import run_step

    def body() -> int:
        lines = run_local(workdir, model_uri, dataset_uri, method,
                          list(train_args) if train_args else None, export_uri)
        click.echo("\nsummary")
        for line in lines:
            click.echo(f"  {line}")
        return 0

    sys.exit(run_step("local", body))
