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

/// The peer-link seeds that are message bodies (first byte 2) decode, each to the kind it is
/// named after: after a protocol change that left them behind, the fuzzer would start from
/// inputs the decoder only refuses.
#[test]
fn the_peer_message_seeds_decode_to_their_kind() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/peer_link");
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let Some((2, body)) = data.split_first().map(|(m, b)| (*m, b)) else { continue };
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let m = twinlease::sync::protocol::decode(body).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.name(), name, "{} decodes to another kind", path.display());
        kinds.push(name);
    }
    kinds.sort();
    let every_kind = [
        "acks",
        "catch-up-done",
        "digest",
        "heartbeat",
        "heartbeat-ack",
        "hello",
        "updates",
        "vote-answer",
        "vote-ask",
        "vote-release",
    ];
    assert_eq!(kinds, every_kind, "one seed per peer message kind");
}
