"""The recipe process tells its launcher why it failed by the exception's type, in a failure
record (issue 35): a refused run, no fallback left or out of memory is exit 65 with its one
line however the recipe words or wraps it; anything else stays an internal error. The
record is read only from the run that wrote it: a missing, garbled or earlier run's record
is none."""

from __future__ import annotations

import collections
import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kubetune.atomic_write import umask_mode
from kubetune.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, BadInputError, KubetuneError
from kubetune.trainer.failures.failure_record import (FailureRecord, first_failure,
                                                      read_failure_record, record_path,
                                                      write_failure_record)
from kubetune.trainer.launcher import outcome
from kubetune.trainer.launcher.supervision import RecipeRun, run_recipe
from kubetune.trainer.recipe_process import failure_report
from kubetune.trainer.recipe_process.fallbacks import NoFallbackError
from kubetune.trainer.recipe_process.run_sanity import NonFiniteError, NoStepError
from tests.support.cli import error_lines
from tests.support.trainer import make_pvc, tune_run

RECORD = FailureRecord("non_finite", "the loss is nan at step 2: lower optimizer.lr", 65)


# The record's format: written whole, read back, anything else is no record.

def test_a_record_reads_back_as_written_with_the_umask_mode(tmp_path):
    path = record_path(tmp_path, 0)
    write_failure_record(path, RECORD)
    assert read_failure_record(path) == RECORD
    assert stat.S_IMODE(path.stat().st_mode) == umask_mode()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left beside


@pytest.mark.parametrize("text", [
    "", "{", "not json", "[]", '"a string"',
    '{"kind": "non_finite", "message": "m"}',  # no exit code
    '{"kind": "non_finite", "message": "m", "exit_code": "65"}',
    '{"kind": "non_finite", "message": "m", "exit_code": true}',
    '{"kind": "non_finite", "message": "m", "exit_code": 0}',
    '{"kind": "non_finite", "message": "m", "exit_code": 300}',
    '{"kind": "non_finite", "message": "  ", "exit_code": 65}',
    '{"kind": "", "message": "m", "exit_code": 65}',
    '{"kind": 1, "message": "m", "exit_code": 65}',
])
def test_a_garbled_record_is_none(tmp_path, text):
    path = tmp_path / "failure-rank0.json"
    path.write_text(text)
    assert read_failure_record(path) is None
    assert first_failure(tmp_path) is None


def test_a_missing_record_is_none(tmp_path):
    assert read_failure_record(tmp_path / "failure-rank0.json") is None
    assert first_failure(tmp_path) is None
    assert first_failure(tmp_path / "gone") is None


def test_a_record_is_one_line_whatever_was_written(tmp_path):
    path = record_path(tmp_path, 0)
    path.write_text(json.dumps({"kind": "k", "message": "two\n  lines", "exit_code": 65}))
    assert read_failure_record(path) == FailureRecord("k", "two lines", 65)


def test_the_lowest_rank_that_reads_back_speaks_for_the_run(tmp_path):
    write_failure_record(record_path(tmp_path, 10), FailureRecord("a", "rank ten", 65))
    write_failure_record(record_path(tmp_path, 2), FailureRecord("b", "rank two", 65))
    record_path(tmp_path, 1).write_text("{")  # garbled: passed over
    (tmp_path / "failure-rankx.json").write_text(json.dumps(RECORD.__dict__))
    assert first_failure(tmp_path).message == "rank two"


# The launcher's side: a fresh directory per run, read only after a failed run.

WRITE_RECORD = ("import json, os, sys; d = os.environ['KUBETUNE_FAILURE_DIR']; "
                "open(os.path.join(d, 'failure-rank0.json'), 'w').write(json.dumps("
                "{'kind': 'no_step', 'message': 'no step', 'exit_code': 65}))")


def run_child(code: str) -> RecipeRun:
    return run_recipe([sys.executable, "-c", code], dict(os.environ), grace_s=5.0)


def test_a_failed_run_brings_back_its_record_and_the_next_run_starts_with_none():
    first = run_child(WRITE_RECORD + "; print(d); sys.exit(3)")
    assert first.code == 3 and first.failure == FailureRecord("no_step", "no step", 65)
    # The next run's directory is its own: the earlier record is neither there nor read.
    second = run_child("import os, sys; print(os.listdir(os.environ['KUBETUNE_FAILURE_DIR']),"
                       " file=sys.stderr); sys.exit(3)")
    assert second.code == 3 and second.failure is None
    assert list(second.tail) == ["[]"]


def test_a_record_of_a_run_that_succeeded_is_not_read(capsys):
    ran = run_child(WRITE_RECORD + "; print(d)")
    assert ran.code == 0 and ran.failure is None
    directory = capsys.readouterr().out.strip().splitlines()[-1]
    assert not Path(directory).exists()  # gone with its run


# The recipe process's side: the record by type, found anywhere in the chain.

def wrapped(inner: BaseException) -> RuntimeError:
    try:
        raise inner
    except BaseException as exc:
        try:
            raise RuntimeError("a wrapper that says nothing") from exc
        except RuntimeError as outer:
            return outer


def raised_while_handling(inner: BaseException) -> KeyError:
    try:
        try:
            raise inner
        except BaseException:
            raise KeyError("cleanup failed")
    except KeyError as outer:
        return outer


@pytest.mark.parametrize("exc, kind, message", [
    (NonFiniteError("weights went to infinity (any wording)"), "non_finite",
     "weights went to infinity (any wording)"),
    (wrapped(NonFiniteError("reworded: lower optimizer.lr")), "non_finite",
     "reworded: lower optimizer.lr"),
    (raised_while_handling(NoStepError("no step at all")), "no_step", "no step at all"),
    (wrapped(NoFallbackError("does not fit\neven at batch_size=1")), "no_fallback",
     "does not fit even at batch_size=1"),
])
def test_a_refusal_is_recorded_by_type(exc, kind, message):
    assert failure_report.classify(exc) == FailureRecord(kind, message, EXIT_BAD_INPUT)


