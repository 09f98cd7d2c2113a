"""`kubetune local`: the whole pipeline on this machine, as the runtime wires it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from kubetune import env, file_lock
from kubetune.entrypoints.extras import require
from kubetune.tools.local import preflight, train_args as train_args_rules
from kubetune.tools.local.steps import (Step, emit, flush_or_discard_output,
                                        forwarding_signals, run_stages)
from kubetune.workspace import SUMMARY_NAME, TEACHER_PATH
from kubetune.entrypoints.options import method_option, objective_option, repeatable_option
from kubetune.trainer.metric_logging import held_out_numbers
from kubetune.trainer.objectives import registry
from kubetune.trainer.request.process_hint import PROCESSES_KEY
from kubetune.trainer.request.topology import Topology

if TYPE_CHECKING:
    from kubetune.tools.local.containers import EngineOptions

# In the work directory: held by the `kubetune local` running there.
WORKDIR_LOCK_NAME = ".kubetune-local.lock"


@contextlib.contextmanager
def workdir_held(workdir: Path) -> Iterator[None]:
    """One `kubetune local` per work directory (the trainer's own lock, on its output_dir,
    as an initializer's on its output): a second fails at once, before any step starts
    or any file of the first's is touched; it exits 75, as a lock held elsewhere is."""
    from kubetune.errors import TransientError

    try:
        with file_lock.hold(Path(workdir) / WORKDIR_LOCK_NAME, wait=False):
            yield
    except file_lock.LockHeld as held:
        raise TransientError(f"workdir {workdir} is in use by another kubetune local "
                             f"({held.holder}): wait for it to finish, or give this run "
                             "another --workdir") from None


# What a run refused before its first step may have made in a work directory it created:
# the lock (gone with the lock) and the `tune` shim a runtime's processes find first.
_BEFORE_ANY_STEP = {WORKDIR_LOCK_NAME, "bin"}


@contextlib.contextmanager
def no_workdir_left_on_refusal(workdir: Path) -> Iterator[None]:
    """A run refused before its first step leaves no work directory it created: the next
    run (or the user's `ls`) finds nothing that looks like a run. One that existed stays,
    and so does one a step wrote into (its logs say what happened)."""
    existed = Path(workdir).exists()
    try:
        yield
    except BaseException:
        if not existed and Path(workdir).is_dir() and \
                {p.name for p in Path(workdir).iterdir()} <= _BEFORE_ANY_STEP:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def demo_sources(sources_dir: Path) -> tuple[str, str]:
    """Generate (once) the embedded tiny model and dataset; return their URIs."""
    from kubetune.tools.demo import write_tiny_dataset, write_tiny_model

    model_dir, dataset_dir = sources_dir / "tiny-llama3", sources_dir / "tiny-addition"
    if not (model_dir / "model.safetensors").is_file():
        write_tiny_model(model_dir)
    if not (dataset_dir / "data" / "train.parquet").is_file():
        write_tiny_dataset(dataset_dir)
    return f"file://{model_dir.resolve()}", f"file://{dataset_dir.resolve()}"


@contextlib.contextmanager
def demo_sources_checked(sources_dir: Path, model_uri: str | None, dataset_uri: str | None
                         ) -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """The (model, dataset) URIs to check and the ones the steps read, the demo's standing
    in for those not given. A demo source not yet in ``sources_dir`` is made in a
    temporary directory for the checks and moved in only once they pass: a refused run
    leaves nothing under the workdir."""
    if model_uri is not None and dataset_uri is not None:
        yield (model_uri, dataset_uri), (model_uri, dataset_uri)
        return
    if (sources_dir / "tiny-llama3").is_dir() and (sources_dir / "tiny-addition").is_dir():
        demo = demo_sources(sources_dir)
        given = (model_uri or demo[0], dataset_uri or demo[1])
        yield given, given
        return
    with tempfile.TemporaryDirectory(prefix="kubetune-demo-sources-") as tmp:
        demo = demo_sources(Path(tmp))
        final = [f"file://{(sources_dir / name).resolve()}"
                 for name in ("tiny-llama3", "tiny-addition")]
        yield ((model_uri or demo[0], dataset_uri or demo[1]),
               (model_uri or final[0], dataset_uri or final[1]))
        sources_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tiny-llama3", "tiny-addition"):
            if not (sources_dir / name).exists():
                shutil.move(str(Path(tmp) / name), str(sources_dir / name))


# How a user of the built-in pipeline asks for more trainer processes (refusals say it).
LOCAL_SPELLINGS = {PROCESSES_KEY: "--nproc"}


def pipeline(workdir: Path, model_uri: str, dataset_uri: str, method: str,
             train_args: list[str], export_uri: str | None,
             objective: str = "sft", teacher_uri: str | None = None,
             nproc: int = 1) -> list[list[Step]]:
    """The four steps over ``workdir/workspace``, as a ClusterTrainingRuntime wires them
    (a distillation run's teacher: the model initializer again, into ``teacher/``);
    ``nproc`` trainer processes, as a runtime's ``numProcPerNode``."""
    pvc = (workdir / "workspace").resolve()
    py = sys.executable
    pod_env = {env.WORKSPACE: str(pvc)}
    # As the byo-model runtime's pod says it: the trainer reads the method it runs (a
    # different KUBETUNE_METHOD inherited from this shell would be refused there).
    trainer_env = {**pod_env, env.METHOD: method, env.OBJECTIVE: objective}
    chosen = registry.get(objective)
    recipe, config, implied = chosen.recipe_for(method, Topology(1, nproc, 0, None),
                                                LOCAL_SPELLINGS)
    tune_run = [
        py, "-m", "kubetune.entrypoints.tune", "run", recipe, "--config", config,
        f"output_dir={pvc / 'output'}",
        f"tokenizer.path={pvc / 'model' / 'original' / 'tokenizer.model'}",
        f"checkpointer.checkpoint_dir={pvc / 'model'}",
        *(chosen.teacher_overrides(pvc / TEACHER_PATH) if teacher_uri else []),
        *implied, *train_args,
    ]
    teacher = [Step("teacher-initializer", [py, "-m", "kubetune.entrypoints", "init-model"],
                    {**pod_env, env.STORAGE_URI: teacher_uri,
                     env.OUTPUT_PATH: str(pvc / TEACHER_PATH)})] if teacher_uri else []
    return [
        [Step("dataset-initializer", [py, "-m", "kubetune.entrypoints", "init-dataset"],
              {**pod_env, env.STORAGE_URI: dataset_uri}),
         Step("model-initializer", [py, "-m", "kubetune.entrypoints", "init-model"],
              {**pod_env, env.STORAGE_URI: model_uri}), *teacher],
        [Step("trainer", tune_run, {**trainer_env, env.PET_NNODES: "1",
                                    env.PET_NPROC_PER_NODE: str(nproc),
                                    env.PET_NODE_RANK: "0"})],
        [Step("exporter", [py, "-m", "kubetune.entrypoints", "export"],
              {**pod_env, env.EXPORT_URI: export_uri or str(pvc / "export")})],
    ]


def summary_lines(workdir: Path) -> list[str]:
    pvc = workdir / "workspace"
    if not pvc.is_dir():  # a trainer-only runtime (no volume): its steps' logs are all
        return [f"logs: {(workdir / 'logs').resolve()}"]
    if not (pvc / "output" / SUMMARY_NAME).is_file():
        return [f"workspace: {pvc.resolve()}"]
    summary = json.loads((pvc / "output" / SUMMARY_NAME).read_text())
    export_manifest = json.loads((pvc / "export" / "manifest.json").read_text()) \
        if (pvc / "export" / "manifest.json").is_file() else {}
    adapter = next((f["path"] for f in export_manifest.get("files", [])
                    if f["path"].endswith("adapter_model.safetensors")), None)
    tps = summary.get("tokens_per_second")
    lines = [
        f"steps: {summary['steps']}",
        f"loss: {summary['first_loss']:.4f} (first) -> {summary['last_loss']:.4f} (last)",
        f"tokens/s: {tps:.0f}" if tps else "tokens/s: n/a",
    ]
    distilled = summary.get("distillation") or {}
    if distilled.get("last_kd_loss") is not None:
        lines.insert(2, f"loss parts: ce {distilled['first_ce_loss']:.4f} -> "
                        f"{distilled['last_ce_loss']:.4f}, kd {distilled['first_kd_loss']:.4f}"
                        f" -> {distilled['last_kd_loss']:.4f}")
    preference = summary.get("preference") or {}
    if preference.get("last_reward_accuracy") is not None:
        lines.insert(2, f"reward accuracy: {preference['first_reward_accuracy']:.2f} (first) -> "
                        f"{preference['last_reward_accuracy']:.2f} (last), margin "
                        f"{preference['last_reward_margin']:.4f}")
    held_out = summary.get("validation") or {}
    if held_out.get("base_val_loss") is not None and held_out.get("last_val_loss") is not None:
        lines.insert(2, f"val loss: {held_out['base_val_loss']:.4f} (base) -> "
                        f"{held_out['last_val_loss']:.4f} (last), best "
                        f"{held_out['best_val_loss']:.4f} @ step {held_out['best_step']}")
    own = held_out_numbers.change_text(held_out)
    if own:
        lines.insert(3 if held_out.get("last_val_loss") is not None else 2,
                     f"held out (base -> last): {own}")
    if adapter:
        lines.append(f"adapter: {(pvc / 'export' / adapter).parent.resolve()}")
    lines.append(f"checkpoint: {(pvc / 'output' / summary['checkpoint']).resolve()}")
    return lines


def summary_text(lines: list[str]) -> str:
    """The summary as printed: a block of ``key: value`` lines, or with
    KUBETUNE_LOG_FORMAT=json one JSON object holding them (``summary``: key -> value)."""
    from kubetune import logs

    if not logs.json_mode():
        return "\nsummary\n" + "".join(f"  {line}\n" for line in lines)
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    return logs.json_line("local", "INFO", "summary", {"summary": fields}) + "\n"


def _tune_run_args(stages: list[list[Step]]) -> list[str]:
    """The trainer step's arguments after `tune run`."""
    command = stages[1][0].command
    return command[command.index("run") + 1:]


# What `kubetune local` sets in each step's environment itself (pipeline), whatever
# this shell's value.
_SET_HERE = frozenset({env.WORKSPACE, env.STORAGE_URI, env.OUTPUT_PATH, env.EXPORT_URI,
                       env.METHOD, env.OBJECTIVE, env.PET_NNODES, env.PET_NPROC_PER_NODE,
                       env.PET_NODE_RANK})


def _own_variables() -> frozenset[str]:
    """The variables of `kubetune local`'s own options (checked as its options), but for
    the trainer's it shares (--val-fraction ...: checked as the trainer's)."""
    return frozenset(p.envvar for p in local.params if isinstance(p.envvar, str)
                     and p.name not in preflight.TRAINER_OPTIONS)


def run_local(workdir: Path, model_uri: str | None = None, dataset_uri: str | None = None,
              method: str = "lora", train_args: list[str] | None = None,
              export_uri: str | None = None, options: dict | None = None,
              objective: str = "sft", teacher_uri: str | None = None,
              nproc: int = 1) -> list[str]:
    """Check, then run the pipeline; return the summary lines. The trainer settings of
    the environment (``KUBETUNE_*``), then the trainer options typed (``options``:
    `kubetune train`'s names, ``val_fraction`` ...), then ``train_args``, override the
    demo defaults that apply (`kubetune.tools.local.train_args`) key by key."""
    from kubetune.entrypoints.train import environment_settings
    from kubetune.entrypoints.step_options import settings_check
    from kubetune.tools.local.violations import raise_all
    from kubetune.trainer.request.train_options import (TrainOptions, spellings_of,
                                                        train_overrides)

    # Its steps run here, in this interpreter: every stack, before the demo model is made.
    require("all", "kubetune local")
    workdir = Path(workdir)
    # Every trainer setting's value as the trainer will check it, all at once, named as
    # typed (--val-fraction) or set (KUBETUNE_VAL_FRACTION): os.environ scanned whole.
    raise_all(settings_check().shell_problems(dict(os.environ), options or {},
                                              _SET_HERE | _own_variables()))
    from_env, _, set_by = environment_settings(method)
    set_by.update({name: "--" + name.replace("_", "-") for name in options or {}})
    # Relative paths mean the directory the user ran us in: made absolute once, here.
    model_uri, dataset_uri, export_uri = preflight.resolve_sources(
        model_uri, dataset_uri, export_uri, Path.cwd())
    teacher_uri = preflight.resolve_teacher(objective, teacher_uri, Path.cwd())
    args = train_args_rules.effective_train_args(
        list(train_args or []), demo_model=model_uri is None,
        demo_dataset=dataset_uri is None, method=method,
        setting_args=train_args_rules.merge(
            from_env, train_overrides(TrainOptions(method=method, **(options or {})))))
    preflight.check_named_paths(args, (workdir / "workspace").resolve())
    with demo_sources_checked(workdir / "sources", model_uri, dataset_uri) as (checked, final):
        stages = pipeline(workdir, *final, method, args, export_uri, objective, teacher_uri,
                          nproc)
        # What was checked and will run: the demo defaults kept, then the user's.
        logging.getLogger("local").info("trainer arguments: %s", " ".join(args))
        preflight.check_trainer(_tune_run_args(stages), stages[1][0].env,
                                (workdir / "workspace").resolve(), *checked, teacher_uri,
                                {**spellings_of(set_by, list(train_args or [])),
                                 **LOCAL_SPELLINGS})
        preflight.check_export_destination(export_uri, (workdir / "workspace").resolve())
    # A completed run of the same config and inputs stays: its trainer says so and the
    # exporter runs on it (the trainer's fingerprint decides, as in a pod restarted).
    run_stages(stages, workdir / "logs")
    return summary_lines(workdir)


def merged_jobset(runtime_path: Path, trainjob_path: Path | None) -> dict:
    """The JobSet the controller would create from the runtime and the TrainJob."""
    from kubetune.entrypoints.step_options import settings_check
    from kubetune.tools.local.runtime_contract import checked_jobset

    # Every violation of both files at once (ContractError), before anything runs.
    return checked_jobset(runtime_path, trainjob_path, settings_check())


def jobset_yaml(jobset: dict) -> str:
    """The merged JobSet as YAML, with literal credential values masked."""
    import yaml

    from kubetune.redact import MASK, SECRET_VARIABLES, redact, register_secret

    for job in jobset["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            for var in container.get("env") or []:
                if var["name"] in SECRET_VARIABLES and var.get("value"):
                    # Also masked where the same value appears elsewhere (an arg, say).
                    register_secret(var["value"])
                    var["value"] = MASK
    return redact(yaml.safe_dump(jobset, sort_keys=False))


def run_runtime(workdir: Path, runtime_path: Path, trainjob_path: Path | None = None,
                engine: "EngineOptions | None" = None,
                configmaps: dict[str, Path] | None = None) -> list[str]:
    """Run a ClusterTrainingRuntime (with a TrainJob's overrides) here, as processes or
    (``engine``) in containers of its images; return the summary. ``configmaps``: the
    directory that stands for each ConfigMap a volume names."""
    from kubetune.entrypoints.shims import install_tune
    from kubetune.tools.local.jobset import LocalJobSet

    workdir = Path(workdir)
    jobset = merged_jobset(runtime_path, trainjob_path)
    # Relative source paths mean the user's directory; then every container is checked
    # before the first one starts.
    preflight.resolve_runtime_uris(jobset, Path.cwd(), in_images=engine is not None)
    if engine is None:  # in an image, a path may be the image's own
        preflight.check_runtime_named_paths(jobset)
    LocalJobSet(jobset, workdir, engine, configmaps=configmaps).check()
    # As processes, a runtime's `tune run` must reach our launcher, as in our images, where
    # /opt/kubetune/bin is first on PATH: never the `tune` torchtune installs beside the
    # interpreter. Written on each run, for this interpreter. Containers have their own.
    commands_dir = None if engine else install_tune(workdir.resolve() / "bin").parent
    run = LocalJobSet(jobset, workdir, engine, commands_dir, configmaps)
    if engine is None:
        # The trainer's builders import as the trainer step will, before any step runs.
        preflight.check_runtime_components(run)
    else:
        run.session.pull_images(run.images())
    restarts = run.run()
    lines = summary_lines(workdir)
    return lines + ([f"restarts: {restarts}"] if restarts else [])


@click.command("local", context_settings={"ignore_unknown_options": True})
@click.option("--workdir", envvar=env.LOCAL_DIR, default="kubetune-local",
              type=click.Path(path_type=Path, file_okay=False), show_default=True,
              show_envvar=True,
              help="Directory for the stand-in PVC (workspace/), sources and logs")
@click.option("--model", "model_uri", envvar=env.LOCAL_MODEL, default=None, show_envvar=True,
              help="Model STORAGE_URI (default: the embedded tiny Llama-3)")
@click.option("--dataset", "dataset_uri", envvar=env.LOCAL_DATASET, default=None,
              show_envvar=True,
              help="Dataset STORAGE_URI (default: the embedded addition dataset)")
@method_option("Fine-tuning method")
@objective_option("sft, dpo: preference tuning on chosen/rejected pairs (--dataset; rso: "
                  "the same with torchtune's hinge loss), or distill: a LoRA student learns "
                  "from --teacher's logits")
@click.option("--teacher", "teacher_uri", envvar=env.TEACHER_URI, default=None,
              show_envvar=True, help="Teacher model STORAGE_URI (--objective distill), "
                                     "fetched like --model into workspace/teacher")
@click.option("--nproc", envvar=env.LOCAL_NPROC, default=1, show_default=True,
              show_envvar=True, type=click.IntRange(1),
              help="Trainer processes on this machine, as a runtime's numProcPerNode: 2+ "
                   "runs the distributed recipes (full and DoRA DPO)")
@click.option("--export-uri", envvar=env.EXPORT_URI, default=None, show_envvar=True,
              help="Export destination (default: workspace/export)")
@click.option("--runtime", "runtime_path", envvar=env.LOCAL_RUNTIME, default=None,
              type=click.Path(path_type=Path), show_envvar=True,
              help="Run this ClusterTrainingRuntime YAML instead of the built-in pipeline: "
                   "its replicatedJobs in dependsOn order, as the controller merges them")
@click.option("--trainjob", "trainjob_path", envvar=env.LOCAL_TRAINJOB, default=None,
              type=click.Path(path_type=Path), show_envvar=True,
              help="TrainJob YAML whose overrides (initializer STORAGE_URIs, trainer "
                   "command/args/env/numNodes/resourcesPerNode) apply to --runtime")
@click.option("--print-jobset", is_flag=True, envvar=env.LOCAL_PRINT_JOBSET, show_envvar=True,
              help="With --runtime: print the merged JobSet as YAML and run nothing")
@click.option("--engine", envvar=env.LOCAL_ENGINE, default="process", show_default=True,
              show_envvar=True, type=click.Choice(["process", "podman", "docker"]),
              help="process: this checkout's code as processes; podman/docker: with "
                   "--runtime, each container in its image, as the kubelet runs it")
@click.option("--gpus", is_flag=True, envvar=env.LOCAL_GPUS, show_envvar=True,
              help="With a container engine: give every GPU to the containers that request "
                   "nvidia.com/gpu (docker --gpus, podman CDI)")
@repeatable_option("--image", "images", env.LOCAL_IMAGES, "NAME=IMAGE",
                   "With a container engine: run IMAGE where the runtime names NAME (a full "
                   "reference, or its last part: initializer, trainer, exporter)")
@click.option("--val-fraction", envvar=env.VAL_FRACTION, type=float, default=None,
              show_envvar=True, help="Hold out this fraction (at most 0.5) of the training "
              "split where the data ships no validation or test split (kubetune train's)")
@click.option("--val-every-n-steps", envvar=env.VAL_EVERY_N_STEPS, type=int, default=None,
              show_envvar=True, help="Validation loss every N optimizer steps (0: none)")
@click.option("--early-stop-patience", envvar=env.EARLY_STOP_PATIENCE, type=int,
              default=None, show_envvar=True,
              help="Stop after N evaluations without a lower validation loss")
@click.option("--val-prompts", envvar=env.VAL_PROMPTS, type=int, default=None,
              show_envvar=True, help="Held-out prompts answered side by side (default 3)")
@click.option("--chat-template", envvar=env.CHAT_TEMPLATE, default=None, show_envvar=True,
              type=click.Choice(["base", "torchtune"]),
              help="Chat data's format: base (the base model's own chat template) or "
                   "torchtune (torchtune's); default base where the base has one")
@repeatable_option("--configmap", "configmaps", env.LOCAL_CONFIGMAPS, "NAME=DIR",
                   "With --runtime: DIR's files stand for ConfigMap NAME wherever a volume "
                   "of the runtime mounts it (a builder at /opt/custom, say)")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def local(workdir: Path, model_uri, dataset_uri, method, objective, teacher_uri, nproc,
          export_uri, runtime_path,
          trainjob_path, print_jobset, engine, gpus, images, configmaps, train_args,
          **validation) -> None:
    """Run the whole pipeline here: both initializers, trainer, exporter.

    TRAIN_ARGS are `key=value` trainer arguments, as a TrainJob's spec.trainer.args;
    each overrides the demo default of the same key, the other defaults stay. The
    defaults sized for the tiny model (learning rate, LoRA rank) apply only without
    --model, those sized for the demo dataset (its format, epochs, batch size, warm-up)
    only without --dataset; seed=0 always. The trainer settings `kubetune train --help`
    lists (KUBETUNE_LORA_RANK, ...) apply from the environment too, over the defaults;
    TRAIN_ARGS win over them. Relative paths (./my-model, file://./my-model) are read from
    the current directory. With --runtime, the runtime and the TrainJob say everything
    instead (the other options, TRAIN_ARGS and trainer settings in this shell are
    refused). Every option is checked before the first step starts.
    """
    from kubetune.entrypoints.step import run_step
    from kubetune.tools.local.containers import EngineOptions, parse_image_overrides
    from kubetune.tools.local.jobset import parse_configmaps
    from kubetune.tools.local.runtime_contract import ContractError, report

    def body() -> int:
        from kubetune.entrypoints.train import setting_variables_set

        given = preflight.Options(workdir, model_uri, dataset_uri, method, export_uri,
                                  runtime_path, trainjob_path, print_jobset, engine, gpus,
                                  tuple(images), tuple(train_args),
                                  tuple(setting_variables_set()), tuple(configmaps))
        ctx = click.get_current_context()
        typed = frozenset(p.name for p in ctx.command.params if ctx.get_parameter_source(
            p.name) == click.core.ParameterSource.COMMANDLINE)
        preflight.check_combinations(given, {opt for p in ctx.command.params
                                             for opt in p.opts if opt.startswith("--")}, typed)
        try:
            if runtime_path is None:
                with no_workdir_left_on_refusal(workdir), workdir_held(workdir):
                    # Typed options only: their variables are read with the other settings.
                    typed_options = {name: value for name, value in validation.items()
                                     if name in typed}
                    lines = run_local(workdir, model_uri, dataset_uri, method,
                                      list(train_args) if train_args else None, export_uri,
                                      typed_options, objective, teacher_uri, nproc)
            else:
                if print_jobset:
                    emit(jobset_yaml(merged_jobset(runtime_path, trainjob_path)), raw=True)
                    return 0
                options = None if engine == "process" else EngineOptions(
                    engine, gpus, parse_image_overrides(images))
                with no_workdir_left_on_refusal(workdir), workdir_held(workdir):
                    lines = run_runtime(workdir, runtime_path, trainjob_path, options,
                                        parse_configmaps(configmaps))
        except ContractError as exc:
            return report(exc, "local")  # each violation a line, not only the last
        # Through emit: a reader that went away (`| head -1`) costs the lines, not the run.
        emit(summary_text(lines))
        return 0

    with forwarding_signals():
        code = run_step("local", body)
    flush_or_discard_output()
    sys.exit(code)
