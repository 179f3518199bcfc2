use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::*;

fn repo_config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
}

/// The host addresses an invalid example is checked against: its `# local: IFACE ADDR/LEN` lines.
fn declared_local(text: &str) -> LocalAddrs {
    LocalAddrs(
        text.lines()
            .filter_map(|l| l.strip_prefix("# local: "))
            .map(|l| {
                let (iface, net) = l.split_once(' ').unwrap();
                (iface.to_string(), net.parse().unwrap())
            })
            .collect(),
    )
}

fn fake_local() -> LocalAddrs {
    declared_local("# local: lan0 198.18.0.120/24")
}

fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_shipped_config_parses() {
    let files = toml_files(&repo_config_dir());
    assert!(files.len() >= 3, "expected the example configs in config/");
    for f in files {
        Config::load_with(&f, &LocalAddrs::default()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

#[test]
fn every_invalid_example_fails_with_its_expected_error() {
    let files = toml_files(&repo_config_dir().join("invalid"));
    assert!(files.len() >= 10);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let expect = text.lines().find_map(|l| l.strip_prefix("# expect: ")).expect("# expect: line");
        let line: usize = text.lines().find_map(|l| l.strip_prefix("# expect-line: ")).expect("# expect-line:").parse().unwrap();
        let err = Config::load_with(&f, &declared_local(&text)).expect_err(&format!("{} should be rejected", f.display()));
        let shown = err.to_string();
        assert!(shown.contains(expect), "{}: error {shown:?} lacks {expect:?}", f.display());
        assert!(shown.contains("fix: "), "{}: error {shown:?} says nothing about what to change", f.display());
        match err {
            ConfigError::Invalid { line: got, path, .. } => {
                assert_eq!(got, line, "{}: wrong line in {shown:?}", f.display());
                assert_eq!(path, f);
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn example_values_arrive_validated() {
    let c = Config::load_with(&repo_config_dir().join("twinlease.example.toml"), &LocalAddrs::default()).unwrap();
    assert_eq!(c.node.name, "branch42-a");
    let s = &c.subnets[0];
    assert_eq!((s.lease_secs, s.renew_secs, s.rebind_secs), (3600, 1800, 3150));
    let dynamic: Vec<Ipv4Addr> = s.dynamic_addresses().collect();
    assert_eq!(dynamic.len(), 99, "100 pool addresses minus one exclusion");
    assert!(!dynamic.contains(&Ipv4Addr::new(198, 18, 0, 150)));
    assert!(c.reservations[0].is_alias_group());
    assert_eq!(c.reservations[0].on_alias_busy, AliasBusyPolicy::HoldOff);
}

#[test]
fn default_t1_t2_follow_the_lease() {
    let text = "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.10-198.18.0.20']\nlease_secs=800\n";
    let c = Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap();
    assert_eq!((c.subnets[0].renew_secs, c.subnets[0].rebind_secs), (400, 700));
}

#[test]
fn pool_may_contain_the_server_address_when_excluded() {
    let text = "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.199']\nexclude=['198.18.0.120']\n";
    Config::parse(Path::new("t.toml"), text, &fake_local()).unwrap();
}
