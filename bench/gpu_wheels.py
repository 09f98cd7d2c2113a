"""The Python packages bench/gpu.sh needs on a lent GPU machine that its image lacks, as
wheels carried with the working tree (that machine reaches no package index).

``fetch`` (here, with this checkout's venv and an index): the training stack's wheels for
CPython 3.12 on x86-64 Linux (the lent image's python3), at the versions this venv runs,
into ``bench/gpu-wheels/`` (git-ignored; the device tool's ``carry`` takes it along, 64 MiB
with the tree): torchtune, torchao, torchdata, omegaconf and antlr4, datasets,
huggingface_hub 2.x and its HTTP client, gguf, and the pure-Python packages they import
that a plain torch + CUDA image may not have. Left out: what that image is known to hold
and what is large or compiled (torch, numpy, pyarrow, sentencepiece, ...:
``LENT_IMAGE_HAS``; /work/.library/device/KINDS.md lists the image's packages), and what
training never imports (boto3: the initializers' S3 client). Prints the folder's total.

``install TARGET`` (there, with its python3): installs into TARGET (for ``PYTHONPATH``) the
carried wheels that machine needs: ours always (``OURS``: exactly the versions tested
here), any other only when its distribution is missing there or older than a carried
wheel's requirement says; then kubetune itself from the working tree (so the bench runs
the code it was sent with). A requirement neither met there nor carried is one
``warning:`` line naming it. Needs only pip and packaging, which the image has.

    python bench/gpu_wheels.py fetch [--dir bench/gpu-wheels]
    python3 bench/gpu_wheels.py install /tmp/kubetune-site [--dir bench/gpu-wheels]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "bench" / "gpu-wheels"
# Installed whatever the lent machine has: the versions kubetune pins and was tested with
# (the image's huggingface_hub is 1.x, ours 2.x).
# tokenizers too: the image's 0.23.2 declares huggingface_hub < 2, ours (0.23.3) < 3;
# torchtune needs it and the resolve against the image's pins found the clash
# (tests/test_gpu_resolve.py). Its wheel is abi3 and links no torch: ~3 MiB.
OURS = ("torchtune", "torchao", "torchdata", "omegaconf", "antlr4-python3-runtime",
        "datasets", "huggingface-hub", "gguf", "tokenizers")
# gguf is no dependency of ours (the real-model bench reads GGUF files): its version here.
EXTRA = {"gguf": "0.19.0"}
# In the lent image (KINDS.md, 2026-11), or large and compiled: not carried. pyarrow's
# wheel alone is 52.5 MiB (26.0.1), more than the carry limit leaves beside the rest: the
# image's must do (datasets 5.2 wants >= 24; install warns where it is older). Small
# pure-Python ones are carried although the image has them (fsspec, whose version datasets
# caps; hf-xet 1.6+, which huggingface_hub 2.x wants; certifi, idna, ...): install puts
# each in only where the image's misses a carried wheel's requirement.
LENT_IMAGE_HAS = {
    "torch", "triton", "numpy", "pandas", "pyarrow", "sympy", "mpmath", "networkx", "pillow",
    "matplotlib", "contourpy", "fonttools", "kiwisolver", "cycler", "pyparsing",
    "sentencepiece", "tiktoken", "safetensors", "psutil", "pyyaml", "regex", "xxhash", "lxml",
    "cryptography", "cffi", "protobuf", "jinja2", "markupsafe", "tzdata", "aiohttp", "yarl",
    "multidict", "frozenlist", "aiosignal", "propcache", "aiohappyeyeballs", "setuptools",
}
# The lent image's versions where a reading gives one (KINDS.md's pip list, 2026-11:
# python3 is CPython 3.12.3): what the carried set must resolve against
# (tests/test_gpu_resolve.py). The image's other packages (KINDS.md's name list) have no
# version read: the resolve leaves them free and cannot check them.
LENT_PYTHON = "3.12"
LENT_IMAGE_PINS = {
    "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0", "triton": "3.6.0",
    "transformers": "5.17.0", "huggingface-hub": "1.33.0", "accelerate": "1.15.0",
    "safetensors": "0.8.0", "tokenizers": "0.23.2", "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0", "numpy": "2.5.2", "sentence-transformers": "6.0.1",
    "torchmetrics": "1.9.0", "pytorch-lightning": "2.6.6",
}
# What bench/gpu_peft.py (the transformers + PEFT baseline) imports: the image's own,
# without the carried site (bench/gpu.py's baseline_env).
BASELINE_NEEDS = ("torch", "transformers", "peft", "accelerate", "tokenizers",
                  "huggingface-hub", "safetensors")
# Never imported by a training run (the initializers' S3 client): not carried.
NOT_NEEDED = {"boto3", "botocore", "s3transfer", "jmespath"}
# The lent image's python3, as pip names its wheels.
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
_LENT_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3",
                 "sys_platform": "linux", "platform_system": "Linux",
                 "platform_machine": "x86_64", "implementation_name": "cpython",
                 "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _needs(requirements: list[str]) -> list[str]:
    """The names ``requirements`` (Requires-Dist lines) need on the lent machine."""
    from packaging.requirements import Requirement

    found = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(_LENT_MARKERS):
            found.append(canonical(req.name))
    return found


def carried_set() -> dict[str, str]:
    """name -> version (this venv's) of every package to carry: the training stack's
    requirements, followed through theirs, less what the lent image has or never needs."""
    from importlib.metadata import PackageNotFoundError, requires, version

    roots = _needs([r for r in requires("kubetune") or []
                    if "extra" not in r or re.search(r"extra\s*==\s*.train.", r)])
    roots = [r.split(";")[0] for r in roots] + list(OURS)
    chosen: dict[str, str] = {}
    todo = [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in chosen or name in LENT_IMAGE_HAS or name in NOT_NEEDED:
            continue
        if name in EXTRA:
            chosen[name] = EXTRA[name]
            continue
        try:
            chosen[name] = version(name)
        except PackageNotFoundError:
            raise SystemExit(f"error: {name} is not installed in this venv: run from a "
                             "checkout whose .venv has the train extra (make venv)") from None
        todo += _needs(requires(name) or [])
    return chosen


def overlay_resolve_input() -> tuple[list[str], list[str]]:
    """(requirements, constraints) of the bench's own processes on the lent machine: the
    carried set at its versions over the image's pinned packages. ``install`` replaces
    OURS whatever the image has, so the image's pins on those are dropped; the rest
    constrain whatever the carried set pulls in (torch above all). A constraint adds no
    package: the image's transformers 5.17, which needs huggingface_hub < 2, is left out
    unless something carried needs it (then it conflicts with the carried 2.x, rightly:
    under the overlay it would import that 2.x)."""
    chosen = carried_set()
    requirements = [f"{name}=={version}" for name, version in sorted(chosen.items())]
    constraints = [f"{name}=={version}" for name, version in sorted(LENT_IMAGE_PINS.items())
                   if name not in OURS]
    return requirements, constraints


def baseline_resolve_input() -> tuple[list[str], list[str]]:
    """(requirements, constraints) of the baseline's process: the image's own packages,
    nothing carried."""
    requirements = [f"{name}=={LENT_IMAGE_PINS[name]}" if name in LENT_IMAGE_PINS else name
                    for name in BASELINE_NEEDS]
    return requirements, [f"{n}=={v}" for n, v in sorted(LENT_IMAGE_PINS.items())]


def fetch(folder: Path) -> None:
    chosen = carried_set()
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()  # one version of each: two stop the install there
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                    "cp", *platforms, "-d", str(folder),
                    *[f"{name}=={v}" for name, v in sorted(chosen.items())]], check=True)
    # kubetune's own wheel: install prefers the tree it is sent with; this one stands in
    # where that machine cannot build (no setuptools).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(folder), str(REPO)], check=True)
    total = 0
    for wheel in sorted(folder.glob("*.whl")):
        total += wheel.stat().st_size
        print(f"{wheel.stat().st_size / 2 ** 20:7.2f} MiB  {wheel.name}")
    print(f"{total / 2 ** 20:7.2f} MiB in {len(list(folder.glob('*.whl')))} wheels "
          f"({folder}); the device tool carries at most 64 MiB with the tree")


def _wheel_name(wheel: Path) -> tuple[str, str]:
    name, version = wheel.name.split("-")[:2]
    return canonical(name), version


def _wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        text = whl.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def _unmet(folder: Path) -> dict[str, list]:
    """name -> the carried wheels' specifiers on it that this machine's install misses
    (absent, or a version outside one of them)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    wanted: dict[str, list] = {}
    for wheel in folder.glob("*.whl"):
        if _wheel_name(wheel)[0] == "kubetune":
            continue  # its pins are its images' versions; it runs on what the image has
        for line in _wheel_requires(wheel):
            req = Requirement(line)
            if (req.marker is None or req.marker.evaluate(_LENT_MARKERS)) \
                    and canonical(req.name) not in NOT_NEEDED:
                wanted.setdefault(canonical(req.name), []).append(req.specifier)
    unmet = {}
    for name, specifiers in wanted.items():
        try:
            have = version(name)
        except PackageNotFoundError:
            unmet[name] = specifiers
            continue
        if not all(spec.contains(have, prereleases=True) for spec in specifiers):
            unmet[name] = specifiers
    return unmet


def install(target: Path, folder: Path) -> None:
    from importlib.metadata import PackageNotFoundError, version

    wheels = {_wheel_name(w)[0]: w for w in folder.glob("*.whl")}
    unmet = _unmet(folder)
    chosen = []
    for name, wheel in sorted(wheels.items()):
        if name == "kubetune":
            continue
        try:
            version(name)
            missing = False
        except PackageNotFoundError:
            missing = True
        if name in OURS or missing or name in unmet:
            chosen.append(wheel)
    for name, specifiers in sorted(unmet.items()):
        if name not in wheels:
            wants = ",".join(sorted({str(s) for s in specifiers if str(s)})) or "(any)"
            print(f"warning: {name} {wants} is needed and neither installed here nor "
                  "carried (bench/gpu_wheels.py: LENT_IMAGE_HAS)", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    if chosen:
        subprocess.run([*pip, *map(str, chosen)], check=True)
    print(f"installed {len(chosen)} carried wheel(s) into {target}: "
          f"{' '.join(_wheel_name(w)[0] for w in chosen) or 'none needed'}", flush=True)
    built = subprocess.run([*pip, "--no-build-isolation", str(REPO)])
    if built.returncode != 0:
        if "kubetune" not in wheels:
            raise SystemExit("error: kubetune could not be built here and no kubetune wheel "
                             "is carried: run bench/gpu_wheels.py fetch before the call")
        print("warning: kubetune built from the tree failed; the carried wheel stands in "
              "(it may be older than the tree)", flush=True)
        subprocess.run([*pip, str(wheels["kubetune"])], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("fetch", "install"))
    parser.add_argument("target", nargs="?", type=Path,
                        help="install: the folder to install into (put it on PYTHONPATH)")
    parser.add_argument("--dir", type=Path, default=WHEELS, help="the wheels' folder")
    args = parser.parse_args()
    if args.action == "fetch":
        fetch(args.dir)
    elif args.target is None:
        parser.error("install needs a target folder")
    else:
        install(args.target, args.dir)


if __name__ == "__main__":
    main()
