"""Secrets never appear in any byte kubetune writes.

Every form a secret takes gets a distinctive value: a token file with a trailing newline,
a token file of two lines, user and password inside each endpoint and URI variable, S3
keys inline and as ``*_FILE``. Then every step runs as a pod runs it, against the local
hub server and moto S3: successes (init-model from the hub and from S3, init-dataset, a
short training, export to a directory and to S3, `kubetune size` of a private hub
repo), failures (credentials refused, an
unreachable endpoint, a malformed token file, credentials inside URIs) and internal
errors with a traceback (a real one: a malformed endpoint that boto3 reads itself and
rejects with an exception we do not map). The recipe process's environment is written out
by a probe and searched too, and so is the saved config of an override carrying URL
credentials. Then stdout, stderr, the termination logs and
every file under the test's directory (workspace, export, S3 work dirs) are searched for
every secret and every part of one. Zero hits.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import clean_env, kubetune
from tests.support.fault_proxy import FaultProxy
from tests.support.hub_server import HubServer, local_tree
from tests.support.trained import TRAIN_ARGS

TOKEN = "hf_CanaryTokenValue0123456789"
TWO_LINE_TOKEN = "hf_CanaryLineOne0123\nCanaryLineTwo4567\n"
KEY_ID = "AKIACANARYKEYID7777"
SECRET_KEY = "Canary/Secret+Key8888"
EXPORT_KEY_ID = "AKIACANARYEXPORT6666"
EXPORT_SECRET = "CanaryExport/Secret+5555"
URL_USER, URL_PASS = "urlUserCanary31", "urlPassCanary32"
HUB_USER, HUB_PASS = "hubUserCanary41", "hubPassCanary42"
URI_USER, URI_PASS = "uriUserCanary51", "uriPassCanary52"
EXPORT_URI_USER, EXPORT_URI_PASS = "expUserCanary61", "expPassCanary62"
# A password holding "/" (as AWS secret keys do): parsers cut it there, so each piece is
# a secret of its own.
SLASH_USER, SLASH_PASS = "slashUserCanary71", "slashPieceA72/slashPieceB73"
# URL credentials inside an override value: the recipe gets them, no saved config does.
OVERRIDE_USER, OVERRIDE_PASS = "ovrUserCanary81", "ovrPassCanary82"
ALONE_KEY_ID = "AKIACANARYALONE9999"  # ACCESS_KEY_ID without SECRET_ACCESS_KEY
# A URL with credentials where a local path belongs (a logger's log_dir): pathlib turns it
# into "http:/user:password@host", which a logger would print and make a directory of.
PATH_USER, PATH_PASS = "pathUserCanary91", "pathPassCanary92"
SECRETS = [TOKEN, "hf_CanaryLineOne0123", "CanaryLineTwo4567", KEY_ID, SECRET_KEY,
           EXPORT_KEY_ID, EXPORT_SECRET, URL_USER, URL_PASS, HUB_USER, HUB_PASS, URI_USER,
           URI_PASS, EXPORT_URI_USER, EXPORT_URI_PASS, SLASH_USER, SLASH_PASS,
           *SLASH_PASS.split("/"), OVERRIDE_USER, OVERRIDE_PASS, ALONE_KEY_ID, PATH_USER,
           PATH_PASS]
# Loaded by every Python process of a run through PYTHONPATH; the recipe process alone
# (it has the launcher's stop file) writes its environment where every_byte searches.
ENV_PROBE = """import os
if os.environ.get("KUBETUNE_STOP_FILE"):
    with open(os.path.join(os.environ["SECRETS_PROBE_DIR"], f"{os.getpid()}.env"), "w") as f:
        f.write("\\n".join(f"{k}={v}" for k, v in os.environ.items()))
