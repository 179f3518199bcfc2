#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twinlease::fuzzing::peer_link(data));
