"""An example model family for kubetune: ``model_type: acme_lm``, a decoder whose layers use
only features kubetune's table knows (docs/extending.md#a-model-family-of-your-own).

The row says what config.json does not: here RMSNorm before each block (Llama's), per-head
q/k norms before RoPE (Qwen3's), a gated SiLU MLP under Llama's names, and sliding-window
layers as ``layer_types`` lists them. Every other feature (biases, windows, RoPE per layer
type, multipliers, soft-caps) kubetune reads from config.json itself."""

from kubetune.model_family.families import FamilyRow

ROWS = [FamilyRow("acme_lm", qk_norm="head", rope_theta_default=1_000_000.0,
                  sliding_default="none")]
