"""Run a merged JobSet (see `runtime_merge`) on this machine, as JobSet and Job would.

- ReplicatedJobs run in `dependsOn` order; jobs whose dependencies are met run together,
  each pod as processes (init containers in turn, then the containers together).
- Volumes become directories under the work directory: the `volumeClaimPolicies` claims
  (the per-job PVC) under `workspace/`, other volumes per pod, a ConfigMap's volume the
  directory the user names for it (``--configmap NAME=DIR``: there are no ConfigMaps
  here); scratch mounts (/tmp, /dev/shm) stay this machine's own. A container sees its mount
  paths rewritten to those directories wherever they appear in its command, args and env
  (there is no container filesystem here to mount them into).
- Env is resolved as the kubelet does: `$(VAR)` expansion, the Job completion index for
  `PET_NODE_RANK`; pod DNS names of the JobSet resolve to 127.0.0.1, and each port a
  container declares (the trainer's rendezvous port) becomes a free loopback port of this
  run: on a cluster every pod has an address of its own, here two runs at once would
  otherwise meet on one port.
- A failed pod goes through the Job's podFailurePolicy and backoffLimit, a failed Job
  through the JobSet's failurePolicy, so a runtime's restart rules can be seen working.
With no engine (`--engine process`), the image of each container is not used: this
checkout's code runs. PATH is the image's order: ``commands_dir`` (our `tune`, as
/opt/kubetune/bin in our images) first, then the directory of the running Python
(`kubetune`), whose `tune`, if any, is torchtune's own: pip installs torchtune's console
script beside the interpreter. With a container engine, each container runs in its image
(`containers.py`): paths stay as the runtime wrote them, mounted where it says.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from kubetune import env as envnames, storage_uri
from kubetune.errors import BadInputError, StepFailedError
from kubetune.tools.local.container_argv import Mount
from kubetune.tools.local.containers import ContainerSession, EngineOptions
from kubetune.tools.local.steps import (Step, StepResult, emit, run_process, status_text,
                                        stop_requested, stopped_cause)
from kubetune.tools.local.runtime_merge import COMPLETION_INDEX_PATH
from kubetune.workspace import DEFAULT_ROOT

DEFAULT_BACKOFF_LIMIT = 6
# Scratch mounts (emptyDir over /tmp, /dev/shm) are this machine's own directories:
# rewriting them would also move every unrelated /tmp path a step is given.
SCRATCH_MOUNTS = ("/tmp", "/dev/shm")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
# Restarts that ignore maxRestarts still stop somewhere on a laptop.
LOCAL_RESTART_CAP = 10


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names replaced, `$$` -> `$`, others kept."""
    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    return _VAR_REF.sub(sub, text)


def _expanded(container: dict, env: dict[str, str]) -> dict:
    """``container`` with $(VAR) in its command and args expanded against its env, as
    Kubernetes does."""
    return {**container,
            "command": [expand(a, env) for a in container.get("command") or []],
            "args": [expand(a, env) for a in container.get("args") or []]}


STEP_NAMES = ("dataset-initializer", "model-initializer", "trainer", "exporter")


def _cause(error: str, container: str) -> str:
    """A step's one-line report without its own step prefix (the caller names the step)."""
    head, sep, rest = error.partition(": ")
    return rest if sep and head in (*STEP_NAMES, container) else error


@dataclass
class PodFailure:
    job: str
    container: str
    exit_code: int
    error: str


@dataclass
class JobFailure:
    job: str
    reason: str  # PodFailurePolicy | BackoffLimitExceeded, as the Job controller reports
    failure: PodFailure


