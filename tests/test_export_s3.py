"""`kubetune export` to s3:// (moto_server behind a recording proxy, real sockets)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support import http_proxy
from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.fault_proxy import FaultProxy
from tests.support.trained import TrainedRun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def proxy(s3):
    server = http_proxy.start(s3.endpoint)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def faults(s3):
    """A fault-injecting proxy in front of moto (S3 and STS), recording who signed what."""
    server = FaultProxy(s3.endpoint)
    yield server
    server.stop()


def s3_env(run: TrainedRun, s3, proxy, tmp_path: Path, **extra: str) -> dict[str, str]:
    return run.env(**{**s3.env(), "ENDPOINT": proxy.endpoint,
                      "KUBETUNE_TERMINATION_LOG": str(tmp_path / "termination-log"),
                      "KUBETUNE_RETRY_MAX_ATTEMPTS": "2", "KUBETUNE_RETRY_BASE_DELAY_S": "0.05",
                      **extra})


def objects(s3, bucket: str) -> dict[str, bytes]:
    client = s3.client()
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            for o in listed}


def assert_no_secret(s3, tmp_path: Path, *results: subprocess.CompletedProcess) -> None:
    for result in results:
        assert s3.secret_access_key not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert s3.secret_access_key.encode() not in path.read_bytes(), path


def test_export_to_s3_is_whole_resumable_and_a_rerun_is_a_no_op(trained_run, s3, proxy,
                                                                 tmp_path):
    bucket = f"exports-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/runs/tiny"
    env = s3_env(trained_run, s3, proxy, tmp_path)

    # Kill the exporter once its first data object is stored: uploads are slowed so the
    # kill lands before the manifest, which is written last.
    proxy.delays["PUT"] = 1.0
    process = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "export", "--export-uri",
                                uri], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not objects(s3, bucket) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, "the exporter ended before its first upload"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    proxy.delays.clear()
    proxy.settle()
    partial = objects(s3, bucket)
    assert partial and "runs/tiny/manifest.json" not in partial  # a reader sees no export

    proxy.reset()
    first = kubetune("export", "--export-uri", uri, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    stored = objects(s3, bucket)
    manifest = json.loads(stored["runs/tiny/manifest.json"])
    listed = {f"runs/tiny/{f['path']}" for f in manifest["files"]}
    assert set(stored) == listed | {"runs/tiny/manifest.json"}
    assert {"runs/tiny/adapter_model.safetensors", "runs/tiny/adapter_config.json",
            "runs/tiny/README.md"} <= listed
    adapter_config = json.loads(stored["runs/tiny/adapter_config.json"])
    assert adapter_config["base_model_name_or_path"] == str(trained_run.base_source.resolve())
    # Objects the killed run stored whole were not uploaded again.
    assert proxy.count("PUT") == len(listed) - len(partial) + 1

    proxy.reset()
    again = kubetune("export", "--export-uri", uri, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to upload" in again.stderr
    assert proxy.count("PUT") == proxy.count("DELETE") == proxy.count("POST") == 0
    assert objects(s3, bucket) == stored
    assert_no_secret(s3, tmp_path, first, again)


def test_missing_bucket_is_one_line_exit_65(trained_run, s3, proxy, tmp_path):
    env = s3_env(trained_run, s3, proxy, tmp_path)
    result = kubetune("export", "--export-uri", "s3://no-such-bucket-kubetune/x", env=env)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "bucket no-such-bucket-kubetune does not exist" in line
    assert (tmp_path / "termination-log").read_text().strip() == line.removeprefix("error: ")
    assert_no_secret(s3, tmp_path, result)


def test_unreachable_endpoint_is_transient_exit_75(trained_run, s3, proxy, tmp_path):
    from tests.support.s3_server import free_port

    env = s3_env(trained_run, s3, proxy, tmp_path, ENDPOINT=f"http://127.0.0.1:{free_port()}")
    # Its own process: a transient failure's exit code as a pod's restart policy reads it.
    result = kubetune("export", "--export-uri", "s3://any-bucket/x", env=env)
    assert result.returncode == 75, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "still failing after 2 attempts" in line


def test_a_different_export_replaces_the_previous_one_whole(trained_run, s3, proxy, tmp_path):
    bucket = f"exports-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    env = s3_env(trained_run, s3, proxy, tmp_path)
    first = kubetune("export", "--export-uri", f"s3://{bucket}/m", "--no-verify-logits",
                     env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    second = kubetune("export", "--export-uri", f"s3://{bucket}/m", "--export-format",
                      "merged", "--no-verify-logits", env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    stored = objects(s3, bucket)
    manifest = json.loads(stored["m/manifest.json"])
    assert manifest["format"] == "merged"
    # The adapter files of the first export are gone: the prefix holds one export only.
    assert set(stored) == {f"m/{f['path']}" for f in manifest["files"]} | {"m/manifest.json"}
    assert "m/adapter_model.safetensors" not in stored



def test_exports_of_one_run_at_once_each_build_their_own_tree(trained_run, s3, proxy, tmp_path):
    # Two destinations at once build apart; a second export to the same destination waits
    # for the first, then finds its manifest there. One shared build tree had each rebuild
    # it under the other: the slower read files the faster had removed (exit 70).
    buckets = [fresh_bucket(s3, "together") for _ in range(2)]
    env = s3_env(trained_run, s3, proxy, tmp_path)
    uris = [f"s3://{buckets[0]}/m", f"s3://{buckets[1]}/m", f"s3://{buckets[0]}/m"]
    processes = [subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "export",
                                   "--export-uri", uri, "--no-verify-logits"], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for uri in uris]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    for process, stderr in zip(processes, errors):
        assert process.returncode == 0, stderr[-3000:]
    assert "nothing to upload" in errors[0] + errors[2]
    for bucket in buckets:
        stored = objects(s3, bucket)
        manifest = json.loads(stored["m/manifest.json"])
        assert set(stored) == {f"m/{f['path']}" for f in manifest["files"]} | {"m/manifest.json"}

@pytest.fixture
def read_only_s3(tmp_path):
    """A moto_server that enforces IAM, with a bucket and a user who may only read it."""
    import boto3

    from tests.support.s3_server import free_port

    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    # The first 4 requests (the setup below) run unauthenticated; every later one is
    # checked against IAM.
    process = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                               env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1",
                 "aws_access_key_id": "admin-key", "aws_secret_access_key": "admin-secret"}
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Resource": "*",
                           "Action": ["s3:Get*", "s3:List*", "s3:HeadBucket"]}]}))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        boto3.client("s3", **admin).create_bucket(Bucket="readonly")
        yield {"ENDPOINT": endpoint, "ACCESS_KEY_ID": key["AccessKeyId"],
               "SECRET_ACCESS_KEY": key["SecretAccessKey"], "REGION": "us-east-1"}
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_credentials_that_cannot_write_are_refused_and_nothing_is_visible(trained_run,
                                                                          read_only_s3, tmp_path):
    import boto3

    env = trained_run.env(**read_only_s3, KUBETUNE_TERMINATION_LOG=str(tmp_path / "log"),
                          KUBETUNE_RETRY_MAX_ATTEMPTS="2")
    result = kubetune("export", "--export-uri", "s3://readonly/run", env=env)
    assert result.returncode == 65, result.stderr[-3000:]
    [line] = error_lines(result)
    assert "may not write" in line and "s3://readonly/run" in line
    assert read_only_s3["SECRET_ACCESS_KEY"] not in result.stdout + result.stderr
    client = boto3.client("s3", endpoint_url=read_only_s3["ENDPOINT"], region_name="us-east-1",
                          aws_access_key_id=read_only_s3["ACCESS_KEY_ID"],
                          aws_secret_access_key=read_only_s3["SECRET_ACCESS_KEY"])
    assert client.list_objects_v2(Bucket="readonly").get("KeyCount", 0) == 0


def fresh_bucket(s3, name: str) -> str:
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    return bucket


@pytest.mark.parametrize("code", ["ThrottlingException", "RequestLimitExceeded"])
def test_a_throttled_upload_is_retried_like_a_download(trained_run, s3, faults, tmp_path,
                                                       code):
    # Answered with 400 as AWS's JSON services answer them: the code alone says "slow down".
    bucket = fresh_bucket(s3, "throttled")
    faults.clear()
    faults.fault("status", f"/{bucket}/run/*", times=1, method="PUT", status=400, code=code)
    env = s3_env(trained_run, s3, faults, tmp_path)
    result = kubetune("export", "--export-uri", f"s3://{bucket}/run", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"S3 answered {code}; retry 1/1" in result.stderr
    puts = [r.path for r in faults.requests if r.method == "PUT"]
    assert len(puts) == len(set(puts)) + 1  # the throttled object, sent again once
    assert "run/manifest.json" in objects(s3, bucket)


ROLE = "arn:aws:iam::123456789012:role/kubetune-exporter"


def test_role_arn_is_assumed_and_its_credentials_sign_the_upload(trained_run, s3, faults,
                                                                 tmp_path):
    bucket = fresh_bucket(s3, "role")
    faults.clear()
    env = s3_env(trained_run, s3, faults, tmp_path, ROLE_ARN=ROLE,
                 AWS_ENDPOINT_URL_STS=faults.url)
    result = kubetune("export", "--export-uri", f"s3://{bucket}/run", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r.method for r in faults.requests if r.path == "/"] == ["POST"]  # AssumeRole
    signers = {r.access_key_id for r in faults.requests if r.method == "PUT"}
    assert len(signers) == 1 and None not in signers and s3.access_key_id not in signers
    assert "run/manifest.json" in objects(s3, bucket)
    assert_no_secret(s3, tmp_path, result)


def test_a_refused_role_is_the_initializers_one_line(trained_run, s3, faults, tmp_path):
    bucket = fresh_bucket(s3, "refused")
    s3.client().put_object(Bucket=bucket, Key="model/config.json", Body=b"{}")
    faults.clear()
    faults.fault("status", "/", times=10, method="POST", status=403, code="AccessDenied")
    sts = {"ROLE_ARN": ROLE, "AWS_ENDPOINT_URL_STS": faults.url}
    export = kubetune("export", "--export-uri", f"s3://{bucket}/run",
                      env=s3_env(trained_run, s3, faults, tmp_path, **sts))
    init = kubetune("init-model", env=clean_env(
        **{**s3.env(), "ENDPOINT": faults.url}, **sts, STORAGE_URI=f"s3://{bucket}/model",
        OUTPUT_PATH=str(tmp_path / "model"),
        KUBETUNE_TERMINATION_LOG=str(tmp_path / "init-termination-log")))
    assert export.returncode == init.returncode == 65, export.stderr[-3000:] + init.stderr
    [exported], [initialized] = error_lines(export), error_lines(init)
    assert f"cannot assume ROLE_ARN {ROLE} (" in exported
    assert exported.split(": ", 2)[2] == initialized.split(": ", 2)[2]
    assert [r.method for r in faults.requests if r.path == "/"] == ["POST", "POST"]
    assert not any(r.method == "PUT" for r in faults.requests)
