"""Render the runtimes for a release with every image pinned by digest.

    python runtimes/release.py --out dist --digest initializer=sha256:... \\
        --digest trainer=sha256:... --digest exporter=sha256:...
    python runtimes/release.py --out dist --podman      # digests of the local images

Writes <out>/kubetune-runtimes.yaml (runtimes/base) and <out>/kubetune-runtimes-dropin.yaml
(the opt-in runtimes/overlays/dropin), rendered by `kubectl kustomize` through a
throwaway overlay whose `images:` set the digests: the same transformer a platform
team's overlay uses, so a release and an overlay cannot disagree on where images are.
`make release-manifests` runs this.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (beside this file; not a package)

IMAGES = ("initializer", "trainer", "exporter")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
OUTPUTS = {"kubetune-runtimes.yaml": generate.BASE,
           "kubetune-runtimes-dropin.yaml": generate.DROPIN}


def _podman_digest(name: str) -> str:
    ref = f"{generate.REGISTRY}/{name}:{generate.VERSION}"
    try:
        result = subprocess.run(["podman", "image", "inspect", "--format", "{{.Digest}}", ref],
                                capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("release.py: error: --podman: podman not found; pass --digest "
                         "NAME=sha256:... instead") from None
    if result.returncode != 0:
        raise SystemExit(f"release.py: error: podman image inspect {ref}: "
                         f"{result.stderr.strip() or 'failed'}")
    return result.stdout.strip()


def digests(parser: argparse.ArgumentParser, given: list[str], podman: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in given:
        name, _, digest = item.partition("=")
        if name not in IMAGES:
            parser.error(f"--digest {name}: not one of {', '.join(IMAGES)}")
        if not DIGEST.fullmatch(digest):
            parser.error(f"--digest {item}: not a sha256 digest (sha256: and 64 hex digits)")
        found[name] = digest
    for name in IMAGES:
        if name not in found:
            if not podman:
                parser.error(f"no digest for {name}: pass --digest {name}=sha256:... or "
                             "--podman to read it from the local image")
            found[name] = _podman_digest(name)
            if not DIGEST.fullmatch(found[name]):
                parser.error(f"podman gave {name} the digest {found[name]!r}")
    return found


def render(source: Path, pinned: dict[str, str], kubectl: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        overlay = Path(tmp)
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(source, overlay)],
            "images": [{"name": f"{generate.REGISTRY}/{name}", "digest": digest}
                       for name, digest in pinned.items()]}))
        result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True,
                                text=True)
    if result.returncode != 0:
        raise SystemExit(f"release.py: error: kubectl kustomize {source}: {result.stderr}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the manifests")
    parser.add_argument("--digest", action="append", default=[], metavar="NAME=sha256:...",
                        help=f"an image's digest, NAME one of {', '.join(IMAGES)}")
    parser.add_argument("--podman", action="store_true",
                        help="digests not given: from `podman image inspect` of "
                             f"{generate.REGISTRY}/NAME:{generate.VERSION}")
    args = parser.parse_args(argv)
    pinned = digests(parser, args.digest, args.podman)
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        parser.error("kubectl not found (it carries kustomize): apt-get install kubectl")
    rendered = {name: render(source, pinned, kubectl) for name, source in OUTPUTS.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        # Beside the target, then renamed: a reader never sees half a manifest.
        tmp = args.out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(args.out / name)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
