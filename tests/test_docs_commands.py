"""The docs do what they say: every block marked runnable in README.md and docs/*.md runs
as a newcomer would type it, in a fresh copy of this checkout, and prints the lines it
shows; every relative link points at a file (and heading) that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import REPO
from tests.support.doc_blocks import (Block, anchors, missing_shown_line, relative_links,
                                      runnable_blocks)
from tests.support.readme_demo import (BLOCK_TIMEOUT_S, README, checkout_copy, demo_block,
                                       readme_demo, run_commands)

DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


def check_block(block: Block, code: int | None, output: str) -> None:
    """A block ran as shown: it ended in time, exit 0, and printed every line it shows."""
    tail = output[-6000:]
    if code is None:
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S} s\n"
                    f"{output[-4000:]}", pytrace=False)
    if code != 0:
        pytest.fail(f"{block.where}: exit {code}\n{tail}", pytrace=False)
    missing = missing_shown_line(block.shown, output)
    if missing is not None:
        pytest.fail(f"{block.where}: the output lacks the shown line\n  {missing}\n"
                    f"output:\n{tail}", pytrace=False)


def run_block(block: Block, cwd: Path) -> None:
    check_block(block, *run_commands(block, cwd))


def runnable(doc: Path) -> list[Block]:
    return runnable_blocks(doc, shown_as=doc.relative_to(REPO))


@pytest.mark.parametrize("doc", [d for d in DOCS if runnable(d)],
                         ids=lambda d: str(d.relative_to(REPO)))
def test_runnable_blocks_run_as_shown(doc, tmp_path, tmp_path_factory):
    # One copy per document, its blocks in order: a block may use what an earlier one made
    # (the laptop run reads the tiny model `make demo` generated).
    blocks = runnable(doc)
    if doc == README:
        # README's `make demo` ran once for this session in its own copy, which
        # test_pipeline_local reads too (tests/support/readme_demo.py); the later blocks
        # run in that copy.
        demo = readme_demo(tmp_path_factory)
        assert blocks[0].commands == demo_block().commands
        check_block(blocks[0], demo.returncode, demo.output)
        cwd, blocks = demo.checkout, blocks[1:]
    else:
        cwd = checkout_copy(tmp_path)
    for block in blocks:
        run_block(block, cwd)


def test_a_broken_block_fails_naming_its_line(tmp_path):
    doc = tmp_path / "guide.md"
    doc.write_text("# Guide\n\n```console runnable\n$ echo 'loss 5.60 -> 0.47'\n"
                   "loss 1.23 -> 4.56\n```\n\n```console runnable\n$ echo one\n"
                   "two\n```\n\n```console runnable\n$ kubetune --no-such-flag\n```\n\n"
                   "```console runnable\n$ kubetune train --epochs abc || echo \"exit $?\"\n"
                   "exit 65\n```\n")
    ok, wrong_output, failing, wrong_code = runnable_blocks(doc)
    run_block(ok, tmp_path)   # decimal numbers shown are wildcards
    with pytest.raises(pytest.fail.Exception,
                       match=rf"{doc}:8: the output lacks the shown line\n  two\n"):
        run_block(wrong_output, tmp_path)
    with pytest.raises(pytest.fail.Exception, match=rf"{doc}:13: exit 2\n"):
        run_block(failing, tmp_path)
    with pytest.raises(pytest.fail.Exception, match=rf"{doc}:17: .*\n  exit 65\n"):
        run_block(wrong_code, tmp_path)   # whole numbers are checked


def test_shown_lines_match_in_order_with_elisions():
    output = ("2026-11-25T13:17:28Z train: step 2/192 (1%) | loss 5.6078 | 4808 tok/s | eta 0:00:05\n"
              "==> trainer: ok in 27.8s\nsummary\n  steps: 192\n"
              "  adapter: /home/me/kt/workspace/export\n")
    assert missing_shown_line([
        "...", "2026-01-01T00:00:00Z train: step 2/192 (1%) | loss 4.1 | … tok/s | eta 0:01:00",
        "==> trainer: ok in 3.1s", "", "summary", "  steps: 192",
        "  adapter: /…/workspace/export"], output) is None
    assert missing_shown_line(["summary", "==> trainer: ok in 1.0s"], output) \
        == "==> trainer: ok in 1.0s"
    assert missing_shown_line(["  steps: 191"], output) == "  steps: 191"
    assert missing_shown_line(["  adapter: /…/workspace/merged"], output) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_relative_links_point_at_what_exists(doc):
    broken = []
    for line, target in relative_links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{doc.relative_to(REPO)}:{line}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{doc.relative_to(REPO)}:{line}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_that_other_files_name_exist():
    # Code comments, Dockerfiles and tests point readers at docs by path ("docs/cli.md").
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    named = set()
    for name in listed.stdout.split():
        if (REPO / name).is_file() and name.endswith((".md", ".py", "Dockerfile", "Makefile",
                                                      ".yaml", ".toml")):
            named |= set(re.findall(r"\bdocs/[\w-]+\.md\b", (REPO / name).read_text()))
    missing = sorted(name for name in named if not (REPO / name).is_file())
    assert not missing, f"named but missing: {missing}"
