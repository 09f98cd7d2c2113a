"""Check everything `kubetune local` was given before any step starts.

A mistake a step would find (a malformed URI, a source that is not there, a typo in a
trainer argument, a runtime whose container needs a Secret not exported) would otherwise
surface after both initializers have copied the model and the dataset: minutes, and a
half-filled workspace. Each check here is the one the step itself makes, called with the
same parser or planner (`kubetune.storage_uri`, the initializers' scheme registry, the
trainer's `plan`), so the two cannot disagree; nothing here writes under the workdir.

Relative local paths (``./my-model``, ``file://./my-model``) are made absolute here,
against the directory `kubetune local` was started in, once: the steps get absolute paths,
whatever their own working directory or container mounts.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kubetune import env, storage_uri
from kubetune.errors import BadInputError, TransientError
from kubetune.workspace import TEACHER_PATH
from kubetune.suggest import closest
from kubetune.tools.local.jobset import SCRATCH_MOUNTS
from kubetune.tools.local.train_args import arg_key

if TYPE_CHECKING:
    from kubetune.tools.local.jobset import LocalJobSet

log = logging.getLogger("local")


# `kubetune train`'s options that `kubetune local` takes too (the held-out data's, the
# chat format's).
TRAINER_OPTIONS = frozenset({"val_fraction", "val_every_n_steps", "early_stop_patience",
                             "val_prompts", "chat_template"})


@dataclass(frozen=True)
class Options:
    """`kubetune local`'s options and arguments, as click parsed them."""

    workdir: Path
    model_uri: str | None
    dataset_uri: str | None
    method: str
    export_uri: str | None
    runtime_path: Path | None
    trainjob_path: Path | None
    print_jobset: bool
    engine: str
    gpus: bool
    images: tuple[str, ...]
    train_args: tuple[str, ...]
    # Trainer settings' variables (KUBETUNE_EPOCHS, ...) this shell sets.
    settings_in_shell: tuple[str, ...] = ()
    configmaps: tuple[str, ...] = ()


def check_combinations(o: Options, option_names: set[str],
                       on_command_line: frozenset[str] = frozenset()) -> None:
    """Options that do not go together, and command-line words that are not TRAIN_ARGS.
    ``on_command_line``: the parameters typed as flags (not from a variable, which the
    runtime's own steps may read from the environment they inherit)."""
    if o.runtime_path is None and o.engine != "process":
        raise BadInputError(f"--engine {o.engine} runs a runtime's images: give --runtime "
                            "(e.g. runtimes/base/kubetune-byo-model.yaml)")
    if o.engine == "process" and (o.gpus or o.images):
        raise BadInputError("--gpus and --image need a container engine (--engine podman "
                            "or docker)")
    if o.runtime_path is None and (o.trainjob_path or o.print_jobset):
        raise BadInputError("--trainjob and --print-jobset need --runtime")
    if o.runtime_path is None and o.configmaps:
        raise BadInputError("--configmap needs --runtime: it stands for a ConfigMap a "
                            "runtime's volume names")
    if o.runtime_path is not None and (o.model_uri or o.dataset_uri or o.train_args):
        raise BadInputError("with --runtime, set sources and trainer args in the TrainJob "
                            "(--trainjob), not --model/--dataset/TRAIN_ARGS")
    if o.runtime_path is not None and o.settings_in_shell:
        # A pod gets the TrainJob's env, never this shell's (nor does --engine's container).
        raise BadInputError(f"with --runtime, set {', '.join(o.settings_in_shell)} in the "
                            "TrainJob's spec.trainer.env, not in this shell: the runtime's "
                            "pods get only the TrainJob's env")
    ignored = sorted(({"method", "objective", "teacher_uri", "export_uri", "nproc"}
                      | TRAINER_OPTIONS) & on_command_line)
    if o.runtime_path is not None and ignored:
        # The option's flag, where its parameter is named otherwise (--teacher: teacher_uri).
        flags = "/".join("--teacher" if name == "teacher_uri" else "--" + name.replace("_", "-")
                         for name in ignored)
        raise BadInputError(f"with --runtime, {flags} would be ignored: the runtime and the "
                            "TrainJob set the method, the export destination and the "
                            "trainer's settings (spec.trainer.env)")
    check_train_arg_words(list(o.train_args), option_names)
    if o.engine != "process" and not o.print_jobset and shutil.which(o.engine) is None:
        raise BadInputError(f"--engine {o.engine}: `{o.engine}` is not installed or not on "
                            "PATH")


