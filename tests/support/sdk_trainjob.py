"""TrainJob specs built by the real Kubeflow SDK (``kubeflow`` 0.5.0), from the same
functions `TrainerClient().train()` calls, so tests submit exactly what a user's
notebook would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_DEFAULT_LORA = {"lora_rank": 8, "lora_alpha": 16, "lora_attn_modules": ["q_proj", "v_proj"]}


def sdk_trainjob_spec(runtime_path: Path, dataset_uri: str = "hf://kubetune/tiny-addition",
                      dataset_preprocess_config: Any = "parquet",
                      model_uri: str = "hf://kubetune/tiny-llama3", epochs: int = 1,
                      batch_size: int = 16, peft: dict | None = _DEFAULT_LORA,
                      gpus: int = 1) -> dict:
    """The TrainJob spec of a BuiltinTrainer run on ``runtime_path`` (LoRA by default).

    ``peft``: the ``LoraConfig`` fields (None: a full fine-tune); ``gpus``: the SDK's
    ``resources_per_node`` GPU count, which picks the controller's recipe.

    ``dataset_preprocess_config``: a ``TorchTuneInstructDataset``, None (the SDK's
    default: the recipe config's own dataset), or "parquet" (``source=PARQUET,
    split="train"``). The SDK builds only hf:// and s3:// sources: callers swap in
    file:// ones with :func:`use_local_sources`; the trainer args it derived from the
    hub URI (``dataset.data_dir`` / ``data_files``) stay as the SDK wrote them.
    """
    from kubeflow.trainer import (BuiltinTrainer, HuggingFaceDatasetInitializer,
                                  HuggingFaceModelInitializer, Initializer, LoraConfig,
                                  TorchTuneConfig)
    from kubeflow.trainer.backends.kubernetes import utils
    from kubeflow.trainer.types.types import (DataFormat, Runtime, RuntimeKind,
                                              TorchTuneInstructDataset)
    from kubeflow_trainer_api import models

    if dataset_preprocess_config == "parquet":
        dataset_preprocess_config = TorchTuneInstructDataset(source=DataFormat.PARQUET,
                                                             split="train")
    cr = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(
        yaml.safe_load(Path(runtime_path).read_text()))
    runtime = Runtime(name=cr.metadata.name, kind=RuntimeKind(cr.kind),
                      trainer=utils.get_runtime_trainer(
                          cr.metadata.labels["trainer.kubeflow.org/framework"],
                          cr.spec.template.spec.replicated_jobs, cr.spec.ml_policy))
    initializer = Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri=dataset_uri),
                              model=HuggingFaceModelInitializer(storage_uri=model_uri))
    trainer = BuiltinTrainer(config=TorchTuneConfig(
        epochs=epochs, batch_size=batch_size, resources_per_node={"gpu": gpus},
        peft_config=LoraConfig(**peft) if peft is not None else None,
        dataset_preprocess_config=dataset_preprocess_config))
    return {"trainer": utils.get_trainer_cr_from_builtin_trainer(runtime, trainer, initializer)
            .to_dict(),
            "initializer": {"dataset": utils.get_dataset_initializer(initializer.dataset)
                            .to_dict(),
                            "model": utils.get_model_initializer(initializer.model).to_dict()}}


def use_local_sources(spec: dict, model_dir: Path, dataset_dir: Path) -> dict:
    spec["initializer"]["model"]["storageUri"] = f"file://{model_dir}"
    spec["initializer"]["dataset"]["storageUri"] = f"file://{dataset_dir}"
    return spec


def sdk_container_trainjob_spec(runtime_path: Path, model_uri: str, dataset_uri: str,
                                env: dict[str, str], resources_per_node: dict,
                                image: str = "ghcr.io/kubetune/trainer:0.1.0") -> dict:
    """The TrainJob spec `TrainerClient().train(runtime=..., initializer=...,
    trainer=CustomTrainerContainer(...))` submits, built by the SDK's own
    `_get_trainjob_spec` (given a Runtime object rather than a name, it needs no cluster)."""
    from kubeflow.trainer import (CustomTrainerContainer, HuggingFaceDatasetInitializer,
                                  HuggingFaceModelInitializer, Initializer)
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend

    spec = KubernetesBackend._get_trainjob_spec(
        None, runtime=sdk_runtime(runtime_path),
        initializer=Initializer(model=HuggingFaceModelInitializer(storage_uri=model_uri),
                                dataset=HuggingFaceDatasetInitializer(storage_uri=dataset_uri)),
        trainer=CustomTrainerContainer(image=image, resources_per_node=resources_per_node,
                                       env=env))
    spec = spec.to_dict()
    del spec["runtimeRef"]
    return spec


def sdk_runtime(runtime_path: Path):
    """The SDK's view of a runtime, as `TrainerClient().get_runtime()` builds it."""
    from kubeflow.trainer.backends.kubernetes import utils
    from kubeflow.trainer.types.types import Runtime, RuntimeKind
    from kubeflow_trainer_api import models

    cr = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(
        yaml.safe_load(Path(runtime_path).read_text()))
    return Runtime(name=cr.metadata.name, kind=RuntimeKind(cr.kind),
                   trainer=utils.get_runtime_trainer(
                       cr.metadata.labels["trainer.kubeflow.org/framework"],
                       cr.spec.template.spec.replicated_jobs, cr.spec.ml_policy))
