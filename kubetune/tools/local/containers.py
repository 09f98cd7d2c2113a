"""`kubetune local --engine podman|docker`: each container of a merged JobSet as a real
container of its image (argv from `container_argv`), one run's network and names, and
their removal however the run ends.

What the kubelet gives a pod is mapped here: the per-job PVC and other volumes are host
directories under the work directory; a `file://` path named in the container's env or
args that exists on this host is bind-mounted read-only at the same path, so the URI is
unchanged (a host-path EXPORT_URI is mounted read-write: `jobset.export_mount`); pods
find each other by their JobSet DNS names (network aliases) on one network per run.
Every image is pulled (where the engine lacks it) before any container starts, so an
image that cannot be pulled is one line, not an exit 125 the failure policy restarts.
Every container runs as the user running `kubetune local` (`container_user`): it reads
what they may read, and what it writes is theirs.

Every container and network of a run is labelled with the run, the work directory (a
hash of this host's name and the directory's absolute path) and the pid of the `kubetune
local` that made it. A `kill -9` of `kubetune local` kills the engine clients with it, but
not their containers: the engine runs those. So a watchdog process (`container_watchdog`)
removes a run's containers and network as soon as its `kubetune local` dies; and, should
the watchdog have been killed too, a run, once it holds the work directory's lock, removes
every container and network still labelled for its work directory: the lock proves that
no live run owns them; they are a dead run's, a trainer maybe still training and holding
the GPUs.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kubetune import env as envnames
from kubetune.errors import BadInputError
from kubetune.tools.local import container_user, container_watchdog
from kubetune.tools.local.container_argv import (ContainerRun, Mount, image_for,
                                                 labelled_containers_argv,
                                                 labelled_networks_argv,
                                                 network_create_argv, network_remove_argv,
                                                 remove_argv, run_argv)
from kubetune.tools.local.steps import Step, emit, termination_log

CONTAINER_ENGINES = ("podman", "docker")
GPU_RESOURCE = "nvidia.com/gpu"
RUN_LABEL = "kubetune.local/run"
WORKDIR_LABEL = "kubetune.local/workdir"
PID_LABEL = "kubetune.local/pid"
_FILE_URI = re.compile(r"file://(/[^\s,;\"']+)")
# A step's env that the engine client gets but the container must not (the host's paths).
_HOST_ONLY = {envnames.TERMINATION_LOG}


@dataclass
class EngineOptions:
    engine: str
    gpus: bool = False
    images: dict[str, str] = field(default_factory=dict)


def parse_image_overrides(values: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`NAME=IMAGE` pairs (NAME: `initializer`, or a full image reference)."""
    overrides = {}
    for value in values:
        name, sep, image = value.partition("=")
        if not sep or not name or not image:
            raise BadInputError(f"--image {value!r}: expected NAME=IMAGE, e.g. "
                                "initializer=localhost/kubetune-initializer:dev")
        overrides[name] = image
    return overrides


def file_sources(texts: list[str], storage_uri: str | None = None) -> list[Path]:
    """Host paths of the `file://` URIs in ``texts`` that exist here, and of
    ``storage_uri`` (an initializer's STORAGE_URI) where it is a bare absolute path."""
    candidates = [Path(m.group(1)) for text in texts for m in _FILE_URI.finditer(text)]
    if storage_uri and storage_uri.startswith("/"):
        candidates.append(Path(storage_uri))
    found: list[Path] = []
    for path in candidates:
        if path.exists() and path not in found:
            found.append(path)
    return found


def workdir_identity(workdir: Path) -> str:
    """The value of WORKDIR_LABEL for runs in ``workdir``: this host's name and the
    directory's absolute path, hashed (one engine may serve several hosts, and a path is
    long and may say more than a label should)."""
    key = f"{socket.gethostname()}:{Path(workdir).resolve()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _cap_drop(container: dict) -> list[str]:
    own = container.get("securityContext") or {}
    return [str(c) for c in ((own.get("capabilities") or {}).get("drop")) or []]


