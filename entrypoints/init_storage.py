"""`kubetune init-dataset` and `kubetune init-model`: fill the workspace from STORAGE_URI."""

from __future__ import annotations

from pathlib import Path

import click

from kubetune.entrypoints.step import step_command
from kubetune.initializers.initialize import initialize
from kubetune.initializers.request import InitRequest, split_patterns
from kubetune.initializers.storage_uri import parse
from kubetune import env
from kubetune.env_table import epilog
from kubetune.redact import register_secret
from kubetune.workspace import workspace


def run_init(kind: str, storage_uri: str, output_path: str | None = None,
             allow_patterns: str | None = None, ignore_patterns: str | None = None,
             revision: str | None = None, access_token: str | None = None) -> dict:
    """Initialize the ``kind`` ("model" or "dataset") directory; return its manifest."""
    register_secret(access_token)
    default = workspace().model_dir if kind == "model" else workspace().dataset_dir
    request = InitRequest(
        kind=kind,
        uri=parse(storage_uri),
        output_path=Path(output_path) if output_path else default,
        allow_patterns=split_patterns(allow_patterns),
        ignore_patterns=split_patterns(ignore_patterns),
        revision=revision or None,
        token=access_token or None,
    )
    return initialize(request)


def _options(kind: str):
    def decorate(func):
        for option in reversed([
            click.option("--storage-uri", envvar=env.STORAGE_URI, required=True,
                         show_envvar=True,
                         help="Where to fetch from: /abs/path, ./rel/path, file:///abs/path, "
                              "hf://org/name[/sub/path], s3://bucket/prefix"),
            click.option("--output-path", envvar=env.OUTPUT_PATH, default=None,
                         show_envvar=True,
                         show_default=f"$KUBETUNE_WORKSPACE/{kind}, else /workspace/{kind}",
                         help="Directory to fill"),
            click.option("--allow-patterns", envvar=env.ALLOW_PATTERNS, default=None,
                         show_envvar=True,
                         help="Comma-separated globs; only matching files are fetched"),
            click.option("--ignore-patterns", envvar=env.IGNORE_PATTERNS, default=None,
                         show_envvar=True, help="Comma-separated globs to skip"),
            click.option("--revision", envvar=env.REVISION, default=None, show_envvar=True,
                         help="Branch, tag or commit to fetch"),
            click.option("--access-token", envvar=env.ACCESS_TOKEN, default=None,
                         show_envvar=True,
                         help="Token for private sources; prefer the env var"),
        ]):
            func = option(func)
        return func

    return decorate


@click.command("init-dataset", epilog=epilog("initializers"))
@_options("dataset")
@step_command("dataset-initializer")
def init_dataset(**options) -> None:
    """Download a dataset into the workspace, verify it, describe it for the trainer."""
    run_init("dataset", **options)


@click.command("init-model", epilog=epilog("initializers"))
@_options("model")
@step_command("model-initializer")
def init_model(**options) -> None:
    """Download a model into the workspace and verify it is loadable."""
    run_init("model", **options)
