"""The CLI contract: every option documented with its env var, one precedence rule, `tune`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kubetune.entrypoints.cli import COMMANDS, main
from kubetune.entrypoints.shims import install_tune
from tests.support.cli import clean_env, kubetune

REPO = Path(__file__).resolve().parents[1]
STEP_COMMANDS = ["init-dataset", "init-model", "train", "export", "local", "size"]


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


# What the initializer image does not ship (core dependencies only).
TORCH_STACK = ("torch", "torchtune", "torchao", "omegaconf", "safetensors", "datasets")


def test_help_of_every_command_imports_no_torch_stack():
    # Every image ships the whole CLI; the initializer image has no torch stack, so
    # `kubetune --help` and each subcommand's `--help` must not import it.
    code = ("import contextlib, io, sys\n"
            "from kubetune.entrypoints.cli import COMMANDS, main\n"
            "for args in [['--help'], *[[name, '--help'] for name in COMMANDS]]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        assert main.main(args, standalone_mode=False) == 0, args\n"
            f"print(sorted(m for m in {TORCH_STACK!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported by --help: {out.stdout.strip()}"


def documented_tune_commands() -> set[str]:
    """Every `tune-*` command our docs, Dockerfiles and Makefile tell a user to run."""
    texts = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").glob("*.md")),
             REPO / "Makefile", REPO / "Dockerfile",
             *sorted((REPO / "images").glob("*.Dockerfile"))]
    return {name for path in texts
            for name in re.findall(r"(?<![\w-])tune-[a-z]+", path.read_text())}


@pytest.mark.parametrize("layout", ["image", "venv"])
def test_install_tune_writes_every_documented_tune_command(tmp_path, layout):
    # image: an empty /opt/kubetune/bin (torchtune's `tune` is elsewhere, shadowed);
    # venv: torchtune's console script already in the directory, replaced by ours.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if layout == "venv":
        (bin_dir / "tune").write_text(f"#!{sys.executable}\n# torchtune's console script\n"
                                      "import sys\nfrom torchtune._cli.tune import main\n"
                                      "sys.exit(main())\n")
    install_tune(bin_dir)
    documented = documented_tune_commands()
    assert "tune-torchtune" in documented
    for name in documented:
        assert os.access(bin_dir / name, os.X_OK), f"documented {name} is not installed"
    ours = subprocess.run([str(bin_dir / "tune"), "--kubetune-version"], capture_output=True,
                          text=True)
    assert ours.returncode == 0 and ours.stdout.startswith("kubetune "), ours.stderr
    theirs = subprocess.run([str(bin_dir / "tune-torchtune"), "ls"], capture_output=True,
                            text=True, env=clean_env())
    assert theirs.returncode == 0 and "lora_finetune_single_device" in theirs.stdout, \
        theirs.stderr
    # torchtune's own `run`, not our launcher: its usage, not our flags.
    usage = subprocess.run([str(bin_dir / "tune-torchtune"), "run", "--help"],
                           capture_output=True, text=True, env=clean_env())
    assert usage.returncode == 0 and "usage: tune run" in usage.stdout, usage.stderr
    before = {name: (bin_dir / name).read_text() for name in documented | {"tune"}}
    install_tune(bin_dir)  # idempotent
    assert {name: (bin_dir / name).read_text() for name in before} == before


def test_tune_on_the_venv_path_is_ours_and_passes_other_subcommands_through():
    venv_bin = Path(sys.executable).parent
    tune = shutil.which("tune", path=str(venv_bin))
    assert tune, f"no tune in {venv_bin}: run `make venv`"
    version = subprocess.run([tune, "--kubetune-version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("kubetune "), version.stderr
    listed = subprocess.run([tune, "ls"], capture_output=True, text=True, env=clean_env())
    assert listed.returncode == 0, listed.stderr
    assert "lora_finetune_single_device" in listed.stdout
    # torchao's import warning (the trainer image's `docker run` is `tune --help`): only
    # when asked for with KUBETUNE_LOG_LEVEL=debug.
    assert TORCHAO_WARNING not in listed.stderr
    theirs = venv_bin / "tune-torchtune"
    assert theirs.is_file()
    listed = subprocess.run([str(theirs), "ls"], capture_output=True, text=True,
                            env=clean_env(KUBETUNE_LOG_LEVEL="debug"))
    assert "lora_finetune_single_device" in listed.stdout
    assert TORCHAO_WARNING in listed.stderr


TORCHAO_WARNING = "Skipping import of cpp extensions"


def test_commands_table_matches_the_group():
    ctx = click.Context(main)
    for name in COMMANDS:
        assert isinstance(main.get_command(ctx, name), click.Command)


def test_bare_kubetune_shows_help_and_succeeds():
    result = kubetune(env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: ") and "init-model" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("args, env, code, line", [
    # A bad value from a variable names the variable the user set, not the option it feeds.
    (["train"], {"KUBETUNE_EPOCHS": "abc"}, 2,
     "error: trainer: invalid value in KUBETUNE_EPOCHS: 'abc' is not a valid integer."),
    (["train", "--epochs", "abc"], {}, 2, "error: trainer: Invalid value for '--epochs'"),
    (["init-model"], {"KUBETUNE_LOG_LEVEL": "loud"}, 65,
     "error: kubetune: KUBETUNE_LOG_LEVEL='loud' is not one of debug, info, warning, error"),
    (["train"], {"KUBETUNE_LOG_FORMAT": "xml"}, 65,
     "error: kubetune: KUBETUNE_LOG_FORMAT='xml' is not one of text, json"),
    (["-q", "-v", "train"], {}, 2, "error: kubetune: -q and -v contradict each other"),
    # A mistyped subcommand gets the "did you mean" a mistyped option gets.
    (["lcoal"], {}, 2, "error: kubetune: No such command 'lcoal' (did you mean 'local'?)"),
    (["trian"], {}, 2, "error: kubetune: No such command 'trian' (did you mean 'train'?)"),
    (["init-modle"], {}, 2,
     "error: kubetune: No such command 'init-modle' (did you mean 'init-model'?)"),
    (["exprot"], {}, 2, "error: kubetune: No such command 'exprot' (did you mean 'export'?)"),
])
def test_usage_and_setting_errors_are_one_error_line(tmp_path, args, env, code, line):
    term = tmp_path / "termination-log"
    result = kubetune(*args, env=clean_env(KUBETUNE_TERMINATION_LOG=str(term), **env))
    assert result.returncode == code, result.stderr
    errors = [x for x in result.stderr.splitlines() if x.lower().startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(line), result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]  # the last line, where one looks
    assert term.read_text().strip() == errors[0][len("error: "):]


def test_quiet_and_verbose_set_the_level_of_every_step(tmp_path, tiny_dataset_dir):
    def fetch(*flags):
        return kubetune(*flags, "init-dataset", env=clean_env(
            STORAGE_URI=f"file://{tiny_dataset_dir}",
            OUTPUT_PATH=str(tmp_path / f"dataset{len(flags) and flags[0]}"),
            KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl")))

    normal, quiet, verbose = fetch(), fetch("-q"), fetch("-v")
    assert normal.returncode == quiet.returncode == verbose.returncode == 0, quiet.stderr
    assert " INFO " in normal.stderr and " DEBUG " not in normal.stderr
    assert quiet.stderr.strip() == "" and quiet.stdout.strip() == ""
    assert " DEBUG " in verbose.stderr
    # One zone: UTC, ISO 8601 with its Z.
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ dataset-initializer INFO ",
                    normal.stderr.splitlines()[0]), normal.stderr
