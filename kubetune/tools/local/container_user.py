"""Who the containers of `kubetune local --engine podman|docker` run as: the user running it.

A run reads the user's own files (a model directory 0700, as home directories are; weights
0600, as safetensors writes them) and writes a workdir and an export that are theirs to
read, move and delete. So every container runs as the invoking user's uid and primary gid,
whatever runAsUser/runAsGroup the runtime names: on a cluster those give the pod an
unprivileged identity and fsGroup makes the volume its own; here the files already have
an owner, and the steps act as that owner. How each engine does it:

- docker, and podman run by root: containers get this host's ids as they are: `--user
  UID:GID`, with `--group-add` for each of the user's other groups (a file their group may
  read is read).
- podman rootless: container ids map to the user's subordinate ids (a file written as uid
  1000 inside is a sub-uid's outside, readable only through `podman unshare`), except with
  `--userns=keep-id`, which maps the user to themselves. Only their primary group crosses
  (runc maps no other). The images' own design, an arbitrary uid with gid 0, would be
  `keep-id:uid=UID,gid=0`: podman 4.3 with runc fails to start such a container, and
  `--user UID:0` leaves every file a sub-gid's; the images need no gid 0 (HOME and the
  caches are under /tmp), so the primary gid it is.
- docker rootless (its daemon runs as the user; container root is the user): `--user 0:0`.
- docker with userns-remap: `--userns=host`, then as docker.

Root is root: `sudo kubetune local` runs as root, as any command under sudo does (SUDO_UID
is not consulted: files would be written as someone the command was not asked to act
for). Its containers run as 0:0 with the capabilities the runtime drops (ALL, in ours),
so like any unprivileged user they read only what the file modes let them: a source that
belongs to another user and only they may read is named before any step starts, with the
fix. Rootless podman's missing supplementary groups are caught the same way.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from kubetune.errors import BadInputError

# A file's ACL may grant what its mode bits refuse: such a file is left to the step to read.
_ACL = "system.posix_acl_access"


@dataclass(frozen=True)
class HostUser:
    """The user running `kubetune local`: effective ids, as the kernel checks them."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str

    @classmethod
    def current(cls) -> "HostUser":
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid {uid}"
        return cls(uid, os.getegid(), tuple(sorted(set(os.getgroups()))), name)


@dataclass(frozen=True)
class EngineFacts:
    """What the engine says about how it maps users."""

    engine: str
    rootless: bool  # podman rootless, or a rootless docker daemon
    userns_remap: bool = False  # a docker daemon that remaps every container's users
    subordinate_ids: bool = True  # podman rootless: the user has a sub-uid range mapped


@dataclass(frozen=True)
class RunAs:
    """How a run's containers are started, and who they read as on this host."""

    user: str  # --user, inside the container
    userns: str | None  # --userns
    groups: tuple[str, ...]  # --group-add
    host_uid: int  # the owner, on this host, of what they write
    host_gids: frozenset[int]  # the groups they read through, on this host
    same_as_host: bool  # they read exactly as `kubetune local` does (same ids and groups)


def engine_facts(engine: str, info_json: str) -> EngineFacts:
    """Parse `podman info --format json` / `docker info --format '{{json .}}'`."""
    info = json.loads(info_json)
    if engine == "podman":
        host = info.get("host") or {}
        uidmap = (host.get("idMappings") or {}).get("uidmap") or []
        rootless = bool((host.get("security") or {}).get("rootless"))
        return EngineFacts(engine, rootless, subordinate_ids=not rootless or any(
            m.get("size", 0) > 1 for m in uidmap))
    if info.get("ServerErrors"):  # an older client answers so when no daemon runs
        raise BadInputError(f"--engine docker: {info['ServerErrors'][0]}")
    options = [o for option in info.get("SecurityOptions") or [] for o in option.split(",")]
    return EngineFacts(engine, "name=rootless" in options, "name=userns" in options)


def info_argv(engine: str) -> list[str]:
    return [engine, "info", "--format", "json" if engine == "podman" else "{{json .}}"]