def export_mount(export_uri: str | None, mounts: list[Mount]) -> Mount | None:
    """The read-write bind mount a container engine needs for a host-path EXPORT_URI
    (absolute here: preflight made a relative one so), at the same path so the URI stays
    as written; None for a remote destination or one on a volume the container mounts.
    The process engine writes there directly; a container would write into its own, then
    discarded, filesystem. The destination directory itself is mounted (made first if
    missing), not a parent: the container may write nowhere else of the user's, and the
    exporter, finding a mount point, builds the export inside it."""
    if not export_uri:
        return None
    try:
        where = storage_uri.export_destination(export_uri)
    except BadInputError:
        return None  # preflight reported it; the step will again
    if not isinstance(where, storage_uri.FileUri):
        return None
    path = Path(os.path.abspath(where.path))
    volumes = [m.target.rstrip("/") for m in mounts
               if m.target.rstrip("/") not in SCRATCH_MOUNTS]
    if any(str(path) == v or str(path).startswith(v + "/") for v in volumes):
        return None
    if not path.exists():
        try:
            # The container runs as this user (`container_user`): theirs, with the
            # umask's mode, as every directory a step makes.
            path.mkdir(parents=True)
        except OSError as exc:
            raise BadInputError(f"{envnames.EXPORT_URI} {export_uri}: cannot create "
                                f"{path}: {exc.strerror}") from None
    return Mount(path, str(path))


def _loopback_ports(spec: dict) -> dict[int, int]:
    """Each containerPort of the JobSet -> a loopback port free now (the OS picks it)."""
    declared = {p["containerPort"] for job in spec["replicatedJobs"]
                for c in job["template"]["spec"]["template"]["spec"].get("containers") or []
                for p in c.get("ports") or [] if p.get("containerPort")}
    ports = {}
    for number in sorted(declared):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports[int(number)] = sock.getsockname()[1]
    return ports


