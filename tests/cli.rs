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

/// A configuration with one small subnet and its state directory under `dir`.
fn one_subnet_config(dir: &std::path::Path) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    let subnet = "[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.10-198.18.0.20\"]\n";
    std::fs::write(&cfg, common::config_text(dir, subnet)).unwrap();
    cfg
}

#[test]
fn leases_without_a_database_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_subnet_config(dir.path());
    let out = Command::new(BIN).args(["leases", "--config"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no lease database"));
}

#[test]
fn check_config_reads_the_peer_key_as_run_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("peer.key");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        common::config_text(
            dir.path(),
            &format!(
                "[[subnet]]\ncidr = \"198.18.0.0/24\"\n[peer]\nlisten = \"198.18.1.1:6767\"\n\
                 address = \"198.18.1.2:6767\"\nkey_file = \"{}\"\n",
                key.display()
            ),
        ),
    )
    .unwrap();
    let check = |extra: &[&str]| Command::new(BIN).arg("check-config").args(extra).arg(&cfg).output().unwrap();
    let refused = |why: &str| {
        let out = check(&[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{why}: {err}");
        assert!(err.contains(&format!("{}:9:12: ", cfg.display())) && err.contains(why), "{err}");
    };
    refused("cannot read key_file");
    let out = check(&["--skip-secret-files"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("secret files not read"));

    std::fs::write(&key, "").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused("is empty");
    std::fs::write(&key, "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused("has mode 0644; it must not be readable by group or others");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = check(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn check_config_refuses_a_huge_pool_by_arithmetic() {
    let f = repo("config/invalid/pool-2-pow-30.toml");
    let out = Command::new(BIN).arg("check-config").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the pools hold 1073741822 addresses"), "{err}");
}

#[test]
fn leases_piped_into_head_ends_quietly() {
    use twinlease::lease::{Binding, ClientKey, LeaseState, Transition};
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let body = "[[subnet]]\ncidr = \"198.18.0.0/16\"\npools = [\"198.18.1.0-198.18.8.255\"]\n";
    std::fs::write(&cfg, common::config_text(dir.path(), body)).unwrap();
    // Enough rows that the output outgrows the pipe long after `head` has gone.
    let (mut store, _) = twinlease::store::LeaseStore::open(&dir.path().join("state/leases.db"), 1).unwrap();
    let rows: Vec<Transition> = (0..2000u32)
        .map(|i| {
            let mut b = Binding::fresh(std::net::Ipv4Addr::from(0xc612_0100 + i));
            b.state = LeaseState::Leased;
            b.owner = Some(ClientKey::from_hw(1, &[2, 0, 0, 0, (i >> 8) as u8, i as u8]));
            b.expires = 4_000_000_000;
            b.version = 1;
            Transition { expect_version: 0, expect_owner: None, new: b }
        })
        .collect();
    store.commit(&rows.iter().collect::<Vec<_>>()).unwrap();
    drop(store);
    let script = format!("{BIN} leases --config {} | head -1; echo \"status=${{PIPESTATUS[0]}}\"", cfg.display());
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("ADDRESS"), "{stdout}");
    // Ended by SIGPIPE (128 + 13) or done before the pipe filled; never a panic (101) or abort (134).
    assert!(stdout.contains("status=141") || stdout.contains("status=0"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `leases --json` writes its array row by row: the same text as a pretty-printed array, in
/// address order, free addresses only with `--all`, and `[]` for an empty table.
#[test]
fn leases_json_is_one_array_of_the_stored_leases() {
    use twinlease::lease::{Binding, ClientKey, LeaseState, Transition};
    use twinlease::store::LeaseStore;
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_subnet_config(dir.path());
    let (mut store, _) = LeaseStore::open(&dir.path().join("state").join("leases.db"), 0).unwrap();
    let json = |extra: &[&str]| {
        let out = Command::new(BIN).args(["leases", "--json", "--config"]).arg(&cfg).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
        // Laid out as serde_json pretty-prints the whole array (scripts grep `"address": "…"`).
        assert_eq!(String::from_utf8_lossy(&out.stdout), serde_json::to_string_pretty(&v).unwrap() + "\n");
        v
    };
    assert_eq!(json(&[]), serde_json::json!([]));
    let binding = |last: u8, state| {
        let mac = [2, 0, 0, 0, 0, last];
        Transition {
            expect_version: 0,
            expect_owner: None,
            new: Binding {
                addr: [198, 18, 0, last].into(),
                state,
                owner: Some(ClientKey::from_hw(1, &mac)),
                expires: 4_000_000_000,
                cltt: 1,
                version: 1,
                term: 1,
                seq: 1,
                hw: mac.to_vec(),
                hostname: None,
            },
        }
    };
    let ts = [binding(12, LeaseState::Leased), binding(11, LeaseState::Free), binding(10, LeaseState::Leased)];
    store.commit(&ts.iter().collect::<Vec<_>>()).unwrap();
    drop(store);
    let addrs = |v: serde_json::Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|l| l["address"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(addrs(json(&[])), ["198.18.0.10", "198.18.0.12"]);
    assert_eq!(addrs(json(&["--all"])), ["198.18.0.10", "198.18.0.11", "198.18.0.12"]);
}
