"""Every bad input a user can give a step ends the same way, whatever the step.

Table-driven: each row is one mistake (a broken model file, a typo in a variable, a
malformed URI, an unknown host, a full volume, a malformed option) run through the real
command, as a pod runs it. For each: the exit code a failure policy acts on, exactly one
`error:` line naming the cause, no traceback, the same line in the termination log, and
nothing a re-run would take as complete (no manifest, no export). No training here: the
exporter rows reuse the session's trained run.
"""

from __future__ import annotations

import json
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.support.cli import clean_env, error_lines, kubetune

BAD_INPUT, USAGE = 65, 2
MANIFEST = ".kubetune-manifest.json"
EXPORT_MANIFEST = "manifest.json"
UNRESOLVABLE = "http://nonexistent.invalid:9000"  # .invalid never resolves (RFC 2606)


@dataclass
class Ctx:
    """What a row may use: a private model copy, the dataset, a trained run, a scratch dir."""
    tmp: Path
    model: Path
    dataset: Path
    trained: object = None

    @property
    def out(self) -> Path:
        return self.tmp / "out" / "target"


@dataclass
class Row:
    id: str
    args: list[str]
    env: Callable[[Ctx], dict[str, str]]
    fragments: tuple[str, ...]
    code: int = BAD_INPUT
    step: str = "model-initializer"
    setup: Callable[[Ctx], None] = lambda ctx: None
    needs_trained: bool = False
    needs_tmpfs: str | None = None  # size of a tmpfs mounted over ctx.out's parent
    extra: dict = field(default_factory=dict)


def _safetensors(header: object, payload: bytes = b"\0" * 8) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + payload