class LocalJobSet:
    """One run of a merged JobSet under ``workdir``."""

    def __init__(self, jobset: dict, workdir: Path, engine: EngineOptions | None = None,
                 commands_dir: Path | None = None,
                 configmaps: dict[str, Path] | None = None) -> None:
        self.jobset = jobset
        self.commands_dir = commands_dir
        self.configmaps = dict(configmaps or {})
        self.name = jobset["metadata"]["name"]
        self.spec = jobset["spec"]
        self.workdir = Path(workdir).resolve()
        self.logs = self.workdir / "logs"
        claims = [t["metadata"]["name"] for p in self.spec.get("volumeClaimPolicies") or []
                  for t in p.get("templates") or []]
        # The first claim is the per-job PVC every step shares: `workspace/`, as in `make demo`.
        self.claim_dirs = {c: self.workdir / ("workspace" if i == 0 else f"claim-{c}")
                           for i, c in enumerate(claims)}
        subdomain = (self.spec.get("network") or {}).get("subdomain") or self.name
        self.subdomain = subdomain
        self.session = ContainerSession(engine, self.name, self.workdir) if engine else None
        names = "|".join(re.escape(j["name"]) for j in self.spec["replicatedJobs"])
        self._pod_dns = re.compile(
            rf"\b{re.escape(self.name)}-(?:{names})-\d+-\d+\.{re.escape(subdomain)}"
            r"(?:\.[A-Za-z0-9.-]*svc[A-Za-z0-9.-]*)?\b(?::(\d+)\b)?")
        self._ports = {} if self.session else _loopback_ports(self.spec)

    # -- ordering --------------------------------------------------------------------

    def stages(self) -> list[list[dict]]:
        """ReplicatedJobs grouped by `dependsOn` depth: each group starts when the one
        before has completed."""
        jobs = {j["name"]: j for j in self.spec["replicatedJobs"]}
        depth: dict[str, int] = {}

        def level(name: str, seen: tuple[str, ...] = ()) -> int:
            if name in seen:
                raise BadInputError(f"replicatedJobs: dependsOn cycle through {name}")
            if name not in depth:
                deps = jobs[name].get("dependsOn") or []
                for dep in deps:
                    if dep["name"] not in jobs:
                        raise BadInputError(f"replicatedJob {name} dependsOn unknown job "
                                            f"{dep['name']}")
                    if dep.get("status") != "Complete":
                        raise BadInputError(f"replicatedJob {name}: dependsOn status "
                                            f"{dep.get('status')!r}: kubetune local runs only "
                                            "`Complete` dependencies")
                depth[name] = 1 + max((level(d["name"], seen + (name,)) for d in deps),
                                      default=-1)
            return depth[name]

        for name in jobs:
            level(name)
        return [[jobs[n] for n in jobs if depth[n] == d]
                for d in range(max(depth.values()) + 1)]

    def check(self) -> None:
        """Raise, before anything runs, what running would raise only when it reaches the
        container: the job order, each container's env (a Secret value not exported), its
        volumes, its command (processes) or image and sources the engine's containers
        could not read (containers). Writes nothing."""
        self.stages()
        for job in self.spec["replicatedJobs"]:
            pod_spec = job["template"]["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
            for container in (pod_spec.get("initContainers") or []) + pod_spec["containers"]:
                pod = f"{self.name}-{job['name']}-0-0"
                if self.session is not None and not container.get("image"):
                    raise BadInputError(f"container {container['name']} of job {job['name']} "
                                        "has no image")
                if self.session is None and not (container.get("command")
                                                  or container.get("args")):
                    raise BadInputError(f"container {container['name']} of job {job['name']} "
                                        "has no command: kubetune local runs commands, not "
                                        "image entrypoints")
                env = self._env(container, 0, pod)  # pods' envs differ only by index
                if self.session is not None:
                    self.session.check_sources(_expanded(container, env), env)
                for mount in container.get("volumeMounts") or []:
                    if mount["mountPath"].rstrip("/") not in SCRATCH_MOUNTS:
                        self._volume_dir(volumes, mount["name"], container, pod)

    # -- one container -> one process -------------------------------------------------

    def _mounts(self, pod_spec: dict, container: dict, pod: str) -> list[tuple[str, Path]]:
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            name = mount["name"]
            if mount["mountPath"].rstrip("/") in SCRATCH_MOUNTS:
                continue
            base = self._volume_dir(volumes, name, container, pod)
            local = base / mount["subPath"] if mount.get("subPath") else base
            local.mkdir(parents=True, exist_ok=True)
            mounts.append((mount["mountPath"].rstrip("/") or "/", local))
        return sorted(mounts, key=lambda m: len(m[0]), reverse=True)

    def _volume_dir(self, volumes: dict, name: str, container: dict, pod: str) -> Path:
        if name in self.claim_dirs:
            return self.claim_dirs[name]
        if "persistentVolumeClaim" in volumes.get(name, {}):
            return self.workdir / f"pvc-{volumes[name]['persistentVolumeClaim']['claimName']}"
        if "configMap" in volumes.get(name, {}):
            return self._configmap_dir(volumes[name]["configMap"] or {}, name, container, pod)
        if name in volumes:
            return self.workdir / "pods" / pod / name
        raise BadInputError(f"container {container['name']} mounts volume {name!r} "
                            "that neither the pod nor volumeClaimPolicies defines")

    def _configmap_dir(self, source: dict, volume: str, container: dict, pod: str) -> Path:
        """The directory the user named for a ConfigMap (``--configmap NAME=DIR``): there
        are no ConfigMaps here, and an empty directory in its place would fail the step
        late (a builder's module missing) instead of now."""
        configmap = source.get("name") or volume
        if configmap in self.configmaps:
            return self.configmaps[configmap]
        if source.get("optional"):
            return self.workdir / "pods" / pod / volume  # as the kubelet: empty, not absent
        raise BadInputError(
            f"container {container['name']}: volume {volume} is ConfigMap {configmap}, which "
            f"does not exist here; give a directory holding its files: kubetune local "
            f"--configmap {configmap}=DIR (or {envnames.LOCAL_CONFIGMAPS}='{configmap}=DIR')")

    def images(self) -> dict[str, str]:
        """Each image the run needs -> the first container that names it (job/container)."""
        found: dict[str, str] = {}
        for job in self.spec["replicatedJobs"]:
            pod_spec = job["template"]["spec"]["template"]["spec"]
            for container in (pod_spec.get("initContainers") or []) + pod_spec["containers"]:
                if container.get("image"):
                    found.setdefault(container["image"],
                                     f"replicatedJobs[{job['name']}] container "
                                     f"{container['name']}")
        return found

    def _container_mounts(self, pod_spec: dict, container: dict, pod: str
                          ) -> tuple[list[Mount], list[str]]:
        """Bind mounts (host directories) and tmpfs paths for a container engine."""
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        mounts, tmpfs = [], []
        for mount in container.get("volumeMounts") or []:
            name, target = mount["name"], mount["mountPath"]
            if (volumes.get(name, {}).get("emptyDir") or {}).get("medium") == "Memory":
                tmpfs.append(target)
                continue
            base = self._volume_dir(volumes, name, container, pod)
            local = base / mount["subPath"] if mount.get("subPath") else base
            if "configMap" in volumes.get(name, {}):
                # A ConfigMap is read-only in a pod, whatever the mount says.
                mounts.append(Mount(local, target, True))
                continue
            # The container runs as this user (`container_user`), so the directory made
            # here is its own, as fsGroup makes a volume the pod's on a cluster.
            local.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(local, target, bool(mount.get("readOnly"))))
        return mounts, tmpfs

    def _container_step(self, job: dict, container: dict, index: int, pod_count: int
                        ) -> Step:
        pod_spec = job["template"]["spec"]["template"]["spec"]
        pod = f"{self.name}-{job['name']}-0-{index}"
        if not container.get("image"):
            raise BadInputError(f"container {container['name']} of job {job['name']} has "
                                "no image")
        env = self._env(container, index, pod)
        resolved = _expanded(container, env)
        mounts, tmpfs = self._container_mounts(pod_spec, container, pod)
        destination = export_mount(env.get(envnames.EXPORT_URI), mounts)
        if destination is not None:
            mounts.append(destination)
        name = container["name"] if pod_count == 1 else f"{container['name']}-{index}"
        return self.session.step(name=name, pod=pod, aliases=[f"{pod}.{self.subdomain}"],
                                 pod_spec=pod_spec, container=resolved, env=env,
                                 mounts=mounts, tmpfs=tmpfs, logs_dir=self.logs)

    def _localize(self, text: str, mounts: list[tuple[str, Path]]) -> str:
        if mounts:
            # One pass, longest mount path first: a replaced path is never rewritten again
            # (/workspace -> /tmp/x/workspace must not then match the /tmp mount).
            local = dict(mounts)
            pattern = "|".join(re.escape(path) for path, _ in mounts)
            text = re.sub(rf"(?<![\w./-])({pattern})(?=/|\b|$)",
                          lambda m: str(local[m.group(1)]), text)
        return self._pod_dns.sub(self._loopback, text)

    def _loopback(self, match: re.Match) -> str:
        port = match.group(1)
        return f"127.0.0.1:{self._ports.get(int(port), port)}" if port else "127.0.0.1"

    def _env(self, container: dict, index: int, pod: str) -> dict[str, str]:
        resolved: dict[str, str] = {}
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                resolved[name] = expand(str(var.get("value", "")), resolved)
                continue
            source = var["valueFrom"]
            field = (source.get("fieldRef") or {}).get("fieldPath")
            if field == COMPLETION_INDEX_PATH:
                resolved[name] = str(index)
            elif field == "metadata.name":
                resolved[name] = pod
            elif name in os.environ:
                # Secrets and ConfigMaps do not exist here: the shell provides the value (a
                # pod's environment is built here, not a setting of ours read).
                resolved[name] = os.environ[name]
            elif any(s.get("optional") for s in source.values() if isinstance(s, dict)):
                continue
            else:
                raise BadInputError(f"container {container['name']}: env {name} comes from "
                                    f"{next(iter(source))}; export {name} to run it here")
        return resolved

    def step(self, job: dict, container: dict, index: int, pod_count: int) -> Step:
        if self.session is not None:
            return self._container_step(job, container, index, pod_count)
        pod_spec = job["template"]["spec"]["template"]["spec"]
        pod = f"{self.name}-{job['name']}-0-{index}"
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not argv:
            raise BadInputError(f"container {container['name']} of job {job['name']} has no "
                                "command: kubetune local runs commands, not image entrypoints")
        mounts = self._mounts(pod_spec, container, pod)
        env = self._env(container, index, pod)
        # Kubernetes expands $(VAR) in command and args against the container's env.
        argv = [self._localize(expand(a, env), mounts) for a in argv]
        env = {k: self._localize(v, mounts) for k, v in env.items()}
        port = env.get(envnames.PET_MASTER_PORT, "")
        if port.isdigit():
            env[envnames.PET_MASTER_PORT] = str(self._ports.get(int(port), port))
        root = next((local for path, local in mounts if path == DEFAULT_ROOT), None)
        if root is not None:
            env.setdefault(envnames.WORKSPACE, str(root))
        first = [str(self.commands_dir)] if self.commands_dir else []
        # The step's PATH: our commands (the image's /opt/kubetune/bin), this Python's bin,
        # then the container's PATH, else the shell's.
        env[envnames.PATH] = os.pathsep.join([*first, str(Path(sys.executable).parent),
                                              env.get(envnames.PATH)
                                              or os.environ.get(envnames.PATH, "")])
        name = container["name"] if pod_count == 1 else f"{container['name']}-{index}"
        return Step(name, argv, env)

    # -- policies ----------------------------------------------------------------------

    @staticmethod
    def pod_action(job: dict, container: str, exit_code: int) -> tuple[str, int | None]:
        """The Job's podFailurePolicy action for a container exit (and the rule's index)."""
        policy = (job["template"]["spec"].get("podFailurePolicy") or {}).get("rules") or []
        for i, rule in enumerate(policy):
            codes = rule.get("onExitCodes")
            if not codes or codes.get("containerName", container) != container:
                continue
            values = set(codes.get("values") or [])
            hit = exit_code in values if codes["operator"] == "In" else \
                exit_code not in values and exit_code != 0
            if hit:
                return rule["action"], i
        return "Count", None

    def jobset_action(self, failure: JobFailure) -> str:
        policy = self.spec.get("failurePolicy")
        if policy is None:
            return "FailJobSet"  # JobSet without a failurePolicy fails on any job failure
        message = (f"Container {failure.failure.container} failed with exit code "
                   f"{failure.failure.exit_code}")
        for rule in policy.get("rules") or []:
            reasons = rule.get("onJobFailureReasons") or []
            targets = rule.get("targetReplicatedJobs") or []
            patterns = rule.get("onJobFailureMessagePatterns") or []
            if reasons and failure.reason not in reasons:
                continue
            if targets and failure.job not in targets:
                continue
            if patterns and not any(re.search(p, message) for p in patterns):
                continue
            return rule["action"]
        return "RestartJobSet"

    # -- running -------------------------------------------------------------------------

    def _run_pod(self, job: dict, index: int, pod_count: int, budget: dict,
                 lock: threading.Lock, out: list) -> None:
        pod_spec = job["template"]["spec"]["template"]["spec"]
        ignored = 0
        while True:
            failure = self._pod_once(job, pod_spec, index, pod_count)
            if failure is None:
                return
            if stop_requested() is not None:  # stopped from outside: no restart
                out.append(JobFailure(job["name"], "Stopped", failure))
                return
            action, rule = self.pod_action(job, failure.container, failure.exit_code)
            if action == "Ignore":
                ignored += 1
                if ignored > LOCAL_RESTART_CAP:  # a cluster would retry forever
                    out.append(JobFailure(job["name"], "BackoffLimitExceeded", failure))
                    return
            emit(f"==> {job['name']}: exit {failure.exit_code} -> podFailurePolicy "
                 f"{action}" + (f" (rule {rule})" if rule is not None else "") + "\n")
            if action == "FailJob" or action == "FailIndex":
                out.append(JobFailure(job["name"], "PodFailurePolicy", failure))
                return
            if action == "Count":
                with lock:
                    budget[job["name"]] -= 1
                    exhausted = budget[job["name"]] < 0
                if exhausted:
                    out.append(JobFailure(job["name"], "BackoffLimitExceeded", failure))
                    return

    def _pod_once(self, job: dict, pod_spec: dict, index: int, pod_count: int
                  ) -> PodFailure | None:
        for container in pod_spec.get("initContainers") or []:
            result = run_process(self.step(job, container, index, pod_count), self.logs)
            if result.exit_code != 0:
                return PodFailure(job["name"], container["name"], result.exit_code,
                                  result.error or "")
        steps = [self.step(job, c, index, pod_count) for c in pod_spec["containers"]]
        results: list[tuple[str, StepResult]] = []
        threads = [threading.Thread(target=lambda c=c, s=s: results.append(
            (c["name"], run_process(s, self.logs)))) for c, s in zip(pod_spec["containers"],
                                                                     steps)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for container, result in results:
            emit(f"==> {result.name}: {status_text(result)} in {result.seconds:.1f}s\n")
            if result.exit_code != 0:
                return PodFailure(job["name"], container, result.exit_code, result.error or "")
        return None

    def _run_stage(self, stage: list[dict]) -> JobFailure | None:
        lock = threading.Lock()
        failures: list[JobFailure] = []
        budget = {j["name"]: j["template"]["spec"].get("backoffLimit", DEFAULT_BACKOFF_LIMIT)
                  for j in stage}
        threads = []
        for job in stage:
            count = job["template"]["spec"].get("parallelism", 1) * job.get("replicas", 1)
            for index in range(count):
                threads.append(threading.Thread(
                    target=self._run_pod, args=(job, index, count, budget, lock, failures)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return failures[0] if failures else None

    def run(self) -> int:
        """Run to completion; return how many times the JobSet restarted. Raise
        StepFailedError (with the failing step's own exit code) if it fails."""
        self.logs.mkdir(parents=True, exist_ok=True)
        stages = self.stages()
        emit(f"==> JobSet {self.name}: " + " -> ".join(
            "+".join(j["name"] for j in stage) for stage in stages) +
            (" (images are not pulled: this checkout's code runs)\n" if self.session is None
             else f" ({self.session.options.engine}, network {self.session.network})\n"))
        if self.session is None:
            return self._run(stages)
        try:
            self.session.open(self.logs)
            return self._run(stages)
        finally:
            self.session.close()

    def _run(self, stages: list[list[dict]]) -> int:
        max_restarts = (self.spec.get("failurePolicy") or {}).get("maxRestarts", 0)
        restarts = uncounted = 0
        while True:
            failure = next((f for f in map(self._run_stage, stages) if f is not None), None)
            if failure is None:
                return restarts + uncounted
            action = self.jobset_action(failure)
            counted = action in ("RestartJobSet", "RestartJob")
            can_restart = ((counted and restarts < max_restarts) or (
                action.endswith("IgnoreMaxRestarts") and uncounted < LOCAL_RESTART_CAP)
            ) and stop_requested() is None
            emit(f"==> job {failure.job} failed ({failure.reason}): failurePolicy {action}"
                 + (" -> restarting\n" if can_restart else " -> JobSet failed\n"))
            if not can_restart:
                pod = failure.failure
                raise StepFailedError(pod.container, stopped_cause(
                    _cause(pod.error, pod.container) or f"exited with code {pod.exit_code}"),
                    pod.exit_code)
            if counted:
                restarts += 1
            else:
                uncounted += 1


def parse_configmaps(values: list[str] | tuple[str, ...]) -> dict[str, Path]:
    """`NAME=DIR` pairs (``--configmap``): each DIR an existing directory, made absolute."""
    found: dict[str, Path] = {}
    for value in values:
        for item in value.split():  # the variable's form: space-separated pairs
            name, sep, directory = item.partition("=")
            if not sep or not name or not directory:
                raise BadInputError(f"--configmap {item!r}: expected NAME=DIR, e.g. "
                                    "my-builders=./examples/custom-dataset")
            path = Path(directory).expanduser().resolve()
            if not path.is_dir():
                raise BadInputError(f"--configmap {item}: {path} is not a directory")
            found[name] = path
    return found
