"""The CLI contract: every option documented with its env var, one precedence rule, `tune`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kubetune.entrypoints.cli import COMMANDS, main
from kubetune.entrypoints.shims import install_tune
from tests.support.cli import clean_env, kubetune

STEP_COMMANDS = ["init-dataset", "init-model", "train", "export", "local"]


def test_every_step_is_a_subcommand():
    result = kubetune("--help")
    assert result.returncode == 0
    for name in STEP_COMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", STEP_COMMANDS)
def test_help_names_every_option_and_its_env_var(name):
    result = kubetune(name, "--help")
    assert result.returncode == 0, result.stderr
    command = main.get_command(click.Context(main), name)
    help_text = " ".join(result.stdout.split())
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        assert param.opts[0] in help_text
        if param.envvar:
            assert f"env var: {param.envvar}" in help_text, f"{name} {param.opts[0]}"


def test_every_option_of_the_steps_has_an_env_var():
    ctx = click.Context(main)
    for name in STEP_COMMANDS:
        command = main.get_command(ctx, name)
        missing = [p.opts[0] for p in command.params if isinstance(p, click.Option)
                   and not p.envvar and p.opts[0] not in ("--dry-run",)]
        assert not missing, f"{name}: options without an env var: {missing}"


def _init_dataset(tmp_path, source, *args, **env):
    return kubetune("init-dataset", *args,
                    env=clean_env(STORAGE_URI=str(source), KUBETUNE_WORKSPACE=str(tmp_path / "ws"),
                                  KUBETUNE_TERMINATION_LOG=str(tmp_path / "term"), **env))


def test_precedence_default_is_the_workspace(tmp_path, tiny_dataset_dir):
    result = _init_dataset(tmp_path, tiny_dataset_dir)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ws" / "dataset" / "data" / "train.parquet").is_file()


def test_precedence_env_beats_default(tmp_path, tiny_dataset_dir):
    result = _init_dataset(tmp_path, tiny_dataset_dir, OUTPUT_PATH=str(tmp_path / "from-env"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "from-env" / "data" / "train.parquet").is_file()
    assert not (tmp_path / "ws" / "dataset").exists()


def test_precedence_option_beats_env(tmp_path, tiny_dataset_dir):
    result = _init_dataset(tmp_path, tiny_dataset_dir, "--output-path",
                           str(tmp_path / "from-option"), OUTPUT_PATH=str(tmp_path / "from-env"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "from-option" / "data" / "train.parquet").is_file()
    assert not (tmp_path / "from-env").exists()


def test_initializer_commands_do_not_import_the_torch_stack():
    # The initializer image has no torch: its commands must not need it.
    code = ("import sys, click; from kubetune.entrypoints.cli import main; "
            "[main.get_command(click.Context(main), n) for n in ('init-model', 'init-dataset')]; "
            "print(sorted(m for m in ('torch', 'torchtune', 'omegaconf', 'safetensors') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_install_tune_keeps_torchtunes_cli_reachable(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    theirs = "#!/bin/sh\n# torchtune's console script\nexec python -m torchtune._cli.tune \"$@\"\n"
    (bin_dir / "tune").write_text(theirs)
    install_tune(bin_dir)
    assert (bin_dir / "tune-torchtune").read_text() == theirs
    ours = subprocess.run([str(bin_dir / "tune"), "--kubetune-version"], capture_output=True,
                          text=True, check=True)
    assert ours.stdout.startswith("kubetune ")
    install_tune(bin_dir)  # idempotent: does not move our own script over torchtune's
    assert (bin_dir / "tune-torchtune").read_text() == theirs


def test_tune_on_the_venv_path_is_ours_and_passes_other_subcommands_through():
    venv_bin = Path(sys.executable).parent
    tune = shutil.which("tune", path=str(venv_bin))
    assert tune, f"no tune in {venv_bin}: run `make venv`"
    version = subprocess.run([tune, "--kubetune-version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("kubetune "), version.stderr
    listed = subprocess.run([tune, "ls"], capture_output=True, text=True, env=clean_env())
    assert listed.returncode == 0, listed.stderr
    assert "lora_finetune_single_device" in listed.stdout
    theirs = venv_bin / "tune-torchtune"
    assert theirs.is_file()
    listed = subprocess.run([str(theirs), "ls"], capture_output=True, text=True, env=clean_env())
    assert "lora_finetune_single_device" in listed.stdout


def test_commands_table_matches_the_group():
    ctx = click.Context(main)
    for name in COMMANDS:
        assert isinstance(main.get_command(ctx, name), click.Command)
