"""`kubetune export`: publish the trained adapter / merged model with a manifest."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoints.options import dataset_dir_option, model_dir_option, output_dir_option
from entrypoints.step import step_command
from exporter.export import ExportRequest, export
from kubetune import env
from kubetune.workspace import workspace


def run_export(output_dir: str, model_dir: str, dataset_dir: str,
               export_uri: str | None = None, export_format: str | None = None) -> dict:
    """Export the completed training run in ``output_dir``; return the export manifest."""
    return export(ExportRequest(
        output_dir=Path(output_dir), model_dir=Path(model_dir), dataset_dir=Path(dataset_dir),
        destination=export_uri or str(workspace().export_dir), format=export_format or None,
    ))


@click.command("export")
@output_dir_option
@model_dir_option
@dataset_dir_option
@click.option("--export-uri", envvar=env.EXPORT_URI, default=None,
              help=f"Destination: /abs/path or file:///abs/path [env: {env.EXPORT_URI}; "
                   "default: $KUBETUNE_WORKSPACE/export, else /workspace/export]")
@click.option("--export-format", envvar=env.EXPORT_FORMAT, default=None,
              type=click.Choice(["adapter", "merged", "both"]),
              help=f"What to export [env: {env.EXPORT_FORMAT}; default: adapter for "
                   "LoRA/DoRA/QLoRA runs, merged for full fine-tunes]")
@step_command("exporter")
def export_command(**options) -> None:
    """Export the trained model from the trainer's output directory."""
    run_export(**options)
