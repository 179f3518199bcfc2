#!/bin/sh
# mmdebstrap --setup-hook: runs before any package is installed, so the kernel's postinst builds
# the initramfs with these settings. ROOT is the directory being bootstrapped.
set -eu
root="$1"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$root/etc/initramfs-tools/conf.d" "$root/etc/initramfs-tools/hooks"
# Only the modules listed by the hook below (the chroot's hardware says nothing about a box's).
printf 'MODULES=list\nCOMPRESS=zstd\n' > "$root/etc/initramfs-tools/conf.d/twinlease.conf"
{
    echo '#!/bin/sh'
    echo '# twinlease image: the drivers needed to find root-a/root-b by partition label.'
    echo 'case "$1" in prereqs) exit 0;; esac'
    echo '. /usr/share/initramfs-tools/hook-functions'
    grep -v '^#' "$here/initramfs-modules.txt" | while read -r m; do
        [ -n "$m" ] && echo "manual_add_modules $m"
    done
    echo 'force_load squashfs'
} > "$root/etc/initramfs-tools/hooks/twinlease"
chmod 0755 "$root/etc/initramfs-tools/hooks/twinlease"
