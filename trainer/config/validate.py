"""Checks that run before launch, so a bad job fails in one line in seconds rather than
with a traceback minutes into model loading. Each is cheap: no torch import, no model."""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.redact import has_userinfo, strip_userinfo
from kubetune.staging import refuse_dangling_link
from kubetune.trainer.request.spelling import spelling
from kubetune.trainer.request.value_rules import VALUE_RULES, value_problem

# torchao's to_nf4 defaults (block_size=64, scaler_block_size=256): a weight quantizes only
# when its element count splits into whole blocks whose scalers split into whole blocks.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256


def nf4_quantizable(numel: int, rows: int = 0, processes: int = 1) -> bool:
    """Whether a ``rows`` x (numel / rows) weight quantizes to NF4 and, on ``processes``
    processes, splits into one NF4 shard per process (FSDP shards dim 0, and torchao
    splits each of the NF4 tensor's inner tensors, the per-256-block scale factors
    included, into that many equal parts)."""
    blocks = NF4_BLOCK * NF4_SCALER_BLOCK * processes
    return numel % blocks == 0 and rows % processes == 0


def check_nf4(dims: dict, processes: int = 1) -> None:
    """QLoRA quantizes every attention and MLP projection: all must fit NF4's blocks, and
    on several processes split into whole blocks per process."""
    d, heads, kv = dims["embed_dim"], dims["num_heads"], dims["num_kv_heads"]
    head_dim = dims.get("head_dim") or d // heads
    shapes = {
        "q_proj": (heads * head_dim, d), "k_proj": (kv * head_dim, d),
        "v_proj": (kv * head_dim, d), "output_proj": (d, heads * head_dim),
        "w1/w3 (gate/up)": (dims["intermediate_dim"], d),
        "w2 (down)": (d, dims["intermediate_dim"]),
    }
    bad = [f"{name} {rows}x{cols}" for name, (rows, cols) in shapes.items()
           if not nf4_quantizable(rows * cols, rows, processes)]
    if not bad:
        return
    if processes > 1 and not [n for n, (r, c) in shapes.items() if not nf4_quantizable(r * c)]:
        raise BadInputError(
            f"QLoRA cannot shard this model's NF4 weights over {processes} processes: each "
            f"projection's size must be a multiple of {NF4_BLOCK * NF4_SCALER_BLOCK} x "
            f"{processes} elements and its rows of {processes}, and {', '.join(bad)} are "
            "not; use 1 process, or method lora")
    raise BadInputError(
        f"QLoRA cannot quantize this model: NF4 needs every projection's size to be a "
        f"multiple of {NF4_BLOCK * NF4_SCALER_BLOCK} elements, and {', '.join(bad)} "
        "are not; use method lora (model.quantize_base=False)"
    )


def _readable(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{what} {path} is missing: the model directory must hold the "
                            "checkpoint's tokenizer files") from None
    except OSError as exc:
        raise BadInputError(f"{what} {path} is unreadable: {exc.strerror}") from None


def check_tokenizer(tok_cfg: DictConfig, pending: set[str] = frozenset()) -> None:
    """The tokenizer files exist, are readable and are the format the builder parses
    (``pending``: files the launcher writes itself at start)."""
    component = str(tok_cfg.get("_component_", ""))
    path = Path(str(tok_cfg.get("path") or tok_cfg.get("vocab_path")))  # phi4: vocab_path
    data = _readable(path, "tokenizer.path")
    if "llama3" in component:
        first = data.split(b"\n", 1)[0].split()
        try:
            if len(first) != 2:
                raise ValueError
            base64.b64decode(first[0], validate=True)
            int(first[1])
        except ValueError:
            raise BadInputError(f"tokenizer.path {path} is not a tiktoken BPE file "
                                "(lines of '<base64 token> <rank>'), which "
                                f"{component.rsplit('.', 1)[-1]} reads") from None
    elif "qwen" in component:
        try:
            json.loads(data)
        except ValueError:
            raise BadInputError(f"tokenizer.path {path} is not valid JSON (a vocab.json)") from None
        merges = tok_cfg.get("merges_file")
        if merges:
            _readable(Path(str(merges)), "tokenizer.merges_file")
    special = tok_cfg.get("special_tokens_path")
    if special and str(special) not in pending:
        try:
            tokens = json.loads(_readable(Path(str(special)), "tokenizer.special_tokens_path"))
            tokens["added_tokens"]
        except (ValueError, KeyError, TypeError):
            raise BadInputError(f"tokenizer.special_tokens_path {special} is not a tokenizer.json "
                                "with added_tokens") from None


