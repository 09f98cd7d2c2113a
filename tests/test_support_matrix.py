"""The support matrix, run: every model family the docs name x LoRA, QLoRA, DoRA and full
fine-tuning x 1 process, 2 processes and 2 nodes (tests/support/support_matrix.py), each
cell a TrainJob on the runtime that carries it, run by `kubetune local --runtime` on a
tiny checkpoint transformers itself wrote, exported, and loaded by transformers / PEFT
(tests/support/matrix_runner.py).

docs/support-matrix.json records each cell's outcome (passed, or refused with exit 65 and
its one line) or the cell that covers it; docs/runtimes.md's table is rendered from it.
`make test` runs a fast subset and the checks that the file and the doc agree with the
matrix; `make matrix-test` runs every cell; both fail when a run's outcome differs from
the file. `make matrix-results` reruns every cell and rewrites the file and the table.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from kubetune.errors import BadInputError
from tests.support import matrix_runner, matrix_table
from tests.support.serving_session import ServingSession
from tests.support.support_matrix import (FAST, MODEL, SFT, all_cells, coverage,
                                          dropin_admits, run_cells, runtime_for)
from tests.test_export_serving import TOLERANCE, serving_python  # noqa: F401 (fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")


def expected_results() -> dict[str, dict]:
    return matrix_table.load()


# -- what the file and the doc say, checked without training (fast) -----------------------

def test_the_results_file_holds_every_cell_as_the_matrix_defines_it():
    """A cell added, a runtime changed or a coverage rule changed without rerunning the
    matrix (`make matrix-results`) leaves the file behind: this fails."""
    results = expected_results()
    cells = all_cells()
    assert sorted(results) == sorted(c.key for c in cells)
    for cell in cells:
        got = results[cell.key]
        covered = coverage(cell)
        if covered is None:
            assert got["outcome"] in ("passed", "unsupported"), (cell.key, got)
            assert got["runtime"] == runtime_for(cell), cell.key
        else:
            by, why = covered
            assert got == {"outcome": "covered", "by": by.key, "why": why}, cell.key
            for _ in range(3):  # a chain of covering cells ends at one that runs
                if coverage(by) is None:
                    break
                by = coverage(by)[0]
            assert coverage(by) is None, f"{cell.key}: no cell that runs covers it"
    assert all(coverage(c) is None for c in FAST)


def test_the_docs_table_is_the_rendered_results():
    doc = matrix_table.DOC.read_text()
    assert matrix_table.rendered_block(doc) == matrix_table.render(expected_results()), \
        "docs/runtimes.md's support matrix is not docs/support-matrix.json rendered: run " \
        "python -m tests.support.matrix_table"


def test_every_family_the_docs_name_is_a_row():
    """docs/trainer.md's table of families, each a row of the matrix."""
    table = matrix_table.REPO.joinpath("docs", "trainer.md").read_text()
    named = ("Llama-3, 3.1, 3.2, 3.3", "Qwen2, Qwen2.5", "Qwen3 dense", "| Mistral |",
             "| Gemma |", "| Gemma 2 |", "Phi-3 (4k), Phi-4")
    assert all(n in table for n in named)
    rows = " ".join(MODEL)
    for family in ("Llama 3", "Llama 3.1", "Llama 3.2", "Llama 3.3", "Mistral", "Qwen2",
                   "Qwen2.5", "Qwen3", "Gemma", "Gemma 2", "Phi-3", "Phi-4"):
        assert family in rows


def test_a_dropin_carries_exactly_the_cells_upstreams_admission_lets_through(tmp_path):
    """Where a model's runtime is a `torchtune-*` drop-in, its cells go through it when
    upstream's TrainJob admission (kubetune/tools/local/admission_rules.py) admits them,
    and through kubetune-byo-model when it refuses them."""
    from kubetune.tools.local.runtime_merge import merge

    for cell in all_cells():
        model = MODEL[cell.model]
        if not model.runtime.startswith("torchtune-"):
            continue
        spec = matrix_runner.trainjob_spec(cell, model.runtime, tmp_path / "m", tmp_path / "d")
        job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "metadata": {"name": "matrix"},
               "spec": {"runtimeRef": {"name": model.runtime}, **spec}}
        runtime = yaml.safe_load(matrix_runner.runtime_file(model.runtime).read_text())
        try:
            merge(runtime, job)
            admitted = True
        except BadInputError as exc:
            assert str(exc).startswith("TrainJob rejected: "), exc
            admitted = False
        assert admitted is dropin_admits(model.runtime, cell), cell.key
        assert (runtime_for(cell) == model.runtime) is admitted, cell.key


# -- the runs ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def serving_session(serving_python, tmp_path_factory):  # noqa: F811
    """The module's one serving-venv process: it writes the checkpoints, computes
    transformers' logits and loads every export (transformers imported once)."""
    log = tmp_path_factory.mktemp("serving") / "serving.log"
    with ServingSession(serving_python, log) as session:
        yield session


