"""s3:// initializers against moto_server (S3 semantics), through a fault-injecting proxy."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.fault_proxy import FaultProxy

MANIFEST = ".kubetune-manifest.json"
MB = 1024 * 1024


def safetensors_bytes(payload: bytes, name: str = "w") -> bytes:
    # One tensor, named after its file: files of one model hold no tensor twice.
    header = json.dumps({name: {"dtype": "U8", "shape": [len(payload)],
                               "data_offsets": [0, len(payload)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + payload


@pytest.fixture(scope="module")
def store(s3, tiny_model_dir, tiny_dataset_dir):
    client = s3.upload_tree(tiny_model_dir, "models", "tiny")
    # A sibling whose name starts like the prefix: must not be pulled in.
    client.put_object(Bucket="models", Key="tiny-2/config.json", Body=b"{}")
    config = (tiny_model_dir / "config.json").read_bytes()
    big = {"single": safetensors_bytes(os.urandom(3 * MB + 12345), "single"),
           "multi": safetensors_bytes(os.urandom(6 * MB + 77), "multi")}
    client.put_object(Bucket="models", Key="big/config.json", Body=config)
    client.put_object(Bucket="models", Key="big/single.safetensors", Body=big["single"])
    # Uploaded in parts: its ETag is not an MD5 ("<hash>-2") and must not be checked as one.
    client.upload_fileobj(__import__("io").BytesIO(big["multi"]), "models",
                          "big/multi.safetensors",
                          Config=TransferConfig(multipart_threshold=5 * MB,
                                                multipart_chunksize=5 * MB))
    # Multipart uploads cut in unequal parts (allowed: only the last may be under 5 MiB).
    # "guess" fits the equal-parts guess by its part count and "count" does not.
    for name, sizes in (("guess", (5 * MB + 1, 5 * MB, 1000)), ("count", (5 * MB, 6 * MB))):
        overhead = len(safetensors_bytes(bytes(sum(sizes)), name)) - sum(sizes)  # its header
        body = safetensors_bytes(os.urandom(sum(sizes) - overhead), name)
        assert len(body) == sum(sizes)
        big[name] = body
        key = f"uneven/{name}.safetensors"
        upload = client.create_multipart_upload(Bucket="models", Key=key)["UploadId"]
        parts, start = [], 0
        for number, size in enumerate(sizes, 1):
            etag = client.upload_part(Bucket="models", Key=key, UploadId=upload,
                                      PartNumber=number, Body=body[start:start + size])["ETag"]
            parts.append({"PartNumber": number, "ETag": etag})
            start += size
        client.complete_multipart_upload(Bucket="models", Key=key, UploadId=upload,
                                         MultipartUpload={"Parts": parts})
    client.put_object(Bucket="models", Key="uneven/config.json", Body=config)
    client.put_object(Bucket="models", Key="evil/config.json", Body=config)
    client.put_object(Bucket="models", Key="evil/../../escape.safetensors", Body=b"x")
    client.create_bucket(Bucket="data")
    client.upload_file(str(tiny_dataset_dir / "data" / "train.parquet"), "data",
                       "addition/train.parquet")
    proxy = FaultProxy(s3.endpoint)
    proxy.big = big
    yield proxy
    proxy.stop()


@pytest.fixture(autouse=True)
def fresh_proxy(store):
    store.clear()


def run_init(s3, proxy: FaultProxy, kind: str, uri: str, out: Path, **extra: str):
    env = clean_env(**{**s3.env(), "ENDPOINT": proxy.url}, STORAGE_URI=uri,
                    OUTPUT_PATH=str(out), KUBETUNE_S3_PART_SIZE_MB="1",
                    KUBETUNE_TERMINATION_LOG=str(out.parent / "termination-log"),
                    KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="4",
                    KUBETUNE_HTTP_TIMEOUT_S="10")
    env.update(extra)
    return kubetune(f"init-{kind}", env=env, timeout=120)


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_prefix_download_is_exact_and_a_rerun_makes_no_request(s3, store, tmp_path,
                                                               tiny_model_dir):
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/tiny", out)
    assert result.returncode == 0, result.stderr
    source = {p.relative_to(tiny_model_dir).as_posix() for p in tiny_model_dir.rglob("*")
              if p.is_file()}
    assert files_under(out) == source | {MANIFEST, "original_repo_id.json"}
    assert (out / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()
    store.clear()
    again = run_init(s3, store, "model", "s3://models/tiny", out)
    assert again.returncode == 0 and "nothing to download" in again.stderr
    assert store.requests == []


def test_large_objects_arrive_in_parallel_ranged_parts_intact(s3, store, tmp_path):
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
    ranged = [r for r in store.requests if r.range and r.path.endswith(".safetensors")]
    assert len(ranged) == 4 + 7  # ceil(size / 1 MiB) parts per object


def test_a_prefix_holding_one_large_object_is_split_into_ranged_parts(s3, store, tmp_path):
    s3.client().put_object(Bucket="models", Key="one/model.safetensors", Body=store.big["single"])
    s3.client().put_object(Bucket="models", Key="one/config.json", Body=b"{}")
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/one", out)
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").read_bytes() == store.big["single"]
    gets = [r for r in store.requests if r.method == "GET" and r.path.endswith(".safetensors")]
    # ceil(3 MB / 1 MiB) ranged parts, not one stream (the workers would sit idle).
    assert len(gets) == 4 and all(r.range for r in gets), [r.range for r in gets]


def test_single_object_uri_for_a_dataset(s3, store, tmp_path):
    out = tmp_path / "dataset"
    result = run_init(s3, store, "dataset", "s3://data/addition/train.parquet", out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {"train.parquet", MANIFEST, ".kubetune-dataset.json"}
    descriptor = json.loads((out / ".kubetune-dataset.json").read_text())
    assert descriptor["files"] == ["train.parquet"] and descriptor["rows"] > 0


@pytest.mark.parametrize("kind, options", [
    ("status", {"status": 503, "code": "SlowDown", "ranged_only": True}),
    ("status", {"status": 500, "code": "InternalError"}),
    ("reset", {"ranged_only": True}),
    ("truncate", {"ranged_only": True}),
])
def test_transient_faults_on_parts_are_retried(s3, store, tmp_path, kind, options):
    store.fault(kind, "/models/big/single.safetensors", times=1, method="GET", **options)
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert "download single.safetensors:" in result.stderr and "retry 1/3" in result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]


def test_corrupted_body_fails_the_etag_check_and_is_fetched_again(s3, store, tmp_path,
                                                                   tiny_model_dir):
    store.fault("corrupt", "/models/tiny/config.json", times=1, method="GET")
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/tiny", out)
    assert result.returncode == 0, result.stderr
    assert "config.json: md5 differs from the source's checksum; retry 1/3" in result.stderr
    assert (out / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()


@pytest.mark.parametrize("uri, fault, expected", [
    ("s3://nobucket/x", None, "bucket nobucket does not exist"),
    ("s3://models/tiny", {"status": 403, "code": "AccessDenied"},
     "bucket models: access denied"),
    ("s3://models/tiny", {"status": 403, "code": "InvalidAccessKeyId"},
     "bucket models: the S3 credentials were rejected (InvalidAccessKeyId)"),
    ("s3://models/nothing-here", None, "s3://models/nothing-here holds no files to download"),
])
def test_client_errors_are_one_line_and_not_retried(s3, store, tmp_path, uri, fault, expected):
    if fault:
        store.fault("status", "/models*", times=10, **fault)
    result = run_init(s3, store, "model", uri, tmp_path / "model")
    assert result.returncode == 65, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert len(store.requests) == 1
    assert not (tmp_path / "model").exists()


def test_keys_escaping_the_output_are_refused(s3, store, tmp_path):
    result = run_init(s3, store, "model", "s3://models/evil", tmp_path / "a" / "model")
    assert result.returncode == 65
    assert "refusing remote file name '../../escape.safetensors'" in error_lines(result)[0]
    assert not any(p.name == "escape.safetensors" for p in tmp_path.rglob("*"))


def test_keys_never_printed_or_written_and_file_secrets_work(s3, store, tmp_path):
    key_file, secret_file = tmp_path / "key-id", tmp_path / "secret"
    key_file.write_text(s3.access_key_id + "\n")
    secret_file.write_text(s3.secret_access_key + "\n")
    out = tmp_path / "model"
    store.fault("status", "/models/tiny/config.json", times=1, status=503, code="SlowDown")
    env = {"ACCESS_KEY_ID": "", "SECRET_ACCESS_KEY": "",
           "ACCESS_KEY_ID_FILE": str(key_file), "SECRET_ACCESS_KEY_FILE": str(secret_file)}
    ok = run_init(s3, store, "model", "s3://models/tiny", out, **env)
    assert ok.returncode == 0, ok.stderr
    denied_store = store.fault("status", "/models*", times=10, status=403,
                               code="SignatureDoesNotMatch")
    denied = run_init(s3, store, "model", "s3://models/tiny", tmp_path / "other")
    assert denied.returncode == 65 and denied_store.times < 10
    seen = ok.stdout + ok.stderr + denied.stdout + denied.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file() and path not in (key_file, secret_file):
            seen += path.read_bytes().decode("utf-8", "replace")
    assert s3.secret_access_key not in seen and s3.access_key_id not in seen


def test_role_arn_is_assumed_through_sts(s3, store, tmp_path):
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/tiny", out,
                      ROLE_ARN="arn:aws:iam::123456789012:role/kubetune-reader",
                      AWS_ENDPOINT_URL_STS=store.url)
    assert result.returncode == 0, result.stderr
    assert (out / MANIFEST).is_file()
    assert [r.method for r in store.requests if r.path == "/"] == ["POST"]  # AssumeRole


def test_a_stale_staged_file_without_a_checksum_is_fetched_again(s3, store, tmp_path):
    # A killed run left a whole file whose object was then re-uploaded with the same size:
    # a multipart ETag proves nothing until its part size is fetched, so it is fetched again.
    staged = tmp_path / ".kubetune-staging-model"
    staged.mkdir()
    (staged / "multi.safetensors").write_bytes(b"\0" * len(store.big["multi"]))
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]


def test_a_retried_large_object_fetches_only_the_failed_part_again(s3, store, tmp_path):
    store.fault("reset", "/models/big/single.safetensors", times=1, method="GET",
                ranged_only=True)
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]
    parts = [r for r in store.requests if r.range and r.path.endswith("single.safetensors")]
    assert len(parts) == 4 + 1  # four parts, and the one that was cut off


def test_objects_enough_to_fill_every_worker_come_as_whole_streams(s3, store, tmp_path):
    # Two large objects, two workers: one stream each already; ranges would add nothing.
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out, KUBETUNE_DOWNLOAD_WORKERS="2")
    assert result.returncode == 0, result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
    gets = [r for r in store.requests if r.method == "GET" and r.path.endswith(".safetensors")]
    assert len(gets) == 2 and not any(r.range for r in gets)


def test_only_the_large_objects_left_over_after_filling_the_workers_are_split(
        s3, tmp_path, monkeypatch):
    from kubetune.initializers.request import InitRequest
    from kubetune.initializers.sources.base import RemoteFile
    from kubetune.initializers.sources.s3 import S3Source
    from kubetune.initializers.storage_uri import parse

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    source = S3Source(InitRequest(kind="model", uri=parse("s3://models/big"),
                                  output_path=tmp_path / "model"))
    big = [RemoteFile(path=f"{i}", size=source.part_size + 100 - i, key=f"k{i}")
           for i in range(5)]
    small = RemoteFile(path="config.json", size=10, key="config")
    source.plan([*big, small], workers=2)
    # Two rounds of two whole streams; the fifth would run alone, so its parts share the pool.
    assert [source._splits(f) for f in [*big, small]] == [False] * 4 + [True, False]


def test_a_whole_stream_cut_off_goes_on_from_the_last_byte_written(s3, store, tmp_path):
    store.fault("reset", "/models/big/single.safetensors", times=1, method="GET")
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out, KUBETUNE_DOWNLOAD_WORKERS="2")
    assert result.returncode == 0, result.stderr
    assert "retry 1/3" in result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]
    gets = [r.range for r in store.requests if r.path.endswith("single.safetensors")]
    assert len(gets) == 2 and gets[0] is None
    start = int(gets[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < start < len(store.big["single"])


@pytest.mark.parametrize("name, prefix_ok", [("single", True), ("single", False),
                                             ("multi", True), ("multi", False)])
def test_a_killed_run_s_partial_object_goes_on_from_its_last_byte_when_the_etag_proves_it(
        s3, store, tmp_path, name, prefix_ok):
    # "single" has an MD5 ETag, "multi" a multipart one: each proves the resumed whole.
    staged = tmp_path / ".kubetune-staging-model"
    staged.mkdir()
    have = MB
    prefix = store.big[name][:have]
    (staged / f"{name}.safetensors.part").write_bytes(
        prefix if prefix_ok else bytes(b ^ 0xFF for b in prefix))
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out, KUBETUNE_DOWNLOAD_WORKERS="2")
    assert result.returncode == 0, result.stderr
    assert (out / "single.safetensors").read_bytes() == store.big["single"]
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
    gets = [r.range for r in store.requests
            if r.method == "GET" and r.path.endswith(f"{name}.safetensors")]
    if prefix_ok:
        assert gets == [f"bytes={have}-"]
    else:
        check = "md5" if name == "single" else "multipart etag"
        assert gets == [f"bytes={have}-", None]
        assert f"{name}.safetensors: {check} differs from the source's checksum" in result.stderr


@pytest.mark.parametrize("workers", ["8", "2"])  # ranged parts, then one whole stream
def test_a_multipart_upload_is_checked_against_its_etag(s3, store, tmp_path, workers):
    store.fault("corrupt", "/models/big/multi.safetensors", times=1, method="GET")
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out,
                      KUBETUNE_DOWNLOAD_WORKERS=workers)
    assert result.returncode == 0, result.stderr
    assert ("multi.safetensors: multipart etag differs from the source's checksum; retry 1/3"
            in result.stderr)
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
    # Part 1's HEAD gave the part size; on the mismatch, both parts' HEADs ruled out an
    # unequal cut; the retry needed none.
    heads = [r for r in store.requests if r.method == "HEAD"]
    assert len(heads) == 3 and all(r.path.endswith("multi.safetensors") for r in heads)


def test_multipart_uploads_in_unequal_parts_are_checked_by_their_real_parts(s3, store, tmp_path):
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/uneven", out)
    assert result.returncode == 0, result.stderr
    assert "retry" not in result.stderr and "only its size is checked" not in result.stderr
    for name in ("guess", "count"):
        assert (out / f"{name}.safetensors").read_bytes() == store.big[name]
    heads = sorted(r.path.rsplit("/", 1)[-1] for r in store.requests if r.method == "HEAD")
    # "guess": part 1, then (its ETag differing under the guess) all three; "count": part
    # 1, then both.
    assert heads == ["count.safetensors"] * 3 + ["guess.safetensors"] * 4


def test_kill_9_mid_object_then_a_rerun_fetches_only_the_parts_missing(s3, store, tmp_path):
    store.fault("slow", "/models/big/multi.safetensors", times=100, method="GET",
                ranged_only=True, bytes_per_s=2 * MB)
    out = tmp_path / "model"
    env = clean_env(**{**s3.env(), "ENDPOINT": store.url}, STORAGE_URI="s3://models/big",
                    OUTPUT_PATH=str(out), KUBETUNE_S3_PART_SIZE_MB="1",
                    KUBETUNE_S3_PART_WORKERS="1")
    process = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "init-model"], env=env,
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / ".kubetune-staging-model" / "multi.safetensors.part-state"
    deadline = time.monotonic() + 60
    # The record: a line naming the object's version, then one line per part whole.
    while not (state.is_file() and len(state.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not out.exists()
    recorded = {"bytes={}-{}".format(*line.split())
                for line in state.read_text().splitlines()[1:] if len(line.split()) == 2}
    store.clear()

    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
    assert "multi.safetensors: " in result.stderr and "from an earlier run" in result.stderr
    # (A request the killed process sent as it died may still reach the proxy: counted
    # here too, it is never one of the parts recorded whole.)
    fetched = {r.range for r in store.requests
               if r.method == "GET" and r.range and r.path.endswith("multi.safetensors")}
    assert len(recorded) >= 2 and not fetched & recorded and len(fetched) < 7
    assert not [p for p in out.rglob("*") if p.name.endswith((".part", ".part-state"))]


def test_a_store_that_refuses_part_numbers_still_downloads_checking_sizes(s3, store, tmp_path):
    store.fault("status", "/models/big/multi.safetensors", times=10, method="HEAD",
                status=400, code="InvalidArgument")
    out = tmp_path / "model"
    result = run_init(s3, store, "model", "s3://models/big", out)
    assert result.returncode == 0, result.stderr
    assert ("multi.safetensors: the store does not say how this multipart upload was cut: "
            "only its size is checked") in result.stderr
    assert (out / "multi.safetensors").read_bytes() == store.big["multi"]
