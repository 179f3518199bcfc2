//! The election's command line: `arbiter schema`, `arbiter init`, `whois`, and what they say
//! when a configuration has no arbiter.

mod common;

use std::process::Command;

use common::BIN;

fn config(dir: &std::path::Path, arbiter: &str) -> std::path::PathBuf {
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        common::config_text(
            dir,
            &format!("[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.10-198.18.0.20\"]\n{arbiter}"),
        ),
    )
    .unwrap();
    path
}

#[test]
fn commands_need_an_arbiter_section() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    for args in [&["whois"][..], &["arbiter", "init"], &["arbiter", "schema"]] {
        let out = Command::new(BIN).args(args).arg("--config").arg(&cfg).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no [arbiter] section"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn schema_init_and_whois_on_a_sqlite_arbiter() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &format!(
            "[arbiter]\nurl = \"sqlite://{}/arb.db\"\nutype = \"cli/dhcp\"\ninterval_ms = 200\ntimeout_ms = 1000\n",
            dir.path().display()
        ),
    );
    let out = Command::new(BIN).args(["arbiter", "schema", "--config"]).arg(&cfg).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("CREATE TABLE IF NOT EXISTS twinlease_heartbeat"));
    for _ in 0..2 {
        let out = Command::new(BIN).args(["arbiter", "init", "--config"]).arg(&cfg).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("arbiter ready"));
    }
    let out = Command::new(BIN).args(["whois", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no primary"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = Command::new(BIN).args(["whois", "--json", "--config"]).arg(&cfg).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["primary"], serde_json::Value::Null);
    assert_eq!(v["utype"], "cli/dhcp");
}

#[test]
fn help_lists_the_election_commands() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("whois") && help.contains("arbiter"), "{help}");
}