def check_train_arg_words(args: list[str], option_names: set[str]) -> None:
    """Each TRAIN_ARG is ``key=value`` (or ``~key``): an option-like word is a mistyped
    option of ours or a trainer setting written as a flag (``--epochs 1``)."""
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            name, _, value = arg.partition("=")
            guess = closest(name, option_names)
            if guess is not None:
                raise BadInputError(f"no such option {name} (did you mean {guess}?)")
            value = value or (args[i + 1] if i + 1 < len(args) and "=" not in args[i + 1]
                              and not args[i + 1].startswith("-") else "<value>")
            key = name.lstrip("-").replace("-", "_")
            raise BadInputError(f"{name} is not an option of kubetune local; trainer "
                                f"arguments are key=value: {key}={value}")
        if "=" not in arg and not arg.startswith("~"):
            raise BadInputError(f"trainer argument {arg!r} is not key=value (e.g. epochs=2, "
                                "optimizer.lr=2e-4)")
        if not arg_key(arg):
            raise BadInputError(f"trainer argument {arg!r} has no key before '='")


def _typed(uri: str, what: str, cwd: Path) -> str:
    """``uri`` (a model or dataset source) made absolute and parsed as the initializer
    parses it; a local path must exist. Errors name the option: ``what``."""
    from kubetune.initializers.storage_uri import parse, source_class

    resolved = storage_uri.absolute(uri, cwd)
    try:
        generic = parse(resolved)
        source_class(generic.scheme)
        if generic.scheme == "hf":
            storage_uri.hub(generic, env.STORAGE_URI)
        elif generic.scheme == "s3":
            storage_uri.s3(generic, env.STORAGE_URI)
        elif generic.scheme == "file" and not Path(generic.location).exists():
            relative = f" ({uri!r} relative to {cwd})" if resolved != uri.strip() else ""
            raise BadInputError(f"{generic.location} does not exist{relative}")
    except BadInputError as exc:
        raise BadInputError(f"{what}: {exc.message}") from None
    return resolved


def local_source(uri: str) -> Path | None:
    """The directory a resolved ``file`` source names, if it is one."""
    generic = storage_uri.parse(uri, env.STORAGE_URI, "")
    path = Path(generic.location)
    return path if generic.scheme == "file" and path.is_dir() else None


def resolve_sources(model_uri: str | None, dataset_uri: str | None,
                    export_uri: str | None, cwd: Path
                    ) -> tuple[str | None, str | None, str | None]:
    """The three URIs absolute and checked (None: the demo's, or the default export)."""
    model = _typed(model_uri, "--model", cwd) if model_uri else None
    dataset = _typed(dataset_uri, "--dataset", cwd) if dataset_uri else None
    export = None
    if export_uri:
        export = storage_uri.absolute(export_uri, cwd)
        try:
            storage_uri.export_destination(export)
        except BadInputError as exc:
            raise BadInputError(f"--export-uri: {exc.message}") from None
    return model, dataset, export


