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

    def can_read(self, path: Path) -> bool:
        """Whether this user reaches and reads ``path`` (every directory above it too)."""
        return self.run(["test", "-r", str(path)]).returncode == 0

    def python(self) -> list[str]:
        """A Python this user may run that imports this checkout's kubetune: this one, or
        (when it lives where the user may not go, e.g. /root) a venv of the system's Python
        of the same version that adds this one's packages: where the user can read them,
        or else from a copy this user can read (`readable_checkout`)."""
        purelib = Path(sysconfig.get_paths()["purelib"])
        if self.run(["test", "-x", sys.executable]).returncode == 0 and \
                self.can_read(REPO / "kubetune" / "__init__.py"):
            return [sys.executable]
        site_dir = purelib if self.can_read(purelib) and self.can_read(
            REPO / "kubetune" / "__init__.py") else self.readable_checkout(purelib)
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
        pth = site / "kubetune-checkout.pth"
        pth.unlink(missing_ok=True)  # a file of root's in the user's venv: replaced
        pth.write_text(f"import site; site.addsitedir({str(site_dir)!r})\n")
        return [str(venv / "bin" / "python")]

    def readable_checkout(self, purelib: Path) -> Path:
        """A copy of this checkout's packages and of its venv's site-packages, under this
        user's home, for a checkout the user cannot read: a clone under a private (0700)
        directory, a venv inside it. Files are hard-linked where the home is on the same
        filesystem (no space, no time), copied otherwise; the editable install's finder,
        which names the checkout's own paths, is rewritten to name the copy's. Returns the
        site-packages to add."""
        dest = self.home / "kubetune-checkout"
        shutil.rmtree(dest, ignore_errors=True)
        _link_tree(purelib, dest / "site-packages")
        for package in _PACKAGE_DIRS:
            _link_tree(REPO / package, dest / "src" / package)
        for finder in (dest / "site-packages").glob("__editable__*finder.py"):
            text = finder.read_text()
            finder.unlink()  # a hard link: the checkout's own finder stays as it is
            finder.write_text(text.replace(f"'{REPO}/", f"'{dest / 'src'}/"))
            finder.chmod(0o644)
        for path in [dest, *dest.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)  # made by root under its umask: the user must enter
        return dest / "site-packages"


REPO = Path(__file__).resolve().parents[2]
# The checkout's package folders (pyproject.toml's package-dir): what the finder maps.
_PACKAGE_DIRS = ("kubetune", "entrypoints", "initializers", "trainer", "exporter")


def _link_tree(src: Path, dest: Path) -> None:
    """``src`` at ``dest``: each file hard-linked, or copied where a link cannot be made."""
    def link_or_copy(source: str, target: str) -> str:
        if os.stat(source).st_mode & 0o004:  # a link shares the mode: only readable ones
            try:
                os.link(source, target)
                return target
            except OSError:
                pass
        copied = shutil.copy2(source, target)
        os.chmod(copied, os.stat(copied).st_mode | 0o444)
        return copied

    shutil.copytree(src, dest, symlinks=True, copy_function=link_or_copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
