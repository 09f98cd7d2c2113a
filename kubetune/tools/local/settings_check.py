"""The values of the ``KUBETUNE_*`` settings a runtime, a TrainJob or this shell carries,
checked before any container or process starts, by the parsers their steps will use.

Names are `runtime_contract`'s; values are checked here. A runtime whose env holds
``KUBETUNE_VAL_FRACTION: "0.9"`` passes every name check, and on a cluster its pods
download the model and the data before the trainer refuses the value. Each value is read
as its step reads it: a step's click option (type, choices, booleans: `kubetune train`,
`kubetune export`, the initializers), the trainer's ranges (``value_rules``, which the
trainer's own check of the merged config reads too) and its option parsers
(``train_options``: a LoRA JSON config, target modules, a column map, overrides), the
numbers ``env_numbers`` parses (the initializers' settings, the request timeout), and a
source or destination URI's scheme. Every bad value is one line naming it as the user
wrote it: a YAML path (``spec.trainer.env[2]``), a variable or an option.

The steps' click commands are the entrypoints' (a room above this one): the caller hands
them in (``kubetune.entrypoints.step_options.settings_check``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import click

from kubetune import env as envnames
from kubetune.errors import BadInputError
from kubetune.tools.local.manifest_walk import container_ref, containers, jobs


# Variable -> (the step's click command, its option).
StepOptions = dict[str, tuple[click.Command, click.Parameter]]


def step_options(*commands: click.Command) -> StepOptions:
    """Variable -> (command, option) for every option of ``commands`` read from one (the
    first command that reads a variable wins: `kubetune train` before the exporter)."""
    found: StepOptions = {}
    for command in commands:
        for param in command.params:
            if isinstance(param.envvar, str):
                found.setdefault(param.envvar, (command, param))
    return found


def _read_by_any_step(name: str, options: StepOptions) -> bool:
    """A variable one of our steps reads (KUBETUNE_*, and the names Kubeflow's own
    initializers and our exporter share: STORAGE_URI, EXPORT_FORMAT, LORA_CONFIG ...)."""
    return name.startswith(envnames.KUBETUNE_PREFIX) or name in options or name in (
        envnames.STORAGE_URI, envnames.EXPORT_URI, envnames.EXPORT_FORMAT)


class SettingsCheck:
    """The checks, over the steps' options (``options``: ``step_options``' mapping;
    ``trainer``: the name of the command whose values the trainer also plans)."""

    def __init__(self, options: StepOptions, trainer: str = "train") -> None:
        self.options = options
        self.trainer = trainer

    def _click_value(self, name: str, text: str):
        """(the value ``text`` stands for, None), or (None, why not) as click says it."""
        command, param = self.options[name]
        ctx = click.Context(command, resilient_parsing=False)
        try:
            return param.type_cast_value(ctx, text), None
        except click.BadParameter as exc:
            return None, exc.message

    def value_problem(self, name: str, text: str) -> str | None:
        """Why the step that reads variable ``name`` would refuse ``text``, or None."""
        if name in (envnames.STORAGE_URI, envnames.EXPORT_URI, envnames.TEACHER_URI):
            return _uri_problem(name, text)
        if name == envnames.EXPORT_FORMAT:
            from kubetune.exporter.artifact import FORMATS

            return None if text in FORMATS else f"{text!r} is not one of {', '.join(FORMATS)}"
        problem = _number_problem(name, text)
        if problem is not None or name not in self.options:
            return problem
        value, problem = self._click_value(name, text)
        if problem is not None:
            return problem
        command, param = self.options[name]
        if value is None or command.name != self.trainer:
            return None
        return _trainer_problem(param.name, value)

    def env_list_problems(self, env_list: list, where: str) -> Iterator[str]:
        """Every literal value of an env list (a container's, a TrainJob's) its step would
        refuse, one line each: ``<where>.env[<i>]: NAME="value": why``."""
        for i, var in enumerate(env_list or []):
            if not isinstance(var, dict) or not isinstance(var.get("value"), str):
                continue  # valueFrom: the kubelet's; a non-string: the schema's
            name = var.get("name")
            if not isinstance(name, str) or not _read_by_any_step(name, self.options):
                continue
            text = var["value"]
            # $(VAR) is the kubelet's to expand in the pod: its value is not known here.
            problem = self.value_problem(name, text) if text.strip() and "$(" not in text \
                else None
            if problem is not None:
                yield f"{where}.env[{i}]: {name}={json.dumps(text)}: {problem}"

    def runtime_problems(self, runtime: dict) -> list[str]:
        """Every bad setting value in a runtime's containers (without the file)."""
        lines: list[str] = []
        for env_list, where in _container_envs(runtime.get("spec") or {}, ""):
            lines += self.env_list_problems(env_list, where)
        return lines

    def trainjob_problems(self, trainjob: dict) -> list[str]:
        """Every bad setting value a TrainJob carries: its trainer's and initializers'
        env, their storage URIs, and its runtimePatches' containers (without the file)."""
        spec = trainjob.get("spec") or {}
        lines = list(self.env_list_problems((spec.get("trainer") or {}).get("env") or [],
                                            "spec.trainer"))
        for kind in ("dataset", "model"):
            section = (spec.get("initializer") or {}).get(kind) or {}
            lines += self.env_list_problems(section.get("env") or [],
                                            f"spec.initializer.{kind}")
            uri = section.get("storageUri")
            problem = _uri_problem(envnames.STORAGE_URI, uri) if isinstance(uri, str) \
                else None
            if problem is not None:
                lines.append(f"spec.initializer.{kind}.storageUri: {uri!r}: {problem}")
        for p, patch in enumerate(spec.get("runtimePatches") or []):
            patched = (patch or {}).get("trainingRuntimeSpec") or {}
            for env_list, where in _container_envs(
                    patched, f"spec.runtimePatches[{p}].trainingRuntimeSpec.template.spec."):
                lines += self.env_list_problems(env_list, where)
        return lines

    def manifest_problems(self, runtime: dict, runtime_path: Path, trainjob: dict | None,
                          trainjob_path: Path | None) -> list[str]:
        """Both files' bad setting values, each line naming its file."""
        lines = [f"{runtime_path}: {line}" for line in self.runtime_problems(runtime)]
        if trainjob is not None:
            lines += [f"{trainjob_path}: {line}" for line in self.trainjob_problems(trainjob)]
        return lines

    def shell_problems(self, environ: dict[str, str], typed: dict[str, object],
                       skip: frozenset[str] = frozenset()) -> list[str]:
        """`kubetune local`'s settings, checked as its steps will check them: each
        trainer option typed (``typed``: `kubetune train`'s option name -> value, said as
        ``--val-fraction 0.9``), then each variable of ``environ`` a step reads (every
        step inherits this shell's) that no typed option overrides, said as
        ``KUBETUNE_VAL_FRACTION=0.9``. ``skip``: the variables `kubetune local` reads or
        sets per step itself (its own options, STORAGE_URI ...)."""
        variables = {param.name: name for name, (command, param) in self.options.items()
                     if command.name == self.trainer}
        lines = []
        for option, value in sorted(typed.items()):
            name = variables.get(option)
            problem = self.value_problem(name, str(value)) \
                if name and value is not None else None
            if problem is not None:
                lines.append(f"--{option.replace('_', '-')} {value}: {problem}")
        overridden = {variables.get(option) for option in typed}
        read = set(self.options) | set(NUMBER_VARIABLES)
        for name, text in sorted(environ.items()):
            if name in overridden or name in skip or name not in read or not text.strip():
                continue
            problem = self.value_problem(name, text)
            if problem is not None:
                lines.append(f"{name}={text}: {problem}")
        return lines


