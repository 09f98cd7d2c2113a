"""What each variable of `kubetune/env.py` means: who sets it, which step reads it, its
default. docs/env.md is rendered from this table (``python -m kubetune.env_table``), and
tests/test_env_table.py keeps the two equal: a name added to env.py fails that test until
it has a row here and the doc is rendered again.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kubetune import env

# Who sets a variable.
YOU = "you"  # the user or the runtime's author, in a pod spec, a TrainJob or a shell
TRAINER = "Kubeflow Trainer"  # the controller, the SDK or the kubelet
OURS = "kubetune"  # one of our processes for another (launcher -> recipe, local -> steps)
TESTS = "tests only"  # test hooks: inert unless set, never in a runtime
LIBRARY = "kubetune, for a library"  # set by us for torch, huggingface_hub...

INIT = "initializers"
LOCAL = "local"


@dataclass(frozen=True)
class Var:
    setter: str
    steps: str
    meaning: str
    default: str = ""


def _train(meaning: str, default: str = "the recipe's") -> Var:
    return Var(YOU, "trainer, local", meaning, default)


ROWS: dict[str, Var] = {
    # Workspace
    env.WORKSPACE: Var(YOU, "all", "root of the shared volume (the PVC)", "/workspace"),
    env.DATASET_DIR: Var(YOU, "all", "the dataset initializer's output", "<workspace>/dataset"),
    env.MODEL_DIR: Var(YOU, "all", "the model initializer's output", "<workspace>/model"),
    env.OUTPUT_DIR: Var(YOU, "trainer, exporter", "trainer output: checkpoints, metrics",
                        "<workspace>/output"),
    env.EXPORT_DIR: Var(YOU, "exporter", "local export directory", "<workspace>/export"),
    # Initializers
    env.STORAGE_URI: Var(TRAINER, INIT, "where to fetch from (file, hf://, s3://, a plugin's)",
                         "required"),
    env.OUTPUT_PATH: Var(TRAINER, INIT, "directory to fill", "<workspace>/model or /dataset"),
    env.ACCESS_TOKEN: Var(TRAINER, INIT, "token for a private hub source (secret)"),
    env.IGNORE_PATTERNS: Var(TRAINER, INIT, "comma-separated globs to skip"),
    env.ALLOW_PATTERNS: Var(TRAINER, INIT, "comma-separated globs; only these are fetched"),
    env.REVISION: Var(TRAINER, INIT, "hub branch, tag or commit", "main"),
    env.S3_ENDPOINT: Var(TRAINER, "initializers, exporter", "S3 endpoint URL", "AWS"),
    env.S3_ACCESS_KEY_ID: Var(TRAINER, "initializers, exporter", "S3 key id (secret)",
                              "boto3's chain"),
    env.S3_SECRET_ACCESS_KEY: Var(TRAINER, "initializers, exporter", "S3 secret key (secret)",
                                  "boto3's chain"),
    env.S3_REGION: Var(TRAINER, "initializers, exporter", "S3 region", "boto3's"),
    env.S3_ROLE_ARN: Var(TRAINER, "initializers, exporter", "IAM role to assume for S3"),
    env.HF_TOKEN: Var(YOU, "initializers, exporter", "hub token (huggingface_hub's name)"),
    env.HF_ENDPOINT: Var(YOU, "initializers, exporter", "hub endpoint",
                         "https://huggingface.co"),
    env.DOWNLOAD_WORKERS: Var(YOU, INIT, "files fetched at once", "8"),
    env.S3_PART_SIZE_MB: Var(YOU, INIT, "largest ranged-GET part, MB", "16"),
    env.S3_PART_WORKERS: Var(YOU, INIT, "ranged parts in flight, all objects", "8"),
    env.HTTP_TIMEOUT_S: Var(YOU, "initializers, exporter", "connect / read timeout of one "
                            "request, s", "60"),
    env.PROGRESS_INTERVAL_S: Var(YOU, INIT, "seconds between two progress lines", "5"),
    # Trainer topology
    env.PET_NNODES: Var(TRAINER, "trainer", "nodes of the run (torch plugin)", "1"),
    env.PET_NPROC_PER_NODE: Var(TRAINER, "trainer", "processes per node", "auto"),
    env.PET_NODE_RANK: Var(TRAINER, "trainer", "this node's rank", "0"),
    env.PET_MASTER_ADDR: Var(TRAINER, "trainer", "rendezvous host"),
    env.PET_MASTER_PORT: Var(TRAINER, "trainer", "rendezvous port", "29500"),
    # Exporter
    env.EXPORT_URI: Var(YOU, "exporter, local", "export destination (path, s3://, hf://)",
                        "<workspace>/export"),
    env.EXPORT_FORMAT: Var(YOU, "exporter", "adapter, merged or both",
                           "adapter for LoRA, merged for full"),
    env.EXPORT_REVISION: Var(YOU, "exporter", "hf:// only: branch to commit to", "main"),
    env.EXPORT_VERIFY_LOGITS: Var(YOU, "exporter", "check base + adapter against the merged "
                                  "model's logits (1 or 0)", "1"),
    env.EXPORT_VERIFY_MAX_BYTES: Var(YOU, "exporter", "skip the logits check above this "
                                     "float32 size", "a quarter of memory"),
    env.EXPORT_CHAT_TEMPLATE: Var(YOU, "exporter", "check, trained or base", "check"),
    env.EXPORT_CHECKPOINT: Var(YOU, "exporter", "which saved checkpoint to export: last, or "
                               "best (the lowest validation loss)", "last"),
    # Failure reporting, logs
    env.TERMINATION_LOG: Var(YOU, "all", "where the one-line failure report is written",
                             env.DEFAULT_TERMINATION_LOG),
    env.LOG_FORMAT: Var(YOU, "all", "text or json (one object per line)", "text"),
    env.LOG_LEVEL: Var(YOU, "all", "info, debug, warning or error", "info"),
    # Training settings (`kubetune train`'s options; `tune run` and `kubetune local` too)
    env.METHOD: Var(YOU, "trainer, local, size", "lora, qlora, dora or full", "lora"),
    env.OBJECTIVE: Var(YOU, "trainer, local, size", "what the run optimises: sft (imitation), "
                       "dpo or rso (preference pairs; rso: DPO's recipes with torchtune's "
                       "hinge loss) or distill (a teacher's logits)", "sft"),
    env.TEACHER_URI: Var(YOU, "local, size", "the teacher model's STORAGE_URI (--objective "
                         "distill): fetched into <workspace>/teacher"),
    env.EPOCHS: _train("epochs"),
    env.MAX_STEPS: _train("most optimizer steps per epoch", "no cap"),
    env.BATCH_SIZE: _train("per-device batch size"),
    env.LEARNING_RATE: _train("peak learning rate"),
    env.LORA_RANK: _train("LoRA rank"),
    env.LORA_ALPHA: _train("LoRA alpha", "the config's alpha/rank ratio kept"),
    env.SEED: _train("random seed"),
    env.DTYPE: _train("bf16 or fp32", "bf16 where supported"),
    env.GRADIENT_ACCUMULATION_STEPS: _train("batches per optimizer step"),
    env.OPTIMIZER: _train("adamw, adam, sgd or a dotted class path"),
    env.LR_SCHEDULER: _train("cosine, linear, constant or a dotted path"),
    env.WARMUP_STEPS: _train("learning-rate warm-up steps", "capped to a tenth of the run"),
    env.MAX_SEQ_LEN: Var(YOU, "trainer, local, size", "most tokens per sample (and pack)",
                         "the recipe's"),
    env.PACKING: _train("pack short samples (1/0)", "on for CUDA with short samples"),
    env.ACTIVATION_CHECKPOINTING: _train("recompute activations in backward (1/0)"),
    env.ACTIVATION_OFFLOADING: _train("offload activations to CPU (1/0), CUDA only"),
    env.COMPILE: _train("torch.compile the model and loss (1/0)", "on for CUDA"),
    env.LORA_DROPOUT: _train("LoRA dropout"),
    env.LORA_TARGET_MODULES: _train("comma-separated modules, or all-linear"),
    env.LORA_CONFIG: _train("LoRA settings as PEFT-style JSON"),
    env.DATASET_TYPE: _train("instruct or chat", "recognised from the columns"),
    env.COLUMN_MAP: _train("role to column, e.g. input=question,output=answer"),
    env.DATASET_SPLIT: _train("dataset split, e.g. train[:90%]", "train"),
    env.SYSTEM_PROMPT: _train("system prompt prepended to every sample"),
    env.TRAIN_ON_INPUT: _train("loss on the prompt too (1/0)"),
    env.CONVERSATION_COLUMN: _train("chat: the conversations' column"),
    env.CONVERSATION_STYLE: _train("chat: openai or sharegpt"),
    env.VAL_FRACTION: _train("hold out this fraction (0 to 0.5] of the training split "
                             "where the data ships no validation or test split",
                             "none (no held-out set)"),
    env.VAL_EVERY_N_STEPS: _train("validation loss every N optimizer steps; 0: none",
                                  "about ten evaluations per run"),
    env.EARLY_STOP_PATIENCE: _train("stop after N evaluations without a lower validation "
                                    "loss; 0: never", "0"),
    env.VAL_PROMPTS: _train("held-out prompts answered side by side (base and tuned) in "
                            "the run report; 0: none", "3"),
    env.TRAIN_OVERRIDES: _train("space-separated key=value overrides, before the command's",
                                "none"),
    env.GRACE_PERIOD_S: _train("seconds to save a checkpoint after SIGTERM", "30"),
    env.SAVE_EVERY_N_STEPS: _train("also save a resumable checkpoint every N steps",
                                   "each epoch"),
    env.MERGED_EPOCHS: _train("LoRA: every epoch's save also holds the merged model (a full "
                              "copy of the weights), not only the last",
                              "false: the adapter and recipe state per epoch"),
    env.CHAT_TEMPLATE: _train("chat data's format: base (the base model's chat template) or "
                              "torchtune (torchtune's format for the family)",
                              "base where the base model has a template, else torchtune"),
    env.TOKEN_CACHE_DIR: _train("where tokenized datasets are cached",
                                "<workspace>/cache/tokens"),
    # `kubetune local`
    env.LOCAL_DIR: Var(YOU, LOCAL, "work directory (stand-in PVC, sources, logs)",
                       "kubetune-local"),
    env.LOCAL_MODEL: Var(YOU, LOCAL, "model STORAGE_URI", "the tiny demo model"),
    env.LOCAL_DATASET: Var(YOU, LOCAL, "dataset STORAGE_URI", "the demo dataset"),
    env.LOCAL_RUNTIME: Var(YOU, LOCAL, "ClusterTrainingRuntime YAML to run"),
    env.LOCAL_TRAINJOB: Var(YOU, LOCAL, "TrainJob YAML applied to the runtime"),
    env.LOCAL_PRINT_JOBSET: Var(YOU, LOCAL, "print the merged JobSet, run nothing (1/0)",
                                "0"),
    env.LOCAL_ENGINE: Var(YOU, LOCAL, "process, podman or docker", "process"),
    env.LOCAL_GPUS: Var(YOU, LOCAL, "give GPUs to containers requesting them (1/0)", "0"),
    env.LOCAL_IMAGES: Var(YOU, LOCAL, "NAME=IMAGE overrides, space-separated"),
    env.LOCAL_CONFIGMAPS: Var(YOU, LOCAL, "NAME=DIR: a directory standing for a ConfigMap, "
                              "space-separated"),
    env.LOCAL_NPROC: Var(YOU, LOCAL, "trainer processes of the built-in pipeline (its "
                         "numProcPerNode)", "1"),
    env.LOCAL_RUN: Var(OURS, "all", "set by kubetune local for its steps"),
    # `kubetune size`
    env.SIZE_MODEL: Var(YOU, "size", "model directory, config.json or hf://", "required"),
    env.GPU_MEMORY: Var(YOU, "size", "memory of each GPU", "80Gi"),
    env.GPUS_PER_NODE: Var(YOU, "size", "GPUs a node offers", "8"),
    env.MAX_NODES: Var(YOU, "size", "most nodes the run may take", "no limit"),
    env.SIZE_OUTPUT: Var(YOU, "size", "text, json or yaml", "text"),
    # Launcher -> recipe processes
    env.STOP_FILE: Var(OURS, "trainer", "launcher -> recipe: stop at the next step"),
    env.FAILURE_DIR: Var(OURS, "trainer", "launcher -> recipe: failure records' directory"),
    env.PROGRESS_TTY: Var(OURS, "trainer", "launcher -> rank 0: terminal for the progress bar"),
    env.TEST_KILL_AT: Var(TESTS, "trainer", "SIGKILL at the N-th checkpoint write"),
    env.TEST_KILL_TOKEN_CACHE_AT: Var(TESTS, "trainer", "SIGKILL the token cache's builder "
                                      "at a named point"),
    env.TEST_STEP_PAUSE: Var(TESTS, "trainer", "seconds each optimizer step pauses"),
    env.TEST_FAILING_COMPILE_BACKEND: Var(TESTS, "trainer", "a dynamo backend that raises"),
    env.TEST_OOM_ABOVE_BATCH: Var(TESTS, "trainer", "out of memory above this micro-batch"),
    # TrainJob status
    env.TRAINER_SERVER_URL: Var(TRAINER, "trainer", "endpoint the TrainJob status is POSTed to"),
    env.TRAINER_SERVER_CA_CERT: Var(TRAINER, "trainer", "CA file of that endpoint"),
    env.TRAINER_SERVER_TOKEN: Var(TRAINER, "trainer", "projected token file for it"),
    # Remote stores: the libraries' own names
    env.AWS_ENDPOINT_URL: Var(YOU, "initializers, exporter", "S3 endpoint (boto3's name)"),
    env.AWS_DEFAULT_REGION: Var(YOU, "initializers, exporter", "S3 region (boto3's name)"),
    env.HF_HUB_DISABLE_PROGRESS_BARS: Var(LIBRARY, "all", "huggingface_hub: no progress bars",
                                          "1"),
    env.RETRY_MAX_ATTEMPTS: Var(YOU, "all", "attempts of one transfer", "8"),
    env.RETRY_BASE_DELAY_S: Var(YOU, "all", "first back-off, s", "0.5"),
    env.RETRY_MAX_DELAY_S: Var(YOU, "all", "longest back-off, s", "30"),
    env.RETRY_TOTAL_S: Var(YOU, "all", "retry budget of one transfer, s", "600"),
    env.HUGGING_FACE_HUB_TOKEN: Var(YOU, "initializers, exporter", "hub token (old name)"),
    env.AWS_ACCESS_KEY_ID: Var(YOU, "initializers, exporter", "S3 key id (boto3's name)"),
    env.AWS_SECRET_ACCESS_KEY: Var(YOU, "initializers, exporter", "S3 secret (boto3's name)"),
    env.AWS_SESSION_TOKEN: Var(YOU, "initializers, exporter", "S3 session token"),
    env.HF_TOKEN_PATH: Var(YOU, "initializers, exporter", "file holding the hub token"),
    # torchrun and torch.distributed
    env.RANK: Var(OURS, "trainer", "torchrun: this process's rank"),
    env.LOCAL_RANK: Var(OURS, "trainer", "torchrun: rank on this node"),
    env.WORLD_SIZE: Var(OURS, "trainer", "torchrun: processes in all"),
    env.LOCAL_WORLD_SIZE: Var(OURS, "trainer", "torchrun: processes on this node"),
    env.MASTER_ADDR: Var(OURS, "trainer", "torch.distributed: rendezvous host"),
    env.MASTER_PORT: Var(OURS, "trainer", "torch.distributed: rendezvous port"),
    env.TQDM_DISABLE: Var(LIBRARY, "trainer", "no tqdm bars in the recipe", "1"),
    env.OMP_NUM_THREADS: Var(LIBRARY, "trainer", "CPU threads per process", "cores / procs"),
    env.HF_HUB_OFFLINE: Var(LIBRARY, "trainer", "the recipe reads only what was staged", "1"),
    env.HF_DATASETS_OFFLINE: Var(LIBRARY, "trainer", "as HF_HUB_OFFLINE, for datasets", "1"),
    env.TRANSFORMERS_OFFLINE: Var(LIBRARY, "trainer", "as HF_HUB_OFFLINE, for transformers",
                                  "1"),
    env.HF_HUB_DISABLE_TELEMETRY: Var(LIBRARY, "trainer", "no telemetry", "1"),
    env.DO_NOT_TRACK: Var(LIBRARY, "trainer", "no telemetry", "1"),
    env.TORCH_COMPILE_BACKEND: Var(YOU, "trainer", "torch.compile backend", "inductor"),
    env.PYTHONUNBUFFERED: Var(LIBRARY, "local, trainer", "children's output line by line", "1"),
    env.PYTHONSAFEPATH: Var(LIBRARY, "local, trainer",
                            "children import nothing from the working directory", "1"),
    env.CUDA_VISIBLE_DEVICES: Var(TRAINER, "trainer", "GPUs this process may use", "all"),
    env.KUBERNETES_SERVICE_HOST: Var(TRAINER, "exporter", "in a pod: the model card says so"),
    env.PATH: Var(YOU, "local", "our bin first for kubetune local's steps"),
    env.HOME: Var(YOU, "make demo-real", "kept for the SmolLM2 converter's transformers"),
}


def names() -> list[str]:
    """Every variable name env.py defines, in its order (not the prefix nor defaults)."""
    skip = {env.KUBETUNE_PREFIX, env.DEFAULT_TERMINATION_LOG}
    found: list[str] = []
    for key, value in vars(env).items():
        if key.isupper() and isinstance(value, str) and value not in skip \
                and value not in found:
            found.append(value)
    return found


def rows_for(step: str) -> list[str]:
    """The names a step reads (its `steps` column names it, or all)."""
    return [n for n in names() if n in ROWS and (
        ROWS[n].steps == "all" or step in [s.strip() for s in ROWS[n].steps.split(",")])]


HEADER = """# Environment variables

