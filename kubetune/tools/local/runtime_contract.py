"""The contract our steps rely on in a runtime, checked offline before anything runs.

A runtime author's mistake here does not fail where it is made: the controller silently
drops a TrainJob's ``spec.trainer`` into a container not named ``node``, or into a job
without the trainer ancestor label; a step without the workspace mounted finds nothing and
blames the step before it; an unnamed container fails in a thread; a misspelled
``KUBETUNE_*`` name is ignored. Each is named here as one line,
``<file>: <path>: <what>; <fix>``, every one at once, for `kubetune validate`,
`kubetune local --runtime` and `--print-jobset`. The CRD schema (unknown fields, wrong
types) is `manifest_schema`'s; this module checks what the schema allows but our steps
cannot run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from kubetune import env as envnames
from kubetune.suggest import closest
# Where a replicatedJob's containers are, shared with the settings check.
from kubetune.tools.local.manifest_walk import POD
from kubetune.tools.local.manifest_walk import container_ref as _container_ref
from kubetune.tools.local.manifest_walk import containers as _containers
from kubetune.tools.local.manifest_walk import job_ref as _job_ref
from kubetune.tools.local.manifest_walk import jobs as _jobs
from kubetune.tools.local.manifest_walk import pod as _pod
from kubetune.tools.local.violations import ContractError, raise_all, report  # noqa: F401
from kubetune.unknown_env import known_names
from kubetune.workspace import DEFAULT_ROOT

if TYPE_CHECKING:
    from kubetune.tools.local.settings_check import SettingsCheck

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER = "trainer"
NODE = "node"
INITIALIZERS = ("dataset-initializer", "model-initializer")
# The words of a container's command that run one of our steps.
_STEP_WORDS = {"init-dataset": "initializer", "init-model": "initializer",
               "train": TRAINER, "tune": TRAINER, "export": "exporter"}


def _ancestor(rjob: dict) -> str | None:
    return (((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}) \
        .get(ANCESTOR_LABEL)


def _role(rjob: dict, container: dict) -> str | None:
    """Which of our steps a container runs: by its job's ancestor label and name, else by
    the words of its command (``kubetune export``, ``tune run``)."""
    ancestor, name = _ancestor(rjob), container.get("name")
    if ancestor in INITIALIZERS and name == ancestor:
        return "initializer"
    if ancestor == TRAINER and name == NODE:
        return TRAINER
    if name == "exporter":
        return "exporter"
    words = [str(w) for w in (container.get("command") or [])[:3]]
    if words and words[0].rsplit("/", 1)[-1] in ("kubetune", "tune"):
        for word in words:
            if word in _STEP_WORDS:
                return _STEP_WORDS[word]
    return None


def _names(rjob: dict, index: int) -> Iterator[str]:
    if not rjob.get("name"):
        yield f"{_job_ref(rjob, index)}.name: missing; every replicatedJob needs a name"
    for kind, i, container in _containers(rjob):
        if not container.get("name"):
            yield (f"{_job_ref(rjob, index)}.{POD}.{kind}[{i}].name: missing; every "
                   "container needs a name (the trainer's: node)")


def _trainer_job(jobs: list) -> Iterator[str]:
    """One job carries the trainer ancestor label, and its trainer container is `node`."""
    labelled = [(i, j) for i, j in enumerate(jobs) if _ancestor(j) == TRAINER]
    if not labelled:
        guess = next(((i, j) for i, j in enumerate(jobs) if j.get("name") == NODE
                      or any(c.get("name") == NODE or _role(j, c) == TRAINER
                             for _, _, c in _containers(j))), None)
        where = f"{_job_ref(guess[1], guess[0])}.template.metadata.labels" if guess \
            else "spec.template.spec.replicatedJobs"
        yield (f"{where}: no job labelled {ANCESTOR_LABEL}: {TRAINER}; add the label to "
               "the trainer's job, or the controller drops the TrainJob's spec.trainer "
               "(env, args, numNodes, PET_*)")
        labelled = [guess] if guess else []
    for index, rjob in labelled:
        containers = [(k, i, c) for k, i, c in _containers(rjob) if k == "containers"]
        if any(c.get("name") == NODE for _, _, c in containers) or not containers:
            continue
        kind, i, first = containers[0]
        if not first.get("name"):
            continue  # reported as unnamed
        yield (f"{_container_ref(rjob, index, kind, i, first)}.name: "
               f"{first.get('name')!r} is not {NODE}; name the trainer container {NODE}: "
               "the controller writes spec.trainer (env, args, PET_*) into the container "
               f"named {NODE} only")


def _initializer_names(rjob: dict, index: int) -> Iterator[str]:
    step = _ancestor(rjob)
    if step not in INITIALIZERS:
        return
    containers = [(k, i, c) for k, i, c in _containers(rjob) if k == "containers"]
    if containers and all(c.get("name") for _, _, c in containers) \
            and not any(c.get("name") == step for _, _, c in containers):
        kind, i, first = containers[0]
        yield (f"{_container_ref(rjob, index, kind, i, first)}.name: "
               f"{first.get('name')!r} is not {step}; name it {step}: the controller "
               f"writes the TrainJob's spec.initializer (STORAGE_URI, env) into the "
               f"container named {step} only")


def _failure_policy(rjob: dict, index: int) -> Iterator[str]:
    rules = ((((rjob.get("template") or {}).get("spec") or {}).get("podFailurePolicy")
              or {}).get("rules")) or []
    names = {c.get("name") for _, _, c in _containers(rjob) if c.get("name")}
    if any(not c.get("name") for _, _, c in _containers(rjob)):
        return  # an unnamed container is reported as such; its rules may mean it
    for i, rule in enumerate(rules):
        named = ((rule or {}).get("onExitCodes") or {}).get("containerName")
        if named == NODE and _ancestor(rjob) == TRAINER:
            continue  # a trainer container not named node is reported as such
        if named and named not in names:
            guess = closest(named, names) or (sorted(names)[0] if len(names) == 1 else None)
            fix = (f"name {guess}" if guess else f"name one of {', '.join(sorted(names))}") \
                + f" (or name the container {named})"
            yield (f"{_job_ref(rjob, index)}.template.spec.podFailurePolicy.rules[{i}]."
                   f"onExitCodes.containerName: {named!r} is no container of this job; "
                   f"{fix}, or the rule never applies (a bad input is retried)")


def _env_value(container: dict, name: str) -> str | None:
    for var in container.get("env") or []:
        if isinstance(var, dict) and var.get("name") == name:
            return var.get("value")
    return None


def _ours(container: dict) -> bool:
    """A container of our images (by repository name: a mirror keeps it) or one whose
    command runs one of our steps (`kubetune ...`, `tune run`)."""
    repository = str(container.get("image") or "").rsplit("@", 1)[0].rsplit(":", 1)[0]
    words = [str(w) for w in (container.get("command") or [])[:1]]
    return "kubetune" in repository or bool(
        words and words[0].rsplit("/", 1)[-1] in ("kubetune", "tune"))


def _mounts(container: dict) -> list[dict]:
    return [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]


def hands_over(runtime: dict) -> bool:
    """Whether a step of ``runtime`` hands its results to the next through the workspace
    volume: an exporter, an initializer with a volume mounted, or a step of ours. Only
    then does every step need the workspace: a trainer-only runtime (upstream's
    `torch-distributed`: a node container, no volume) has no next step to hand to."""
    for rjob in _jobs(runtime):
        if not isinstance(rjob, dict):
            continue
        for _, _, container in _containers(rjob):
            role = _role(rjob, container)
            if role == "exporter" or (role is not None and _ours(container)) or (
                    role == "initializer" and _mounts(container)):
                return True
    return False


def _workspace_mount(rjob: dict, index: int) -> Iterator[str]:
    for kind, i, container in _containers(rjob):
        role = _role(rjob, container)
        mounts = _mounts(container)
        if role is not None:
            root = (_env_value(container, envnames.WORKSPACE) or str(DEFAULT_ROOT)).rstrip("/")
            if not any(str(m.get("mountPath", "")).rstrip("/") == root for m in mounts):
                yield (f"{_container_ref(rjob, index, kind, i, container)}.volumeMounts: "
                       f"nothing mounted at {root}; mount the workspace volume (the "
                       f"volumeClaimPolicies claim) at {root}: the {role} hands its results "
                       "to the next step there")


# The controller's plugins other than torch's, and what each adds that is not modelled here.
_NOT_EMULATED = {
    "mpi": "the hostfile, SSH keys and OMPI_MCA_* env of an MPI launcher and its nodes",
    "jax": "JAX_NUM_PROCESSES, JAX_PROCESS_ID and JAX_COORDINATOR_ADDRESS",
    "xgboost": "the DMLC_* tracker env of each worker",
    "flux": "the Flux broker's config and its init container",
}


def _ml_policy(runtime: dict) -> Iterator[str]:
    """A runtime for a plugin we do not emulate: its JobSet would lack what that plugin
    adds, so it is neither passed nor shown as the controller would make it."""
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    for name, adds in _NOT_EMULATED.items():
        if policy.get(name) is not None:
            yield (f"spec.mlPolicy.{name}: the controller's {name} plugin ({adds}) is not "
                   "emulated: kubetune validate and kubetune local model the torch plugin "
                   "only (mlPolicy.torch: PET_*), so this runtime is neither checked nor "
                   "run here; check it with the controller (kubectl apply --dry-run=server)")


def _volume_names(runtime: dict, rjob: dict, index: int) -> Iterator[str]:
    spec = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
    claims = {(t.get("metadata") or {}).get("name") for p in spec.get("volumeClaimPolicies")
              or [] for t in (p or {}).get("templates") or []}
    volumes = {v.get("name") for v in _pod(rjob).get("volumes") or [] if isinstance(v, dict)}
    known = {n for n in claims | volumes if n}
    for kind, i, container in _containers(rjob):
        for mount in container.get("volumeMounts") or []:
            name = (mount or {}).get("name")
            if name and name not in known:
                guess = closest(name, known)
                hint = f" (did you mean {guess}?)" if guess else ""
                yield (f"{_container_ref(rjob, index, kind, i, container)}.volumeMounts"
                       f"[{name}]: no volume or volumeClaimPolicies claim named {name}{hint}; "
                       "define it in the pod's volumes or name an existing one")


def _depends_on(jobs: list, rjob: dict, index: int) -> Iterator[str]:
    names = {j.get("name") for j in jobs if isinstance(j, dict) and j.get("name")}
    for i, dep in enumerate(rjob.get("dependsOn") or []):
        name = (dep or {}).get("name")
        if name not in names:
            guess = closest(str(name), names - {rjob.get("name")})
            hint = f" (did you mean {guess}?)" if guess else ""
            yield (f"{_job_ref(rjob, index)}.dependsOn[{i}].name: no replicatedJob named "
                   f"{name}{hint}; name one of {', '.join(sorted(names))}")


def env_problems(env_list: list, where: str) -> Iterator[str]:
    """Unknown ``KUBETUNE_*`` names in an env list (a container's, a TrainJob's)."""
    known = known_names()
    for var in env_list or []:
        name = (var or {}).get("name") if isinstance(var, dict) else None
        if isinstance(name, str) and name.startswith(envnames.KUBETUNE_PREFIX) \
                and name not in known:
            guess = closest(name, known)
            hint = f"did you mean {guess}?" if guess else "see docs/env.md for the names"
            yield f"{where}.env[{name}]: no part of kubetune reads {name}; {hint}"


def runtime_problems(runtime: dict) -> list[str]:
    """Every way ``runtime`` breaks the contract, one line each (without the file)."""
    jobs = _jobs(runtime)
    lines: list[str] = list(_ml_policy(runtime))
    if lines:
        return lines  # the rest of our contract is about what the torch plugin runs
    workspace = hands_over(runtime)
    for index, rjob in enumerate(jobs):
        if not isinstance(rjob, dict):
            continue
        lines += _names(rjob, index)
        lines += _initializer_names(rjob, index)
        lines += _failure_policy(rjob, index)
        if workspace:
            lines += _workspace_mount(rjob, index)
        lines += _volume_names(runtime, rjob, index)
        lines += _depends_on(jobs, rjob, index)
        for kind, i, container in _containers(rjob):
            lines += env_problems(container.get("env") or [],
                                  _container_ref(rjob, index, kind, i, container))
    lines += _trainer_job([j for j in jobs if isinstance(j, dict)])
    return lines


def trainjob_problems(trainjob: dict) -> list[str]:
    """Unknown ``KUBETUNE_*`` names wherever a TrainJob sets env."""
    spec = trainjob.get("spec") or {}
    lines = list(env_problems((spec.get("trainer") or {}).get("env") or [], "spec.trainer"))
    for kind in ("dataset", "model"):
        lines += env_problems(((spec.get("initializer") or {}).get(kind) or {}).get("env")
                              or [], f"spec.initializer.{kind}")
    for p, patch in enumerate(spec.get("runtimePatches") or []):
        tpl = (((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}) \
            .get("spec") or {}
        for rjob in tpl.get("replicatedJobs") or []:
            for kind, i, container in _containers(rjob or {}):
                lines += env_problems(container.get("env") or [],
                                      f"spec.runtimePatches[{p}].trainingRuntimeSpec."
                                      f"template.spec.replicatedJobs[{rjob.get('name')}]."
                                      f"{POD}.{kind}[{container.get('name') or i}]")
    return lines


def problems(runtime: dict, runtime_path: Path, trainjob: dict | None = None,
             trainjob_path: Path | None = None) -> list[str]:
    """Every contract violation of the runtime and the TrainJob, each line naming its file."""
    lines = [f"{runtime_path}: {line}" for line in runtime_problems(runtime)]
    if trainjob is not None:
        lines += [f"{trainjob_path}: {line}" for line in trainjob_problems(trainjob)]
    return lines


def check_files(runtime_path: Path, trainjob_path: Path | None = None,
                settings: "SettingsCheck | None" = None) -> tuple[dict, dict | None]:
    """The runtime and the TrainJob read, then checked: raise ContractError naming every
    violation, before anything merges or runs. Reading them checks them against the CRD
    schema first (``runtime_spec`` through ``manifest_schema``, as `kubectl apply` would),
    both files' problems at once; then our contract and the ``KUBETUNE_*`` values the
    steps will parse (``settings``, the steps' options: ``settings_check``), all at once.
    A file that cannot be read as a runtime or TrainJob at all is one BadInputError."""
    from kubetune.tools.local.runtime_spec import load_runtime, load_trainjob

    loaded: list[dict | None] = []
    schema: list[str] = []
    for path, load in ((runtime_path, load_runtime), (trainjob_path, load_trainjob)):
        try:
            loaded.append(load(path) if path else None)
        except ContractError as exc:
            schema += exc.lines
            loaded.append(None)
    raise_all(schema)
    runtime, trainjob = loaded
    lines = problems(runtime, runtime_path, trainjob, trainjob_path)
    if settings is not None:
        lines += settings.manifest_problems(runtime, runtime_path, trainjob, trainjob_path)
    raise_all(lines)
    return runtime, trainjob


def checked_jobset(runtime_path: Path, trainjob_path: Path | None = None,
                   settings: "SettingsCheck | None" = None) -> dict:
    """The JobSet the controller would create from the two files, every check passed
    (``check_files``, then admission as the controller's webhook answers)."""
    from kubetune.tools.local.runtime_merge import merge
    from kubetune.tools.local.runtime_spec import default_trainjob

    runtime, trainjob = check_files(runtime_path, trainjob_path, settings)
    return merge(runtime, trainjob or default_trainjob(runtime))
