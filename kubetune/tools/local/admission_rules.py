"""Kubeflow Trainer v2.3's TrainJob admission rules, as data (evaluated by `admission.py`).

Each rule says, in our words, what the validating webhook rejects, where upstream decides
it (file and function in kubeflow/trainer v2.3.0), and the field error it answers with:
``<field>: Invalid value: <value>: <detail>`` (or ``<field>: Required value``), as
apimachinery's `field.Error` prints it (v0.36, which trainer v2.3 builds with). ``detail`` is upstream's text word for word; the
placeholders in ``field`` and ``detail`` name facts the evaluator computes.

A rule's keys:
  id        stable name (tests refer to it)
  plugin    the framework plugin that owns it (`kubetune local` for the emulator's own)
  upstream  "file: function" in kubeflow/trainer v2.3.0
  rule      what it rejects, in our words
  scope     what it is checked for: the TrainJob once, or each item of a list (below)
  when      the condition that rejects (the small language `admission.holds` reads:
            {"fact": f, op: operand} with op in eq ne in not_in gt contains not_contains
            matches not_matches longer_than truthy; {"all": [...]}, {"any": [...]},
            {"not": cond})
  field     the field path upstream reports
  value     the fact shown as the bad value; None: a "Required value" error
  detail    upstream's message text
  message   (the emulator's own rules only, instead of field/value/detail) the whole text

Scopes: `trainjob`; `initializer` (each of spec.initializer.dataset / .model that is set);
`trainer_arg` (each spec.trainer.args entry); `env_injection_target` (each container an
mlPolicy.torch.envInjection target names); `runtime_patch` (each spec.runtimePatches
entry); `patch_replicated_job` (each replicated job a patch names); `patch_container`
(each container or init container a patch names in a replicated job the runtime has).

Within a scope, errors come in the order of this table; scopes in the order upstream's
plugins visit them (`admission._items`). The webhook runs every plugin and returns all
their errors at once, identical messages
once (utilerrors.NewAggregate): `admission.admission_errors` does the same.
"""

from __future__ import annotations

from kubetune import env as envnames

# Upstream's constants (pkg/constants/constants.go), the rules' vocabulary.
SUPPORTED_TUNE_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")
MULTI_NODE_TUNE_MODEL = "llama3_3/70B"
SINGLE_DEVICE_QLORA_MODELS = ("llama3_2/1B", "llama3_2/3B")
QLORA_CONFIG_SUFFIX = "_qlora"
QLORA_SINGLE_DEVICE_CONFIG_SUFFIX = "_qlora_single_device"
# Entries of the runtime's `tune run` command that the controller carries over; a
# TrainJob may not set them (TorchTuneImmutableConfigs).
TUNE_IMMUTABLE_CONFIGS = ("output_dir", "tokenizer.path", "checkpointer.checkpoint_dir",
                          "tokenizer.merges_file")
TUNE_ENTRYPOINT = ("tune", "run")
TORCHRUN_RESERVED_ENV = (envnames.PET_NNODES, envnames.PET_NPROC_PER_NODE,
                         envnames.PET_NODE_RANK, envnames.PET_MASTER_ADDR,
                         envnames.PET_MASTER_PORT)
STEP_CONTAINERS = ("dataset-initializer", "model-initializer", "node")
INITIALIZER_VOLUME = "initializer"
# apimachinery's IsDomainPrefixedPath pieces (pkg/util/validation/validation.go).
DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS1123_SUBDOMAIN_MAX = 253
HTTP_PATH = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"

_JOBSET = "pkg/runtime/framework/plugins/jobset/jobset.go: JobSet.Validate"
_DOMAIN_PATH = ("pkg/runtime/framework/plugins/jobset/jobset.go: JobSet.Validate -> "
                "apimachinery pkg/util/validation/validation.go: IsDomainPrefixedPath")
_TORCH = "pkg/runtime/framework/plugins/torch/torch.go: Torch.Validate"
_ENV_TARGETS = "pkg/runtime/framework/plugins/torch/torch.go: validateEnvInjectionTargets"
_TORCHTUNE = "pkg/runtime/framework/plugins/torch/torchtune.go: validateTorchTune"

