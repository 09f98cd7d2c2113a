"""The runtimes as a platform team installs them: overlays rendered by `kubectl kustomize`
composing runtimes/components/*, every output valid against the Kubeflow Trainer CRDs,
each knob landing on the steps it names and nowhere else; Pod Security "restricted" in
every container of every runtime; images retargeted in one place; release digests."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.crd_schema import CRDS, validate
from tests.support.runtimes import BASE, DROPIN, REPO, runtime_files

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl not installed (it carries kustomize; Debian: "
                            "apt-get install kubectl, as .ci/run does)")
needs_crds = pytest.mark.skipif(not CRDS.is_dir(),
                                reason=f"Kubeflow Trainer CRDs not found at {CRDS}")
COMPONENTS = REPO / "runtimes" / "components"
EXAMPLE = REPO / "runtimes" / "overlays" / "example"
CPU_STEPS = ("dataset-initializer", "model-initializer", "teacher-initializer", "exporter")
IMAGES = ("initializer", "trainer", "exporter")


def jobs(runtime: dict) -> list[dict]:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"]


def pod(job: dict) -> dict:
    return job["template"]["spec"]["template"]["spec"]


def containers(pod_spec: dict) -> list[dict]:
    return (pod_spec.get("initContainers") or []) + pod_spec["containers"]


def is_gang(runtime: dict) -> bool:
    return runtime["metadata"]["labels"]["kubetune.io/layout"] == "gang"


def platform(values: dict) -> str:
    return yaml.safe_dump({
        "apiVersion": "platform.kubetune.io/v1alpha1", "kind": "KubetunePlatform",
        "metadata": {"name": "platform",
                     "annotations": {"config.kubernetes.io/local-config": "true"}},
        "spec": values})


def kustomize(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120)


def render(tmp_path: Path, components: list[str] = (), values: dict | None = None,
           files: dict[str, str] | None = None, **extra) -> list[dict]:
    """A platform team's overlay over base + drop-ins, rendered; the runtimes it outputs."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    resources = [os.path.relpath(BASE, overlay), os.path.relpath(DROPIN, overlay)]
    for name, text in (files or {}).items():
        (overlay / name).write_text(text)
        resources.append(name)
    if values is not None:
        (overlay / "platform.yaml").write_text(platform(values))
        resources.append("platform.yaml")
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": resources,
                     "components": [os.path.relpath(COMPONENTS / c, overlay)
                                    for c in components], **extra}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = kustomize(overlay)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def sources() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in map(lambda p: yaml.safe_load(p.read_text()),
                                                   runtime_files())}


