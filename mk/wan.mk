# The failure table with real processes (see README, "Failover"): tests/wan.rs with the WAN
# flapping for WAN_FLAP_SECS (default here 60 s; make test runs 12 s). Each row prints a
# "WAN ROW" line: new clients served / tried and the time to serve.

WAN_FLAP_SECS ?= 60

.PHONY: test-wan-long

test-wan-long: deps
	WAN_FLAP_SECS=$(WAN_FLAP_SECS) $(CARGO) test --features fault-injection --test wan -- --nocapture --test-threads=1
