"""The export's model card (README.md), built with huggingface_hub's ModelCard and
ModelCardData, so the hub (and anything reading the card) finds base model, datasets,
library, licence and tags in its metadata; then what was trained, how, how it ended (with a
held-out set: the base model's, the best and the last validation loss, and which checkpoint
was exported), the loss curve, and how to load it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import ModelCard, ModelCardData

from kubetune import env, storage_uri
from kubetune.exporter import run_identity
from kubetune.workspace.model_files import original_repo_id

# The run's settings a reader compares runs by (keys of the merged torchtune config).
HYPERPARAMETERS = (
    ("epochs", "epochs"), ("max_steps_per_epoch", "max steps per epoch"),
    ("batch_size", "batch size"), ("gradient_accumulation_steps", "gradient accumulation"),
    ("optimizer.lr", "learning rate"), ("optimizer._component_", "optimizer"),
    ("lr_scheduler.num_warmup_steps", "warmup steps"), ("model.lora_rank", "LoRA rank"),
    ("model.lora_alpha", "LoRA alpha"), ("model.lora_dropout", "LoRA dropout"),
    ("model.use_dora", "DoRA"),
    ("model.quantize_base", "QLoRA (NF4 base)"), ("tokenizer.max_seq_len", "max sequence length"),
    ("dataset.packed", "packed"), ("dtype", "dtype"), ("seed", "seed"),
    # Saved as the recipe ran it (null resolved to the run's steps: saved_config.record_ran).
    ("run_val_every_n_steps", "evaluated every (optimizer steps)"),
)


METHODS = {"full": "full fine-tune", "lora": "LoRA", "dora": "DoRA", "qlora": "QLoRA"}


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def title(base_name: str | None, model_dir: Path | None, destination: str | None,
          method: str, kind: str = "fine-tune") -> str:
    """What the card is called: the base model's repo id (as the hub source or the
    initializer's ``original_repo_id`` names it), else the export's own name; never a path.
    ``kind``: what was done to it (``run_identity.title_kind``: "DPO fine-tune", ...)."""
    repo = hub_id(base_name) or hub_id(original_repo_id(model_dir) if model_dir else None)
    label = METHODS.get(method, method)
    if repo:
        return f"{repo.split('/')[-1]} ({label} {kind} of {repo})"
    where = storage_uri.export_destination(destination) if destination else None
    if isinstance(where, storage_uri.HubUri):
        name = where.repo_id.split("/")[-1]
    elif isinstance(where, storage_uri.S3Uri):
        name = where.prefix.rstrip("/").split("/")[-1] or where.bucket
    elif isinstance(where, storage_uri.FileUri):
        name = where.path.name
    else:
        name = "model"
    return f"{name} ({label} {kind})"


# The prompt of the card's example: a user's turn, nothing from the training data (a
# card may be public where the data is not).
EXAMPLE_PROMPT = "Hello! What can you do?"


def load_lines(destination: str | None, adapter_dir: str | None, merged_dir: str | None,
               base_name: str, chat_template: bool = False,
               generation_config: bool = False) -> list[str]:
    """The "Load it" snippet for where the export went: a hub repo loads by id, a local tree
    by its path, an S3 export is copied down first (transformers cannot read s3://). It
    loads the model and the export's tokenizer and generates once: through the chat
    template where the export has one (``chat_template``), from plain text otherwise.
    ``generation_config``: the export carries one (the stop tokens the run was trained
    with), which an adapter's base model does not know."""
    where = storage_uri.export_destination(destination) if destination else None
    pre: list[str] = []
    if isinstance(where, storage_uri.HubUri):
        ref = where.repo_id
    elif isinstance(where, storage_uri.S3Uri):
        ref = "./" + (where.prefix.rstrip("/").split("/")[-1] or where.bucket)
        pre = [f"# first: aws s3 sync {where.raw.rstrip('/')} {ref}"]
    elif isinstance(where, storage_uri.FileUri):
        ref = str(where.path)
    else:
        ref = "."
    lines = ["```python"] + pre
    generate = "output = model.generate(**inputs, max_new_tokens=64)"
    if adapter_dir is not None:
        sub = f', subfolder="{adapter_dir}"' if adapter_dir else ""
        lines += ["from peft import PeftModel",
                  "from transformers import AutoModelForCausalLM, AutoTokenizer"
                  + (", GenerationConfig" if generation_config else ""),
                  f"base = AutoModelForCausalLM.from_pretrained({json.dumps(base_name)})",
                  f"model = PeftModel.from_pretrained(base, {json.dumps(ref)}{sub})"]
        if generation_config:
            lines += [f"generation_config = GenerationConfig.from_pretrained({json.dumps(ref)}"
                      f"{sub})"]
            generate = ("output = model.generate(**inputs, generation_config=generation_config, "
                        "max_new_tokens=64)")
    else:
        sub = f', subfolder="{merged_dir}"' if merged_dir else ""
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer",
                  f"model = AutoModelForCausalLM.from_pretrained({json.dumps(ref)}{sub})"]
    lines += [f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(ref)}{sub})"]
    if chat_template:
        message = json.dumps({"role": "user", "content": EXAMPLE_PROMPT})
        lines += [f"messages = [{message}]",
                  "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
                  "return_dict=True, return_tensors=\"pt\")"]
    else:
        lines += [f"inputs = tokenizer({json.dumps(EXAMPLE_PROMPT)}, return_tensors=\"pt\")"]
    lines += [generate,
              "print(tokenizer.decode(output[0, inputs[\"input_ids\"].shape[1]:], "
              "skip_special_tokens=True))"]
    return lines + ["```"]


