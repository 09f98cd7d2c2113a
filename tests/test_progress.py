"""Progress the Kubeflow way: the TrainJob status a trainer POSTs (to a real local HTTPS
server with its own CA and a token file), the pod-log lines, the JSON log mode, and the
run report in the output dir."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime

import pytest

from kubetune.remote.trainjob_status import MAX_METRICS, StatusReporter
from tests.support import status_server, warm_start
from tests.support.trainer import SHORT, make_pvc, tune_run

# The warm-up set as the config's own (100 steps): one the user sets is kept however long.
TRAIN_ARGS = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
              "dataset=torchtune.datasets.instruct_dataset", "epochs=1", "dtype=fp32", *SHORT,
              "lr_scheduler.num_warmup_steps=100"]
STEP_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ train: step (\d+)/3 \((\d+)%\) \| epoch 1/1 \| "
    r"loss \d+\.\d{4} \| lr \d\.\d\de[-+]\d\d \| \d+ tok/s \| eta (\d+:\d\d:\d\d|\?)$")
WARNING = "TrainJob status: cannot report progress"


@pytest.fixture
def server(tmp_path):
    started = status_server.start(tmp_path / "status")
    yield started
    started.stop()


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_reporter_speaks_the_sdks_contract_and_rereads_a_rotated_token(server):
    from kubeflow.trainer.backends.kubernetes import utils as sdk

    env = server.env()
    os.environ.update(env)  # the SDK reads os.environ only
    try:
        assert sdk.update_trainjob_status(progress_percent=7, estimated_remaining_seconds=9,
                                          metrics={"loss": 1.5})
    finally:
        for name in env:
            os.environ.pop(name)
    sdk_request = server.requests[0]

    reporter = StatusReporter.from_env(env)
    many = {f"m{i}": i for i in range(300)}
    reporter.update(10, 20.4, {"loss": "2.5", **many})
    assert wait_for(lambda: len(server.requests) == 2)
    # kubelet rotates the projected token: the next request carries the new one.
    server.token_file.write_text("kt-status-token-2\n")
    later = time.time() + 5
    os.utime(server.token_file, (later, later))
    assert reporter.finish(100, 0, {"loss": 1.25})
    first, final = server.requests[1:]

    for ours in (first, final):
        assert ours.path == sdk_request.path == status_server.STATUS_PATH
        assert ours.headers["Content-Type"] == sdk_request.headers["Content-Type"] \
            == "application/json"
        assert set(ours.body) == set(sdk_request.body) == {"trainerStatus"}
        assert set(ours.body["trainerStatus"]) == set(sdk_request.body["trainerStatus"])
        assert datetime.fromisoformat(ours.body["trainerStatus"]["lastUpdatedTime"]).tzinfo
    assert sdk_request.headers["Authorization"] == "Bearer kt-status-token-1"
    assert first.headers["Authorization"] == "Bearer kt-status-token-1"
    assert final.headers["Authorization"] == "Bearer kt-status-token-2"
    status = first.body["trainerStatus"]
    assert status["progressPercentage"] == 10 and status["estimatedRemainingSeconds"] == 20
    assert len(status["metrics"]) == MAX_METRICS
    assert status["metrics"][0] == {"name": "loss", "value": "2.5"}
    assert all(isinstance(m["value"], str) for m in status["metrics"])
    assert final.body["trainerStatus"]["progressPercentage"] == 100


def test_a_server_outside_the_ca_gets_nothing(server, tmp_path):
    other_ca, _, _ = status_server.make_ca_and_cert(tmp_path / "other")
    env = {**server.env(), "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(other_ca)}
    reporter = StatusReporter.from_env(env)
    assert reporter.finish(100, 0, {"loss": 1}) is False
    assert server.requests == []  # the TLS handshake failed: no token left the process


def test_reporter_sends_the_first_update_then_only_the_latest_per_interval(server):
    env = server.env()
    reporter = StatusReporter(env["KUBEFLOW_TRAINER_SERVER_URL"], str(server.ca_file),
                              str(server.token_file), min_interval_s=3600)
    reporter.update(0, None, {"step": 0})
    assert wait_for(lambda: len(server.requests) == 1)
    for step in range(1, 50):
        reporter.update(step, None, {"step": step})  # within the interval: held back
    assert reporter.finish(100, 0, {"step": 50})  # the end goes at once
    sent = [r.body["trainerStatus"]["progressPercentage"] for r in server.requests]
    assert sent == [0, 100]


def _train(tmp_path, tiny_model_dir, tiny_dataset_dir, cold_start=False, **env):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    run_env = warm_start.cold(pvc.env(**env)) if cold_start else pvc.env(**env)
    result = tune_run(pvc, *TRAIN_ARGS[:3], *pvc.runtime_args(), *TRAIN_ARGS[3:],
                      env=run_env)
    return pvc, result


@pytest.fixture(scope="module")
def reported_run(tmp_path_factory, tiny_model_dir, tiny_dataset_dir):
    tmp_path = tmp_path_factory.mktemp("reported")
    server = status_server.start(tmp_path / "status")
    try:
        # Cold: its log is checked for the libraries' import-time noise too.
        pvc, result = _train(tmp_path, tiny_model_dir, tiny_dataset_dir, cold_start=True,
                             **server.env())
    finally:
        server.stop()
    return pvc, result, server.requests


@pytest.mark.slow
def test_trainer_reports_progress_to_the_trainjob_status(reported_run):
    pvc, result, requests = reported_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(requests) >= 2
    progress = []
    for request in requests:
        assert request.path == status_server.STATUS_PATH
        assert request.headers["Authorization"] == "Bearer kt-status-token-1"
        status = request.body["trainerStatus"]
        assert datetime.fromisoformat(status["lastUpdatedTime"])
        metrics = {m["name"]: m["value"] for m in status["metrics"]}
        assert all(isinstance(v, str) for v in metrics.values())
        assert float(metrics["loss"]) > 0
        progress.append(status["progressPercentage"])
    assert progress == sorted(progress) and progress[0] < 100 and progress[-1] == 100
    first = {m["name"]: m["value"] for m in requests[0].body["trainerStatus"]["metrics"]}
    assert first["total_steps"] == "3" and first["step"] == "1" and first["epoch"] == "1"
    assert {"lr", "tokens_per_second"} <= set(first)
    assert requests[-1].body["trainerStatus"]["estimatedRemainingSeconds"] == 0
    assert WARNING not in result.stderr + result.stdout
    token = "kt-status-token-1"
    assert not [p for p in pvc.output.rglob("*") if p.is_file() and token.encode()
                in p.read_bytes()]


@pytest.mark.slow
def test_pod_log_has_one_line_per_step_and_no_config_dump(reported_run):
    _, result, _ = reported_run
    lines = [line for line in result.stdout.splitlines() if " train: " in line]
    assert len(lines) == 3, result.stdout
    matches = [STEP_LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [1, 2, 3]
    assert [int(m.group(2)) for m in matches] == [33, 66, 100]  # the last step reads 100%
    assert matches[0].group(3) == "?" and matches[2].group(3) != "?"
    log = result.stdout + result.stderr
    # A 100-step warm-up the user set, in a run of 3 steps: kept, said once, before step 1.
    warmup = [line for line in log.splitlines() if "warm-up" in line]
    assert len(warmup) == 1 and re.search(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ trainer WARNING the learning-rate warm-up "
        r"\(lr_scheduler.num_warmup_steps=100\) covers all 3 steps of this run \(it peaks at 3% "
        r"of optimizer.lr=", warmup[0]), warmup
    assert warmup[0][:20] <= lines[0][:20]  # UTC timestamps: no later than step 1
    # The closing line in numbers a person reads (summary.json keeps every digit).
    [done] = [line for line in log.splitlines() if " trainer INFO done: " in line]
    assert re.search(r"done: 3 steps in \d+\.\d s, loss \d+\.\d{4} -> \d+\.\d{4}, \d+ tokens/s, "
                     r"checkpoint ", done), done
    assert "with resolved config" not in log and "Skipping import of cpp extensions" not in log
    assert "'set_vital' is deprecated" not in log


@pytest.mark.slow
def test_run_report_has_curves_and_a_page(reported_run):
    from PIL import Image

    pvc, result, _ = reported_run
    image = Image.open(pvc.output / "kubetune-curves.png")
    image.verify()  # CRCs and structure
    image = Image.open(pvc.output / "kubetune-curves.png")
    assert image.format == "PNG" and image.size == (800, 800)
    # The figure the PNG was drawn from, built from the run's own metrics.
    from kubetune.trainer.metric_logging import curves, run_report

    fig = curves.figure(run_report.loss_steps(pvc.output))
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["loss", "learning rate", "tokens/s per device"]
    assert axes[-1].get_xlabel() == "step"
    raw, smooth = axes[0].get_lines()[:2]
    assert list(raw.get_xdata()) == [1, 2, 3] and len(smooth.get_xdata()) == 3
    assert [float(y) for y in raw.get_ydata()] == [r["loss"] for r in
                                                   run_report.loss_steps(pvc.output)]
    assert len(axes[0].get_yticks()) >= 3 and len(axes[-1].get_xticks()) >= 3
    page = (pvc.output / "kubetune-report.md").read_text()
    summary = pvc.summary()
    assert "**completed**" in page and "![loss and learning rate by step](kubetune-curves.png)" \
        in page
    assert f"loss: {summary['first_loss']:.4f} (step 1) -> {summary['last_loss']:.4f} (step 3)" \
        in page
    assert "LoRA rank" in page and "tokens/s" in page


@pytest.mark.slow
def test_in_a_terminal_one_live_bar_redraws_each_step_and_a_failing_server_never_fails_it(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    """stdout and stderr on a pty, as a person's terminal: tqdm's bar (rate, ETA, loss)
    redrawn in place with carriage returns, none of the per-step lines a pod's log gets,
    and the recipe's own lines ("Starting checkpoint save...") each on a line of its own,
    never glued onto the bar's. The TrainJob status server answers 500 to every report
    (the "500" case of test_a_failing_status_server_never_fails_the_run, read off this
    run): the run completes, with one warning line for the run."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from tests.support.cli import REPO

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    server = status_server.start(tmp_path / "status", behaviour="500")
    main, child_end = pty.openpty()
    # A person's terminal has a size (a fresh pty says 0x0).
    fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "kubetune.entrypoints.tune", "run", *TRAIN_ARGS[:3],
             *pvc.runtime_args(), *TRAIN_ARGS[3:], "lr_scheduler.num_warmup_steps=1"],
            env=pvc.env(COLUMNS="160", **server.env()), cwd=REPO, stdout=child_end,
            stderr=child_end)
        os.close(child_end)
        screen = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every writer of the pty is gone
                break
            if not chunk:
                break
            screen += chunk
        os.close(main)
        text = screen.decode("utf-8", "replace")
        assert child.wait(timeout=600) == 0, text[-3000:]
    finally:
        server.stop()
    assert " train: step " not in text
    assert "warm-up" not in text  # one step of warm-up, three of training
    segments = re.split(r"[\r\n]", text)
    assert any(seg.startswith("Starting checkpoint save") for seg in segments), text[-3000:]
    assert not any("train:" in seg and "Starting checkpoint save" in seg
                   for seg in segments), text[-3000:]
    # Each redraw starts with a carriage return; the last shows the whole run.
    frames = [f.strip() for f in text.replace("\n", "\r").split("\r") if "train:" in f]
    assert len(frames) >= 3, text
    last = frames[-1]
    assert re.search(r"train: 100%.*\| 3/3 \[\d\d:\d\d<00:00, +[\d.]+(s/step|step/s), "
                     r"epoch 1/1, loss \d+\.\d{4}, lr \d\.\d\de[-+]\d\d, \d+ tok/s\]", last), last
    assert pvc.summary()["steps"] == 3
    # The failing server: asked, and failed; one line for the run, not one per step.
    assert pvc.complete() and server.requests
    assert text.count(WARNING) == 1, text[-3000:]
    assert "with resolved config" not in text


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["hang", "absent"])
def test_a_failing_status_server_never_fails_the_run(behaviour, tmp_path, tiny_model_dir,
                                                     tiny_dataset_dir):
    """A server that hangs, or none listening. (One that answers 500 is read off the
    terminal's run: test_in_a_terminal_one_live_bar_redraws_each_step_and_a_failing_…)"""
    server = status_server.start(tmp_path / "status", behaviour="ok" if behaviour == "absent"
                                 else behaviour)
    env = server.env()
    if behaviour == "hang":
        env["KUBETUNE_LOG_LEVEL"] = "debug"  # the noise comes back on demand
    if behaviour == "absent":
        server.stop()  # the port is closed: connection refused
        env["KUBETUNE_LOG_FORMAT"] = "json"
    try:
        pvc, result = _train(tmp_path, tiny_model_dir, tiny_dataset_dir, **env)
    finally:
        if behaviour != "absent":
            server.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    assert pvc.complete() and pvc.summary()["steps"] == 3
    log = result.stdout + result.stderr
    # One line for the run, not one per step. A hanging server may not even cost that:
    # the run can end before the first request's timeout, and the final report is quiet.
    assert log.count(WARNING) in ({0, 1} if behaviour == "hang" else {1}), log
    assert ("with resolved config" in log) == (behaviour == "hang")
    if behaviour != "absent":
        assert server.requests  # it was asked, and failed
    else:
        records = [json.loads(line) for line in log.splitlines() if line.strip()]
        steps = [r for r in records if r["message"].startswith("train: step")]
        assert [r["step"] for r in steps] == [1, 2, 3]
        assert all(r["total_steps"] == 3 and r["loss"] > 0 and r["time"] for r in steps)
        assert {r["component"] for r in records} == {"trainer"}


