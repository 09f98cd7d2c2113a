"""KUBETUNE_LOG_FORMAT=json under `kubetune local` (issue 43 §5): every line it prints is
one JSON object: its steps' lines (a step's own JSON, with the step named; a line a
library printed, wrapped), its `==>` lines, the summary and the error line."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import clean_env, kubetune


def _records(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)  # a line that is not JSON fails here, named
            assert isinstance(record, dict) and {"time", "level", "component",
                                                 "message"} <= set(record), line
            records.append(record)
    return records


def test_a_refused_run_says_so_in_json(tmp_path):
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "epcohs=1", env=clean_env(
        KUBETUNE_LOG_FORMAT="json", KUBETUNE_TERMINATION_LOG=str(tmp_path / "term")))
    assert result.returncode == 65, result.stderr[-2000:]
    records = _records(result.stdout) + _records(result.stderr)
    errors = [r for r in records if r["level"] == "ERROR"]
    assert len(errors) == 1 and errors[0]["message"] == (
        "local: unknown key epcohs (did you mean epochs?)"), records


@pytest.mark.slow
def test_every_line_of_a_run_is_a_json_object(tmp_path):
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "epochs=1",
                      "max_steps_per_epoch=2", env=clean_env(
                          KUBETUNE_LOG_FORMAT="json",
                          KUBETUNE_TERMINATION_LOG=str(tmp_path / "term")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    records = _records(result.stdout) + _records(result.stderr)
    finished = {r["step"]: r for r in records if r["component"] == "local" and "exit_code" in r}
    assert set(finished) == {"dataset-initializer", "model-initializer", "trainer",
                             "exporter"}, records
    assert finished["trainer"]["exit_code"] == 0
    assert finished["trainer"]["message"].startswith("trainer: ok in ")
    steps = [r for r in records if r["message"].startswith("train: step")]
    assert [r["step"] for r in steps] == [1, 2]  # the trainer's own field kept
    assert all(r.get("component") == "trainer" for r in steps)
    # torchtune's own prints, wrapped and named by the step that printed them.
    assert any(r.get("source") == "recipe" or r.get("source") == "output" for r in records)
    [summary] = [r for r in records if r["message"] == "summary"]
    assert summary["summary"]["steps"] == "2" and "checkpoint" in summary["summary"]
