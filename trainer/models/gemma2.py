"""Gemma 2 on torchtune 0.6.1's own builders and checkpointer, with its two departures
from Hugging Face's Gemma 2 corrected (each moves logits by ~0.1 on a random tiny model,
more on real weights):

- the final logit soft-cap: torchtune's ``Gemma2FinalNorm`` caps the normalised hidden
  state *before* the output projection; Gemma 2 caps the logits *after* it;
- the feed-forward norms: torchtune's HF key table maps ``pre_feedforward_layernorm`` to
  the norm applied after the MLP (``mlp_scale``) and ``post_feedforward_layernorm`` to the
  one before it (``mlp_norm``); the layer applies ``mlp_norm`` first.

The builders wrap torchtune's (``gemma2``, ``lora_gemma2``, same arguments) and the
checkpointer is torchtune's GEMMA2 path with the key table corrected for each call.
"""

from __future__ import annotations

import torch
from torch import nn
from torchtune.models.gemma2 import _component_builders as tt
from torchtune.models.gemma2 import _convert_weights as gemma2_convert
from torchtune.modules import TransformerDecoder
from torchtune.training.checkpointing._checkpointer import FullModelHFCheckpointer

from kubetune.model_family.convert import GEMMA2_FEED_FORWARD_NORMS as FEED_FORWARD_NORMS
from kubetune.model_family.scoped import patched


class SoftCappedOutput:
    """The output projection with Gemma 2's final soft-cap on its logits. A plain object
    like torchtune's ``TiedLinear`` (Gemma 2 ties the output to the embedding), so the
    state dict and FSDP see the same modules."""

    def __init__(self, output, cap: float) -> None:
        self.output, self.cap = output, cap

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.output(x) / self.cap) * self.cap


def _cap_logits(model: TransformerDecoder) -> TransformerDecoder:
    cap = model.norm.capping_value
    model.norm.logit_capping = nn.Identity()
    model.output = SoftCappedOutput(model.output, cap)
    return model


def gemma2(**kwargs) -> TransformerDecoder:
    """torchtune's ``gemma2`` (same arguments), capping logits as Gemma 2 does."""
    return _cap_logits(tt.gemma2(**kwargs))


def lora_gemma2(*args, **kwargs) -> TransformerDecoder:
    """torchtune's ``lora_gemma2`` (same arguments), capping logits as Gemma 2 does."""
    return _cap_logits(tt.lora_gemma2(*args, **kwargs))


class Gemma2HFCheckpointer(FullModelHFCheckpointer):
    """torchtune's ``FullModelHFCheckpointer`` for GEMMA2, feed-forward norms mapped right."""

    def load_checkpoint(self):
        with patched(gemma2_convert, "_GEMMA2_FROM_HF", updates=FEED_FORWARD_NORMS):
            return super().load_checkpoint()

    def save_checkpoint(self, *args, **kwargs) -> None:
        with patched(gemma2_convert, "_GEMMA2_FROM_HF", updates=FEED_FORWARD_NORMS):
            return super().save_checkpoint(*args, **kwargs)
