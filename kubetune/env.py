"""Every environment variable kubetune reads, in one place.

Names that Kubeflow Trainer or its SDK set are spelled exactly as upstream sets them;
names of our own carry the ``KUBETUNE_`` prefix. The values are read in one settings place
per concern (``kubetune.remote.settings``, ``kubetune.initializers.settings``,
``kubetune.trainer.request.settings``, ``kubetune.trainer.request.passed_env``,
the workspace, credentials, logs) or as a click option's ``envvar``.
"""

# Workspace (the PVC the controller mounts at /workspace).
WORKSPACE = "KUBETUNE_WORKSPACE"
DATASET_DIR = "KUBETUNE_DATASET_DIR"
MODEL_DIR = "KUBETUNE_MODEL_DIR"
OUTPUT_DIR = "KUBETUNE_OUTPUT_DIR"
EXPORT_DIR = "KUBETUNE_EXPORT_DIR"

# Initializers, as Kubeflow Trainer and its SDK set them.
STORAGE_URI = "STORAGE_URI"
OUTPUT_PATH = "OUTPUT_PATH"
ACCESS_TOKEN = "ACCESS_TOKEN"
IGNORE_PATTERNS = "IGNORE_PATTERNS"
ALLOW_PATTERNS = "ALLOW_PATTERNS"
REVISION = "REVISION"
# S3, as Kubeflow Trainer sets them (unset keys fall back to boto3's standard chain).
S3_ENDPOINT = "ENDPOINT"
S3_ACCESS_KEY_ID = "ACCESS_KEY_ID"
S3_SECRET_ACCESS_KEY = "SECRET_ACCESS_KEY"
S3_REGION = "REGION"
S3_ROLE_ARN = "ROLE_ARN"
# Hugging Face's own names, honoured as alternatives.
HF_TOKEN = "HF_TOKEN"
HF_ENDPOINT = "HF_ENDPOINT"
# Initializer tuning (ours).
DOWNLOAD_WORKERS = "KUBETUNE_DOWNLOAD_WORKERS"  # files fetched at once (default 8)
S3_PART_SIZE_MB = "KUBETUNE_S3_PART_SIZE_MB"  # largest ranged-GET part (default 16)
S3_PART_WORKERS = "KUBETUNE_S3_PART_WORKERS"  # ranged parts in flight, all objects (default 8)
HTTP_TIMEOUT_S = "KUBETUNE_HTTP_TIMEOUT_S"  # connect / read timeout of one request (default 60)

# Trainer, as the torch plugin of Kubeflow Trainer sets them.
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"

# Exporter.
EXPORT_URI = "EXPORT_URI"
EXPORT_FORMAT = "EXPORT_FORMAT"

# Failure reporting.
# The prefix of our own names: a variable with it that no constant here names is a typo
# (kubetune.unknown_env warns).
KUBETUNE_PREFIX = "KUBETUNE_"
TERMINATION_LOG = "KUBETUNE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# Direct training (`kubetune train`).
METHOD = "KUBETUNE_METHOD"
OBJECTIVE = "KUBETUNE_OBJECTIVE"  # sft | dpo | distill | rso (kubetune.trainer.objectives.registry)
TEACHER_URI = "KUBETUNE_TEACHER_URI"  # a distillation run's teacher model (a STORAGE_URI)
EPOCHS = "KUBETUNE_EPOCHS"
MAX_STEPS = "KUBETUNE_MAX_STEPS"
BATCH_SIZE = "KUBETUNE_BATCH_SIZE"
LEARNING_RATE = "KUBETUNE_LEARNING_RATE"
LORA_RANK = "KUBETUNE_LORA_RANK"
LORA_ALPHA = "KUBETUNE_LORA_ALPHA"
SEED = "KUBETUNE_SEED"

