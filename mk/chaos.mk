# The chaos soak (see README, "Chaos soak"): tests/chaos.rs for CHAOS_CYCLES cycles (default
# 200, about 25 minutes here) with a fresh seed each run unless CHAOS_SEED is given; it prints a
# line per cycle and ends with "CHAOS SUMMARY". make test runs the same test for 20 cycles.

CHAOS_CYCLES ?= 200

.PHONY: chaos

chaos: deps
	@seed=$${CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	CHAOS_CYCLES=$(CHAOS_CYCLES) CHAOS_SEED=$$seed $(CARGO) test --features fault-injection --test chaos -- --nocapture
