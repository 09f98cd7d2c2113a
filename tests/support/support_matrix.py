"""The support matrix: every model family the docs name x every fine-tuning method x every
topology the runtimes use, and for each cell the runtime that carries it or the cell whose
run covers it. tests/test_support_matrix.py runs it; docs/support-matrix.json records what
the runs gave; docs/runtimes.md's table is rendered from that file
(tests/support/matrix_table.py).

A cell is *run* when it is a code path of its own: the family's builder, checkpointer and
tokenizer under that method's recipe (every family x method on 1 process), FSDP sharding
that family's modules (every family x method on 2 processes), a multi-node config's
model-shaped settings (full fine-tuning on 2 nodes, every family). A cell is *covered* by
another when nothing the two differ in reaches the code the cell would run: `COVERAGE`
says why, and the docs print it.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("lora", "qlora", "dora", "full")
METHOD_NAMES = {"lora": "LoRA", "qlora": "QLoRA", "dora": "DoRA", "full": "full"}
TOPOLOGIES = ("1 process", "2 processes", "2 nodes")
# nodes, processes per node
LAYOUT = {"1 process": (1, 1), "2 processes": (1, 2), "2 nodes": (2, 1)}

BYO = "kubetune-byo-model"
GANG = "kubetune-llama3.1-8b-full-multinode"


@dataclass(frozen=True)
class Model:
    name: str  # as README.md and docs/ name it
    checkpoint: str  # tests/support/hf_checkpoint.py FAMILIES key
    tokenizer: str  # tests/support/tiny_tokenizers.TOKENIZERS key
    runtime: str  # the runtime a user of this model takes: a drop-in, a direct one, BYO
    shape: str  # what sets this checkpoint apart, for the docs


MODELS = (
    Model("Llama 3", "llama3", "llama3", BYO, "plain RoPE, untied"),
    Model("Llama 3.1", "llama3.1", "llama3", "kubetune-llama3.1-8b-lora",
          "llama3 RoPE scaling x8, untied"),
    Model("Llama 3.2", "llama3.2", "llama3", "torchtune-llama3.2-1b",
          "llama3 RoPE scaling x32, tied"),
    Model("Llama 3.3", "llama3.1", "llama3", "torchtune-llama3.3-70b",
          "Llama 3.1's architecture, the 70B drop-in's configs"),
    Model("Mistral", "mistral", "spm", "kubetune-mistral-7b-lora",
          "llama-shaped, own model_type, sentencepiece"),
    Model("Qwen2 / Qwen2.5 (7B+)", "qwen2", "qwen2", "kubetune-qwen2.5-7b-qlora",
          "q/k/v biases, untied"),
    Model("Qwen2 / Qwen2.5 (0.5B-3B)", "qwen2-tied", "qwen2", "torchtune-qwen2.5-1.5b",
          "q/k/v biases, tied"),
    Model("Qwen3 (8B+)", "qwen3", "qwen3", "kubetune-qwen3-8b-lora",
          "own head_dim, q/k norms, untied"),
    Model("Qwen3 (0.6B-4B)", "qwen3-tied", "qwen3", BYO, "own head_dim, q/k norms, tied"),
    Model("Gemma", "gemma", "spm", "kubetune-gemma-7b-lora",
          "(1+w) norms, GeLU, own head_dim, one KV head, tied"),
    Model("Gemma 2", "gemma2", "spm", BYO, "soft-capping, sliding window, tied"),
    Model("Phi-3", "phi3", "phi3", BYO, "fused qkv/gate_up in HF, sentencepiece"),
    Model("Phi-4", "phi3", "phi4", BYO, "Phi-3's architecture, byte-level BPE"),
    # Checkpoints of a supported architecture as other houses ship them (issue 52). Every
    # checkpoint here is written by transformers 5 (`rope_parameters`, `dtype`).
    Model("Llama, tokenizer.json only", "llama3.2", "json-only", BYO,
          "SmolLM2 / TinyLlama's layout: tokenizer.json and a chat template of its own, "
          "no original/; tied"),
    Model("Llama, sharded, generation EOS list", "llama3", "json-sharded", BYO,
          "tokenizer.json only, untied, two safetensors shards and their index, a "
          "generation_config.json stopping at more EOS ids than the tokenizer's"),
    Model("Llama, sentencepiece only", "llama3", "spm-only", BYO,
          "Llama 2's layout: a sentencepiece tokenizer.model, no tokenizer.json"),
)
# Each shape row -> the family row whose builder, checkpointer and FSDP units it shares.
SHAPE_TWINS = {"Llama, tokenizer.json only": "Llama 3.2",
               "Llama, sharded, generation EOS list": "Llama 3",
               "Llama, sentencepiece only": "Llama 3"}
MODEL = {m.name: m for m in MODELS}
# Chat data on each model: tests/support/family_chat_templates.py's family whose instruct
# template it trains in, and what proves it: a real run of the family's tiny checkpoint
# whose merged export renders the training ids (tests/test_chat_template_training.py).
CHAT_TEMPLATE = {
    "Llama 3": ("llama3", "run"), "Llama 3.1": ("llama3", "run"), "Llama 3.2": ("llama3", "run"),
    "Llama 3.3": ("llama3", "run"), "Mistral": ("mistral", "run"),
    "Qwen2 / Qwen2.5 (7B+)": ("qwen2.5", "run"), "Qwen2 / Qwen2.5 (0.5B-3B)": ("qwen2.5", "run"),
    "Qwen3 (8B+)": ("qwen3", "run"), "Qwen3 (0.6B-4B)": ("qwen3", "run"),
    "Gemma": ("gemma", "run"), "Gemma 2": ("gemma2", "run"),
    "Phi-3": ("phi3", "run"), "Phi-4": ("phi4", "run"),
    # Their own template, rendered by the fast tokenizer: tests/test_fast_tokenizer.py, and
    # a real SmolLM2 run whose export answers through it (tests/test_real_model.py).
    "Llama, tokenizer.json only": ("own", "run"),
    "Llama, sharded, generation EOS list": ("own", "run"),
    # No tokenizer.json to render a template with: torchtune's Llama 2 format.
    "Llama, sentencepiece only": ("llama2", None),
}


# The objective axis: SFT on every family; each objective beyond it (`--objective`) on the
# families its entry names. Its code path is the objective's recipe and data around the
# same model builders, checkpointers and FSDP units SFT's cells run for every family, so one
# family carries an objective; its cells are (family, method, topology, objective). Another
# objective is one more entry (its data: tests/support/matrix_runner.write_objective_data).
SFT = "sft"


@dataclass(frozen=True)
class Objective:
    name: str  # as the table names it
    models: tuple[str, ...]  # the families whose rows it has
    why: str  # why those families carry it, for the docs
    methods: tuple[str, ...] = METHODS  # the columns it has cells in
    held_out: bool = True  # its runs measure the held-out loss (the runner checks it)
    runtime: str | None = None  # a runtime of its own (else the family's, as SFT's)


OBJECTIVES = {
    "dpo": Objective(
        "DPO", ("Llama 3",),
        "DPO changes the recipe (torchtune's lora_dpo_single_device, lora_dpo_distributed, "
        "full_dpo_distributed), the data (preference pairs) and the loss, not the model: "
        "the family's builder, checkpointer, tokenizer and FSDP units are the ones its SFT "
        "cells run, for every family; Llama 3's tiny checkpoint carries DPO's cells",
        ),  # its held-out pairs: trainer/validation/preference_held_out.py
    "distill": Objective(
        "Distillation", ("Llama 3",),
        "distillation changes the recipe (torchtune's knowledge_distillation_single_device "
        "and _distributed), adds a frozen teacher (its runtime's third initializer, into "
        "/workspace/teacher) and the loss, not the student's model, whose builder, "
        "checkpointer and FSDP units every family's SFT cells run; Llama 3's tiny checkpoint "
        "carries its cells, the same checkpoint its teacher (one tokenizer, as distillation "
        "needs: the cell proves the path, tests/test_objective_distill.py a deeper teacher)",
        runtime="kubetune-llama3.2-1b-distill-lora"),
}
OBJECTIVE_NAMES = {SFT: "SFT", **{key: o.name for key, o in OBJECTIVES.items()}}


@dataclass(frozen=True)
class Cell:
    model: str
    method: str
    topology: str
    objective: str = SFT

    @property
    def key(self) -> str:
        key = f"{self.model} | {METHOD_NAMES[self.method]} | {self.topology}"
        return key if self.objective == SFT else f"{key} | {OBJECTIVE_NAMES[self.objective]}"


def all_cells() -> list[Cell]:
    sft = [Cell(m.name, method, topology) for m in MODELS for method in METHODS
           for topology in TOPOLOGIES]
    return sft + [Cell(model, method, topology, key)
                  for key, objective in OBJECTIVES.items() for model in objective.models
                  for method in objective.methods for topology in TOPOLOGIES]


# Cells whose run would exercise nothing another run does not: cell -> (the cell that
# covers it, why). Written as rules over the whole table.
_TWO_NODE_ADAPTER_RUNS = {"Llama 3.2", "Qwen3 (8B+)"}
_TWO_PROCESS_DORA_RUNS = {"Llama 3.1", "Qwen2 / Qwen2.5 (7B+)", "Gemma 2"}
# A tied checkpoint -> the untied one of its family.
_TIED_TWINS = {"Qwen2 / Qwen2.5 (0.5B-3B)": "Qwen2 / Qwen2.5 (7B+)",
               "Qwen3 (0.6B-4B)": "Qwen3 (8B+)"}


def coverage(cell: Cell) -> tuple[Cell, str] | None:
    """The cell whose run covers ``cell``, and why; None for a cell run itself."""
    if cell.objective != SFT:
        return _objective_coverage(cell)
    if cell.model in SHAPE_TWINS and (cell.method, cell.topology) != ("lora", "1 process"):
        return (Cell(SHAPE_TWINS[cell.model], cell.method, cell.topology),
                "the same builder, checkpointer and FSDP units as its family's row; the "
                "files around the weights, the one difference, are read at load and at "
                "export the same way under any method and topology: this row's LoRA "
                "1-process cell runs them")
    if cell.model == "Llama 3" and (cell.topology != "1 process"
                                    or cell.method in ("qlora", "dora")):
        return (Cell("Llama 3.1", cell.method, cell.topology),
                "the same modules, LoRA variants and FSDP units: Llama 3 and 3.1 differ "
                "only in RoPE frequencies, which Llama 3's LoRA and full runs and the "
                "logits check cover")
    if cell.model == "Llama 3.3" and cell.topology == "1 process":
        return (Cell("Llama 3.1", cell.method, cell.topology),
                "torchtune ships no single-device 70B config: the drop-in falls back to "
                "llama3_2/1B's, the configs kubetune train runs Llama 3.1's cell with")
    if cell.model == "Llama 3.3" and cell.method == "dora" and cell.topology == "2 processes":
        return (Cell("Llama 3.1", cell.method, cell.topology),
                "the drop-in's DoRA is its LoRA config (llama3_3/70B_lora, run) with "
                "use_dora; DoRA under FSDP on this architecture is Llama 3.1's cell")
    if (cell.model in _TIED_TWINS and cell.method in ("qlora", "dora")
            and cell.topology == "1 process"):
        return (Cell(_TIED_TWINS[cell.model], cell.method, cell.topology),
                "the same builder, LoRA variant and checkpointer; the tied output, the one "
                "difference, changes the output LoRA (its LoRA cell runs it) and the saved "
                "weights (its full and 2-process cells run them)")
    if cell.model == "Phi-4" and cell.topology != "1 process":
        return (Cell("Phi-3", cell.method, cell.topology),
                "Phi-4 is Phi-3's architecture; its tokenizer, the one difference, makes "
                "the same batches on any topology (Phi-4's 1-process cells run it)")
    if (cell.method == "dora" and cell.topology == "2 processes"
            and cell.model not in _TWO_PROCESS_DORA_RUNS):
        return (Cell(cell.model, "lora", cell.topology),
                "the family's modules under FSDP, as LoRA runs them; DoRA's magnitudes under "
                "FSDP are the same DoRALinear in every family's builder, run for "
                + ", ".join(sorted(_TWO_PROCESS_DORA_RUNS)))
    if (cell.topology == "2 nodes" and cell.method in ("lora", "dora")
            and cell.model not in _TWO_NODE_ADAPTER_RUNS):
        return (Cell(cell.model, cell.method, "2 processes"),
                "the same recipe and config on a world of 2, sharded alike; the 2-node "
                "launch is the same for every family and is run for "
                + " and ".join(sorted(_TWO_NODE_ADAPTER_RUNS)))
    return None


# An objective's 2-node cells its 2-process ones cover (LoRA's 2-node cell runs the
# launch), with the name its recipe goes by.
_TWO_NODE_COVERED = {("dpo", "dora"): "DPO", ("dpo", "full"): "DPO", ("distill", "dora"): "KD"}


def _objective_coverage(cell: Cell) -> tuple[Cell, str] | None:
    recipe = _TWO_NODE_COVERED.get((cell.objective, cell.method))
    if recipe is not None and cell.topology == "2 nodes":
        return (Cell(cell.model, cell.method, "2 processes", cell.objective),
                f"the same {recipe} recipe and config on a world of 2, sharded alike; the "
                f"2-node launch of a {recipe} recipe is LoRA's 2-node cell, run")
    return None  # run; a method the objective's recipes cannot train is refused (65)


def run_cells() -> list[Cell]:
    return [c for c in all_cells() if coverage(c) is None]


def runtime_for(cell: Cell) -> str:
    """The runtime that carries ``cell``: the model's own where it admits the cell, else
    kubetune-byo-model (tests/test_support_matrix.py checks this against the admission
    rules upstream's webhook applies)."""
    model = MODEL[cell.model]
    if cell.objective != SFT:  # chosen by `kubetune train --objective`: no drop-in's
        if OBJECTIVES[cell.objective].runtime:
            return OBJECTIVES[cell.objective].runtime
        return model.runtime if not model.runtime.startswith("torchtune-") else BYO
    if cell.model == "Llama 3.1" and cell.method == "full" and cell.topology == "2 nodes":
        return GANG
    if model.runtime.startswith("torchtune-") and not dropin_admits(model.runtime, cell):
        return BYO
    return model.runtime


# What upstream's TrainJob admission lets a `tune run` TrainJob do on each drop-in
# (kubetune/tools/local/admission_rules.py holds the rules; the test checks these against
# them): only the 70B trains on several nodes, and only full fine-tuning does; QLoRA on
# the 1B/3B runs on one process; Qwen2.5 1.5B has no QLoRA.
def dropin_admits(runtime: str, cell: Cell) -> bool:
    nodes, processes = LAYOUT[cell.topology]
    if nodes > 1:
        return runtime == "torchtune-llama3.3-70b" and cell.method == "full"
    if cell.method == "qlora":
        if runtime == "torchtune-qwen2.5-1.5b":
            return False
        if runtime in ("torchtune-llama3.2-1b", "torchtune-llama3.2-3b"):
            return processes == 1
    return True


# The cells `make test` runs (tests/test_support_matrix.py): every family, method and
# topology at least once, each a run cell of the full matrix. Gemma | LoRA | 1 process
# runs in `make matrix-test` only: in `make test`, Gemma's QLoRA cell below takes its
# runtime, answers and a PEFT-loaded Gemma adapter, and tests/test_chat_template_training.py
# LoRA-trains the same Gemma checkpoint on 1 process through the exporter's logits check.
FAST = (
    Cell("Llama 3", "lora", "1 process"),
    Cell("Llama 3.1", "full", "2 nodes"),
    Cell("Llama 3.2", "full", "2 nodes"),
    Cell("Llama 3.3", "full", "2 processes"),
    Cell("Mistral", "qlora", "1 process"),
    Cell("Qwen2 / Qwen2.5 (7B+)", "dora", "2 processes"),
    Cell("Qwen2 / Qwen2.5 (0.5B-3B)", "lora", "2 processes"),
    Cell("Qwen3 (8B+)", "lora", "2 nodes"),
    Cell("Qwen3 (0.6B-4B)", "full", "1 process"),
    Cell("Gemma", "qlora", "2 nodes"),
    Cell("Gemma 2", "dora", "1 process"),
    Cell("Phi-3", "qlora", "2 processes"),
    Cell("Phi-4", "dora", "1 process"),
)
