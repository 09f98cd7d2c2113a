"""`kubetune local --engine`: every container runs as the user running it, however the
engine maps users (rootful, rootless, userns-remap), and a source that user may read but
the containers could not is named before any step. The engines themselves run in
tests/images (as root, and as a non-root user with rootless podman)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubetune.entrypoints.local import merged_jobset
from kubetune.errors import BadInputError
from kubetune.tools.local.container_user import (EngineFacts, HostUser, engine_facts,
                                                 first_unreadable, refusal, run_as)
from kubetune.tools.local.containers import EngineOptions
from kubetune.tools.local.jobset import LocalJobSet
from tests.support.runtimes import initializer_uris, runtime_file, write_trainjob

ALICE = HostUser(1000, 1000, (27, 100, 1000), "alice")
ROOT = HostUser(0, 0, (0,), "root")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes files of another uid")


def model_initializer_argv(tmp_path: Path, facts: EngineFacts, me: HostUser) -> list[str]:
    job = write_trainjob(tmp_path / "job.yaml", "kubetune-byo-model",
                         initializer_uris("hf://org/model", "hf://org/data"))
    js = LocalJobSet(merged_jobset(runtime_file("kubetune-byo-model.yaml"), job),
                     tmp_path / "run", EngineOptions(facts.engine))
    js.session.run_as = run_as(facts, me)
    js.logs.mkdir(parents=True, exist_ok=True)
    job = next(j for j in js.spec["replicatedJobs"] if j["name"] == "model-initializer")
    return js.step(job, job["template"]["spec"]["template"]["spec"]["containers"][0], 0,
                   1).command


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == option]


@pytest.mark.parametrize("facts, me, user, userns, groups", [
    # Containers get this host's ids: the user's uid, primary gid and other groups.
    (EngineFacts("docker", rootless=False), ALICE, "1000:1000", [], ["27", "100"]),
    (EngineFacts("podman", rootless=False), ROOT, "0:0", [], []),
    # Rootless podman maps container ids to sub-ids, but for keep-id's own user.
    (EngineFacts("podman", rootless=True), ALICE, "1000:1000", ["keep-id"], []),
    # A rootless docker daemon runs as the user: its container root is the user.
    (EngineFacts("docker", rootless=True), ALICE, "0:0", [], []),
    # A daemon remapping every container's users: not this run's.
    (EngineFacts("docker", rootless=False, userns_remap=True), ALICE, "1000:1000",
     ["host"], ["27", "100"]),
], ids=["docker", "podman-as-root", "podman-rootless", "docker-rootless",
        "docker-userns-remap"])
def test_containers_run_as_the_user_running_kubetune_local(tmp_path, facts, me, user,
                                                           userns, groups):
    argv = model_initializer_argv(tmp_path, facts, me)
    assert option_values(argv, "--user") == [user]  # not the runtime's runAsUser 65532
    assert option_values(argv, "--userns") == userns
    # The pod's fsGroup stays, after the user's own groups.
    assert option_values(argv, "--group-add") == groups + ["65532"]


# What the engines answer (trimmed): podman 4.3 rootful and rootless, docker 20.10.
PODMAN_ROOTFUL = {"host": {"security": {"rootless": False},
                           "idMappings": {"gidmap": None, "uidmap": None}}}
PODMAN_ROOTLESS = {"host": {"security": {"rootless": True}, "idMappings": {
    "uidmap": [{"container_id": 0, "host_id": 1001, "size": 1},
               {"container_id": 1, "host_id": 100000, "size": 65536}]}}}
# A user without /etc/subuid entries: podman warns "Using rootless single mapping".
PODMAN_NO_SUBIDS = {"host": {"security": {"rootless": True}, "idMappings": {
    "uidmap": [{"container_id": 0, "host_id": 1002, "size": 1}]}}}


@pytest.mark.parametrize("engine, info, facts", [
    ("podman", PODMAN_ROOTFUL, EngineFacts("podman", rootless=False)),
    ("podman", PODMAN_ROOTLESS, EngineFacts("podman", rootless=True)),
    ("podman", PODMAN_NO_SUBIDS, EngineFacts("podman", rootless=True,
                                             subordinate_ids=False)),
    ("docker", {"SecurityOptions": ["name=seccomp,profile=default"]},
     EngineFacts("docker", rootless=False)),
    ("docker", {"SecurityOptions": ["name=seccomp,profile=default", "name=rootless"]},
     EngineFacts("docker", rootless=True)),
    ("docker", {"SecurityOptions": ["name=seccomp,profile=default", "name=userns"]},
     EngineFacts("docker", rootless=False, userns_remap=True)),
])
def test_how_an_engine_maps_users_is_read_from_its_info(engine, info, facts):
    assert engine_facts(engine, json.dumps(info)) == facts


def test_rootless_podman_without_subordinate_ids_is_refused_with_the_fix():
    # keep-id needs a sub-uid range (podman cannot even store an image without one).
    with pytest.raises(BadInputError) as caught:
        run_as(engine_facts("podman", json.dumps(PODMAN_NO_SUBIDS)), ALICE)
    message = caught.value.message
    assert "\n" not in message
    assert "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 alice" in message


def test_a_docker_client_without_its_daemon_says_so():
    with pytest.raises(BadInputError, match="Cannot connect to the Docker daemon"):
        engine_facts("docker", json.dumps({"ServerErrors": [
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the "
            "docker daemon running?"]}))


def private_model(tmp_path: Path, owner: int) -> Path:
    """A model as a user keeps it: directory 0700, weights 0600 (safetensors' mode)."""
    model = tmp_path / "home" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"x")
    (model / "model.safetensors").chmod(0o600)
    model.chmod(0o700)
    for path in (model, model / "model.safetensors"):
        os.chown(path, owner, owner)
    return model