def _trainer_problem(option: str, value) -> str | None:
    """The trainer's own refusal of one `kubetune train` option's value: its range
    (``value_rules``), else the parser of its override (``train_options``)."""
    from kubetune.trainer.request.train_options import (OPTION_KEYS, TrainOptions,
                                                        split_overrides, train_overrides)
    from kubetune.trainer.request.value_rules import key_problem

    if option in OPTION_KEYS:
        problem = key_problem(OPTION_KEYS[option], value)
        if problem is not None:
            return problem
    try:
        if option == "train_overrides_text":
            split_overrides(value)
        elif option in TrainOptions.__dataclass_fields__ and option != "method":
            train_overrides(TrainOptions(**{option: value}))
    except BadInputError as exc:
        return exc.message
    return None


def _uri_problem(name: str, text: str) -> str | None:
    """A source's or destination's URI parsed as its step parses it (its shape, and an
    hf:// or s3:// one as those sources read it); whether a path exists is the step's, on
    its own volume, and a scheme no plugin here serves may be a plugin's of the image
    (`kubetune local` as processes refuses it: `preflight.resolve_runtime_uris`)."""
    from kubetune import storage_uri

    if "$(" in text:
        return None  # the kubelet expands it in the pod
    try:
        if name == envnames.EXPORT_URI:
            storage_uri.export_destination(storage_uri.absolute(text, Path.cwd()))
        else:
            from kubetune.initializers.storage_uri import parse

            typed = parse(storage_uri.absolute(text, Path.cwd()))
            if typed.scheme == "hf":
                storage_uri.hub(typed, name)
            elif typed.scheme == "s3":
                storage_uri.s3(typed, name)
    except BadInputError as exc:
        return exc.message
    return None


# The variables whose numbers ``env_numbers`` parses (no click option reads them).
NUMBER_VARIABLES = (envnames.DOWNLOAD_WORKERS, envnames.S3_PART_SIZE_MB,
                    envnames.S3_PART_WORKERS, envnames.PROGRESS_INTERVAL_S,
                    envnames.HTTP_TIMEOUT_S)


def _number_problem(name: str, text: str) -> str | None:
    """The numbers ``env_numbers`` parses, read by the settings object that reads them."""
    from kubetune.initializers.settings import InitializerSettings
    from kubetune.remote.settings import http_timeout_s

    readers: dict[str, Callable[[dict], object]] = {
        envnames.DOWNLOAD_WORKERS: lambda e: InitializerSettings(e).download_workers,
        envnames.S3_PART_SIZE_MB: lambda e: InitializerSettings(e).s3_part_size,
        envnames.S3_PART_WORKERS: lambda e: InitializerSettings(e).s3_part_workers,
        envnames.PROGRESS_INTERVAL_S: lambda e: InitializerSettings(e).progress_interval_s,
        envnames.HTTP_TIMEOUT_S: http_timeout_s,
    }
    if name not in readers:
        return None
    try:
        readers[name]({name: text})
    except BadInputError as exc:
        # env_numbers names the variable; the caller names it as the user wrote it.
        return exc.message.split(f"{name}={text.strip()!r} ", 1)[-1]
    return None


def _container_envs(spec: dict, prefix: str) -> Iterator[tuple[list, str]]:
    for index, rjob in enumerate(jobs({"spec": spec})):
        if not isinstance(rjob, dict):
            continue
        for kind, i, container in containers(rjob):
            yield (container.get("env") or [],
                   prefix + container_ref(rjob, index, kind, i, container))
