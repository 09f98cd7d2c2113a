"""Run support-matrix cells (tests/support/support_matrix.py) as a user would: each one a
TrainJob on the runtime that carries it, run by `kubetune local --runtime` (initializers,
trainer, exporter, as processes), several cells at once; each export loaded with
transformers / PEFT as its cell ends (`serve`), by the one serving-venv process of the
whole batch (tests/support/serving_session.py), which wrote the checkpoints before the
first cell: its imports are paid once and overlap the training.

Every cell trains the same way: 2 optimizer steps of batch 2 per process on 16 short rows
(two, the fewest in which every LoRA tensor trains: B starts at zero, so the first step
moves B alone and the second A too), fp32 (the tolerance of the exporter's own logits check
assumes it), no warm-up, and LoRA-family methods on every attention and MLP projection (and
the output where `all-linear` reaches it). The held-out loss is measured on 2 held-out rows
(the data's test split: one batch) on the base before the first step and after the last
one (`run_val_every_n_steps` = the steps): what the cell checks is that a held-out loss is
measured at both ends on that family and topology, not its value. (Measured, under load:
a cell's recipe process used 10-13 CPU-s where `import torchtune` alone used 10.5, so its
setup, steps and held-out loss are little beside its imports; the answers were what
counted, a quarter to a third of a fast-subset cell's CPU on 1 process.) The held-out
answers (base and tuned, greedy) depend on the family's tokenizer and model, not on the
method or topology: the fast subset's cells (every family) answer (one prompt of 4 new
tokens, decoded by the family's tokenizer: on these runs the answers' compute budget cut the
default 3 prompts of 64 tokens to one of 16) and must record them; the others ask for none
(`kubetune.val_prompts=0`), which saves their generation.

A cell of another objective (`Cell.objective`, `--objective` on `kubetune train`) trains
the same way on that objective's data (`write_objective_data`; SFT's where it has none):
DPO on 16 preference pairs with held-out pairs in a test split
(tests/support/preference_data.py), which it leaves out (`Objective.held_out`);
distillation on SFT's data, on its own runtime, the teacher named by a runtimePatch.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kubetune.workspace import ANSWERS_NAME
from tests.support import tiny_tokenizers
from tests.support.cli import REPO, clean_env, kubetune
from tests.support.runtimes import initializer_uris, runtime_file, write_trainjob
from tests.support.serving_session import SERVING_ENV, ServingSession
from tests.support.support_matrix import (FAST, GANG, LAYOUT, MODEL, OBJECTIVES, SFT, Cell,
                                          runtime_for)

HF_CHECKPOINT = REPO / "tests/support/hf_checkpoint.py"
VOCAB = 320  # the embedding rows; each tokenizer uses the first ones
STEPS = 2
ROWS = 16
HELD_OUT_ROWS = 2  # the data's test split (one batch): every cell measures its held-out loss
# The fast subset's held-out answers: one prompt, a few tokens (see the top).
ANSWER_PROMPTS = 1
ANSWER_TOKENS = 4
LEARNING_RATE = "1e-2"
LORA = {"lora_rank": 8, "lora_alpha": 16,
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True}
# torchtune overrides of the drop-in (`tune run`) and gang runtimes' TrainJobs, the same
# run the KUBETUNE_* settings below make of `kubetune train`.
TUNE_ARGS = [f"max_steps_per_epoch={STEPS}", "gradient_accumulation_steps=1", "dtype=fp32",
             "seed=0", "dataset.packed=False", "tokenizer.max_seq_len=64",
             f"optimizer.lr={LEARNING_RATE}"]
TRAIN_ENV = {"KUBETUNE_EPOCHS": "1", "KUBETUNE_MAX_STEPS": str(STEPS),
             "KUBETUNE_BATCH_SIZE": "2", "KUBETUNE_GRADIENT_ACCUMULATION_STEPS": "1",
             "KUBETUNE_DTYPE": "fp32", "KUBETUNE_SEED": "0", "KUBETUNE_PACKING": "false",
             "KUBETUNE_MAX_SEQ_LEN": "64", "KUBETUNE_LEARNING_RATE": LEARNING_RATE}
# The held-out loss at the base and after the last step, not after every step.
VAL_EVERY = STEPS
PEFT_ENV = {"KUBETUNE_WARMUP_STEPS": "0", "KUBETUNE_LORA_RANK": "8",
            "KUBETUNE_LORA_ALPHA": "16", "KUBETUNE_LORA_TARGET_MODULES": "all-linear"}


def serving(python: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True,
                          timeout=timeout, env=SERVING_ENV)


def write_held_out_split(dataset_dir: Path) -> None:
    """The data's test split beside its train split, as a hub dataset lays them out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kubetune.tools.demo.tiny_dataset import tiny_rows

    rows = tiny_rows(HELD_OUT_ROWS, seed=1)
    pq.write_table(pa.Table.from_pylist(rows), dataset_dir / "data" / "test.parquet")


