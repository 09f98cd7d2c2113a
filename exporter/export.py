"""The export flow: locate, build, verify, publish with the manifest as the commit."""

from __future__ import annotations

import errno
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from kubetune.exporter import (artifact, base_model, chat_format, export_manifest,
                               model_card, run_identity, verify)
from kubetune.chat_template.render import find_template
from kubetune.exporter.tokenizer_files import GENERATION_CONFIG_NAME
from kubetune.exporter.destination import open_destination
from kubetune.exporter.training_output import TrainingOutput, locate
from kubetune import env
from kubetune.phase_progress import PhaseProgress
from kubetune.errors import BadInputError
from kubetune.remote.trainjob_status import StatusReporter, transfer_metrics
from kubetune.workspace import ADAPTER_WEIGHTS_NAME, MODEL_CONFIG_NAME
from kubetune.workspace.initializer_manifest import InitializerManifest
from kubetune.workspace.model_files import read_config
from kubetune.workspace.training_samples import read_training_samples

log = logging.getLogger("exporter")


@dataclass(frozen=True)
class ExportRequest:
    output_dir: Path
    model_dir: Path
    dataset_dir: Path
    destination: str
    format: str | None = None
    revision: str | None = None
    verify_logits: bool = True
    # Base weights (as float32) above this skip the logits check; None: a quarter of
    # the memory available, since the check holds about four float32 copies.
    verify_max_bytes: int | None = None
    # check: the base's chat template must prompt as training did (torchtune's format is
    # written where the base has none); trained: torchtune's format always; base: unchecked.
    chat_template: str = "check"
    # last: the checkpoint the run ended with; best: the saved one with the lowest
    # validation loss.
    checkpoint: str = "last"


def _memory_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _float32_bytes(shapes: dict[str, list[int]]) -> int:
    total = 0
    for shape in shapes.values():
        count = 1
        for dim in shape:
            count *= dim
        total += 4 * count
    return total


def _verify(request: ExportRequest, training: TrainingOutput, tree: Path, fmt: str,
            base: dict) -> dict:
    """Structure always; logits when asked and the model fits. Returns what was checked.
    ``base``: the base model's name and revision (``base_model.source``)."""
    read_config(request.model_dir)  # a missing or broken base model is a one-line error
    base_files = base_model.weight_files(request.model_dir)
    base_shapes = verify.shapes_of(base_files)
    adapter_sub, merged_sub = artifact.subdirs(fmt)
    report: dict = {}
    adapter_file = (tree / adapter_sub / ADAPTER_WEIGHTS_NAME if adapter_sub is not None
                    else training.checkpoint_dir / ADAPTER_WEIGHTS_NAME)
    if adapter_sub is not None:
        pairs = verify.check_adapter(adapter_file, base_shapes)
        report["adapter_pairs"] = pairs
        log.info("adapter: %d LoRA pairs fit the base model's weights", pairs)
    if merged_sub is not None:
        exported = sorted((tree / merged_sub).glob("*.safetensors"))
        report["merged_tensors"] = verify.check_merged(exported, base_shapes)
        log.info("merged: %d tensors match the base model's names and shapes",
                 report["merged_tensors"])
    # The logits' reference is the trainer's own merge: one the exporter made from this
    # adapter (a checkpoint saved without one) would only agree with itself.
    merged_files = training.merged_shards()

    if adapter_sub is None:
        # The check vouches for the adapter a user will load; none is exported here.
        report["logits"] = "not applicable: no adapter exported"
    elif not request.verify_logits:
        report["logits"] = "skipped: turned off"
        log.warning("logits check turned off (KUBETUNE_EXPORT_VERIFY_LOGITS=0)")
    elif not merged_files:
        report["logits"] = "skipped: the checkpoint has no merged weights to compare with"
        log.warning("logits check skipped: %s", report["logits"])
    else:
        limit = request.verify_max_bytes
        limit = _memory_available() // 4 if limit is None else limit
        need = _float32_bytes(base_shapes)
        if need > limit:
            report["logits"] = (f"skipped: the base model takes {need / 1e9:.1f} GB as float32, "
                                f"over the {limit / 1e9:.1f} GB limit")
            log.warning("logits check %s (KUBETUNE_EXPORT_VERIFY_MAX_BYTES)", report["logits"])
        else:
            from kubetune.exporter import verify_logits

            config = artifact.adapter_config(training, base)
            result = verify_logits.check(request.model_dir / MODEL_CONFIG_NAME, base_files,
                                         adapter_file, config, merged_files,
                                         quantized_base=training.method == "qlora")
            report["logits"] = result.as_dict()
    return report


