"""An output directory that is a mount point, as a Kubernetes ``subPath`` mounts it.

A subPath is a bind mount of a directory of the same filesystem: ``os.path.ismount`` says
no, and renaming over it fails (EBUSY). The initializer and the exporter must fill it
anyway, crash-safe (the manifest last), and leave the mount in place. Needs root and
``mount --bind`` (the test image runs as root); skipped, saying why, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import clean_env, kubetune

MANIFEST = ".kubetune-manifest.json"


@pytest.fixture
def bind_mount(tmp_path):
    """``tmp_path/ws/model``: a bind mount of ``tmp_path/volume/sub`` (same filesystem)."""
    backing = tmp_path / "volume" / "sub"
    target = tmp_path / "ws" / "model"
    backing.mkdir(parents=True)
    target.mkdir(parents=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a bind mount cannot be made")
    made = subprocess.run(["mount", "--bind", str(backing), str(target)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"mount --bind failed (needs root / CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        assert not os.path.ismount(target)  # what made the rename over it look safe
        yield target, backing
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == str(path) for line in table)


def init(source: Path, out: Path, **extra: str) -> subprocess.CompletedProcess:
    env = clean_env(STORAGE_URI=str(source), OUTPUT_PATH=str(out),
                    KUBETUNE_TERMINATION_LOG=str(out.parent / "termination-log"), **extra)
    return kubetune("init-model", env=env, timeout=120)


def test_initializer_fills_a_bind_mounted_output_and_replaces_it_later(bind_mount, model_copy):
    target, backing = bind_mount
    (target / "lost+found").mkdir()  # a volume's own entry: left alone
    first = init(model_copy, target, IGNORE_PATTERNS="tokenizer.json")
    assert first.returncode == 0, first.stderr
    assert mounted(target)
    manifest = json.loads((backing / MANIFEST).read_text())
    assert {f["path"] for f in manifest["files"]} >= {"config.json", "model.safetensors"}
    assert not (backing / "tokenizer.json").exists()
    assert not [p for p in backing.iterdir() if p.name.startswith(".kubetune-staging")]

    # A different request replaces the tree through the same mount point.
    (model_copy / "config.json").write_text((model_copy / "config.json").read_text() + "\n")
    second = init(model_copy, target)
    assert second.returncode == 0, second.stderr
    assert mounted(target)
    assert (backing / "tokenizer.json").read_bytes() == (model_copy / "tokenizer.json").read_bytes()
    assert (backing / "config.json").read_bytes() == (model_copy / "config.json").read_bytes()
    assert (backing / "lost+found").is_dir()
    assert not [p for p in backing.iterdir() if p.name.startswith(".kubetune-staging")]
    again = init(model_copy, target)
    assert again.returncode == 0 and "nothing to download" in again.stderr


def test_a_killed_swap_is_never_trusted_and_the_next_run_completes(bind_mount, model_copy):
    """The state a kill mid-swap leaves (the swap's journal written, old manifest gone, some
    new files in, the rest still staged inside the mount): the next run does not take it as
    done, knows the files there are its own (not a user's), and ends whole."""
    target, backing = bind_mount
    assert init(model_copy, target).returncode == 0
    staged = target / ".kubetune-staging-model"
    staged.mkdir()
    # The swap's first moves: the journal of what it may leave, then the old manifest goes.
    shutil.copyfile(backing / MANIFEST, backing / ".kubetune-staging-model.owned.json")
    (backing / MANIFEST).unlink()
    shutil.move(str(backing / "tokenizer.json"), staged / "tokenizer.json")
    rerun = init(model_copy, target)
    assert rerun.returncode == 0, rerun.stderr
    assert "nothing to download" not in rerun.stderr
    assert (backing / MANIFEST).is_file() and mounted(target)
    assert (backing / "tokenizer.json").read_bytes() == (model_copy / "tokenizer.json").read_bytes()
    assert not staged.exists()
    assert not [p for p in backing.iterdir() if p.name.startswith(".kubetune-staging")]


def test_a_user_s_file_in_a_bind_mounted_output_is_kept(bind_mount, model_copy):
    target, backing = bind_mount
    assert init(model_copy, target, IGNORE_PATTERNS="tokenizer.json").returncode == 0
    (backing / "notes.txt").write_text("mine")
    changed = init(model_copy, target)
    assert changed.returncode == 65, changed.stderr
    assert "notes.txt" in changed.stderr and "Traceback" not in changed.stderr
    assert (backing / "notes.txt").read_text() == "mine" and (backing / MANIFEST).is_file()
    assert mounted(target)
