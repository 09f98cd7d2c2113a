"""Speed defaults apply only where the user said nothing, and the MFU parameter count
matches a known model."""

from __future__ import annotations

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
    assert cfg.dataset.packed is True and cfg.tokenizer.max_seq_len == 2048
    assert cfg.loss._component_ == speed.CHUNKED_CE
    assert cfg.optimizer._component_ == "torch.optim.AdamW" and cfg.optimizer.lr == 2e-5
    assert cfg.compile is False
    assert any("packing" in n for n in notes)


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
        speed.apply(cfg, set(), "cpu", 1, mean_chars=mean_chars, rows=rows, max_seq_len=2048)
        assert not cfg.dataset.get("packed")


def test_fused_adamw_on_cuda():
    cfg = base_cfg()
    cfg.optimizer = {"_component_": "torch.optim.AdamW", "lr": 1e-4}
    speed.apply(cfg, set(), "cuda", 8, mean_chars=None, rows=None, max_seq_len=2048)
    assert cfg.optimizer.fused is True


def test_parameter_count_of_llama_3_2_1b():
    dims = {"embed_dim": 2048, "num_layers": 16, "vocab_size": 128256, "num_heads": 32,
            "num_kv_heads": 8, "intermediate_dim": 8192, "tie_word_embeddings": True}
    assert parameter_count(dims) == 1_235_814_400  # Hugging Face reports 1.24B
