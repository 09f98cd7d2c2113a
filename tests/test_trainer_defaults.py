"""Speed defaults apply only where the user said nothing, and the parameter count (MFU,
memory plan) matches known models of each family."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kubetune.trainer.performance import speed
from kubetune.trainer.metric_logging.summary import parameter_count


def base_cfg():
    return OmegaConf.create({
        "batch_size": 4, "compile": True,
        "loss": {"_component_": "torch.nn.CrossEntropyLoss"},
        "optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit", "lr": 2e-5},
        "dataset": {"_component_": "torchtune.datasets.instruct_dataset"},
        "tokenizer": {"max_seq_len": None},
    })


def test_cpu_defaults_on_a_large_set_of_short_samples():
    cfg = base_cfg()
    notes = speed.apply(cfg, set(), "cpu", 1, mean_chars=200, rows=50_000, max_seq_len=2048)
    # Packs attend densely on CPU (no flex attention): slower per token, so not by default,
    # and the note says why and how to pack anyway.
    assert not cfg.dataset.get("packed") and cfg.tokenizer.max_seq_len is None
    assert cfg.loss._component_ == speed.CHUNKED_CE
    assert cfg.optimizer._component_ == "torch.optim.AdamW" and cfg.optimizer.lr == 2e-5
    assert cfg.compile is False
    assert any(n.startswith("speed: not packing 50000 samples") and "dataset.packed=True" in n
               for n in notes)


def test_cuda_packs_a_large_set_of_short_samples():
    cfg = base_cfg()
    notes = speed.apply(cfg, set(), "cuda", 1, mean_chars=200, rows=50_000, max_seq_len=2048)
    assert cfg.dataset.packed is True and cfg.tokenizer.max_seq_len == 2048
    assert any(n.startswith("speed: packing 50000 samples") for n in notes)


def test_what_the_user_set_stays():
    cfg = base_cfg()
    user = {"dataset.packed", "loss", "optimizer._component_", "compile"}
    cfg.dataset.packed = False
    speed.apply(cfg, user, "cpu", 1, mean_chars=200, rows=50_000, max_seq_len=2048)
    assert cfg.dataset.packed is False and cfg.compile is True
    assert cfg.loss._component_ == "torch.nn.CrossEntropyLoss"
    assert cfg.optimizer._component_ == "bitsandbytes.optim.PagedAdamW8bit"


def test_no_packing_for_long_samples_or_a_small_set():
    for mean_chars, rows in ((6000, 50_000), (40, 500)):
        cfg = base_cfg()
        notes = speed.apply(cfg, set(), "cuda", 1, mean_chars=mean_chars, rows=rows,
                            max_seq_len=2048)
        assert not cfg.dataset.get("packed") and not any("packing" in n for n in notes)


def test_fused_adamw_on_cuda():
    cfg = base_cfg()
    cfg.optimizer = {"_component_": "torch.optim.AdamW", "lr": 1e-4}
    speed.apply(cfg, set(), "cuda", 8, mean_chars=None, rows=None, max_seq_len=2048)
    assert cfg.optimizer.fused is True


def test_parameter_count_of_llama_3_2_1b():
    dims = {"embed_dim": 2048, "num_layers": 16, "vocab_size": 128256, "num_heads": 32,
            "num_kv_heads": 8, "intermediate_dim": 8192, "tie_word_embeddings": True}
    assert parameter_count(dims) == 1_235_814_400  # Hugging Face reports 1.24B


# Each model's config.json fields that size it, and the parameter count its safetensors
# hold. The count comes from config.json alone (the trainer's memory plan and
# summary.json's MFU), so a family whose builder ties the output without saying so
# (Gemma) must not count its 256k-row embedding twice. Left out by design: Qwen3's q/k
# norms and Gemma 2's two extra norms per layer (thousands of parameters in billions).
REAL_CONFIGS = {
    "Qwen3-8B": ({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
                  "intermediate_size": 12288, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                  "tie_word_embeddings": False}, 8_190_735_360),
    "Qwen3-0.6B": ({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
                    "intermediate_size": 3072, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                    "tie_word_embeddings": True}, 596_049_920),
    "gemma-2-2b": ({"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304,
                    "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096}, 2_614_341_888),
    "Phi-3-mini-4k": ({"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
                       "intermediate_size": 8192, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32,
                       "max_position_embeddings": 4096}, 3_821_079_552),
    "phi-4": ({"model_type": "phi3", "vocab_size": 100352, "hidden_size": 5120,
               "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40,
               "num_key_value_heads": 10, "max_position_embeddings": 16384},
              14_659_507_200),
}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_parameter_count_of_the_model_in_the_checkpoint(name):
    from kubetune.model_family.architecture import architecture_of

    config, safetensors_total = REAL_CONFIGS[name]
    counted = parameter_count(architecture_of(config).shape)
    assert abs(counted - safetensors_total) <= 1e-4 * safetensors_total
