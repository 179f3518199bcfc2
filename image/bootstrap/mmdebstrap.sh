#!/usr/bin/env bash
# The Debian bootstrap of the image: image/bootstrap/mmdebstrap.sh DEBARCH SUITE MIRROR OUT.tar
# Packages from packages-*.txt, no recommends, no documentation or translations; setup.sh
# configures the initramfs before the kernel is installed, customize.sh trims the result.
# scripts/build-image.sh caches OUT.tar under a hash of this directory.
set -euo pipefail
debarch="$1" suite="$2" mirror="$3" out="$4"
here="$(cd "$(dirname "$0")" && pwd)"
case "$debarch" in amd64) arch=x86_64 ;; arm64) arch=aarch64 ;; *) echo "unknown $debarch"; exit 1 ;; esac
packages="$(cat "$here/packages-common.txt" "$here/packages-$arch.txt" | grep -v '^#' | xargs | tr ' ' ,)"
exec mmdebstrap --quiet --variant=minbase --arch="$debarch" --components=main \
    --include="$packages" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --setup-hook="$here/setup.sh \"\$1\"" \
    --customize-hook="$here/customize.sh \"\$1\"" \
    "$suite" "$out" "$mirror"
