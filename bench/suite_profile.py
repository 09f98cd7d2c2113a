"""Where `make test`'s time goes: the report `make test-profile` writes (docs/testing.md).

Reads a profile directory:
- ``junit.xml``: pytest's per-test seconds (setup, call and teardown);
- ``processes.jsonl``: every Python process the suite started (tests/support/process_log.py):
  the test that started it, its command line, its life, whether it imported torch;
- ``stacks.txt``: py-spy's samples of the pytest workers and all their children (raw
  collapsed stacks, 10 a second of CPU), each sample put in one phase by its frames.

Prints markdown: the suite's phases in CPU seconds, then one row per test file (tests,
seconds, processes started, those that imported torch, training runs, and the file's CPU
seconds by phase). A training run is one recipe launch: a torchrun, or a recipe process
that no torchrun started.

    python bench/suite_profile.py test-profile/ > test-profile/report.md
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from pathlib import Path

RATE = 10  # samples a CPU-second: `make test-profile`'s --rate

RECIPE = "kubetune.trainer.recipe_process.bootstrap"
TORCHRUN = "torch.distributed.run"

# A sample's phase: the first rule whose pattern one of its frames matches (a frame is
# "function (path:line)"), tried in this order, so a narrower phase wins over the one
# around it (an import inside the exporter counts as an import; generation inside
# validation as answers).
PHASES = [
    ("imports", re.compile(r"\(<frozen importlib\._bootstrap")),
    ("pip (the serving venv)", re.compile(r"\(pip/")),
    ("held-out answers (generation)", re.compile(r"validation/answers\.py")),
    ("held-out loss", re.compile(r"validation/val_loop\.py|recipe_process/held_out\.py")),
    ("tokenization", re.compile(r"token_cache/|tokenizers?/|_tokenizer\.py|sample_capture\.py")),
    ("checkpoint saves", re.compile(r"save_checkpoint|checkpoint_store\.py")),
    ("export", re.compile(r"exporter/")),
    # A recipe's methods are sampled as "Class.train (recipes/...)".
    ("training steps", re.compile(r"\btrain \((recipes/|.*recipe_hooks)")),
    ("recipe setup (model build, weights load)", re.compile(r"\bsetup \(recipes/|recipe_process/")),
    ("initializers", re.compile(r"initializers/")),
    ("transformers/peft (serving checks)", re.compile(r"transformers/|peft/")),
    ("kubetune local, launcher, plans", re.compile(r"tools/local/|trainer/(launch|launcher|planning|request|config)")),
]
# py-spy counts a thread as busy in a few blocking calls it cannot tell from work: a
# sample whose innermost frame waits is counted apart, not as its phase.
WAITING = re.compile(r"^(\w+\.)?(wait|_wait|_try_wait|sleep|select|poll|communicate|"
                     r"_communicate|acquire|join|read|readline|recv|recv_into|accept)\b")


def phase_of(frames: list[str]) -> str:
    if not frames:
        return "no Python frame (interpreter start-up, native threads)"
    if WAITING.match(frames[-1]):
        return "waiting (counted busy by py-spy)"
    for name, pattern in PHASES:
        if any(pattern.search(frame) for frame in frames):
            return name
    return "other (tests' own code, servers, pytest)"


def file_of_test(test: str) -> str:
    """``tests/test_x.py::test_y (call)`` -> ``test_x.py``."""
    return Path(test.split("::", 1)[0]).name if test else ""


def read_junit(path: Path) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = defaultdict(list)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname "tests.test_x" or "tests.test_x.TestClass": the test_* part.
        name = next((part for part in module if part.startswith("test_")), module[-1])
        seconds[f"{name}.py"].append(float(case.get("time", 0)))
    return seconds


def read_processes(path: Path) -> tuple[dict[int, dict], dict[str, Counter]]:
    """Each process by pid, and per test file: processes, torch imports, training runs."""
    by_pid: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        by_pid.setdefault(record["pid"], {}).update(record)
    per_file: dict[str, Counter] = defaultdict(Counter)
    for process in by_pid.values():
        test_file = file_of_test(process.get("test", ""))
        if not test_file:
            continue
        argv = " ".join(process.get("argv", []))
        parent = " ".join(by_pid.get(process.get("ppid"), {}).get("argv", []))
        counts = per_file[test_file]
        counts["processes"] += 1
        counts["torch"] += bool(process.get("torch"))
        counts["training runs"] += TORCHRUN in argv or (RECIPE in argv and TORCHRUN not in parent)
        counts["cpu"] += process.get("cpu", 0.0)
    return by_pid, per_file


def read_stacks(path: Path, by_pid: dict[int, dict]) -> dict[str, Counter]:
    """Samples per test file and phase (the leaf process's test; in a pytest worker's own
    process, the test function on the stack)."""
    per_file: dict[str, Counter] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue  # a command line with a newline in it splits its sample over lines
        frames = stack.split(";")
        pids = [int(m.group(1)) for frame in frames if (m := re.match(r"process (\d+):", frame))]
        frames = [frame for frame in frames if not frame.startswith("process ")]
        test_file = file_of_test(by_pid.get(pids[-1], {}).get("test", "")) if pids else ""
        if not test_file:
            test_file = next((m.group(1) for frame in frames
                              if (m := re.search(r"\((?:.*/)?(test_\w+\.py):", frame))), "")
        per_file[test_file or "(outside any test)"][phase_of(frames)] += int(count)
    return per_file


def report(directory: Path) -> str:
    seconds = read_junit(directory / "junit.xml")
    by_pid, processes = read_processes(directory / "processes.jsonl")
    samples = read_stacks(directory / "stacks.txt", by_pid) if (directory / "stacks.txt").exists() else {}
    phases = Counter()
    for counts in samples.values():
        phases.update(counts)
    total = sum(phases.values()) or 1
    lines = ["## Where the CPU time goes (py-spy samples of every process)", "",
             "| phase | CPU s | share |", "|---|---:|---:|"]
    lines += [f"| {name} | {count / RATE:.0f} | {100 * count / total:.0f}% |"
              for name, count in phases.most_common()]
    lines += [f"| **all** | **{total / RATE:.0f}** | |", "",
              "## Per test file (slowest first)", "",
              "| file | tests | seconds | processes | imported torch | training runs | processes' CPU s "
              "| top phases (sampled s) |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    names = sorted(set(seconds) | set(processes), key=lambda name: -sum(seconds.get(name, [])))
    for name in names:
        counts, phase_counts = processes.get(name, Counter()), samples.get(name, Counter())
        top = ", ".join(f"{phase} {count / RATE:.0f}" for phase, count in phase_counts.most_common(3))
        lines.append(f"| {name} | {len(seconds.get(name, []))} | {sum(seconds.get(name, [])):.0f} | "
                     f"{counts['processes']} | {counts['torch']} | {counts['training runs']} | "
                     f"{counts['cpu']:.0f} | {top} |")
    all_seconds = sum(sum(values) for values in seconds.values())
    lines += ["", f"{sum(len(v) for v in seconds.values())} tests, {all_seconds:.0f} test-seconds "
              f"(summed over both workers), {sum(c['processes'] for c in processes.values())} processes, "
              f"{sum(c['training runs'] for c in processes.values())} training runs."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(report(Path(sys.argv[1] if len(sys.argv) > 1 else "test-profile")))
