"""Issue 22's audit of user mistakes that ended as exit 70 with a traceback, were retried
as transient, or passed silently: one row per kind, each run through the real command as
a pod runs it, ending as the other bad-input tables do (the documented exit code, exactly
one `error:` line naming the culprit, no traceback, the same line in the termination log,
nothing a re-run trusts).

Kinds: model trees the trainer would choke on (no config.json, an unknown dtype, shards
that disagree, config.json sizes that are not the weights'), the same checked by the
trainer when no initializer ran, dataset files that are not UTF-8 or mix formats, bad
endpoint / region / role values, S3 keys given by halves, URIs carrying credentials, and
a refused connection that names the endpoint, and TrainJobs and runtimes that `kubectl
apply` would refuse (a misspelt field, a value of the wrong type: issue 43), and dataset
settings a builder of the user's own does not take (issue 47).
"""

from __future__ import annotations

import errno
import os
import json
import struct
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.support import user_chat_shapes as shapes
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.runtimes import runtime_file
from tests.test_bad_inputs_steps import (S3_KEYS, Ctx, Row, _index, _safetensors, export_env,
                                         model_env, uri_env)
from tests.test_bad_inputs_trainer import Row as TrainerRow
from tests.test_bad_inputs_trainer import _check, _run

TRANSIENT, USAGE = 75, 2
ROLE = "arn:aws:iam::123456789012:role/kubetune-reader"
SLASH_PASSWORD = "Pw1/restOfPw2"  # each piece longer than the redaction floor


