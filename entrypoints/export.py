"""`kubetune export`: publish the trained adapter / merged model, verified, with a manifest."""

from __future__ import annotations

from pathlib import Path

import click

from kubetune.entrypoints.extras import require
from kubetune.entrypoints.options import dataset_dir_option, model_dir_option, output_dir_option
from kubetune.entrypoints.step import step_command
from kubetune.exporter.export import ExportRequest, export
from kubetune import env
from kubetune.workspace import workspace


def run_export(output_dir: str, model_dir: str, dataset_dir: str,
               export_uri: str | None = None, export_format: str | None = None,
               export_revision: str | None = None, verify_logits: bool = True,
               verify_max_bytes: int | None = None, chat_template: str = "check",
               checkpoint: str = "last") -> dict:
    """Export the completed training run in ``output_dir``; return the export manifest."""
    require("export", "kubetune export")
    return export(ExportRequest(
        output_dir=Path(output_dir), model_dir=Path(model_dir), dataset_dir=Path(dataset_dir),
        destination=export_uri or str(workspace().export_dir), format=export_format or None,
        revision=export_revision or None, verify_logits=verify_logits,
        verify_max_bytes=verify_max_bytes, chat_template=chat_template,
        checkpoint=checkpoint,
    ))


@click.command("export")
@output_dir_option
@model_dir_option
@dataset_dir_option
@click.option("--export-uri", envvar=env.EXPORT_URI, default=None, show_envvar=True,
              show_default="$KUBETUNE_WORKSPACE/export, else /workspace/export",
              help="Destination: /abs/path, ./rel/path, file:///abs/path, s3://bucket/prefix or "
                   "hf://org/repo")
@click.option("--export-format", envvar=env.EXPORT_FORMAT, default=None, show_envvar=True,
              type=click.Choice(["adapter", "merged", "both"]),
              show_default="adapter for LoRA/DoRA/QLoRA runs, merged for full fine-tunes",
              help="What to export")
@click.option("--export-revision", envvar=env.EXPORT_REVISION, default=None, show_envvar=True,
              show_default="main", help="hf:// only: the branch to commit to, created if absent")
@click.option("--verify-logits/--no-verify-logits", envvar=env.EXPORT_VERIFY_LOGITS,
              default=True, show_default=True, show_envvar=True,
              help="Check that base + adapter reproduces the merged model's logits before "
                   "publishing (the variable takes 1 or 0)")
@click.option("--verify-max-bytes", envvar=env.EXPORT_VERIFY_MAX_BYTES, default=None,
              type=click.IntRange(min=0), show_envvar=True,
              show_default="a quarter of the memory available",
              help="Skip the logits check when the base model's weights, as float32, exceed "
                   "this many bytes")
@click.option("--chat-template", envvar=env.EXPORT_CHAT_TEMPLATE, default="check",
              show_default=True, show_envvar=True,
              type=click.Choice(["check", "trained", "base"]),
              help="check: keep the base model's chat template if it prompts the model as the "
                   "run's training samples did (else fail), write the format the model was "
                   "trained on where the base has none; trained: write that format over the "
                   "base's; base: export the base's tokenizer files unchecked")
@click.option("--checkpoint", envvar=env.EXPORT_CHECKPOINT, default="last", show_default=True,
              show_envvar=True, type=click.Choice(["last", "best"]),
              help="last: the checkpoint the run ended with; best: the saved checkpoint with "
                   "the lowest validation loss (a run with a held-out set only)")
@step_command("exporter")
def export_command(**options) -> None:
    """Export the trained model from the trainer's output directory."""
    run_export(**options)
