"""Data at scale: what a run pays for its data before its first step, unpacked and packed,
as the rows grow. One script, the same data, the baselines measured beside the runs.

For each row count (``--rows``), on alpaca-like rows (~287 tokens of the tiny byte-level
tokenizer each; ``kubetune.tools.demo.alpaca_like``) in 4 parquet shards and the tiny
Llama-3 (the model costs nothing: the data path is what is measured), runs to their first
optimizer step (batch 4, one step, then the checkpoint):

  plain         plain torchtune `tune run`, unpacked (upstream's default: rows tokenized
                lazily, as batches draw them)
  unpacked      ours, unpacked, cold cache (every row tokenized once, in parallel, into
                the cache; rows with nothing to train on dropped): THE BASELINE of the ratios
  packed        ours, dataset.packed=True at 2048 tokens, cold cache (tokenize, pack index)
  restart       ours, packed again on the same data, a new output_dir (the cache is mapped)
  dist-1        ours, packed, cold cache, the distributed recipe with 1 process (a
                one-process group: the launcher starts it without torchrun),
  dist-2        ... and with 2 processes on this node (under torchrun, whose own process
                is counted too): one builds, the other waits and maps
  plain-packed  plain torchtune packed (its PackedDataset: every pack built in memory, in
                each process, at every start), up to ``--plain-packed-max-rows``

Reported per run: seconds to the end of the data setup (torchtune's "Learning rate
scheduler is initialized.", printed right after it) and to the first finished step; the
largest process's resident set during the setup (sampled every 0.1 s: the model and the
data, before any training) and its peak (the kernel's high-water mark, the first step
included: a packed step of 4 x 2048 tokens, with its dense attention mask on CPU, costs a
few hundred MB that the ~300-token unpacked batches do not, whatever the data's size);
CPU seconds of the whole tree (user + system, every process, workers included).

Targets, as ratios at 100k rows: packed / unpacked time to first step <= 1.3, packed /
unpacked peak RSS <= 1.2, restart / unpacked time to first step <= 1.1, dist-2 / dist-1
CPU seconds <= 1.5. ``plain`` is there so the baseline cannot hide a slower start: ours
tokenizes every row before step 1, plain torchtune only the first batch's.

On a shared machine, timings drift with the neighbours' load: ``--repeats`` runs the whole
sequence again, and medians of the per-repeat ratios are reported.

    python bench/data_scale.py [--rows 10000 100000 1000000] [--repeats 1]
                               [--workdir /tmp/kubetune-bench-data]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubetune.tools.demo import TinyModelSpec, write_tiny_model  # noqa: E402
from kubetune.tools.demo.alpaca_like import write_alpaca_like  # noqa: E402
from kubetune.tools.plain_torchtune import loading_overrides  # noqa: E402

SHARDS = 4
PACK_LEN = 2048
RUNS = ("plain", "unpacked", "packed", "restart", "dist-1", "dist-2")
TARGETS = {"packed_over_unpacked_first_step": ("packed", "unpacked", "first_step_s", 1.3),
           "packed_over_unpacked_peak_rss": ("packed", "unpacked", "peak_rss_mb", 1.2),
           "restart_over_unpacked_first_step": ("restart", "unpacked", "first_step_s", 1.1),
           "dist2_over_dist1_cpu_s": ("dist-2", "dist-1", "cpu_s", 1.5)}
INFO = ["packed_over_unpacked_setup_rss", "plain_over_unpacked_first_step",
        "packed_over_plain_first_step"]


def measure_child(command: list[str]) -> int:
    """Run ``command``; report its tree's largest resident set and total CPU seconds."""
    code = subprocess.call(command)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"kubetune-bench-usage {usage.ru_maxrss * 1024} {usage.ru_utime + usage.ru_stime}",
          flush=True)
    return code


# torchtune's recipes print this right after their data setup, before the first step.
SETUP_DONE = "Learning rate scheduler is initialized."


