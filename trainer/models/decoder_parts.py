"""The pieces torchtune 0.6.1 lacks for a config-built decoder, each one small module over
torchtune's own (``kubetune.trainer.models.decoder`` assembles them):

- ``RotaryEmbedding``: rotate-half RoPE as Hugging Face computes it, with a partial rotary
  dimension and linear position scaling (torchtune's Qwen2 RoPE has neither);
- ``AttentionCall``: the attention call of one layer with a sliding window and an attention
  logit soft-cap, around torchtune's own call (SDPA, flex, or our per-document call);
- ``post_projected``: a projection (``nn.Linear`` or torchtune's LoRA/DoRA linear) whose
  output is normalised per head or as a whole, and/or scaled: q/k norms *before* RoPE as
  Qwen3, Gemma 3 and OLMo 2 have them (torchtune's ``q_norm`` runs after RoPE), and a
  query scale other than head_dim ** -0.5 (Gemma, Granite). The module keeps its class's
  parameters and names, so LoRA validation, merging, FSDP and PEFT's keys see nothing new;
- ``ScaledEmbedding``, ``Multiplier`` and ``post_logits``: embedding scale, residual
  multiplier, and a logit scale or final soft-cap on the output projection.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torchtune.modules import TiedLinear
from torchtune.modules.peft import DoRALinear, LoRALinear


class RotaryEmbedding(nn.Module):
    """RoPE in Hugging Face's rotate-half layout on the first ``rotary_dim`` of each head;
    positions divided by ``factor`` (linear scaling). Called as torchtune's RoPE modules
    are: ``[b, s, heads, head_dim]`` with optional ``input_pos`` ``[b, s]``."""

    def __init__(self, head_dim: int, rotary_dim: int, base: float, max_seq_len: int,
                 factor: float = 1.0) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, base
        self.max_seq_len, self.factor = max_seq_len, factor
        self.rope_init()

    def rope_init(self) -> None:
        # Called again by torchtune's recipes after a model built on the meta device.
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        inv_freq = 1.0 / (self.base ** exponent)
        positions = torch.arange(self.max_seq_len, dtype=torch.float32) / self.factor
        freqs = torch.outer(positions, inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        seq = x.shape[1]
        if input_pos is None:
            cos, sin = self.cos[:seq][None, :, None], self.sin[:seq][None, :, None]
        else:
            cos, sin = self.cos[input_pos][:, :, None], self.sin[input_pos][:, :, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        half = self.rotary_dim // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        out = rot * cos + rotated * sin
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


class AttentionCall:
    """One layer's attention: ``inner`` (the call torchtune chose) with the keys restricted
    to the last ``window`` positions up to each query (``kv > q - window``, as transformers
    masks sliding layers) and/or the scores soft-capped (``cap * tanh(s / cap)``, computed
    here since SDPA cannot). A query's own position is the last key its mask allows, which
    holds for the causal, block-causal (packed) and KV-cache masks torchtune builds."""

    def __init__(self, inner: Callable, window: int = 0, softcap: float = 0.0) -> None:
        self.inner, self.window, self.softcap = inner, window, softcap
        self._block_masks: tuple | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, dropout_p: float,
                 is_causal: bool) -> torch.Tensor:
        if _is_block_mask(mask):
            if self.softcap:
                raise ValueError("an attention logit soft-cap cannot run with flex attention's "
                                 "block mask: set dataset.packed false")
            return self.inner(q, k, v, mask=self._windowed_block_mask(mask),
                              dropout_p=dropout_p, is_causal=is_causal)
        if self.window and self.window < k.shape[-2]:
            # (A window as long as the keys changes nothing: the call stays as it was.)
            mask = self._windowed(mask, q.shape[-2], k.shape[-2], is_causal, q.device)
            # One mask per sequence, as torchtune's calls (and our per-document call,
            # which reads each sequence's documents from it) expect.
            mask = mask.expand(q.shape[0], -1, -1)
            is_causal = False
        if not self.softcap:
            return self.inner(q, k, v, mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is None and is_causal:
            mask = self._windowed(None, q.shape[-2], k.shape[-2], True, q.device, band=False)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        weights = nn.functional.dropout(weights, p=dropout_p, training=dropout_p > 0)
        return weights @ v

    def _windowed(self, mask, q_len: int, kv_len: int, is_causal: bool, device,
                  band: bool = True) -> torch.Tensor:
        keys = torch.arange(kv_len, device=device)
        if mask is None:
            queries = torch.arange(kv_len - q_len, kv_len, device=device)
            allowed = (keys[None] <= queries[:, None]) if is_causal else \
                torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
            allowed = allowed[None]
        else:
            allowed = mask
        if not band or not self.window:
            return allowed
        own = torch.where(allowed, keys, -1).amax(dim=-1, keepdim=True)
        return allowed & (keys > own - self.window)

    def _windowed_block_mask(self, mask):
        if not self.window:
            return mask
        if self._block_masks is not None and self._block_masks[0] is mask:
            return self._block_masks[1]
        from torch.nn.attention.flex_attention import and_masks, create_block_mask

        window = self.window

        def in_window(b, h, q_idx, kv_idx):
            return kv_idx > q_idx - window

        q_len, kv_len = mask.seq_lengths
        windowed = create_block_mask(and_masks(mask.mask_mod, in_window), B=None, H=None,
                                     Q_LEN=q_len, KV_LEN=kv_len, device=mask.kv_num_blocks.device)
        self._block_masks = (mask, windowed)
        return windowed


def _is_block_mask(mask) -> bool:
    return mask is not None and type(mask).__name__ == "BlockMask"


class _PostProjected:
    """Mixin: the projection's output normalised by ``norm`` (over groups of its size: one
    head, or the whole projection) and multiplied by ``multiplier``."""

    norm: nn.Module | None
    norm_size: int
    multiplier: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.norm is not None:
            out = self.norm(out.unflatten(-1, (-1, self.norm_size))).flatten(-2)
        if self.multiplier != 1.0:
            out = out * self.multiplier
        return out


class PostProjectedLinear(_PostProjected, nn.Linear):
    pass


class PostProjectedLoRALinear(_PostProjected, LoRALinear):
    pass


class PostProjectedDoRALinear(_PostProjected, DoRALinear):
    pass


_POST_PROJECTED = {nn.Linear: PostProjectedLinear, LoRALinear: PostProjectedLoRALinear,
                   DoRALinear: PostProjectedDoRALinear}


def post_projected(proj: nn.Module, norm: nn.Module | None, multiplier: float) -> nn.Module:
    """``proj`` as built, its output then normalised and scaled; unchanged where neither."""
    if norm is None and multiplier == 1.0:
        return proj
    proj.__class__ = _POST_PROJECTED[type(proj)]
    proj.norm = norm
    # Every norm kind here has one weight of its size: read once, not at each forward.
    proj.norm_size = next(norm.parameters()).shape[0] if norm is not None else 0
    proj.multiplier = multiplier
    return proj


class ScaledEmbedding(nn.Embedding):
    """Embeddings times ``scale`` in the weights' dtype (Gemma rounds sqrt(hidden) so)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = super().forward(tokens)
        return out * torch.tensor(self.scale, dtype=out.dtype, device=out.device)


