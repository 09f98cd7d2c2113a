"""Every file and directory a `kubetune local` run writes (sources, workspace, checkpoint,
export, logs) has the mode the umask gives a new one: 0644/0755 under umask 022,
0664/0775 under 002. A serving pod of another uid reads the export from the PVC, and the
steps of a platform may run as different users in one group: a file written 0600, or a
directory 0700, is one they cannot read; one written 0666, 0777 is one anybody may change."""

from __future__ import annotations

import os
import stat

import pytest

from kubetune.atomic_write import umask_mode, write_atomic
from tests.support.cli import clean_env, kubetune
from tests.support.file_modes import wrong_modes


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_a_whole_local_run_writes_every_file_with_the_umask_mode(tmp_path, umask):
    workdir = tmp_path / "run"
    result = kubetune("local", "--workdir", str(workdir), "epochs=2",
                      "max_steps_per_epoch=2", env=clean_env(), umask=umask)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # What a user would look for, there to be checked.
    for name in ("output/kubetune-report.md", "output/summary.json",
                 "output/kubetune-curves.png", "output/kubetune-config.yaml",
                 "output/kubetune-complete.json", "output/epoch_1/adapter_model.safetensors",
                 "export/manifest.json", "export/adapter_model.safetensors",
                 "model/.kubetune-manifest.json"):
        assert (workdir / "workspace" / name).is_file(), name
    assert (workdir / "sources" / "tiny-llama3" / "model.safetensors").is_file()
    assert wrong_modes(workdir, umask) == []


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_an_atomic_write_has_the_umask_mode_whatever_the_writer_left(tmp_path, umask):
    """safetensors' save_file replaces the file it is given by its own 0600 one."""
    from safetensors.torch import save_file
    import torch

    from kubetune.atomic_write import atomic_path

    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "summary.json", "{}")
        write_atomic(tmp_path / "tune", "#!/bin/sh\n", executable=True)
        with atomic_path(tmp_path / "adapter_model.safetensors") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp))
        assert umask_mode() == 0o666 & ~umask
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"summary.json": 0o666 & ~umask, "tune": 0o777 & ~umask,
                     "adapter_model.safetensors": 0o666 & ~umask}
