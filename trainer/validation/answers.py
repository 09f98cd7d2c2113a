"""Answers on held-out prompts: what a person reads before trusting the model.

For the first few held-out rows that hold an answer, the prompt is the row's tokens up to
its last answer, the reference is that answer, and the model answers the prompt greedily.
The prompt is cut from the tokens training fed, so it is the chat format the exporter
checks the export's template against (``kubetune.exporter.chat_format``): the base and the
tuned model are asked exactly as the exported model will be.

Where the answer starts: the row's last labelled span. torchtune's tokenizers label an
answer's header with it (Llama 3's ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``,
ChatML's ``<|im_start|>assistant\\n``), which a chat template's generation prompt holds, so
the header (found by tokenizing a probe conversation, ``answer_header``) goes with the
prompt; found inside the span, it also cuts a row trained on its input
(``train_on_input``) at the last answer. A row with nothing before its answer (text
completion) has no prompt and is passed over.

Every rank runs the same forwards: FSDP's collectives match only then. Rank 0's token is
broadcast at each step, so every rank stops at the same step, and each forward has one
shape, the longest prompt plus ``max_new_tokens`` (within the context), the rest right
padding (causal attention: later positions change nothing before them), so a compiled
model compiles once. The prompts are answered as one batch: no KV cache, the cost is at
most ``max_new_tokens`` forwards of ``prompts`` rows of that length, without gradients.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from kubetune import redact as redact_module
from kubetune.phase_progress import PhaseProgress
from kubetune.trainer.validation import budget
from kubetune.workspace import answers_record

log = logging.getLogger("trainer")

IGNORE_INDEX = -100  # torchtune's CROSS_ENTROPY_IGNORE_IDX, where a loss names none
PROMPTS = 3  # held-out prompts answered when the settings name no number
MAX_NEW_TOKENS = 64
# Rows looked at for prompts: text-completion data has none, and a lazily tokenized set
# would be tokenized whole to find that out.
SCANNED_AT_MOST = 256


@dataclass(frozen=True)
class HeldOutPrompt:
    prompt: list[int]
    reference: list[int]  # the row's answer, end tokens included


def _last_span(labels: Sequence[int], ignore_index: int) -> tuple[int, int] | None:
    end = next((i + 1 for i in range(len(labels) - 1, -1, -1) if labels[i] != ignore_index),
               None)
    if end is None:
        return None
    start = end - 1
    while start > 0 and labels[start - 1] != ignore_index:
        start -= 1
    return start, end


def _last_at(tokens: Sequence[int], part: Sequence[int], start: int, end: int) -> int | None:
    for at in range(end - len(part), start - 1, -1):
        if list(tokens[at:at + len(part)]) == list(part):
            return at
    return None


def split_row(tokens: Sequence[int], labels: Sequence[int], ignore_index: int = IGNORE_INDEX,
              header: Sequence[int] = ()) -> HeldOutPrompt | None:
    """A row's prompt and reference answer; None for a row without a label or without a
    prompt before its answer. ``header``: the tokens that open an answer (``answer_header``)."""
    span = _last_span(labels, ignore_index)
    if span is None:
        return None
    start, end = span
    cut = start
    if header:
        at = _last_at(tokens, header, start, end)
        if at is not None:
            cut = at + len(header)
    if cut == 0 or cut >= end:
        return None
    return HeldOutPrompt(prompt=[int(t) for t in tokens[:cut]],
                         reference=[int(t) for t in tokens[cut:end]])


def answer_header(tokenizer: Any) -> list[int]:
    """The labelled tokens an answer opens with, before its text: common to two answers of
    a probe conversation tokenized as training does. Empty where the tokenizer has no
    messages to tokenize (text only) or nothing opens an answer."""
    from torchtune.data import Message

    labelled = []
    for text in ("a", "b"):
        try:
            tokens, mask = tokenizer.tokenize_messages([
                Message(role="user", content="q", masked=True),
                Message(role="assistant", content=text, masked=False)])
        except Exception:  # a tokenizer of text alone, or one that wants other roles
            return []
        labelled.append([t for t, masked in zip(tokens, mask) if not masked])
    common = 0
    while common < min(map(len, labelled)) and labelled[0][common] == labelled[1][common]:
        common += 1
    return [int(t) for t in labelled[0][:common]]


def _row(dataset: Any, index: int) -> tuple[list[int], list[int]]:
    row = dataset[index]
    tokens, labels = list(row["tokens"]), list(row["labels"])
    lengths = row.get("seq_lens") if isinstance(row, Mapping) else None
    if lengths is not None and len(lengths):  # a pack: its first sample alone
        first = int(lengths[0])
        tokens, labels = tokens[:first], labels[:first]
    return [int(t) for t in tokens], [int(t) for t in labels]


def held_out_prompts(dataset: Any, prompts: int, ignore_index: int, header: Sequence[int],
                    context: int) -> list[HeldOutPrompt]:
    """The first ``prompts`` rows, in order, with a prompt that leaves room to answer
    (among the first ``SCANNED_AT_MOST``)."""
    found = []
    for index in range(min(len(dataset), SCANNED_AT_MOST)):
        if len(found) >= prompts:
            break
        split = split_row(*_row(dataset, index), ignore_index=ignore_index, header=header)
        if split is not None and len(split.prompt) < context:
            found.append(split)
    return found


def _context(recipe: Any) -> int:
    bounds = [getattr(recipe._tokenizer, "max_seq_len", None),
              getattr(recipe._model, "max_seq_len", None)]
    bounds = [int(b) for b in bounds if b]
    return min(bounds) if bounds else 2**31


def _stop_tokens(tokenizer: Any) -> set[int]:
    stops = getattr(tokenizer, "stop_tokens", None) or [getattr(tokenizer, "eos_id", None)]
    return {int(t) for t in stops if t is not None}


def _special_tokens(tokenizer: Any) -> set[int]:
    named = getattr(tokenizer, "special_tokens", None) or {}
    return {int(t) for t in named.values() if isinstance(t, int)} | _stop_tokens(tokenizer)


def _decode(tokenizer: Any, ids: list[int], *, keep_special: bool) -> str:
    if not keep_special:
        # Each tokenizer skips its own special tokens differently (Qwen's keep them by
        # default): drop them by id, so every family reads the same.
        special = _special_tokens(tokenizer)
        ids = [t for t in ids if t not in special]
    try:
        return _decode_all(tokenizer, ids, keep_special)
    except Exception:
        # A model's embedding often has rows past its tokenizer's vocabulary (padded to a
        # multiple; Phi-3's 32064 against 32011 pieces): a model that picks one answers
        # without it, as a tokenizer cannot spell it.
        return _decode_all(tokenizer, [t for t in ids if _spells(tokenizer, t)], keep_special)


def _decode_all(tokenizer: Any, ids: list[int], keep_special: bool) -> str:
    if keep_special and "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters:
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
    else:
        decoded = tokenizer.decode(ids)
    if isinstance(decoded, list):
        # torchtune 0.6.1's byte-level BPE (Phi-4's) decodes to its tokens' strings, in
        # GPT-2's byte alphabet: mapped back to bytes, then read as UTF-8.
        alphabet = getattr(getattr(tokenizer, "tokenizer_model", None), "byte_decoder", {})
        # Its special tokens decode to None there: their names, as other tokenizers write them.
        named = {v: k for k, v in (getattr(tokenizer, "special_tokens", None) or {}).items()}
        if len(decoded) == len(ids):
            decoded = [named.get(i, "") if p is None else p for i, p in zip(ids, decoded)]
        data = bytearray()
        for piece in decoded:
            for char in piece or "":
                byte = alphabet.get(char)
                data += bytes([byte]) if byte is not None else char.encode("utf-8")
        return data.decode("utf-8", errors="replace")
    return decoded


def _spells(tokenizer: Any, token: int) -> bool:
    try:
        tokenizer.decode([token])
        return True
    except Exception:
        return False


def _logits_at(output: Any, row: int, position: int) -> Any:
    """The logits at ``position`` of ``row``; a chunked output (the recipes'
    ``set_num_output_chunks``) is a list of pieces along the sequence."""
    if isinstance(output, (list, tuple)):
        for piece in output:
            if position < piece.shape[1]:
                return piece[row, position]
            position -= piece.shape[1]
        raise IndexError("position past the model's output")
    return output[row, position]


def _broadcast_from_first(tokens: Any) -> Any:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(tokens, src=0)
    return tokens


def greedy(model: Any, prompts: Sequence[list[int]], new_tokens: int, length: int,
           stops: set[int], device: Any, progress: Any = None) -> list[list[int]]:
    """Greedy continuations of ``prompts``, answered together (one forward per new token
    for all of them), each at most ``new_tokens`` tokens and ended before a stop token;
    every forward is ``len(prompts) x length`` tokens (right padded). ``progress`` (a
    ``PhaseProgress`` over ``new_tokens`` forwards) is advanced a forward at a time."""
    import torch

    # The padding is never attended to (it follows every position read): any id in the
    # vocabulary does, and 0 is in every one (a tokenizer's pad id need not be).
    sequence = torch.zeros((len(prompts), length), dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        sequence[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    positions = [len(p) for p in prompts]
    # A row answers until its stop token, its token budget or the end of the sequence.
    budgets = [min(new_tokens, length - len(p)) for p in prompts]
    answers: list[list[int]] = [[] for _ in prompts]
    active = [row for row in range(len(prompts)) if budgets[row] > 0]
    while active:
        output = model(sequence)
        if getattr(model, "output_hidden_states", None):  # hidden states first, logits last
            output = output[-1]
        chosen = torch.stack([_logits_at(output, row, positions[row] - 1).argmax()
                              for row in active]).to(torch.long)
        chosen = _broadcast_from_first(chosen).tolist()  # every rank goes on alike
        still = []
        for row, token in zip(active, chosen):
            if token in stops:
                continue
            answers[row].append(token)
            sequence[row, positions[row]] = token
            positions[row] += 1
            if len(answers[row]) < budgets[row]:
                still.append(row)
        active = still
        if progress is not None:
            progress.advance()
    return answers


def _device(recipe: Any) -> Any:
    device = getattr(recipe, "_device", None)
    return device if device is not None else next(recipe._model.parameters()).device


def answer(recipe: Any, heldout_dataset: Any, prompts: int, max_new_tokens: int,
           allowed: float | None = None, emit: Callable[[str], None] | None = None,
           which: str = "base") -> list[dict]:
    """The recipe's model's greedy answers to the first ``prompts`` held-out rows:
    ``[{"prompt", "reference", "answer"}]``, within ``allowed`` forward positions
    (``budget.fit_answers``). Every rank calls it (the same forwards run on all); all get
    the same answers. ``emit``: rank 0's log, for the cut and the progress lines."""
    tokenizer, model = recipe._tokenizer, recipe._model
    ignore_index = getattr(getattr(recipe, "_loss_fn", None), "ignore_index", IGNORE_INDEX)
    context = _context(recipe)
    asked = held_out_prompts(heldout_dataset, prompts, ignore_index, answer_header(tokenizer),
                            context) if prompts > 0 and max_new_tokens > 0 else []
    if not asked:
        return []
    kept, new_tokens = budget.fit_answers([len(a.prompt) for a in asked], max_new_tokens,
                                          context, allowed)
    if emit is not None and (kept, new_tokens) != (len(asked), max_new_tokens):
        emit(f"held-out answers ({which} model): {len(asked) - kept} of {len(asked)} cut, "
             f"the rest up to {new_tokens} new tokens (of {max_new_tokens}): answers are "
             f"bounded to about {budget.ANSWER_SHARE:.0%} of the run's compute")
    asked = asked[:kept]
    length = min(context, max(len(a.prompt) for a in asked) + new_tokens)
    stops, device = _stop_tokens(tokenizer), _device(recipe)
    from kubetune.trainer.validation.val_loop import training_state_kept

    with training_state_kept(model, device), PhaseProgress(
            f"held-out answers ({which} model, {kept} prompt(s))", new_tokens,
            "tokens at most", emit) as progress:
        answers = greedy(model, [a.prompt for a in asked], new_tokens, length, stops,
                         device, progress)
    return [_masked({"prompt": _decode(tokenizer, a.prompt, keep_special=True),
                     "reference": _decode(tokenizer, a.reference, keep_special=False),
                     "answer": _decode(tokenizer, ids, keep_special=False)})
            for a, ids in zip(asked, answers)]


