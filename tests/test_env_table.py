"""docs/env.md is kubetune/env_table.py rendered: one row for every name kubetune/env.py
defines, kept equal to the code (a name added without a row, or a row changed without
rendering again, fails here: `python -m kubetune.env_table docs/env.md`)."""

from __future__ import annotations

import pytest

from kubetune import env_table
from tests.support.cli import REPO, kubetune

REGENERATE = "python -m kubetune.env_table docs/env.md"


def test_every_name_in_env_py_has_a_row():
    missing = [n for n in env_table.names() if n not in env_table.ROWS]
    stale = [n for n in env_table.ROWS if n not in env_table.names()]
    assert not missing, f"add a row to kubetune/env_table.py for {missing}, then {REGENERATE}"
    assert not stale, f"rows in kubetune/env_table.py for names env.py lacks: {stale}"


def test_docs_env_md_is_the_table_rendered():
    text = (REPO / "docs" / "env.md").read_text()
    assert text == env_table.render(), f"docs/env.md is stale: run {REGENERATE}"
    assert REGENERATE in text and REGENERATE in (REPO / "DEVELOPERS.md").read_text()


def test_test_hooks_are_marked():
    hooks = [n for n in env_table.names() if n.startswith("KUBETUNE_TEST_")]
    assert hooks and all(env_table.ROWS[n].setter == env_table.TESTS for n in hooks)
    text = env_table.render()
    assert all(f"| `{n}` | **tests only** |" in text for n in hooks)


@pytest.mark.parametrize("command", ["init-model", "init-dataset"])
def test_initializer_help_names_every_variable_it_reads(command):
    result = kubetune(command, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    absent = [n for n in env_table.rows_for("initializers") if n not in text]
    assert not absent, absent
    for name in ("KUBETUNE_DOWNLOAD_WORKERS", "KUBETUNE_RETRY_TOTAL_S", "HF_TOKEN",
                 "ENDPOINT", "ROLE_ARN"):
        assert name in text