def write_objective_data(root: Path) -> dict[str, Path]:
    """Each objective's data beyond SFT's, with its test split: objective -> directory."""
    from tests.support.preference_data import pairs, trl_standard

    rows = pairs(trl_standard, 64)
    preference = root / "preference"
    (preference / "data").mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows[:ROWS]), ("test", rows[-HELD_OUT_ROWS:])):
        (preference / "data" / f"{split}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in part))
    return {"dpo": preference}


def checkpoint_name(model: str) -> str:
    """The directory of a model's checkpoint: one per (architecture, tokenizer)."""
    spec = MODEL[model]
    return f"{spec.checkpoint}-{spec.tokenizer}"


def write_checkpoints(python: Path, root: Path, models: list[str],
                      session: ServingSession | None = None) -> dict[str, Path]:
    """One transformers-written checkpoint per model (shared by models with the same
    architecture and tokenizer), at shapes NF4 can quantize, in one serving process
    (``session``'s where one is given)."""
    dirs = {m: root / checkpoint_name(m) for m in models}
    todo = {d: MODEL[m] for m, d in dirs.items() if not (d / "config.json").is_file()}
    if todo:
        root.mkdir(parents=True, exist_ok=True)
        specs = [[m.checkpoint, str(d), VOCAB, "nf4"] for d, m in todo.items()]
        if session is not None:
            written = session.request({"op": "write-many", "specs": specs})
            assert "error" not in written, written["error"]
        else:
            (root / "checkpoints.json").write_text(json.dumps(specs))
            written = serving(python, str(HF_CHECKPOINT), "write-many",
                              str(root / "checkpoints.json"))
            assert written.returncode == 0, written.stderr[-3000:]
        for d, m in todo.items():
            tiny_tokenizers.TOKENIZERS[m.tokenizer](d)
    return dirs


@dataclass
class CellRun:
    cell: Cell
    runtime: str
    exit_code: int
    output: str  # kubetune local's stdout + stderr
    workspace: Path
    base: Path  # the checkpoint it started from
    export: Path | None = None
    steps: int = 0
    world_size: int = 0
    served: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)  # summary.json's

    @property
    def validated(self) -> bool:
        """The held-out loss measured on the base (step 0) and after the last step (a DPO
        run's: the DPO loss on its held-out pairs); under an objective whose ``held_out``
        is off, none measured, and its test split left out of training."""
        v = self.validation or {}
        if self.cell.objective != SFT and not OBJECTIVES[self.cell.objective].held_out:
            return not v and not self.answered

        finite = all(isinstance(v.get(k), float) and math.isfinite(v[k])
                     for k in ("base_val_loss", "last_val_loss"))
        return finite and v.get("last_step") == STEPS and v.get("split") == "test" \
            and (self.answered if self.cell in FAST else not self.answered)

    @property
    def answered(self) -> bool:
        """Held-out prompts answered by the base and by the tuned model."""
        record = self.workspace / "output" / ANSWERS_NAME
        prompts = json.loads(record.read_text()).get("prompts") if record.is_file() else None
        return bool(prompts) and all(isinstance(p.get("base"), str) and
                                     isinstance(p.get("tuned"), str) for p in prompts)

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith("error: ")]

    @property
    def stepped(self) -> bool:
        return bool(re.search(r"train: step \d", self.output))

    def outcome(self) -> dict:
        """What the results file records: passed, or unsupported with its one line; any
        other result is a failure, described."""
        if self.exit_code == 0 and self.served.get("ok"):
            return {"outcome": "passed"}
        if self.exit_code == 65 and len(self.error_lines) == 1 and not self.stepped:
            return {"outcome": "unsupported", "line": self.error_lines[0]}
        return {"outcome": "failed", "detail": self.failure()}

    def failure(self) -> str:
        if self.exit_code != 0:
            return f"exit {self.exit_code}: " + " | ".join(self.error_lines or
                                                          self.output.splitlines()[-5:])
        return f"steps {self.steps}, world size {self.world_size}, export {self.export}, " \
               f"validation {self.validation}: {self.served}"


