#!/usr/bin/env bash
# Docker as it works on CI's machines (root, Debian bookworm, no systemd, no image
# registry): Debian's docker.io, its daemon started by hand (overlay2 on the host's ext4,
# its own iptables rules and bridge), then the images under test copied in from podman's
# store, where `make images-test` builds them: `docker-setup.sh IMAGE...`.
# DOCKER_HOST, when set, names the daemon to use (and to start, for a unix socket).
set -euo pipefail
if ! command -v dockerd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # docker.io brings containerd, runc and docker-init (`docker run --init`).
  apt-get install -y -qq docker.io >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  socket=${DOCKER_HOST:-unix:///var/run/docker.sock}
  # No systemd here: the daemon runs in the background for as long as the machine does.
  nohup dockerd --host "$socket" >/var/log/kubetune-ci-dockerd.log 2>&1 &
  # Up to 10 minutes: CI builds at the least CPU weight beside the tests (.ci/run), and the
  # daemon starts in the CPU time they leave.
  for _ in $(seq 600); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null || { tail -20 /var/log/kubetune-ci-dockerd.log; exit 1; }
fi
docker version --format 'docker {{.Server.Version}}'
if [ "$#" -gt 0 ]; then
  # One archive: the layers the images share are copied once.
  podman save -m "$@" | docker load
  # A machine that ran this before: the images these tags named then, now untagged.
  docker image prune -f >/dev/null
fi
