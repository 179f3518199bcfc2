#!/usr/bin/env bash
# Builds the firmware disk image without mounting anything:
#   scripts/build-image.sh ARCH BIN OUT.img
# 1. the Debian bootstrap (image/bootstrap/mmdebstrap.sh), cached as a tar keyed by a hash of
#    image/bootstrap/ (packages, hooks, module lists): in $BUILD/ARCH/cache and $IMAGE_CACHE (outside the
#    tree, shared by every checkout on the machine);
# 2. the twinlease layer (make install, image/apply.sh, image/rootfs/) on a copy of it;
# 3. each partition from that tree: squashfs (root-a), ext4 -d (data; empty root-b),
#    FAT via mtools (ESP with systemd-boot, kernel, initrd, loader entries);
# 4. the GPT disk (sfdisk) with the partitions written in at their offsets (dd).
# VERSION (default: Cargo's version +g<commit>) goes into the root as /usr/lib/twinlease/release
# and beside slot A's kernel; BUNDLE_PUBKEY is the public key update bundles must be signed with
# (README "Updating"). scripts/build-bundle.sh reuses this build's root tree, kernel and initrd.
set -euo pipefail
arch="${1:?usage: build-image.sh ARCH BIN OUT.img}"
bin="${2:?binary}"
out="${3:?output image}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$repo/build/image}/$arch"
cache_out="${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/twinlease}"
suite="${SUITE:-bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}"

version="${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)+g$(git -C "$repo" rev-parse --short HEAD)}"
pubkey="${BUNDLE_PUBKEY:?BUNDLE_PUBKEY: the public key (PEM) update bundles are checked against}"

# Partition sizes (MiB). The root slots hold the squashfs; the budget is the slot size. The ESP
# holds both slots' kernel and initrd: arm64 kernels are uncompressed (~32 MiB each, below).
ESP_MIB=64 ROOT_MIB=160 DATA_MIB=256
case "$arch" in
    x86_64)  debarch=amd64 efi=x64 console=ttyS0 ;;
    aarch64) debarch=arm64 efi=aa64 console=ttyAMA0 ESP_MIB=128 ;;
    *) echo "unknown ARCH $arch (x86_64 or aarch64)"; exit 1 ;;
esac
step() { printf '%s [%4ss] %s\n' "$(date +%T)" "$SECONDS" "$*"; }
mkdir -p "$build" "$build/cache" "$cache_out"

# ---- 1. bootstrap (cached) ----------------------------------------------------------------
bs="$repo/image/bootstrap"
key="$( (echo "$suite $mirror $debarch"; cat "$bs"/*) | sha256sum | cut -c1-16)"
tarball="$build/cache/bootstrap-$arch-$key.tar"
if [[ ! -s "$tarball" && -s "$cache_out/bootstrap-$arch-$key.tar" ]]; then
    step "bootstrap: from $cache_out"
    ln -f "$cache_out/bootstrap-$arch-$key.tar" "$tarball" 2>/dev/null ||
        { cp "$cache_out/bootstrap-$arch-$key.tar" "$tarball.part" && mv "$tarball.part" "$tarball"; }
fi
if [[ ! -s "$tarball" ]]; then
    step "bootstrap: mmdebstrap $suite $debarch (cache key $key)"
    rm -f "$build"/cache/bootstrap-"$arch"-*.tar
    "$bs/mmdebstrap.sh" "$debarch" "$suite" "$mirror" "$build/cache/partial.tar"
    mv "$build/cache/partial.tar" "$tarball"
    rm -f "$cache_out"/bootstrap-"$arch"-*.tar
    # A hard link when the cache is on the same file system, else a copy.
    ln -f "$tarball" "$cache_out/bootstrap-$arch-$key.tar" 2>/dev/null ||
        { cp "$tarball" "$cache_out/partial.tar" && mv "$cache_out/partial.tar" "$cache_out/bootstrap-$arch-$key.tar"; }
fi

