"""Plan a training run (one merged config) and run torchtune's recipe on it."""

from __future__ import annotations

import collections
import json
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError, KubetuneError
from kubetune.workspace import COMPLETION_MARKER_NAME, Workspace
from trainer import dataset_location, hardware
from trainer.checkpoint_model import LORA_KEYS, read_checkpoint_model
from trainer.metric_logger import METRICS_NAME, read_metrics
from trainer.recipe_config import apply_overrides, load_config, resolve_recipe
from trainer.tune_command import TuneRunRequest

log = logging.getLogger("trainer")

MERGED_CONFIG_NAME = "kubetune-config.yaml"
SUMMARY_NAME = "summary.json"

# Variables that keep every library in the recipe process off the network.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class RunPlan:
    request: TuneRunRequest
    cfg: DictConfig
    recipe_path: Path
    distributed: bool
    notes: list[str] = field(default_factory=list)

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    def command(self, config_path: Path) -> list[str]:
        if self.distributed:
            torchrun = list(self.request.torchrun_args)
            if not any(a.startswith("--rdzv") or a == "--standalone" for a in torchrun):
                torchrun.append("--standalone")  # as `tune run` does without an endpoint
            return [sys.executable, "-m", "torch.distributed.run", *torchrun,
                    str(self.recipe_path), "--config", str(config_path)]
        return [sys.executable, str(self.recipe_path), "--config", str(config_path)]


def _is_lora(model_cfg: DictConfig) -> bool:
    return any(k in model_cfg for k in LORA_KEYS) or "lora" in str(model_cfg.get("_component_"))


def plan(request: TuneRunRequest, workspace: Workspace) -> RunPlan:
    recipe_path, supports_distributed = resolve_recipe(request.recipe)
    cfg = apply_overrides(load_config(request.config), request.overrides)
    notes: list[str] = []

    cfg.output_dir = str(cfg.get("output_dir") or workspace.output_dir)
    model_dir = Path(OmegaConf.select(cfg, "checkpointer.checkpoint_dir") or workspace.model_dir)
    checkpoint = read_checkpoint_model(model_dir)
    arch = checkpoint.architecture

    # The checkpoint wins over the config's fixed size: same LoRA settings, real dimensions.
    model_cfg = cfg.get("model") or OmegaConf.create({})
    lora = _is_lora(model_cfg)
    component = arch.component(lora)
    if model_cfg.get("_component_") != component:
        notes.append(f"model: config {request.config} names {model_cfg.get('_component_')}; "
                     f"the checkpoint's config.json is {arch.family} "
                     f"(layers={arch.dims['num_layers']}, dim={arch.dims['embed_dim']}): "
                     f"using {component}")
    new_model = {"_component_": component, **arch.dims}
    new_model.update({k: model_cfg[k] for k in LORA_KEYS if k in model_cfg})
    cfg.model = OmegaConf.create(new_model)

    ckpt_cfg = cfg.get("checkpointer") or OmegaConf.create({})
    ckpt_cfg._component_ = ckpt_cfg.get("_component_", "torchtune.training.FullModelHFCheckpointer")
    ckpt_cfg.checkpoint_dir = str(model_dir)
    ckpt_cfg.checkpoint_files = checkpoint.weight_files
    ckpt_cfg.model_type = arch.model_type
    ckpt_cfg.output_dir = "${output_dir}"
    cfg.checkpointer = ckpt_cfg

    tok_cfg = cfg.get("tokenizer") or OmegaConf.create({})
    tokenizer = checkpoint.tokenizer
    given = tok_cfg.get("path")
    if given and not Path(str(given)).is_file():
        raise BadInputError(f"tokenizer.path {given} does not exist: the model directory "
                            f"{model_dir} must hold the tokenizer files")
    new_tok = {"_component_": tokenizer.component, **tokenizer.args,
               "max_seq_len": tok_cfg.get("max_seq_len")}
    if given:
        new_tok["path"] = str(given)
    if tok_cfg.get("merges_file"):
        new_tok["merges_file"] = str(tok_cfg.merges_file)
    if tok_cfg.get("prompt_template"):
        new_tok["prompt_template"] = tok_cfg.prompt_template
    cfg.tokenizer = OmegaConf.create(new_tok)

    hw = hardware.choose(cfg.get("device"), cfg.get("dtype"))
    notes += hw.notes
    cfg.device, cfg.dtype = hw.device, hw.dtype
    if hw.device == "cpu":
        # Fused AdamW and CUDA memory statistics are GPU features.
        if "optimizer" in cfg and cfg.optimizer.get("fused"):
            cfg.optimizer.fused = False
        cfg.log_peak_memory_stats = False

    if "dataset" in cfg:
        notes += dataset_location.locate(cfg.dataset, workspace.dataset_dir)

    cfg.metric_logger = OmegaConf.create({
        "_component_": "trainer.metric_logger.JsonLinesMetricLogger",
        "log_dir": "${output_dir}",
    })
    distributed = "distributed" in Path(recipe_path).stem or bool(request.torchrun_args)
    if distributed and not supports_distributed:
        raise BadInputError(f"recipe {request.recipe} cannot run distributed; "
                            "drop the torchrun options")
    return RunPlan(request=request, cfg=cfg, recipe_path=Path(recipe_path),
                   distributed=distributed, notes=notes)


