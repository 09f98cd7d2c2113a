"""Which chat template the export carries, checked against how the model was trained.

The trainer recorded a few training conversations with the token ids torchtune fed the
model (``kubetune.workspace.training_samples``). A template must render each one's prompt
(every message before the final answer, with ``add_generation_prompt``) to exactly the
ids the answer followed in training: anything else prompts the model in a format it never
saw. Then:

- the base model has a template: it is kept when it also renders the whole conversation
  as trained up to the end of the final answer, and ends that answer with a token
  generation stops at (torchtune appends an end-of-text token after the last turn that
  a base's template need not); otherwise the export fails, naming the first difference;
- the run trained in the base's own template (``chat_template`` in the samples): that
  template, checked the same way, is kept (or written, where the base's files now differ);
- the base has none: torchtune's format for the run's tokenizer (``torchtune_formats``) is
  written, after it reproduced every sample's ids exactly.

``--chat-template trained`` writes torchtune's format over a base's; ``base`` exports the
base's files unchecked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.chat_template.parity import answer_end_tokens
from kubetune.chat_template.parity import sample_problem as _sample_problem
from kubetune.chat_template import render as rendering
from kubetune.chat_template.torchtune_formats import known_tokenizers, trained_template
from kubetune.workspace.training_samples import TrainingSample, TrainingSamples

log = logging.getLogger("exporter")

MODES = ("check", "trained", "base")


@dataclass(frozen=True)
class ChatFormat:
    """What the export's tokenizer files get: a template to write (None: the base's files
    as they are), where, and the token ids generation must stop at."""

    template: str | None = None
    template_file: str = rendering.TOKENIZER_CONFIG
    stop_token_ids: list[int] = field(default_factory=list)
    report: dict = field(default_factory=dict)  # for the manifest's verification


def _first_problem(template: str, samples: TrainingSamples, encoder: rendering.TextTokenizer,
                   named: dict[str, str], exact: bool) -> str | None:
    stops = set(samples.stop_tokens.values())
    for number, sample in enumerate(_answered(samples), start=1):
        problem = _sample_problem(template, number, sample, encoder, named, stops, exact)
        if problem is not None:
            return problem
    return None


def _answered(samples: TrainingSamples) -> list[TrainingSample]:
    """Conversations that end with the assistant's answer: the ones a prompt is cut from."""
    return [s for s in samples.samples if s.messages and s.messages[-1]["role"] == "assistant"]


def _trained(samples: TrainingSamples) -> str | None:
    return trained_template(samples.tokenizer, samples.prompt_template, samples.bos_token,
                            samples.eos_token)


def _no_template_known(samples: TrainingSamples) -> str:
    tokenizer = samples.tokenizer.rsplit(".", 1)[-1]
    if samples.prompt_template is not None:
        return (f"the run formatted its conversations with the prompt template "
                f"{samples.prompt_template.rsplit('.', 1)[-1]}, which has no chat template here")
    return (f"no chat template is known for torchtune's {tokenizer} (known: "
            f"{', '.join(known_tokenizers())})")


def _encoder(model_dir: Path) -> tuple[rendering.TextTokenizer | None, str]:
    """The base's tokenizer.json as transformers encodes with it, or why there is none."""
    if not (model_dir / rendering.TOKENIZER_JSON).is_file():
        return None, f"the base model has no {rendering.TOKENIZER_JSON} to tokenize it with"
    try:
        return rendering.TextTokenizer(model_dir), ""
    except Exception as exc:  # the tokenizers library's own error: one that holds only
        # the special tokens (what torchtune reads) is no tokenizer to encode with
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"the base model's {rendering.TOKENIZER_JSON} does not load ({first})"


def _with_answer_ends(stops: list[int], template: str, answered: list[TrainingSample],
                      encoder: rendering.TextTokenizer, named: dict[str, str]) -> list[int]:
    """``stops`` and the tokens ``template`` ends an answer with: torchtune's tokenizer
    knows only its own format's (Gemma's has its eos alone), the template its own."""
    return sorted(set(stops) | answer_end_tokens(template, [s.messages for s in answered],
                                                 encoder, named))


