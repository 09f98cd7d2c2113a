"""Speed defaults a practitioner would pick, applied only where the user said nothing.

- packing: short samples waste most of each padded batch; packing them into
  ``max_seq_len`` sequences trains the same tokens in fewer steps. Only when the data is
  large enough to fill many packs (on a tiny set packing would leave a handful of steps).
- chunked cross-entropy: never materializes the full fp32 logits (vocab x sequence).
- fused AdamW on CUDA (one kernel per step, not one per tensor); not on CPU.
- torch.compile: an option (``compile=True``); off on CPU, where inductor's compile time
  dwarfs a short run.
"""

from __future__ import annotations

import importlib.util

from omegaconf import DictConfig, OmegaConf

CHUNKED_CE = "torchtune.modules.loss.CEWithChunkedOutputLoss"
_PLAIN_CE = ("torch.nn.CrossEntropyLoss", "torch.nn.modules.loss.CrossEntropyLoss")
# Mean characters per token of English under Llama/Qwen BPE: rough, and only decides
# whether samples are short.
CHARS_PER_TOKEN = 4.0
# Pack only if samples are this many times shorter than a pack...
SHORT_FACTOR = 4
# ...and the data fills at least this many optimizer steps' worth of packs.
MIN_PACKED_STEPS = 20


def _user_set(user_keys: set[str], key: str) -> bool:
    return any(k == key or k.startswith(key + ".") for k in user_keys)


def apply(cfg: DictConfig, user_keys: set[str], device: str, world_size: int,
          mean_chars: float | None, rows: int | None, max_seq_len: int) -> list[str]:
    notes: list[str] = []
    loss = cfg.get("loss")
    if isinstance(loss, DictConfig) and loss.get("_component_") in _PLAIN_CE \
            and not _user_set(user_keys, "loss"):
        cfg.loss = OmegaConf.create({"_component_": CHUNKED_CE})
        notes.append("speed: chunked cross-entropy (CEWithChunkedOutputLoss)")

    optimizer = cfg.get("optimizer")
    component = str(optimizer.get("_component_", "")) if isinstance(optimizer, DictConfig) else ""
    if component.startswith("bitsandbytes.") and (
            device == "cpu" or importlib.util.find_spec("bitsandbytes") is None) \
            and not {"optimizer", "optimizer._component_"} & user_keys:
        # torchtune's full single-device configs pick 8-bit paged AdamW: CUDA-only, and
        # bitsandbytes is not in our images.
        cfg.optimizer = OmegaConf.create({"_component_": "torch.optim.AdamW",
                                          "lr": optimizer.get("lr", 2e-5),
                                          "weight_decay": optimizer.get("weight_decay", 0.01)})
        optimizer = cfg.optimizer
        notes.append(f"optimizer {component} is unavailable here: using torch.optim.AdamW")
    if isinstance(optimizer, DictConfig) and "Adam" in str(optimizer.get("_component_", "")):
        if device.startswith("cuda"):
            if not _user_set(user_keys, "optimizer.fused") and not optimizer.get("fused"):
                optimizer.fused = True
                notes.append("speed: fused AdamW")
        elif optimizer.get("fused"):
            optimizer.fused = False  # a CUDA kernel

    if device == "cpu" and cfg.get("compile") and not _user_set(user_keys, "compile"):
        cfg.compile = False
        notes.append("speed: compile off on CPU (compile=True to force)")

    dataset = cfg.get("dataset")
    if (isinstance(dataset, DictConfig) and not _user_set(user_keys, "dataset.packed")
            and not dataset.get("packed") and mean_chars and rows):
        tokens_per_sample = mean_chars / CHARS_PER_TOKEN
        packs = rows * tokens_per_sample / max_seq_len
        steps = packs / max(1, int(cfg.get("batch_size") or 1) * world_size)
        if tokens_per_sample * SHORT_FACTOR <= max_seq_len and steps >= MIN_PACKED_STEPS:
            dataset.packed = True
            notes.append(f"speed: packing samples (~{tokens_per_sample:.0f} tokens each) into "
                         f"{max_seq_len}-token sequences (dataset.packed=False to turn off)")
    if isinstance(dataset, DictConfig) and dataset.get("packed") \
            and cfg.tokenizer.get("max_seq_len") is None:
        cfg.tokenizer.max_seq_len = max_seq_len  # packing needs a pack length
    return notes
