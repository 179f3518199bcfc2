# twinlease — two commands do everything on a fresh machine:
#   make demo   a throwaway pair of boxes in network namespaces: election, sync, failover, a real client
#   make test   every test (installs missing Debian packages first)
# Further targets live in mk/*.mk (packaging, arbiter, benchmarks).

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never
# Where built artifacts go. Set here, before mk/*.mk are read in name order: a rule's
# prerequisites are expanded as the file is read, and mk/bench.mk comes before mk/packaging.mk.
DIST := dist

.PHONY: all build deps test test-unit demo bench clean

all: build

build:
	$(CARGO) build --release

deps:
	@scripts/ensure-deps.sh

# Unit + property tests, then the integration tests (real clients in namespaces, run in parallel).
test: deps
	$(CARGO) test --all-targets --features fault-injection --no-fail-fast -- --test-threads=$${TEST_THREADS:-8}
	@if [ "$(PACKAGING_TESTS)" != 0 ]; then $(MAKE) --no-print-directory test-packaging; fi
	@if [ "$(IMAGE_TESTS)" != 0 ]; then $(MAKE) --no-print-directory test-image; fi

test-unit:
	$(CARGO) test --lib

demo: deps
	$(CARGO) build --release --quiet
	@bash scripts/demo.sh target/release/twinlease

# The shipped static binary (make static) beside the bench build and Kea, then instructions per
# lease of the shipped binary under callgrind against bench/instructions-baseline.txt (+10 %).
bench: static
	@scripts/ensure-deps.sh scripts/apt-deps.txt scripts/apt-deps-bench.txt
	$(CARGO) build --profile bench-fast --quiet
	@setsid -w bash bench/dhcp-ladder.sh target/bench-fast/twinlease dist/twinlease-x86_64
	@bash bench/plot.sh ladder bench/results/bench.tsv bench/results/bench.svg "make bench: one box, side by side"
	@echo "(aarch64: dist/twinlease-aarch64 runs here only under qemu-user emulation, whose CPU figures say nothing about an arm64 box; not benchmarked)"
	@setsid -w bash bench/instructions.sh dist/twinlease-x86_64 bench/instructions-baseline.txt
	@if [ "$(PAIR)" = 1 ]; then $(MAKE) --no-print-directory bench-pair; \
	else echo "(pair mode, before-ack sync vs Kea HA: make bench-pair, or make bench PAIR=1)"; fi

clean:
	$(CARGO) clean

-include mk/*.mk