# -- Pod Security Standards, "restricted" (which includes "baseline"), as data -----------
# From https://kubernetes.io/docs/concepts/security/pod-security-standards/ ; each entry:
# where the field is, and what values are allowed (None: the field must be unset).
RESTRICTED = {
    # baseline
    "host_namespaces": ("hostNetwork", "hostPID", "hostIPC"),            # unset or false
    "privileged": False,                                                 # unset or false
    "baseline_capabilities": {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID",
                              "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID",
                              "SETPCAP", "SETUID", "SYS_CHROOT"},
    "host_ports": {0},                                                   # or unset
    "apparmor_types": {"RuntimeDefault", "Localhost"},                   # or unset
    "selinux_types": {"", "container_t", "container_init_t", "container_kvm_t"},
    "selinux_user_role": None,                                           # must be unset
    "proc_mount": {"Default"},                                           # or unset
    "seccomp_types": {"RuntimeDefault", "Localhost"},                    # restricted: set
    "safe_sysctls": {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                     "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                     "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                     "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                     "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"},
    # restricted
    "volume_types": {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                     "persistentVolumeClaim", "projected", "secret"},
    "allow_privilege_escalation": False,                                 # must be false
    "run_as_non_root": True,                                             # must be true
    "capabilities_drop": "ALL",                                          # must be dropped
    "capabilities_add": {"NET_BIND_SERVICE"},                            # the only one
}


def restricted_violations(pod_spec: dict) -> list[str]:
    """Every way ``pod_spec`` breaks the restricted profile (container fields override
    the pod's where both exist, as the kubelet reads them)."""
    rules, found = RESTRICTED, []
    psc = pod_spec.get("securityContext") or {}
    for field in rules["host_namespaces"]:
        if pod_spec.get(field):
            found.append(f"pod {field}")
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= rules["volume_types"]:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl["name"] not in rules["safe_sysctls"]:
            found.append(f"sysctl {sysctl['name']}")
    for c in containers(pod_spec):
        sc, name = c.get("securityContext") or {}, c["name"]

        def effective(key: str):
            return sc[key] if key in sc else psc.get(key)

        if sc.get("privileged", False) is not rules["privileged"]:
            found.append(f"{name}: privileged")
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if not added <= rules["capabilities_add"] or not added <= rules["baseline_capabilities"]:
            found.append(f"{name}: capabilities.add {sorted(added)}")
        if rules["capabilities_drop"] not in (caps.get("drop") or []):
            found.append(f"{name}: capabilities.drop lacks ALL")
        if sc.get("allowPrivilegeEscalation") is not rules["allow_privilege_escalation"]:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if effective("runAsNonRoot") is not rules["run_as_non_root"]:
            found.append(f"{name}: runAsNonRoot not true")
        if effective("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        if (effective("seccompProfile") or {}).get("type") not in rules["seccomp_types"]:
            found.append(f"{name}: seccompProfile not RuntimeDefault/Localhost")
        apparmor = effective("appArmorProfile")
        if apparmor and apparmor.get("type") not in rules["apparmor_types"]:
            found.append(f"{name}: appArmorProfile {apparmor.get('type')}")
        selinux = effective("seLinuxOptions") or {}
        if selinux.get("type", "") not in rules["selinux_types"] or \
                selinux.get("user") or selinux.get("role"):
            found.append(f"{name}: seLinuxOptions {selinux}")
        if sc.get("procMount", "Default") not in rules["proc_mount"]:
            found.append(f"{name}: procMount {sc['procMount']}")
        if (effective("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{name}: windowsOptions.hostProcess")
        for port in c.get("ports") or []:
            if port.get("hostPort", 0) not in rules["host_ports"]:
                found.append(f"{name}: hostPort {port['hostPort']}")
    return found


@pytest.mark.parametrize("path", runtime_files() + sorted(REPO.glob("examples/*/runtime.yaml")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_container_meets_pod_security_restricted(path):
    for job in jobs(yaml.safe_load(path.read_text())):
        assert restricted_violations(pod(job)) == [], f"{path.name}: {job['name']}"


def test_restricted_check_sees_each_violation():
    p = pod(jobs(yaml.safe_load((BASE / "kubetune-byo-model.yaml").read_text()))[2])
    assert restricted_violations(p) == []
    cases = {
        "pod hostNetwork": lambda s: s.update(hostNetwork=True),
        "volume host": lambda s: s["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        "seccompProfile not": lambda s: s["securityContext"].pop("seccompProfile"),
        "init: capabilities.drop lacks ALL": lambda s: s.setdefault("initContainers", []).append(
            {"name": "init", "securityContext": {"allowPrivilegeEscalation": False}}),
        "node: allowPrivilegeEscalation": lambda s: s["containers"][0]["securityContext"]
        .pop("allowPrivilegeEscalation"),
        "node: capabilities.add": lambda s: s["containers"][0]["securityContext"][
            "capabilities"].update(add=["SYS_ADMIN"]),
        "node: runAsNonRoot": lambda s: s["containers"][0]["securityContext"].update(
            runAsNonRoot=False),
        "node: hostPort": lambda s: s["containers"][0].update(
            ports=[{"containerPort": 29500, "hostPort": 29500}]),
        "sysctl kernel.msgmax": lambda s: s["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    }
    for expected, mutate in cases.items():
        broken = copy.deepcopy(p)
        mutate(broken)
        assert any(expected in v for v in restricted_violations(broken)), expected


# -- components -------------------------------------------------------------------------

TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["a", "b"]}]}]}}}
GPU = lambda runtime, job: job == "node"                                    # noqa: E731
CPU = lambda runtime, job: job in CPU_STEPS                                 # noqa: E731
EVERY = lambda runtime, job: True                                           # noqa: E731
GANG = lambda runtime, job: is_gang(runtime)                                # noqa: E731


@needs_kubectl
@needs_crds
@pytest.mark.parametrize("component, values, field, value, where", [
    ("gpu-node-selector", {"gpuNodes": {"nodeSelector": {"pool": "h100"}}}, "nodeSelector",
     {"pool": "h100"}, GPU),
    ("gpu-tolerations", {"gpuNodes": {"tolerations": TOLERATIONS}}, "tolerations",
     TOLERATIONS, GPU),
    ("gpu-affinity", {"gpuNodes": {"affinity": AFFINITY}}, "affinity", AFFINITY, GPU),
    ("cpu-node-selector", {"cpuNodes": {"nodeSelector": {"pool": "cpu"}}}, "nodeSelector",
     {"pool": "cpu"}, CPU),
    ("cpu-tolerations", {"cpuNodes": {"tolerations": TOLERATIONS}}, "tolerations",
     TOLERATIONS, CPU),
    ("cpu-affinity", {"cpuNodes": {"affinity": AFFINITY}}, "affinity", AFFINITY, CPU),
    ("priority-class", {"priorityClassName": "ml-batch"}, "priorityClassName", "ml-batch",
     EVERY),
    ("scheduler-name", {"schedulerName": "scheduler-plugins-scheduler"}, "schedulerName",
     "scheduler-plugins-scheduler", GANG),
], ids=lambda v: v if isinstance(v, str) and "-" in v else None)
def test_component_sets_its_field_on_its_steps_only(tmp_path, component, values, field,
                                                    value, where):
    before = sources()
    rendered = render(tmp_path, [component], values)
    assert sorted(r["metadata"]["name"] for r in rendered) == sorted(before)
    hits = 0
    for runtime in rendered:
        assert validate(runtime) == []
        original = before[runtime["metadata"]["name"]]
        assert [j["name"] for j in jobs(runtime)] == [j["name"] for j in jobs(original)]
        for job in jobs(runtime):
            if where(runtime, job["name"]):
                assert pod(job)[field] == value, (runtime["metadata"]["name"], job["name"])
                hits += 1
            else:
                assert field not in pod(job), (runtime["metadata"]["name"], job["name"])
    assert hits


@needs_kubectl
@needs_crds
def test_storage_components_set_the_claim(tmp_path):
    rendered = render(tmp_path, ["storage", "storage-size"], {"storage": {
        "storageClassName": "fast-rwo", "accessMode": "ReadWriteOncePod", "size": "321Gi"}})
    for runtime in rendered:
        assert validate(runtime) == []
        (claim,) = runtime["spec"]["template"]["spec"]["volumeClaimPolicies"][0]["templates"]
        assert claim["metadata"]["name"] == "initializer"
        assert claim["spec"]["storageClassName"] == "fast-rwo"
        assert claim["spec"]["resources"]["requests"]["storage"] == "321Gi"
        # The gang runtime's nodes share the claim: it stays ReadWriteMany.
        assert claim["spec"]["accessModes"] == (
            ["ReadWriteMany"] if is_gang(runtime) else ["ReadWriteOncePod"])


@needs_kubectl
@needs_crds
def test_shm_component_sizes_the_trainers_memory_volume(tmp_path):
    for runtime in render(tmp_path, ["shm"], {"shmSize": "24Gi"}):
        assert validate(runtime) == []
        node = next(j for j in jobs(runtime) if j["name"] == "node")
        dshm = next(v for v in pod(node)["volumes"] if v["name"] == "dshm")
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "24Gi"}