def _tree_rss(root: int) -> int:
    """The resident set of the largest process under ``root`` (by /proc), in bytes."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    largest = 0
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            largest = max(largest, int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1)))
        except (OSError, AttributeError):
            continue
    return largest * 1024


def timed(command: list[str], env: dict, log: Path, first_step) -> dict:
    """Run ``command``: seconds to the end of its data setup and to its first step, the
    largest process's resident set during the setup (sampled) and at its peak (the
    kernel's high-water mark, first step included), CPU seconds of the whole tree."""
    wrapper = [sys.executable, __file__, "--measure", "--", *command]
    start = time.monotonic()
    first = setup = None
    setup_rss = 0
    with open(log, "w") as out:
        child = subprocess.Popen(wrapper, env=env, cwd=REPO, stdout=out,
                                 stderr=subprocess.STDOUT)
        while child.poll() is None:
            if setup is None:
                setup_rss = max(setup_rss, _tree_rss(child.pid))
                if SETUP_DONE in log.read_text(errors="replace"):
                    setup = time.monotonic() - start
            if first is None and first_step():
                first = time.monotonic() - start
            time.sleep(0.1)
    if child.returncode != 0 or first is None or setup is None:
        raise SystemExit(f"{' '.join(command[:6])} failed ({child.returncode}): see {log}")
    rss, cpu = re.findall(r"^kubetune-bench-usage (\d+) ([0-9.]+)$", log.read_text(), re.M)[-1]
    return {"setup_s": round(setup, 2), "first_step_s": round(first, 2),
            "setup_rss_mb": round(setup_rss / 2 ** 20), "peak_rss_mb": round(int(rss) / 2 ** 20),
            "cpu_s": round(float(cpu), 1)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(workdir: Path, rows: int) -> tuple[Path, Path]:
    model = workdir / "model"
    if not model.is_dir():
        # Positions for 2048-token packs (plain torchtune does not truncate at all).
        write_tiny_model(model, TinyModelSpec(max_position_embeddings=8192))
    dataset = workdir / f"dataset-{rows}"
    if not dataset.is_dir():
        write_alpaca_like(dataset, rows, SHARDS, "parquet", scale=0.25)
    return model, dataset


def common_args(model: Path, dataset: Path) -> list[str]:
    return ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={dataset / 'data'}", "dataset.split=train", "batch_size=4",
            "gradient_accumulation_steps=1", "epochs=1", "max_steps_per_epoch=1",
            "dtype=fp32", "seed=0", f"checkpointer.checkpoint_dir={model}",
            f"tokenizer.path={model / 'original' / 'tokenizer.model'}"]


def plain_run(model: Path, dataset: Path, out: Path, env: dict, packed: bool = False) -> dict:
    """Upstream torchtune, given only what it needs to load this checkpoint."""
    pack = ["dataset.packed=True", f"tokenizer.max_seq_len={PACK_LEN}"] if packed \
        else ["dataset.packed=False"]
    args = [*common_args(model, dataset), *pack, f"output_dir={out}",
            "device=cpu", *loading_overrides(model),
            "metric_logger._component_=torchtune.training.metric_logging.DiskLogger",
            f"metric_logger.log_dir={out / 'logs'}", "log_peak_memory_stats=False",
            "optimizer.fused=False"]
    command = [sys.executable, "-m", "torchtune._cli.tune", "run",
               "lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
               *args]
    logs = out / "logs"
    return timed(command, env, out.parent / f"{out.name}.log", lambda: any(
        "Step 1 |" in p.read_text() for p in logs.glob("log_*.txt")))


def our_run(name: str, model: Path, dataset: Path, out: Path, cache: Path, env: dict,
            processes: int = 0) -> dict:
    """``processes``: 0 the single-device recipe; N the distributed one under torchrun."""
    packed = name != "unpacked"
    args = [*common_args(model, dataset), f"output_dir={out}",
            f"dataset.packed={packed}", *([f"tokenizer.max_seq_len={PACK_LEN}"] if packed else [])]
    if processes:
        recipe = [f"--rdzv_endpoint=127.0.0.1:{free_port()}", "lora_finetune_distributed",
                  "--config", "llama3_2/1B_lora"]
        env = {**env, "PET_NNODES": "1", "PET_NPROC_PER_NODE": str(processes),
               "PET_NODE_RANK": "0"}
    else:
        recipe = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device"]
    command = [sys.executable, "-m", "kubetune.entrypoints.tune", "run", *recipe, *args]
    metrics = out / "metrics.jsonl"
    result = timed(command, {**env, "KUBETUNE_TOKEN_CACHE_DIR": str(cache)},
                   out.parent / f"{out.name}.log",
                   lambda: metrics.is_file() and metrics.stat().st_size > 0)
    log = (out.parent / f"{out.name}.log").read_text()
    result["built"] = len(re.findall(r"token cache: tokenized", log))
    return result


