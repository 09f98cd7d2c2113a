"""Read a Dockerfile's instructions, and replay its install steps in a virtualenv.

There is no Docker engine on CI machines. What can be checked without one is what each
image's build would install: the `python -m pip ...` and `kubetune ...` commands of its
RUN instructions, run in order in a clean virtualenv, with the build context's COPYs
reproduced and the image paths mapped to temporary directories.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARG defaults (global and per stage)
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)), text)

    def env(self) -> dict[str, str]:
        """The final stage's ENV, as `KEY=value` pairs."""
        out: dict[str, str] = {}
        for arg in self.final.all("ENV"):
            for pair in shlex.split(arg):
                key, _, value = pair.partition("=")
                out[key] = value
        return out

    def labels(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for arg in self.final.all("LABEL"):
            for pair in shlex.split(arg):
                key, _, value = pair.partition("=")
                out[key] = self.expand(value)
        return out


def parse(path: Path, build_args: dict[str, str] | None = None) -> Dockerfile:
    """The Dockerfile at ``path``; ``build_args`` as `--build-arg NAME=value` would give."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") and not pending:
            continue
        if raw.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in filter(str.strip, lines):
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), " ".join(rest.split())
        if keyword == "ARG":
            name, has_default, default = rest.partition("=")
            if has_default:
                args[name] = default.strip('"')
            if build_args and name in build_args:
                args[name] = build_args[name]
        if keyword == "FROM":
            parts = rest.split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args, stages)


def _pip_settings(assignments: list[str]) -> list[str]:
    """``PIP_INDEX_URL=url`` before a pip command as the option pip reads it as
    (``--index-url url``); pip drops an empty setting, so an empty one gives nothing."""
    options = []
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        assert name.startswith("PIP_"), f"unexpected variable before a command: {assignment}"
        if value:
            options += ["--" + name[4:].lower().replace("_", "-"), value]
    return options


def install_commands(dockerfile: Dockerfile) -> list[list[str]]:
    """The pip and kubetune commands of every RUN, in build order, variables expanded;
    pip settings given as environment (``PIP_X=v python -m pip install``) as options."""
    commands = []
    for stage in dockerfile.stages:
        for run in stage.all("RUN"):
            run = re.sub(r"--mount=\S+\s*", "", run)
            for part in run.split("&&"):
                argv = shlex.split(dockerfile.expand(part.strip()))
                assignments = []
                while argv and re.match(r"[A-Za-z_]\w*=", argv[0]):
                    assignments.append(argv.pop(0))
                if argv[:3] == ["python", "-m", "pip"]:
                    commands.append([*argv[:4], *_pip_settings(assignments), *argv[4:]])
                elif argv[:1] == ["kubetune"]:
                    commands.append(argv)
    return commands


def copy_context(dockerfile: Dockerfile, repo: Path, root: Path) -> None:
    """Reproduce the build stages' `COPY <context paths> <dest>` under ``root``."""
    for stage in dockerfile.stages:
        workdir = "/"
        for keyword, arg in stage.instructions:
            if keyword == "WORKDIR":
                workdir = arg
            if keyword != "COPY" or arg.startswith("--from"):
                continue
            *sources, dest = arg.split()
            target_dir = root / (dest if dest.startswith("/") else f"{workdir}/{dest}") \
                .lstrip("/")
            for source in sources:
                src = repo / source
                if len(sources) > 1 or dest.endswith("/"):
                    target = target_dir / Path(source).name
                else:
                    target = target_dir
                target.parent.mkdir(parents=True, exist_ok=True)
                if src.is_dir():
                    shutil.copytree(src, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(src, target)


def replay(dockerfile: Dockerfile, repo: Path, root: Path, venv: Path,
           drop_options: tuple[str, ...] = ("--index-url",), extra_pip: tuple[str, ...] = ()
           ) -> list[list[str]]:
    """Run the image's install commands into ``venv``; image paths live under ``root``."""
    copy_context(dockerfile, repo, root)
    executed = []
    for argv in install_commands(dockerfile):
        mapped: list[str] = []
        skip = False
        for arg in argv:
            if skip:
                skip = False
                continue
            if arg in drop_options:  # e.g. the PyTorch CPU index: CI installs offline
                skip = True
                continue
            mapped.append(re.sub(r"(?<![\w.])/(src|wheels|opt)\b",
                                 lambda m: str(root / m.group(1)), arg))
        if mapped[0] == "python":
            mapped = [str(venv / "bin" / "python"), *mapped[1:]]
            if mapped[3] == "install":
                mapped += list(extra_pip)
        else:
            mapped = [str(venv / "bin" / mapped[0]), *mapped[1:]]
        result = subprocess.run(mapped, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(mapped)} failed:\n{result.stderr[-3000:]}")
        executed.append(mapped)
    return executed
