"""Checks that run before launch, so a bad job fails in one line in seconds rather than
with a traceback minutes into model loading. Each is cheap: no torch import, no model."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from kubetune.errors import BadInputError

# torchao's to_nf4 defaults (block_size=64, scaler_block_size=256): a weight quantizes only
# when its element count splits into whole blocks whose scalers split into whole blocks.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256


def nf4_quantizable(numel: int) -> bool:
    return numel % NF4_BLOCK == 0 and (numel // NF4_BLOCK) % NF4_SCALER_BLOCK == 0


def check_nf4(dims: dict) -> None:
    """QLoRA quantizes every attention and MLP projection: all must fit NF4's blocks."""
    d, heads, kv = dims["embed_dim"], dims["num_heads"], dims["num_kv_heads"]
    head_dim = dims.get("head_dim") or d // heads
    shapes = {
        "q_proj": (heads * head_dim, d), "k_proj": (kv * head_dim, d),
        "v_proj": (kv * head_dim, d), "output_proj": (d, heads * head_dim),
        "w1/w3 (gate/up)": (dims["intermediate_dim"], d),
        "w2 (down)": (d, dims["intermediate_dim"]),
    }
    bad = [f"{name} {rows}x{cols}" for name, (rows, cols) in shapes.items()
           if not nf4_quantizable(rows * cols)]
    if bad:
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
