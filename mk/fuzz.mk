# Fuzzing (see README, "Fuzzing").
#   make fuzz        each target for FUZZ_SECONDS (libFuzzer through cargo-fuzz on the nightly
#                    toolchain; without either, the stable mutation loop of examples/fuzz_stable.rs)
#   make fuzz-stable the stable mutation loop, whatever is installed
# New inputs libFuzzer finds go to fuzz/work/<target> (not committed); the committed seeds are
# fuzz/corpus/<target>, which tests/fuzz_corpus.rs replays in `make test`. A crash is saved
# under fuzz/artifacts/<target>/: fix it, and add the input to fuzz/corpus/<target>/.

FUZZ_SECONDS ?= 300
FUZZ_TARGETS := dhcp peer_link config arbiter_answer
FUZZ_SEED ?= 24301
# Stop a target after this many executions (0: only FUZZ_SECONDS bounds it).
FUZZ_RUNS ?= 0
# No sanitizer by default: the fuzzed paths are safe Rust (parsers, decisions; no unsafe block and
# no C library on them), so AddressSanitizer would find nothing there and cost half the rate.
# FUZZ_SANITIZER=address brings it back.
FUZZ_SANITIZER ?= none

.PHONY: fuzz fuzz-stable

fuzz: SHELL := /bin/bash

fuzz:
	@if rustup toolchain list 2>/dev/null | grep -q '^nightly' && cargo +nightly fuzz --version >/dev/null 2>&1; then \
		cd fuzz && cargo +nightly fuzz build -O -s $(FUZZ_SANITIZER) && \
		for t in $(FUZZ_TARGETS); do \
			mkdir -p work/$$t; \
			cargo +nightly fuzz run -O -s $(FUZZ_SANITIZER) $$t work/$$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -runs=$(if $(filter 0,$(FUZZ_RUNS)),-1,$(FUZZ_RUNS)) -print_final_stats=1 2>&1 \
				| tee work/$$t.log | grep -E '^(Done|==|SUMMARY|stat::number_of_executed_units)' ; \
			test $${PIPESTATUS[0]} -eq 0 || exit 1; \
			echo "$$t: $$(grep -oE 'stat::number_of_executed_units: *[0-9]+' work/$$t.log | grep -oE '[0-9]+$$') executions in $$(grep -oE 'runs in [0-9]+' work/$$t.log | grep -oE '[0-9]+$$') s without a crash (libFuzzer)"; \
		done; \
	else \
		echo "no nightly toolchain with cargo-fuzz (rustup toolchain install nightly; cargo install cargo-fuzz): stable mutation loop"; \
		$(MAKE) --no-print-directory fuzz-stable; \
	fi

fuzz-stable:
	$(CARGO) build --profile bench-fast --quiet --example fuzz_stable
	target/bench-fast/examples/fuzz_stable $(FUZZ_SECONDS) $(FUZZ_SEED)
