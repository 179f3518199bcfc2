//! The stable-toolchain fallback of `make fuzz`, for machines without a nightly toolchain or
//! cargo-fuzz: a bounded mutation loop per target, driven by a seeded PRNG over the saved
//! corpus (bit flips, byte overwrites, interesting values, truncation, insertion, splicing).
//! No coverage feedback, so it finds less than libFuzzer; same targets, same corpus.
//!
//! `make fuzz-stable`, or `cargo run --profile bench-fast --example fuzz_stable -- [SECONDS_PER_TARGET] [SEED]`

use std::path::Path;
use std::time::{Duration, Instant};

use twinlease::fuzzing::TARGETS;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&corpus[rng.below(corpus.len())]);
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len());
        match rng.below(6) {
            0 if !out.is_empty() => out[at] ^= 1 << rng.below(8),
            1 if !out.is_empty() => out[at] = rng.next() as u8,
            2 if !out.is_empty() => out[at] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)],
            3 => out.truncate(at),
            4 => out.insert(at.min(out.len()), rng.next() as u8),
            _ => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len());
                out.truncate(at);
                out.extend_from_slice(&other[from..]);
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x5eed);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (name, target) in TARGETS {
        let corpus: Vec<Vec<u8>> =
            std::fs::read_dir(root.join(name)).unwrap().map(|e| std::fs::read(e.unwrap().path()).unwrap()).collect();
        let (mut rng, mut input) = (Rng(seed | 1), Vec::new());
        let (start, mut execs) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_secs(secs) {
            for _ in 0..256 {
                mutate(&mut rng, &corpus, &mut input);
                if std::panic::catch_unwind(|| target(&input)).is_err() {
                    let path = format!("fuzz-crash-{name}-{execs}");
                    std::fs::write(&path, &input).unwrap();
                    eprintln!("{name}: crash after {execs} executions, input saved to {path}");
                    std::process::exit(1);
                }
                execs += 1;
            }
        }
        println!("{name}: {execs} executions in {secs} s without a crash (stable mutation loop)");
    }
}