def resolve_teacher(objective: str, teacher_uri: str | None, cwd: Path) -> str | None:
    """A distillation run's teacher source, absolute and parsed as the model initializer
    parses it; required by an objective with a teacher and meaningless without one."""
    from kubetune.trainer.objectives import registry

    needs = registry.get(objective).needs_teacher
    if needs and not teacher_uri:
        raise BadInputError(f"--objective {objective} needs a teacher: --teacher URI (or "
                            f"{env.TEACHER_URI}), a model of the student's tokenizer")
    if not needs and teacher_uri:
        raise BadInputError(f"--teacher is for --objective distill (this run: {objective}): "
                            "add --objective distill or leave --teacher out")
    return _typed(teacher_uri, "--teacher", cwd) if teacher_uri else None


def check_export_destination(export_uri: str | None, work_dir: Path) -> None:
    """The exporter's own check of ``export_uri`` (absolute; None: the workspace's), made
    before any step rather than after the training: a directory holding what no export
    wrote, S3 credentials missing or refused, a bucket that does not exist, a hub token
    missing or read-only. Each failure is the exporter's line, naming --export-uri.
    Credentials are this process's environment, which the exporter step inherits. One
    attempt per request, each bounded (``destination.PROBE_TIMEOUT_S``): an endpoint that
    does not answer is exit 75 here, not minutes of retries."""
    if export_uri is None:
        return
    from kubetune.exporter.destination import open_destination

    try:
        open_destination(export_uri, None, work_dir, probe=True).check()
    except BadInputError as exc:
        raise BadInputError(f"--export-uri: {exc.message}") from None
    except TransientError as exc:
        raise TransientError(f"--export-uri: {exc.message} (checked before any step: fix "
                             "the endpoint, or run again when it answers)") from None


def _verified_model(model_dir: Path) -> None:
    """The model initializer's own check of a local source (read-only), naming --model."""
    from kubetune.initializers import verify_model

    try:
        verify_model.verify(model_dir)
    except BadInputError as exc:
        raise BadInputError(f"--model {model_dir}: {exc.message}") from None


def _verified_dataset(dataset_dir: Path) -> dict:
    """The dataset initializer's own check of a local source (read-only), naming
    --dataset; the descriptor it would write."""
    from kubetune.initializers import verify_dataset

    try:
        return verify_dataset.describe(dataset_dir)
    except BadInputError as exc:
        raise BadInputError(f"--dataset {dataset_dir}: {exc.message}") from None


def _dataset_view(dataset_dir: Path, descriptor: dict, view: Path) -> Path:
    """A dataset directory as the dataset initializer leaves it for the trainer: links to
    the data files and the descriptor, made under ``view`` (the user's source gets no file
    of ours)."""
    from kubetune.initializers import verify_dataset

    for name in descriptor["files"]:
        (view / name).parent.mkdir(parents=True, exist_ok=True)
        (view / name).symlink_to(dataset_dir / name)
    verify_dataset.write_descriptor(view, descriptor)
    return view