def _write(relative: str, data: bytes | str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.model / relative
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _index(weight_map: object) -> Callable[[Ctx], None]:
    return _write("model.safetensors.index.json",
                  json.dumps({"metadata": {}, "weight_map": weight_map}))


def model_env(**extra: str) -> Callable[[Ctx], dict[str, str]]:
    return lambda ctx: {"STORAGE_URI": str(ctx.model), "OUTPUT_PATH": str(ctx.out), **extra}


def uri_env(uri: str, **extra: str) -> Callable[[Ctx], dict[str, str]]:
    return lambda ctx: {"STORAGE_URI": uri, "OUTPUT_PATH": str(ctx.out), **extra}


def export_env(**extra: str) -> Callable[[Ctx], dict[str, str]]:
    def env(ctx: Ctx) -> dict[str, str]:
        values = {"KUBETUNE_WORKSPACE": str(ctx.trained.workspace), **extra}
        values.setdefault("EXPORT_URI", str(ctx.out))
        return values
    return env


def _big_dataset(ctx: Ctx) -> None:
    # Fills a 64 KiB tmpfs to its last page: the data fits (the size check passes),
    # the descriptor takes the last page, and the manifest finds no room.
    ctx.dataset.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"input": "1+1", "output": "2"}) + "\n"
    body = line * ((64 * 1024 - 4096 - 512) // len(line))
    (ctx.dataset / "train.jsonl").write_text(body)


S3_KEYS = {"ACCESS_KEY_ID": "AKIAEXAMPLEKEY", "SECRET_ACCESS_KEY": "example-secret",
           "REGION": "us-east-1"}

ROWS = [
    # -- the model initializer: files that are not what they claim ------------------------
    Row("safetensors-header-is-a-list", ["init-model"], model_env(),
        ("model.safetensors", "corrupt safetensors header", "list"),
        setup=_write("model.safetensors", _safetensors([1, 2]))),
    Row("safetensors-header-lacks-data-offsets", ["init-model"], model_env(),
        ("model.safetensors", "data_offsets"),
        setup=_write("model.safetensors", _safetensors({"w": {"dtype": "F32", "shape": [2]}}))),
    Row("safetensors-data-offsets-not-numbers", ["init-model"], model_env(),
        ("model.safetensors", "data_offsets"),
        setup=_write("model.safetensors", _safetensors(
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}))),
    Row("safetensors-truncated", ["init-model"], model_env(), ("model.safetensors", "truncated"),
        setup=lambda ctx: (ctx.model / "model.safetensors").write_bytes(
            (ctx.model / "model.safetensors").read_bytes()[:-100])),
    Row("config-json-is-a-list", ["init-model"], model_env(), ("config.json", "list"),
        setup=_write("config.json", "[]")),
    Row("config-json-does-not-parse", ["init-model"], model_env(), ("config.json", "parse"),
        setup=_write("config.json", "{not json")),
    Row("index-weight-map-is-a-list", ["init-model"], model_env(),
        ("model.safetensors.index.json", "weight_map"), setup=_index(["model.safetensors"])),
    Row("index-names-an-absolute-shard", ["init-model"], model_env(),
        ("/etc/hostname", "outside the model directory"),
        setup=_index({"tok_embeddings.weight": "/etc/hostname"})),
    Row("index-names-a-shard-above-the-tree", ["init-model"], model_env(),
        ("../model.safetensors", "outside the model directory"),
        setup=_index({"tok_embeddings.weight": "../model.safetensors"})),
    Row("index-names-a-missing-shard", ["init-model"], model_env(),
        ("model-00002-of-00002.safetensors", "missing"),
        setup=_index({"tok_embeddings.weight": "model-00002-of-00002.safetensors"})),
    Row("no-weights-at-all", ["init-model"], model_env(), ("no model weights",),
        setup=lambda ctx: (ctx.model / "model.safetensors").unlink()),
    # -- numbers in environment variables: one parser, naming the variable -----------------
    Row("retry-attempts-not-a-number", ["init-model"],
        model_env(KUBETUNE_RETRY_MAX_ATTEMPTS="abc"), ("KUBETUNE_RETRY_MAX_ATTEMPTS='abc'",)),
    Row("retry-total-not-a-number", ["init-model"],
        model_env(KUBETUNE_RETRY_TOTAL_S="10m"), ("KUBETUNE_RETRY_TOTAL_S='10m'",)),
    Row("http-timeout-not-a-number-hf", ["init-model"],
        uri_env("hf://org/name", KUBETUNE_HTTP_TIMEOUT_S="abc"), ("KUBETUNE_HTTP_TIMEOUT_S='abc'",)),
    Row("http-timeout-not-a-number-s3", ["init-dataset"],
        uri_env("s3://bucket/data", KUBETUNE_HTTP_TIMEOUT_S="abc", **S3_KEYS),
        ("KUBETUNE_HTTP_TIMEOUT_S='abc'",), step="dataset-initializer"),
    Row("download-workers-not-a-number", ["init-model"],
        model_env(KUBETUNE_DOWNLOAD_WORKERS="eight"), ("KUBETUNE_DOWNLOAD_WORKERS='eight'",)),
    Row("s3-part-size-not-a-number", ["init-model"],
        uri_env("s3://bucket/model", KUBETUNE_S3_PART_SIZE_MB="16MB", **S3_KEYS),
        ("KUBETUNE_S3_PART_SIZE_MB='16MB'",)),
    Row("progress-interval-not-a-number", ["init-model"],
        model_env(KUBETUNE_PROGRESS_INTERVAL_S="often"), ("KUBETUNE_PROGRESS_INTERVAL_S",)),
    # Sizes that make no sense: a count of 0 or less is not quietly taken as 1, an interval
    # of 0 does not spin.
    Row("download-workers-zero", ["init-model"], model_env(KUBETUNE_DOWNLOAD_WORKERS="0"),
        ("KUBETUNE_DOWNLOAD_WORKERS='0' must be at least 1",)),
    Row("download-workers-negative", ["init-dataset"],
        lambda ctx: {"STORAGE_URI": str(ctx.model), "OUTPUT_PATH": str(ctx.out),
                     "KUBETUNE_DOWNLOAD_WORKERS": "-4"},
        ("KUBETUNE_DOWNLOAD_WORKERS='-4' must be at least 1",), step="dataset-initializer"),
    Row("s3-part-workers-zero", ["init-model"],
        uri_env("s3://bucket/model", KUBETUNE_S3_PART_WORKERS="0", **S3_KEYS),
        ("KUBETUNE_S3_PART_WORKERS='0' must be at least 1",)),
    Row("s3-part-size-negative", ["init-model"],
        uri_env("s3://bucket/model", KUBETUNE_S3_PART_SIZE_MB="-16", **S3_KEYS),
        ("KUBETUNE_S3_PART_SIZE_MB='-16' must be at least 1",)),
    Row("progress-interval-zero", ["init-model"], model_env(KUBETUNE_PROGRESS_INTERVAL_S="0"),
        ("KUBETUNE_PROGRESS_INTERVAL_S='0' must be more than 0",)),
    Row("progress-interval-negative", ["init-model"],
        model_env(KUBETUNE_PROGRESS_INTERVAL_S="-5"),
        ("KUBETUNE_PROGRESS_INTERVAL_S='-5' must be more than 0",)),
    # -- URIs: malformed names, unknown hosts ---------------------------------------------
    Row("storage-uri-relative", ["init-model"], uri_env("relative/path"),
        ("malformed", "file:///abs/path")),
    Row("storage-uri-unsupported-scheme", ["init-model"], uri_env("gs://bucket/model"),
        ("unsupported storage scheme 'gs'",)),
    Row("storage-uri-missing-path", ["init-model"], uri_env("/no/such/model"),
        ("/no/such/model", "does not exist")),
    Row("hf-repo-id-malformed", ["init-model"], uri_env("hf://org/na$me"),
        ("STORAGE_URI", "hf://org/na$me", "no valid hub repo id")),
    Row("hf-repo-id-double-dash", ["init-dataset"], uri_env("hf://org--x/--name"),
        ("no valid hub repo id",), step="dataset-initializer"),
    Row("s3-bucket-malformed", ["init-model"], uri_env("s3://My_Bucket!/model", **S3_KEYS),
        ("STORAGE_URI", "no valid bucket", "My_Bucket!")),
    Row("hf-endpoint-unknown-host", ["init-model"],
        uri_env("hf://org/name", HF_ENDPOINT=UNRESOLVABLE),
        ("host nonexistent.invalid does not exist", "HF_ENDPOINT")),
    Row("s3-endpoint-unknown-host", ["init-dataset"],
        uri_env("s3://bucket/data", ENDPOINT=UNRESOLVABLE, **S3_KEYS),
        ("host nonexistent.invalid does not exist", "ENDPOINT="), step="dataset-initializer"),
    # -- datasets -------------------------------------------------------------------------
    Row("dataset-without-data-files", ["init-dataset"],
        lambda ctx: {"STORAGE_URI": str(ctx.dataset), "OUTPUT_PATH": str(ctx.out)},
        ("no data files",), step="dataset-initializer",
        setup=lambda ctx: (ctx.dataset.mkdir(parents=True),
                           (ctx.dataset / "README.md").write_text("no data here"))),
    Row("volume-full-while-writing-the-manifest", ["init-dataset"],
        lambda ctx: {"STORAGE_URI": str(ctx.dataset), "OUTPUT_PATH": str(ctx.out)},
        ("no space left on the volume of",), step="dataset-initializer", setup=_big_dataset,
        needs_tmpfs="64k"),
    # -- the exporter ---------------------------------------------------------------------
    Row("export-uri-bucket-malformed", ["export"],
        export_env(EXPORT_URI="s3://Bad_Bucket!/x", **S3_KEYS),
        ("EXPORT_URI", "no valid bucket"), step="exporter", needs_trained=True),
    Row("export-uri-repo-id-malformed", ["export"],
        export_env(EXPORT_URI="hf://org/bad repo", HF_TOKEN="hf_example"),
        ("EXPORT_URI", "no valid hub repo id"), step="exporter", needs_trained=True),
    Row("export-uri-unsupported", ["export"], export_env(EXPORT_URI="gs://bucket/x"),
        ("EXPORT_URI", "not supported"), step="exporter", needs_trained=True),
    Row("export-s3-unknown-host", ["export"],
        export_env(EXPORT_URI="s3://bucket/x", ENDPOINT=UNRESOLVABLE, **S3_KEYS),
        ("host nonexistent.invalid does not exist", "ENDPOINT="), step="exporter",
        needs_trained=True),
    Row("export-retry-attempts-not-a-number", ["export"],
        export_env(EXPORT_URI="s3://bucket/x", ENDPOINT=UNRESOLVABLE,
                   KUBETUNE_RETRY_MAX_ATTEMPTS="abc", **S3_KEYS),
        ("KUBETUNE_RETRY_MAX_ATTEMPTS='abc'",), step="exporter", needs_trained=True),
    Row("export-volume-full", ["export"], export_env(), ("no space left on the volume of",
                                                         "EXPORT_URI"),
        step="exporter", needs_trained=True, needs_tmpfs="16k"),
    # -- the output holds what is not ours: refused, kept as it was ------------------------
    Row("output-path-is-a-file", ["init-model"], model_env(),
        ("OUTPUT_PATH", "is a file", "target"),
        setup=lambda ctx: (ctx.out.parent.mkdir(parents=True), ctx.out.write_text("mine"))),
    Row("output-path-holds-a-user-s-files", ["init-dataset"],
        lambda ctx: {"STORAGE_URI": str(ctx.model), "OUTPUT_PATH": str(ctx.out)},
        ("OUTPUT_PATH", "did not write", "notes.txt"), step="dataset-initializer",
        setup=lambda ctx: (ctx.out.mkdir(parents=True),
                           (ctx.out / "notes.txt").write_text("mine"))),
    # -- the CLI: usage errors keep exit 2, are one error line, reach the termination log -
    Row("cli-unknown-option", ["init-model", "--no-such-option"], model_env(),
        ("model-initializer: No such option", "--no-such-option"), code=USAGE),
    Row("cli-bad-choice", ["export", "--export-format", "lora"], lambda ctx: {},
        ("exporter: Invalid value for '--export-format'",), code=USAGE, step="exporter"),
    Row("cli-unknown-command", ["init-modle"], model_env(),
        ("kubetune: No such command 'init-modle'",), code=USAGE),
    Row("cli-local-trainjob-without-runtime", ["local", "--trainjob", "job.yaml"],
        lambda ctx: {"KUBETUNE_LOCAL_DIR": str(ctx.tmp / "local")},
        ("--trainjob and --print-jobset need --runtime",), step="local"),
]


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full volume needs a small tmpfs, and mount failed here (not root, "
                    f"or no CAP_SYS_ADMIN): {mounted.stderr.strip()}")


