"""The tiny checkpoints tests/support/hf_checkpoint.py writes with transformers: the shapes
every family shares and each family's own config fields (plain data: the suite imports it
without transformers)."""

# The sizes every family shares. `small`: the least that shows a family's quirks. `nf4`:
# every attention and MLP projection a multiple of NF4's 64 x 256 blocks, so QLoRA can
# quantize it (kubetune refuses QLoRA on other shapes).
SHAPES = {
    "small": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512},
    "nf4": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 512},
}
# Llama 3.1+ RoPE scaling, as the real checkpoints carry it (3.1/3.3: factor 8; 3.2: 32).
LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# Each family's own config fields, the ones a loader can get wrong. "head_dim_factor":
# head_dim as a multiple of hidden_size / num_attention_heads (Qwen3 and Gemma set their
# own); "kv_heads" overrides the shape's; "nf4": values for the nf4 shape.
FAMILIES = {
    # Llama 3: plain RoPE, untied output.
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               {"rope_theta": 500_000.0, "tie_word_embeddings": False}),
    # Llama 3.1 / 3.3: llama3 RoPE scaling (factor 8), untied.
    "llama3.1": ("LlamaConfig", "LlamaForCausalLM",
                 {"rope_theta": 500_000.0, "tie_word_embeddings": False,
                  "rope_scaling": {**LLAMA3_ROPE, "factor": 8.0}}),
    # Llama 3.2 1B/3B: factor 32 and the output tied to the embeddings.
    "llama3.2": ("LlamaConfig", "LlamaForCausalLM",
                 {"rope_theta": 500_000.0, "tie_word_embeddings": True,
                  "rope_scaling": {**LLAMA3_ROPE, "factor": 32.0}}),
    # Mistral v0.3: llama-shaped with its own model_type; no sliding window.
    "mistral": ("MistralConfig", "MistralForCausalLM",
                {"rope_theta": 1_000_000.0, "sliding_window": None,
                 "tie_word_embeddings": False}),
    # Qwen2 / Qwen2.5 7B+: q/k/v biases come with the architecture; untied.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"rope_theta": 1_000_000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}),
    # Qwen2.5 0.5B-3B: tied.
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM",
                   {"rope_theta": 1_000_000.0, "tie_word_embeddings": True,
                    "rms_norm_eps": 1e-6}),
    # head_dim 1.5 x hidden / heads (3 x at nf4 shapes: k_proj whole NF4 blocks on each of
    # 2 processes); untied output; q/k norms come with the architecture.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              {"head_dim_factor": 1.5, "tie_word_embeddings": False,
               "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "nf4": {"head_dim_factor": 3}}),
    "qwen3-tied": ("Qwen3Config", "Qwen3ForCausalLM",
                   {"head_dim_factor": 2, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}),
    # Gemma: (1 + w) norms, GeLU-tanh, embeddings scaled by sqrt(hidden), head_dim of its
    # own (256 vs 3072 / 16 in 7B), one KV head (2B), always tied.
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              {"head_dim_factor": 2, "kv_heads": 1, "hidden_activation": "gelu_pytorch_tanh",
               "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}),
    # head_dim 2 x hidden / heads as in Gemma 2 (256 vs 2304/8); softcaps; alternating window.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim_factor": 2, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0, "sliding_window": 256,
                "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0,
                "bos_token_id": 2, "eos_token_id": 1}),
    # The config-built families (kubetune/model_family/families.py). Windows of 4 tokens
    # and a sliding layer beside a full one, so a sequence of 16 tells the layers apart.
    # Gemma 3: (1 + w) norms before and after each block, q/k norms per head, RoPE 1M on
    # full layers and 10k on sliding ones, query_pre_attn_scalar apart from head_dim.
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"head_dim_factor": 2, "sliding_window": 4, "query_pre_attn_scalar": 24,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0,
                     "bos_token_id": 2, "eos_token_id": 1}),
    # OLMo 2: norms after each block only, q/k norms over the whole projection.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              {"tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
               "eos_token_id": 2}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM",
              {"tie_word_embeddings": False, "sliding_window": 4, "pad_token_id": 0,
               "layer_types": ["sliding_attention", "full_attention"], "bos_token_id": 1,
               "eos_token_id": 2}),
    # Granite: embedding, attention, residual and logit multipliers.
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                {"embedding_multiplier": 12.0, "attention_multiplier": 0.0625,
                 "residual_multiplier": 0.22, "logits_scaling": 8.0,
                 "tie_word_embeddings": True}),
    # SmolLM3: every other layer without RoPE (NoPE).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                {"no_rope_layers": [1, 0], "tie_word_embeddings": True, "pad_token_id": 0,
                 "bos_token_id": 1, "eos_token_id": 2}),
    # StarCoder 2: LayerNorm with biases, a plain GeLU MLP (c_fc/c_proj), biases on every
    # projection, a window on every layer.
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM",
                   {"sliding_window": 4, "use_bias": True, "tie_word_embeddings": True,
                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM",
                  {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                   "tie_word_embeddings": False, "head_dim_factor": 1}),
    "helium": ("HeliumConfig", "HeliumForCausalLM",
               {"tie_word_embeddings": False, "head_dim_factor": 1, "pad_token_id": 0, "bos_token_id": 1,
                "eos_token_id": 2}),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM",
                 {"tie_word_embeddings": False, "attention_bias": True,
                  "attention_out_bias": False, "pad_token_id": 0, "bos_token_id": 1,
                  "eos_token_id": 2}),
    # Phi-3 / Phi-4: fused qkv_proj and gate_up_proj in HF, split in torchtune.
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             {"rope_theta": 10_000.0, "pad_token_id": 0, "bos_token_id": 1,
              "eos_token_id": 2, "sliding_window": None}),
}
