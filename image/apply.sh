#!/usr/bin/env bash
# Finishes a `make install DESTDIR=ROOT` tree for first boot, offline:
#   image/apply.sh ROOT
# creates the twinlease user and group in ROOT/etc/{passwd,group}, the state directory with its
# owner, and enables twinlease.service and the console on tty2 (multi-user.target.wants symlinks).
set -euo pipefail
root="${1:?usage: image/apply.sh ROOT}"
root="$(cd "$root" && pwd)"
lib=usr/lib
[[ -e "$root/$lib/sysusers.d/twinlease.conf" ]] || { echo "no twinlease install under $root (run make install DESTDIR=$root)"; exit 1; }
systemd-sysusers --root="$root" "$root/$lib/sysusers.d/twinlease.conf"
systemd-tmpfiles --root="$root" --create "$root/$lib/tmpfiles.d/twinlease.conf"
systemctl --root="$root" enable twinlease.service twinlease-console@tty2.service
