"""`kubetune local` checks every option and argument before any step starts.

Table-driven: each row is one mistake a user makes on the command line. For each: exit 65,
exactly one `error:` line naming the option and the cause (also in the termination log),
and no step started: no workspace (nothing staged) and no step log under the workdir.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.support import hub_write_server
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.runtimes import runtime_file
from tests.support.s3_server import free_port

BAD_INPUT = 65
# Not a KUBETUNE_* name: a runtime may set only names kubetune reads (runtime_contract).
SECRET_NAME = "ACME_NOT_EXPORTED_TOKEN"


@dataclass
class Ctx:
    project: Path  # the user's working directory
    workdir: Path  # --workdir: elsewhere


@dataclass
class Row:
    id: str
    args: Callable[[Ctx], list[str]]
    fragments: Callable[[Ctx], tuple[str, ...]]
    env: dict[str, str] = field(default_factory=dict)


def _trainjob(ctx: Ctx, initializer: str) -> str:
    job = ctx.project / "job.yaml"
    job.write_text(f"""apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: tiny}}
spec:
  runtimeRef: {{name: kubetune-byo-model}}
  initializer:
{initializer}""")
    return str(job)


def _bad_yaml(ctx: Ctx) -> str:
    path = ctx.project / "runtime.yaml"
    path.write_text("kind: ClusterTrainingRuntime\n  spec: [\n")
    return str(path)


def _empty_dir(ctx: Ctx) -> str:
    (ctx.project / "empty").mkdir()
    (ctx.project / "empty" / "README.md").write_text("no data here")
    return "./empty"


def _notes_dir(ctx: Ctx) -> str:
    (ctx.project / "results").mkdir()
    (ctx.project / "results" / "notes.txt").write_text("mine")
    return "./results"


BYO = str(runtime_file("kubetune-byo-model.yaml"))
ROWS = [
    # -- TRAIN_ARGS, checked as the trainer checks them --------------------------------
    Row("trainer-setting-as-a-flag", lambda c: ["--epochs", "1"],
        lambda c: ("--epochs is not an option of kubetune local; trainer arguments are "
                   "key=value: epochs=1",)),
    Row("mistyped-option", lambda c: ["--modle", "./my-model"],
        lambda c: ("no such option --modle (did you mean --model?)",)),
    Row("not-key-value", lambda c: ["epochs"], lambda c: ("'epochs' is not key=value",)),
    Row("unknown-key", lambda c: ["epochz=2"],
        lambda c: ("unknown key epochz (did you mean epochs?)",)),
    Row("unknown-model-key", lambda c: ["model.lora_rnk=4"],
        lambda c: ("unknown key model.lora_rnk (did you mean model.lora_rank?)",)),
    Row("unknown-key-with-a-remote-model", lambda c: ["--model", "hf://org/model",
                                                       "model.lora_rnk=4"],
        lambda c: ("unknown key model.lora_rnk (did you mean model.lora_rank?)",)),
    Row("key-only-a-section-has", lambda c: ["lora_rank=4"],
        lambda c: ("unknown key lora_rank (did you mean model.lora_rank?)",)),
    Row("key-only-a-section-has-with-a-remote-model", lambda c: ["--model", "hf://org/model",
                                                                 "lora_rank=4"],
        lambda c: ("unknown key lora_rank (did you mean model.lora_rank?)",)),
    Row("bad-number", lambda c: ["optimizer.lr=fast"],
        lambda c: ("optimizer.lr=fast: must be a number > 0",)),
    Row("no-optimizer-step", lambda c: ["batch_size=100000"],
        lambda c: ("the run makes no optimizer step", "batch_size=100000")),
    Row("method-the-model-cannot-take", lambda c: ["--method", "qlora"],
        lambda c: ("QLoRA cannot quantize this model",)),
    # -- sources and destination, parsed as the steps parse them ------------------------
    Row("relative-model-missing", lambda c: ["--model", "./no-such-model"],
        lambda c: (f"--model: {c.project / 'no-such-model'} does not exist ('./no-such-model'"
                   f" relative to {c.project})",)),
    Row("relative-file-uri-dataset-missing", lambda c: ["--dataset", "file://./no-data"],
        lambda c: (f"--dataset: {c.project / 'no-data'} does not exist",)),
    Row("malformed-dataset-uri", lambda c: ["--dataset", "relative/path"],
        lambda c: ("--dataset: storage URI 'relative/path' is malformed",
                   "./rel/path")),
    Row("local-dataset-without-data-beside-a-remote-model", lambda c: [
        "--model", "hf://org/model", "--dataset", _empty_dir(c)],
        lambda c: (f"--dataset {c.project / 'empty'}: no data files found",)),
    Row("unsupported-scheme", lambda c: ["--model", "gs://bucket/model"],
        lambda c: ("--model: unsupported storage scheme 'gs'",)),
    Row("bad-hub-repo-id", lambda c: ["--model", "hf://org/na$me"],
        lambda c: ("--model: STORAGE_URI 'hf://org/na$me' names no valid hub repo id",)),
    Row("bad-export-uri", lambda c: ["--export-uri", "gs://bucket/out"],
        lambda c: ("--export-uri: EXPORT_URI 'gs://bucket/out' is not supported",)),
    # The exporter's own destination check, made before the run rather than after it.
    Row("s3-export-without-credentials", lambda c: ["--export-uri", "s3://exports/tiny"],
        lambda c: ("--export-uri: no S3 credentials: set ACCESS_KEY_ID and "
                   "SECRET_ACCESS_KEY", "(for s3://exports/tiny)")),
    Row("hub-export-without-a-token", lambda c: ["--export-uri", "hf://acme/tiny-lora"],
        lambda c: ("--export-uri: uploading to hf://acme/tiny-lora@main needs a token with "
                   "write access",)),
    Row("export-dir-holding-other-files", lambda c: ["--export-uri", _notes_dir(c)],
        lambda c: (f"--export-uri: export destination {c.project / 'results'} holds files "
                   "that are not a kubetune export's (notes.txt)",)),
    # -- options that do not go together ------------------------------------------------
    Row("gpus-without-engine", lambda c: ["--gpus", "--runtime", BYO],
        lambda c: ("--gpus and --image need a container engine",)),
    Row("method-with-runtime", lambda c: ["--runtime", BYO, "--method", "full"],
        lambda c: ("with --runtime, --method would be ignored",)),
    Row("trainer-setting-in-the-shell-with-runtime", lambda c: ["--runtime", BYO],
        lambda c: ("with --runtime, set KUBETUNE_LORA_RANK in the TrainJob's "
                   "spec.trainer.env, not in this shell",),
        env={"KUBETUNE_LORA_RANK": "2"}),
    Row("engine-not-installed", lambda c: ["--engine", "podman", "--runtime", BYO],
        lambda c: ("--engine podman: `podman` is not installed or not on PATH",),
        env={"PATH": "/nonexistent"}),
    # -- a runtime and a TrainJob: merged and checked before the first container -------
    Row("trainjob-field-misspelt", lambda c: ["--runtime", BYO, "--trainjob", _trainjob(c, """    model: {storageUri: hf://org/model}
    dataset: {storageURI: hf://org/data}
""")], lambda c: ("spec.initializer.dataset.storageURI: unknown field (did you mean "
                  "storageUri?)",)),
    Row("trainjob-file-missing", lambda c: ["--runtime", BYO, "--trainjob", "no-job.yaml"],
        lambda c: ("no-job.yaml: cannot read: No such file or directory",)),
    Row("runtime-not-yaml", lambda c: ["--runtime", _bad_yaml(c)],
        lambda c: (f"{c.project / 'runtime.yaml'}: not valid YAML (line 2)",)),
    Row("trainjob-secret-not-exported", lambda c: [
        "--runtime", BYO, "--trainjob", _trainjob(c, f"""    model:
      storageUri: hf://org/model
      env: [{{name: {SECRET_NAME}, valueFrom: {{secretKeyRef: {{name: s, key: k}}}}}}]
    dataset: {{storageUri: hf://org/data}}
""")], lambda c: (f"env {SECRET_NAME} comes from secretKeyRef; export {SECRET_NAME}",)),
    Row("trainjob-relative-source-missing", lambda c: [
        "--runtime", BYO, "--trainjob", _trainjob(c, """    model: {storageUri: ./no-such-model}
    dataset: {storageUri: hf://org/data}
""")], lambda c: (f"STORAGE_URI: {c.project / 'no-such-model'} does not exist",)),
]


def _context(tmp_path: Path) -> Ctx:
    ctx = Ctx(project=tmp_path / "project", workdir=tmp_path / "run")
    ctx.project.mkdir(parents=True)
    return ctx


def _refused_before_any_step(ctx: Ctx, args: list[str], env: dict[str, str],
                             code: int = BAD_INPUT) -> str:
    """`kubetune local ARGS` exits ``code`` with one `error:` line (also in the termination
    log) and no step started: nothing staged in the stand-in PVC, no step's log, no step
    line. Returns the line."""
    term = ctx.project.parent / "termination-log"
    result = kubetune("local", "--workdir", str(ctx.workdir), *args,
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(term), **env),
                      cwd=ctx.project, timeout=300)
    report = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == code, report
    assert "Traceback" not in result.stderr, report
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: local: "), report
    assert term.read_text().strip() == lines[0].removeprefix("error: ")
    assert not (ctx.workdir / "workspace").exists(), report
    assert not (ctx.workdir / "logs").exists(), report
    assert not (ctx.workdir / "sources").exists(), report  # the demo's, made for the checks
    assert "==> " not in result.stdout, report
    return lines[0]


READ_TOKEN = "hf_kubetuneReadOnlyToken012345678"


@pytest.fixture(scope="module")
def hub():
    server = hub_write_server.start()
    server.add_token(READ_TOKEN, write=False)
    yield server
    server.stop()


def test_an_export_destination_that_refuses_fails_before_any_step(s3, hub, tmp_path):
    """Reached as the exporter reaches it, one attempt each: a bucket that is not there, a
    read-only hub token; an endpoint that does not answer is exit 75, at once."""
    keys = {"ENDPOINT": s3.endpoint, "ACCESS_KEY_ID": s3.access_key_id,
            "SECRET_ACCESS_KEY": s3.secret_access_key, "REGION": s3.region}
    cases = [
        (["s3://kubetune-no-such-bucket/run"], keys, BAD_INPUT,
         "--export-uri: bucket kubetune-no-such-bucket does not exist"),
        (["hf://acme/tiny-lora"], {"HF_ENDPOINT": hub.endpoint, "ACCESS_TOKEN": READ_TOKEN},
         BAD_INPUT, "--export-uri: the token is read-only"),
        (["s3://exports/run"], {**keys, "ENDPOINT": f"http://127.0.0.1:{free_port()}"}, 75,
         "--export-uri: read (s3://exports/run): still failing after 1 attempts"),
    ]
    for number, (uri, env, code, fragment) in enumerate(cases):
        line = _refused_before_any_step(_context(tmp_path / str(number)),
                                        ["--export-uri", *uri], env, code)
        assert fragment in line, line
        assert READ_TOKEN not in line and s3.secret_access_key not in line


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_bad_option_fails_before_any_step(row: Row, tmp_path):
    ctx = _context(tmp_path)
    line = _refused_before_any_step(ctx, row.args(ctx), row.env)
    for fragment in row.fragments(ctx):
        assert fragment in line, (fragment, line)


@pytest.mark.slow
def test_relative_paths_are_read_from_the_users_directory(tmp_path, tiny_model_dir,
                                                          tiny_dataset_dir):
    # Run from the project directory with relative paths, the workdir elsewhere: every
    # step gets the absolute path (the manifests record it), and the export lands in the
    # project, not in the workdir or a step's directory.
    project = tmp_path / "project"
    shutil.copytree(tiny_model_dir, project / "my-model")
    shutil.copytree(tiny_dataset_dir, project / "data")
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--model", "./my-model",
                      "--dataset", "file://./data", "--export-uri", "./exports/run1",
                      "dataset=torchtune.datasets.instruct_dataset", "epochs=1",
                      "max_steps_per_epoch=2", env=clean_env(), cwd=project, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ws = tmp_path / "run" / "workspace"
    recorded = {kind: json.loads((ws / kind / ".kubetune-manifest.json").read_text())
                ["storage_uri"] for kind in ("model", "dataset")}
    assert recorded == {"model": str(project / "my-model"),
                        "dataset": f"file://{project / 'data'}"}
    export = project / "exports" / "run1"
    assert (export / "adapter_model.safetensors").is_file()
    assert json.loads((export / "manifest.json").read_text())["files"]
    # Own model and dataset: none of the demo's settings but the seed.
    line = next(x for x in result.stderr.splitlines() if "trainer arguments:" in x)
    assert line.split("trainer arguments: ", 1)[1].split() == [
        "seed=0", "dataset=torchtune.datasets.instruct_dataset", "epochs=1",
        "max_steps_per_epoch=2"]