def hub_id(name: str | None) -> str | None:
    """A name the hub resolves (org/name), or None for a path or a URI."""
    if not name or name.startswith(("/", ".")) or "://" in name:
        return None
    parts = name.split("/")
    return name if len(parts) == 2 and all(parts) else None


def dataset_hub_id(source: str | None) -> str | None:
    if not source or not source.startswith("hf://"):
        return None
    return hub_id("/".join(source[len("hf://"):].split("/")[:2]))


def base_license(model_dir: Path | None) -> str | None:
    """The licence the base model's own card declares, if the initializer fetched it."""
    card = Path(model_dir) / "README.md" if model_dir else None
    if card is None or not card.is_file():
        return None
    try:
        return ModelCard.load(card).data.license
    except Exception:  # a card without metadata, or malformed: say nothing rather than guess
        return None


def _select(config: Mapping, dotted: str):
    value = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def validation_lines(validation: Mapping | None, checkpoint: Any = None) -> list[str]:
    """The held-out loss from the base model to the last step, and which saved checkpoint
    this export is (the run's last, or the one with the lowest validation loss)."""
    lines: list[str] = []
    v = validation or {}
    if v.get("base_val_loss") is not None or v.get("last_val_loss") is not None:
        held = f"split `{v['split']}`" if v.get("split") else (
            f"a {v['fraction']} fraction of the training split" if v.get("fraction")
            else "the config's `dataset_val`")
        lines.append(f"- validation loss (held out: {held}"
                     + (f", {v['rows']} rows" if v.get("rows") is not None else "") + "): "
                     f"base model {_loss(v.get('base_val_loss'))}, best "
                     f"{_loss(v.get('best_val_loss'))} at step {v.get('best_step')}, last "
                     f"{_loss(v.get('last_val_loss'))} at step {v.get('last_step')}")
    if checkpoint is not None:
        why = "the lowest validation loss" if checkpoint.by == "best" else "the run's last"
        loss = f", validation loss {checkpoint.val_loss:.4f}" \
            if checkpoint.val_loss is not None else ""
        step = f" at step {checkpoint.step}" if checkpoint.step is not None else ""
        lines.append(f"- exported checkpoint: `{checkpoint.name}` ({why}{step}{loss})")
    return lines


def _loss(value: Any) -> str:
    return "?" if value is None else f"{float(value):.4f}"


def on_kubeflow(environ: Mapping[str, str]) -> bool:
    """In a pod of a cluster, and not a `kubetune local` run."""
    return bool(environ.get(env.KUBERNETES_SERVICE_HOST)) and not environ.get(env.LOCAL_RUN)


HUB_TAGS = {"dpo": "dpo", "rso": "rso", "distill": "distillation"}