def _nothing_a_rerun_trusts(ctx: Ctx, row: Row) -> None:
    scratch = ctx.out.parent
    manifests = [p for p in scratch.rglob("*")
                 if p.name.startswith(MANIFEST) or p.name == EXPORT_MANIFEST]
    assert manifests == [], f"{row.id}: a manifest was left for a re-run to trust: {manifests}"
    if row.code != 75:
        # A clean failure takes its staging and lock with it (only a transient one keeps
        # staging, for the restart to resume from).
        left = [p for p in scratch.rglob(".kubetune-staging*")] if scratch.exists() else []
        assert left == [], f"{row.id}: left {left}"
    if row.id.startswith("output-path-"):
        assert {p.name for p in scratch.rglob("*")} <= {"target", "notes.txt"}
        assert ((ctx.out / "notes.txt") if ctx.out.is_dir() else ctx.out).read_text() == "mine"
    if row.step == "exporter":
        # The build tree is removed: nothing of the export is left beside the destination.
        left = list(scratch.iterdir()) if scratch.exists() else []
        assert left == [], f"{row.id}: the export left {left}"


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_bad_input_is_one_line_and_its_exit_code(row: Row, request, tmp_path, model_copy):
    assert len(ROWS) >= 25
    ctx = Ctx(tmp=tmp_path, model=model_copy, dataset=tmp_path / "dataset-src")
    if row.needs_trained:
        ctx.trained = request.getfixturevalue("trained_run")
    mounted = None
    if row.needs_tmpfs:
        mounted = ctx.out.parent
        _mount_tmpfs(mounted, row.needs_tmpfs)
    try:
        row.setup(ctx)
        term = tmp_path / "termination-log"
        env = clean_env(KUBETUNE_TERMINATION_LOG=str(term), KUBETUNE_RETRY_MAX_ATTEMPTS="2",
                        KUBETUNE_RETRY_BASE_DELAY_S="0.01")
        env.update(row.env(ctx))
        result = kubetune(*row.args, env=env, timeout=300)
        report = result.stdout[-2000:] + result.stderr[-3000:]
        assert result.returncode == row.code, report
        assert "Traceback" not in result.stderr, report
        logged = term.read_text().strip()
        assert "\n" not in logged
        for fragment in row.fragments:
            assert fragment in logged, (fragment, logged)
        if row.code == USAGE:
            # The usage line, then one error line as for every failure, which the
            # termination log says too.
            assert "Usage:" in result.stderr, report
            assert error_lines(result) == [f"error: {logged}"], report
            assert result.stderr.splitlines()[-1] == f"error: {logged}", report
        else:
            lines = error_lines(result)
            assert len(lines) == 1, report
            assert lines[0] == f"error: {logged}", (lines, logged)
            assert logged.startswith(f"{row.step}: "), logged
        _nothing_a_rerun_trusts(ctx, row)
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)
