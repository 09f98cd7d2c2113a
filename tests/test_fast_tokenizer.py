"""A checkpoint that ships only a Hugging Face ``tokenizer.json`` (most Llama-architecture
models on the hub: SmolLM, TinyLlama, fine-tunes) trains with it (issue 52 §2): the
special tokens are the ones transformers reads from tokenizer_config.json and
generation_config.json, conversations are rendered in the checkpoint's own chat template,
and a checkpoint with no tokenizer at all is one line naming what would do. In-process:
the tokenizer as the recipe builds it from the plan's component."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torchtune.config._utils import _get_component_from_path
from torchtune.data import Message

from kubetune.errors import BadInputError
from kubetune.trainer.checkpointing.checkpoint_model import (HF_TOKENIZER,
                                                             read_checkpoint_model)
from kubetune.trainer.data.chat_template_tokens import TemplateTokenizer

CHATML = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
          "{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
          "{% endif %}")
CHAT = [Message(role="user", content="2+2?", masked=True),
        Message(role="assistant", content="ANSWER: 4", masked=False)]


@pytest.fixture
def json_only(model_copy) -> Path:
    """The tiny Llama-3 without its tiktoken file: tokenizer.json and its configs only."""
    shutil.rmtree(model_copy / "original")
    return model_copy


def _edit(path: Path, **changes) -> None:
    found = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**found, **changes}))


def _built(model_dir: Path):
    tokenizer = read_checkpoint_model(model_dir).tokenizer
    assert tokenizer.component == HF_TOKENIZER
    return _get_component_from_path(tokenizer.component)(**tokenizer.args)


def test_special_tokens_come_from_tokenizer_config_and_generation_config(json_only):
    # A generation_config.json whose EOS list differs from the tokenizer's EOS: generation
    # stops at each of them (transformers' generate), the tokenizer's EOS ends a text.
    ids = {t["content"]: t["id"] for t in
           json.loads((json_only / "tokenizer.json").read_text())["added_tokens"]}
    _edit(json_only / "generation_config.json", eos_token_id=[ids["<|eot_id|>"],
                                                              ids["<|eom_id|>"]])
    tok = _built(json_only)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (
        ids["<|begin_of_text|>"], ids["<|end_of_text|>"], ids["<|finetune_right_pad_id|>"])
    assert tok.stop_tokens == [ids["<|end_of_text|>"], ids["<|eot_id|>"], ids["<|eom_id|>"]]
    # Its post-processor adds BOS, as transformers' encode does: torchtune's add_bos follows.
    assert tok.encode("hi") == [tok.bos_id, ord("h"), ord("i"), tok.eos_id]
    assert tok.encode("hi", add_bos=False, add_eos=False) == [ord("h"), ord("i")]
    assert tok.decode(tok.encode("hi")) == "hi"


def test_a_config_that_says_no_bos_adds_none(json_only):
    _edit(json_only / "tokenizer_config.json", add_bos_token=False)
    assert _built(json_only).encode("hi", add_eos=False) == [ord("h"), ord("i")]


def test_conversations_render_in_the_checkpoints_own_chat_template(json_only):
    (json_only / "chat_template.jinja").write_text(CHATML)
    tok = _built(json_only)
    tokens, mask = tok.tokenize_messages(CHAT)
    assert (tokens, mask) == TemplateTokenizer(CHATML, json_only, None).tokenize(CHAT)
    trained = [t for t, masked in zip(tokens, mask) if not masked]
    assert tok.decode(trained, skip_special_tokens=False) == "ANSWER: 4<|eot_id|>"
    # A prompt to answer (torchtune's generate: an empty answer, no end tokens).
    prompt, _ = tok.tokenize_messages(CHAT[:1] + [Message(role="assistant", content="")],
                                      add_end_tokens=False)
    assert tok.decode(prompt, skip_special_tokens=False) == (
        "<|start_header_id|>user<|end_header_id|>2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>")
    # tokenizer.max_seq_len cuts, as torchtune's tokenizers do.
    tok.max_seq_len = 5
    assert tok.tokenize_messages(CHAT)[0] == tokens[:5]


def test_without_a_template_messages_are_plain_text_between_bos_and_eos(json_only):
    tok = _built(json_only)
    assert tok.template is None
    tokens, mask = tok.tokenize_messages(CHAT)
    assert tokens == [tok.bos_id, *b"2+2?", *b"ANSWER: 4", tok.eos_id]
    assert mask == [True] * 5 + [False] * 10


def test_no_tokenizer_at_all_is_one_line_naming_what_would_do(json_only):
    (json_only / "tokenizer.json").unlink()
    with pytest.raises(BadInputError) as refused:
        read_checkpoint_model(json_only)
    message = str(refused.value)
    assert "original/tokenizer.model is missing" in message
    assert "sentencepiece tokenizer.model" in message and "tokenizer.json" in message
    assert "\n" not in message


def test_the_familys_own_tokenizer_stays_the_choice(model_copy):
    assert read_checkpoint_model(model_copy).tokenizer.component == \
        "torchtune.models.llama3.llama3_tokenizer"


def test_a_sentencepiece_only_llama_takes_llama2s_tokenizer(json_only):
    from tests.support.tiny_tokenizers import write_spm

    (json_only / "tokenizer.json").unlink()
    write_spm(json_only)
    assert read_checkpoint_model(json_only).tokenizer.component == \
        "torchtune.models.llama2.llama2_tokenizer"


def _dry_run(tmp_path: Path, model: Path, dataset: Path, *overrides: str):
    from tests.support.trainer import make_pvc, tune_run
    from tests.test_trainer_config_checks import RECIPE

    pvc = make_pvc(tmp_path / "pvc", model, dataset)
    return tune_run(pvc, *RECIPE, f"output_dir={pvc.output}",
                    f"checkpointer.checkpoint_dir={pvc.model}", *overrides, "--kubetune-dry-run")


def test_tokenizer_overrides_act_or_are_refused_in_one_line(json_only, tiny_dataset_dir,
                                                           tmp_path):
    # Issue 52: the plan rebuilt the tokenizer section and dropped what it did not know.
    other = tmp_path / "other-generation.json"
    other.write_text(json.dumps({"eos_token_id": [1, 2]}))
    acted = _dry_run(tmp_path / "a", json_only, tiny_dataset_dir,
                     f"tokenizer.generation_config_path={other}")
    assert acted.returncode == 0, acted.stderr[-2000:]
    assert f"  generation_config_path: {other}\n" in acted.stdout
    refused = _dry_run(tmp_path / "b", json_only, tiny_dataset_dir,
                       "tokenizer.special_tokens_path=/x.json")
    assert refused.returncode == 65, refused.stderr[-2000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "unknown key tokenizer.special_tokens_path" in errors[0]


def test_torchtunes_chat_format_is_refused_for_a_tokenizer_json_only_checkpoint(
        json_only, tmp_path):
    # torchtune has no format for it: asking for one would silently train the base's.
    from omegaconf import OmegaConf

    from kubetune.trainer.planning import chat_template_plan

    (json_only / "chat_template.jinja").write_text(CHATML)
    cfg = OmegaConf.create({
        "dataset": {"_component_": "kubetune.trainer.data.chat_dataset.chat_dataset"},
        "tokenizer": {"_component_": HF_TOKENIZER},
        "kubetune": {"chat_template": "torchtune"}})
    with pytest.raises(BadInputError, match="torchtune has no chat format"):
        chat_template_plan.plan(cfg, json_only, None)
