"""README's `make demo`, run once per `make test` session in a copy of this checkout, and
read by both files that check it: tests/test_docs_commands.py (the block prints what
README shows; README's next block runs in the same copy, on the sources it generated)
and tests/test_pipeline_local.py (what a newcomer checks in its output and workspace).

The demo trains 192 steps (3 epochs): its recipe process alone is about 100 CPU-seconds
under load. Each file ran it apart before; now the first to need it runs it
(tests/support/shared_runs.py), the other reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import REPO, clean_env
from tests.support.doc_blocks import Block, runnable_blocks
from tests.support.shared_runs import shared_run

BLOCK_TIMEOUT_S = 600
README = REPO / "README.md"
DEMO_COMMANDS = ["make demo"]  # README's first runnable block: what this run stands for


def checkout_copy(dest: Path) -> Path:
    """The files a clone has (tracked, plus new ones git does not ignore), and this venv.

    The copy's `.venv` links to the running interpreter's venv, with a fresh `.installed`
    stamp, so `make demo` there finds it made and installs nothing (the venv's editable
    install still points at this checkout: the same code)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    if sys.prefix == sys.base_prefix:
        pytest.skip("the docs' commands need the venv `make venv` creates")
    venv = dest / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()
    return dest


def run_commands(block: Block, cwd: Path, **extra_env: str) -> tuple[int | None, str]:
    """A block's commands in one bash, as a newcomer types them: (exit code, stdout and
    stderr together); the exit code is None when the block outran BLOCK_TIMEOUT_S."""
    script = "set -euo pipefail\n" + "\n".join(block.commands) + "\n"
    env = clean_env(PATH=f"{cwd / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    **extra_env)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):   # under `make test`: a fresh make
        env.pop(name, None)
    try:
        result = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as stopped:
        output = stopped.stdout or ""
        return None, output if isinstance(output, str) else output.decode(errors="replace")
    return result.returncode, result.stdout


@dataclass
class DemoRun:
    """The copy README's `make demo` ran in, and what it printed."""
    checkout: Path
    returncode: int | None
    output: str  # stdout and stderr together, as the docs test reads a block's

    @property
    def workdir(self) -> Path:
        return self.checkout / "kubetune-local"

    @property
    def termination_log(self) -> Path:
        # Set for the demo's block only: a run that succeeds reports nothing there.
        return self.checkout.parent / "termination-log"


def demo_block() -> Block:
    block = runnable_blocks(README, shown_as=README.relative_to(REPO))[0]
    assert block.commands == DEMO_COMMANDS, (
        f"{block.where}: README's first runnable block is no longer `make demo`: "
        "tests/support/readme_demo.py (and test_pipeline_local) stand for that block")
    return block


def _build(workdir: Path) -> None:
    checkout = workdir / "checkout"
    checkout.mkdir()
    checkout_copy(checkout)
    run = DemoRun(checkout, None, "")
    code, output = run_commands(demo_block(), checkout,
                                KUBETUNE_TERMINATION_LOG=str(run.termination_log))
    (workdir / "result.json").write_text(json.dumps({"returncode": code, "output": output}))


def readme_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The session's one run of README's `make demo`. Its readers add only what leaves
    the run as it was: README's later blocks write beside ``kubetune-local`` (they read
    its sources), test_pipeline_local's re-run is checked to change nothing in it."""
    workdir = shared_run(tmp_path_factory, "readme-make-demo", _build)
    result = json.loads((workdir / "result.json").read_text())
    return DemoRun(workdir / "checkout", result["returncode"], result["output"])
