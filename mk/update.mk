# Safe updates (README "Updating"): signed bundles for the root slot that is not running.
#
#   make bundle [ARCH=…] [VERSION=…]  dist/twinlease-<arch>-<version>.bundle from the last
#                                     make image of ARCH (built first), signed with BUNDLE_KEY
#   make test-update                  tests/update.rs: the x86_64 image under QEMU through OVMF
#                                     and systemd-boot, updated, rolled back, refusing bad
#                                     bundles, then a pair rolled onto a new version under client
#                                     load (slow under TCG: not in make test)
#   make test-update-aarch64          the same test's single box on the aarch64 image
#                                     (qemu-system-aarch64 virt, TCG, AAVMF + systemd-boot): bad
#                                     bundles refused, a newer aarch64 bundle installed with
#                                     --reboot, slot b marked good on the new version, the leases
#                                     kept; one VM (slower still: not in make test)
#
# BUNDLE_KEY is an Ed25519 private key (PEM); by default a development key is generated under
# build/keys/. A product key is given by path (make image bundle BUNDLE_KEY=/secure/product.pem):
# the image trusts the public half of the key it was built with.

.PHONY: bundle bundle-key test-update test-update-aarch64

BUNDLE_DEV_KEY := build/keys/bundle-dev.pem
BUNDLE_KEY     ?= $(BUNDLE_DEV_KEY)
BUNDLE_PUBKEY  := build/keys/$(notdir $(basename $(BUNDLE_KEY))).pub.pem
VERSION        ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)+g$(shell git rev-parse --short HEAD)
export VERSION

bundle-key:
	@if [ ! -e "$(BUNDLE_KEY)" ]; then \
	    if [ "$(BUNDLE_KEY)" != "$(BUNDLE_DEV_KEY)" ]; then echo "BUNDLE_KEY $(BUNDLE_KEY) does not exist"; exit 1; fi; \
	    mkdir -p $(dir $(BUNDLE_DEV_KEY)) && (umask 077 && openssl genpkey -algorithm ed25519 -out $(BUNDLE_DEV_KEY)) && \
	    echo "generated the development bundle key $(BUNDLE_DEV_KEY)"; \
	fi
	@mkdir -p build/keys && openssl pkey -in "$(BUNDLE_KEY)" -pubout -out $(BUNDLE_PUBKEY)

bundle: image
	@start=$$(date +%s); \
	BUNDLE_KEY=$(BUNDLE_KEY) scripts/build-bundle.sh $(or $(ARCH),$(shell uname -m)) $(DIST)/twinlease-$(or $(ARCH),$(shell uname -m))-$(VERSION).bundle && \
	echo "bundle build: $$(( $$(date +%s) - start )) s"

UPDATE_NEXT := $(VERSION).next
# The newer bundle the update tests install: the last image of arch $(1), another version.
next_bundle = BUNDLE_KEY=$(BUNDLE_KEY) VERSION=$(UPDATE_NEXT)$(2) scripts/build-bundle.sh $(1) $(DIST)/twinlease-$(1)-$(UPDATE_NEXT)$(2).bundle $(3)

test-update:
	@$(MAKE) --no-print-directory image ARCH=x86_64
	$(call next_bundle,x86_64)
	$(call next_bundle,x86_64,-broken,broken)
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-x86_64.img \
	TWINLEASE_BUNDLE=$(CURDIR)/$(DIST)/twinlease-x86_64-$(UPDATE_NEXT).bundle \
	TWINLEASE_BROKEN_BUNDLE=$(CURDIR)/$(DIST)/twinlease-x86_64-$(UPDATE_NEXT)-broken.bundle \
	TWINLEASE_BUNDLE_KEY=$(abspath $(BUNDLE_KEY)) \
	$(CARGO) test --features fault-injection --test update -- --ignored --nocapture --test-threads=$${UPDATE_TEST_THREADS:-3} --skip a_pair_
	@# The pair roll alone: its clients' waits are the figure, so nothing else runs beside it.
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-x86_64.img \
	TWINLEASE_BUNDLE=$(CURDIR)/$(DIST)/twinlease-x86_64-$(UPDATE_NEXT).bundle \
	$(CARGO) test --features fault-injection --test update -- --ignored --nocapture a_pair_

# The single-box update on aarch64; the VM follows the image's architecture (tests/common/vm.rs).
test-update-aarch64:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory image ARCH=aarch64 && \
	$(call next_bundle,aarch64) && \
	TWINLEASE_IMAGE=$(CURDIR)/$(DIST)/twinlease-aarch64.img \
	TWINLEASE_BUNDLE=$(CURDIR)/$(DIST)/twinlease-aarch64-$(UPDATE_NEXT).bundle \
	TWINLEASE_BUNDLE_KEY=$(abspath $(BUNDLE_KEY)) \
	$(CARGO) test --features fault-injection --test update -- --ignored --nocapture --test-threads=1 \
	    --exact bad_bundles_are_refused_then_a_newer_one_boots_marked_good_with_the_leases_kept && \
	echo "test-update-aarch64: $$(( $$(date +%s) - start )) s"
