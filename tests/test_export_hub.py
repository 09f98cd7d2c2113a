"""`kubetune export` to hf:// (a local hub server answering huggingface_hub's real calls)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import hub_write_server
from tests.support.cli import REPO, error_lines, kubetune
from tests.support.trained import TrainedRun

pytestmark = pytest.mark.slow

WRITE_TOKEN = "hf_kubetuneWriteToken0123456789"
READ_TOKEN = "hf_kubetuneReadOnlyToken012345678"
# Fine-grained without write rights: whoami cannot tell, the first write is refused.
SCOPED_TOKEN = "hf_kubetuneScopedToken0123456789"


@pytest.fixture(scope="module")
def hub():
    server = hub_write_server.start()
    server.add_token(WRITE_TOKEN, write=True)
    server.add_token(READ_TOKEN, write=False)
    server.add_token(SCOPED_TOKEN, write=False, role="fineGrained")
    yield server
    server.stop()


def hub_env(run: TrainedRun, hub, tmp_path: Path, token: str | None = WRITE_TOKEN,
            **extra: str) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.endpoint, "KUBETUNE_TERMINATION_LOG": str(tmp_path / "term-log"),
           "KUBETUNE_RETRY_MAX_ATTEMPTS": "2", "KUBETUNE_RETRY_BASE_DELAY_S": "0.05",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf-home"), **extra}
    if token:
        # Mounted as a Secret file, the way a pod gets it.
        (tmp_path / "token").write_text(token + "\n")
        env["ACCESS_TOKEN_FILE"] = str(tmp_path / "token")
    return run.env(**env)


def assert_no_token(tmp_path: Path, *results: subprocess.CompletedProcess) -> None:
    for result in results:
        for token in (WRITE_TOKEN, READ_TOKEN, SCOPED_TOKEN):
            assert token not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "token":
            assert WRITE_TOKEN.encode() not in path.read_bytes(), path


def test_export_to_the_hub_is_one_commit_and_a_rerun_is_a_no_op(trained_run, hub, tmp_path):
    env = hub_env(trained_run, hub, tmp_path)
    result = kubetune("export", "--export-uri", "hf://kubetune-test/tiny-lora",
                      "--export-format", "both", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert hub.count("POST", "/api/repos/create") == 1  # created, as it was absent
    assert hub.count("POST", "/commit/") == 1
    files = hub.files("kubetune-test/tiny-lora")
    manifest = json.loads(files["manifest.json"])
    assert set(files) == {f["path"] for f in manifest["files"]} | {"manifest.json"}
    adapter_config = json.loads(files["adapter/adapter_config.json"])
    assert adapter_config["base_model_name_or_path"] == str(trained_run.base_source.resolve())
    assert "merged/model.safetensors.index.json" in files and "README.md" in files
    import hashlib

    for entry in manifest["files"]:
        assert hashlib.sha256(files[entry["path"]]).hexdigest() == entry["sha256"]

    hub.reset_log()
    again = kubetune("export", "--export-uri", "hf://kubetune-test/tiny-lora",
                     "--export-format", "both", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to upload" in again.stderr
    assert hub.count("POST") == 0  # no create, pre-upload or commit
    assert hub.files("kubetune-test/tiny-lora") == files
    assert_no_token(tmp_path, result, again)


def test_a_branch_is_created_and_main_is_left_alone(trained_run, hub, tmp_path):
    env = hub_env(trained_run, hub, tmp_path, KUBETUNE_EXPORT_REVISION="candidate")
    result = kubetune("export", "--export-uri", "hf://kubetune-test/branched", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "adapter_model.safetensors" in hub.files("kubetune-test/branched", "candidate")
    assert hub.files("kubetune-test/branched", "main") == {}


@pytest.mark.parametrize("token, expected", [
    (READ_TOKEN, "read-only"), (SCOPED_TOKEN, "may not write"),
    ("hf_notAKnownToken0123456789", "rejected the token"),
    (None, "needs a token with write access"),
])
def test_a_token_that_cannot_write_is_refused_before_anything_is_uploaded(
        trained_run, hub, tmp_path, token, expected):
    env = hub_env(trained_run, hub, tmp_path, token=token)
    result = kubetune("export", "--export-uri", "hf://kubetune-test/refused", env=env)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert expected in line
    assert (tmp_path / "term-log").read_text().strip() == line.removeprefix("error: ")
    assert "kubetune-test/refused" not in hub.state.repos
    assert_no_token(tmp_path, result)


def test_killed_mid_commit_leaves_the_repo_untouched_and_a_rerun_completes(trained_run, hub,
                                                                           tmp_path):
    env = hub_env(trained_run, hub, tmp_path)
    hub.state.commit_received.clear()
    hub.state.hold_commits.set()
    process = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "export", "--export-uri",
                                "hf://kubetune-test/killed"], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert hub.state.commit_received.wait(180), "the exporter never sent its commit"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        # The commit's sender is gone before the hub accepted it: the hub drops it.
        hub.state.abandon_held = True
        hub.state.hold_commits.clear()
        time.sleep(0.2)
    finally:
        hub.state.hold_commits.clear()
    assert hub.files("kubetune-test/killed") == {}
    hub.state.abandon_held = False
    result = kubetune("export", "--export-uri", "hf://kubetune-test/killed", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "manifest.json" in hub.files("kubetune-test/killed")


def test_a_hub_answering_503_is_retried(trained_run, hub, tmp_path):
    env = hub_env(trained_run, hub, tmp_path)
    hub.state.fail_commits = 1
    hub.reset_log()
    result = kubetune("export", "--export-uri", "hf://kubetune-test/flaky", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert hub.count("POST", "/commit/") == 2
    assert "manifest.json" in hub.files("kubetune-test/flaky")
