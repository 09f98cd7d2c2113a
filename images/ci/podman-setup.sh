#!/usr/bin/env bash
# Podman as it works on CI's machines (root, hybrid cgroups, no image registry): install it
# from Debian packages when missing, use runc (crun fails on these hosts) and raise the
# containers' file and process limits to the host's hard limits (podman's defaults exceed
# them here and every container fails to start; torch's dataloader and gloo open many files).
set -euo pipefail
if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # netavark + aardvark-dns: the per-run network of `kubetune local --engine podman`
  # resolves pod names (multi-node rendezvous).
  apt-get install -y -qq podman runc mmdebstrap uidmap slirp4netns fuse-overlayfs \
    netavark aardvark-dns >/dev/null
fi
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
# nproc above 32768 is refused here even under the host's hard limit (measured: 65536 fails).
cap() { local hard=$1 want=$2; [ "$hard" = unlimited ] || [ "$hard" -ge "$want" ] && echo "$want" || echo "$hard"; }
nofile=$(cap "$(ulimit -Hn)" 65536); nproc=$(cap "$(ulimit -Hu)" 32768)
if ! grep -q '# kubetune-ci' "$conf" 2>/dev/null; then
  cat >>"$conf" <<CONF
# kubetune-ci: settings that work on CI's hosts
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
fi
podman --version