def run_as(facts: EngineFacts, me: HostUser) -> RunAs:
    """The user a run's containers run as: ``me`` (see the module's docstring)."""
    own = frozenset({me.gid})
    if facts.engine == "podman" and facts.rootless:
        if not facts.subordinate_ids:
            raise BadInputError(
                f"--engine podman: rootless podman has no subordinate ids for {me.name}, so "
                "its containers cannot run as you (--userns=keep-id); add a range: `usermod "
                f"--add-subuids 100000-165535 --add-subgids 100000-165535 {me.name}` (as "
                "root), then `podman system migrate`")
        return RunAs(f"{me.uid}:{me.gid}", "keep-id", (), me.uid, own, same_as_host=False)
    if facts.engine == "docker" and facts.rootless:
        return RunAs("0:0", None, (), me.uid, own, same_as_host=False)
    others = tuple(str(g) for g in me.groups if g != me.gid)
    return RunAs(f"{me.uid}:{me.gid}", "host" if facts.userns_remap else None, others,
                 me.uid, frozenset({me.gid, *me.groups}), same_as_host=True)


def _reads_past_modes(cap_drop: list[str]) -> bool:
    """Whether root in a container dropping ``cap_drop`` may read past the mode bits."""
    dropped = {c.upper().removeprefix("CAP_") for c in cap_drop}
    return not dropped & {"ALL", "DAC_OVERRIDE"}


def _allowed(st: os.stat_result, uid: int, gids: frozenset[int], want: int) -> bool:
    """Whether the mode bits give ``want`` (4 read, 1 search, 5 both) to uid/gids."""
    mode = stat.S_IMODE(st.st_mode)
    bits = mode >> 6 if st.st_uid == uid else mode >> 3 if st.st_gid in gids else mode
    return bits & want == want


def _has_acl(path: Path) -> bool:
    try:
        return _ACL in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def first_unreadable(source: Path, who: RunAs, cap_drop: list[str]) -> Path | None:
    """The first path under ``source`` (itself included) that this process may read but a
    container running as ``who`` and dropping ``cap_drop`` may not; None if none. Only
    ``source`` and what it holds count: it is bind-mounted at its own path, and the
    directories above it in the container are the container's own."""
    if who.host_uid == 0:
        if _reads_past_modes(cap_drop):
            return None
    elif who.same_as_host:
        return None  # its ids and groups are this process's: what it reads, they read

    def refused(path: Path, want: int) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False  # gone, or unreadable here too: the step reports what it finds
        return not _allowed(st, who.host_uid, who.host_gids, want) \
            and not _has_acl(path) and os.access(path, os.R_OK if want & 4 else os.X_OK)

    source = Path(source)
    if not source.is_dir():
        return source if refused(source, 4) else None
    if refused(source, 5):
        return source
    for dirpath, dirnames, filenames in os.walk(source):
        for names, want in ((dirnames, 5), (filenames, 4)):
            for name in names:
                path = Path(dirpath) / name
                # A link is followed where it points, which the container may not have.
                if not path.is_symlink() and refused(path, want):
                    return path
    return None


def refusal(path: Path, who: RunAs, engine: str) -> str:
    """The one line that says why a container cannot read ``path`` and what to do."""
    st = path.stat()
    kind = "directory" if path.is_dir() else "file"
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if who.host_uid == 0:
        owner = _user_name(st.st_uid)
        return (f"{path}: this {kind} (owner {owner}, mode {mode}) is readable here only "
                f"because you are root; the --engine {engine} containers run as root "
                "without root's privileges (the runtime drops them) and cannot read it: run "
                f"kubetune local as {owner} (without sudo: rootless podman, or docker as a "
                "member of the docker group), or let others read it (chmod -R o+rX)")
    return (f"{path}: this {kind} (group {st.st_gid}, mode {mode}) is readable by you "
            f"through a group the --engine {engine} containers do not carry (rootless "
            "containers keep only your primary group): let your primary group or others "
            "read it (chgrp / chmod o+r), or use --engine docker")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