def check_trainer(tune_run: list[str], step_env: dict[str, str], pvc: Path,
                  model_uri: str, dataset_uri: str, teacher_uri: str | None = None,
                  spellings: dict[str, str] | None = None):
    """Plan the trainer step (``tune_run``: its argv after ``run``) as the trainer will,
    before the initializers have filled the workspace; return the planned config (an
    OmegaConf DictConfig), or None where a source is remote.

    A local source directory is checked as its initializer will check it. With both
    local, the trainer's whole `plan` then runs against them: keys, values, the
    method against the model, the LoRA rank, the dataset's columns and split, whether the
    rows make a step. With a remote source, only the checks that need no checkpoint and
    no data. ``spellings``: config key -> the option or variable that set it, which a
    refusal names (``--val-fraction``, not ``kubetune.val_fraction``)."""
    from kubetune.trainer.planning.plan import check_request, plan
    from kubetune.trainer.request.settings import LauncherSettings
    from kubetune.trainer.request.tune_command import parse_tune_run
    from kubetune.workspace import Workspace

    model_dir, dataset_dir = local_source(model_uri), local_source(dataset_uri)
    # A local source is checked as its initializer will check it, whatever the other.
    if model_dir is not None:
        _verified_model(model_dir)
    descriptor = _verified_dataset(dataset_dir) if dataset_dir is not None else None
    teacher_dir = local_source(teacher_uri) if teacher_uri else None
    if teacher_dir is not None:
        _verified_model(teacher_dir)
    if model_dir is None or descriptor is None or (teacher_uri and teacher_dir is None):
        request = parse_tune_run(tune_run)
        request.spellings = dict(spellings or {})
        for note in check_request(request):
            log.debug("trainer plan: %s", note)
        return None
    # The workspace paths the pipeline gives the trainer, pointed at the model source.
    in_pvc = str(pvc / "model")
    argv = [a.replace(f"={in_pvc}", f"={model_dir}", 1) for a in tune_run]
    if teacher_dir is not None:
        argv = [a.replace(f"={pvc / TEACHER_PATH}", f"={teacher_dir}", 1) for a in argv]
    # The step's own environment (PET_*): the topology the trainer will see.
    settings = LauncherSettings({**os.environ, **step_env})  # a child's env, built here
    with tempfile.TemporaryDirectory(prefix="kubetune-preflight-") as tmp:
        dataset_view = _dataset_view(dataset_dir, descriptor, Path(tmp))
        here = Workspace(root=pvc, dataset_dir=dataset_view, model_dir=model_dir,
                         output_dir=pvc / "output", export_dir=pvc / "export")
        request = parse_tune_run(argv)
        request.spellings = dict(spellings or {})
        request.objective = step_env.get(env.OBJECTIVE)  # as the trainer step reads it
        planned = plan(request, here, settings)
    for note in planned.notes:  # the trainer logs them itself when it runs
        log.debug("trainer plan: %s", note)
    return planned.cfg


# Trainer arguments naming local data a held-out set is read from (and, below, those
# naming a model an objective loads besides the policy: a teacher).
_NAMED_PATHS = ("dataset_val.data_dir", "dataset_val.data_files")


def _path_keys() -> tuple[str, ...]:
    from kubetune.trainer.objectives import registry

    return _NAMED_PATHS + tuple(f"{section}.checkpoint_dir" for objective in
                                registry.OBJECTIVES.values()
                                for section in objective.own_checkpointers)


def _named_paths(value: str) -> list[str]:
    """The paths an argument's value names: one, or a YAML list (``[a.json, b.json]``)."""
    import yaml

    if value.strip().startswith(("[", "{")):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return []
        items = parsed.values() if isinstance(parsed, dict) else parsed
        return [str(p) for item in items for p in (item if isinstance(item, list) else [item])]
    return [value]


def check_named_paths(train_args: list[str], *filled: Path) -> None:
    """A held-out set (``dataset_val.data_dir``/``data_files``) or a teacher checkpoint
    named on an absolute path of this machine that is not there, refused before any step
    (with a remote model or dataset the trainer's plan cannot run here, and would find it
    only after the downloads). A path under ``filled`` (the workspace, a container's
    mounts) is the steps' to fill."""
    keys = _path_keys()
    for arg in train_args:
        key, sep, value = arg.partition("=")
        if not sep or key not in keys:
            continue
        for named in _named_paths(value):
            path = Path(named)
            if path.is_absolute() and not any(path.is_relative_to(f) for f in filled) \
                    and not path.exists():
                raise BadInputError(f"{key}={value}: {named} does not exist")


