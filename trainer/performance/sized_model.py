"""The model `kubetune size` sizes, from its ``config.json`` alone: a model directory (the
model initializer's output, or any Hugging Face checkout), a ``config.json`` file, or
``hf://org/name`` on the hub (only ``config.json`` is fetched, never weights).

The architecture is read as the trainer reads it (``kubetune.model_family``), so an
unsupported model fails here with the trainer's own line. The checkpoint's size, which
sets the host memory each process loads, is the weight files' where they are on disk,
else the parameter count at config.json's dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubetune import retry, storage_uri
from kubetune.errors import BadInputError
from kubetune.model_family.architecture import Architecture, architecture_of
from kubetune.trainer.performance import host_memory
from kubetune.trainer.performance.model_shape import parameter_count
from kubetune.workspace import MODEL_CONFIG_NAME
from kubetune.workspace.model_files import read_config, weight_files

MODEL_FORMS = "a model directory, a config.json or hf://org/name"
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class SizedModel:
    label: str  # what the messages call it
    architecture: Architecture
    checkpoint_bytes: int
    checkpoint_measured: bool  # the weight files' sizes, not parameters x dtype

    @property
    def parameters(self) -> int:
        return parameter_count(self.architecture.shape)


def _dtype_bytes(cfg: dict) -> int:
    # transformers 5 writes "dtype"; earlier ones "torch_dtype". Hub checkpoints are bf16
    # where they say nothing.
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    return _DTYPE_BYTES.get(name, 2)


def _from_config(cfg: dict, label: str, weights: int | None) -> SizedModel:
    if not isinstance(cfg, dict):
        raise BadInputError(f"{label}: config.json is not a JSON object")
    arch = architecture_of(cfg)
    estimated = parameter_count(arch.shape) * _dtype_bytes(cfg)
    return SizedModel(label, arch, weights if weights else estimated, bool(weights))


def _local(path: Path, label: str) -> SizedModel:
    if path.is_dir():
        try:
            weights = host_memory.checkpoint_bytes(path, weight_files(path))
        except BadInputError:
            weights = None  # config.json alone: sized from its shape
        return _from_config(read_config(path), label, weights)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError(f"--model {label}: no such file or directory ({MODEL_FORMS})"
                            ) from None
    except (OSError, ValueError) as exc:
        raise BadInputError(f"--model {label}: not a readable config.json ({exc})") from None
    return _from_config(cfg, label, None)


def _hub(uri: storage_uri.StorageUri, label: str) -> SizedModel:
    # First: it sets huggingface_hub's environment before huggingface_hub reads it.
    from kubetune.remote import hub
    from kubetune.remote.hub_errors import HubErrors
    from huggingface_hub.errors import RemoteEntryNotFoundError

    repo = storage_uri.hub(uri, "--model", repo_type="model")
    token = hub.token()
    errors = HubErrors(repo.repo_id, "model", hub.endpoint(), None, bool(token))
    path = f"{repo.sub_path}/{MODEL_CONFIG_NAME}" if repo.sub_path else MODEL_CONFIG_NAME

    def classify(exc: BaseException):
        if isinstance(exc, RemoteEntryNotFoundError):
            raise BadInputError(f"{label}: the repo has no {path} (is it a transformers "
                                "model?)") from None
        return errors.classify(exc)

    body = retry.call(lambda: hub.read_small_file(repo.repo_id, path, token),
                      f"fetch {path} of {repo.repo_id}", classify=classify)
    try:
        cfg = json.loads(body)
    except ValueError:
        raise BadInputError(f"{label}: {path} is not JSON") from None
    return _from_config(cfg, label, None)


def read(model: str) -> SizedModel:
    """The model ``model`` names (:data:`MODEL_FORMS`)."""
    text = (model or "").strip()
    if not text:
        raise BadInputError(f"--model is empty: give {MODEL_FORMS}")
    if "://" not in text:
        return _local(Path(text).expanduser(), text)
    uri = storage_uri.parse(text, "--model", MODEL_FORMS)
    if uri.scheme == "hf":
        return _hub(uri, text)
    if uri.scheme == "file":
        return _local(Path(uri.location), text)
    raise BadInputError(f"--model {text}: {uri.scheme}:// is not read here; give "
                        f"{MODEL_FORMS}")
