# Pair benchmark (see README, "Benchmark: the pair").
#   make bench-pair        one run, side by side at each offered rate: a twinlease pair (before-ack
#                          sync), one twinlease box, Kea HA hot-standby pairs (single-
#                          and multi-threaded) and one Kea (memfile);
#                          then the full catch-up of 65,536 leases (tests/pair.rs, ignored test)
#   make bench PAIR=1      the single-box ladder, then the above
#   make bench-control     50 status clients on the control socket during perfdhcp at 2,000/s
#   make bench-tui         the console's idle CPU: `twinlease tui` in tmux on an idle box for 60 s
# RATES="…" STEP_SECS=… (≤ 30) KEA=0 KEA_SINGLE=0 KEA_HA_MT=0 PARTNER_CPU=… CPU_QUOTA=… KEEP=1 CATCH_UP=0 tune it.

.PHONY: bench-pair bench-catch-up bench-control bench-tui

bench-pair:
	@scripts/ensure-deps.sh scripts/apt-deps.txt scripts/apt-deps-bench.txt
	$(CARGO) build --profile bench-fast --quiet
	@setsid -w bash bench/pair-ladder.sh target/bench-fast/twinlease
	@bash bench/plot.sh ladder bench/results/bench-pair.tsv bench/results/bench-pair.svg "make bench-pair: pairs side by side (serving box CPU)"
	@if [ "$(CATCH_UP)" != 0 ]; then $(MAKE) --no-print-directory bench-catch-up; fi

# The ignored benchmark test: a standby with an empty store catches up 65,536 leases.
bench-catch-up:
	$(CARGO) test --profile bench-fast --quiet --test pair --no-run
	@log=$$(mktemp); \
	if $(CARGO) test --profile bench-fast --quiet --test pair -- --ignored --nocapture --exact bench_full_catch_up_of_65536_leases > "$$log" 2>&1; then \
	    grep -F 'full catch-up of 65,536 leases' "$$log"; \
	    echo "(target: ≤ 2 s; load average now $$(cut -d' ' -f1-3 /proc/loadavg))"; rm -f "$$log"; \
	else \
	    cat "$$log"; rm -f "$$log"; exit 1; \
	fi

# The ignored benchmark test: 50 status clients asking 20 times a second each while perfdhcp runs
# at 2,000 leases/s, against perfdhcp alone in the same run (tests/control_load.rs).
bench-control:
	@scripts/ensure-deps.sh scripts/apt-deps.txt scripts/apt-deps-bench.txt
	$(CARGO) test --profile bench-fast --quiet --test control_load --no-run
	$(CARGO) test --profile bench-fast --quiet --test control_load -- --ignored --nocapture --exact \
	    bench_fifty_status_clients_at_2000_per_second 2>&1 | grep -F CONTROL

# The ignored benchmark test: the console showing an idle box's dashboard, its CPU time read from
# /proc (TUI_IDLE_SECS=60 by default).
bench-tui:
	@scripts/ensure-deps.sh scripts/apt-deps.txt
	$(CARGO) test --profile bench-fast --quiet --test tui --no-run
	$(CARGO) test --profile bench-fast --quiet --test tui -- --ignored --nocapture --exact \
	    bench_console_idle_cpu 2>&1 | grep -F "TUI idle"

# Scaling (bench/scale.sh): pools and stores of 254, 65,536 and 1,048,576 leases (SIZES="…"):
# start-up to READY, RSS, reaper CPU per expired lease, `leases --json` time, for the shipped
# binary; then the pair's full catch-up of 65,536 leases (CATCH_UP=0 skips it); SVG plot.
.PHONY: bench-scale bench-instructions
bench-scale: $(DIST)/twinlease-x86_64
	@setsid -w bash bench/scale.sh $(DIST)/twinlease-x86_64
	@bash bench/plot.sh scale bench/results/scale.tsv bench/results/scale.svg
	@if [ "$(CATCH_UP)" != 0 ]; then $(MAKE) --no-print-directory bench-catch-up; fi

# Instructions per lease of the shipped binary alone (UPDATE_BASELINE=1 stores the figure).
bench-instructions: $(DIST)/twinlease-x86_64
	@setsid -w bash bench/instructions.sh $(DIST)/twinlease-x86_64 bench/instructions-baseline.txt
