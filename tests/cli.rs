//! The command line as a user meets it: check-config, version, leases, help.

mod common;

use std::process::Command;

use common::BIN;

fn repo(p: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

#[test]
fn check_config_accepts_the_examples_and_rejects_with_a_location() {
    for f in ["config/twinlease.example.toml", "config/minimal.toml", "config/relay-only.toml"] {
        let out = Command::new(BIN).args(["check-config"]).arg(repo(f)).output().unwrap();
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(": OK ("));
    }
    let bad = repo("config/invalid/overlapping-pools.toml");
    let out = Command::new(BIN).args(["check-config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:8:10: pool 198.18.0.150-198.18.0.160 overlaps", bad.display())), "{err}");
    assert!(err.contains("fix: make the pools disjoint"), "{err}");
    let out = Command::new(BIN).args(["check-config", "/nonexistent/twinlease.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn version_and_help() {
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("twinlease {}", env!("CARGO_PKG_VERSION")));
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "check-config", "leases", "version"] {
        assert!(help.contains(cmd), "--help lists {cmd}");
    }
}

#[test]
fn leases_without_a_database_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, common::config_text(dir.path(), "[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.10-198.18.0.20\"]\n")).unwrap();
    let out = Command::new(BIN).args(["leases", "--config"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no lease database"));
}