"""


def with_userinfo(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


class Scene:
    def __init__(self, root: Path, hub: HubServer, s3, proxy: FaultProxy) -> None:
        self.root, self.hub, self.s3, self.proxy = root, hub, s3, proxy
        self.secret_files = root / "secrets"
        self.secret_files.mkdir()
        self.workspace = root / "workspace"
        self.results: dict[str, subprocess.CompletedProcess] = {}
        self.count = 0

    def secret_file(self, name: str, value: str) -> str:
        path = self.secret_files / name
        path.write_text(value)
        return str(path)

    def run(self, name: str, *args: str, **extra: str) -> subprocess.CompletedProcess:
        self.count += 1
        env = clean_env(KUBETUNE_WORKSPACE=str(self.workspace),
                        KUBETUNE_TERMINATION_LOG=str(self.root / f"termination-{name}"),
                        KUBETUNE_RETRY_BASE_DELAY_S="0.05", KUBETUNE_RETRY_MAX_ATTEMPTS="2",
                        KUBETUNE_HTTP_TIMEOUT_S="10", **extra)
        result = kubetune(*args, env=env, timeout=600)
        self.results[name] = result
        return result

    def hub_env(self, **extra: str) -> dict[str, str]:
        return {"HF_ENDPOINT": self.hub.url,
                "ACCESS_TOKEN_FILE": self.secret_file("token", TOKEN + "\n"), **extra}

    def s3_env(self, **extra: str) -> dict[str, str]:
        # Credentials in the endpoint URL too: the store ignores them, we must hide them.
        return {"ENDPOINT": with_userinfo(self.proxy.url, URL_USER, URL_PASS),
                "ACCESS_KEY_ID": KEY_ID, "SECRET_ACCESS_KEY": SECRET_KEY,
                "REGION": self.s3.region, **extra}

    def export_s3_env(self, **extra: str) -> dict[str, str]:
        return {"ENDPOINT": with_userinfo(self.proxy.url, URL_USER, URL_PASS),
                "ACCESS_KEY_ID_FILE": self.secret_file("key-id", EXPORT_KEY_ID + "\n"),
                "SECRET_ACCESS_KEY_FILE": self.secret_file("secret", EXPORT_SECRET + "\n "),
                "REGION": self.s3.region, **extra}


@pytest.fixture(scope="module")
def scene(tmp_path_factory, s3, tiny_model_dir, tiny_dataset_dir):
    hub = HubServer(token=TOKEN).start()
    hub.add_repo("org/private", local_tree(tiny_model_dir), private=True)
    client = s3.upload_tree(tiny_model_dir, "secret-models", "tiny")
    client.upload_file(str(tiny_dataset_dir / "data" / "train.parquet"), "secret-models",
                       "data/train.parquet")
    client.create_bucket(Bucket="secret-export")
    proxy = FaultProxy(s3.endpoint)
    scene = Scene(tmp_path_factory.mktemp("secrets"), hub, s3, proxy)
    play(scene)
    yield scene
    proxy.stop()
    hub.stop()


def play(scene: Scene) -> None:
    model = str(scene.workspace / "model")
    # Successes.
    scene.run("init-model-hub", "init-model", **scene.hub_env(
        STORAGE_URI="hf://org/private", OUTPUT_PATH=model))
    scene.run("init-model-s3", "init-model", **scene.s3_env(
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "s3-model")))
    scene.run("init-dataset-s3", "init-dataset", **scene.s3_env(
        STORAGE_URI="s3://secret-models/data"))
    overrides = [a for a in TRAIN_ARGS if not a.startswith("max_steps_per_epoch")]
    probe = scene.root / "recipe-env"
    (probe / "code").mkdir(parents=True)
    (probe / "code" / "sitecustomize.py").write_text(ENV_PROBE)
    scene.run("train", "train", *overrides, "max_steps_per_epoch=2",
              "dataset.new_system_prompt=Answer. See "
              f"http://{OVERRIDE_USER}:{OVERRIDE_PASS}@notes.example/x",
              **scene.hub_env(HF_ENDPOINT=with_userinfo(scene.hub.url, HUB_USER, HUB_PASS)),
              **scene.s3_env(), PYTHONPATH=str(probe / "code"), SECRETS_PROBE_DIR=str(probe))
    scene.run("train-url-as-path", "train", *overrides, "max_steps_per_epoch=1",
              f"output_dir={scene.root / 'url-as-path'}",
              "metric_logger=torchtune.training.metric_logging.DiskLogger",
              f"metric_logger.log_dir=http://{PATH_USER}:{PATH_PASS}@logs.example/x",
              **scene.hub_env(), **scene.s3_env())
    scene.run("export-local", "export", **scene.hub_env(), **scene.s3_env(
        EXPORT_URI=str(scene.root / "exported"), KUBETUNE_EXPORT_DIR=str(scene.root / "x1")))
    scene.run("export-s3", "export", **scene.hub_env(), **scene.export_s3_env(
        EXPORT_URI="s3://secret-export/run", KUBETUNE_EXPORT_DIR=str(scene.root / "x2")))
    # Failures a user causes: refused credentials, unreachable endpoint, bad inputs.
    scene.proxy.fault("status", "/secret-models*", times=10, status=403,
                      code="SignatureDoesNotMatch")
    scene.run("s3-denied", "init-model", **scene.s3_env(
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "denied")))
    scene.proxy.clear()
    scene.run("hub-denied", "init-model", HF_ENDPOINT=scene.hub.url,
              ACCESS_TOKEN="hf_CanaryWrongToken0000", STORAGE_URI="hf://org/private",
              OUTPUT_PATH=str(scene.root / "hub-denied"))
    scene.run("hub-userinfo", "init-model",
              HF_ENDPOINT=with_userinfo(scene.hub.url, HUB_USER, HUB_PASS),
              ACCESS_TOKEN=TOKEN, STORAGE_URI="hf://org/private",
              OUTPUT_PATH=str(scene.root / "hub-userinfo"))
    scene.run("s3-unreachable", "init-model", **scene.s3_env(
        ENDPOINT=with_userinfo("http://127.0.0.1:1", URL_USER, URL_PASS),
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "unreachable")))
    scene.run("two-line-token", "init-model", HF_ENDPOINT=scene.hub.url,
              ACCESS_TOKEN_FILE=scene.secret_file("two-lines", TWO_LINE_TOKEN),
              STORAGE_URI="hf://org/private", OUTPUT_PATH=str(scene.root / "two-lines"))
    scene.run("s3-uri-userinfo", "init-model", **scene.s3_env(
        STORAGE_URI=f"s3://{URI_USER}:{URI_PASS}@secret-models/tiny",
        OUTPUT_PATH=str(scene.root / "uri-userinfo")))
    scene.run("export-uri-userinfo", "export", **scene.export_s3_env(
        EXPORT_URI=f"s3://{EXPORT_URI_USER}:{EXPORT_URI_PASS}@secret-export/run",
        KUBETUNE_EXPORT_DIR=str(scene.root / "x3")))
    scene.run("hub-endpoint-slash-password", "init-model", **scene.hub_env(
        HF_ENDPOINT=with_userinfo(scene.hub.url, SLASH_USER, SLASH_PASS),
        STORAGE_URI="hf://org/private", OUTPUT_PATH=str(scene.root / "slash-hub")))
    scene.run("s3-endpoint-slash-password", "init-model", **scene.s3_env(
        ENDPOINT=with_userinfo(scene.proxy.url, SLASH_USER, SLASH_PASS),
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "slash-s3")))
    scene.run("key-id-alone", "init-model", **scene.s3_env(
        ACCESS_KEY_ID=ALONE_KEY_ID, SECRET_ACCESS_KEY="",
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "key-id-alone")))
    # `kubetune size` reads config.json of a private repo with the token; a refused
    # token; credentials inside the URI.
    scene.run("size-hub", "size", "--model", "hf://org/private", "--output", "json",
              **scene.hub_env())
    scene.run("size-hub-denied", "size", "--model", "hf://org/private",
              HF_ENDPOINT=scene.hub.url, ACCESS_TOKEN="hf_CanaryWrongToken0000")
    scene.run("size-uri-userinfo", "size", "--model",
              f"hf://{URI_USER}:{URI_PASS}@org/private", **scene.hub_env())
    # Internal errors, tracebacks printed: exceptions libraries raise that we do not map.
    # boto3 reads AWS_ENDPOINT_URL_S3 itself (we name ENDPOINT and AWS_ENDPOINT_URL).
    scene.run("internal-s3-endpoint", "init-model", **scene.s3_env(
        ENDPOINT="", AWS_ENDPOINT_URL_S3=with_userinfo("http://127.0.0.1:notaport", HUB_USER,
                                                       HUB_PASS),
        STORAGE_URI="s3://secret-models/tiny", OUTPUT_PATH=str(scene.root / "internal-1")))
    scene.run("internal-hub-uri", "init-model", **scene.hub_env(
        STORAGE_URI=f"hf://{URI_USER}:{URI_PASS}@org/private",
        OUTPUT_PATH=str(scene.root / "internal-2")))


def every_byte(scene: Scene) -> list[tuple[str, bytes]]:
    written = []
    for name, result in scene.results.items():
        written.append((f"{name}: stdout", result.stdout.encode()))
        written.append((f"{name}: stderr", result.stderr.encode()))
    for path in sorted(scene.root.rglob("*")):
        if path.is_file() and not path.is_relative_to(scene.secret_files):
            written.append((str(path), path.read_bytes()))
    for key in scene.s3.client().list_objects_v2(Bucket="secret-export").get("Contents", []):
        body = scene.s3.client().get_object(Bucket="secret-export", Key=key["Key"])["Body"]
        written.append((f"s3://secret-export/{key['Key']}", body.read()))
    return written


def test_the_runs_did_what_they_stand_for(scene):
    codes = {name: result.returncode for name, result in scene.results.items()}
    for name in ("init-model-hub", "init-model-s3", "init-dataset-s3", "train", "export-local",
                 "export-s3", "size-hub"):
        assert codes[name] == 0, (name, scene.results[name].stderr[-3000:])
    assert (scene.root / "exported" / "manifest.json").is_file()
    assert codes["s3-denied"] == 65 and codes["hub-denied"] == 65
    assert codes["size-hub-denied"] == 65 and codes["size-uri-userinfo"] == 65
    assert codes["s3-unreachable"] == 75
    assert codes["two-line-token"] == 65 and codes["s3-uri-userinfo"] == 65
    assert codes["hub-userinfo"] != 0 and codes["export-uri-userinfo"] != 0
    assert codes["hub-endpoint-slash-password"] == 65
    assert codes["s3-endpoint-slash-password"] == 65
    assert list((scene.root / "recipe-env").glob("*.env"))  # the recipe's env was searched
    tracebacks = [name for name, result in scene.results.items()
                  if result.returncode == 70 and "Traceback (most recent call last)"
                  in result.stderr]
    assert tracebacks, codes  # the internal-error path (its traceback) was exercised


def test_a_token_file_of_two_lines_is_one_line_naming_the_file_not_its_value(scene):
    result = scene.results["two-line-token"]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "ACCESS_TOKEN_FILE" in lines[0] and "more than one line" in lines[0]


def test_a_url_with_credentials_where_a_path_belongs_is_refused_masked(scene):
    result = scene.results["train-url-as-path"]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 65, result.stderr[-2000:]
    assert len(lines) == 1 and "metric_logger.log_dir=http://***@logs.example/x" in lines[0]
    assert not (scene.root / "url-as-path").exists()  # refused before anything was made


def test_a_key_id_without_its_secret_is_bad_input_naming_the_missing_one(scene):
    result = scene.results["key-id-alone"]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 65, result.stderr[-2000:]
    assert len(lines) == 1 and "SECRET_ACCESS_KEY is not" in lines[0]


def test_the_saved_config_masks_the_override_s_url_credentials(scene):
    saved = (scene.workspace / "output" / "kubetune-config.yaml").read_text()
    assert "http://***@notes.example/x" in saved


def test_no_secret_in_any_byte_written(scene):
    written = every_byte(scene)
    assert len(written) > 2 * scene.count  # the workspace and exports were searched too
    hits = [(where, secret) for where, data in written for secret in SECRETS
            if secret.encode() in data]
    assert hits == [], [(where, SECRETS.index(secret)) for where, secret in hits]