class Multiplier(nn.Module):
    """A residual branch times a constant (Granite's residual_multiplier)."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.value


def _logits(out: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    if scale != 1.0:
        out = out * scale
    if cap:
        out = torch.tanh(out / cap) * cap
    return out


class _PostLogits:
    scale: float
    cap: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(super().forward(x), self.scale, self.cap)


class PostLogitsLinear(_PostLogits, nn.Linear):
    pass


class PostLogitsLoRALinear(_PostLogits, LoRALinear):
    pass


class PostLogitsDoRALinear(_PostLogits, DoRALinear):
    pass


class PostLogitsTiedLinear(TiedLinear):
    """torchtune's ``TiedLinear`` (a plain object, so the state dict holds the embedding
    once) with the logit scale and cap after it."""

    def __init__(self, tied_module: nn.Module, scale: float, cap: float) -> None:
        super().__init__(tied_module)
        self.scale, self.cap = scale, cap

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(super().__call__(x), self.scale, self.cap)


_POST_LOGITS = {nn.Linear: PostLogitsLinear, LoRALinear: PostLogitsLoRALinear,
                DoRALinear: PostLogitsDoRALinear}


def post_logits(output, scale: float, cap: float):
    """The output projection with ``scale`` and ``cap`` applied to its logits."""
    if scale == 1.0 and not cap:
        return output
    if isinstance(output, TiedLinear):
        return PostLogitsTiedLinear(output.tied_module, scale, cap)
    output.__class__ = _POST_LOGITS[type(output)]
    output.scale, output.cap = scale, cap
    return output
