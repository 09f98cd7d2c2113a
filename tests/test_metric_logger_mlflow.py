"""A user's own ``metric_logger`` (torchtune's ``MLFlowLogger``) gets the held-out losses too
(issue 42 §3), checked on a real MLflow tracking server this module starts itself
(``mlflow server``, a sqlite store, a free port on 127.0.0.1) and read back with MLflow's
own client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kubetune.workspace import validation_record
from tests.support.trainer import SHORT, make_pvc, tune_run

MLFLOW_LOGGER = "torchtune.training.metric_logging.MLFlowLogger"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` as a user runs it, in a process group of its own (its workers
    go with it)."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
         f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a cold start on two busy cores
        while not _healthy(uri):
            assert process.poll() is None and time.monotonic() < deadline, \
                (root / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _history(uri: str, experiment: str, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}


def test_our_logger_forwards_each_evaluation_to_the_users_mlflow(mlflow_server, tmp_path):
    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger

    logger = JsonLinesMetricLogger(log_dir=str(tmp_path), also={
        "_component_": MLFLOW_LOGGER, "tracking_uri": mlflow_server,
        "experiment_name": "kubetune-forward", "run_name": "forward"})
    logger.log_dict({"val_loss": 2.5, "val_tokens": 40}, step=0)
    for step in (1, 2, 3, 4):
        logger.log_dict({"loss": 3.0 - 0.25 * step, "lr": 1e-4}, step=step)
    logger.log_dict({"val_loss": 1.5, "val_tokens": 40}, step=4)
    logger.close()
    assert _history(mlflow_server, "kubetune-forward", "val_loss") == {0: 2.5, 4: 1.5}
    assert _history(mlflow_server, "kubetune-forward", "val_tokens") == {0: 40, 4: 40}
    assert _history(mlflow_server, "kubetune-forward", "loss") == \
        {1: 2.75, 2: 2.5, 3: 2.25, 4: 2.0}


def _hub_layout_dataset(tiny_dataset_dir: Path, root: Path) -> Path:
    """The tiny dataset laid out as a hub dataset: a train file and a test file."""
    import pyarrow.parquet as pq

    table = pq.read_table(next(tiny_dataset_dir.rglob("*.parquet")))
    (root / "data").mkdir(parents=True)
    held = min(16, table.num_rows // 4)
    pq.write_table(table.slice(held), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(table.slice(0, held), root / "data" / "test-00000-of-00001.parquet")
    return root


@pytest.mark.slow
def test_a_training_run_logs_val_loss_to_mlflow_from_the_base_to_the_last_step(
        mlflow_server, tmp_path, tiny_model_dir, tiny_dataset_dir):
    dataset = _hub_layout_dataset(tiny_dataset_dir, tmp_path / "hub-dataset")
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, dataset)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      "dataset=torchtune.datasets.instruct_dataset", "epochs=1", "dtype=fp32",
                      *SHORT, f"metric_logger._component_={MLFLOW_LOGGER}",
                      f"metric_logger.tracking_uri={mlflow_server}",
                      "metric_logger.experiment_name=kubetune-train",
                      "metric_logger.run_name=tiny")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The shipped config's DiskLogger log_dir, which MLFlowLogger does not take, is left out.
    assert "metric_logger.log_dir (the config's) left out" in result.stdout + result.stderr
    last_step = max(m["step"] for m in pvc.metrics() if "loss" in m)
    assert set(_history(mlflow_server, "kubetune-train", "loss")) == \
        set(range(1, last_step + 1))
    record = validation_record.read(pvc.output)
    if record is None:
        pytest.skip("needs the validation loop: the recipe wrote no kubetune-validation.json")
    measured = {int(e["step"]): float(e["val_loss"]) for e in record.by_step()}
    assert 0 in measured and last_step in measured, measured
    logged = _history(mlflow_server, "kubetune-train", "val_loss")
    # Every evaluation, at its step: the base model's (0) and the last step's among them.
    assert logged == pytest.approx(measured), (logged, measured)
