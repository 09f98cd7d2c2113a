"""Fixtures every test module may use: the tiny model and dataset, servers, a trained run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubetune.tools.demo import write_tiny_dataset, write_tiny_model
from tests.support import s3_server, shared_runs, warm_start
from tests.support.trained import trained_run  # noqa: F401 (a session fixture)


@pytest.fixture(scope="session", autouse=True)
def _warm_start() -> None:
    """The torchtune and kubetune commands the suite starts fork from a warm process where
    `make` installed the hook (tests/support/warm_start.py)."""
    warm_start.start()


@pytest.fixture(scope="session", autouse=True)
def _shared_runs_factory(tmp_path_factory) -> None:
    shared_runs.record_factory(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The embedded tiny Llama-3 model in HF layout (do not modify: copy it)."""
    return write_tiny_model(tmp_path_factory.mktemp("sources") / "tiny-llama3")


@pytest.fixture(scope="session")
def tiny_dataset_dir(tmp_path_factory) -> Path:
    """The embedded addition dataset: data/train.parquet (do not modify: copy it)."""
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "tiny-addition")


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path) -> Path:
    """A private, modifiable copy of the tiny model."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model-src"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A moto_server on 127.0.0.1 (real S3 protocol, real sockets)."""
    server = s3_server.start()
    yield server
    server.process.terminate()
    server.process.wait(timeout=10)


def pytest_addoption(parser) -> None:
    # tests/test_support_matrix.py: `make matrix-results` records a run of every cell.
    parser.addoption("--matrix-write", action="store_true",
                     help="write the support matrix's outcomes to docs/support-matrix.json "
                          "and its table into docs/runtimes.md")
    # .ci/run: `make test` has just run the fast subset's cells; the whole matrix need
    # not train them twice in one CI run.
    parser.addoption("--matrix-skip-fast", action="store_true",
                     help="leave out the fast subset's cells (make test runs them)")
    # A cell added: run the cells whose key holds this text (`--matrix-write` then records
    # theirs and keeps every other entry as recorded).
    parser.addoption("--matrix-cells", default=None,
                     help="run only the support-matrix cells whose key holds this text")
    parser.addoption("--matrix-workers", type=int, default=None,
                     help="support-matrix cells run at once (default: the CPU count)")


# `make test` runs `pytest -n 2 --dist loadfile`: xdist hands out whole files in collection
# order, so a long file collected late (test_trainer_resume, test_validation_loop sort
# last) runs alone on one worker while the other has nothing left: the run's tail. The
# files known to be long start first, longest first (summed test seconds of a `make
# test` profile; a rough order is all it needs); the rest keep their order after them.
FILE_SECONDS = {
    "test_trainer_resume.py": 710, "test_support_matrix.py": 603,
    "test_chat_template_training.py": 300, "test_model_families.py": 287,
    "test_validation_loop.py": 277, "test_sdk_any_model.py": 203,
    "test_docs_commands.py": 183, "test_second_run.py": 172, "test_objective_dpo.py": 145,
    "test_local_signals.py": 142, "test_held_out_data.py": 138, "test_pipeline_local.py": 117,
}


def pytest_collection_modifyitems(config, items) -> None:
    # sorted() is stable: a file's tests keep their order (its module fixtures their use).
    items[:] = sorted(items, key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
