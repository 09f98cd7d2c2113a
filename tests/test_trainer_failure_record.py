"""The recipe process tells its launcher why it failed by the exception's type, in a failure
record (issue 35): a refused run, no fallback left or out of memory is exit 65 with its one
line however the recipe words or wraps it; anything else stays an internal error. The
record is read only from the run that wrote it: a missing, garbled or earlier run's record
is none."""

from __future__ import annotations

import json
import stat

import pytest

from kubetune.atomic_write import umask_mode
from kubetune.errors import EXIT_BAD_INPUT
from kubetune.trainer.failures.failure_record import (FailureRecord, first_failure,
                                                      read_failure_record, record_path,
                                                      write_failure_record)
from kubetune.trainer.recipe_process import failure_report
from kubetune.trainer.recipe_process.fallbacks import NoFallbackError
from kubetune.trainer.recipe_process.run_sanity import NonFiniteError, NoStepError

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