# Exporter: where on the hub, and how hard to check before publishing.
EXPORT_REVISION = "KUBETUNE_EXPORT_REVISION"
EXPORT_VERIFY_LOGITS = "KUBETUNE_EXPORT_VERIFY_LOGITS"
EXPORT_VERIFY_MAX_BYTES = "KUBETUNE_EXPORT_VERIFY_MAX_BYTES"
EXPORT_CHAT_TEMPLATE = "KUBETUNE_EXPORT_CHAT_TEMPLATE"
EXPORT_CHECKPOINT = "KUBETUNE_EXPORT_CHECKPOINT"  # last | best (lowest validation loss)

# `kubetune local`.
LOCAL_DIR = "KUBETUNE_LOCAL_DIR"
LOCAL_MODEL = "KUBETUNE_LOCAL_MODEL"
LOCAL_DATASET = "KUBETUNE_LOCAL_DATASET"
LOCAL_RUNTIME = "KUBETUNE_LOCAL_RUNTIME"
LOCAL_TRAINJOB = "KUBETUNE_LOCAL_TRAINJOB"
LOCAL_PRINT_JOBSET = "KUBETUNE_LOCAL_PRINT_JOBSET"
LOCAL_ENGINE = "KUBETUNE_LOCAL_ENGINE"
LOCAL_GPUS = "KUBETUNE_LOCAL_GPUS"
LOCAL_IMAGES = "KUBETUNE_LOCAL_IMAGES"
LOCAL_CONFIGMAPS = "KUBETUNE_LOCAL_CONFIGMAPS"
LOCAL_NPROC = "KUBETUNE_LOCAL_NPROC"

# `kubetune size` (its --method, --max-seq-len and --batch-size read the trainer's own
# KUBETUNE_METHOD, KUBETUNE_MAX_SEQ_LEN and KUBETUNE_BATCH_SIZE).
SIZE_MODEL = "KUBETUNE_SIZE_MODEL"
GPU_MEMORY = "KUBETUNE_GPU_MEMORY"
GPUS_PER_NODE = "KUBETUNE_GPUS_PER_NODE"
MAX_NODES = "KUBETUNE_MAX_NODES"
SIZE_OUTPUT = "KUBETUNE_SIZE_OUTPUT"

# Direct training (`kubetune train`): what to train and how.
DTYPE = "KUBETUNE_DTYPE"
GRADIENT_ACCUMULATION_STEPS = "KUBETUNE_GRADIENT_ACCUMULATION_STEPS"
OPTIMIZER = "KUBETUNE_OPTIMIZER"
LR_SCHEDULER = "KUBETUNE_LR_SCHEDULER"
WARMUP_STEPS = "KUBETUNE_WARMUP_STEPS"
MAX_SEQ_LEN = "KUBETUNE_MAX_SEQ_LEN"
PACKING = "KUBETUNE_PACKING"
ACTIVATION_CHECKPOINTING = "KUBETUNE_ACTIVATION_CHECKPOINTING"
ACTIVATION_OFFLOADING = "KUBETUNE_ACTIVATION_OFFLOADING"
COMPILE = "KUBETUNE_COMPILE"
LORA_DROPOUT = "KUBETUNE_LORA_DROPOUT"
LORA_TARGET_MODULES = "KUBETUNE_LORA_TARGET_MODULES"
# The PEFT-style JSON form, e.g. LORA_CONFIG='{"r": 4, "lora_alpha": 16}'.
LORA_CONFIG = "LORA_CONFIG"
DATASET_TYPE = "KUBETUNE_DATASET_TYPE"
COLUMN_MAP = "KUBETUNE_COLUMN_MAP"
DATASET_SPLIT = "KUBETUNE_DATASET_SPLIT"
SYSTEM_PROMPT = "KUBETUNE_SYSTEM_PROMPT"
TRAIN_ON_INPUT = "KUBETUNE_TRAIN_ON_INPUT"
CONVERSATION_COLUMN = "KUBETUNE_CONVERSATION_COLUMN"
CONVERSATION_STYLE = "KUBETUNE_CONVERSATION_STYLE"
TRAIN_OVERRIDES = "KUBETUNE_TRAIN_OVERRIDES"
# Held-out data and validation (kubetune.trainer.validation).
VAL_FRACTION = "KUBETUNE_VAL_FRACTION"  # hold out this fraction where the data has no split
VAL_EVERY_N_STEPS = "KUBETUNE_VAL_EVERY_N_STEPS"  # run_val_every_n_steps (0: none)
EARLY_STOP_PATIENCE = "KUBETUNE_EARLY_STOP_PATIENCE"  # evaluations without improvement
VAL_PROMPTS = "KUBETUNE_VAL_PROMPTS"  # held-out prompts answered side by side