@needs_kubectl
@needs_crds
def test_gpu_resource_component_renames_the_gpu_resource(tmp_path):
    before = sources()
    for runtime in render(tmp_path, ["gpu-resource-amd"]):
        assert validate(runtime) == []
        old = next(j for j in jobs(before[runtime["metadata"]["name"]]) if j["name"] == "node")
        node = next(j for j in jobs(runtime) if j["name"] == "node")
        resources = pod(node)["containers"][0]["resources"]
        count = pod(old)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        for section in ("requests", "limits"):
            assert "nvidia.com/gpu" not in resources[section]
            assert resources[section]["amd.com/gpu"] == count


@needs_kubectl
def test_component_without_its_value_names_it(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "platform.yaml").write_text(platform({"storage": {"size": "1Gi"}}))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(BASE, overlay), "platform.yaml"],
        "components": [os.path.relpath(COMPONENTS / "storage", overlay)]}))
    result = kustomize(overlay)
    assert result.returncode != 0
    assert "spec.storage.storageClassName" in result.stderr


@needs_kubectl
@needs_crds
def test_example_overlay_renders_valid_restricted_runtimes(tmp_path):
    result = kustomize(EXAMPLE)
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    assert {r["kind"] for r in rendered} == {"ClusterTrainingRuntime"}  # values left out
    assert not [r for r in rendered if r["metadata"]["name"].startswith("torchtune-")]
    for runtime in rendered:
        assert validate(runtime) == []
        for job in jobs(runtime):
            assert restricted_violations(pod(job)) == []
            assert pod(job)["priorityClassName"] == "ml-batch"
            for c in containers(pod(job)):
                assert c["image"].startswith("registry.example.com/ml/kubetune-")


