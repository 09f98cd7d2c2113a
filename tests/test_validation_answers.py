"""Answers on held-out prompts (issue 42, §5): the prompt and reference cut from held-out
rows as training tokenized them, greedy answers of the tiny Llama-3 against torchtune's
own generation, the record of base and tuned answers, and the run report's section."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kubetune.trainer.metric_logging import run_report
from kubetune.trainer.validation import answers, budget
from kubetune.workspace import answers_record

torch = pytest.importorskip("torch")

ADDING = [{"role": "system", "content": "You add numbers."},
          {"role": "user", "content": "What is 2 plus 3?"},
          {"role": "assistant", "content": "5"},
          {"role": "user", "content": "And 4 plus 4?"},
          {"role": "assistant", "content": "It is 8."}]
CONVERSATIONS = [
    ADDING,
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
    [{"role": "user", "content": "Count to three."},
     {"role": "assistant", "content": "One, two, three."}],
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from kubetune.tools.demo.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def make_tokenizer(model_dir: Path, max_seq_len: int | None = 512):
    from torchtune.models.llama3 import llama3_tokenizer

    return llama3_tokenizer(path=str(model_dir / "original" / "tokenizer.model"),
                            special_tokens_path=str(model_dir / "tokenizer.json"),
                            max_seq_len=max_seq_len)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return make_tokenizer(model_dir)


def heldout(tokenizer, tmp_path: Path, conversations=CONVERSATIONS, train_on_input=False):
    """Held-out rows as the recipe's data setup makes them: torchtune's chat dataset."""
    from torchtune.datasets import chat_dataset

    data = tmp_path / "heldout.json"
    data.write_text(json.dumps([{"messages": c} for c in conversations]))
    return chat_dataset(tokenizer, source="json", data_files=str(data), split="train",
                        conversation_column="messages", conversation_style="openai",
                        train_on_input=train_on_input)


@pytest.fixture(scope="module")
def model(model_dir):
    from tests.support.torchtune_logits import model as load

    return load(model_dir)


def recipe(model, tokenizer):
    """The attributes of torchtune's recipe object that answering reads."""
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    return SimpleNamespace(_model=model, _tokenizer=tokenizer, _device=torch.device("cpu"),
                           _loss_fn=CEWithChunkedOutputLoss())


def generation_prompt(tokenizer, messages) -> list[int]:
    """The prompt torchtune's tokenizer makes for generation: the conversation before the
    last answer, then an empty answer without its end."""
    from torchtune.data import Message

    shown = [Message(role=m["role"], content=m["content"]) for m in messages[:-1]]
    tokens, _ = tokenizer.tokenize_messages(shown + [Message(role="assistant", content="")],
                                            add_end_tokens=False)
    return tokens


def torchtune_greedy(model, tokenizer, prompt: list[int], new_tokens: int,
                     stop_tokens: list[int] | None) -> list[int]:
    """torchtune's own generation, top-1: the independent greedy reference."""
    from torchtune.generation import generate

    with torch.no_grad():
        out, _ = generate(model, torch.tensor(prompt), max_generated_tokens=new_tokens,
                          pad_id=tokenizer.pad_id, top_k=1, stop_tokens=stop_tokens)
    made = out[0, len(prompt):].tolist()
    ends = [i for i, t in enumerate(made) if stop_tokens and t in stop_tokens]
    return made[:ends[0]] if ends else made


# --- prompt and reference --------------------------------------------------------------

