# Packaging: two static binaries, the install tree an image recipe reuses, and their checks.
#
#   make static        dist/twinlease-x86_64   (x86_64-unknown-linux-musl, cargo + musl-gcc)
#   make cross         dist/twinlease-aarch64  (aarch64-unknown-linux-musl, cargo-zigbuild)
#   make check-static  file/ldd checks of both + size report (dist/SIZES.txt)
#   make test-cross    the aarch64 binary under qemu-aarch64-static: version, check-config, DHCP
#   make test-packaging all of the above from scratch; `make test` runs it after the cargo tests
#                      (PACKAGING_TESTS=0 skips it: two release builds, ~8 min cold on 2 cores)
#   make install DESTDIR=… PREFIX=… [ARCH=x86_64|aarch64 | BIN=path]
#
# Tools are fetched only when missing: Debian packages from scripts/apt-deps-packaging.txt, the
# rustup targets, and Zig (PyPI `ziglang`) with cargo-zigbuild (PyPI) in a virtualenv under
# .tools/ (ignored by git).

X86_TARGET    := x86_64-unknown-linux-musl
ARM_TARGET    := aarch64-unknown-linux-musl
TARGET_DIR    ?= $(or $(CARGO_TARGET_DIR),target)
TOOLS         := $(CURDIR)/.tools
VENV          := $(TOOLS)/venv
PYTHON        ?= python3
ZIGLANG_VERSION        ?= 0.17.1
CARGO_ZIGBUILD_VERSION ?= 0.24.0

# Install layout (FHS; systemd's own directories under PREFIX/lib).
PREFIX      ?= /usr
BINDIR      ?= $(PREFIX)/bin
SYSCONFDIR  ?= /etc
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
DOCDIR      ?= $(PREFIX)/share/doc/twinlease
ARCH        ?= $(shell uname -m)
BIN         ?= $(DIST)/twinlease-$(ARCH)

.PHONY: tls-guard packaging-deps static cross check-static test-cross test-packaging install uninstall packaging-tools rust-targets zig-tools size-report

# ---- tools -------------------------------------------------------------------------------

rust-targets:
	@for t in $(X86_TARGET) $(ARM_TARGET); do \
	    rustup target list --installed | grep -qx "$$t" || rustup target add "$$t"; \
	done

