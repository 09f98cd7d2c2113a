#!/usr/bin/env bash
# The non-root user tests/images runs `kubetune local --engine` as (tests/support/
# other_user.py): rootless podman with its own image store, and docker as a member of the
# docker group. Run as root, after podman-setup.sh (and docker-setup.sh):
# `rootless-user.sh IMAGE...` also copies those images from root's store into the user's
# (what tests/images does when they are not there), so the images' tests find them.
set -euo pipefail
user=kubetune-rootless
if ! id "$user" >/dev/null 2>&1; then
  # useradd gives it a sub-uid and sub-gid range (uidmap's login.defs): keep-id needs one.
  useradd --create-home --shell /bin/bash "$user"
fi
grep -q "^$user:" /etc/subuid || usermod --add-subuids 200000-265535 "$user"
grep -q "^$user:" /etc/subgid || usermod --add-subgids 200000-265535 "$user"
getent group docker >/dev/null && usermod -aG docker "$user"
# slirp4netns (rootless podman's network) opens /dev/net/tun: 0666 on a usual host, 0600
# on CI's machines.
chmod 0666 /dev/net/tun
# Rootless podman's default storage here is vfs (a full copy per layer: GBs per image);
# the kernel's overlay works unprivileged since Linux 5.13.
home=$(getent passwd "$user" | cut -d: -f6)
conf="$home/.config/containers/storage.conf"
kernel=$(uname -r | cut -d- -f1)
if [ ! -f "$conf" ] && [ "$(printf '5.13\n%s\n' "$kernel" | sort -V | head -n1)" = 5.13 ]; then
  install -d -o "$user" -g "$user" "$home/.config" "$home/.config/containers"
  printf '[storage]\ndriver = "overlay"\n' >"$conf"
  chown "$user:" "$conf"
fi
runuser -l "$user" -c 'podman info --format "rootless podman {{.Host.Security.Rootless}}, storage {{.Store.GraphDriverName}}"'
if [ "$#" -gt 0 ]; then
  # By ID, not by tag: a store a former build filled holds the same tags on other images.
  inspect="podman image inspect --format {{.Id}} $*"
  if [ "$(runuser -l "$user" -c "$inspect" 2>/dev/null)" != "$($inspect)" ]; then
    podman save -m "$@" | runuser -l "$user" -c 'podman load' | tail -5
    # The images those tags named before, now untagged: GBs of the user's disk.
    runuser -l "$user" -c 'podman image prune -f' >/dev/null
  fi
fi