def test_out_of_memory_is_recorded_by_type():
    import torch

    record = failure_report.classify(wrapped(torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")))
    assert record.kind == "out_of_memory" and record.exit_code == EXIT_BAD_INPUT
    assert record.message.startswith(
        "out of memory (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)"
        ": lower batch_size or tokenizer.max_seq_len")
    assert failure_report.classify(MemoryError()).message.startswith("out of memory (MemoryError)")
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                       "allocate memory: you tried to allocate 1 bytes")
    assert failure_report.classify(cpu).kind == "out_of_memory"


@pytest.mark.parametrize("exc", [RuntimeError("NonFiniteError: only a name in the text"),
                                 wrapped(ValueError("OutOfMemoryError")), KeyError("x")])
def test_anything_else_is_no_record(exc):
    assert failure_report.classify(exc) is None


def test_the_record_is_left_for_this_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBETUNE_FAILURE_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    assert isinstance(failure_report.report(wrapped(NonFiniteError("m"))), NonFiniteError)
    assert read_failure_record(record_path(tmp_path, 3)) == FailureRecord("non_finite", "m", 65)
    assert failure_report.report(KeyError("x")) is None
    assert [p.name for p in tmp_path.iterdir()] == ["failure-rank3.json"]


# How the launcher reports a failed run: the record first, then what it did before.

PLAN = SimpleNamespace(request=SimpleNamespace(recipe="lora_finetune_single_device"))


def failed(code: int, *tail: str, failure: FailureRecord | None = None) -> RecipeRun:
    return RecipeRun(code, 1.0, 0.0, collections.deque(tail), signalled=False, killed=False,
                     failure=failure)


def test_the_record_is_the_report_whatever_stderr_says():
    with pytest.raises(BadInputError) as raised:
        outcome.raise_failed(PLAN, failed(1, "RuntimeError: a wrapper", "exitcode  : -9",
                                          failure=RECORD))
    assert str(raised.value) == RECORD.message and raised.value.exit_code == EXIT_BAD_INPUT


def test_without_a_record_a_named_error_in_stderr_is_no_longer_trusted():
    with pytest.raises(KubetuneError) as raised:
        outcome.raise_failed(PLAN, failed(1, "NonFiniteError: printed, not raised"))
    assert raised.value.exit_code == EXIT_INTERNAL
    assert str(raised.value) == ("recipe lora_finetune_single_device failed: NonFiniteError: "
                                 "printed, not raised")


# End to end: the launcher and the recipe process, with a recipe that fails at setup.

FAILURES = {
    "wrapped and reworded": (
        "from kubetune.trainer.recipe_process.run_sanity import NonFiniteError\n"
        "try:\n"
        "    raise NonFiniteError('the weights went to infinity, said differently: lower "
        "optimizer.lr')\n"
        "except NonFiniteError as exc:\n"
        "    raise RuntimeError('the recipe wrapped it') from exc\n"),
    "out of memory, wrapped": (
        "import torch\n"
        "try:\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 9.00 GiB')\n"
        "except torch.OutOfMemoryError as exc:\n"
        "    raise RuntimeError('a data loader worker failed') from exc\n"),
    "any other error": "raise ValueError('a bug in the recipe')\n",
}


def failing_recipe(tmp_path: Path, body: str) -> Path:
    """torchtune's own single-device LoRA recipe, its setup raising ``body``."""
    from kubetune.trainer.config.recipe_config import resolve_recipe

    source = resolve_recipe("lora_finetune_single_device")[0].read_text()
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    path = tmp_path / "failing_recipe.py"
    path.write_text(f"{source}\n\ndef _failing_setup(self, *args, **kwargs):\n{lines}\n\n"
                    "LoRAFinetuneRecipeSingleDevice.setup = _failing_setup\n")
    return path


@pytest.mark.parametrize("case", FAILURES)
def test_a_recipe_failure_is_reported_by_its_type(tmp_path, tiny_model_dir, tiny_dataset_dir,
                                                  case):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    recipe = failing_recipe(tmp_path, FAILURES[case])
    result = tune_run(pvc, str(recipe), "--config", "llama3_2/1B_lora_single_device",
                      *pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
                      "dataset.source=parquet", f"dataset.data_dir={pvc.dataset / 'data'}",
                      "batch_size=4", "gradient_accumulation_steps=1", "dtype=fp32",
                      env=pvc.env(OMP_NUM_THREADS="1"))
    [line] = error_lines(result)
    assert pvc.termination_log.read_text().strip() == line.removeprefix("error: ")
    assert not pvc.complete()
    if case == "wrapped and reworded":
        assert result.returncode == EXIT_BAD_INPUT, result.stderr[-3000:]
        assert line == ("error: trainer: the weights went to infinity, said differently: "
                        "lower optimizer.lr")
        assert "Traceback" not in result.stderr  # a refusal is its line alone
    elif case == "out of memory, wrapped":
        assert result.returncode == EXIT_BAD_INPUT, result.stderr[-3000:]
        assert line.startswith("error: trainer: out of memory (torch.OutOfMemoryError: CUDA "
                               "out of memory. Tried to allocate 9.00 GiB): lower batch_size")
    else:
        assert result.returncode == EXIT_INTERNAL, result.stderr[-3000:]
        assert line == (f"error: trainer: recipe {recipe} failed: ValueError: a bug in the "
                        "recipe")
