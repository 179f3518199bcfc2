# Election arbiter targets (see README, "Arbiter").
#   make bench-arbiter   N branch pairs against the local PostgreSQL at I = 1 s
#   make model-check     the election model check with the deep (slow) bounds too
#   make test-arbiter    the election unit tests, the arbiter battery and the fault tests

ARBITER_PAIRS ?= 5000
ARBITER_SECONDS ?= 20
ARBITER_CONNECTIONS ?= 16
ARBITER_URL ?= postgres://root@127.0.0.1:5432/test

.PHONY: bench-arbiter model-check test-arbiter

bench-arbiter: deps
	$(CARGO) build --profile bench-fast --quiet --example arbiter_bench
	target/bench-fast/examples/arbiter_bench --pairs $(ARBITER_PAIRS) --seconds $(ARBITER_SECONDS) --connections $(ARBITER_CONNECTIONS) --url $(ARBITER_URL)

model-check:
	$(CARGO) test --profile bench-fast --lib election::model -- --include-ignored --nocapture

test-arbiter: deps
	$(CARGO) test --lib election
	$(CARGO) test --test arbiter_battery --test election_faults