$(VENV)/bin/cargo-zigbuild:
	@command -v $(PYTHON) >/dev/null || { echo "python3 (with venv) is needed to fetch Zig from PyPI"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check "ziglang==$(ZIGLANG_VERSION)" "cargo-zigbuild==$(CARGO_ZIGBUILD_VERSION)"

zig-tools: $(VENV)/bin/cargo-zigbuild

packaging-deps:
	@scripts/ensure-deps.sh scripts/apt-deps-packaging.txt

packaging-tools: packaging-deps rust-targets zig-tools

# ---- binaries ----------------------------------------------------------------------------

# TLS must be rustls with the ring provider: aws-lc and OpenSSL need toolchains (cmake, a C
# library per target) that break these builds, and two rustls providers make rustls panic.
tls-guard:
	@for c in aws-lc-rs aws-lc-sys openssl-sys; do \
	    if $(CARGO) tree --locked -e normal,build -i "$$c" >/dev/null 2>&1; then \
	        echo "$$c is in the dependency graph (cargo tree -i $$c): select rustls' ring provider in every crate"; exit 1; \
	    fi; \
	done

# Bundled SQLite (and, once TLS lands, ring) are C: musl-gcc from Debian's musl-tools compiles
# them for the x86_64 musl target; the Rust side links against Rust's own musl.
static: packaging-deps rust-targets tls-guard
	@mkdir -p $(DIST)
	@start=$$(date +%s); \
	CC_x86_64_unknown_linux_musl=musl-gcc $(CARGO) build --release --locked --target $(X86_TARGET) && \
	cp $(TARGET_DIR)/$(X86_TARGET)/release/twinlease $(DIST)/twinlease-x86_64 && \
	echo "x86_64 build: $$(( $$(date +%s) - start )) s" | tee $(DIST)/build-time-x86_64.txt
	@scripts/check-static.sh $(DIST)/twinlease-x86_64 x86-64

# Debian's aarch64 gcc brings glibc headers, which do not link against Rust's musl 1.2.5;
# zig cc targets musl itself. The first run fills zig's cache (~1 min).
cross: packaging-deps rust-targets zig-tools tls-guard
	@mkdir -p $(DIST)
	@start=$$(date +%s); \
	PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/cargo-zigbuild build --release --locked --target $(ARM_TARGET) && \
	cp $(TARGET_DIR)/$(ARM_TARGET)/release/twinlease $(DIST)/twinlease-aarch64 && \
	echo "aarch64 build: $$(( $$(date +%s) - start )) s" | tee $(DIST)/build-time-aarch64.txt
	@scripts/check-static.sh $(DIST)/twinlease-aarch64 aarch64

$(DIST)/twinlease-x86_64:
	$(MAKE) static

$(DIST)/twinlease-aarch64:
	$(MAKE) cross

# The file/ldd checks and the size report for whatever is in dist/ (builds what is missing).
check-static: $(DIST)/twinlease-x86_64 $(DIST)/twinlease-aarch64
	@scripts/check-static.sh $(DIST)/twinlease-x86_64 x86-64
	@scripts/check-static.sh $(DIST)/twinlease-aarch64 aarch64
	@scripts/size-report.sh $(DIST)

size-report: check-static

# ---- proof that the aarch64 binary runs --------------------------------------------------

test-cross: packaging-deps $(DIST)/twinlease-aarch64
	@scripts/check-static.sh $(DIST)/twinlease-aarch64 aarch64
	scripts/test-cross.sh $(DIST)/twinlease-aarch64

# Everything a firmware engineer runs, checked: both builds (always run through cargo, so a dependency
# that breaks the static or cross build fails here), file/ldd, sizes, the aarch64 run.
PACKAGING_TESTS ?= 1
test-packaging: static cross
	@scripts/size-report.sh $(DIST)
	scripts/test-cross.sh $(DIST)/twinlease-aarch64 $(DIST)/twinlease-x86_64

# ---- install tree ------------------------------------------------------------------------

# Units name /usr/bin/twinlease; a different BINDIR is written into the installed copies.
install: $(BIN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(DOCDIR)
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/twinlease
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/twinlease
	for u in systemd/twinlease.service systemd/twinlease-console@.service; do \
	    sed -e 's|/usr/bin/twinlease|$(BINDIR)/twinlease|g' -e 's|/etc/twinlease/|$(SYSCONFDIR)/twinlease/|g' "$$u" > $(DESTDIR)$(UNITDIR)/$$(basename "$$u"); \
	    chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename "$$u"); \
	done
	install -m 0644 systemd/twinlease.sysusers $(DESTDIR)$(SYSUSERSDIR)/twinlease.conf
	sed -e 's|/etc/twinlease/|$(SYSCONFDIR)/twinlease/|g' systemd/twinlease.tmpfiles > $(DESTDIR)$(TMPFILESDIR)/twinlease.conf
	chmod 0644 $(DESTDIR)$(TMPFILESDIR)/twinlease.conf
	@# An existing configuration is never overwritten; the default goes beside it.
	if [ -e $(DESTDIR)$(SYSCONFDIR)/twinlease/twinlease.toml ]; then \
	    install -m 0640 config/twinlease.example.toml $(DESTDIR)$(SYSCONFDIR)/twinlease/twinlease.toml.default; \
	    echo "kept $(DESTDIR)$(SYSCONFDIR)/twinlease/twinlease.toml; new default in twinlease.toml.default"; \
	else \
	    install -m 0640 config/twinlease.example.toml $(DESTDIR)$(SYSCONFDIR)/twinlease/twinlease.toml; \
	fi
	install -m 0644 config/twinlease.example.toml $(DESTDIR)$(DOCDIR)/twinlease.example.toml
	install -m 0644 image/README.md $(DESTDIR)$(DOCDIR)/IMAGE.md

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/twinlease $(DESTDIR)$(UNITDIR)/twinlease.service $(DESTDIR)$(UNITDIR)/twinlease-console@.service \
	      $(DESTDIR)$(SYSUSERSDIR)/twinlease.conf $(DESTDIR)$(TMPFILESDIR)/twinlease.conf
	rm -rf $(DESTDIR)$(DOCDIR)
	@echo "left $(DESTDIR)$(SYSCONFDIR)/twinlease and the state directory in place"