@pytest.mark.parametrize("train_on_input", [False, True])
def test_the_prompt_is_what_the_exported_chat_template_renders_before_the_last_answer(
        model_dir, tokenizer, tmp_path, train_on_input):
    from kubetune.chat_template.render import TextTokenizer, named_tokens, render
    from kubetune.chat_template.torchtune_formats import trained_template

    row = heldout(tokenizer, tmp_path, [ADDING], train_on_input)[0]
    split = answers.split_row(row["tokens"], row["labels"],
                              header=answers.answer_header(tokenizer))
    template = trained_template("torchtune.models.llama3._tokenizer.Llama3Tokenizer", None,
                                "<|begin_of_text|>", "<|end_of_text|>")
    rendered = render(template, ADDING[:-1], True, named_tokens(model_dir))
    assert split.prompt == TextTokenizer(model_dir).encode(rendered)
    # The first answer stays in the prompt; the last one is the reference, without its end.
    assert "5<|eot_id|>" in tokenizer.decode(split.prompt, skip_special_tokens=False)
    assert answers._decode(tokenizer, split.reference, keep_special=False) == "It is 8."


def test_a_chatml_prompt_is_what_its_exported_chat_template_renders(tmp_path):
    from torchtune.models.qwen2 import qwen2_tokenizer

    from kubetune.chat_template.render import TextTokenizer, named_tokens, render
    from kubetune.chat_template.torchtune_formats import trained_template
    from kubetune.tools.demo.tiny_qwen2 import write_tiny_qwen2

    qwen = write_tiny_qwen2(tmp_path / "qwen2")
    tokenizer = qwen2_tokenizer(path=str(qwen / "vocab.json"),
                                merges_file=str(qwen / "merges.txt"),
                                special_tokens_path=str(qwen / "tokenizer.json"), max_seq_len=512)
    row = heldout(tokenizer, tmp_path, [ADDING])[0]
    split = answers.split_row(row["tokens"], row["labels"],
                              header=answers.answer_header(tokenizer))
    template = trained_template("torchtune.models.qwen2._tokenizer.Qwen2Tokenizer", None, None,
                                "<|endoftext|>")
    rendered = render(template, ADDING[:-1], True, named_tokens(qwen))
    assert split.prompt == TextTokenizer(qwen).encode(rendered)
    assert answers._decode(tokenizer, split.reference, keep_special=False) == "It is 8."


def test_rows_with_nothing_to_answer_are_passed_over(tokenizer, tmp_path):
    rows = heldout(tokenizer, tmp_path)
    first = rows[0]
    unlabelled = {"tokens": first["tokens"], "labels": [-100] * len(first["tokens"])}
    text = tokenizer.encode("plain text, all of it trained on")
    completion = {"tokens": text, "labels": list(text)}  # a text-completion row
    assert answers.split_row(unlabelled["tokens"], unlabelled["labels"]) is None
    assert answers.split_row(completion["tokens"], completion["labels"]) is None
    header = answers.answer_header(tokenizer)
    found = answers.held_out_prompts([unlabelled, completion, rows[1], rows[2]], 3, -100,
                                    header, context=512)
    assert [answers._decode(tokenizer, f.reference, keep_special=False) for f in found] == [
        "Blue.", "One, two, three."]


def test_the_labelled_span_is_cut_where_the_loss_ignores_nothing_else():
    # Without a header: the prompt is everything before the last labelled run.
    tokens = [1, 10, 11, 12, 13, 14, 15, 16, 2]
    labels = [-100, -100, 11, 12, -100, -100, 15, 16, -100]
    split = answers.split_row(tokens, labels)
    assert (split.prompt, split.reference) == ([1, 10, 11, 12, 13, 14], [15, 16])
    assert answers.split_row(tokens, [-7 if x == -100 else x for x in labels],
                             ignore_index=-7) == split


# --- generation --------------------------------------------------------------------------