def _tensors(ctx: Ctx) -> dict:
    """The tiny model's header: tensor -> {dtype, shape, data_offsets}."""
    raw = (ctx.model / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return {k: v for k, v in json.loads(raw[8:8 + length]).items() if k != "__metadata__"}


def _file(tensors: dict, dtype: str | None = None) -> bytes:
    """A safetensors file holding ``tensors`` (zeros), optionally all in ``dtype``."""
    header, offset = {}, 0
    for name, entry in sorted(tensors.items()):
        count = 1
        for dim in entry["shape"]:
            count *= dim
        size = count * {"F16": 2, "BF16": 2, "F32": 4}[dtype or entry["dtype"]]
        header[name] = {"dtype": dtype or entry["dtype"], "shape": entry["shape"],
                        "data_offsets": [offset, offset + size]}
        offset += size
    return _safetensors(header, b"\0" * offset)


def _shards(second_dtype: str | None = None, index_all_in_first: bool = False,
            duplicate: bool = False) -> Callable[[Ctx], None]:
    """Split the tiny model into two shards and an index, spoiled one way."""
    def setup(ctx: Ctx) -> None:
        tensors = _tensors(ctx)
        names = sorted(tensors)
        first = {n: tensors[n] for n in names[:len(names) // 2]}
        second = {n: tensors[n] for n in names[len(names) // 2:]}
        if duplicate:
            second[names[0]] = tensors[names[0]]
        (ctx.model / "model.safetensors").unlink()
        shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
        (ctx.model / shard1).write_bytes(_file(first))
        (ctx.model / shard2).write_bytes(_file(second, second_dtype))
        weight_map = {n: shard1 for n in first} | {n: shard2 for n in second
                                                  if n not in first}
        if index_all_in_first:
            weight_map = {n: shard1 for n in names}
        _index(weight_map)(ctx)
    return setup


def _config(**changes: object) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        config = json.loads((ctx.model / "config.json").read_text())
        for key, value in changes.items():
            config[key] = value(config[key]) if callable(value) else value
        (ctx.model / "config.json").write_text(json.dumps(config))
    return setup


def _unknown_dtype(ctx: Ctx) -> None:
    raw = (ctx.model / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + length].replace(b'"F32"', b'"X32"', 1)  # same length: offsets hold
    (ctx.model / "model.safetensors").write_bytes(raw[:8] + header + raw[8 + length:])


def _truncated(ctx: Ctx) -> None:
    path = ctx.model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-64])


def _data(files: dict[str, bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        ctx.dataset.mkdir(parents=True, exist_ok=True)
        for name, body in files.items():
            (ctx.dataset / name).write_bytes(body)
    return setup


def _mixed(ctx: Ctx) -> None:
    _data({"extra.jsonl": b'{"input": "1+1", "output": "2"}\n'})(ctx)
    (ctx.dataset / "train.parquet").write_bytes(ctx.tiny_parquet.read_bytes())


def dataset_env(**extra: str) -> Callable[[Ctx], dict[str, str]]:
    return lambda ctx: {"STORAGE_URI": str(ctx.dataset), "OUTPUT_PATH": str(ctx.out), **extra}


def train_env(own_data: bool = False, **extra: str) -> Callable[[Ctx], dict[str, str]]:
    """`kubetune train` on the (spoiled) model copy, no initializer in between;
    ``own_data``: on the row's dataset instead of the tiny one."""
    return lambda ctx: {"KUBETUNE_MODEL_DIR": str(ctx.model),
                        "KUBETUNE_DATASET_DIR": str(ctx.dataset if own_data
                                                    else ctx.tiny_parquet.parent.parent),
                        "KUBETUNE_OUTPUT_DIR": str(ctx.out), **extra}


def _parquet(rows: list[dict], schema: dict | None = None) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        ctx.dataset.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(rows) if rows else pa.table(
            {name: pa.array([], kind) for name, kind in (schema or {}).items()})
        pq.write_table(table, ctx.dataset / "train.parquet")
    return setup


def _damaged_adapter(ctx: Ctx) -> None:
    """A private copy of the trained workspace whose adapter lost its tail."""
    import shutil

    copy = ctx.tmp / "ws"
    shutil.copytree(ctx.trained.workspace, copy, symlinks=True)
    adapters = sorted((copy / "output").glob("epoch_*/adapter_model.safetensors"))
    assert adapters
    for adapter in adapters:
        adapter.write_bytes(adapter.read_bytes()[:-64])


TRAIN = ["train", "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train"]
TRAIN_CHAT = ["train", "dataset=torchtune.datasets.chat_dataset", "dataset.split=train",
              "dataset.conversation_column=messages", "dataset.conversation_style=openai"]

def _manifest(name: str, edit: Callable[[dict], None], runtime: bool = False
              ) -> Callable[[Ctx], None]:
    """A TrainJob (or, with ``runtime``, the byo-model runtime) written to ctx.tmp/``name``
    with ``edit`` applied, as a user types one by hand."""
    def setup(ctx: Ctx) -> None:
        import yaml

        doc = yaml.safe_load(runtime_file("kubetune-byo-model").read_text()) if runtime else {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tiny"},
            "spec": {"runtimeRef": {"name": "kubetune-byo-model"},
                     "initializer": {"model": {"storageUri": f"file://{ctx.model}"},
                                     "dataset": {"storageUri": f"file://{ctx.dataset}"}}}}
        edit(doc)
        (ctx.tmp / name).write_text(yaml.safe_dump(doc))
    return setup


def _local_args(runtime: str = "") -> Callable[[Ctx], list[str]]:
    def args(ctx: Ctx) -> list[str]:
        path = ctx.tmp / runtime if runtime else runtime_file("kubetune-byo-model")
        job = [] if runtime else ["--trainjob", str(ctx.tmp / "job.yaml")]
        return ["--workdir", str(ctx.out), "--runtime", str(path), *job]
    return args


ROWS = [
    # -- the model initializer refuses what the trainer would choke on --------------------
    Row("model-without-config-json", ["init-model"], model_env(),
        ("no config.json",), setup=lambda ctx: (ctx.model / "config.json").unlink()),
    Row("safetensors-unknown-dtype", ["init-model"], model_env(),
        ("model.safetensors", "dtype 'X32'"), setup=_unknown_dtype),
    Row("shards-disagree-on-dtype", ["init-model"], model_env(),
        ("disagree on dtype", "F16"), setup=_shards(second_dtype="F16")),
    Row("tensor-in-two-shards", ["init-model"], model_env(),
        ("is in both", "model-00001-of-00002.safetensors"), setup=_shards(duplicate=True)),
    Row("index-places-a-tensor-in-the-wrong-shard", ["init-model"], model_env(),
        ("model.safetensors.index.json places tensor", "does not hold it"),
        setup=_shards(index_all_in_first=True)),
    Row("config-hidden-size-disagrees-with-weights", ["init-model"], model_env(),
        ("config.json says", "hidden_size", "embedding weights"),
        setup=_config(hidden_size=lambda v: v * 2)),
    Row("config-layer-count-disagrees-with-weights", ["init-model"], model_env(),
        ("num_hidden_layers",), setup=_config(num_hidden_layers=lambda v: v + 1)),
    # -- the trainer checks the same when no initializer ran ------------------------------
    Row("train-truncated-weights", TRAIN, train_env(), ("model.safetensors", "truncated"),
        step="trainer", setup=_truncated),
    Row("train-config-disagrees-with-weights", TRAIN, train_env(),
        ("config.json says", "vocab_size"), step="trainer",
        setup=_config(vocab_size=lambda v: v + 7)),
    Row("train-dataset-column-null", TRAIN, train_env(own_data=True),
        ("column 'output'", "null"), step="trainer",
        setup=_parquet([{"input": "1+1", "output": None}] * 16)),
    Row("train-dataset-column-not-text", TRAIN, train_env(own_data=True),
        ("column 'output'", "int values, not text"), step="trainer",
        setup=_parquet([{"input": "1+1", "output": 2}] * 16)),
    Row("train-dataset-zero-rows", TRAIN, train_env(own_data=True), ("hold no rows",),
        step="trainer", setup=_parquet([], {"input": "string", "output": "string"})),
    Row("train-dataset-chat-column-not-conversations", TRAIN_CHAT, train_env(own_data=True),
        ("column 'messages'", "sampled row 1", "not a list of messages"), step="trainer",
        setup=_data({"train.jsonl": "".join(json.dumps({"messages": f"hi {i}"}) + "\n"
                                            for i in range(16)).encode()})),
    # -- the dataset initializer ----------------------------------------------------------
    Row("dataset-jsonl-not-utf8", ["init-dataset"], dataset_env(),
        ("train.jsonl", "not UTF-8"), step="dataset-initializer",
        setup=_data({"train.jsonl": '{"input": "café", "output": "2"}\n'.encode("latin-1")})),
    Row("dataset-csv-not-utf8", ["init-dataset"], dataset_env(),
        ("train.csv", "not UTF-8"), step="dataset-initializer",
        setup=_data({"train.csv": "input,output\nnaïve,2\n".encode("cp1252")})),
    Row("dataset-mixes-formats", ["init-dataset"], dataset_env(),
        ("mixes formats", "extra.jsonl"), step="dataset-initializer", setup=_mixed),
    # -- the exporter ---------------------------------------------------------------------
    Row("export-truncated-adapter", ["export"],
        lambda ctx: {"KUBETUNE_WORKSPACE": str(ctx.tmp / "ws"), "EXPORT_URI": str(ctx.out)},
        ("adapter_model.safetensors", "is damaged", "truncated"), step="exporter",
        needs_trained=True, setup=_damaged_adapter),
    # -- endpoint, region and role values -------------------------------------------------
    Row("hf-endpoint-without-scheme", ["init-model"],
        uri_env("hf://org/name", HF_ENDPOINT="hub.mirror.local:8080"),
        ("HF_ENDPOINT='hub.mirror.local:8080'", "no scheme")),
    Row("hf-endpoint-not-http", ["init-dataset"],
        uri_env("hf://org/name", HF_ENDPOINT="ftp://hub.mirror.local"),
        ("HF_ENDPOINT", "'ftp' is not http"), step="dataset-initializer"),
    Row("hf-endpoint-port-not-a-number", ["init-model"],
        uri_env("hf://org/name", HF_ENDPOINT="http://127.0.0.1:hub"),
        ("HF_ENDPOINT", "port")),
    Row("hf-endpoint-password-with-slash", ["init-model"],
        uri_env("hf://org/name", HF_ENDPOINT=f"http://reader:{SLASH_PASSWORD}@127.0.0.1:1"),
        ("HF_ENDPOINT='http://***@127.0.0.1:1'", "percent-encoded")),
    Row("s3-endpoint-without-scheme", ["init-dataset"],
        uri_env("s3://bucket/data", ENDPOINT="minio.store:9000", **S3_KEYS),
        ("ENDPOINT='minio.store:9000'", "no scheme"), step="dataset-initializer"),
    Row("s3-endpoint-url-variable-bad-port", ["init-model"],
        uri_env("s3://bucket/model", AWS_ENDPOINT_URL="http://127.0.0.1:99999", **S3_KEYS),
        ("AWS_ENDPOINT_URL", "port")),
    Row("s3-region-malformed", ["init-model"],
        uri_env("s3://bucket/model", **{**S3_KEYS, "REGION": "us east 1"}),
        ("REGION='us east 1'", "not a region")),
    Row("s3-role-arn-malformed", ["init-model"],
        uri_env("s3://bucket/model", ROLE_ARN="kubetune-reader", REGION="us-east-1"),
        ("ROLE_ARN='kubetune-reader'", "not a role ARN")),
    Row("export-s3-endpoint-not-http", ["export"],
        export_env(EXPORT_URI="s3://bucket/x", ENDPOINT="s3://minio.store", **S3_KEYS),
        ("ENDPOINT", "'s3' is not http"), step="exporter", needs_trained=True),
    Row("export-role-arn-malformed", ["export"],
        export_env(EXPORT_URI="s3://bucket/x", ROLE_ARN="arn:bad", REGION="us-east-1"),
        ("ROLE_ARN", "not a role ARN"), step="exporter", needs_trained=True),
    # -- credentials by halves, or inside a URI -------------------------------------------
    Row("s3-key-id-without-secret", ["init-model"],
        uri_env("s3://bucket/model", ACCESS_KEY_ID="AKIAEXAMPLEKEY", REGION="us-east-1"),
        ("ACCESS_KEY_ID is set but SECRET_ACCESS_KEY is not",)),
    Row("s3-secret-without-key-id", ["init-dataset"],
        uri_env("s3://bucket/data", SECRET_ACCESS_KEY="example-secret", REGION="us-east-1"),
        ("SECRET_ACCESS_KEY is set but ACCESS_KEY_ID is not",), step="dataset-initializer"),
    Row("storage-uri-with-credentials", ["init-model"],
        uri_env(f"s3://uploader:{SLASH_PASSWORD}@bucket/model", **S3_KEYS),
        ("STORAGE_URI 's3://***@bucket/model'", "user or password")),
    Row("export-uri-with-credentials", ["export"],
        export_env(EXPORT_URI="hf://writer:secretpw@org/repo"),
        ("EXPORT_URI", "user or password"), step="exporter", needs_trained=True),
    # -- paths: a file where a directory belongs, a read-only volume ---------------------
    Row("local-workdir-is-a-file", ["local"],
        lambda ctx: {"KUBETUNE_LOCAL_DIR": str(ctx.tmp / "a-file")},
        ("invalid value in KUBETUNE_LOCAL_DIR", "is a file"), code=USAGE, step="local",
        setup=lambda ctx: (ctx.tmp / "a-file").write_text("")),
    Row("install-tune-bin-dir-under-a-file", ["install-tune", "--bin-dir"],
        lambda ctx: {}, ("a-file/bin", "not a directory"), step="install-tune",
        setup=lambda ctx: (ctx.tmp / "a-file").write_text(""),
        extra={"args": lambda ctx: [str(ctx.tmp / "a-file" / "bin")]}),
    # -- TrainJobs and runtimes kubectl apply refuses (strict field validation) -----------
    Row("trainjob-field-misspelt", ["local"], lambda ctx: {},
        ("job.yaml: spec.initializer.dataset.storageURI: unknown field",
         "did you mean storageUri?"), step="local",
        setup=_manifest("job.yaml", lambda d: d["spec"]["initializer"]["dataset"].update(
            storageURI=d["spec"]["initializer"]["dataset"].pop("storageUri"))),
        extra={"args": _local_args()}),
    Row("trainjob-section-misspelt", ["local"], lambda ctx: {},
        ("spec.initialiser: unknown field", "did you mean initializer?"), step="local",
        setup=_manifest("job.yaml", lambda d: d["spec"].update(
            initialiser=d["spec"].pop("initializer"))),
        extra={"args": _local_args()}),
    Row("trainjob-env-value-not-a-string", ["local"], lambda ctx: {},
        ("spec.trainer.env[0].value: expected a string, got the number 1",), step="local",
        setup=_manifest("job.yaml", lambda d: d["spec"].update(
            trainer={"env": [{"name": "KUBETUNE_EPOCHS", "value": 1}]})),
        extra={"args": _local_args()}),
    Row("runtime-field-misspelt", ["local"], lambda ctx: {},
        ("runtime.yaml: spec.mlPolicy.numNode: unknown field", "did you mean numNodes?"),
        step="local", setup=_manifest("runtime.yaml", lambda d: d["spec"]["mlPolicy"].update(
            numNode=d["spec"]["mlPolicy"].pop("numNodes")), runtime=True),
        extra={"args": _local_args("runtime.yaml")}),
    # -- a refused connection names where it went (retried: the endpoint may come up) -----
    Row("hf-connection-refused-names-the-hub", ["init-model"],
        uri_env("hf://org/name", HF_ENDPOINT="http://127.0.0.1:1"),
        ("Connection refused", "hub at http://127.0.0.1:1"), code=TRANSIENT),
    Row("s3-connection-refused-names-the-endpoint", ["init-model"],
        uri_env("s3://bucket/model", ENDPOINT="http://127.0.0.1:1", **S3_KEYS),
        ("http://127.0.0.1:1",), code=TRANSIENT),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_mistake_is_one_line_naming_its_culprit(row: Row, request, tmp_path, model_copy,
                                                 tiny_dataset_dir):
    ctx = Ctx(tmp=tmp_path, model=model_copy, dataset=tmp_path / "dataset-src")
    ctx.tiny_parquet = tiny_dataset_dir / "data" / "train.parquet"
    if row.needs_trained:
        ctx.trained = request.getfixturevalue("trained_run")
    row.setup(ctx)
    term = tmp_path / "termination-log"
    env = clean_env(KUBETUNE_TERMINATION_LOG=str(term), KUBETUNE_RETRY_MAX_ATTEMPTS="2",
                    KUBETUNE_RETRY_BASE_DELAY_S="0.01")
    env.update(row.env(ctx))
    args = [*row.args, *row.extra["args"](ctx)] if "args" in row.extra else row.args
    result = kubetune(*args, env=env, timeout=300)
    report = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == row.code, report
    assert "Traceback" not in result.stderr, report
    logged = term.read_text().strip()
    assert "\n" not in logged
    for fragment in row.fragments:
        assert fragment in logged, (fragment, logged)
    if row.code == USAGE:  # the usage line, then the one error line the log repeats
        assert "Usage:" in result.stderr and logged.startswith(f"{row.step}: "), report
        assert error_lines(result) == [f"error: {logged}"], report
        return
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0] == f"error: {logged}", report
    assert lines[-1] == [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert logged.startswith(f"{row.step}: "), logged
    for piece in SLASH_PASSWORD.split("/"):
        assert piece not in result.stdout + result.stderr, report
    # Nothing a re-run, the trainer or the exporter would take for a finished step.
    left = [p for p in ctx.out.parent.rglob("*") if p.name.startswith(".kubetune-manifest")
            or p.name in ("manifest.json", "kubetune-complete.json", "kubetune-config.yaml")]
    assert left == [], left


def test_a_read_only_install_directory_is_one_line(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs",
                              str(bin_dir)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only volume needs mount (root): {mounted.stderr.strip()}")
    try:
        term = tmp_path / "termination-log"
        result = kubetune("install-tune", "--bin-dir", str(bin_dir),
                          env=clean_env(KUBETUNE_TERMINATION_LOG=str(term)))
        assert result.returncode == 65, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        logged = term.read_text().strip()
        assert logged.startswith("install-tune: ") and "read-only file system" in logged
        assert error_lines(result) == [f"error: {logged}"]
    finally:
        subprocess.run(["umount", str(bin_dir)], check=False)


# The trainer's config: components, splits, column maps, list values, override keys.
_REPO = Path(__file__).resolve().parents[1]
_CUSTOM_PATH = f"{_REPO / 'examples' / 'custom-dataset'}:{_REPO}"
_BUILDER = "my_datasets.arithmetic_chat_dataset"
TRAINER_ROWS = [
    TrainerRow("optimizer class misspelled", ["optimizer._component_=torch.optim.AdamWW"],
               "torch.optim defines no AdamWW (did you mean torch.optim.AdamW?)"),
    TrainerRow("optimizer names its module", ["optimizer._component_=torch.optim.adamw"],
               "is a module, not a class or function (did you mean torch.optim.AdamW?)"),
    TrainerRow("dataset builder misspelled",
               ["dataset._component_=torchtune.datasets.instruct_datset"],
               "did you mean torchtune.datasets.instruct_dataset?"),
    TrainerRow("component package misspelled", [
        "lr_scheduler._component_=torchtune.training.lr_schedulerz.get_cosine_schedule_with_warmup"],
        "there is no module torchtune.training.lr_schedulerz"),
    TrainerRow("split the data lacks", ["dataset.split=validation"], "no split 'validation'"),
    TrainerRow("split malformed", ["dataset.split=train[:abc]"], "is not a split"),
    TrainerRow("column_map key typo", ["dataset.column_map.inptu=question"],
               "dataset.column_map key 'inptu' (did you mean input?)"),
    TrainerRow("column_map without a role", ["dataset.column_map={input: input}"],
               "dataset.column_map lacks output"),
    TrainerRow("column_map value not a column", ["dataset.column_map={input: input, output: [1]}"],
               "must name a column"),
    TrainerRow("--column-map malformed", ["--column-map", "input"], "column map 'input'",
               via="train"),
    TrainerRow("list option given a word", ["model.lora_attn_modules=q_proj"],
               "model.lora_attn_modules=q_proj: must be a list"),
    TrainerRow("empty key after a section", ["model.=3"], "override key 'model.' has an empty part"),
    TrainerRow("empty key", ["=3"], "override key '' has an empty part"),
    TrainerRow("empty key between sections", ["optimizer..lr=3e-4"], "has an empty part"),
    TrainerRow("tokenizer key typo", ["tokenizer.max_seq_lenn=64"],
               "unknown key tokenizer.max_seq_lenn (did you mean tokenizer.max_seq_len?)"),
    TrainerRow("PET_NNODES not a number", [], "PET_NNODES='two' is not a whole number",
               via="train", env={"PET_NNODES": "two"}),
    TrainerRow("PET_NODE_RANK beyond the nodes", [], "PET_NODE_RANK=3 is not below nnodes 2",
               via="train", env={"PET_NNODES": "2", "PET_NODE_RANK": "3",
                                 "PET_MASTER_ADDR": "trainer-node-0"}),
    TrainerRow("PET_MASTER_PORT not a port", [], "PET_MASTER_PORT='http' is not a port",
               via="train", env={"PET_NNODES": "2", "PET_MASTER_ADDR": "trainer-node-0",
                                 "PET_MASTER_PORT": "http"}),
    TrainerRow("checkpointer key typo", ["checkpointer.output_dirr=/tmp/x"],
               "unknown key checkpointer.output_dirr (did you mean checkpointer.output_dir?)"),
    TrainerRow("held-out fraction above one half", [], "KUBETUNE_VAL_FRACTION=0.6: the "
               "held-out fraction must be more than 0 and at most 0.5", via="train",
               env={"KUBETUNE_VAL_FRACTION": "0.6"}),
    TrainerRow("dataset_val split the data lacks",
               ["dataset_val=torchtune.datasets.instruct_dataset", "dataset_val.split=test"],
               "dataset_val.split=test: the dataset has no split 'test'"),
    # Issue 47: a setting made for torchtune's builders, given to one of the user's own.
    TrainerRow("system prompt for a builder without one", [f"dataset._component_={_BUILDER}"],
               f"KUBETUNE_SYSTEM_PROMPT: {_BUILDER} takes no new_system_prompt",
               env={"PYTHONPATH": _CUSTOM_PATH, "KUBETUNE_SYSTEM_PROMPT": "Be brief."}),
    TrainerRow("column map for a builder without one", [f"dataset._component_={_BUILDER}"],
               f"KUBETUNE_COLUMN_MAP: {_BUILDER} takes no column_map",
               env={"PYTHONPATH": _CUSTOM_PATH, "KUBETUNE_COLUMN_MAP": "input=question"}),
]


@pytest.mark.parametrize("row", TRAINER_ROWS, ids=[r.id for r in TRAINER_ROWS])
def test_a_config_mistake_is_one_line_before_the_recipe(row, tmp_path, tiny_model_dir,
                                                       tiny_dataset_dir):
    result, output, term = _run(row, tiny_model_dir, tiny_dataset_dir, tmp_path)
    _check(row, result, output, term)
    assert not (output / "kubetune-config.yaml").exists()  # failed before launching


def test_every_kind_has_a_row():
    assert len(ROWS) >= 25 and len(TRAINER_ROWS) >= 15 and len(TRAINS) >= 7


def _jsonl(rows: list[dict]) -> Callable[[Path], None]:
    return lambda data: shapes.write_jsonl(data / "train.jsonl", rows)


# Issue 43: data as users bring it that ended in exit 70 (a traceback) or was refused,
# though torchtune can represent it. Each trains; a row that cannot train is dropped and
# counted by reason with its row number (the expected line's fragment, where one is).
TRAINS = [
    ("chat-null-system-content", _jsonl(shapes.openai_rows(40, {2: shapes.null_system()})),
     None),
    ("chat-tool-exchange", _jsonl(shapes.openai_rows(40, {5: shapes.tool_exchange()})), None),
    ("chat-content-parts-among-strings",
     _jsonl(shapes.openai_rows(40, {8: shapes.content_parts()})), None),
    ("chat-trl-conversational-prompt-completion", _jsonl(shapes.trl_conversational(40)),
     None),
    ("chat-assistant-turn-first", _jsonl(shapes.openai_rows(40, {3: shapes.assistant_first()})),
     "with an assistant turn before any user turn (row 3)"),
    ("alpaca-null-input", _jsonl(shapes.alpaca_null_input(40)), None),
    ("csv-number-answers", lambda data: shapes.write_numbers_csv(data / "train.csv"), None),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind,write,dropped", TRAINS, ids=[t[0] for t in TRAINS])
def test_data_that_crashed_or_was_refused_now_trains(kind, write, dropped, tmp_path,
                                                     tiny_model_dir):
    data = tmp_path / "data"
    data.mkdir()
    write(data)
    result = kubetune("train", "--model-dir", str(tiny_model_dir), "--dataset-dir",
                      str(data), "--output-dir", str(tmp_path / "out"), "--epochs", "1",
                      "max_steps_per_epoch=1", "batch_size=4",
                      "gradient_accumulation_steps=1", "dtype=fp32",
                      env=clean_env(KUBETUNE_TOKEN_CACHE_DIR=str(tmp_path / "c")),
                      timeout=600)
    report = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == 0, report
    assert "Traceback" not in result.stderr, report
    said = [line for line in result.stderr.splitlines() if "train: dropped" in line]
    if dropped is None:
        assert said == [], said
    else:
        assert len(said) == 1 and dropped in said[0], said


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_volume_anywhere_in_a_step_is_one_line_and_bad_input(tmp_path, code, capsys,
                                                                    monkeypatch):
    # Wherever a write surfaces ENOSPC/EDQUOT (a manifest, a summary, a copied file), the
    # step reports one line naming the file and exits 65: a restart fails the same way.
    from kubetune.entrypoints.step import run_step
    term = tmp_path / "termination-log"
    monkeypatch.setenv("KUBETUNE_TERMINATION_LOG", str(term))
    target = tmp_path / "out" / "summary.json"

    def write() -> int:
        raise OSError(code, os.strerror(code), str(target))

    assert run_step("trainer", write) == 65
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "volume full" in lines[0] and str(target) in lines[0]
    assert "volume full" in term.read_text()
