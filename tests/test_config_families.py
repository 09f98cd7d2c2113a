"""Every family row of kubetune/model_family/families.py against transformers itself: a
tiny random checkpoint that transformers writes for the type gives the same logits
through our config-built decoder (fp32), and after two optimizer steps with LoRA, DoRA
and full fine-tuning the checkpointer's saves load back in transformers (the merged or
full model) and PEFT (the adapter on the base) with the logits our model gives.

Tolerance: tests/test_export_serving.py's TOLERANCE (1e-4 of the logits' scale). Both
sides sum the same float32 products, in other orders: the differences measured here were
0 to 5e-7; a feature read wrong (a window, a RoPE base, a multiplier, a norm's placement)
moves them past ten times the tolerance (test_a_feature_read_wrong_is_seen).

One serving process writes every checkpoint, one computes transformers' logits, one PEFT's;
the training and saving run in this process (a second or two a family and method).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import REPO
from tests.test_export_serving import TOLERANCE, serving_python  # noqa: F401 (fixture)

HF_CHECKPOINT = REPO / "tests/support/hf_checkpoint.py"
VOCAB = 320
METHODS = ("lora", "dora", "full")


def _serving(python: Path, *args: str) -> str:
    result = subprocess.run([str(python), str(HF_CHECKPOINT), *args], capture_output=True,
                            text=True, timeout=900,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _rows() -> list[str]:
    from kubetune.model_family import families

    return sorted({families.row_of(t).model_type for t in families.model_types()})


def _tokens() -> list[list[int]]:
    import torch

    # 16 positions: past every window of 4 the tiny configs set.
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3)).tolist()


def _load(model_dir: Path, method: str):
    """Our model and checkpointer for ``model_dir``, as the trainer resolves them."""
    from torchtune import training
    from torchtune.config._utils import _get_component_from_path

    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    checkpoint = read_checkpoint_model(model_dir)
    arch = checkpoint.architecture
    lora = {} if method == "full" else {
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True, "lora_rank": 4, "lora_alpha": 8,
        "use_dora": method == "dora"}
    model = _get_component_from_path(arch.component(lora=bool(lora)))(**lora, **arch.dims)
    checkpointer = _get_component_from_path(arch.checkpointer)(
        checkpoint_dir=str(model_dir), checkpoint_files=checkpoint.weight_files,
        model_type=arch.model_type, output_dir=str(model_dir.parent / f"out-{method}"))
    missing, unexpected = model.load_state_dict(
        checkpointer.load_checkpoint()[training.MODEL_KEY], strict=False)
    assert not unexpected and all("lora" in k or "magnitude" in k for k in missing), missing
    return model, checkpointer


def _train_and_save(model, checkpointer, method: str, tokens: list[list[int]]):
    """Two AdamW steps on ``tokens`` (every feature's gradient flows), then the save the
    recipe makes; returns our logits after training and the saved epoch directory."""
    import torch
    from torchtune import training
    from torchtune.modules.peft import (get_adapter_params, get_adapter_state_dict,
                                        get_merged_lora_ckpt, set_trainable_params)

    ids = torch.tensor(tokens)
    if method != "full":
        for module in model.modules():
            if hasattr(module, "initialize_dora_magnitude"):
                module.initialize_dora_magnitude()
        set_trainable_params(model, get_adapter_params(model))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-2)
    torch.manual_seed(0)
    for _ in range(2):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        ours = model(ids)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if method == "full":
        checkpointer.save_checkpoint({training.MODEL_KEY: state}, epoch=0)
    else:
        checkpointer.save_checkpoint({
            training.MODEL_KEY: get_merged_lora_ckpt(dict(state), rank=4, alpha=8),
            training.ADAPTER_KEY: get_adapter_state_dict(state),
            training.ADAPTER_CONFIG: {"r": 4, "lora_alpha": 8, "peft_type": "LORA",
                                      "use_dora": method == "dora",
                                      "target_modules": ["q_proj", "k_proj", "v_proj",
                                                         "output_proj", "w1", "w2", "w3"]}},
            epoch=0)
    return ours, Path(checkpointer._output_dir) / "epoch_0"


def _model_only(saved: Path) -> Path:
    """The saved model's files alone: transformers loads a directory holding an
    adapter_config.json as base + adapter (the base it names), not as the merged model."""
    dest = saved.with_name(saved.name + "-merged")
    shutil.copytree(saved, dest, ignore=shutil.ignore_patterns("adapter_*"))
    return dest


@pytest.fixture(scope="module")
def written(serving_python, tmp_path_factory) -> dict[str, Path]:
    from tests.support import tiny_tokenizers

    root = tmp_path_factory.mktemp("config-families")
    specs = [[name, str(root / name / "model"), VOCAB, "small"] for name in _rows()]
    (root / "specs.json").write_text(json.dumps(specs))
    _serving(serving_python, "write-many", str(root / "specs.json"))
    for name in _rows():
        tiny_tokenizers.write_bpe(root / name / "model", ())
    return {name: root / name / "model" for name in _rows()}


def test_every_row_has_a_transformers_checkpoint_here():
    from tests.support.hf_families import FAMILIES

    assert set(_rows()) <= set(FAMILIES), set(_rows()) - set(FAMILIES)


def _close(got, want) -> tuple[float, float]:
    scale = max(1.0, float(want.abs().max()))
    return float((got - want).abs().max()), TOLERANCE * scale


@pytest.mark.slow
def test_logits_then_lora_dora_full_saves_load_back_in_transformers_and_peft(
        written, serving_python, tmp_path):
    import torch

    from tests.support.torchtune_logits import logits

    tokens = _tokens()
    specs = tmp_path / "base.json"
    specs.write_text(json.dumps({"tokens": tokens, "dirs": [str(d) for d in written.values()]}))
    base = {k: torch.tensor(v) for k, v in
            json.loads(_serving(serving_python, "logits-many", str(specs))).items()}
    ours: dict[tuple[str, str], torch.Tensor] = {}
    saved: dict[tuple[str, str], Path] = {}
    for name, model_dir in written.items():
        diff, limit = _close(logits(model_dir, tokens), base[str(model_dir)])
        assert diff <= limit, f"{name}: base logits differ from transformers' by {diff}"
        for method in METHODS:
            torch.manual_seed(0)
            model, checkpointer = _load(model_dir, method)
            ours[name, method], saved[name, method] = _train_and_save(
                model, checkpointer, method, tokens)
    merged_dirs = {key: _model_only(d) for key, d in saved.items()}
    specs.write_text(json.dumps({"tokens": tokens,
                                 "dirs": [str(d) for d in merged_dirs.values()]}))
    merged = json.loads(_serving(serving_python, "logits-many", str(specs)))
    adapters = [[str(d), str(written[name])] for (name, method), d in saved.items()
                if method != "full"]
    specs.write_text(json.dumps({"tokens": tokens, "adapters": adapters}))
    peft = json.loads(_serving(serving_python, "peft-logits-many", str(specs)))
    for (name, method), directory in saved.items():
        got = ours[name, method]
        moved, _ = _close(got, base[str(written[name])])
        assert moved > 100 * TOLERANCE, f"{name} {method}: training left the logits as they were"
        diff, limit = _close(torch.tensor(merged[str(merged_dirs[name, method])]), got)
        assert diff <= limit, f"{name} {method}: transformers' load of the save differs by {diff}"
        if method != "full":
            diff, limit = _close(torch.tensor(peft[str(directory)]), got)
            assert diff <= limit, f"{name} {method}: PEFT's adapter on the base differs by {diff}"
            config = json.loads((directory / "adapter_config.json").read_text())
            assert config.get("use_dora", False) is (method == "dora")


@pytest.mark.slow
def test_a_feature_read_wrong_is_seen(written, serving_python, tmp_path):
    """The parity above can fail: each of these features, read wrong, moves the logits past
    ten times the tolerance."""
    import torch
    from safetensors.torch import load_file
    from torchtune.models.convert_weights import get_mapped_key

    from kubetune.model_family.architecture import decoder_family
    from kubetune.trainer.models.decoder import decoder

    tokens = _tokens()
    wrong = {"ministral": {"sliding_window": 0}, "gemma3_text": {"sliding_rope_base": 1e6},
             "smollm3": {"rope_layers": [1, 1]}, "granite": {"residual_multiplier": 1.0},
             "olmo2": {"placement": "sandwich"}, "starcoder2": {"sliding_window": 0},
             "gemma2": {"embed_scale": 1.0}}
    dirs = [str(written[n]) for n in wrong]
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"tokens": tokens, "dirs": dirs}))
    want = json.loads(_serving(serving_python, "logits-many", str(specs)))
    for name, change in wrong.items():
        config = json.loads((written[name] / "config.json").read_text())
        _, spec, keys = decoder_family(config)
        model = decoder(**{**spec, **change}).eval()
        state = load_file(written[name] / "model.safetensors")
        model.load_state_dict({get_mapped_key(k, keys): v for k, v in state.items()},
                              strict=False)
        with torch.no_grad():
            got = model(torch.tensor(tokens))
        diff, limit = _close(got, torch.tensor(want[str(written[name])]))
        assert diff > 10 * limit, f"{name} {change}: only {diff} from transformers' logits"


@pytest.mark.slow
@pytest.mark.parametrize("window", [4, 64])
def test_windows_hold_under_the_recipes_per_document_attention(written, serving_python, tmp_path,
                                                               window):
    """The recipe process builds its model after our CPU per-document attention is
    installed (trainer/recipe_process/document_attention.py): a batch of several sequences
    with a window shorter than them (4) and one longer (64, so the window changes nothing)
    gives transformers' logits there too. A window's mask once reached that call as one
    sequence's, and a batch of two was read as a pack of one."""
    import torch
    from safetensors.torch import load_file
    from torchtune.models.convert_weights import get_mapped_key
    from torchtune.modules import attention

    from kubetune.model_family.architecture import decoder_family
    from kubetune.trainer.models.decoder import decoder
    from kubetune.trainer.recipe_process import document_attention

    name = "gemma3_text"
    config = json.loads((written[name] / "config.json").read_text())
    config["sliding_window"] = window
    model_dir = tmp_path / "model"
    shutil.copytree(written[name], model_dir)
    (model_dir / "config.json").write_text(json.dumps(config))
    tokens = _tokens()
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"tokens": tokens, "dirs": [str(model_dir)]}))
    want = torch.tensor(json.loads(_serving(serving_python, "logits-many", str(specs)))[str(model_dir)])
    chooser = attention._sdpa_or_flex_attention
    try:
        assert document_attention.install()
        _, spec, keys = decoder_family(config)
        model = decoder(**spec).eval()
    finally:
        attention._sdpa_or_flex_attention = chooser
    state = load_file(model_dir / "model.safetensors")
    model.load_state_dict({get_mapped_key(k, keys): v for k, v in state.items()}, strict=False)
    with torch.no_grad():
        got = model(torch.tensor(tokens))
    diff, limit = _close(got, want)
    assert diff <= limit, f"window {window}: {diff} from transformers' logits"
