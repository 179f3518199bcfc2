#!/bin/sh
# mmdebstrap --customize-hook: runs after every package is installed. Removes what must differ
# per box or is not needed on an appliance: host keys (made at first boot on data), apt lists,
# and every kernel module not named in modules-keep.txt.
set -eu
root="$1"
here="$(cd "$(dirname "$0")" && pwd)"
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old
for moddir in "$root"/lib/modules/*; do
    kver="$(basename "$moddir")"
    keep="$(mktemp)"
    (cd "$moddir/kernel" && grep -v '^#' "$here/modules-keep.txt" | while read -r pat; do
        [ -n "$pat" ] && find . -path "./$pat" -name '*.ko*'
    done) | sort -u > "$keep"
    (cd "$moddir/kernel" && find . -name '*.ko*' | sort) | comm -23 - "$keep" | while read -r m; do
        rm -f "$moddir/kernel/$m"
    done
    find "$moddir/kernel" -type d -empty -delete
    rm -f "$keep"
    chroot "$root" depmod -a "$kver"
done
