"""Every environment variable kubetune reads, in one place.

Names that Kubeflow Trainer or its SDK set are spelled exactly as upstream sets them;
names of our own carry the ``KUBETUNE_`` prefix.
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
S3_PART_SIZE_MB = "KUBETUNE_S3_PART_SIZE_MB"  # ranged-GET part size (default 16)
S3_PART_WORKERS = "KUBETUNE_S3_PART_WORKERS"  # parts of one object fetched at once (default 8)
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
TERMINATION_LOG = "KUBETUNE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# Direct training (`kubetune train`).
METHOD = "KUBETUNE_METHOD"
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