def _security(pod_spec: dict, container: dict, who: container_user.RunAs) -> dict:
    """The securityContext as the engine's options. runAsUser and runAsGroup yield to the
    user running `kubetune local` (``who``): the files the steps read and write are theirs."""
    pod = pod_spec.get("securityContext") or {}
    own = container.get("securityContext") or {}
    pod_groups = ([pod["fsGroup"]] if "fsGroup" in pod else []) + list(
        pod.get("supplementalGroups") or [])
    return {
        "user": who.user, "userns": who.userns,
        "groups": [*who.groups, *(str(g) for g in pod_groups)],
        "read_only": bool(own.get("readOnlyRootFilesystem")),
        "cap_drop": _cap_drop(container),
        "no_new_privileges": own.get("allowPrivilegeEscalation") is False,
    }


def _source_paths(container: dict, env: dict[str, str]) -> list[Path]:
    """The host paths a container's (expanded) command, args and env name as sources."""
    texts = [*(container.get("command") or []), *(container.get("args") or []),
             *env.values()]
    return file_sources(texts, env.get(envnames.STORAGE_URI))


def _wants_gpu(container: dict) -> bool:
    resources = container.get("resources") or {}
    return any(GPU_RESOURCE in (resources.get(k) or {}) for k in ("limits", "requests"))


# What podman and docker print when an image cannot be pulled (`run` then exits 125).
_PULL_FAILURE = re.compile(
    r"manifest unknown|not found|pull access denied|repository does not exist|"
    r"requested access to the resource is denied|unauthorized|authentication required|"
    r"initializing source|unable to copy from source|invalid reference format|"
    r"name unknown|no such host|Error response from daemon", re.IGNORECASE)