def check_runtime_named_paths(jobset: dict) -> None:
    """``check_named_paths`` for each trainer container of a merged JobSet run as
    processes (its paths are this machine's, but for its volumes' mounts): its command,
    arguments and ``KUBETUNE_TRAIN_OVERRIDES``."""
    for job in jobset["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        for container in pod.get("containers") or []:
            if container.get("name") != "node":
                continue
            overrides = next((v.get("value") or "" for v in container.get("env") or []
                              if v.get("name") == env.TRAIN_OVERRIDES), "")
            words = [str(w) for w in (container.get("command") or []) +
                     (container.get("args") or [])] + overrides.split()
            mounts = [Path(m["mountPath"]) for m in container.get("volumeMounts") or []
                      if m.get("mountPath")]
            try:
                check_named_paths(words, *mounts)
            except BadInputError as exc:
                raise BadInputError(f"container {container['name']} of job {job['name']}: "
                                    f"{exc.message}") from None


def resolve_runtime_uris(jobset: dict, cwd: Path, in_images: bool = False) -> None:
    """STORAGE_URI and EXPORT_URI values of the merged JobSet's containers: relative local
    paths made absolute against ``cwd`` (in place), every value parsed as its step will,
    and a local source that is neither under one of the container's mounts nor on this
    machine refused. ``in_images`` (a container engine): the scheme may be a plugin's
    installed in the image only, and an absolute path may be the image's own; a relative
    one is still this machine's."""
    from kubetune.initializers.storage_uri import parse, source_class

    for job in jobset["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        for container in (pod.get("initContainers") or []) + pod.get("containers", []):
            # A path on a volume appears when the pod runs; /tmp and /dev/shm stay this
            # machine's own (as `jobset` runs them), so a source there must exist now.
            mounts = [m["mountPath"].rstrip("/") for m in container.get("volumeMounts") or []
                      if m["mountPath"].rstrip("/") not in SCRATCH_MOUNTS]
            for var in container.get("env") or []:
                value = var.get("value")
                if var["name"] not in (env.STORAGE_URI, env.EXPORT_URI) or not value \
                        or "$(" in value:
                    continue
                var["value"] = resolved = storage_uri.absolute(value, cwd)
                where = f"container {container['name']}: {var['name']}"
                try:
                    if var["name"] == env.EXPORT_URI:
                        storage_uri.export_destination(resolved)
                        continue
                    generic = parse(resolved)
                    if not in_images:
                        source_class(generic.scheme)
                except BadInputError as exc:
                    raise BadInputError(f"{where}: {exc.message}") from None
                path = generic.location
                on_a_volume = any(path == m or path.startswith(m + "/") for m in mounts)
                in_image = in_images and resolved == value
                if generic.scheme == "file" and not (on_a_volume or in_image) \
                        and not Path(path).exists():
                    relative = f" ({value!r} relative to {cwd})" if resolved != value else ""
                    raise BadInputError(f"{where}: {path} does not exist{relative}")


def _component_args(words: list[str]) -> list[tuple[str, str]]:
    """(key, dotted path) of each ``_component_`` a trainer command line sets."""
    found = []
    for word in words:
        key, sep, value = word.partition("=")
        if sep and (key.endswith("._component_") or key == "dataset") and "." in value:
            found.append((key, value))
    return found


def check_runtime_components(jobset: "LocalJobSet") -> None:
    """Each user module a trainer container's ``_component_`` names (a dataset builder on
    a ConfigMap or PYTHONPATH) imported as that container's step will import it, before
    any step runs: a module that does not import is one line with its cause. Processes
    only: with a container engine the module is the image's."""
    from kubetune.trainer.config.component_import import import_problem, users_module

    for job in jobset.spec["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if container.get("name") != "node":
                continue
            step = jobset.step(job, container, 0, 1)
            words = step.command + step.env.get(env.TRAIN_OVERRIDES, "").split()
            for key, component in _component_args(words):
                module = users_module(component)
                cause = import_problem(module, step.env) if module else None
                if cause is not None:
                    raise BadInputError(
                        f"container {container['name']} of job {job['name']}: "
                        f"{key}={component}: cannot import {module}: {cause}; put its "
                        "directory on the container's PYTHONPATH (a ConfigMap volume: "
                        "--configmap NAME=DIR) or install it in the trainer image")