def test_json_log_mode_for_an_initializer(tmp_path, tiny_dataset_dir):
    from tests.support.cli import clean_env, kubetune

    result = kubetune("init-dataset", env=clean_env(
        STORAGE_URI=f"file://{tiny_dataset_dir}", OUTPUT_PATH=str(tmp_path / "dataset"),
        KUBETUNE_LOG_FORMAT="json", KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl")))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert records and all({"time", "level", "component", "message"} <= set(r)
                           for r in records)
    assert {r["component"] for r in records} == {"dataset-initializer"}
    assert all(datetime.fromisoformat(r["time"].replace("Z", "+00:00")).utcoffset() is not None
               for r in records)
    assert any("fetched 1 files" in r["message"] for r in records)


def test_curves_have_a_smoothed_loss_and_eval_loss_when_the_run_has_one(tmp_path):
    from PIL import Image

    from kubetune.trainer.metric_logging import curves

    noisy = [{"step": i, "loss": 3.0 - 0.02 * i + (0.5 if i % 2 else -0.5), "lr": 1e-4,
              "tokens_per_second": 900.0 + i} for i in range(1, 101)]
    evals = [{"step": 50, "val_loss": 2.2}, {"step": 100, "val_loss": 1.4}]
    fig = curves.figure(noisy, evals)
    loss = fig.get_axes()[0]
    raw, smooth, evaluated = loss.get_lines()
    raw_y, smooth_y = list(raw.get_ydata()), list(smooth.get_ydata())
    # The smoothed line follows the trend without the +-0.5 zigzag.
    assert max(abs(a - b) for a, b in zip(smooth_y[10:], smooth_y[11:])) < 0.2
    assert max(abs(a - b) for a, b in zip(raw_y, raw_y[1:])) > 0.9
    assert smooth_y[-1] < smooth_y[10]
    assert list(evaluated.get_xdata()) == [50, 100] and list(evaluated.get_ydata()) == [2.2, 1.4]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == \
        ["train", "train (smoothed)", "validation"]
    path = tmp_path / "curves.png"
    curves.save(path, noisy, evals)
    assert Image.open(path).size == (800, 800)


def test_an_initializer_reports_bytes_and_percent_done(server, tmp_path, tiny_dataset_dir):
    from tests.support.cli import clean_env, kubetune

    result = kubetune("init-dataset", env=clean_env(
        STORAGE_URI=f"file://{tiny_dataset_dir}", OUTPUT_PATH=str(tmp_path / "dataset"),
        KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl"), **server.env()))
    assert result.returncode == 0, result.stderr
    final = server.requests[-1]
    assert final.headers["Authorization"] == "Bearer kt-status-token-1"
    status = final.body["trainerStatus"]
    # The TrainJob's progress is the training's: a download does not set it.
    assert "progressPercentage" not in status and status["lastUpdatedTime"]
    metrics = {m["name"]: m["value"] for m in status["metrics"]}
    size = (tiny_dataset_dir / "data" / "train.parquet").stat().st_size
    assert metrics["phase"] == "dataset-initializer"
    assert metrics["transfer_percent"] == "100.0"
    assert int(metrics["transfer_total_bytes"]) == int(metrics["transfer_bytes"]) >= size


def test_a_terminal_that_cannot_be_opened_gets_the_step_lines(tmp_path, capsys):
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    progress = TrainProgress({"KUBETUNE_PROGRESS_TTY": str(tmp_path / "gone" / "pts-9")})
    progress.set_plan(2, 1)
    for step in (1, 2):
        progress.on_step({"step": step, "epoch": 0, "loss": 2.0 / step, "lr": 1e-4})
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(" train: step " in line for line in lines), lines
    assert "loss 1.0000" in lines[1] and "step 2/2 (100%)" in lines[1]


def test_quiet_prints_no_progress(capsys):
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    progress = TrainProgress({"KUBETUNE_LOG_LEVEL": "warning"})
    progress.on_step({"step": 1, "loss": 2.0})
    assert capsys.readouterr().out == ""
