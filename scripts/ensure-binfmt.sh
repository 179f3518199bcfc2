#!/usr/bin/env bash
# Makes sure the kernel runs ARCH binaries through qemu-user (binfmt_misc), which mmdebstrap
# needs to run a foreign Debian architecture's maintainer scripts:
#   scripts/ensure-binfmt.sh ARCH     (e.g. aarch64; qemu-user-static ships the registration)
# On a host without systemd as init (a container, a CI runner) nothing has mounted binfmt_misc or
# loaded qemu-user-static's binfmt.d entries, so both happen here; elsewhere this is a no-op.
set -euo pipefail
arch="${1:?usage: ensure-binfmt.sh ARCH}"
misc=/proc/sys/fs/binfmt_misc
[[ -e "$misc/qemu-$arch" ]] && exit 0
[[ -e "$misc/register" ]] || mount -t binfmt_misc binfmt_misc "$misc"
conf=/usr/lib/binfmt.d/qemu-$arch.conf
[[ -e "$conf" ]] || { echo "$conf missing (install qemu-user-static)"; exit 1; }
/usr/lib/systemd/systemd-binfmt "$conf"
[[ -e "$misc/qemu-$arch" ]] || { echo "binfmt_misc did not take qemu-$arch"; exit 1; }
echo "binfmt_misc: qemu-$arch registered"
