"""An example package of examples/ installed the way an image installs it: pip, no deps,
no index, into a folder a test puts on PYTHONPATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def install_example(example: Path, tmp_path_factory) -> str:
    """``example`` installed into a fresh folder; returns that folder."""
    target = tmp_path_factory.mktemp(f"{example.name}-site")
    # A copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = shutil.copytree(example, tmp_path_factory.mktemp(f"{example.name}-src") / example.name)
    # --no-build-isolation: build with the setuptools already installed, never the network.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target),
                    str(source)], check=True, capture_output=True, cwd=target)
    return str(target)