# Trainer fault tolerance.
GRACE_PERIOD_S = "KUBETUNE_GRACE_PERIOD_S"  # SIGTERM -> checkpoint deadline
SAVE_EVERY_N_STEPS = "KUBETUNE_SAVE_EVERY_N_STEPS"  # step-level resumable saves (0: per epoch)
# A LoRA run's every save also holds the merged model (default: its last save only).
MERGED_EPOCHS = "KUBETUNE_MERGED_EPOCHS"
STOP_FILE = "KUBETUNE_STOP_FILE"  # launcher -> recipe processes: stop at the next step
# launcher -> recipe processes: the directory, fresh for each run, where a process that fails
# for a known reason leaves its failure record (kubetune.trainer.failures).
FAILURE_DIR = "KUBETUNE_FAILURE_DIR"
# launcher -> rank 0: the path of the launcher's terminal (/dev/pts/N), for the live
# progress bar (unset without a terminal, or in JSON mode: per-step lines instead).
PROGRESS_TTY = "KUBETUNE_PROGRESS_TTY"
TEST_KILL_AT = "KUBETUNE_TEST_KILL_AT"  # tests only: SIGKILL at the N-th checkpoint write
# Tests only: SIGKILL the token cache's builder at a named point of its build
# (kubetune.trainer.data.token_cache.store.KILL_POINTS).
TEST_KILL_TOKEN_CACHE_AT = "KUBETUNE_TEST_KILL_TOKEN_CACHE_AT"
# Tests only: seconds each optimizer step pauses after it ends, so that a test's SIGTERM
# lands mid-run however fast the machine runs the tiny model (numerics unchanged).
TEST_STEP_PAUSE = "KUBETUNE_TEST_STEP_PAUSE"
# Which chat format conversations train in: base (the base model's own chat template) or
# torchtune (torchtune's format for the family); default base where the base has one.
CHAT_TEMPLATE = "KUBETUNE_CHAT_TEMPLATE"
# Where the trainer caches tokenized datasets (default: <workspace>/cache/tokens).
TOKEN_CACHE_DIR = "KUBETUNE_TOKEN_CACHE_DIR"
# Tests only (kubetune.trainer.recipe_process.fallbacks; inert unless set): register a dynamo
# backend of this name that raises, and make a forward above this micro-batch raise
# torch.OutOfMemoryError, so a CPU test drives the compile and out-of-memory fallbacks.
TEST_FAILING_COMPILE_BACKEND = "KUBETUNE_TEST_FAILING_COMPILE_BACKEND"
TEST_OOM_ABOVE_BATCH = "KUBETUNE_TEST_OOM_ABOVE_BATCH"

# TrainJob status (Kubeflow Trainer 2.2+, feature gate TrainJobStatus): the controller
# injects these into trainer containers; spelled as the kubeflow SDK reads them.
TRAINER_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"  # HTTPS endpoint the status is POSTed to
TRAINER_SERVER_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"  # CA file the endpoint's TLS chains to
TRAINER_SERVER_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # projected token FILE path (rotated)

