//! Every fuzz target's entry point over its saved corpus (`fuzz/corpus/<target>/`): the seeds
//! and every input that once crashed a target. Runs on stable in `make test`; `make fuzz`
//! looks for new inputs.

use std::path::Path;

use twinlease::fuzzing::TARGETS;

#[test]
fn every_target_survives_its_saved_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        inputs.sort();
        assert!(inputs.len() >= 3, "{name}: a corpus of {} inputs", inputs.len());
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                panic!("{name} fails on {}", input.display());
            }
        }
    }
}
