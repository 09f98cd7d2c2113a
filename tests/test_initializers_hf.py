"""hf:// initializers against a real local hub (tests/support/hub_server.py), in fresh processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.hub_server import HubServer, local_tree

TOKEN = "hf_kubetuneTestToken0123456789"
MANIFEST = ".kubetune-manifest.json"


@pytest.fixture(scope="module")
def hub(tiny_model_dir, tiny_dataset_dir):
    server = HubServer(token=TOKEN).start()
    model = local_tree(tiny_model_dir)
    # The SDK always ignores these for models; a repo that also has them shows we skip them.
    model["pytorch_model.bin"] = b"\x80\x02 not really a pickle"
    model["flax_model.msgpack"] = b"msgpack"
    server.v1 = server.add_repo("org/tiny", model, tags=("v1",))
    changed = dict(model)
    changed["config.json"] = model["config.json"].replace(b"{", b'{"kubetune_v2": true,', 1)
    server.v2 = server.add_repo("org/tiny", changed)
    dataset = local_tree(tiny_dataset_dir)
    dataset["README.md"] = b"# tiny addition\n"
    server.add_repo("org/ds", dataset, repo_type="dataset")
    server.add_repo("org/private", model, private=True)
    server.add_repo("org/gated", model, gated=True)
    server.add_repo("org/binonly", {"config.json": model["config.json"],
                                    "pytorch_model.bin": b"\x80\x02 pickled weights"})
    server.add_repo("org/escape", {"config.json": b"{}", "../escape.safetensors": b"x"})
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_counters(hub):
    hub.clear()


def run_init(hub: HubServer, kind: str, uri: str, out: Path, token: str | None = TOKEN,
             **extra: str):
    env = clean_env(HF_ENDPOINT=hub.url, STORAGE_URI=uri, OUTPUT_PATH=str(out),
                    KUBETUNE_TERMINATION_LOG=str(out.parent / "termination-log"),
                    KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="4",
                    KUBETUNE_HTTP_TIMEOUT_S="5")
    env.update(extra)
    if token:
        env["ACCESS_TOKEN"] = token
    return kubetune(f"init-{kind}", env=env, timeout=120)


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_model_download_is_complete_verified_and_prefers_safetensors(hub, tmp_path, tiny_model_dir):
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out)
    assert result.returncode == 0, result.stderr
    expected = {p for p in files_under(tiny_model_dir)}
    assert files_under(out) == expected | {MANIFEST, "original_repo_id.json"}
    assert (out / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["resolved_revision"] == hub.v2
    assert {f["path"] for f in manifest["files"]} == expected | {"original_repo_id.json"}
    assert "skipping 2 .bin, .msgpack file(s)" in result.stderr
    assert json.loads((out / "original_repo_id.json").read_text()) == {"repo_id": "org/tiny"}
    # Nothing of ours is left beside the output: no staging, no lock file.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_tree_listing_follows_pages(hub, tmp_path, tiny_model_dir):
    hub.page_size = 2
    try:
        result = run_init(hub, "model", "hf://org/tiny", tmp_path / "model")
    finally:
        hub.page_size = 1000
    assert result.returncode == 0, result.stderr
    assert hub.count(contains="/tree/") >= 4
    assert (tmp_path / "model" / "original" / "tokenizer.model").is_file()


def test_rerun_of_a_completed_request_makes_no_request(hub, tmp_path):
    out = tmp_path / "model"
    assert run_init(hub, "model", "hf://org/tiny", out).returncode == 0
    assert hub.count() > 0
    hub.clear()
    again = run_init(hub, "model", "hf://org/tiny", out)
    assert again.returncode == 0, again.stderr
    assert "nothing to download" in again.stderr
    assert hub.count() == 0


def test_dataset_sub_path_folder_and_file(hub, tmp_path):
    folder = tmp_path / "folder"
    result = run_init(hub, "dataset", "hf://org/ds/data", folder)
    assert result.returncode == 0, result.stderr
    # Repo-relative paths: the SDK points the trainer at /workspace/dataset/data.
    assert files_under(folder) == {"data/train.parquet", MANIFEST, ".kubetune-dataset.json"}
    descriptor = json.loads((folder / ".kubetune-dataset.json").read_text())
    assert descriptor["format"] == "parquet" and descriptor["rows"] > 0
    assert descriptor["files"] == ["data/train.parquet"]
    assert hub.count(contains="README.md") == 0

    single = tmp_path / "single"
    result = run_init(hub, "dataset", "hf://org/ds/data/train.parquet", single)
    assert result.returncode == 0, result.stderr
    assert "data/train.parquet" in files_under(single)
    assert hub.count(contains="/tree/") == 1  # only the folder request listed a tree

    missing = run_init(hub, "dataset", "hf://org/ds/nope", tmp_path / "missing")
    assert missing.returncode == 65
    assert error_lines(missing) == ["error: dataset-initializer: 'nope' not found in dataset "
                                    "repo org/ds at main"]


def test_allow_and_ignore_patterns(hub, tmp_path):
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out,
                      ALLOW_PATTERNS="*.json,*.safetensors,original/*",
                      IGNORE_PATTERNS="*.msgpack,*.h5,*.bin,*.pt,*.pth,original/*")
    assert result.returncode == 0, result.stderr
    names = files_under(out)
    assert "model.safetensors" in names and "config.json" in names
    assert not any(n.startswith("original/") or n.endswith((".bin", ".msgpack")) for n in names)
    assert hub.count(contains="original/") == 0


def test_a_changed_filter_moves_only_the_difference(hub, tmp_path):
    out = tmp_path / "model"
    # The SDK's patterns, then none: the same files either way (safetensors win).
    first = run_init(hub, "model", "hf://org/tiny", out,
                     IGNORE_PATTERNS="*.msgpack,*.h5,*.bin,*.pt,*.pth")
    assert first.returncode == 0, first.stderr
    fetched = hub.count(contains="/resolve/")
    assert fetched >= 5
    before = files_under(out)
    hub.clear()
    again = run_init(hub, "model", "hf://org/tiny", out)
    assert again.returncode == 0, again.stderr
    assert hub.count(contains="/resolve/") == 0  # every file kept, checked by its checksum
    assert files_under(out) == before
    assert json.loads((out / MANIFEST).read_text())["ignore_patterns"] == []

    data = tmp_path / "dataset"
    narrow = run_init(hub, "dataset", "hf://org/ds", data,
                      ALLOW_PATTERNS="data/*")
    assert narrow.returncode == 0, narrow.stderr
    hub.clear()
    wide = run_init(hub, "dataset", "hf://org/ds", data)
    assert wide.returncode == 0, wide.stderr
    fetched = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert len(fetched) == 1 and fetched[0].endswith("/README.md"), fetched
    assert (data / "README.md").read_bytes() == b"# tiny addition\n"


def test_revision_pinning_by_commit_and_tag(hub, tmp_path):
    by_commit = tmp_path / "commit"
    assert run_init(hub, "model", "hf://org/tiny", by_commit, REVISION=hub.v1).returncode == 0
    assert "kubetune_v2" not in (by_commit / "config.json").read_text()
    assert json.loads((by_commit / MANIFEST).read_text())["resolved_revision"] == hub.v1

    by_tag = tmp_path / "tag"
    assert run_init(hub, "model", "hf://org/tiny", by_tag, REVISION="v1").returncode == 0
    manifest = json.loads((by_tag / MANIFEST).read_text())
    assert manifest["requested_revision"] == "v1" and manifest["resolved_revision"] == hub.v1
    # Every file came from the resolved commit, never from the moving branch.
    assert hub.count(contains="/resolve/v1/") == 0

    head = tmp_path / "head"
    assert run_init(hub, "model", "hf://org/tiny", head).returncode == 0
    assert "kubetune_v2" in (head / "config.json").read_text()

    bad = run_init(hub, "model", "hf://org/tiny", tmp_path / "bad", REVISION="nope")
    assert bad.returncode == 65
    assert error_lines(bad) == ["error: model-initializer: revision 'nope' not found in model "
                                "repo org/tiny (check REVISION)"]


@pytest.mark.parametrize("fault, options", [
    ("reset", {}),
    ("truncate", {}),
    ("status", {"status": 500}),
    ("status", {"status": 503}),
    ("corrupt", {}),
])
def test_transient_fault_is_retried_and_the_result_is_intact(hub, tmp_path, tiny_model_dir,
                                                             fault, options):
    hub.fault(fault, "*/resolve/*/model.safetensors", times=1, method="GET", **options)
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out)
    assert result.returncode == 0, result.stderr
    assert "download model.safetensors:" in result.stderr and "retry 1/3" in result.stderr
    assert (out / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    if fault == "reset":
        # The retry resumed after the bytes that had arrived instead of starting over.
        ranges = [r.range for r in hub.requests if r.path.endswith("model.safetensors")]
        assert ranges[0] is None and ranges[1] and ranges[1].startswith("bytes=")


def test_a_stalled_response_times_out_and_is_retried(hub, tmp_path, tiny_model_dir):
    hub.fault("stall", "*/resolve/*/tokenizer.json", method="GET", stall_s=6)
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out, KUBETUNE_HTTP_TIMEOUT_S="1.5")
    assert result.returncode == 0, result.stderr
    assert "download tokenizer.json: ReadTimeout" in result.stderr
    assert (out / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_a_stalled_api_call_times_out_and_is_retried(hub, tmp_path):
    hub.fault("stall_api", "/api/datasets/org/ds/paths-info/*", stall_s=6)
    result = run_init(hub, "dataset", "hf://org/ds/data", tmp_path / "dataset",
                      KUBETUNE_HTTP_TIMEOUT_S="1.5")
    assert result.returncode == 0, result.stderr
    assert "look up the path in org/ds: ReadTimeout" in result.stderr


def test_listing_faults_and_429_honour_retry_after(hub, tmp_path):
    hub.fault("status", "/api/models/org/tiny*", times=1, status=429,
              headers={"Retry-After": "1"})
    hub.fault("status", "/api/models/org/tiny/tree/*", times=1, status=502)
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out)
    assert result.returncode == 0, result.stderr
    assert "HTTP 429 from the hub; retry 1/3 in 1.0s" in result.stderr
    assert "HTTP 502 from the hub; retry 1/3" in result.stderr


def test_persistent_failure_exhausts_retries_with_exit_75_and_no_output(hub, tmp_path):
    hub.fault("corrupt", "*/resolve/*/model.safetensors", times=100, method="GET")
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/tiny", out)
    assert result.returncode == 75
    lines = error_lines(result)
    assert len(lines) == 1 and "model.safetensors: sha256 differs" in lines[0]
    assert "still failing after 4 attempts" in lines[0]
    assert (tmp_path / "termination-log").read_text().strip() == lines[0].removeprefix("error: ")
    assert not out.exists()


@pytest.mark.parametrize("uri, token, expected", [
    ("hf://org/nothere", TOKEN, "model repo org/nothere not found, or the token cannot see it"),
    ("hf://org/private", None, "model repo org/private not found, or the token cannot see it "
                               "(no token was given: set ACCESS_TOKEN or HF_TOKEN for a private repo)"),
    ("hf://org/private", "hf_wrongTokenWrongToken99", "rejected the token (invalid or expired)"),
    ("hf://org/gated", None, "gated repo org/gated: accept its licence at"),
])
def test_client_errors_are_one_line_not_retried(hub, tmp_path, uri, token, expected):
    result = run_init(hub, "model", uri, tmp_path / "model", token=token)
    assert result.returncode == 65, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert hub.count() == 1  # never retried
    if token:
        assert token not in result.stderr + result.stdout


@pytest.mark.parametrize("status, code, expected", [
    (401, None, "rejected the token (invalid or expired) for org/tiny"),
    (403, None, "model repo org/tiny: access denied"),
    (403, "GatedRepo", "gated repo org/tiny: accept its licence"),
    (404, None, "model repo org/tiny not found, or the token cannot see it"),
])
def test_download_client_errors_are_one_line_not_retried(hub, tmp_path, status, code, expected):
    headers = {"X-Error-Code": code} if code else {}
    hub.fault("status", "*/resolve/*/config.json", times=5, status=status, headers=headers)
    result = run_init(hub, "model", "hf://org/tiny", tmp_path / "model")
    assert result.returncode == 65, result.stderr
    assert any(expected in line for line in error_lines(result)), result.stderr
    assert sum(r.path.endswith("/config.json") for r in hub.requests) == 1
    assert not (tmp_path / "model").exists()


def test_path_traversal_names_are_refused(hub, tmp_path):
    out = tmp_path / "inner" / "model"
    result = run_init(hub, "model", "hf://org/escape", out)
    assert result.returncode == 65
    assert "refusing remote file name '../escape.safetensors'" in error_lines(result)[0]
    assert not (tmp_path / "inner" / "escape.safetensors").exists()
    assert not (tmp_path / "escape.safetensors").exists()
    assert not out.exists()


def test_pickle_only_model_is_fetched_unloaded_or_refused_by_patterns(hub, tmp_path):
    out = tmp_path / "model"
    result = run_init(hub, "model", "hf://org/binonly", out)
    assert result.returncode == 0, result.stderr
    assert "no safetensors weights: fetching 1 pickle-based file(s) (.bin)" in result.stderr
    assert (out / "pytorch_model.bin").is_file()

    sdk = run_init(hub, "model", "hf://org/binonly", tmp_path / "sdk",
                   IGNORE_PATTERNS="*.msgpack,*.h5,*.bin,*.pt,*.pth")
    assert sdk.returncode == 65
    assert "has no model weights" in error_lines(sdk)[0]
    assert "IGNORE_PATTERNS=*.msgpack,*.h5,*.bin,*.pt,*.pth" in error_lines(sdk)[0]


def test_token_never_printed_or_written(hub, tmp_path):
    out = tmp_path / "model"
    hub.fault("status", "*/resolve/*/config.json", times=1, status=500)
    ok = run_init(hub, "model", "hf://org/private", out, KUBETUNE_PROGRESS_INTERVAL_S="0.01")
    assert ok.returncode == 0, ok.stderr
    assert all(r.authorization == f"Bearer {TOKEN}" for r in hub.requests)  # it was used
    denied = run_init(hub, "model", "hf://org/nothere", tmp_path / "other")
    seen = ok.stdout + ok.stderr + denied.stdout + denied.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            seen += path.read_bytes().decode("utf-8", "replace")
    assert TOKEN not in seen
    assert "retry 1/3" in ok.stderr  # the failure path was exercised too


@pytest.mark.parametrize("how", ["HF_TOKEN", "ACCESS_TOKEN_FILE"])
def test_token_alternatives(hub, tmp_path, how):
    secret_file = tmp_path / "secret" / "token"
    secret_file.parent.mkdir()
    secret_file.write_text(TOKEN + "\n")
    extra = {"HF_TOKEN": TOKEN} if how == "HF_TOKEN" else {"ACCESS_TOKEN_FILE": str(secret_file)}
    result = run_init(hub, "model", "hf://org/private", tmp_path / "model", token=None, **extra)
    assert result.returncode == 0, result.stderr
    assert {r.authorization for r in hub.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in result.stderr + result.stdout


def test_progress_lines_are_plain_lines(hub, tmp_path):
    hub.fault("slow", "*/resolve/*/model.safetensors", method="GET", bytes_per_s=400_000)
    result = run_init(hub, "model", "hf://org/tiny", tmp_path / "model",
                      KUBETUNE_PROGRESS_INTERVAL_S="0.2")
    assert result.returncode == 0, result.stderr
    progress = [l for l in result.stderr.splitlines() if " progress: " in l]
    assert progress, result.stderr
    assert "\r" not in result.stderr + result.stdout
    line = progress[0].split(" progress: ", 1)[1]
    # "3/7 files, 0.2/0.5 MB, 0.9 MB/s, ETA 1s"
    files, mb, rate = line.split(", ")[:3]
    assert files.endswith("/7 files") and mb.endswith(" MB") and rate.endswith(" MB/s")
    assert any(", ETA " in line for line in progress)


def test_kill_9_mid_download_leaves_no_output_and_a_rerun_completes(hub, tmp_path, tiny_model_dir):
    hub.fault("slow", "*/resolve/*/model.safetensors", method="GET", bytes_per_s=100_000)
    out = tmp_path / "model"
    env = clean_env(HF_ENDPOINT=hub.url, STORAGE_URI="hf://org/tiny", OUTPUT_PATH=str(out),
                    ACCESS_TOKEN=TOKEN)
    process = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "init-model"], env=env,
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part = tmp_path / ".kubetune-staging-model" / "model.safetensors.part"
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size > 50_000):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not out.exists()  # where the trainer looks: nothing

    result = run_init(hub, "model", "hf://org/tiny", out)
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    resumed = [r.range for r in hub.requests if r.path.endswith("model.safetensors")][-1]
    assert resumed and resumed.startswith("bytes=") and resumed != "bytes=0-"
    assert not (tmp_path / ".kubetune-staging-model").exists()


def test_a_second_initializer_waits_for_the_first_and_downloads_nothing(hub, tmp_path):
    # A restarted pod may start while the old one still runs: they must not share staging.
    hub.fault("slow", "*/resolve/*/model.safetensors", method="GET", bytes_per_s=400_000)
    out = tmp_path / "model"
    env = clean_env(HF_ENDPOINT=hub.url, STORAGE_URI="hf://org/tiny", OUTPUT_PATH=str(out),
                    ACCESS_TOKEN=TOKEN)
    first = subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints", "init-model"], env=env,
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    part = tmp_path / ".kubetune-staging-model" / "model.safetensors.part"
    deadline = time.monotonic() + 60
    while not part.is_file():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = run_init(hub, "model", "hf://org/tiny", out)
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert second.returncode == 0, second.stderr
    assert "another initializer is filling" in second.stderr
    assert "nothing to download" in second.stderr
    assert sum(r.path.endswith("/model.safetensors") for r in hub.requests) == 1


def test_disk_full_is_a_one_line_bad_input(hub, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a real full disk)")
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(volume)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        # Too big for the volume: refused before the first byte.
        big = run_init(hub, "model", "hf://org/tiny", volume / "model")
        assert big.returncode == 65
        assert "no space left on the volume" in error_lines(big)[0]
        assert "needs" in error_lines(big)[0]
        assert not (volume / "model").exists()
        # Small in bytes but not in blocks: the volume fills up mid-download.
        files = {f"data/part-{i:02d}.jsonl": b'{"a": 1}\n' for i in range(40)}
        hub.add_repo("org/many", files, repo_type="dataset")
        mid = run_init(hub, "dataset", "hf://org/many", volume / "dataset")
        assert mid.returncode == 65, mid.stderr
        assert "no space left on the volume" in error_lines(mid)[0]
        assert not (volume / "dataset").exists()
    finally:
        subprocess.run(["umount", str(volume)], check=True)


def _shard(payload: bytes, name: str = "w") -> bytes:
    import struct

    header = json.dumps({name: {"dtype": "U8", "shape": [len(payload)],
                               "data_offsets": [0, len(payload)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + payload


def test_an_unusable_tree_is_refused_and_never_swapped_in(hub, tmp_path):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    hub.add_repo("org/sharded", {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        # Each tensor in the shard the index names (a tensor in two shards is refused).
        "model-00001-of-00002.safetensors": _shard(b"x" * 64, "a"),
        "model-00002-of-00002.safetensors": _shard(b"y" * 64, "b"),
    })
    hub.add_repo("org/broken", {"config.json": b'{"model_type": ',
                                "model.safetensors": _shard(b"z" * 64)})
    hub.add_repo("org/empty-data", {"data/train.csv": b"input,output\n"},
                 repo_type="dataset")

    whole = run_init(hub, "model", "hf://org/sharded", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    assert "verified 2 tensors in safetensors headers" in whole.stderr

    cases = [
        ("model", "hf://org/sharded", {"IGNORE_PATTERNS": "*-00002-of-*"},
         "shards named in model.safetensors.index.json are missing: "
         "model-00002-of-00002.safetensors"),
        ("model", "hf://org/broken", {}, "config.json does not parse"),
        ("dataset", "hf://org/empty-data", {}, "the dataset's csv files hold no rows"),
    ]
    for kind, uri, extra, expected in cases:
        out = tmp_path / uri.rsplit("/", 1)[-1] / kind
        result = run_init(hub, kind, uri, out, **extra)
        assert result.returncode == 65, result.stderr
        assert expected in error_lines(result)[0]
        assert not out.exists()