# Pod logs.
LOG_FORMAT = "KUBETUNE_LOG_FORMAT"  # text (default) or json: one JSON object per line
LOG_LEVEL = "KUBETUNE_LOG_LEVEL"  # info (default), debug (config dump, noise), warning, error
# Set by `kubetune local` for its steps: the run is not on Kubeflow Trainer.
LOCAL_RUN = "KUBETUNE_LOCAL_RUN"

# Remote stores: the names boto3 and huggingface_hub read themselves, honoured as
# alternatives to Kubeflow's (ENDPOINT, REGION, ACCESS_TOKEN).
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
# Set for huggingface_hub before it is imported (a pod's log is not a terminal).
HF_HUB_DISABLE_PROGRESS_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"

# Retry budget of every transfer (kubetune.retry); the user sets them in a pod spec.
RETRY_MAX_ATTEMPTS = "KUBETUNE_RETRY_MAX_ATTEMPTS"
RETRY_BASE_DELAY_S = "KUBETUNE_RETRY_BASE_DELAY_S"
RETRY_MAX_DELAY_S = "KUBETUNE_RETRY_MAX_DELAY_S"
RETRY_TOTAL_S = "KUBETUNE_RETRY_TOTAL_S"
# Initializers' progress lines: seconds between two (read in kubetune.initializers.settings).
PROGRESS_INTERVAL_S = "KUBETUNE_PROGRESS_INTERVAL_S"

# Secrets' other spellings (boto3's and huggingface_hub's own), masked in everything we
# print (kubetune.redact) and kept from the recipe processes
# (kubetune.trainer.launcher.child_env).
HUGGING_FACE_HUB_TOKEN = "HUGGING_FACE_HUB_TOKEN"
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
HF_TOKEN_PATH = "HF_TOKEN_PATH"  # a file holding the hub token (huggingface_hub's own name)

# torchrun sets these in each recipe process (read in kubetune.trainer.request.passed_env:
# only rank 0 reports).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
# ...and these, which torch.distributed reads to form the process group; the launcher sets
# all six itself for a one-process group, which it starts without torchrun
# (kubetune.trainer.request.topology). LOCAL_WORLD_SIZE: processes on this node, which
# share its cores.
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# The launcher sets these for the recipe processes; the libraries inside read them.
TQDM_DISABLE = "TQDM_DISABLE"  # progress comes from our metric logger instead
OMP_NUM_THREADS = "OMP_NUM_THREADS"  # CPU threads per process (torch)
HF_HUB_OFFLINE = "HF_HUB_OFFLINE"  # the recipe reads only what the initializers staged
HF_DATASETS_OFFLINE = "HF_DATASETS_OFFLINE"
TRANSFORMERS_OFFLINE = "TRANSFORMERS_OFFLINE"
HF_HUB_DISABLE_TELEMETRY = "HF_HUB_DISABLE_TELEMETRY"
DO_NOT_TRACK = "DO_NOT_TRACK"
# torchtune's compile helpers read it (default inductor); the fallbacks' compile probe
# uses the same backend (kubetune.trainer.recipe_process.fallbacks).
TORCH_COMPILE_BACKEND = "TORCH_COMPILE_BACKEND"
# Set for every child process we start (`kubetune local`'s steps, the recipe): its output
# reaches our log prefixing and redaction line by line.
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# Set for the same children (and `-P` on the command lines we build): a step started from a
# folder that holds a clone named `kubetune` imports the installed package, not the clone.
PYTHONSAFEPATH = "PYTHONSAFEPATH"
# The container runtime (NVIDIA's) or the user: which GPUs this process may use
# (kubetune.trainer.performance.hardware).
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Kubernetes sets it in every pod: the exporter's model card says where it ran.
KUBERNETES_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
# The shell's: `kubetune local` puts this Python's bin directory first for its steps.
PATH = "PATH"
# The shell's: the SmolLM2 converter (kubetune.tools.demo.smollm2) keeps it in the bare
# environment it runs transformers in.
HOME = "HOME"
