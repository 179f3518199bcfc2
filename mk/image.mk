# The firmware image: a raw GPT disk to flash onto a box (README "Flashing a box").
#
#   make image [ARCH=x86_64|aarch64]  dist/twinlease-<arch>.img and .img.zst (+ .img.sizes)
#   make test-image                   the x86_64 image under QEMU (tests/image.rs); `make test`
#                                     runs it after the cargo tests (IMAGE_TESTS=0 skips it)
#   make test-image-full              also one box through OVMF + systemd-boot, and a missing and
#                                     an unreadable key (three more boots, ~7 min here)
#   make test-image-aarch64           the aarch64 image under qemu-system-aarch64 (virt, TCG):
#                                     one box through AAVMF + systemd-boot serving a client; not
#                                     in make test (an emulated arm64 boot is slow here)
#
# Built without mounts from Debian packages (scripts/build-image.sh); the bootstrap is cached in
# build/image/<arch>/cache and in IMAGE_CACHE (default $XDG_CACHE_HOME/twinlease, else
# ~/.cache/twinlease), keyed by a hash of image/bootstrap/. Tools: scripts/apt-deps-image.txt.

.PHONY: image image-deps test-image test-image-full test-image-aarch64

IMAGE_TESTS ?= 1

image-deps:
	@scripts/ensure-deps.sh scripts/apt-deps-image.txt $(if $(filter aarch64,$(ARCH)),scripts/apt-deps-image-aarch64.txt)
	$(if $(filter aarch64,$(ARCH)),@scripts/ensure-binfmt.sh aarch64)

# The binary is always rebuilt through cargo (a no-op when nothing changed), never taken stale.
image: image-deps bundle-key $(if $(filter aarch64,$(ARCH)),cross,static)
	@start=$$(date +%s); \
	BUNDLE_PUBKEY=$(BUNDLE_PUBKEY) scripts/build-image.sh $(ARCH) $(DIST)/twinlease-$(ARCH) $(DIST)/twinlease-$(ARCH).img && \
	echo "image build: $$(( $$(date +%s) - start )) s" | tee $(DIST)/image-build-time-$(ARCH).txt

# The image tests in make test; test-image-full runs every one.
IMAGE_FULL_ONLY := --skip boot_through_uefi_and_systemd_boot --skip missing_or_unreadable_key_is_refused_on_the_console

test-image:
	@$(MAKE) --no-print-directory image ARCH=x86_64
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-x86_64.img $(CARGO) test --features fault-injection --test image -- --ignored $(IMAGE_FULL_ONLY) --test-threads=$${IMAGE_TEST_THREADS:-1}

test-image-full:
	@$(MAKE) --no-print-directory image ARCH=x86_64
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-x86_64.img $(CARGO) test --features fault-injection --test image -- --ignored --test-threads=$${IMAGE_TEST_THREADS:-1}

test-image-aarch64:
	@$(MAKE) --no-print-directory image ARCH=aarch64
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-aarch64.img $(CARGO) test --features fault-injection --test image -- --ignored --exact boot_through_uefi_and_systemd_boot --test-threads=1