def check_writable(output_dir: Path) -> None:
    """Create ``output_dir`` if needed and prove a file can be written there."""
    # A symlink to nothing would read as "File exists" from mkdir: name the link instead.
    refuse_dangling_link(output_dir, "output_dir")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        # A probe of its own: every node of a multi-node job probes the same shared
        # volume at once, and one node must not delete another's probe.
        fd, probe = tempfile.mkstemp(dir=output_dir, prefix=".kubetune-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BadInputError(f"output_dir {output_dir} is not writable ({exc.strerror}): mount "
                            "the volume read-write or set output_dir / --output-dir") from None


def check_values(cfg: DictConfig, spellings: dict[str, str] | None = None) -> None:
    """Every number a recipe reads is a number in its range, or the run fails here in one
    line instead of as a traceback in the recipe (or, for ``epochs=0``, as a run that
    trains nothing and is marked complete). The ranges are ``value_rules``' (the static
    check of a runtime's settings reads the same); ``spellings``: the option or variable
    that set a key, named instead of the key."""
    from omegaconf import OmegaConf

    for key, (kind, _, nullable) in VALUE_RULES.items():
        parent, _, leaf = key.rpartition(".")
        section = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(section, DictConfig) or leaf not in section:
            continue
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except Exception as exc:  # an interpolation that does not resolve
            raise BadInputError(f"{key}: {exc}".splitlines()[0]) from None
        if value is None:
            if nullable:
                continue
            raise BadInputError(f"{key} is empty: set {key}=<{kind}>")
        number, problem = value_problem(key, value)
        if problem is not None:
            said = spelling(spellings or {}, key)
            raise BadInputError(f"{said.assign(str(value))}: {problem}")
        if number != value:
            OmegaConf.update(cfg, key, number, merge=False)