def export(request: ExportRequest) -> dict:
    """Export the completed run; return the manifest now at the destination."""
    training = locate(request.output_dir, request.checkpoint)
    fmt = request.format or artifact.default_format(training)
    if fmt not in artifact.FORMATS:
        raise BadInputError(f"EXPORT_FORMAT {fmt!r} is not one of {', '.join(artifact.FORMATS)}")
    if fmt != "merged" and not training.is_peft:
        raise BadInputError(f"EXPORT_FORMAT={fmt} asks for an adapter, but the run was a full "
                            "fine-tune (no adapter_model.safetensors): use EXPORT_FORMAT=merged")
    if request.chat_template not in chat_format.MODES:
        raise BadInputError(f"{env.EXPORT_CHAT_TEMPLATE} {request.chat_template!r} is not one "
                            f"of {', '.join(chat_format.MODES)}")
    # Before the destination is touched: a template that prompts the model otherwise than
    # it was trained fails the export here.
    chat = chat_format.decide(
        read_training_samples(training.output_dir, training.marker.fingerprint),
        request.model_dir, request.chat_template)
    destination = open_destination(request.destination, request.revision,
                                   Path(request.output_dir).resolve().parent)
    destination.check()
    # Each initializer's manifest, read once for the whole export.
    base = base_model.source(request.model_dir, InitializerManifest.read(request.model_dir))
    dataset = base_model.dataset_source(InitializerManifest.read(request.dataset_dir))
    adapter_sub, merged_sub = artifact.subdirs(fmt)
    stages = 3 + (adapter_sub is not None) + (merged_sub is not None)
    with destination.build_dir() as tree, PhaseProgress("export", stages, "stages done",
                                                          log.info) as progress:
        stage = progress.stage
        try:
            if adapter_sub is not None:
                stage("writing the adapter")
                artifact.write_adapter(training, request.model_dir, base, tree / adapter_sub, chat)
            if merged_sub is not None:
                stage("writing the merged model")
                artifact.write_merged(training, request.model_dir, tree / merged_sub, chat)
            stage("hashing the files")
            _write_card(request, training, fmt, base, dataset, tree)
            metrics = training.summary()
            result = export_manifest.build(
                tree, fmt=fmt, base_model=base, dataset=dataset,
                training_config=training.config_text(), metrics=metrics,
                checkpoint=training.checkpoint, verification={},
                checkpoint_by=training.chosen.by if training.chosen else None,
                checkpoint_val_loss=training.chosen.val_loss if training.chosen else None,
                identity=run_identity.manifest_fields(metrics, training.method))
            previous = destination.read_manifest()
            if export_manifest.same_export(previous, result):
                log.info("%s already holds this export (manifest matches): nothing to upload",
                         destination.description)
                return previous
            stage("verifying")
            result["verification"] = {**chat.report, **_verify(request, training, tree, fmt, base)}
            stage("publishing")
            destination.publish(tree, result, previous)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # The build tree goes with its context: nothing half-written is left to be taken
            # as an export.
            free = shutil.disk_usage(tree if tree.exists() else tree.parent).free
            raise BadInputError(f"no space left on the volume of {tree} while writing the export "
                                f"({free / 1e6:.1f} MB free): enlarge that volume or export "
                                f"elsewhere with {env.EXPORT_URI}") from None
    log.info("exported %s to %s", fmt, destination.description)
    _report_status(result)
    return result


def _write_card(request: ExportRequest, training: TrainingOutput, fmt: str, base: dict,
                dataset: dict, tree: Path) -> None:
    """The model card (README.md), with the run's report and curves carried beside it."""
    adapter_sub, merged_sub = artifact.subdirs(fmt)
    carried = training.carry_report(tree)
    # The files the card's snippet loads the tokenizer from.
    loaded = tree / (adapter_sub if adapter_sub is not None else merged_sub)
    (tree / "README.md").write_text(model_card.render(
        fmt, base, dataset, training.summary(), adapter_sub, merged_sub, training.method,
        config=training.config(),
        model_dir=request.model_dir, curves=carried.get("curves"),
        report=carried.get("report"), destination=request.destination,
        checkpoint=training.chosen,
        target_modules=(artifact.adapter_config(training, base).get("target_modules")
                        if training.is_peft else None),
        chat_template=find_template(loaded) is not None,
        generation_config=(loaded / GENERATION_CONFIG_NAME).is_file()))


def _report_status(result: dict) -> None:
    """Where the TrainJob status endpoint is injected: the export's files and bytes."""
    status = StatusReporter.from_env(source="exporter")
    if status is not None:
        files = result.get("files") or []
        size = sum(int(f.get("size") or 0) for f in files)
        status.finish(None, None, transfer_metrics("exporter", size, size, len(files),
                                                   len(files)))