def test_greedy_answers_are_torchtune_generations_through_the_chat_format(
        model, tokenizer, tmp_path):
    rows = heldout(tokenizer, tmp_path)
    found = answers.answer(recipe(model, tokenizer), rows, prompts=2, max_new_tokens=12)
    assert len(found) == 2
    for got, messages in zip(found, CONVERSATIONS):
        prompt = generation_prompt(tokenizer, messages)
        want = torchtune_greedy(model, tokenizer, prompt, 12, tokenizer.stop_tokens)
        assert got["answer"] == answers._decode(tokenizer, want, keep_special=False)
        assert got["reference"] == messages[-1]["content"]
        assert got["prompt"] == tokenizer.decode(prompt, skip_special_tokens=False)
        assert got["prompt"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_a_secret_in_a_held_out_prompt_is_masked(model, tokenizer, tmp_path):
    leaky = [{"role": "system", "content": "Fetch http://alice:s3cr3tpass@example.com/x"},
             {"role": "user", "content": "Go."},
             {"role": "assistant", "content": "Token s3cr3tpass used."}]
    (got,) = answers.answer(recipe(model, tokenizer), heldout(tokenizer, tmp_path, [leaky]),
                            prompts=1, max_new_tokens=1)
    assert "http://***@example.com/x" in got["prompt"]
    assert "s3cr3tpass" not in json.dumps(got)


def count_forwards(model) -> tuple[list[int], object]:
    lengths: list[int] = []
    handle = model.register_forward_hook(lambda _m, args, _o: lengths.append(args[0].shape[1]))
    return lengths, handle


def test_generation_stops_at_a_stop_token_and_is_bounded_by_the_context(
        model, model_dir, tmp_path):
    tokenizer = make_tokenizer(model_dir)
    rows = heldout(tokenizer, tmp_path, [CONVERSATIONS[1]])
    prompt = generation_prompt(tokenizer, CONVERSATIONS[1])
    free = torchtune_greedy(model, tokenizer, prompt, 10, None)
    # A token the model picks 4th (and not before) made a stop token: it stops there.
    at = next(i for i in range(3, len(free)) if free[i] not in free[:i])
    tokenizer.stop_tokens = [free[at]]
    lengths, handle = count_forwards(model)
    try:
        (got,) = answers.answer(recipe(model, tokenizer), rows, prompts=1, max_new_tokens=10)
    finally:
        handle.remove()
    assert got["answer"] == answers._decode(tokenizer, free[:at], keep_special=False)
    assert len(lengths) == at + 1  # no forward after the stop token
    # The context bounds prompt and answer together: 3 tokens of room, 3 forwards.
    tokenizer.stop_tokens, tokenizer.max_seq_len = [], len(prompt) + 3
    lengths, handle = count_forwards(model)
    try:
        (got,) = answers.answer(recipe(model, tokenizer), rows, prompts=1, max_new_tokens=10)
    finally:
        handle.remove()
    assert got["answer"] == answers._decode(tokenizer, free[:3], keep_special=False)
    assert lengths == [len(prompt) + 3] * 3


def test_a_chunked_output_answers_the_same(model, tokenizer, tmp_path):
    rows = heldout(tokenizer, tmp_path)
    whole = answers.answer(recipe(model, tokenizer), rows, prompts=3, max_new_tokens=8)
    model.set_num_output_chunks(4)
    try:
        chunked = answers.answer(recipe(model, tokenizer), rows, prompts=3, max_new_tokens=8)
    finally:
        model.set_num_output_chunks(0)
    assert chunked == whole and len(whole) == 3


def test_answering_leaves_the_rng_and_each_modules_mode_as_they_were(
        model, model_dir, tokenizer, tmp_path):
    from tests.support.torchtune_logits import model as load

    rows = heldout(tokenizer, tmp_path)
    # Dropout in training: an answer made in train mode would differ from the eval one.
    training = load(model_dir, attn_dropout=0.5).train()
    training.norm.eval()
    modes = [m.training for m in training.modules()]
    torch.manual_seed(7)
    before = torch.get_rng_state()
    found = answers.answer(recipe(training, tokenizer), rows, prompts=3, max_new_tokens=8)
    assert torch.equal(torch.get_rng_state(), before)
    assert [m.training for m in training.modules()] == modes
    assert found == answers.answer(recipe(model, tokenizer), rows, prompts=3, max_new_tokens=8)


# --- the record and record_answers ---------------------------------------------------------

def made(prompt: str, reference: str, answer: str) -> dict:
    return {"prompt": prompt, "reference": reference, "answer": answer}


def test_the_record_keeps_the_base_answers_beside_the_tuned(tmp_path):
    answers_record.write_base(tmp_path, [made("p1", "r1", "b1"), made("p2", "r2", "b2")], 0)
    answers_record.write_tuned(tmp_path, [made("p1", "r1", "t1"), made("p2", "r2", "t2")], 12)
    record = answers_record.read(tmp_path)
    assert (record.base_step, record.tuned_step) == (0, 12)
    assert [(p.prompt, p.reference, p.base, p.tuned) for p in record.prompts] == [
        ("p1", "r1", "b1", "t1"), ("p2", "r2", "b2", "t2")]
    assert json.loads((tmp_path / "kubetune-answers.json").read_text())["prompts"][0] == {
        "prompt": "p1", "reference": "r1", "base": "b1", "tuned": "t1"}
    # A resumed run answers again after its last step: the base's answers stay.
    answers_record.write_tuned(tmp_path, [made("p1", "r1", "t1'"), made("p2", "r2", "t2'")], 20)
    again = answers_record.read(tmp_path)
    assert [(p.base, p.tuned) for p in again.prompts] == [("b1", "t1'"), ("b2", "t2'")]
    assert (again.base_step, again.tuned_step) == (0, 20)
    # A new run's base answers replace an earlier run's record whole.
    answers_record.write_base(tmp_path, [made("q", "r", "b")], 0)
    fresh = answers_record.read(tmp_path)
    assert [(p.prompt, p.tuned) for p in fresh.prompts] == [("q", None)]
    assert fresh.tuned_step is None


def test_tuned_answers_without_the_bases_and_a_broken_record(tmp_path):
    answers_record.write_tuned(tmp_path, [made("p", "r", "t")], 5)
    record = answers_record.read(tmp_path)
    assert (record.prompts[0].base, record.base_step, record.tuned_step) == (None, None, 5)
    (tmp_path / "kubetune-answers.json").write_text('{"prompts": [')
    assert answers_record.read(tmp_path) is None
    assert answers_record.read(tmp_path / "absent") is None


def test_record_answers_writes_on_rank_0_only_and_not_when_off(model, tokenizer, tmp_path):
    rows = heldout(tokenizer, tmp_path)
    settings = {"prompts": 2, "max_new_tokens": 4}
    on_rank_1 = answers.record_answers(recipe(model, tokenizer), rows, settings,
                                       tmp_path, rank=1, step=0, which="base")
    assert len(on_rank_1) == 2 and answers_record.read(tmp_path) is None
    for off in ({"prompts": 0}, {"max_new_tokens": 0}):
        assert answers.record_answers(recipe(model, tokenizer), rows, off, tmp_path,
                                      rank=0, step=0, which="base") is None
    assert answers.record_answers(recipe(model, tokenizer), [], {}, tmp_path, rank=0, step=0,
                                  which="base") is None
    assert answers_record.read(tmp_path) is None
    answers.record_answers(recipe(model, tokenizer), rows, settings, tmp_path, 0, 0, "base")
    answers.record_answers(recipe(model, tokenizer), rows, settings, tmp_path, 0, 9, "tuned")
    record = answers_record.read(tmp_path)
    assert (record.base_step, record.tuned_step, len(record.prompts)) == (0, 9, 2)
    # The same weights: the base's and the "tuned" answers agree.
    assert all(p.base == p.tuned is not None for p in record.prompts)
    # Three prompts by default (a setting left null too).
    default = answers.record_answers(recipe(model, tokenizer), rows,
                                     {"prompts": None, "max_new_tokens": 2}, tmp_path, 1, 0,
                                     "base")
    assert len(default) == 3


# --- the run report ------------------------------------------------------------------------

def fenced_blocks(markdown: str) -> list[str]:
    """The contents of the report's fenced blocks, as CommonMark closes them (a closing
    fence is at least as long as the opening one)."""
    blocks, lines, at = [], markdown.split("\n"), 0
    while at < len(lines):
        opening = re.fullmatch(r"(`{3,})text", lines[at])
        at += 1
        if not opening:
            continue
        body = []
        while not re.fullmatch(rf"`{{{len(opening.group(1))},}}", lines[at]):
            body.append(lines[at])
            at += 1
        blocks.append("\n".join(body))
        at += 1
    return blocks


def test_the_run_report_shows_reference_base_and_tuned_answers_side_by_side(tmp_path):
    tricky = "```\nnot a fence end\n````\n| a | b |\n# not a heading\x07"
    long_prompt = "system prompt " * 100 + "the question?"
    answers_record.write_base(tmp_path, [made(long_prompt, "ref 1", "base 1"),
                                         made("p2", tricky, "")], 0)
    answers_record.write_tuned(tmp_path, [made(long_prompt, "ref 1", "tuned 1"),
                                          made("p2", tricky, tricky)], 24)
    report = run_report.write(tmp_path).read_text()
    section = report[report.index("## Answers on held-out prompts"):]
    assert section.index("### Prompt 1") < section.index("### Prompt 2")
    assert "**Base model (step 0)**" in section and "**Tuned model (step 24)**" in section
    assert "**Base model (step 0)**: _(nothing: it stopped at once)_" in section
    blocks = fenced_blocks(section)
    shown = tricky.replace("\x07", "\\x07")
    assert blocks == ["…" + long_prompt[-run_report._PROMPT_SHOWN:], "ref 1", "base 1",
                      "tuned 1", "p2", shown, shown]
    # Nothing of the answers outside their blocks: no stray heading or table.
    outside = re.sub(r"(?ms)^(`{3,})text\n.*?^\1$", "", section)
    assert "not a heading" not in outside and "| a |" not in outside


def test_a_report_before_the_tuned_answers_says_so_and_none_without_a_record(tmp_path):
    assert "Answers on held-out prompts" not in run_report.write(tmp_path).read_text()
    answers_record.write_base(tmp_path, [made("p", "r", "b")], 0)
    report = run_report.write(tmp_path).read_text()
    assert "**Tuned model**: _not yet: answered after the last step_" in report


# --- every rank together --------------------------------------------------------------------

@pytest.mark.slow
def test_ranks_answer_together_sharded_or_not_and_as_one_process_does(
        model, model_dir, tokenizer, tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    data = tmp_path / "heldout.json"
    data.write_text(json.dumps([{"messages": c} for c in CONVERSATIONS]))
    out = tmp_path / "out"
    out.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(repo / "tests" / "support" / "answers_ranks.py"), str(model_dir), str(data),
         str(out), "2", "6"], env=environ, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    alone = answers.answer(recipe(model, tokenizer), heldout(tokenizer, tmp_path), 2, 6)
    assert ranks[0]["sharded"] == ranks[1]["sharded"] == alone
    # Rank 1's own weights differ: it answers with rank 0's tokens all the same.
    assert ranks[0]["diverging"] == ranks[1]["diverging"] == alone


def test_answers_beyond_their_share_of_the_run_are_cut_and_said_to_be(model, tokenizer,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "MIN_NEW_TOKENS", 2)  # the floor, small: a cheap test
    rows = heldout(tokenizer, tmp_path)
    lines: list[str] = []
    shapes: list[tuple[int, ...]] = []
    handle = model.register_forward_hook(lambda _m, args, _o: shapes.append(args[0].shape))
    try:
        cut = answers.answer(recipe(model, tokenizer), rows, prompts=3, max_new_tokens=20,
                             allowed=1, emit=lines.append, which="tuned")
    finally:
        handle.remove()
    assert len(cut) == 1 and cut[0]["reference"] == CONVERSATIONS[0][-1]["content"]
    assert 1 <= len(shapes) <= 2 and {s[0] for s in shapes} == {1}  # one row, 2 tokens at most
    assert lines == ["held-out answers (tuned model): 2 of 3 cut, the rest up to 2 new "
                     "tokens (of 20): answers are bounded to about 5% of the run's compute"]