<!-- Generated from kubetune/env_table.py by `python -m kubetune.env_table docs/env.md`:
edit that table, then run the command (tests/test_env_table.py fails until the two agree). -->

Every variable kubetune reads or sets, one row each: who sets it (**you**: a user or a
runtime's pod spec, a TrainJob, a shell; **Kubeflow Trainer**: the controller, the SDK or
the kubelet; **kubetune**: one of our processes for another; **tests only**: test hooks,
never in a runtime), which step reads it, and its default. An option's variable wins over
its default and loses to the option given on the command line. A `KUBETUNE_*` name not in
this table is a typo: the steps warn, and `kubetune validate` refuses it in a runtime.

To regenerate: `python -m kubetune.env_table docs/env.md`.

| variable | set by | read by | meaning | default |
|---|---|---|---|---|
"""


def render() -> str:
    """docs/env.md's text."""
    lines = []
    for name in names():
        row = ROWS.get(name)
        if row is None:
            lines.append(f"| `{name}` | ? | ? | (no row in kubetune/env_table.py) | |")
            continue
        setter = f"**{row.setter}**" if row.setter == TESTS else row.setter
        default = f"`{row.default}`" if row.default and row.default[0] in "/<0123456789" \
            else row.default
        lines.append(f"| `{name}` | {setter} | {row.steps} | {row.meaning} | {default} |")
    return HEADER + "\n".join(lines) + "\n"


def epilog(step: str) -> str:
    """A command's --help epilog: every variable ``step`` reads."""
    return (f"Variables the {step} read (docs/env.md): "
            + ", ".join(rows_for(step)) + ".")


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/env.md")
    target.write_text(render())
    print(f"wrote {target}")
