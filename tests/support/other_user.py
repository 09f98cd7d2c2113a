"""Commands run as a real non-root user of this machine (the images tests' rootless podman
and docker-group runs), created by images/ci/rootless-user.sh."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

NAME = "kubetune-rootless"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int
    home: Path

    @classmethod
    def find(cls, name: str = NAME) -> "OtherUser | None":
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return cls(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))

    def run(self, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
            umask: int | None = None, timeout: float = 600, stdin=None
            ) -> subprocess.CompletedProcess:
        """``argv`` in a login shell of this user (its own HOME and PATH), with ``env``
        added, under ``umask`` (None: its login's)."""
        command = (f"cd {shlex.quote(str(cwd))} && " if cwd else "") + \
            (f"umask {umask:03o} && " if umask is not None else "") + shlex.join(
                ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv])
        return subprocess.run(["runuser", "-l", self.name, "-c", command], stdin=stdin,
                              capture_output=True, text=stdin is None, timeout=timeout)

    def give(self, path: Path) -> None:
        """Make ``path`` and all it holds this user's."""
        for p in [path, *path.rglob("*")]:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)

    def python(self) -> list[str]:
        """A Python this user may run that imports this checkout's kubetune: this one, or
        (when it lives where the user may not go, e.g. /root) a venv of the system's Python
        of the same version that adds this one's packages."""
        if self.run(["test", "-x", sys.executable]).returncode == 0:
            return [sys.executable]
        venv = self.home / "kubetune-checkout-venv"
        system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                              path="/usr/bin:/bin")
        if system is None:
            raise RuntimeError(f"{sys.executable} is not executable by {self.name} and "
                               f"/usr/bin has no python{sys.version_info.major}."
                               f"{sys.version_info.minor}")
        if not (venv / "bin" / "python").exists():
            created = self.run([system, "-m", "venv", "--without-pip", str(venv)])
            assert created.returncode == 0, created.stderr
        site = next((venv / "lib").glob("python*/site-packages"))
        (site / "kubetune-checkout.pth").write_text(
            f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        return [str(venv / "bin" / "python")]
