#!/usr/bin/env bash
# Stand-in base images, built from Debian's packages because CI reaches no image registry:
#   localhost/kubetune-ci-python:bookworm  Debian bookworm + python3.11 in a venv first on PATH
#                                          (what python:3.11-slim gives the initializer/exporter)
#   localhost/kubetune-ci-torch:bookworm   the same + torch's CPU wheel (what the pytorch image
#                                          gives the trainer and the all-in-one image)
# Our Dockerfiles build FROM these unchanged; only their base build args differ.
# TORCH_WHEELS: a directory holding the torch CPU wheel for cp311 (and its dependencies are
# fetched from the package index pip is configured with).
set -euo pipefail
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
work=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=mounts.sh
. "$here/mounts.sh"
trap 'rm -rf "$work"' EXIT

# pip inside a build reaches the indexes this host's pip reaches, through the same TLS
# proxy: the base gets this host's CA bundle and its effective pip settings (index URLs,
# find-links, certificate, constraints); builds bind-mount the local index folders they
# name. Nothing of this is in our Dockerfiles: it is the CI host's network, not the image's.
pip config list 2>/dev/null | sed -nE "s/^(:env:|global)\.([a-z-]+)='(.*)'$/\2 = \3/p" \
  | sort -u -t= -k1,1 >"$work/pip.conf"
sed -i '1i [global]' "$work/pip.conf"
constraints=$(sed -n 's/^constraint = //p' "$work/pip.conf")

if ! podman image exists localhost/kubetune-ci-python:bookworm; then
  # passwd: groupadd/useradd, as the python images have; ca-certificates: TLS to indexes.
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    --customize-hook="cp /etc/ssl/certs/ca-certificates.crt \"\$1/etc/ssl/certs/ca-certificates.crt\"" \
    --customize-hook="cp '$work/pip.conf' \"\$1/etc/pip.conf\"" \
    ${constraints:+--customize-hook="mkdir -p \"\$1$(dirname "$constraints")\" && cp '$constraints' \"\$1$constraints\""} \
    --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    bookworm "$work/rootfs.tar" | tail -20
  podman import --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' "$work/rootfs.tar" localhost/kubetune-ci-python:bookworm | tail -20
fi

if ! podman image exists localhost/kubetune-ci-torch:bookworm; then
  cat >"$work/Containerfile" <<'CF'
FROM localhost/kubetune-ci-python:bookworm
ARG TORCH_SPEC
RUN python -m pip install --no-cache-dir --find-links /wheels "${TORCH_SPEC}"
CF
  # The wheel directory is bind-mounted, never copied into a layer; pip's index settings
  # come from the host's pip configuration, passed as environment.
  podman build --network host --no-cache -v "$TORCH_WHEELS:/wheels:ro" $(ci_mounts) \
    --build-arg TORCH_SPEC="$TORCH_SPEC" -t localhost/kubetune-ci-torch:bookworm "$work" | tail -20
fi
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep kubetune-ci