def _peft_spec(cell: Cell) -> dict | None:
    if cell.method == "full":
        return None
    return {**LORA, "quantize_base": cell.method == "qlora", "use_dora": cell.method == "dora"}


def _validation_settings(cell: Cell) -> dict[str, str]:
    """The held-out settings as config keys (see the top): answers in the fast subset only."""
    answers = {"kubetune.val_prompts": str(ANSWER_PROMPTS),
               "kubetune.val_max_new_tokens": str(ANSWER_TOKENS)} if cell in FAST \
        else {"kubetune.val_prompts": "0"}
    return {"run_val_every_n_steps": str(VAL_EVERY), **answers}


def _validation_env(cell: Cell) -> dict[str, str]:
    """The same settings as `kubetune train` reads them: its options' env, and the one
    config key it has no option for among its overrides."""
    keys = _validation_settings(cell)
    env = {"KUBETUNE_VAL_EVERY_N_STEPS": keys.pop("run_val_every_n_steps"),
           "KUBETUNE_VAL_PROMPTS": keys.pop("kubetune.val_prompts")}
    if keys:
        env["KUBETUNE_TRAIN_OVERRIDES"] = " ".join(f"{k}={v}" for k, v in keys.items())
    return env


def trainjob_spec(cell: Cell, runtime: str, model_dir: Path, dataset_dir: Path) -> dict:
    """The TrainJob a user would write for ``cell`` on ``runtime``."""
    from tests.support.sdk_trainjob import sdk_trainjob_spec, use_local_sources

    nodes, processes = LAYOUT[cell.topology]
    validation = [f"{k}={v}" for k, v in _validation_settings(cell).items()]
    if runtime.startswith("torchtune-"):  # the SDK's BuiltinTrainer, as a notebook sends it
        spec = use_local_sources(
            sdk_trainjob_spec(runtime_file(runtime), batch_size=2, peft=_peft_spec(cell),
                              gpus=processes), model_dir, dataset_dir)
        spec["trainer"]["numNodes"] = nodes
        spec["trainer"]["numProcPerNode"] = processes
        spec["trainer"]["args"] += TUNE_ARGS + validation + (
            ["lr_scheduler.num_warmup_steps=0"] if cell.method != "full" else [])
        return spec
    if runtime == GANG:  # one stage per node: sources from the trainer's env
        return {"trainer": {
            "numNodes": nodes, "numProcPerNode": processes,
            "env": [{"name": "MODEL_URI", "value": f"file://{model_dir}"},
                    {"name": "DATASET_URI", "value": f"file://{dataset_dir}"}],
            "args": ["epochs=1", "batch_size=2", "dataset=torchtune.datasets.instruct_dataset",
                     "dataset.split=train", *TUNE_ARGS, *validation]}}
    env = {**TRAIN_ENV, "KUBETUNE_METHOD": cell.method,
           **({} if cell.objective == SFT else {"KUBETUNE_OBJECTIVE": cell.objective}),
           **(PEFT_ENV if cell.method != "full" else {}), **_validation_env(cell)}
    spec = {**initializer_uris(f"file://{model_dir}", f"file://{dataset_dir}"),
            "trainer": {"numNodes": nodes, "numProcPerNode": processes,
                        "env": [{"name": k, "value": v} for k, v in env.items()]}}
    if cell.objective == "distill":  # the teacher: the student's own checkpoint
        spec["runtimePatches"] = [teacher_patch(f"file://{model_dir}")]
    return spec


