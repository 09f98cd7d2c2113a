"""What a user would run instead of us (issue 64): a plain transformers + PEFT training
script, on the same model, rows, batch, sequence length and LoRA settings as bench/gpu.py's
1B LoRA (``sft``) and DPO (``dpo``) cases, its processed tokens/s and peak memory printed as
one JSON line for bench/gpu.py to divide ours by.

It runs in a Python of its own, never beside the training stack: peft refuses to import
beside torchao 0.15, and on a lent GPU the carried huggingface_hub 2.x (bench/gpu.sh's
PYTHONPATH) breaks the image's transformers 5.17 (which needs huggingface_hub < 2). So it
imports only torch, transformers, peft and tokenizers: on a GPU the lent image's own, in
the smoke the tests' ``.venv-serving``. Its inputs are plain files bench/gpu.py writes
with the training stack (the SFT rows as JSON lines: this Python need not read parquet).

  sft   AutoModelForCausalLM + get_peft_model (rank, alpha, dropout and target modules of
        the SDK's LoRA arguments: q, v, the attention output and the MLP), batches padded
        to their longest row (what DataCollatorForSeq2Seq does), the prompt masked from
        the labels, the config's gradient accumulation, AdamW at the config's learning
        rate and weight decay. Tokens counted as torchtune's SFT recipes count them: the
        labels trained on.
  dpo   the same model and adapter settings as torchtune's DPO config, the DPO sigmoid loss
        (beta 0.1) against the same weights with the adapter disabled as the reference
        (how TRL's DPOTrainer runs a PEFT model), chosen and rejected padded together to
        the longest. Tokens counted as torchtune's DPO recipe counts them: every position
        of the concatenated batch, padding included.

A loop, not ``transformers.Trainer``: the Trainer's own per-step work (logging,
callbacks) would only slow the baseline; the loop is the fastest a user gets from these
libraries without compiling, so a ratio against it is not flattered.

    python bench/gpu_peft.py sft --model DIR --rows FILE [--steps 8] [--batch 4]
                                  [--accumulation 8] [--max-seq-len 2048]
    python bench/gpu_peft.py dpo --model DIR --pairs FILE [--steps 6] [--batch 4]
                                  [--max-seq-len 1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

PEFT_MODULES = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (rank, alpha, dropout, learning rate, weight decay) per mode: the SDK's LoRA arguments on
# llama3_2/1B_lora's optimizer; llama3_1/8B_lora_dpo_single_device's own for DPO.
SETTINGS = {"sft": (8, 16, 0.1, 3e-4, 0.01), "dpo": (8, 16, 0.0, 5e-4, 0.05)}
DPO_BETA = 0.1  # torchtune's DPOLoss default, which the DPO config keeps


def peft_model(model_dir: Path, mode: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    rank, alpha, dropout, _, _ = SETTINGS[mode]
    # bf16 on a GPU as ours trains there; fp32 on CPU as the smoke's ours does.
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device())
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                                             target_modules=PEFT_MODULES))
    return model.train()


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def optimizer_of(model, mode: str):
    import torch

    _, _, _, lr, decay = SETTINGS[mode]
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                             weight_decay=decay)


def tokenizer_of(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def special_ids(model_dir: Path) -> tuple[int, int, int]:
    """(bos, eos, pad) from config.json: the ids the model was written with."""
    config = json.loads((model_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    return config["bos_token_id"], eos, config.get("pad_token_id", eos)


def encoded(tokenizer, bos: int, eos: int, prompt: str, answer: str,
            max_len: int) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer and the same ids with the prompt masked (-100)."""
    head = [bos] + tokenizer.encode(prompt, add_special_tokens=False).ids
    tail = tokenizer.encode(answer, add_special_tokens=False).ids + [eos]
    ids = (head + tail)[:max_len]
    return ids, ([-100] * len(head) + tail)[:max_len]


def padded(rows: list[list[int]], value: int) -> list[list[int]]:
    longest = max(map(len, rows))
    return [row + [value] * (longest - len(row)) for row in rows]