@needs_root
def test_root_is_told_before_any_step_of_a_source_only_its_owner_may_read(tmp_path):
    """sudo kubetune local: root's containers drop root's privileges (the runtime drops
    ALL), so another user's private model is unreadable to them: said before any step,
    naming the file and its owner, with the fix."""
    model = private_model(tmp_path, owner=4242)
    job = write_trainjob(tmp_path / "job.yaml", "kubetune-byo-model",
                         initializer_uris(f"file://{model}", "hf://org/data"))
    js = LocalJobSet(merged_jobset(runtime_file("kubetune-byo-model.yaml"), job),
                     tmp_path / "run", EngineOptions("docker"))
    js.session.run_as = run_as(EngineFacts("docker", rootless=False), ROOT)
    with pytest.raises(BadInputError) as caught:
        js.check()
    message = caught.value.message
    assert message.startswith(f"model-initializer: {model}: ")
    assert "owner uid 4242, mode 0700" in message and "\n" not in message
    assert "run kubetune local as uid 4242" in message and "chmod -R o+rX" in message
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    # A container keeping root's privileges (no capability dropped) reads it.
    assert first_unreadable(model, run_as(EngineFacts("docker", False), ROOT), []) is None
    # Readable by others: read.
    model.chmod(0o755)
    (model / "model.safetensors").chmod(0o644)
    js.check()


@needs_root
def test_rootless_containers_do_not_read_through_the_users_other_groups(tmp_path):
    model = private_model(tmp_path, owner=0)
    os.chown(model / "model.safetensors", 0, 5555)
    (model / "model.safetensors").chmod(0o640)
    model.chmod(0o755)
    me = HostUser(4243, 4243, (4243, 5555), "bob")
    # Rootless podman keeps only the primary group: refused, with what to do.
    who = run_as(EngineFacts("podman", rootless=True), me)
    assert first_unreadable(model, who, ["ALL"]) == model / "model.safetensors"
    message = refusal(model / "model.safetensors", who, "podman")
    assert "(group 5555, mode 0640)" in message and "--engine docker" in message
    # Docker adds every group of the user: as the user reads it, the containers do.
    assert first_unreadable(model, run_as(EngineFacts("docker", False), me), ["ALL"]) is None