def _check_writable(output_dir: Path) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / ".kubetune-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInputError(f"output_dir {output_dir} is not writable: {exc.strerror}") from None


def _latest_epoch_dir(output_dir: Path) -> str | None:
    epochs = sorted((p for p in output_dir.glob("epoch_*") if p.name[6:].isdigit()),
                    key=lambda p: int(p.name[6:]))
    return epochs[-1].name if epochs else None


def summarize(output_dir: Path, wall_time_s: float, exit_reason: str) -> dict:
    metrics = [m for m in read_metrics(output_dir) if "loss" in m]
    tps = [m["tokens_per_second"] for m in metrics if "tokens_per_second" in m]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "steps": len(metrics),
        "first_loss": metrics[0]["loss"] if metrics else None,
        "last_loss": metrics[-1]["loss"] if metrics else None,
        "tokens_per_second": sum(tps) / len(tps) if tps else None,
        "wall_time_s": round(wall_time_s, 3),
        "peak_memory_bytes": peak_kib * 1024,
        "exit_reason": exit_reason,
        "checkpoint": _latest_epoch_dir(output_dir),
    }


def _stream(pipe, sink, tail: collections.deque) -> None:
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace")
        sink.write(line)
        sink.flush()
        if line.strip():
            tail.append(line.rstrip())


def _error_line(tail: collections.deque) -> str:
    """The exception line of the recipe's traceback, else its last line."""
    for line in reversed(tail):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return tail[-1] if tail else "the recipe exited without output"


def run(plan_: RunPlan, dry_run: bool = False) -> int:
    for note in plan_.notes:
        log.info(note)
    output_dir = plan_.output_dir
    config_path = output_dir / MERGED_CONFIG_NAME
    command = plan_.command(config_path)
    if dry_run:
        print(f"recipe: {plan_.request.recipe} ({plan_.recipe_path})")
        print("config:")
        print(OmegaConf.to_yaml(plan_.cfg), end="")
        print("command: " + " ".join(command))
        return 0

    _check_writable(output_dir)
    for stale in (output_dir / COMPLETION_MARKER_NAME, output_dir / METRICS_NAME,
                  output_dir / SUMMARY_NAME):
        stale.unlink(missing_ok=True)
    config_path.write_text(OmegaConf.to_yaml(plan_.cfg))
    log.info("launching: %s", " ".join(command))

    env = {**os.environ, **OFFLINE_ENV}
    if not sys.stdout.isatty():
        env["TQDM_DISABLE"] = "1"  # progress comes from our metric logger instead
    start = time.monotonic()
    tail: collections.deque = collections.deque(maxlen=200)
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    reader = threading.Thread(target=_stream, args=(child.stderr, sys.stderr, tail), daemon=True)
    reader.start()
    code = child.wait()
    reader.join()
    wall = time.monotonic() - start

    summary = summarize(output_dir, wall, "completed" if code == 0 else f"failed ({code})")
    (output_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2))
    if code != 0:
        raise KubetuneError(f"recipe {plan_.request.recipe} failed: {_error_line(tail)}")
    marker = {"checkpoint": summary["checkpoint"], "config": MERGED_CONFIG_NAME,
              "steps": summary["steps"], "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                        time.gmtime())}
    # Written last: the exporter trusts only an output_dir that has this marker.
    tmp = output_dir / (COMPLETION_MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2))
    os.replace(tmp, output_dir / COMPLETION_MARKER_NAME)
    log.info("done: %s steps, loss %s -> %s, checkpoint %s", summary["steps"],
             summary["first_loss"], summary["last_loss"], output_dir / str(summary["checkpoint"]))
    return 0