def sft_steps(args) -> tuple[list[float], list[int], list[float]]:
    """Per optimizer step: seconds, labelled tokens, mean loss."""
    import torch

    tokenizer, (bos, eos, pad) = tokenizer_of(args.model), special_ids(args.model)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    need = args.steps * args.accumulation * args.batch
    if len(rows) < need:
        raise SystemExit(f"error: {args.rows} holds {len(rows)} rows; {need} are needed")
    samples = [encoded(tokenizer, bos, eos, row["input"] + "\n", row["output"],
                       args.max_seq_len) for row in rows[:need]]
    model = peft_model(args.model, "sft")
    optimizer = optimizer_of(model, "sft")
    seconds, tokens, losses = [], [], []
    for step in range(args.steps):
        sync()
        start, counted, total = time.perf_counter(), 0, 0.0
        for micro in range(args.accumulation):
            first = (step * args.accumulation + micro) * args.batch
            batch = samples[first:first + args.batch]
            ids = torch.tensor(padded([s[0] for s in batch], pad), device=device())
            labels = torch.tensor(padded([s[1] for s in batch], -100), device=device())
            mask = torch.tensor(padded([[1] * len(s[0]) for s in batch], 0), device=device())
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            (loss / args.accumulation).backward()
            counted += int((labels != -100).sum())
            total += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        seconds.append(time.perf_counter() - start)
        tokens.append(counted)
        losses.append(total / args.accumulation)
    return seconds, tokens, losses


def sequence_logps(model, ids, labels, mask):
    """Each sequence's summed log-probability of its answer tokens."""
    import torch

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    picked = torch.gather(logits.log_softmax(-1), 2, targets.clamp(min=0).unsqueeze(2))
    return (picked.squeeze(2) * (targets != -100)).sum(-1)


def dpo_steps(args) -> tuple[list[float], list[int], list[float]]:
    """Per optimizer step (one batch of pairs: the DPO case accumulates none): seconds,
    tokens of the concatenated batch, loss."""
    import torch
    import torch.nn.functional as F

    tokenizer, (bos, eos, pad) = tokenizer_of(args.model), special_ids(args.model)
    pairs = [json.loads(line) for line in args.pairs.read_text().splitlines() if line.strip()]
    need = args.steps * args.batch
    if len(pairs) < need:
        raise SystemExit(f"error: {args.pairs} holds {len(pairs)} pairs; {need} are needed")

    def answer(messages: list[dict]) -> str:
        return next(m["content"] for m in messages if m["role"] == "assistant")

    def prompt(messages: list[dict]) -> str:
        return "".join(m["content"] + "\n" for m in messages if m["role"] != "assistant")

    model = peft_model(args.model, "dpo")
    optimizer = optimizer_of(model, "dpo")
    seconds, tokens, losses = [], [], []
    for step in range(args.steps):
        batch = pairs[step * args.batch:(step + 1) * args.batch]
        # chosen rows first, then rejected, padded to one length: torchtune's
        # concatenated forward, so the counted tokens are the same kind as ours.
        encoded_rows = [encoded(tokenizer, bos, eos, prompt(p[side]), answer(p[side]),
                                args.max_seq_len)
                        for side in ("chosen", "rejected") for p in batch]
        sync()
        start = time.perf_counter()
        ids = torch.tensor(padded([r[0] for r in encoded_rows], pad), device=device())
        labels = torch.tensor(padded([r[1] for r in encoded_rows], -100), device=device())
        mask = torch.tensor(padded([[1] * len(r[0]) for r in encoded_rows], 0), device=device())
        with torch.no_grad(), model.disable_adapter():
            reference = sequence_logps(model, ids, labels, mask)
        policy = sequence_logps(model, ids, labels, mask)
        half = len(batch)
        margin = (policy[:half] - reference[:half]) - (policy[half:] - reference[half:])
        loss = -F.logsigmoid(DPO_BETA * margin).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        seconds.append(time.perf_counter() - start)
        tokens.append(ids.numel())
        losses.append(float(loss.detach()))
    return seconds, tokens, losses


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=tuple(SETTINGS))
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=Path, help="sft: JSON lines of input/output")
    parser.add_argument("--pairs", type=Path, help="dpo: JSON lines of chosen/rejected")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    args = parser.parse_args()
    if (args.rows if args.mode == "sft" else args.pairs) is None:
        parser.error(f"{args.mode} needs --{'rows' if args.mode == 'sft' else 'pairs'}")
    import peft
    import torch
    import transformers

    torch.manual_seed(0)
    seconds, tokens, losses = (sft_steps if args.mode == "sft" else dpo_steps)(args)
    # The first step (the allocator's and the kernels' warm-up) is left out, as ours'
    # tokens/s leaves it out; median, as bench/trainer.py takes ours'.
    steady = [t / s for t, s in zip(tokens, seconds)][1 if len(tokens) > 1 else 0:]
    steady.sort()
    print(json.dumps({
        "mode": args.mode, "device": str(device()), "steps": args.steps,
        "tokens_per_s": steady[len(steady) // 2], "tokens_per_step": tokens,
        "step_s": seconds, "losses": losses,
        "peak_cuda_reserved_gib": torch.cuda.max_memory_reserved() / 2 ** 30
        if torch.cuda.is_available() else None,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__}}))


if __name__ == "__main__":
    main()