def pull_failure(image: str, where: str, engine: str, stderr: str) -> str | None:
    """The one line for an image that could not be pulled (``stderr``: the engine's), or
    None where ``stderr`` says something else."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    cause = next((line for line in reversed(lines) if _PULL_FAILURE.search(line)), None)
    if cause is None:
        return None
    cause = re.sub(r"^(Error: |Error response from daemon: )", "", cause)
    return (f"{where}: image {image} could not be pulled ({engine}: {cause}); check its "
            "name and tag, log in to its registry, or run a local build: --image "
            "NAME=IMAGE")


class ContainerSession:
    """The containers and the network of one `kubetune local` run."""

    def __init__(self, options: EngineOptions, jobset_name: str, workdir: Path) -> None:
        if options.engine not in CONTAINER_ENGINES:
            raise BadInputError(f"--engine {options.engine}: one of process, "
                                + ", ".join(CONTAINER_ENGINES))
        self.options = options
        self.run_id = f"{jobset_name}-{secrets.token_hex(3)}"
        self.network = f"kubetune-{self.run_id}"
        self.workdir_id = workdir_identity(workdir)
        self.labels = {RUN_LABEL: self.run_id, WORKDIR_LABEL: self.workdir_id,
                       PID_LABEL: str(os.getpid())}
        self.started: list[str] = []
        # Who the containers run as: the engine is asked on first use (`identify`).
        self.run_as: container_user.RunAs | None = None
        self._network_made = False
        self._watchdog: container_watchdog.Watchdog | None = None

    def _engine(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise BadInputError(f"--engine {self.options.engine}: `{argv[0]}` is not "
                                "installed or not on PATH") from None
        if check and result.returncode != 0:
            raise BadInputError(f"{' '.join(argv)}: " + (result.stderr.strip().splitlines()
                                                          or ["failed"])[-1])
        return result

    def identify(self) -> container_user.RunAs:
        """Who this run's containers run as: the user running us, as the engine maps
        users (asked once)."""
        if self.run_as is None:
            info = self._engine(container_user.info_argv(self.options.engine)).stdout
            facts = container_user.engine_facts(self.options.engine, info)
            self.run_as = container_user.run_as(facts, container_user.HostUser.current())
        return self.run_as

    def check_sources(self, container: dict, env: dict[str, str]) -> None:
        """Refuse (exit 65), before any step, a source this user may read that the
        container, running as them through the engine, may not (`container_user`)."""
        who, cap_drop = self.identify(), _cap_drop(container)
        for source in _source_paths(container, env):
            path = container_user.first_unreadable(source, who, cap_drop)
            if path is not None:
                raise BadInputError(f"{container['name']}: " + container_user.refusal(
                    path, who, self.options.engine))

    def pull_images(self, images: dict[str, str]) -> None:
        """Every image the run needs (image -> the container naming it), present or pulled
        now, before any container starts: an image that cannot be pulled is one line
        (exit 65), not a container exit 125 that the failure policy restarts."""
        engine = self.options.engine
        for image, where in images.items():
            image = image_for(image, self.options.images)
            if self._engine([engine, "image", "inspect", image], check=False).returncode == 0:
                continue
            emit(f"==> pulling {image}\n")
            try:
                result = subprocess.run([engine, "pull", image], capture_output=True,
                                        text=True)
            except FileNotFoundError:
                raise BadInputError(f"--engine {engine}: `{engine}` is not installed or not "
                                    "on PATH") from None
            if result.returncode != 0:
                raise BadInputError(pull_failure(image, where, engine, result.stderr) or (
                    f"{where}: image {image} could not be pulled ({engine} pull exited "
                    f"{result.returncode}); check its name, or give --image NAME=IMAGE"))

    def open(self, logs_dir: Path) -> None:
        """Remove what a dead run in this work directory left (the caller holds the work
        directory's lock), start this run's watchdog (its log in ``logs_dir``), then make
        this run's network."""
        # Asked now, not by the first containers: they start in parallel, none waiting
        # on the engine for the others.
        self.identify()
        self.remove_orphans()
        self._watchdog = container_watchdog.start(
            self.options.engine, RUN_LABEL, self.run_id, self.network,
            logs_dir / "container-watchdog.log")
        self._engine(network_create_argv(self.options.engine, self.network, self.labels))
        self._network_made = True

    def remove_orphans(self) -> list[str]:
        """Remove every container and network labelled for this work directory: with its
        lock held, they are a dead run's (a `kill -9` of its `kubetune local`). One
        warning line per container; return their names."""
        engine = self.options.engine
        containers = self._engine(labelled_containers_argv(
            engine, WORKDIR_LABEL, self.workdir_id)).stdout.split()
        for name in containers:
            emit(f"warning: removing container {name}: left running by a kubetune local "
                 "in this workdir that is gone (killed?)\n")
        if containers:
            self._engine(remove_argv(engine, containers))
        for network in self._engine(labelled_networks_argv(
                engine, WORKDIR_LABEL, self.workdir_id)).stdout.split():
            self._engine(network_remove_argv(engine, network))
        return containers

    def close(self) -> None:
        """Remove every container this run started and its network; errors are ignored
        (a container that ended on its own is already gone)."""
        try:
            if self.started:
                self._engine(remove_argv(self.options.engine, self.started), check=False)
            if self._network_made:
                self._engine(network_remove_argv(self.options.engine, self.network),
                             check=False)
        finally:
            if self._watchdog is not None:
                self._watchdog.release()

    def step(self, *, name: str, pod: str, aliases: list[str], pod_spec: dict,
             container: dict, env: dict[str, str], mounts: list[Mount], tmpfs: list[str],
             logs_dir: Path) -> Step:
        """The Step whose command runs ``container`` of ``pod`` in its image."""
        command = list(container.get("command") or [])
        args = list(container.get("args") or [])
        sources = [Mount(p, str(p), read_only=True) for p in _source_paths(container, env)
                   if not any(m.target == str(p) for m in mounts)]
        engine_name = f"kubetune-{self.run_id}-{name}-{len(self.started)}"
        run = ContainerRun(
            engine=self.options.engine, name=engine_name,
            image=image_for(container["image"], self.options.images),
            command=command, args=args,
            env_names=[n for n in env if n not in _HOST_ONLY],
            mounts=mounts + sources, tmpfs=tmpfs,
            termination_log=termination_log(logs_dir, name),
            network=self.network, hostname=pod, aliases=aliases,
            gpus=self.options.gpus and _wants_gpu(container),
            labels=dict(self.labels), **_security(pod_spec, container, self.identify()))
        self.started.append(engine_name)
        return Step(name, run_argv(run), env, in_container=True)