def test_base_runtimes_need_no_particular_cluster():
    """No scheduler name, node pool, storage class or priority class built in; every
    trainer's /dev/shm is memory-backed and leaves room under its memory limit."""
    for path in runtime_files():
        runtime = yaml.safe_load(path.read_text())
        for claim in runtime["spec"]["template"]["spec"]["volumeClaimPolicies"][0]["templates"]:
            assert "storageClassName" not in claim["spec"]
        for job in jobs(runtime):
            for field in ("schedulerName", "nodeSelector", "priorityClassName", "tolerations"):
                assert field not in pod(job), f"{path.name}: {job['name']} {field}"
        node = next(j for j in jobs(runtime) if j["name"] == "node")
        dshm = next(v for v in pod(node)["volumes"] if v["name"] == "dshm")["emptyDir"]
        limit = pod(node)["containers"][0]["resources"]["limits"]["memory"]
        assert dshm["medium"] == "Memory"
        assert int(dshm["sizeLimit"].removesuffix("Gi")) * 2 <= int(limit.removesuffix("Gi"))


# -- images -----------------------------------------------------------------------------

DIGESTS = {name: "sha256:" + f"{i:x}" * 64 for i, name in enumerate(IMAGES, start=10)}


@needs_kubectl
def test_images_set_in_one_place_reach_every_container(tmp_path):
    """kustomize's own image transformer reaches every container (init containers too)
    of a ClusterTrainingRuntime: no `configurations:` needed."""
    extra = yaml.safe_load((BASE / "kubetune-byo-model.yaml").read_text())
    extra["metadata"]["name"] = "with-init"
    pod(jobs(extra)[2])["initContainers"] = [{"name": "warm", "image":
                                              "ghcr.io/kubetune/initializer:0.1.0"}]
    rendered = render(tmp_path, files={"with-init.yaml": yaml.safe_dump(extra)}, images=[
        {"name": f"ghcr.io/kubetune/{n}", "newName": f"reg.corp/ml/{n}", "digest": d}
        for n, d in DIGESTS.items()])
    seen = set()
    for runtime in rendered:
        for job in jobs(runtime):
            for c in containers(pod(job)):
                name = c["image"].split("@")[0].rsplit("/", 1)[1]
                assert c["image"] == f"reg.corp/ml/{name}@{DIGESTS[name]}", c["image"]
                seen.add((runtime["metadata"]["name"], c["name"]))
    assert ("with-init", "warm") in seen and len(seen) > 30


@needs_kubectl
def test_release_manifests_pin_every_image_by_digest(tmp_path):
    out = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, str(REPO / "runtimes" / "release.py"), "--out", str(out),
         *(f"--digest={n}={d}" for n, d in DIGESTS.items())],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    base = list(yaml.safe_load_all((out / "kubetune-runtimes.yaml").read_text()))
    dropin = list(yaml.safe_load_all((out / "kubetune-runtimes-dropin.yaml").read_text()))
    assert {r["metadata"]["name"] for r in base} == {
        p.stem for p in runtime_files() if p.parent == BASE}
    assert {r["metadata"]["name"] for r in dropin} == {
        p.stem for p in runtime_files() if p.parent == DROPIN}
    for runtime in base + dropin:
        for job in jobs(runtime):
            for c in containers(pod(job)):
                name = c["image"].split("@")[0].rsplit("/", 1)[1]
                assert c["image"] == f"ghcr.io/kubetune/{name}@{DIGESTS[name]}"


@pytest.mark.parametrize("args, message", [
    (["--digest=trainer=sha256:abc"], "--digest trainer=sha256:abc: not a sha256 digest"),
    (["--digest=tokenizer=sha256:" + "a" * 64], "--digest tokenizer: not one of"),
    ([f"--digest={n}={d}" for n, d in list(DIGESTS.items())[:2]],
     "no digest for exporter"),
])
def test_release_refuses_bad_digests(tmp_path, args, message):
    result = subprocess.run(
        [sys.executable, str(REPO / "runtimes" / "release.py"), "--out", str(tmp_path), *args],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert message in result.stderr and not list(tmp_path.iterdir())