def lora_widths(model_cfg: DictConfig, dims: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each kind of layer the LoRA config adapts, from the checkpoint's
    sizes: a rank above the smaller of the two adds parameters and learns nothing more."""
    d, heads, kv = dims["embed_dim"], dims["num_heads"], dims["num_kv_heads"]
    hd = int(dims.get("head_dim") or d // heads)
    shapes = {"q_proj": (d, heads * hd), "k_proj": (d, kv * hd), "v_proj": (d, kv * hd),
              "output_proj": (heads * hd, d)}
    adapted = {name: shapes[name] for name in (model_cfg.get("lora_attn_modules") or [])
               if name in shapes}
    if model_cfg.get("apply_lora_to_mlp"):
        ff = dims["intermediate_dim"]
        adapted.update({"w1": (d, ff), "w2": (ff, d), "w3": (d, ff)})
    if model_cfg.get("apply_lora_to_output") and dims.get("vocab_size"):
        adapted["output"] = (d, dims["vocab_size"])
    return adapted


def lora_rank_excess(model_cfg: DictConfig, dims: dict,
                     spellings: dict[str, str] | None = None) -> str | None:
    """Why ``model.lora_rank`` is larger than every adapted layer can use, or None; named
    as the user set it (``spellings``: --lora-rank, KUBETUNE_LORA_RANK), else by the key."""
    rank = model_cfg.get("lora_rank")
    adapted = lora_widths(model_cfg, dims)
    if not isinstance(rank, int) or not adapted:
        return None
    name, (fan_in, fan_out) = min(adapted.items(), key=lambda item: min(item[1]))
    width = min(fan_in, fan_out)
    if rank <= width:
        return None
    said = spelling(spellings or {}, "model.lora_rank")
    return (f"{said.assign(str(rank))} is larger than the model allows: {name} is "
            f"{fan_in}x{fan_out}, so a rank above {width} adds parameters and learns nothing "
            f"more: set {said.assign(str(width))} or less")


# How a full volume shows in a recipe's output: Python's OSError, safetensors' Rust
# error, torch.save's zip and stream writers (which do not say why a write failed: on some
# CPUs and paths only "unexpected pos" or "basic_ios::clear: iostream error" is printed).
_DISK_FULL = ("No space left on device", "[Errno 28]", "StorageFull")
_WRITE_FAILED = ("file write failed", "PytorchStreamWriter failed", "unexpected pos",
                 "iostream error")
# Below this a failed write is taken to be the full volume's doing.
_NEARLY_FULL_BYTES = 16 << 20


def check_volume(cause: str, output_dir: Path) -> None:
    """Turn the recipe's failure into exit 65 when the output volume filled up under it
    (while saving a checkpoint): a restart would fail the same way."""
    try:
        stats = os.statvfs(output_dir)
        free = stats.f_bavail * stats.f_frsize
    except OSError:
        free = None
    if not (any(sign in cause for sign in _DISK_FULL) or (
            any(sign in cause for sign in _WRITE_FAILED)
            and free is not None and free < _NEARLY_FULL_BYTES)):
        return
    room = f", {free / (1 << 20):.1f} MB free" if free is not None else ""
    raise BadInputError(f"output volume full ({output_dir}{room}): the recipe could not "
                        "write its checkpoint; enlarge the volume (PVC) or point output_dir "
                        "at a bigger one")


# torchtune's training dtypes (recipes refuse fp16) and devices.
DTYPES = ("bf16", "fp32")
_DEVICE = re.compile(r"^(cpu|cuda|xpu|npu|mps)(:\d+)?$")
LORA_ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")
_BOOL_KEYS = ("shuffle", "compile", "enable_activation_checkpointing",
              "enable_activation_offloading", "dataset.packed", "dataset.train_on_input",
              "model.apply_lora_to_mlp", "model.apply_lora_to_output", "model.use_dora",
              "model.quantize_base", "kubetune.merged_epochs", "save_adapter_weights_only")


# Leaf names of the keys that name a local file or directory (torchtune's and ours).
_PATH_LEAVES = ("path", "dir", "file", "files")


def check_paths(cfg: DictConfig) -> None:
    """A URL carrying a user or password where a local path belongs is refused: a logger
    or checkpointer would make a directory named after it, password included (pathlib
    turns ``http://u:pw@host/x`` into ``http:/u:pw@host/x``) and print it."""
    from omegaconf import OmegaConf

    def walk(node, prefix: str, leaf: str) -> None:
        # A list's items are named by the key that holds the list (data_files: [...]).
        items = node.items() if isinstance(node, dict) else ((i, v) for i, v in enumerate(node))
        for key, value in items:
            name = f"{prefix}{key}"
            kind = str(key).rsplit("_", 1)[-1] if isinstance(node, dict) else leaf
            if isinstance(value, (dict, list)):
                walk(value, f"{name}.", kind)
            elif isinstance(value, str) and kind in _PATH_LEAVES and has_userinfo(value):
                raise BadInputError(f"{name}={strip_userinfo(value)}: a URL with a user or "
                                    "password where a local path belongs; give a path "
                                    "(credentials go in the environment or a Secret)")

    walk(OmegaConf.to_container(cfg, resolve=False), "", "")


def check_choices(cfg: DictConfig) -> None:
    """Values picked from a fixed set: dtype, device, switches, LoRA's attention modules."""
    from omegaconf import ListConfig, OmegaConf

    dtype = cfg.get("dtype")
    if dtype is not None and str(dtype) not in DTYPES:
        raise BadInputError(f"dtype={dtype}: must be one of {', '.join(DTYPES)}")
    device = cfg.get("device")
    if device is not None and not _DEVICE.match(str(device)):
        raise BadInputError(f"device={device}: must be cpu or cuda (cuda:N)")
    for key in _BOOL_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not isinstance(value, bool):
            raise BadInputError(f"{key}={value}: must be True or False")
    modules = OmegaConf.select(cfg, "model.lora_attn_modules", default=None)
    if modules is not None:
        names = list(modules) if isinstance(modules, (list, ListConfig)) else [modules]
        bad = [str(m) for m in names if str(m) not in LORA_ATTN_MODULES]
        if bad or not names:
            raise BadInputError(f"model.lora_attn_modules=[{','.join(map(str, names))}]"
                                f": each must be one of {', '.join(LORA_ATTN_MODULES)} "
                                "(torchtune's names: o_proj is output_proj)")