def one_repeat(workdir: Path, rows: int, repeat: int, plain_packed: bool) -> dict:
    model, dataset = prepare(workdir, rows)
    runs = workdir / f"runs-{rows}-{repeat}"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "PET_"))}
    env["TQDM_DISABLE"] = "1"
    found = {"plain": plain_run(model, dataset, runs / "plain", env),
             "unpacked": our_run("unpacked", model, dataset, runs / "unpacked",
                                 runs / "cache-unpacked", env),
             "packed": our_run("packed", model, dataset, runs / "packed",
                               runs / "cache-packed", env),
             "restart": our_run("restart", model, dataset, runs / "restart",
                                runs / "cache-packed", env),
             "dist-1": our_run("dist-1", model, dataset, runs / "dist-1", runs / "cache-dist-1",
                               env, processes=1),
             "dist-2": our_run("dist-2", model, dataset, runs / "dist-2", runs / "cache-dist-2",
                               env, processes=2)}
    if plain_packed:
        found["plain-packed"] = plain_run(model, dataset, runs / "plain-packed", env,
                                          packed=True)
    shutil.rmtree(runs, ignore_errors=True)  # caches of 1M rows are gigabytes
    return found


def ratios(found: dict) -> dict:
    out = {name: found[a][key] / found[b][key] for name, (a, b, key, _) in TARGETS.items()}
    out["packed_over_unpacked_setup_rss"] = (found["packed"]["setup_rss_mb"]
                                             / found["unpacked"]["setup_rss_mb"])
    out["plain_over_unpacked_first_step"] = (found["plain"]["first_step_s"]
                                             / found["unpacked"]["first_step_s"])
    out["packed_over_plain_first_step"] = (found["packed"]["first_step_s"]
                                           / found["plain"]["first_step_s"])
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = re.search(r"^Model name:\s*(.+)$", lscpu, re.M).group(1).strip()
    except (OSError, AttributeError):
        model = "unknown CPU"
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def table(results: dict) -> str:
    lines = [f"Machine: {results['machine']}; medians of {results['repeats']} repeat(s).", "",
             "| rows | run | data set up (s) | first step (s) | largest RSS in setup (MB) "
             "| peak RSS (MB) | CPU, all processes (s) |", "|---|---|---|---|---|---|---|"]
    for rows, entry in results["by_rows"].items():
        for run, got in entry["runs"].items():
            lines.append(f"| {int(rows):,} | {run} | {got['setup_s']:.1f} | "
                         f"{got['first_step_s']:.1f} | {got['setup_rss_mb']} | "
                         f"{got['peak_rss_mb']} | {got['cpu_s']:.0f} |")
    lines += ["", "| rows | " + " | ".join(list(TARGETS) + INFO) + " |",
              "|---|" + "---|" * (len(TARGETS) + len(INFO))]
    for rows, entry in results["by_rows"].items():
        cells = [f"{entry['ratios'][k]:.2f} (target <= {TARGETS[k][3]})" for k in TARGETS]
        cells += [f"{entry['ratios'][k]:.2f}" for k in INFO]
        lines.append(f"| {int(rows):,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        sys.exit(measure_child(sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kubetune-bench-data"))
    parser.add_argument("--plain-packed-max-rows", type=int, default=100_000,
                        help="also run plain torchtune packed (its PackedDataset holds every "
                             "pack in memory: ~12 GB at 1M rows) up to this many rows")
    args = parser.parse_args()
    results = {"machine": machine(), "repeats": args.repeats, "by_rows": {}}
    for rows in args.rows:
        plain_packed = rows <= args.plain_packed_max_rows
        repeats = [one_repeat(args.workdir, rows, r, plain_packed) for r in range(args.repeats)]
        per_repeat = [ratios(found) for found in repeats]
        for found, each in zip(repeats, per_repeat):
            print(json.dumps({"rows": rows, **each, "runs": found}), file=sys.stderr, flush=True)
        results["by_rows"][rows] = {
            "runs": {run: {key: median([r[run][key] for r in repeats])
                           for key in repeats[0][run]} for run in repeats[0]},
            "ratios": {key: median([r[key] for r in per_repeat]) for key in per_repeat[0]},
        }
    print(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