# ---- 2. the twinlease layer ---------------------------------------------------------------
step "root: unpack bootstrap, install twinlease"
root="$build/rootfs"
rm -rf "$root" && mkdir -p "$root"
tar -xpf "$tarball" -C "$root" --numeric-owner
make -s -C "$repo" install DESTDIR="$root" BIN="$(realpath "$bin")" >/dev/null
# The site configuration comes from the ESP at boot; the example is only documentation.
rm -f "$root/etc/twinlease/twinlease.toml"
rmdir "$root/etc/twinlease"
cp -a "$repo/image/rootfs/." "$root/"
chown -R 0:0 "$root/etc/systemd" "$root/usr/lib/twinlease"
"$repo/image/apply.sh" "$root" >/dev/null 2>&1
systemd-sysusers --root="$root" "$root/usr/lib/sysusers.d/twinlease-image.conf" >/dev/null 2>&1
systemctl --root="$root" enable systemd-networkd.service twinlease-provision.service \
    twinlease-boot-report.service twinlease-ssh-keys.service \
    twinlease-console-status.service >/dev/null 2>&1
systemctl --root="$root" enable ssh.service >/dev/null 2>&1
# The configuration lives on data (keys, passwords); /etc is read-only.
ln -sfn /var/lib/twinlease-site "$root/etc/twinlease"
: > "$root/etc/machine-id"
echo twinlease > "$root/etc/hostname"
ln -sfn /run/systemd/resolve/resolv.conf "$root/etc/resolv.conf"
# No interactive first-boot questions on a box nobody sits at; nothing to update in /etc.
# No package updates on an appliance either (it is reflashed, slot by slot).
for unit in systemd-firstboot.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer; do
    ln -sfn /dev/null "$root/etc/systemd/system/$unit"
done
touch "$root/etc/.updated" "$root/var/.updated"
# Updates (README "Updating"): the bundle key, boot assessment, the admin's update socket and
# the partner's update port (a pair roll).
install -D -m 0644 "$pubkey" "$root/usr/share/twinlease/bundle-key.pem"
systemctl --root="$root" enable twinlease-update-health.service twinlease-update-bless.service \
    twinlease-update.socket twinlease-update-peer.socket >/dev/null 2>&1

kver="$(ls "$root/lib/modules" | sort -V | tail -1)"
# /var lives on the data partition: its first contents are the bootstrap's /var.
step "data: ext4 from /var"
vardir="$build/var"
rm -rf "$vardir" && mv "$root/var" "$vardir" && mkdir -m 0755 "$root/var"
mkdir -p -m 0750 "$vardir/lib/twinlease-site" && chgrp "$(awk -F: '$1=="twinlease"{print $3}' "$root/etc/group")" "$vardir/lib/twinlease-site"
mkdir -p "$vardir/log/journal" "$root/efi"

# ---- 3. partitions ------------------------------------------------------------------------
parts="$build/parts"
rm -rf "$parts" && mkdir -p "$parts"
step "root-a: squashfs"
# The release file is a pseudo file (mksquashfs -p): a bundle re-squashes the same tree with
# its own version (scripts/build-bundle.sh). Time stamps come from SOURCE_DATE_EPOCH (mksquashfs
# refuses -mkfs-time/-all-time beside it); -e takes every argument after it, so it comes last.
echo "$version" > "$build/version"
mksquashfs "$root" "$parts/root-a.sqfs" -comp zstd -Xcompression-level 6 -noappend -quiet \
    -p "usr/lib/twinlease/release f 444 0 0 echo $version" -e boot >/dev/null
root_bytes=$(stat -c %s "$parts/root-a.sqfs")
if ((root_bytes > ROOT_MIB * 1024 * 1024)); then
    echo "root file system is $((root_bytes / 1024 / 1024)) MiB, over the ${ROOT_MIB} MiB slot"; exit 1
fi
E2FS_OPTS=(-q -F -t ext4 -E "root_owner=0:0" -U clear)
truncate -s "${DATA_MIB}M" "$parts/data.ext4"
mkfs.ext4 "${E2FS_OPTS[@]}" -L data -d "$vardir" "$parts/data.ext4"
truncate -s "${ROOT_MIB}M" "$parts/root-b.ext4"
mkfs.ext4 "${E2FS_OPTS[@]}" -L root-b "$parts/root-b.ext4"

step "esp: FAT with systemd-boot"
esp="$parts/esp.vfat"
truncate -s "${ESP_MIB}M" "$esp"
mkfs.vfat -F 32 -n ESP -i 7117e45e "$esp" >/dev/null
cmdline="root=PARTLABEL=root-a rootfstype=squashfs ro console=$console,115200 net.ifnames=0 panic=10 quiet"
echo "$cmdline" > "$build/cmdline"
cp "$root/boot/vmlinuz-$kver" "$build/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$build/initrd.img"
# systemd-boot loads only uncompressed arm64 kernels; Debian's arm64 vmlinuz is gzip.
if [[ "$(head -c2 "$build/vmlinuz" | od -An -tx1 | tr -d ' ')" == 1f8b ]]; then
    gunzip -c < "$build/vmlinuz" > "$build/vmlinuz.raw" && mv "$build/vmlinuz.raw" "$build/vmlinuz"