def card_data(fmt: str, base: dict, dataset: dict, adapter_dir: str | None, method: str,
              model_dir: Path | None, objective: str = "sft") -> ModelCardData:
    """``method``: the trainer's (full, lora, dora, qlora), from its completion marker;
    ``objective``: the run's (sft, dpo, rso, distill), from its summary."""
    tag = "full-fine-tune" if method == "full" else method
    # The hub's tag for what the run was (SFT has none: a fine-tune is the default).
    tags = ["kubetune", "torchtune", tag] + (
        [HUB_TAGS[objective]] if objective in HUB_TAGS else [])
    return ModelCardData(
        base_model=hub_id(base.get("name")),
        datasets=[d] if (d := dataset_hub_id(dataset.get("source"))) else None,
        library_name="peft" if adapter_dir is not None else "transformers",
        license=base_license(model_dir),
        pipeline_tag="text-generation",
        tags=tags,
    )


def render(fmt: str, base: dict, dataset: dict, metrics: dict, adapter_dir: str | None,
           merged_dir: str | None, method: str, config: Mapping | None = None,
           model_dir: Path | None = None, curves: str | None = None,
           report: str | None = None, environ: Mapping[str, str] | None = None,
           destination: str | None = None, target_modules: list[str] | None = None,
           chat_template: bool = False, generation_config: bool = False,
           checkpoint: Any = None) -> str:
    """``destination``: the export URI (the load snippet names it); ``target_modules``: the
    adapter's modules in Hugging Face names, as ``adapter_config.json`` lists them;
    ``chat_template`` / ``generation_config``: the export's tokenizer files have a chat
    template / it has a generation config (the snippet prompts and generates with them);
    ``checkpoint``: the exported checkpoint as chosen (``checkpoint_choice.ChosenCheckpoint``)."""
    config = config or {}
    # Where the card says it ran: Kubernetes' variable and `kubetune local`'s (on_kubeflow).
    environ = os.environ if environ is None else environ
    name = base.get("name") or "the base model"
    revision = base.get("revision")
    where = " on Kubeflow Trainer" if on_kubeflow(environ) else ""
    kind = run_identity.title_kind(metrics)
    lines = [
        f"# {title(base.get('name'), model_dir, destination, method, kind)}", "",
        f"Fine-tuned with kubetune from a torchtune run{where}; exported as {fmt}.", "",
        f"- method: {METHODS.get(method, method)}",
        *run_identity.card_lines(metrics),
        f"- base model: `{name}`" + (f" at revision `{revision}`" if revision else ""),
        f"- base model source: `{base.get('source')}`",
        f"- dataset: `{dataset.get('source')}`"
        + (f" at revision `{dataset['revision']}`" if dataset.get("revision") else ""),
    ]
    if target_modules:
        lines.append("- target modules: " + ", ".join(f"`{m}`" for m in target_modules))
    for key, label in (("steps", "steps"), ("first_loss", "first loss"),
                       ("last_loss", "final loss")):
        if metrics.get(key) is not None:
            lines.append(f"- {label}: {_fmt(metrics[key])}")
    lines += validation_lines(metrics.get("validation"), checkpoint)
    lines += run_identity.held_out_lines(metrics)
    if metrics.get("tokens_per_second"):
        device = metrics.get("gpu") or metrics.get("device")
        lines.append(f"- speed: {metrics['tokens_per_second']:.0f} tokens/s on {device} x "
                     f"{metrics.get('world_size')}")
    rows = [(label, _select(config, key)) for key, label in HYPERPARAMETERS]
    rows = [(label, value) for label, value in rows if value is not None]
    if rows:
        lines += ["", "## Training hyperparameters", "", "| setting | value |", "|---|---|"]
        lines += [f"| {label} | `{value}` |" for label, value in rows]
    if curves:
        lines += ["", "## Training curves", "", f"![loss and learning rate by step]({curves})"]
    if report:
        lines += ["", f"The run's own report: [{report}]({report})."]
    lines += ["", "`manifest.json` lists the sha256 of every file and the full training "
              "config.", "", "## Load it", ""]
    lines += load_lines(destination, adapter_dir, merged_dir, name, chat_template,
                        generation_config)
    lines += [""]
    data = card_data(fmt, base, dataset, adapter_dir, method, model_dir,
                     run_identity.objective(metrics))
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))
