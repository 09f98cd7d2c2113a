"""Packed batches on CPU: what attending per document buys, and whether packing pays there.

Four ways to train the same documents (alpaca-like rows' token lengths, as
``bench/packed_attention.py`` draws them, packed as torchtune's PackedDataset packs them:
``packed_attention.pack_lengths``), each in a fresh process so memory high-water marks
do not mix:

  padded      batches of ``--batch`` rows padded to the batch's longest (no packing: what
              the trainer does on CPU by default);
  whole-pack  ``--batch`` packs of ``--seq`` positions through torchtune 0.6.1's dense
              block-causal mask, every pack attending over all its positions (what
              torchtune does without flex attention);
  per-doc     the same packs with the trainer's per-document attention
              (``kubetune.trainer.recipe_process.document_attention``);
  per-pack    per-doc, one pack per forward and backward, the gradients accumulated over
              the batch's packs before its one optimizer step (what the trainer runs on
              CPU: ``kubetune.trainer.performance.speed``).

For each: trained (non-padding) tokens per second over ``--steps`` optimizer steps after
the first, and how much the first step raised the process's peak resident memory above
what it held after building the model and the batch. A LoRA Llama-3 of ``--dim`` width
(``--layers`` layers, vocab 2000), fp32, forward, cross-entropy, backward, AdamW step.
Ratios are to ``padded`` in the same run. ``--threads 1`` (the default) keeps the
neighbours' load out of the timings on a shared machine.

    python bench/cpu_packing.py [--dim 512] [--layers 4] [--seq 2048] [--batch 4]
                                [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from packed_attention import document_lengths, pack_lengths  # noqa: E402

VOCAB = 2000
WAYS = ("padded", "whole-pack", "per-doc", "per-pack")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(way: str, args: argparse.Namespace) -> dict:
    """In this process: build, train ``args.steps + 1`` steps one way, report."""
    import torch
    import torch.nn.functional as F
    from torchtune.data import padded_collate_packed, padded_collate_sft
    from torchtune.models.llama3 import lora_llama3

    if way in ("per-doc", "per-pack"):
        from kubetune.trainer.recipe_process import document_attention

        document_attention.install()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = lora_llama3(lora_attn_modules=["q_proj", "v_proj"], vocab_size=VOCAB,
                        num_layers=args.layers, num_heads=8, num_kv_heads=4,
                        embed_dim=args.dim, max_seq_len=args.seq,
                        intermediate_dim=args.dim * 3, lora_rank=8, lora_alpha=16)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    packed = pack_lengths(document_lengths("realistic", args.batch * (args.steps + 1) *
                                           args.seq // 100, args.seq, seed=0),
                          args.seq, args.batch * (args.steps + 1))
    generator = torch.Generator().manual_seed(0)

    def tokens(n: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (n,), generator=generator)

    batches, trained = [], []
    if way == "padded":  # the packs' documents, in the same order, a batch at a time
        rows = iter([n for documents, _ in packed for n in documents])
        for _ in range(args.steps + 1):
            drawn = [next(rows) for _ in range(args.batch)]
            batches.append(padded_collate_sft([{"tokens": tokens(n).tolist(),
                                                "labels": tokens(n).tolist()}
                                               for n in drawn]))
            trained.append(sum(drawn))
    else:
        for step in range(args.steps + 1):
            drawn = packed[step * args.batch:(step + 1) * args.batch]
            batch = []
            for documents, pad in drawn:
                seq_lens = documents + ([pad] if pad else [])
                batch.append({"tokens": tokens(args.seq), "labels": tokens(args.seq),
                              "input_pos": torch.tensor([p for n in seq_lens
                                                         for p in range(n)]),
                              "seq_lens": torch.tensor(seq_lens)})
            batches.append(padded_collate_packed(batch))
            trained.append(sum(sum(documents) for documents, _ in drawn))

    before = peak_rss_mb()
    seconds = []
    for batch in batches:
        started = time.perf_counter()
        # The whole batch in one forward, or (per-pack) one pack at a time; either way the
        # loss is the batch's mean over its labelled tokens, so the gradients are the same.
        labelled = (batch["labels"] != -100).sum()
        mask, positions = batch.get("mask"), batch.get("input_pos")
        parts = [slice(i, i + 1) for i in range(len(batch["tokens"]))] \
            if way == "per-pack" else [slice(None)]
        for rows in parts:
            logits = model(batch["tokens"][rows], mask=None if mask is None else mask[rows],
                           input_pos=None if positions is None else positions[rows])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"][rows].reshape(-1),
                                   reduction="sum") / labelled
            loss.backward()
            del logits, loss
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
        if len(seconds) == 1:
            first_step_mb = peak_rss_mb() - before
    return {"tokens_per_s": sum(trained[1:]) / sum(seconds[1:]),
            "first_step_peak_rss_mb": first_step_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args)))
        return
    found = {}
    for way in WAYS:
        command = [sys.executable, __file__, "--one", way,
                   *[f"--{k}={getattr(args, k)}" for k in
                     ("dim", "layers", "seq", "batch", "steps", "threads")]]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        found[way] = json.loads(output.strip().splitlines()[-1])
    padded = found["padded"]
    ratios = {way: {"tokens_per_s_over_padded":
                    found[way]["tokens_per_s"] / padded["tokens_per_s"]}
              for way in WAYS}
    print(json.dumps({"settings": vars(args) | {"one": None}, "runs": found,
                      "ratios": ratios}, indent=2))
    print(f"\n| way | trained tokens/s | / padded | first step's peak RSS rise (MB) |\n"
          f"|---|---|---|---|")
    for way in WAYS:
        run = found[way]
        print(f"| {way} | {run['tokens_per_s']:.0f} | "
              f"{ratios[way]['tokens_per_s_over_padded']:.2f} | "
              f"{run['first_step_peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