def decide(samples: TrainingSamples | None, model_dir: Path, mode: str = "check") -> ChatFormat:
    """The chat template and stop tokens the export carries (``model_dir``: the base model's
    tokenizer files); a base template that prompts otherwise than training is exit 65."""
    model_dir = Path(model_dir)
    base = rendering.find_template(model_dir)
    stops = sorted(set(samples.stop_tokens.values())) if samples else []
    where = base.where if base else rendering.TOKENIZER_CONFIG
    if mode == "base":
        return ChatFormat(None, where, stops, {
            "chat_template": f"the base model's files, not checked ({env.EXPORT_CHAT_TEMPLATE}"
                             "=base)"})
    answered = _answered(samples) if samples else []
    if not answered:
        if mode == "trained":
            raise BadInputError(f"{env.EXPORT_CHAT_TEMPLATE}=trained: the run recorded no "
                                "conversation to write a chat template for (a text-completion "
                                "dataset has no chat format): leave it at check")
        reason = "the run recorded no conversation (text-completion data, or an older trainer)"
        return ChatFormat(None, where, stops, {"chat_template": f"not checked: {reason}"})
    encoder, reason = _encoder(model_dir)
    if encoder is None:
        log.warning("chat template not checked: %s", reason)
        return ChatFormat(None, where, stops, {"chat_template": f"not checked: {reason}"})
    named = rendering.named_tokens(model_dir)
    recorded = samples.chat_template
    if recorded is not None and mode != "trained" and (base is None or base.text != recorded):
        # The run trained in the base's template as it then was: that is what it answers in.
        problem = _first_problem(recorded, samples, encoder, named, exact=False)
        if problem is not None:
            raise BadInputError(f"the chat template the run trained in does not render its "
                                f"own training ids with this base model's tokenizer: {problem}")
        log.info("chat template: the one the run trained in (the base model's as the trainer "
                 "read it) written to %s, checked on %d sample(s)", where, len(answered))
        return ChatFormat(recorded, where, _with_answer_ends(stops, recorded, answered,
                                                             encoder, named), {
            "chat_template": f"trained in (the base's at training), checked on {len(answered)} "
                             "training sample(s)"})
    if base is not None and mode == "check":
        problem = _first_problem(base.text, samples, encoder, named, exact=False)
        if problem is None:
            log.info("chat template: the base model's (%s) prompts as training did on %d "
                     "sample(s)", base.where, len(answered))
            return ChatFormat(None, where, _with_answer_ends(stops, base.text, answered,
                                                             encoder, named), {
                "chat_template": f"base's ({base.where}), checked on {len(answered)} "
                                 "training sample(s)"})
        instead = ("replace it with the format the model was trained on: "
                   f"{env.EXPORT_CHAT_TEMPLATE}=trained (--chat-template trained)"
                   if _trained(samples) is not None else
                   f"train with data in the base template's format, or export it unchecked "
                   f"with {env.EXPORT_CHAT_TEMPLATE}=base")
        raise BadInputError(f"the base model's chat template ({base.where}) does not prompt "
                            f"the model as it was trained: {problem}; {instead}")
    return _torchtune_format(samples, base, where, stops, answered, encoder, named, mode)


def _torchtune_format(samples: TrainingSamples, base: rendering.FoundTemplate | None,
                      where: str, stops: list[int],
                      answered: list, encoder: rendering.TextTokenizer,
                      named: dict[str, str], mode: str) -> ChatFormat:
    """Where the base's own template is not the export's: torchtune's format for the run's
    tokenizer as a template, written only if it reproduces every checked sample exactly."""
    template = _trained(samples)
    if template is None:
        reason = _no_template_known(samples)
        if mode == "trained":
            raise BadInputError(f"{env.EXPORT_CHAT_TEMPLATE}=trained: {reason}")
        log.warning("no chat template written (the base model has none): %s", reason)
        return ChatFormat(None, where, stops, {"chat_template": f"none: {reason}"})
    problem = _first_problem(template, samples, encoder, named, exact=True)
    if problem is not None:
        # torchtune's format as written here does not reproduce this run: never ship it.
        if mode == "trained":
            raise BadInputError(f"{env.EXPORT_CHAT_TEMPLATE}=trained: torchtune's format as a "
                                f"chat template does not reproduce this run: {problem}")
        log.warning("no chat template written (the base model has none): torchtune's format "
                    "does not reproduce this run: %s", problem)
        return ChatFormat(None, where, stops, {"chat_template": f"none: {problem}"})
    log.info("chat template: torchtune's %s format written to %s (the base model %s); it "
             "reproduces the %d training sample(s) checked token for token",
             samples.tokenizer.rsplit(".", 1)[-1], where,
             "had another" if base is not None else "has none", len(answered))
    return ChatFormat(template, where, stops, {
        "chat_template": f"trained ({samples.tokenizer.rsplit('.', 1)[-1]}), reproduces "
                         f"{len(answered)} training sample(s) exactly"})