def teacher_patch(uri: str) -> dict:
    """A TrainJob's runtimePatch naming the distillation runtime's teacher (its third
    initializer takes no TrainJob initializer block), as examples/trainjobs shows users."""
    container = {"name": "teacher-initializer", "env": [{"name": "STORAGE_URI", "value": uri}]}
    job = {"name": "teacher-initializer",
           "template": {"spec": {"template": {"spec": {"containers": [container]}}}}}
    return {"manager": "kubetune.io/teacher",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def _slug(cell: Cell) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cell.key.lower()).strip("-")


def run_cell(cell: Cell, model_dir: Path, dataset_dir: Path, root: Path) -> CellRun:
    runtime = runtime_for(cell)
    workdir = root / _slug(cell)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    job = write_trainjob(workdir / "trainjob.yaml", runtime,
                         trainjob_spec(cell, runtime, model_dir, dataset_dir), name="matrix")
    result = kubetune("local", "--workdir", str(workdir / "run"), "--runtime",
                      str(runtime_file(runtime)), "--trainjob", str(job), env=clean_env(),
                      timeout=900)
    ws = workdir / "run" / "workspace"
    run = CellRun(cell, runtime, result.returncode, result.stdout + result.stderr, ws,
                  model_dir)
    summary = ws / "output" / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        run.steps, run.world_size = data.get("steps", 0), data.get("world_size", 0)
        run.validation = data.get("validation") or {}
    if (ws / "export" / "manifest.json").is_file():
        run.export = ws / "export"
    return run


def run_cells(cells: list[Cell], checkpoints: dict[str, Path], datasets: dict[str, Path],
              root: Path, workers: int,
              after: Callable[[CellRun], None] = lambda run: None) -> list[CellRun]:
    """Run ``cells``, ``workers`` at a time (each a `kubetune local` of its own), each on
    its objective's data (``datasets``: objective -> directory; SFT's where it has none of
    its own); ``after`` each cell's run, in its worker (the export served)."""
    # The longest first (two processes, full weights, a reference model or a teacher):
    # in table order a long cell could start last and run alone, one CPU idle.
    ordered = sorted(cells, key=lambda c: (-_world_size(c), c.method != "full",
                                           c.objective == SFT))

    def run(cell: Cell) -> CellRun:
        done = run_cell(cell, checkpoints[cell.model],
                        datasets.get(cell.objective, datasets[SFT]), root)
        after(done)
        return done

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, ordered))


def serve(session: ServingSession, run: CellRun) -> None:
    """Load ``run``'s export as a user's serving code does (an adapter with PEFT onto its
    base, merged weights with transformers), in the batch's serving process, and fill its
    ``served``: ok when the logits are finite and moved from the base's, and the run
    trained, measured and answered as asked."""
    if run.export is None:
        return
    report = session.request({"op": "load", "base": str(run.base), "export": str(run.export)})
    run.served = {**report, "ok": _served_ok(report) and run.steps == STEPS
                  and run.world_size == _world_size(run.cell) and run.validated}


def _world_size(cell: Cell) -> int:
    nodes, processes = LAYOUT[cell.topology]
    return nodes * processes


def _served_ok(report: dict) -> bool:
    if "error" in report or not (report["finite"] and report["moved"] > 0):
        return False
    if report["kind"] == "adapter":  # every exported tensor is the one PEFT loaded
        return report["equal"] == report["tensors"] > 0 and not report["missing"] \
            and not report["unexpected"]
    return True


def results(runs: list[CellRun]) -> dict[str, dict]:
    return {r.cell.key: {"runtime": r.runtime, **r.outcome()} for r in runs}

