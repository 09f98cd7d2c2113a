"""Where the held-out numbers go (issue 42 §3, §4's export): metrics.jsonl lines of their own,
the progress line (log lines, the JSON log and the terminal bar), the TrainJob status,
summary.json, the run report and its curves, the model card, the export manifest and
`kubetune export --checkpoint best|last`.

The numbers are written as the validation loop writes them: through our metric logger's
``log_dict({"val_loss", "val_tokens"}, step=N)`` and the validation record's own module.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kubetune.workspace import validation_record
from kubetune.workspace.validation_record import ValidationRecord
from tests.support import status_server
from tests.support.cli import error_lines, kubetune

VAL_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ validation: step (\d+) \| "
                      r"val_loss (\d+\.\d{4}) \| base (\d+\.\d{4}) \| best (\d+\.\d{4}) @ step "
                      r"(\d+)$")
# A run of 12 steps, two epochs (saved at steps 6 and 12), evaluated every 4 steps and at
# each epoch's end: the held-out loss falls, then rises (over-fitting) after step 6.
EVALUATIONS = [(0, 0, 2.5), (4, 0, 1.9), (6, 0, 1.7), (8, 1, 1.8), (12, 1, 2.0)]


def _record(**changes) -> ValidationRecord:
    record = ValidationRecord(
        source="split", split="test", train_split="train", fraction=None, rows=32,
        tokens=1234, every_n_steps=4,
        evaluations=[{"step": s, "epoch": e, "val_loss": v, "val_tokens": 1234}
                     for s, e, v in EVALUATIONS],
        checkpoints={"epoch_0": {"step": 6, "val_loss": 1.7},
                     "epoch_1": {"step": 12, "val_loss": 2.0}})
    for key, value in changes.items():
        setattr(record, key, value)
    return record


def _log_run(output_dir: Path, also: dict | None = None) -> None:
    """Train steps and evaluations through our metric logger, in the order a run logs
    them (its progress lines go to stdout)."""
    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger

    logger = JsonLinesMetricLogger(log_dir=str(output_dir), also=also)
    logger.set_plan(12, 2)
    evaluations = {s: (e, v) for s, e, v in EVALUATIONS}
    logger.set_epoch(0)
    logger.log_dict({"val_loss": 2.5, "val_tokens": 1234}, step=0)
    for step in range(1, 13):
        logger.set_epoch((step - 1) // 6)
        logger.note_step_tokens(100)
        logger.log_dict({"loss": 3.0 - 0.1 * step, "lr": 1e-4, "tokens_per_second_per_gpu": 500.0},
                        step=step)
        if step in evaluations:
            logger.log_dict({"val_loss": evaluations[step][1], "val_tokens": 1234}, step=step)
    logger.close()


def test_the_record_reads_back_with_base_best_last_and_the_best_checkpoint(tmp_path):
    assert validation_record.read(tmp_path) is None  # no held-out set: no record
    # A resumed run measured step 8 again: the later measurement is the one.
    record = _record(evaluations=_record().evaluations
                     + [{"step": 8, "epoch": 1, "val_loss": 1.85, "val_tokens": 1234}])
    path = validation_record.write(tmp_path, record)
    assert path.name == "kubetune-validation.json"
    back = validation_record.read(tmp_path)
    assert back == record
    assert back.base["val_loss"] == 2.5 and back.base["step"] == 0
    assert back.best["step"] == 6 and back.last["step"] == 12
    assert [e["val_loss"] for e in back.by_step()] == [2.5, 1.9, 1.7, 1.85, 2.0]
    assert back.best_checkpoint == "epoch_0"
    assert back.checkpoint_val_loss("epoch_1") == 2.0
    # A checkpoint saved before any evaluation has no loss: never the best.
    validation_record.write(tmp_path, _record(checkpoints={"epoch_0": {"step": 6,
                                                                       "val_loss": None}}))
    assert validation_record.read(tmp_path).best_checkpoint is None
    (tmp_path / "kubetune-validation.json").write_text("{cut sho")
    assert validation_record.read(tmp_path) is None


def test_an_evaluation_is_a_metrics_line_of_its_own_and_a_progress_line(tmp_path, capsys,
                                                                       monkeypatch):
    from kubetune.trainer.metric_logging.metric_logger import read_metrics
    from kubetune.trainer.metric_logging.run_report import loss_steps

    monkeypatch.delenv("KUBETUNE_PROGRESS_TTY", raising=False)
    _log_run(tmp_path)
    records = read_metrics(tmp_path)
    val = [r for r in records if "val_loss" in r]
    assert [(r["step"], r["val_loss"]) for r in val] == [(s, v) for s, _, v in EVALUATIONS]
    # Exactly these fields: no training field a reader could mistake for a step's.
    assert all(set(r) == {"step", "epoch", "val_loss", "val_tokens", "time_s"} for r in val)
    assert [r["epoch"] for r in val] == [e for _, e, _ in EVALUATIONS]
    assert all(r["val_tokens"] == 1234 for r in val)
    # The steps' readers see the twelve steps and nothing else.
    assert [r["step"] for r in loss_steps(tmp_path)] == list(range(1, 13))
    lines = [m.groups() for m in map(VAL_LINE.match, capsys.readouterr().out.splitlines()) if m]
    assert lines == [("0", "2.5000", "2.5000", "2.5000", "0"),
                     ("4", "1.9000", "2.5000", "1.9000", "4"),
                     ("6", "1.7000", "2.5000", "1.7000", "6"),
                     ("8", "1.8000", "2.5000", "1.7000", "6"),
                     ("12", "2.0000", "2.5000", "1.7000", "6")]


def test_a_resumed_run_still_reads_its_evaluations_against_the_base(tmp_path, capsys,
                                                                    monkeypatch):
    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger

    monkeypatch.delenv("KUBETUNE_PROGRESS_TTY", raising=False)
    first = JsonLinesMetricLogger(log_dir=str(tmp_path))
    first.log_dict({"val_loss": 2.5, "val_tokens": 10}, step=0)
    first.log_dict({"val_loss": 1.5, "val_tokens": 10}, step=4)
    first.close()
    again = JsonLinesMetricLogger(log_dir=str(tmp_path))  # the resumed process
    again.log_dict({"val_loss": 1.75, "val_tokens": 10}, step=8)
    again.close()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("validation: step 8 | val_loss 1.7500 | base 2.5000 | "
                         "best 1.5000 @ step 4"), last


def test_the_json_log_carries_the_numbers(capsys):
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    progress = TrainProgress({"KUBETUNE_LOG_FORMAT": "json"})
    progress.on_validation({"step": 0, "val_loss": 2.0, "val_tokens": 50})
    progress.on_validation({"step": 3, "val_loss": 1.25, "val_tokens": 50})
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["message"] == "validation: step 3 | val_loss 1.2500 | base 2.0000 | best " \
                              "1.2500 @ step 3"
    assert (line["val_loss"], line["base_val_loss"], line["best_step"], line["val_tokens"]) \
        == (1.25, 2.0, 3, 50)


def test_in_a_terminal_the_validation_line_goes_above_the_bar(tmp_path):
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    master, slave = os.openpty()
    try:
        progress = TrainProgress({"KUBETUNE_PROGRESS_TTY": os.ttyname(slave)})
        progress.set_plan(4, 1)
        progress.on_validation({"step": 0, "val_loss": 2.0, "val_tokens": 50})
        progress.on_step({"step": 1, "epoch": 0, "loss": 1.9})
        progress.on_step({"step": 2, "epoch": 0, "loss": 1.8})
        progress.on_validation({"step": 2, "val_loss": 1.5, "val_tokens": 50})
        progress.on_step({"step": 3, "epoch": 0, "loss": 1.7})
        progress.close()
        screen = b""
        while True:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                break
            screen += os.read(master, 65536)
    finally:
        os.close(master)
        os.close(slave)
    text = screen.decode(errors="replace")
    assert "validation: step 2 | val_loss 1.5000 | base 2.0000 | best 1.5000 @ step 2" in text
    assert "3/4" in text and "loss 1.7000" in text  # the bar went on below it


def test_the_trainjob_status_carries_val_loss_beside_loss(tmp_path, monkeypatch):
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    server = status_server.start(tmp_path / "status")
    try:
        progress = TrainProgress({**server.env(), "KUBETUNE_LOG_LEVEL": "warning"})
        progress.reporter.min_interval_s = 0  # every update goes: this test reads each one
        progress.set_plan(4, 1)
        progress.on_validation({"step": 0, "val_loss": 2.0, "val_tokens": 50})
        _wait(lambda: len(server.requests) >= 1)
        progress.on_step({"step": 1, "epoch": 0, "loss": 1.9})
        _wait(lambda: len(server.requests) >= 2)
        progress.on_step({"step": 2, "epoch": 0, "loss": 1.8})
        _wait(lambda: len(server.requests) >= 3)
        progress.on_validation({"step": 2, "val_loss": 1.5, "val_tokens": 50})
        _wait(lambda: len(server.requests) >= 4)
        progress.close()
    finally:
        server.stop()
    sent = [{m["name"]: m["value"] for m in r.body["trainerStatus"].get("metrics", [])}
            for r in server.requests]
    assert sent[0]["val_loss"] == "2" and sent[0]["step"] == "0"
    # A step keeps the last evaluation's number beside its own loss.
    assert sent[2]["loss"] == "1.8" and sent[2]["val_loss"] == "2"
    assert (sent[3]["loss"], sent[3]["val_loss"], sent[3]["best_val_loss"],
            sent[3]["base_val_loss"]) == ("1.8", "1.5", "1.5", "2")


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert predicate()


def _write_run(output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    _log_run(output_dir)
    validation_record.write(output_dir, _record())
    OmegaConf.save(OmegaConf.create({"epochs": 2, "batch_size": 4,
                                     "kubetune": {"data": {"split": "train", "rows": 128}}}),
                   output_dir / "kubetune-config.yaml")


def test_summary_report_and_curves_read_the_base_best_and_last(tmp_path, tiny_model_dir):
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model
    from kubetune.trainer.metric_logging import curves, run_report
    from kubetune.trainer.metric_logging.summary import summarize
    from kubetune.trainer.metric_logging.validation_numbers import loss_change

    _write_run(tmp_path)
    dims = read_checkpoint_model(tiny_model_dir).architecture.dims
    summary = summarize(tmp_path, 10.0, "completed", dims, "cpu", 1, "epoch_1", "lora",
                        OmegaConf.load(tmp_path / "kubetune-config.yaml"))
    assert summary["steps"] == 12 and summary["last_loss"] == pytest.approx(1.8)
    assert summary["train_data"] == {"split": "train", "rows": 128}
    v = summary["validation"]
    assert (v["source"], v["split"], v["train_split"], v["fraction"], v["rows"], v["tokens"]) \
        == ("split", "test", "train", None, 32, 1234)
    assert (v["base_val_loss"], v["best_val_loss"], v["best_step"], v["last_val_loss"],
            v["last_step"], v["evaluations"]) == (2.5, 1.7, 6, 2.0, 12, 5)
    assert v["best_checkpoint"] == "epoch_0" and v["early_stop"] is None
    json.dumps(summary)  # summary.json takes it as it is
    assert loss_change(v) == "2.5000 -> 2.0000 (best 1.7000 @ step 6)"

    run_report.write(tmp_path, summary, state="completed")
    page = (tmp_path / "kubetune-report.md").read_text()
    assert "- trained on: split `train`, 128 rows" in page
    assert "- held out: split `test` (32 rows, 1234 tokens)" in page
    assert "- validation loss: 2.5000 -> 2.0000 (best 1.7000 @ step 6)" in page
    assert "| base | 0 | 2.5000 |\n| best | 6 | 1.7000 |\n| last | 12 | 2.0000 |" in page
    assert "`epoch_0` (1.7000); `kubetune export --checkpoint best` exports it" in page

    fig = curves.figure(run_report.loss_steps(tmp_path), run_report.eval_records(tmp_path))
    loss_axis = fig.get_axes()[0]
    lines = {line.get_label(): line for line in loss_axis.get_lines()}
    # Train and validation on the one axis; the base model's loss marked at step 0.
    assert list(lines["validation"].get_xdata()) == [0, 4, 6, 8, 12]
    assert list(lines["validation"].get_ydata()) == [2.5, 1.9, 1.7, 1.8, 2.0]
    base = lines["base model (step 0): 2.5000"]
    assert list(base.get_xdata()) == [0] and list(base.get_ydata()) == [2.5]
    assert "train" in lines and (tmp_path / "kubetune-curves.png").is_file()


def test_an_early_stop_and_a_fraction_are_said_in_the_report(tmp_path):
    from kubetune.trainer.metric_logging import run_report

    _write_run(tmp_path)
    validation_record.write(tmp_path, _record(
        source="fraction", split=None, fraction=0.1,
        early_stop={"patience": 2, "step": 12, "best_step": 6, "best_val_loss": 1.7}))
    page = run_report.render(tmp_path, run_report.loss_steps(tmp_path), None, "completed")
    assert "- held out: a 0.1 fraction of split `train`, by content (32 rows" in page
    assert "Stopped early at step 12: no improvement in 2 evaluations (best 1.7000 at step 6)" \
        in page


def test_a_run_without_a_held_out_set_reports_as_before(tmp_path, tiny_model_dir):
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model
    from kubetune.trainer.metric_logging import run_report
    from kubetune.trainer.metric_logging.summary import summarize

    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "epoch": 0, "loss": 2.0 / s}) for s in (1, 2)) + "\n")
    dims = read_checkpoint_model(tiny_model_dir).architecture.dims
    summary = summarize(tmp_path, 1.0, "completed", dims, "cpu", 1, "epoch_0", "lora", None)
    assert summary["validation"] is None and summary["train_data"] is None
    page = run_report.render(tmp_path, run_report.loss_steps(tmp_path), summary, "completed")
    assert "## Validation" not in page and "held out" not in page


# --- `kubetune export --checkpoint best|last` on a real run's output ----------------------


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def two_checkpoints(trained_run, tmp_path_factory) -> Path:
    """The trained run's output with a second saved checkpoint, ``epoch_1``, whose adapter
    moved on from ``epoch_0`` (as a later epoch's does) and whose held-out loss is worse:
    the run ended on epoch_1; the best checkpoint is epoch_0."""
    from safetensors.torch import load_file, save_file

    from kubetune.trainer.metric_logging.validation_numbers import validation_summary

    output = Path(shutil.copytree(trained_run.output_dir,
                                  tmp_path_factory.mktemp("two") / "output", symlinks=True))
    marker_path = output / "kubetune-complete.json"
    marker = json.loads(marker_path.read_text())
    assert marker["checkpoint"] == "epoch_0"
    shutil.copytree(output / "epoch_0", output / "epoch_1")
    adapter = output / "epoch_1" / "adapter_model.safetensors"
    tensors = load_file(adapter)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, adapter)
    marker_path.write_text(json.dumps({**marker, "checkpoint": "epoch_1"}))
    validation_record.write(output, _record())
    summary = json.loads((output / "summary.json").read_text())
    summary["validation"] = validation_summary(output)
    (output / "summary.json").write_text(json.dumps(summary))
    return output


def _export(trained_run, output: Path, dest: Path, *args: str, **env: str):
    return kubetune("export", "--export-uri", str(dest), *args,
                    env=trained_run.env(KUBETUNE_OUTPUT_DIR=str(output), **env))


@pytest.mark.slow
def test_export_best_takes_the_checkpoint_with_the_lowest_validation_loss(
        trained_run, two_checkpoints, tmp_path):
    dest = tmp_path / "export"
    result = _export(trained_run, two_checkpoints, dest, KUBETUNE_EXPORT_CHECKPOINT="best")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "exporting epoch_0" in line]
    assert len(said) == 1 and "INFO" in said[0], result.stderr[-3000:]
    assert "the lowest validation loss (1.7000 at step 6) of 2 saved checkpoints (the last, " \
           "epoch_1: 2.0000)" in said[0]
    manifest = json.loads((dest / "manifest.json").read_text())
    assert (manifest["checkpoint"], manifest["checkpoint_by"], manifest["checkpoint_val_loss"]) \
        == ("epoch_0", "best", 1.7)
    files = {f["path"]: f["sha256"] for f in manifest["files"]}
    # The weights are the best checkpoint's, checked against its merged model (logits).
    assert files["adapter_model.safetensors"] == \
        _sha256(two_checkpoints / "epoch_0" / "adapter_model.safetensors")
    assert manifest["verification"]["logits"]["max_abs_diff"] is not None
    card = (dest / "README.md").read_text()
    assert "- exported checkpoint: `epoch_0` (the lowest validation loss at step 6, validation " \
           "loss 1.7000)" in card
    assert "- validation loss (held out: split `test`, 32 rows): base model 2.5000, best " \
           "1.7000 at step 6, last 2.0000 at step 12" in card


@pytest.mark.slow
def test_export_last_is_the_default_and_the_option_beats_the_variable(
        trained_run, two_checkpoints, tmp_path):
    dest = tmp_path / "export"
    result = _export(trained_run, two_checkpoints, dest, "--checkpoint", "last",
                     "--no-verify-logits", KUBETUNE_EXPORT_CHECKPOINT="best")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((dest / "manifest.json").read_text())
    assert (manifest["checkpoint"], manifest["checkpoint_by"], manifest["checkpoint_val_loss"]) \
        == ("epoch_1", "last", 2.0)
    files = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert files["adapter_model.safetensors"] == \
        _sha256(two_checkpoints / "epoch_1" / "adapter_model.safetensors") != \
        _sha256(two_checkpoints / "epoch_0" / "adapter_model.safetensors")
    assert "- exported checkpoint: `epoch_1` (the run's last at step 12, validation loss " \
           "2.0000)" in (dest / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("record", ["none", "no checkpoint measured"])
def test_export_best_of_a_run_without_validation_is_exit_65(trained_run, tmp_path, record):
    output = Path(shutil.copytree(trained_run.output_dir, tmp_path / "output", symlinks=True))
    if record != "none":
        validation_record.write(output, _record(checkpoints={}))
    result = _export(trained_run, output, tmp_path / "export", "--checkpoint", "best")
    assert result.returncode == 65, result.stderr[-3000:]
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]
    expected = "has no kubetune-validation.json" if record == "none" else \
        "no saved checkpoint in"
    assert "--checkpoint best" in lines[0] and expected in lines[0], lines
    assert "KUBETUNE_EXPORT_CHECKPOINT=last" in lines[0] and "KUBETUNE_VAL_FRACTION" in lines[0]
    assert not (tmp_path / "export").exists()


def test_kubetune_local_ends_with_the_validation_loss(tmp_path):
    from kubetune.entrypoints.local import summary_lines
    from kubetune.trainer.metric_logging.validation_numbers import validation_summary

    output = tmp_path / "workspace" / "output"
    output.mkdir(parents=True)
    validation_record.write(output, _record())
    summary = {"steps": 12, "first_loss": 2.9, "last_loss": 1.8, "tokens_per_second": 500.0,
               "checkpoint": "epoch_1", "validation": validation_summary(output)}
    (output / "summary.json").write_text(json.dumps(summary))
    lines = summary_lines(tmp_path)
    assert lines[1:3] == ["loss: 2.9000 (first) -> 1.8000 (last)",
                          "val loss: 2.5000 (base) -> 2.0000 (last), best 1.7000 @ step 6"]
    del summary["validation"]
    (output / "summary.json").write_text(json.dumps(summary))
    assert not any(line.startswith("val loss") for line in summary_lines(tmp_path))


def test_the_final_status_carries_the_last_best_and_base_val_loss(tmp_path):
    from kubetune.trainer.metric_logging.train_progress import report_finished
    from kubetune.trainer.metric_logging.validation_numbers import validation_summary

    validation_record.write(tmp_path, _record())
    server = status_server.start(tmp_path / "status")
    try:
        report_finished({"last_loss": 1.8, "last_step": 12, "epochs": 2,
                         "validation": validation_summary(tmp_path)}, server.env())
    finally:
        server.stop()
    final = {m["name"]: m["value"] for m in server.requests[-1].body["trainerStatus"]["metrics"]}
    assert (final["loss"], final["val_loss"], final["best_val_loss"], final["base_val_loss"]) \
        == ("1.8", "2", "1.7", "2.5")


def test_the_choice_of_checkpoint_on_an_output_dir(tmp_path):
    from kubetune.errors import BadInputError
    from kubetune.exporter.checkpoint_choice import choose
    from kubetune.workspace.trainer_output import CompletionMarker

    marker = CompletionMarker(checkpoint="epoch_1", method="lora")
    (tmp_path / "epoch_1").mkdir()
    validation_record.write(tmp_path, _record())
    last = choose(tmp_path, marker)
    assert (last.name, last.by, last.val_loss, last.step) == ("epoch_1", "last", 2.0, 12)
    # The best checkpoint's directory is gone (removed by hand): said, not a traceback.
    with pytest.raises(BadInputError, match=r"epoch_0, is missing: re-run the trainer, or "
                                            r"export the last checkpoint"):
        choose(tmp_path, marker, "best")
    (tmp_path / "epoch_0").mkdir()
    best = choose(tmp_path, marker, "best")
    assert (best.name, best.by, best.val_loss, best.step) == ("epoch_0", "best", 1.7, 6)
    with pytest.raises(BadInputError, match="KUBETUNE_EXPORT_CHECKPOINT 'first' is not one of "
                                            "last, best"):
        choose(tmp_path, marker, "first")
