"""Chat data trains in the base model's own chat template, on every family we claim: the
trainer's ids for a conversation with a system prompt and several turns are the ids
transformers' ``apply_chat_template`` gives (a tokenizer and template shaped like each
instruct model's, tests/support/family_chat_templates.py), the prompt with
``add_generation_prompt`` renders their prefix, and only the answers (with the turn's end)
train. Rows a template refuses are dropped by reason; the plan says which format trains
and refuses, before any step, data no row of which the template accepts.

In-process for all eight families; tests/test_chat_template_training.py trains for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.support.family_chat_templates import FAMILY_TEMPLATES
from tests.support.tiny_tokenizers import TOKENIZERS, write_spm_tokenizer_json
from tests.test_chat_template import transformers_ids
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

FAMILIES = sorted(FAMILY_TEMPLATES)
CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 4 plus 4?"},
    {"role": "assistant", "content": "8"},
]
NO_SYSTEM = CONVERSATION[1:]


def write_tokenizer_dir(family: str, model_dir: Path) -> Path:
    """A tiny tokenizer of the family's kind with its instruct model's chat template."""
    kind, template, named, _ = FAMILY_TEMPLATES[family]
    model_dir.mkdir(parents=True, exist_ok=True)
    TOKENIZERS[kind](model_dir)
    if kind in ("spm", "phi3"):
        write_spm_tokenizer_json(model_dir, family)
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config.update(named, chat_template=template)
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if kind in ("spm", "phi3"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config))
    return model_dir


def conversation_of(family: str) -> list[dict]:
    # Gemma's template has no system turn (it raises on one).
    return NO_SYSTEM if family.startswith("gemma") else CONVERSATION


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: write_tokenizer_dir(family, root / family) for family in FAMILIES}


def transform(model_dir: Path, train_on_input: bool = False):
    from kubetune.chat_template.render import find_template
    from kubetune.trainer.data.chat_dataset import ChatTransform

    return ChatTransform(None, "messages", "openai", None, train_on_input, None,
                         find_template(model_dir).text, str(model_dir))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_trainer_feeds_the_ids_transformers_renders(family, tokenizer_dirs, serving_python,
                                                         tmp_path):
    model_dir = tokenizer_dirs[family]
    chat = conversation_of(family)
    fed = transform(model_dir)({"messages": chat})
    tokens, mask = fed["tokens"], fed["mask"]
    got = transformers_ids(serving_python, model_dir, [chat], tmp_path)["results"][0][0]
    prompt = got["prompt"]["ids"]
    assert tokens[:len(prompt)] == prompt, got["prompt"]["text"]
    if family == "mistral":
        # Mistral's template puts the system prompt in the last user turn only: a complete
        # conversation renders without it, so training feeds the prompt it answers.
        assert "You add numbers." not in got["whole"]["text"]
        answer = tokens[len(prompt):]
        assert got["whole"]["ids"][-len(answer):] == answer
    else:
        assert tokens == got["whole"]["ids"], got["whole"]["text"]
    encoder = transform(model_dir).template.encoder
    trained = encoder.decode([t for t, m in zip(tokens, mask) if not m])
    end_of_turn = FAMILY_TEMPLATES[family][3]
    assert trained.count(end_of_turn) == 2, trained
    for answer in ("5", "8"):
        assert answer in trained
    for prompt_text in ("What is", "You add", "user", "system"):
        assert prompt_text not in trained, trained


@pytest.mark.parametrize("family", FAMILIES)
def test_train_on_input_trains_every_turn(family, tokenizer_dirs):
    model_dir = tokenizer_dirs[family]
    fed = transform(model_dir, train_on_input=True)({"messages": conversation_of(family)})
    encoder = transform(model_dir).template.encoder
    trained = encoder.decode([t for t, m in zip(fed["tokens"], fed["mask"]) if not m])
    assert "What is 2 plus 3?" in trained and "And 4 plus 4?" in trained


@pytest.mark.parametrize("family", ["gemma", "gemma2"])
def test_a_system_turn_gemma_refuses_is_a_dropped_row_with_the_templates_reason(
        family, tokenizer_dirs):
    from kubetune.trainer.data.chat_messages import RowDropped
    from kubetune.trainer.data.token_cache.dropped import reason_of

    with pytest.raises(RowDropped) as raised:
        transform(tokenizer_dirs[family])({"messages": CONVERSATION})
    assert reason_of(raised.value, RowDropped) == (
        "a conversation the base model's chat template refuses (System role not supported)")


def test_qwen25_trains_its_default_system_prompt_where_the_row_has_none(tokenizer_dirs):
    model_dir = tokenizer_dirs["qwen2.5"]
    fed = transform(model_dir)({"messages": NO_SYSTEM})
    text = transform(model_dir).template.encoder.decode(fed["tokens"])
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")


# As the trainer plans a mode its variable set: the plan names the variable.
SET_BY = {"kubetune.chat_template": "KUBETUNE_CHAT_TEMPLATE"}


def _cfg(model_dir: Path, mode: str | None = None, tokenizer: str = "x.gemma_tokenizer"):
    from kubetune.trainer.data.dataset_shape import CHAT

    cfg = OmegaConf.create({
        "dataset": {"_component_": CHAT, "conversation_column": "messages",
                    "conversation_style": "openai"},
        "tokenizer": {"_component_": tokenizer}, "kubetune": {}})
    if mode:
        cfg.kubetune.chat_template = mode
    return cfg


class _Found:
    def __init__(self, rows: list[list[dict]]) -> None:
        self.rows = [{"messages": r} for r in rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_plan_trains_in_the_bases_template_by_default(family, tokenizer_dirs):
    from kubetune.trainer.planning import chat_template_plan

    cfg = _cfg(tokenizer_dirs[family])
    notes = chat_template_plan.plan(cfg, tokenizer_dirs[family],
                                    _Found([conversation_of(family)] * 3))
    assert cfg.dataset.chat_template == FAMILY_TEMPLATES[family][1]
    assert cfg.dataset.chat_template_dir == str(tokenizer_dirs[family])
    assert len(notes) == 1 and "the base model's own" in notes[0], notes
    assert "checked on 3 of 3 sampled row(s)" in notes[0]


def test_the_plan_refuses_before_any_step_data_the_template_refuses_entirely(tokenizer_dirs):
    from kubetune.errors import BadInputError
    from kubetune.trainer.planning import chat_template_plan

    with pytest.raises(BadInputError) as raised:
        chat_template_plan.plan(_cfg(tokenizer_dirs["gemma"]), tokenizer_dirs["gemma"],
                                _Found([CONVERSATION] * 2))
    assert "refuses every row sampled" in str(raised.value)
    assert "KUBETUNE_CHAT_TEMPLATE=torchtune" in str(raised.value)


def test_torchtune_asked_for_says_so_and_that_the_export_carries_no_template(tokenizer_dirs):
    from kubetune.trainer.planning import chat_template_plan

    cfg = _cfg(tokenizer_dirs["gemma"], "torchtune")
    notes = chat_template_plan.plan(cfg, tokenizer_dirs["gemma"], _Found([NO_SYSTEM]), SET_BY)
    assert "chat_template" not in cfg.dataset
    assert "KUBETUNE_CHAT_TEMPLATE=torchtune" in notes[0]
    assert "the export will carry no chat template" in notes[1]


def test_base_asked_for_without_a_template_is_one_line(tmp_path):
    from kubetune.errors import BadInputError
    from kubetune.trainer.planning import chat_template_plan

    with pytest.raises(BadInputError, match="^KUBETUNE_CHAT_TEMPLATE=base: .*has no chat "
                                            "template.*KUBETUNE_CHAT_TEMPLATE=torchtune"):
        chat_template_plan.plan(_cfg(tmp_path, "base"), tmp_path, None, SET_BY)
    # Set as a `tune run` override, it is named by its key (issue 53).
    with pytest.raises(BadInputError, match=r"^kubetune.chat_template=base: .*set "
                                            r"kubetune.chat_template=torchtune$"):
        chat_template_plan.plan(_cfg(tmp_path, "base"), tmp_path, None)
    with pytest.raises(BadInputError, match=r"^--chat-template bases is not one of base, "
                                            "torchtune$"):
        chat_template_plan.plan(_cfg(tmp_path, "bases"), tmp_path, None,
                                {"kubetune.chat_template": "--chat-template"})
    notes = chat_template_plan.plan(_cfg(tmp_path, tokenizer="x.qwen2_5_tokenizer"), tmp_path,
                                    None)
    assert notes == ["chat template: torchtune's format for qwen2_5_tokenizer (the base model "
                     "has no chat template)"]


def test_torchtunes_mistral_format_refusing_a_system_prompt_is_a_counted_reason():
    from torchtune.data import Message
    from torchtune.models.mistral import MistralChatTemplate

    from kubetune.trainer.data.token_cache.dropped import reason_of

    with pytest.raises(ValueError) as raised:
        MistralChatTemplate()([Message("system", "You add."), Message("user", "2+3?")])
    assert reason_of(raised.value).startswith("a system prompt, which torchtune's Mistral "
                                              "format has no place for")


def test_torchtune_asked_for_on_a_base_that_prompts_otherwise_is_one_65_before_launch(
        tokenizer_dirs):
    from kubetune.errors import BadInputError
    from kubetune.trainer.planning import chat_template_plan

    qwen = tokenizer_dirs["qwen2.5"]
    cfg = _cfg(qwen, "torchtune", tokenizer="torchtune.models.qwen2_5.qwen2_5_tokenizer")
    with pytest.raises(BadInputError) as raised:
        chat_template_plan.plan(cfg, qwen, _Found([NO_SYSTEM]), SET_BY)
    line = str(raised.value)
    assert "You are Qwen" in line and line.endswith("set KUBETUNE_CHAT_TEMPLATE=base"), line
    # With a system prompt Qwen2.5's template prompts as torchtune's ChatML does.
    notes = chat_template_plan.plan(cfg, qwen, _Found([CONVERSATION]), SET_BY)
    assert "KUBETUNE_CHAT_TEMPLATE=torchtune" in notes[0] and len(notes) == 1
