#!/usr/bin/env bash
# An update bundle from the last `make image` of ARCH (README "Updating"; format in
# src/update/bundle.rs):
#   scripts/build-bundle.sh ARCH OUT.bundle [broken]
# VERSION (default: the image's) goes into the root as /usr/lib/twinlease/release; the root tree
# is the image's, squashed again when the version differs. BUNDLE_KEY is the Ed25519 private key
# (PEM) that signs the manifest. `broken` makes a deliberately broken build for the rollback
# test: /usr/bin/twinlease refuses `run` (every other subcommand works).
set -euo pipefail
arch="${1:?usage: build-bundle.sh ARCH OUT.bundle [broken]}"
out="${2:?output bundle}"
broken="${3:-}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$repo/build/image}/$arch"
key="${BUNDLE_KEY:?BUNDLE_KEY: the private key (PEM) that signs bundles}"
[[ -s "$build/version" && -d "$build/rootfs" ]] || { echo "no image build in $build (make image ARCH=$arch)"; exit 1; }
version="${VERSION:-$(cat "$build/version")}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}"
work="$(mktemp -d "$build/bundle.XXXXXX")"
trap 'rm -rf "$work"' EXIT

root="$build/parts/root-a.sqfs"
if [[ -n "$broken" || "$version" != "$(cat "$build/version")" ]]; then
    pseudo=(-p "usr/lib/twinlease/release f 444 0 0 echo $version")
    exclude=(boot)
    if [[ -n "$broken" ]]; then
        printf '#!/bin/sh\n# A deliberately broken build (scripts/build-bundle.sh broken): the daemon never starts.\n%s\n%s\n' \
            'case "$1" in run) echo "twinlease: deliberately broken build" >&2; exit 70;; esac' \
            'exec /usr/lib/twinlease/twinlease.real "$@"' > "$work/wrapper"
        pseudo+=(-p "usr/bin/twinlease f 755 0 0 cat $work/wrapper"
                 -p "usr/lib/twinlease/twinlease.real f 755 0 0 cat $build/rootfs/usr/bin/twinlease")
        exclude+=(usr/bin/twinlease)
    fi
    root="$work/root.sqfs"
    # -e takes every argument after it: it comes last.
    mksquashfs "$build/rootfs" "$root" -comp zstd -Xcompression-level 6 -noappend -quiet \
        "${pseudo[@]}" -e "${exclude[@]}" >/dev/null
fi

manifest="$work/manifest"
{
    echo "format 1"
    echo "arch $arch"
    echo "version $version"
    for p in "root $root" "kernel $build/vmlinuz" "initrd $build/initrd.img"; do
        set -- $p
        echo "payload $1 $(stat -c %s "$2") $(sha256sum "$2" | cut -d' ' -f1)"
    done
} > "$manifest"
openssl pkeyutl -sign -inkey "$key" -rawin -in "$manifest" -out "$work/signature"
[[ $(stat -c %s "$work/signature") == 64 ]] || { echo "$key: not an Ed25519 key (the signature is not 64 bytes)"; exit 1; }

mkdir -p "$(dirname "$out")"
{
    printf 'TWINLEASE-BUNDLE 1\n'
    perl -e 'print pack("N", shift)' "$(stat -c %s "$manifest")"
    cat "$manifest" "$work/signature" "$root" "$build/vmlinuz" "$build/initrd.img"
} > "$out.part"
mv "$out.part" "$out"
echo "bundle $(basename "$out"): $version, $(( $(stat -c %s "$out") / 1024 / 1024 )) MiB ($(stat -c %s "$out") bytes): root $(( $(stat -c %s "$root") / 1024 )) KiB, kernel $(( $(stat -c %s "$build/vmlinuz") / 1024 )) KiB, initrd $(( $(stat -c %s "$build/initrd.img") / 1024 )) KiB"
