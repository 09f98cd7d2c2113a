"""Where packed documents lose time: collate, attention, or the whole step (issue 13).

Measured on an H100, realistic packs (alpaca-like documents, ~287 tokens) train 2.4x
slower than packs of 10-token documents of the same shape, and about 1.3x of that is only
what tokens/s counts. This script splits the rest apart, in one process, on positions per
second (batch x sequence length: no counting convention), for three packings of the same
shape:

  short      documents of ~10 tokens (the fast case measured);
  realistic  documents with Alpaca's lengths (``kubetune.tools.demo.alpaca_like``);
  single     one document per pack, through the packed path (a causal BlockMask);
  unpacked   the same positions with no mask: SDPA's causal kernel, what an unpacked run
             of full-length rows gets (the ceiling for attention).

For each it times, as torchtune 0.6.1's packed path runs them:
  collate    ``padded_collate_packed`` (document ids, then a flex ``BlockMask`` on CUDA or
             a dense block-causal mask elsewhere), per batch, in the training process;
  attention  torchtune's attention call alone (flex attention compiled by torchtune on
             CUDA, SDPA with the dense mask elsewhere), forward + backward, at the model's
             head shapes;
  step       the model's forward, chunked cross-entropy and backward (LoRA on q/v, as the
             SDK's default), the mask built beforehand;
and reports each packing's times as ratios to ``short`` (the same run, so machine noise
cancels), the BlockMask's sparsity, and how many graphs dynamo compiled during the timed
steps (a recompile per batch would show here, not in a profile of one step).

CUDA: a Llama-3.2-1B-shaped LoRA model, bf16. Elsewhere: a tiny one, fp32 (the numbers
only show the script works; the question is a GPU one).

    python bench/packed_attention.py [--seq 2048] [--batch 4] [--steps 8] [--compile]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from kubetune.tools.demo.alpaca_like import alpaca_like_rows  # noqa: E402

# Llama-3 spends about 4 characters a token on English, and its chat template about 20
# tokens of headers a row.
CHARS_PER_TOKEN = 4
TEMPLATE_TOKENS = 20
PACKINGS = ("short", "realistic", "single", "unpacked")


def document_lengths(packing: str, count: int, seq_len: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    if packing == "short":
        return [rng.randint(8, 12) for _ in range(count)]
    if packing in ("single", "unpacked"):
        return [seq_len] * count
    return [min(seq_len, TEMPLATE_TOKENS + len(r["input"] + r["output"]) // CHARS_PER_TOKEN)
            for r in alpaca_like_rows(count, seed=seed)]


def pack_lengths(lengths: list[int], seq_len: int,
                 wanted: int) -> list[tuple[list[int], int]]:
    """``wanted`` packs as torchtune's PackedDataset makes them (split_across_pack=False):
    each pack's documents, in order until the next does not fit, and its padding (which
    the pack counts as one more sequence)."""
    lengths_left = iter(lengths)
    out, current, pending = [], [], next(lengths_left)
    while len(out) < wanted:
        if sum(current) + pending <= seq_len:
            current.append(pending)
            pending = next(lengths_left)
            continue
        out.append((current, seq_len - sum(current)))
        current = []
    return out


def packs(packing: str, batches: int, batch: int, seq_len: int, vocab: int,
          seed: int = 0) -> list[list[dict]]:
    """``batches`` batches of ``batch`` packs (``pack_lengths``) with random tokens."""
    wanted = batches * batch
    lengths = document_lengths(packing, wanted * seq_len // 8 + 16, seq_len, seed)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for documents, pad in pack_lengths(lengths, seq_len, wanted):
        seq_lens = documents + ([pad] if pad else [])
        positions = torch.cat([torch.arange(n) for n in seq_lens])
        out.append({"tokens": torch.randint(0, vocab, (seq_len,), generator=generator),
                    "labels": torch.randint(0, vocab, (seq_len,), generator=generator),
                    "input_pos": positions,
                    "seq_lens": torch.tensor(seq_lens)})
    return [out[i * batch:(i + 1) * batch] for i in range(batches)]


def build_model(device: str, seq_len: int):
    from torchtune.models.llama3_2 import lora_llama3_2_1b
    from torchtune.models.llama3_2._component_builders import lora_llama3_2

    lora = dict(lora_attn_modules=["q_proj", "v_proj"], lora_rank=8, lora_alpha=16)
    if device == "cuda":
        model, dtype = lora_llama3_2_1b(**lora), torch.bfloat16
    else:
        model = lora_llama3_2(**lora, vocab_size=512, num_layers=2, num_heads=4,
                              num_kv_heads=2, embed_dim=128, intermediate_dim=256,
                              max_seq_len=seq_len)
        dtype = torch.float32
    model = model.to(device=device, dtype=dtype)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    return model, dtype


def synced(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def timed(device: str, func, repeats: int) -> list[float]:
    func()  # warm-up (compiles, allocator)
    times = []
    for _ in range(repeats):
        start = synced(device)
        func()
        times.append(synced(device) - start)
    return times


def to_device(batch: dict, device: str) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def measure(packing: str, model, dtype, device: str, args) -> dict:
    from torchtune.data import padded_collate_packed
    from torchtune.modules.attention_utils import _sdpa_or_flex_attention
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    batches = packs(packing, args.steps + 1, args.batch, args.seq, model.tok_embeddings.num_embeddings)
    documents = statistics.mean(len(b["seq_lens"]) for batch in batches for b in batch)
    collate = [timed(device, lambda b=b: padded_collate_packed(b), 1)[0] for b in batches]
    collated = [to_device(padded_collate_packed(b), device) for b in batches]
    if packing == "unpacked":
        collated = [{**c, "mask": None} for c in collated]
    mask = collated[0]["mask"]
    sparsity = float(mask.sparsity()) if hasattr(mask, "sparsity") else None

    attention = _sdpa_or_flex_attention()
    layer = model.layers[0].attn
    heads, head_dim = layer.num_heads, layer.head_dim
    shape = (args.batch, heads, args.seq, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def attention_step():
        attention(q, k, v, mask=mask, dropout_p=0.0, is_causal=mask is None).sum().backward()

    attention_times = timed(device, attention_step, args.steps)

    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    steps = iter(collated)

    def model_step():
        batch = next(steps, None) or collated[-1]
        logits = model(batch["tokens"], mask=batch["mask"], input_pos=batch["input_pos"])
        loss_fn(logits, batch["labels"]).backward()

    graphs_before = graphs_compiled()
    step_times = timed(device, model_step, args.steps)
    positions = args.batch * args.seq
    return {"packing": packing, "documents_per_pack": round(documents, 1),
            "block_sparsity_pct": sparsity,
            "collate_ms": 1e3 * statistics.median(collate),
            "attention_ms": 1e3 * statistics.median(attention_times),
            "step_ms": 1e3 * statistics.median(step_times),
            "positions_per_s": positions / statistics.median(step_times),
            "graphs_compiled_while_timed": graphs_compiled() - graphs_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--compile", action="store_true",
                        help="compile the model's layers as torchtune's compile=True does")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model, dtype = build_model(device, args.seq)
    if args.compile:
        from torchtune.training import compile_model

        compile_model(model)
    results = [measure(p, model, dtype, device, args) for p in PACKINGS]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {dtype}, batch {args.batch} x "
          f"{args.seq}, compile={args.compile}")
    base = results[0]
    print(f"{'packing':<10} {'docs/pack':>9} {'sparsity%':>9} {'collate':>9} {'attention':>10} "
          f"{'step':>9} {'graphs':>6}   (times as ratios to short)")
    for r in results:
        sparsity = "-" if r["block_sparsity_pct"] is None else f"{r['block_sparsity_pct']:.1f}"
        print(f"{r['packing']:<10} {r['documents_per_pack']:>9} {sparsity:>9} "
              f"{r['collate_ms'] / base['collate_ms']:>8.2f}x "
              f"{r['attention_ms'] / base['attention_ms']:>9.2f}x "
              f"{r['step_ms'] / base['step_ms']:>8.2f}x {r['graphs_compiled_while_timed']:>6}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