@pytest.fixture(scope="module")
def sources(serving_python, serving_session, tmp_path_factory):  # noqa: F811
    """One transformers-written checkpoint per architecture and tokenizer, and the data."""
    from kubetune.tools.demo import write_tiny_dataset

    root = tmp_path_factory.mktemp("matrix")
    checkpoints = matrix_runner.write_checkpoints(serving_python, root / "checkpoints",
                                                  sorted(MODEL), serving_session)
    dataset = write_tiny_dataset(root / "data", rows=matrix_runner.ROWS)
    matrix_runner.write_held_out_split(dataset)
    datasets = {SFT: dataset, **matrix_runner.write_objective_data(root)}
    return checkpoints, datasets, root


def _workers(request) -> int:
    return request.config.getoption("--matrix-workers") or os.cpu_count() or 1


def _run_and_compare(request, cells, sources, serving_session) -> dict[str, dict]:
    checkpoints, datasets, root = sources
    runs = matrix_runner.run_cells(cells, checkpoints, datasets, root / "cells",
                                   _workers(request),
                                   after=lambda run: matrix_runner.serve(serving_session, run))
    got = matrix_runner.results(runs)
    for run in runs:
        if run.cell.key in got and got[run.cell.key]["outcome"] == "failed":
            print(f"--- {run.cell.key} ({run.runtime}):\n{run.output[-4000:]}")
    return got


def _differences(got: dict[str, dict], want: dict[str, dict]) -> list[str]:
    return [f"{key}: recorded {want.get(key)}, ran {value}" for key, value in got.items()
            if value != want.get(key)]


@pytest.mark.slow
def test_each_checkpoint_loads_with_transformers_logits(sources, serving_session):
    """The trainer builds each family from config.json with transformers' numbers (fp32):
    RoPE scaling, tied output, norms, head_dim, soft-capping."""
    import torch

    from tests.support.torchtune_logits import logits

    from kubetune.model_family.architecture import TORCHTUNE_TYPES, supported_types

    checkpoints = {str(d): d for d in sources[0].values()}
    # Every model_type torchtune's own builders run is among the checkpoints the matrix
    # trains, with two of the config-built decoder's rows; the decoder's every row is
    # checked against transformers by tests/test_config_families.py.
    trained = {json.loads((d / "config.json").read_text())["model_type"]
               for d in checkpoints.values()}
    assert set(TORCHTUNE_TYPES) | {"qwen3", "gemma2"} <= trained <= set(supported_types())
    tokens = torch.randint(0, matrix_runner.VOCAB, (2, 96),
                           generator=torch.Generator().manual_seed(1)).tolist()
    wanted = serving_session.request({"op": "logits-many", "tokens": tokens,
                                      "dirs": sorted(checkpoints)})
    assert "error" not in wanted, wanted["error"]
    for name, model_dir in checkpoints.items():
        want = torch.tensor(wanted[name])
        got = logits(model_dir, tokens)
        scale = max(1.0, float(want.abs().max()))
        assert float((got - want).abs().max()) <= TOLERANCE * scale, model_dir.name


@pytest.mark.slow
def test_the_fast_subset_runs_as_recorded(request, sources, serving_session):
    """Every family, method and topology at least once (support_matrix.FAST)."""
    got = _run_and_compare(request, list(FAST), sources, serving_session)
    assert not _differences(got, expected_results()), "\n".join(_differences(
        got, expected_results()))


@pytest.mark.matrix
def test_the_whole_matrix_runs_as_recorded(request, sources, serving_session):
    cells = run_cells()
    if request.config.getoption("--matrix-skip-fast"):
        assert not request.config.getoption("--matrix-write"), \
            "--matrix-write records every cell: drop --matrix-skip-fast"
        cells = [cell for cell in cells if cell not in FAST]
    chosen = request.config.getoption("--matrix-cells")
    if chosen:  # a few cells rerun (a new one); --matrix-write records only theirs
        cells = [cell for cell in cells if chosen in cell.key]
        assert cells, f"--matrix-cells {chosen!r}: no run cell's key holds it"
    got = _run_and_compare(request, cells, sources, serving_session)
    if request.config.getoption("--matrix-write"):
        recorded = expected_results() if chosen else {}
        cells = {}
        for cell in all_cells():
            covered = coverage(cell)
            cells[cell.key] = got.get(cell.key, recorded.get(cell.key)) if covered is None \
                else {"outcome": "covered", "by": covered[0].key, "why": covered[1]}
        matrix_table.RESULTS.write_text(json.dumps({"cells": cells}, indent=1) + "\n")
        doc = matrix_table.DOC.read_text()
        matrix_table.DOC.write_text(matrix_table.rewrite(doc, matrix_table.render(cells)))
    failed = [k for k, v in got.items() if v["outcome"] == "failed"]
    assert not failed, "\n".join(f"{k}: {got[k]}" for k in failed)
    assert not _differences(got, expected_results()), "\n".join(_differences(
        got, expected_results()))