def _masked(texts: dict[str, str]) -> dict[str, str]:
    """Held-out text goes into the report the export carries: a secret in it (a URL's
    credentials in a system prompt) is masked, in the URL and wherever else the row or
    the answer repeats it."""
    secrets = set().union(*(redact_module.url_credentials(t) for t in texts.values()))
    masked = {}
    for key, text in texts.items():
        text = redact_module.redact(text)
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, redact_module.MASK)
        masked[key] = text
    return masked


def _setting(settings: Mapping, key: str, default: int) -> int:
    value = settings.get(key)
    return default if value is None else int(value)


def record_answers(recipe: Any, heldout_dataset: Any, settings: Mapping | None,
                   output_dir: Path | str, rank: int, step: int, which: str,
                   allowed: float | None = None) -> list[dict] | None:
    """``answer`` on every rank, recorded by rank 0 as the base's (``which="base"``, before
    the first step) or the tuned model's (``"tuned"``, after the last). Nothing where the
    settings (``kubetune.validation``) ask for no prompt or the held-out set is empty. An
    answer that cannot be made or written costs a warning, never the run."""
    if which not in ("base", "tuned"):
        raise ValueError(f"which: 'base' or 'tuned', not {which!r}")
    settings = settings or {}
    prompts = _setting(settings, "prompts", PROMPTS)
    max_new_tokens = _setting(settings, "max_new_tokens", MAX_NEW_TOKENS)
    if prompts <= 0 or max_new_tokens <= 0 or heldout_dataset is None \
            or len(heldout_dataset) == 0:
        return None
    try:
        found = answer(recipe, heldout_dataset, prompts, max_new_tokens, allowed,
                       log.info if rank == 0 else None, which)
        if rank == 0 and found:
            write = answers_record.write_base if which == "base" else answers_record.write_tuned
            write(output_dir, found, step)
        return found
    except Exception as exc:
        log.warning("answers on held-out prompts not recorded (%s model): %s", which, exc)
        return None
