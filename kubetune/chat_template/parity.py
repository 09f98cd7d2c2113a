"""The one rule a chat template must keep with training, checked by the trainer before its
first step and by the exporter on the run's recorded samples: the template renders a
conversation's prompt (every message before the final answer, with
``add_generation_prompt``) to exactly the ids the answer followed in training, and the
answer as trained, ended by a token generation stops at."""

from __future__ import annotations

import json

from kubetune.chat_template import render as rendering

_SHOWN_CHARS = 60  # of each side of a difference, in the error line


def _quote(text: str) -> str:
    shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"
    return json.dumps(shown, ensure_ascii=False)


def _difference(got: list[int], want: list[int], encoder: rendering.TextTokenizer,
                number: int, what: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    after = f" (after {_quote(encoder.decode(want[max(0, at - 6):at])[-_SHOWN_CHARS:])})" \
        if at else ""
    return (f"{what} of training sample {number} differs at token {at}{after}: the template "
            f"gives {_quote(encoder.decode(got[at:at + 24]) or '(nothing)')} where training had "
            f"{_quote(encoder.decode(want[at:at + 24]) or '(nothing)')}")


def _answer_end(tokens: list[int], start: int, stops: set[int]) -> int:
    """Where the final answer (from ``start``) ends in training: its first stop token."""
    return next((i for i in range(start, len(tokens)) if tokens[i] in stops), len(tokens))


def sample_problem(template: str, number: int, sample,
                    encoder: rendering.TextTokenizer, named: dict[str, str], stops: set[int],
                    exact: bool) -> str | None:
    import jinja2

    want = sample.tokens
    try:
        prompt = encoder.encode(rendering.render(template, sample.messages[:-1], True, named))
        whole = encoder.encode(rendering.render(template, sample.messages, False, named))
    except jinja2.TemplateError as exc:
        return f"the template fails on training sample {number}: {exc}"
    if want[:len(prompt)] != prompt:
        return _difference(prompt, want, encoder, number, "the prompt")
    if exact:
        return None if whole == want else _difference(whole, want, encoder, number,
                                                       "the whole conversation")
    if whole[:len(prompt)] != prompt and len(want) > len(prompt):
        # A template that renders a complete conversation otherwise than its prompt
        # (Mistral's moves the system prompt): the answer after the prompt is what counts.
        answer = want[len(prompt):]
        return None if whole[-len(answer):] == answer else _difference(
            whole[len(whole) - len(answer):], answer, encoder, number, "the final answer")
    end = _answer_end(want, len(prompt), stops)
    if whole[:end] != want[:end]:
        return _difference(whole, want, encoder, number, "the final answer")
    if end < len(want) and (len(whole) <= end or whole[end] not in stops):
        return (f"training sample {number}'s final answer ends with "
                f"{_quote(encoder.decode(want[end:end + 1]))} in training, but the template "
                f"ends it with {_quote(encoder.decode(whole[end:end + 8]))}, where generation "
                "would not stop")
    return None


def answer_end_tokens(template: str, conversations: list[list[dict[str, str]]],
                      encoder: rendering.TextTokenizer, named: dict[str, str]) -> set[int]:
    """The added tokens ``template`` writes after a final answer's text (Gemma's
    ``<end_of_turn>``, Phi-3's ``<|end|>``, ChatML's ``<|im_end|>``): a model trained in the
    template ends its answers with them, so generation stops at them. Read from the
    conversations that end with an answer; a template's tokens before the answer's text
    (Qwen3's thinking block) are not among them."""
    import jinja2

    added, found = encoder.added_ids(), set()
    for messages in conversations:
        content = messages[-1]["content"].strip() if messages and \
            messages[-1]["role"] == "assistant" else ""
        if not content:
            continue
        try:
            prompt = rendering.render(template, messages[:-1], True, named)
            whole = rendering.render(template, messages, False, named)
        except jinja2.TemplateError:
            continue
        tail = whole[len(prompt):] if whole.startswith(prompt) else whole
        at = tail.rfind(content)
        if at >= 0:
            found |= {i for i in encoder.encode(tail[at + len(content):]) if i in added}
    return found
