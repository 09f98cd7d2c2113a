"""The `podman run` / `docker run` command line for one container of a merged JobSet.

Pure argv building (no engine is called), so every rule is unit-tested without an engine;
`containers.py` runs what this builds. The translation, as the kubelet would run the pod:
- `command` replaces the image's ENTRYPOINT (its first word as `--entrypoint`, the rest
  before `args`), `args` replace its CMD; neither given: the image's own.
- env is passed by NAME only (`-e NAME`): the values travel in the engine client's own
  environment, so a credential never appears on a command line (`ps` shows argv).
- volumes are host directories bind-mounted (`readOnly` kept); a `medium: Memory` emptyDir
  is a tmpfs; the termination log is one host file per container at /dev/termination-log.
- the user: `--user` and `--userns` as `container_user` decides (the user running
  `kubetune local`, not the runtime's runAsUser/runAsGroup); fsGroup and
  supplementalGroups -> `--group-add`; readOnlyRootFilesystem -> `--read-only`, dropped
  capabilities -> `--cap-drop`, allowPrivilegeEscalation false -> no-new-privileges.
- pods reach each other by their JobSet DNS names: network aliases on a per-job network.
- GPUs: docker's `--gpus all`, podman's CDI device `nvidia.com/gpu=all`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubetune import env as envnames

ENGINES = ("podman", "docker")
TERMINATION_LOG_PATH = envnames.DEFAULT_TERMINATION_LOG  # where the kubelet mounts it


@dataclass(frozen=True)
class Mount:
    host: Path
    target: str
    read_only: bool = False


@dataclass
class ContainerRun:
    """One container as the engine should run it."""

    engine: str
    name: str
    image: str
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env_names: list[str] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    tmpfs: list[str] = field(default_factory=list)
    termination_log: Path | None = None
    network: str | None = None
    hostname: str | None = None
    aliases: list[str] = field(default_factory=list)
    user: str | None = None
    userns: str | None = None
    groups: list[str] = field(default_factory=list)
    read_only: bool = False
    cap_drop: list[str] = field(default_factory=list)
    no_new_privileges: bool = False
    gpus: bool = False
    labels: dict[str, str] = field(default_factory=dict)


def run_argv(c: ContainerRun) -> list[str]:
    """The engine command line that runs ``c`` attached (its output is the step's log)."""
    if c.engine not in ENGINES:
        raise ValueError(f"engine {c.engine!r}: one of {', '.join(ENGINES)}")
    # --init: our step is not PID 1, so a SIGTERM it does not handle still ends it (PID 1
    # ignores signals without a handler); --rm: nothing is left behind when it ends.
    argv = [c.engine, "run", "--rm", "--init", "--name", c.name]
    for key, value in sorted(c.labels.items()):
        argv += ["--label", f"{key}={value}"]
    if c.network:
        argv += ["--network", c.network]
        for alias in c.aliases:
            argv += ["--network-alias", alias]
    if c.hostname:
        argv += ["--hostname", c.hostname]
    if c.userns:
        argv += ["--userns", c.userns]
    if c.user:
        argv += ["--user", c.user]
    for group in c.groups:
        argv += ["--group-add", group]
    if c.read_only:
        argv.append("--read-only")
    for cap in c.cap_drop:
        argv += ["--cap-drop", cap]
    if c.no_new_privileges:
        argv += ["--security-opt", "no-new-privileges"]
    if c.gpus:
        argv += ["--gpus", "all"] if c.engine == "docker" else \
            ["--device", "nvidia.com/gpu=all"]
    for m in c.mounts:
        argv += ["--mount", f"type=bind,source={m.host},target={m.target}" +
                 (",readonly" if m.read_only else "")]
    for path in c.tmpfs:
        argv += ["--tmpfs", path]
    if c.termination_log is not None:
        argv += ["--mount", f"type=bind,source={c.termination_log},"
                 f"target={TERMINATION_LOG_PATH}",
                 "-e", f"{envnames.TERMINATION_LOG}={TERMINATION_LOG_PATH}"]
    for name in c.env_names:
        argv += ["-e", name]
    if c.command:
        argv += ["--entrypoint", c.command[0]]
    argv.append(c.image)
    argv += c.command[1:] + c.args
    return argv


def remove_argv(engine: str, names: list[str]) -> list[str]:
    """Force-remove containers (running or not); a name already gone is not an error."""
    return [engine, "rm", "-f", "--ignore", *names] if engine == "podman" else \
        [engine, "rm", "-f", *names]


def labelled_containers_argv(engine: str, label: str, value: str) -> list[str]:
    """List the names of every container (running or not) labelled ``label=value``, one
    a line (podman and docker both take this filter and format)."""
    return [engine, "ps", "-a", "--filter", f"label={label}={value}", "--format",
            "{{.Names}}"]


def labelled_networks_argv(engine: str, label: str, value: str) -> list[str]:
    """List the names of every network labelled ``label=value``, one a line."""
    return [engine, "network", "ls", "--filter", f"label={label}={value}", "--format",
            "{{.Name}}"]


def network_create_argv(engine: str, network: str,
                        labels: dict[str, str] | None = None) -> list[str]:
    argv = [engine, "network", "create"]
    for key, value in sorted((labels or {}).items()):
        argv += ["--label", f"{key}={value}"]
    return argv + [network]


def network_remove_argv(engine: str, network: str) -> list[str]:
    return [engine, "network", "rm", "-f", network] if engine == "podman" else \
        [engine, "network", "rm", network]


def image_for(image: str, overrides: dict[str, str]) -> str:
    """``image`` after ``--image`` overrides, keyed by the full reference or by the last
    part of its repository (`initializer` for ghcr.io/kubetune/initializer:0.1.0)."""
    if image in overrides:
        return overrides[image]
    repository = image.rsplit("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        last = last.split(":", 1)[0]
    return overrides.get(last, image)