_TUNE = {"all": [{"fact": "torch_policy", "truthy": True},
                 {"fact": "trainer_set", "truthy": True},
                 {"fact": "tune_run", "truthy": True}]}
_QLORA_CONFIG = {"fact": "tune_config", "contains": QLORA_CONFIG_SUFFIX}

RULES: tuple[dict, ...] = (
    # -- the emulator's own: upstream looks the runtime up by runtimeRef, so the two
    #    cannot differ there; `kubetune local` is handed both files.
    {"id": "runtime-name-matches", "plugin": "kubetune local", "upstream": None,
     "rule": "the runtime file given is the one the TrainJob's runtimeRef names",
     "scope": "trainjob", "when": {"fact": "runtime_name_matches", "truthy": False},
     "message": "TrainJob runtimeRef.name is {runtime_name!r} but the runtime is "
                "{runtime_file_name!r}"},
    {"id": "runtime-kind-matches", "plugin": "kubetune local", "upstream": None,
     "rule": "the runtime file given is of the kind the TrainJob's runtimeRef names",
     "scope": "trainjob", "when": {"fact": "runtime_kind_matches", "truthy": False},
     "message": "TrainJob runtimeRef.kind is {runtime_ref_kind!r} but the runtime is a "
                "{runtime_file_kind}"},

    # -- JobSet plugin: initializers need their job, container and the shared volume.
    {"id": "initializer-job", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "a TrainJob that configures an initializer needs a runtime with that "
             "initializer's replicated job",
     "scope": "initializer", "when": {"fact": "has_job", "truthy": False},
     "field": "spec.runtimeRef", "value": "runtime_ref",
     "detail": "must have {step} job when trainJob is configured with input {config_name}"},
    {"id": "initializer-container", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "that job has a container named after the initializer",
     "scope": "initializer",
     "when": {"all": [{"fact": "has_job", "truthy": True},
                      {"fact": "has_container", "truthy": False}]},
     "field": "spec.runtimeRef", "value": "runtime_ref",
     "detail": "must have container with name - {step} in the {step} job"},
    {"id": "initializer-volume", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "that container mounts the volume named `initializer`",
     "scope": "initializer",
     "when": {"all": [{"fact": "has_container", "truthy": True},
                      {"fact": "mounts_initializer_volume", "truthy": False}]},
     "field": "spec.runtimeRef", "value": "runtime_ref",
     "detail": "must have volumeMount with name - initializer in container {step} of the "
               "{step} job"},

    # -- JobSet plugin: runtimePatches. Every patch is checked; none stops the others.
    {"id": "patch-manager-required", "plugin": "JobSet", "upstream": _DOMAIN_PATH,
     "rule": "a runtime patch names its manager",
     "scope": "runtime_patch", "when": {"fact": "manager", "eq": ""},
     "field": "spec.runtimePatches.manager", "value": None, "detail": ""},
    {"id": "patch-manager-domain-prefixed", "plugin": "JobSet", "upstream": _DOMAIN_PATH,
     "rule": "the manager is <domain>/<path>, both parts non-empty",
     "scope": "runtime_patch",
     "when": {"all": [{"fact": "manager", "ne": ""},
                      {"fact": "manager_split", "truthy": False}]},
     "field": "spec.runtimePatches.manager", "value": "manager",
     "detail": 'must be a domain-prefixed path (such as "acme.io/foo")'},
    {"id": "patch-manager-domain-length", "plugin": "JobSet", "upstream": _DOMAIN_PATH,
     "rule": "the manager's domain is at most 253 characters",
     "scope": "runtime_patch",
     "when": {"all": [{"fact": "manager_split", "truthy": True},
                      {"fact": "manager_domain", "longer_than": DNS1123_SUBDOMAIN_MAX}]},
     "field": "spec.runtimePatches.manager", "value": "manager_domain",
     "detail": f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters"},
    {"id": "patch-manager-domain", "plugin": "JobSet", "upstream": _DOMAIN_PATH,
     "rule": "the manager's domain is a lowercase RFC 1123 subdomain",
     "scope": "runtime_patch",
     "when": {"all": [{"fact": "manager_split", "truthy": True},
                      {"fact": "manager_domain", "not_matches": DNS1123_SUBDOMAIN}]},
     "field": "spec.runtimePatches.manager", "value": "manager_domain",
     "detail": "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
               "characters, '-' or '.', and must start and end with an alphanumeric "
               "character (e.g. 'example.com', regex used for validation is '"
               + DNS1123_SUBDOMAIN + "')"},
    {"id": "patch-manager-path", "plugin": "JobSet", "upstream": _DOMAIN_PATH,
     "rule": "the manager's path uses URL path characters only",
     "scope": "runtime_patch",
     "when": {"all": [{"fact": "manager_split", "truthy": True},
                      {"fact": "manager_path", "not_matches": HTTP_PATH}]},
     "field": "spec.runtimePatches.manager", "value": "manager_path",
     "detail": "Invalid path (regex used for validation is '" + HTTP_PATH + "')"},
    {"id": "patch-replicated-job-exists", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "a patch changes only replicated jobs the runtime has",
     "scope": "patch_replicated_job", "when": {"fact": "job_exists", "truthy": False},
     "field": "spec.runtimePatches", "value": "runtime_patches",
     "detail": "must not have replicated job that doesn't exist in the runtime job "
               "template"},
    {"id": "patch-init-container-exists", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "a patch changes only init containers the runtime's job has",
     "scope": "patch_container",
     "when": {"all": [{"fact": "kind", "eq": "initContainers"},
                      {"fact": "container_exists", "truthy": False}]},
     "field": "spec.runtimePatches", "value": "runtime_patches",
     "detail": "must not have initContainer that doesn't exist in the runtime job {job}"},
    {"id": "patch-container-exists", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "a patch changes only containers the runtime's job has",
     "scope": "patch_container",
     "when": {"all": [{"fact": "kind", "eq": "containers"},
                      {"fact": "container_exists", "truthy": False}]},
     "field": "spec.runtimePatches", "value": "runtime_patches",
     "detail": "must not have container that doesn't exist in the runtime job {job}"},
    {"id": "patch-no-step-env", "plugin": "JobSet", "upstream": _JOBSET,
     "rule": "env of the initializer and trainer containers comes from spec.initializer "
             "and spec.trainer, never from a patch",
     "scope": "patch_container",
     "when": {"all": [{"fact": "kind", "eq": "containers"},
                      {"fact": "container_exists", "truthy": True},
                      {"fact": "sets_env", "truthy": True},
                      {"fact": "container", "in": list(STEP_CONTAINERS)}]},
     "field": "spec.runtimePatches", "value": "runtime_patches",
     "detail": "must not have envs for the dataset-initializer, model-initializer, node "
               "containers"},

    # -- Torch plugin (only for runtimes with mlPolicy.torch).
    {"id": "env-injection-target", "plugin": "Torch", "upstream": _ENV_TARGETS,
     "rule": "every container an envInjection target names is in the runtime's job",
     "scope": "env_injection_target",
     "when": {"all": [{"fact": "torch_policy", "truthy": True},
                      {"fact": "container_exists", "truthy": False}]},
     "field": "spec.runtimeRef", "value": "target",
     "detail": 'envInjection target podSet {job_quoted} container {container_quoted} not '
               'found in runtime template'},
    {"id": "trainer-reserved-env", "plugin": "Torch", "upstream": _TORCH,
     "rule": "the TrainJob sets none of the PET_* variables the controller sets (also "
             "for `tune run`)",
     "scope": "trainjob",
     "when": {"all": [{"fact": "torch_policy", "truthy": True},
                      {"fact": "trainer_set", "truthy": True},
                      {"fact": "reserved_env", "truthy": True}]},
     "field": "spec.trainer.env", "value": "trainer_env",
     "detail": "must not have reserved envs, invalid envs configured: {reserved_env_list}"},

    # -- Torch plugin, `tune run` TrainJobs (command exactly ["tune", "run"]).
    {"id": "tune-supported-model", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "the runtime is named torchtune-<model>-<size> for one of "
             + ", ".join(SUPPORTED_TUNE_MODELS),
     "scope": "trainjob",
     "when": {"all": [_TUNE, {"fact": "tune_model", "not_in": list(SUPPORTED_TUNE_MODELS)}]},
     "field": "spec.runtimeRef.name", "value": "runtime_name",
     "detail": "must have a supported pretrained model, invalid model configured: "
               "{tune_model}"},
    {"id": "tune-single-node", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": f"only {MULTI_NODE_TUNE_MODEL} trains on more than one node",
     "scope": "trainjob",
     "when": {"all": [_TUNE, {"fact": "num_nodes", "gt": 1},
                      {"fact": "tune_model", "ne": MULTI_NODE_TUNE_MODEL}]},
     "field": "spec.trainer.numNodes", "value": "num_nodes",
     "detail": "must be 1 for {tune_model} model"},
    {"id": "tune-qlora-unsupported", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "qwen2_5/1.5B has no QLoRA config",
     "scope": "trainjob",
     "when": {"all": [_TUNE, _QLORA_CONFIG, {"fact": "tune_model", "eq": "qwen2_5/1.5B"}]},
     "field": "spec.runtimeRef.name", "value": "runtime_name",
     "detail": "QLoRA is not supported for {tune_model} model"},
    {"id": "tune-qlora-single-process", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "QLoRA on llama3_2/1B and 3B runs on one device: one process per node...",
     "scope": "trainjob",
     "when": {"all": [_TUNE, _QLORA_CONFIG,
                      {"fact": "tune_config", "not_contains": QLORA_SINGLE_DEVICE_CONFIG_SUFFIX},
                      {"fact": "tune_model", "in": list(SINGLE_DEVICE_QLORA_MODELS)}]},
     "field": "spec.trainer.numProcPerNode", "value": "num_proc_per_node",
     "detail": "must be auto or 1 for {tune_model} model when using QLoRA"},
    {"id": "tune-qlora-single-gpu", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "...and one GPU (the same condition; upstream reports both errors)",
     "scope": "trainjob",
     "when": {"all": [_TUNE, _QLORA_CONFIG,
                      {"fact": "tune_config", "not_contains": QLORA_SINGLE_DEVICE_CONFIG_SUFFIX},
                      {"fact": "tune_model", "in": list(SINGLE_DEVICE_QLORA_MODELS)}]},
     "field": "spec.trainer.resourcesPerNode", "value": "resources_per_node",
     "detail": "must have gpu resource with value 1 for {tune_model} model when using QLoRA"},
    {"id": "tune-no-multinode-lora", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "LoRA or QLoRA args on more than one node (the controller would silently "
             "run a full fine-tune)",
     "scope": "trainjob",
     "when": {"all": [_TUNE, {"fact": "num_nodes", "gt": 1},
                      {"any": [{"fact": "uses_lora", "truthy": True},
                               {"fact": "uses_qlora", "truthy": True}]}]},
     "field": "spec.trainer.numNodes", "value": "num_nodes",
     "detail": "LoRA fine-tuning is not supported for multi-node training in TorchTune"},
    {"id": "tune-immutable-arg", "plugin": "Torch", "upstream": _TORCHTUNE,
     "rule": "trainer.args never set " + ", ".join(TUNE_IMMUTABLE_CONFIGS)
             + ": the runtime's command sets them",
     "scope": "trainer_arg",
     "when": {"all": [_TUNE, {"fact": "key", "in": list(TUNE_IMMUTABLE_CONFIGS)}]},
     "field": "spec.trainer.args[{index}]", "value": "arg",
     "detail": "must not set immutable config {key_quoted} in trainer args; it is managed "
               "by the runtime"},
)