fi
loader="$build/loader"
rm -rf "$loader" && mkdir -p "$loader/entries"
# No default: systemd-boot starts the first entry in its order, the newest generation that is
# good or has tries left (src/update/slots.rs); the factory slot is generation 1.
printf 'timeout 0\neditor no\n' > "$loader/loader.conf"
printf 'title twinlease %s (slot a)\nversion %s\nlinux /slot-a/vmlinuz\ninitrd /slot-a/initrd.img\noptions %s\n' \
    "$version" "$version" "$cmdline" > "$loader/entries/twinlease-1-a.conf"
printf 'arch %s\nversion %s\n' "$arch" "$version" > "$loader/manifest"
export MTOOLS_SKIP_CHECK=1
mmd -i "$esp" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries ::/slot-a ::/twinlease
mcopy -i "$esp" "$root/usr/lib/systemd/boot/efi/systemd-boot$efi.efi" "::/EFI/BOOT/BOOT${efi^^}.EFI"
mcopy -i "$esp" "$loader/loader.conf" ::/loader/
mcopy -i "$esp" "$loader/entries/twinlease-1-a.conf" ::/loader/entries/
mcopy -i "$esp" "$loader/manifest" ::/slot-a/
mcopy -i "$esp" "$build/vmlinuz" "$build/initrd.img" ::/slot-a/
printf 'Site configuration for this box: see "Flashing a box" in the twinlease README.\n' > "$build/README.txt"
mcopy -i "$esp" "$build/README.txt" ::/twinlease/

# ---- 4. the disk --------------------------------------------------------------------------
step "disk: GPT"
first=1 # MiB
esp_at=$first root_a_at=$((esp_at + ESP_MIB)) root_b_at=$((root_a_at + ROOT_MIB)) data_at=$((root_b_at + ROOT_MIB))
total=$((data_at + DATA_MIB + 1))
rm -f "$out.part"
truncate -s "${total}M" "$out.part"
esp_type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B
root_type=$([[ $arch == x86_64 ]] && echo 4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709 || echo B921B045-1DF0-41C3-AF44-4C6F280D3FAE)
linux_type=0FC63DAF-8483-4772-8E79-3D69D8477DE4
sfdisk --quiet "$out.part" <<SFDISK
label: gpt
label-id: 7D1F3A5C-2B1E-4C4B-9E0A-5A17E1EA5E00
start=${esp_at}MiB, size=${ESP_MIB}MiB, type=$esp_type, name=esp
start=${root_a_at}MiB, size=${ROOT_MIB}MiB, type=$root_type, name=root-a
start=${root_b_at}MiB, size=${ROOT_MIB}MiB, type=$root_type, name=root-b
start=${data_at}MiB, size=${DATA_MIB}MiB, type=$linux_type, name=data
SFDISK
for p in "esp.vfat $esp_at" "root-a.sqfs $root_a_at" "root-b.ext4 $root_b_at" "data.ext4 $data_at"; do
    set -- $p
    dd if="$parts/$1" of="$out.part" bs=1M seek="$2" conv=notrunc,sparse status=none
done
mv "$out.part" "$out"
step "compress: zstd"
zstd -q -f -T0 -12 "$out" -o "$out.zst"
{
    echo "image $(basename "$out"): $(du -m --apparent-size "$out" | cut -f1) MiB raw, $(( $(stat -c %s "$out.zst") / 1024 / 1024 )) MiB as .zst ($(stat -c %s "$out.zst") bytes)"
    echo "esp     ${ESP_MIB} MiB  kernel $(( $(stat -c %s "$build/vmlinuz") / 1024 )) KiB, initrd $(( $(stat -c %s "$build/initrd.img") / 1024 )) KiB"
    echo "root-a  ${ROOT_MIB} MiB  squashfs $((root_bytes / 1024 / 1024)) MiB ($root_bytes bytes; budget ${ROOT_MIB} MiB)"
    echo "root-b  ${ROOT_MIB} MiB  empty ext4 (the slot updates write: make bundle)"
    echo "data    ${DATA_MIB} MiB  ext4: /var (journal, leases, site configuration, ssh host keys)"
    echo "kernel  $kver"
    echo "version $version"
} | tee "$out.sizes"
step "done"
