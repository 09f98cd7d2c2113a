"""The retry budget (kubetune/retry.py) as a user meets it, through real local servers.

A transfer that is moving bytes is not failing: one that drops after running longer than
the whole budget is retried (and resumed). A server's Retry-After is waited out as asked,
up to the budget. One retry layer per call: N attempts are N requests on the wire.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.fault_proxy import FaultProxy
from tests.support.hub_server import HubServer, local_tree

TOKEN = "hf_retryBudgetToken0123456789"


@pytest.fixture(scope="module")
def hub(tiny_model_dir):
    server = HubServer(token=TOKEN).start()
    server.add_repo("org/tiny", local_tree(tiny_model_dir))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def store(s3, tiny_model_dir):
    s3.upload_tree(tiny_model_dir, "budget", "tiny")
    proxy = FaultProxy(s3.endpoint)
    yield proxy
    proxy.stop()


@pytest.fixture(autouse=True)
def fresh(hub, store):
    hub.clear()
    store.clear()


def init_from_hub(hub: HubServer, out: Path, **extra: str):
    env = clean_env(HF_ENDPOINT=hub.url, STORAGE_URI="hf://org/tiny", OUTPUT_PATH=str(out),
                    ACCESS_TOKEN=TOKEN, KUBETUNE_TERMINATION_LOG=str(out.parent / "term"),
                    KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="3",
                    KUBETUNE_HTTP_TIMEOUT_S="10", **extra)
    return kubetune("init-model", env=env, timeout=120)


def init_from_s3(s3, store: FaultProxy, out: Path, **extra: str):
    env = clean_env(**{**s3.env(), "ENDPOINT": store.url}, STORAGE_URI="s3://budget/tiny",
                    OUTPUT_PATH=str(out), KUBETUNE_TERMINATION_LOG=str(out.parent / "term"),
                    KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="3",
                    KUBETUNE_HTTP_TIMEOUT_S="10", **extra)
    return kubetune("init-model", env=env, timeout=120)


def test_a_transfer_longer_than_the_budget_that_drops_once_is_resumed(hub, tmp_path,
                                                                      tiny_model_dir):
    weights = (tiny_model_dir / "model.safetensors").read_bytes()
    # Half the file at a pace that takes about 2.5 s, then the connection drops: the
    # attempt outlives the 1 s budget, but it was moving bytes the whole time.
    hub.fault("slow_reset", "*/resolve/*/model.safetensors", method="GET",
              bytes_per_s=len(weights) // 5)
    out = tmp_path / "model"
    result = init_from_hub(hub, out, KUBETUNE_RETRY_TOTAL_S="1")
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").read_bytes() == weights
    ranges = [r.range for r in hub.requests
              if r.method == "GET" and r.path.endswith("/model.safetensors")]
    # One drop, one resumed request for the rest: not a start over, not a give-up.
    assert len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes=")
    assert int(ranges[1][len("bytes="):].rstrip("-")) > 0


def test_failures_without_progress_still_spend_the_budget(hub, tmp_path):
    hub.fault("status", "*/resolve/*/model.safetensors", times=50, method="GET", status=503)
    out = tmp_path / "model"
    result = init_from_hub(hub, out)
    assert result.returncode == 75, result.stderr
    assert "still failing after 3 attempts" in error_lines(result)[0]
    assert hub.count("GET", "/model.safetensors") == 3
    assert not out.exists()


def test_retry_after_is_honoured_beyond_the_backoff_cap(s3, store, tmp_path, tiny_model_dir):
    # Backoff alone is capped at 0.1 s here; the store asks for 2 s, and gets them.
    store.fault("status", "/budget/tiny/config.json", method="GET", status=503,
                code="SlowDown", headers={"Retry-After": "2"})
    out = tmp_path / "model"
    result = init_from_s3(s3, store, out, KUBETUNE_RETRY_MAX_DELAY_S="0.1")
    assert result.returncode == 0, result.stderr
    assert "download config.json: S3 SlowDown; retry 1/2 in 2.0s" in result.stderr
    assert (out / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()


def test_retry_after_past_the_budget_gives_up_at_once_and_says_so(s3, store, tmp_path):
    store.fault("status", "/budget/tiny/config.json", times=5, method="GET", status=503,
                code="SlowDown", headers={"Retry-After": "120"})
    out = tmp_path / "model"
    result = init_from_s3(s3, store, out, KUBETUNE_RETRY_TOTAL_S="30")
    assert result.returncode == 75, result.stderr
    line = error_lines(result)[0]
    assert "the server asked to wait 120s, past the 30s budget (KUBETUNE_RETRY_TOTAL_S)" in line
    assert [r.method for r in store.requests if r.path == "/budget/tiny/config.json"] == ["GET"]


def test_the_exporter_makes_one_request_per_attempt_and_honours_retry_after(
        trained_run, s3, store, tmp_path):
    """botocore's own retries are off: 3 attempts of ours are 3 PUTs, not 6."""
    s3.client().create_bucket(Bucket="budget-export")
    store.fault("status", "/budget-export/run/*", times=100, method="PUT", status=503,
                code="SlowDown", headers={"Retry-After": "1"})
    env = trained_run.env(**{**s3.env(), "ENDPOINT": store.url},
                          EXPORT_URI="s3://budget-export/run",
                          KUBETUNE_EXPORT_DIR=str(tmp_path / "export-work"),
                          KUBETUNE_TERMINATION_LOG=str(tmp_path / "term"),
                          KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="3",
                          KUBETUNE_EXPORT_VERIFY_LOGITS="false")
    result = kubetune("export", env=env, timeout=300)
    assert result.returncode == 75, result.stdout + result.stderr
    puts = [r.path for r in store.requests if r.method == "PUT"]
    assert len(puts) == 3 and len(set(puts)) == 1, puts
    # Backoff alone would wait at most 0.05 s, 0.1 s.
    assert "S3 answered SlowDown; retry 1/2 in 1.0s" in result.stderr
    assert "S3 answered SlowDown; retry 2/2 in 1.0s" in result.stderr


def test_assuming_a_role_makes_one_request_per_attempt(s3, store, tmp_path):
    """botocore's STS client retries nothing of its own: 3 attempts are 3 AssumeRole calls."""
    store.fault("status", "/", times=100, method="POST", status=503, code="ServiceUnavailable")
    result = init_from_s3(s3, store, tmp_path / "model",
                          ROLE_ARN="arn:aws:iam::123456789012:role/kubetune-reader",
                          AWS_ENDPOINT_URL_STS=store.url)
    assert result.returncode == 75, result.stderr
    assert [r.method for r in store.requests if r.path == "/"] == ["POST"] * 3
