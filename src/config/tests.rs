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

/// Loads `f` as `check-config` does: the file, then the secret files it names.
fn check_like_check_config(f: &Path, local: &LocalAddrs) -> Result<Config, ConfigError> {
    Config::load_with(f, local).and_then(|c| c.check_secret_files().map(|()| c))
}

#[test]
fn every_invalid_example_fails_with_its_expected_error() {
    let files = toml_files(&repo_config_dir().join("invalid"));
    assert!(files.len() >= 10);
    for f in files {
        // Lossy: one example is not UTF-8 on purpose; its header lines are.
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap()).into_owned();
        let header = |name: &str| text.lines().find_map(|l| l.strip_prefix(name));
        let expect = header("# expect: ").expect("# expect: line");
        let line: usize = header("# expect-line: ").expect("# expect-line:").parse().unwrap();
        let column: Option<usize> = header("# expect-column: ").map(|c| c.parse().unwrap());
        let err = check_like_check_config(&f, &declared_local(&text))
            .expect_err(&format!("{} should be rejected", f.display()));
        let shown = err.to_string();
        assert!(shown.contains(expect), "{}: error {shown:?} lacks {expect:?}", f.display());
        assert!(shown.contains("fix: "), "{}: error {shown:?} says nothing about what to change", f.display());
        match err {
            ConfigError::Invalid { line: got, column: got_column, path, .. } => {
                assert_eq!(got, line, "{}: wrong line in {shown:?}", f.display());
                if let Some(c) = column {
                    assert_eq!(got_column, c, "{}: wrong column in {shown:?}", f.display());
                }
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
    assert_eq!(dynamic.len(), 119, "100 + 20 pool addresses minus one exclusion");
    assert!(!dynamic.contains(&Ipv4Addr::new(198, 18, 0, 150)));
    assert!(c.reservations[0].is_alias_group());
    assert_eq!(c.reservations[0].on_alias_busy, AliasBusyPolicy::HoldOff);
}

#[test]
fn default_t1_t2_follow_the_lease() {
    let text =
        "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.10-198.18.0.20']\nlease_secs=800\n";
    let c = Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap();
    assert_eq!((c.subnets[0].renew_secs, c.subnets[0].rebind_secs), (400, 700));
}

#[test]
fn pool_may_contain_the_server_address_when_excluded() {
    let text = "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.199']\nexclude=['198.18.0.120']\n";
    Config::parse(Path::new("t.toml"), text, &fake_local()).unwrap();
}

/// A /15 pool (131,070 addresses) with `excludes` single addresses excluded, every sixth one.
fn big_pool_text(excludes: usize) -> String {
    let list: Vec<String> = (0..excludes)
        .map(|i| format!("'{}'", Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 3)) + 6 * i as u32)))
        .collect();
    format!(
        "[node]\nname='x'\n[dhcp]\nmax_pool_addresses=131072\n[[subnet]]\ncidr='198.18.0.0/15'\n\
         pools=['198.18.0.1-198.19.255.254']\nexclude=[{}]\n",
        list.join(",")
    )
}

#[test]
fn excludes_cost_one_range_step_each_not_one_per_pool_address() {
    let excludes = 20_000;
    let text = big_pool_text(excludes);
    let before = steps_taken();
    let c = Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap();
    let parse_steps = steps_taken() - before;
    // Merging the pool (1 range) and the exclusions (20,000), then one walk over both.
    assert!(parse_steps >= excludes as u64, "the step counter missed the exclusions ({parse_steps} steps)");
    assert!(parse_steps <= 3 * (1 + excludes as u64), "{parse_steps} steps for 1 pool and {excludes} exclusions");

    let s = &c.subnets[0];
    assert_eq!(s.dynamic().ranges().len(), excludes + 1);
    assert_eq!(s.dynamic().len(), 131_070 - excludes as u64);
    let before = steps_taken();
    let mut count = 0u64;
    let mut previous = None;
    for a in s.dynamic_addresses() {
        assert!(previous < Some(a), "addresses come in ascending order, each once");
        previous = Some(a);
        count += 1;
    }
    assert_eq!(count, s.dynamic().len());
    assert_eq!(steps_taken(), before, "enumerating the pool consults no exclusion");
    assert_eq!(c.pool_addresses(), count);
}

#[test]
fn exclusions_may_overlap_each_other_and_touch_the_pool_ends() {
    let text = "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.10-198.18.0.20','198.18.0.30-198.18.0.40']\n\
                exclude=['198.18.0.10','198.18.0.15-198.18.0.32','198.18.0.18-198.18.0.19','198.18.0.40-198.18.0.41']\n";
    let c = Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap();
    let got: Vec<u8> = c.subnets[0].dynamic_addresses().map(|a| a.octets()[3]).collect();
    assert_eq!(got, [11, 12, 13, 14, 33, 34, 35, 36, 37, 38, 39]);
}

fn naive_difference(pools: &[AddrRange], cut: &[AddrRange]) -> Vec<Ipv4Addr> {
    let cut: std::collections::BTreeSet<Ipv4Addr> = cut.iter().flat_map(AddrRange::iter).collect();
    let all: std::collections::BTreeSet<Ipv4Addr> = pools.iter().flat_map(AddrRange::iter).collect();
    all.difference(&cut).copied().collect()
}

/// Ranges near `base` (wrapping is avoided by the caller's choice of base).
fn ranges_near(base: u32, raw: &[(u32, u32)]) -> Vec<AddrRange> {
    raw.iter()
        .map(|&(a, len)| AddrRange { first: Ipv4Addr::from(base + a), last: Ipv4Addr::from(base + a + len) })
        .collect()
}

proptest::proptest! {
    #[test]
    fn addr_set_difference_matches_the_per_address_one(
        pools in proptest::collection::vec((0u32..200, 0u32..30), 0..8),
        cut in proptest::collection::vec((0u32..200, 0u32..30), 0..12),
        base in proptest::sample::select(vec![0u32, 0xc612_0000, u32::MAX - 230]),
    ) {
        let (pools, cut) = (ranges_near(base, &pools), ranges_near(base, &cut));
        let set = AddrSet::from_ranges(pools.iter().copied()).minus(&AddrSet::from_ranges(cut.iter().copied()));
        let expected = naive_difference(&pools, &cut);
        proptest::prop_assert_eq!(set.iter().collect::<Vec<_>>(), expected.clone());
        proptest::prop_assert_eq!(set.len(), expected.len() as u64);
        for w in set.ranges().windows(2) {
            proptest::prop_assert!(u64::from(u32::from(w[0].last)) + 1 < u64::from(u32::from(w[1].first)), "ranges merged");
        }
        for a in (0..260).map(|i| Ipv4Addr::from(base.wrapping_add(i))) {
            proptest::prop_assert_eq!(set.contains(a), expected.binary_search(&a).is_ok());
        }
    }
}

#[test]
fn the_pool_limit_admits_a_head_office_sized_pool_and_refuses_one_more() {
    let text = |max: u64| {
        format!(
            "[node]\nname='x'\n[dhcp]\nmax_pool_addresses={max}\n[[subnet]]\ncidr='198.16.0.0/12'\n\
             pools=['198.16.0.1-198.31.255.254']\nexclude=['198.16.0.1']\n[[subnet]]\ncidr='198.18.0.0/15'\n"
        )
    };
    let err = Config::parse(Path::new("t.toml"), &text(1 << 20), &LocalAddrs::default())
        .expect_err("the second subnet overlaps the first");
    assert!(err.to_string().contains("subnet 198.18.0.0/15 overlaps subnet 198.16.0.0/12"), "{err}");

    let one_subnet = |max: u64| text(max).replace("[[subnet]]\ncidr='198.18.0.0/15'\n", "");
    let c = Config::parse(Path::new("t.toml"), &one_subnet(1 << 20), &LocalAddrs::default()).unwrap();
    assert_eq!(c.pool_addresses(), (1 << 20) - 3, "a /12 less network, broadcast and one exclusion");
    let err = Config::parse(Path::new("t.toml"), &one_subnet((1 << 20) - 4), &LocalAddrs::default()).unwrap_err();
    assert!(
        err.to_string().contains("the pools hold 1048573 addresses") && err.to_string().contains("= 1048572"),
        "{err}"
    );
}

#[test]
fn the_pool_limit_counts_every_subnet() {
    let text = "[node]\nname='x'\n[dhcp]\nmax_pool_addresses=150\n\
                [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.1-198.18.0.100']\n\
                [[subnet]]\ncidr='198.18.1.0/24'\npools=['198.18.1.1-198.18.1.10','198.18.1.11-198.18.1.70']\n";
    let err = Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap_err();
    let ConfigError::Invalid { line, message, .. } = &err else { panic!("{err}") };
    assert!(message.contains("the pools hold 170 addresses"), "{err}");
    assert_eq!(*line, 10, "points at the second subnet's larger pool: {err}");
}

#[test]
fn a_non_utf8_byte_is_located_by_line_and_character_column() {
    let bytes = b"# caf\xc3\xa9\n[node]\nname = \"\xff\"\n";
    let err = validate::utf8(Path::new("t.toml"), bytes).unwrap_err();
    let ConfigError::Invalid { line, column, message, .. } = &err else { panic!("{err}") };
    assert_eq!((*line, *column, message.as_str()), (3, 9, "byte 0xff is not UTF-8"));
    assert_eq!(validate::utf8(Path::new("t.toml"), b"[node]\n").unwrap(), "[node]\n");
}

mod secret_files {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn write(dir: &Path, name: &str, content: &[u8], mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn with_peer_key(key: &Path) -> Config {
        let text = format!(
            "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\n[peer]\nlisten='198.18.1.1:6767'\n\
             address='198.18.1.2:6767'\nkey_file = '{}'\n",
            key.display()
        );
        Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap()
    }

    fn with_password_file(file: &Path) -> Config {
        let text = format!(
            "[node]\nname='x'\n[[subnet]]\ncidr='198.18.0.0/24'\n[arbiter]\nurl='postgres://t@hq.example/a'\n\
             utype='b/dhcp'\npassword_file = '{}'\n",
            file.display()
        );
        Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap()
    }

    /// The error check-config gives, which must be the one `run` gets from `read`.
    fn refusal(c: &Config, run_reads: impl Fn(&Config) -> Result<(), ConfigError>) -> String {
        let checked = c.check_secret_files().expect_err("check-config refuses it").to_string();
        assert_eq!(run_reads(c).expect_err("run refuses it").to_string(), checked);
        checked
    }

    #[test]
    fn peer_key_is_refused_by_check_config_exactly_as_by_run() {
        let dir = tempfile::tempdir().unwrap();
        let run = |c: &Config| c.peer.as_ref().unwrap().read_key().map(drop);
        let good = write(dir.path(), "good", b"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0\n", 0o600);
        let c = with_peer_key(&good);
        c.check_secret_files().unwrap();
        assert_eq!(c.peer.as_ref().unwrap().read_key().unwrap(), b"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0");

        let cases: [(&str, PathBuf, &str); 6] = [
            ("missing", dir.path().join("absent"), "cannot read key_file"),
            ("world", write(dir.path(), "world", b"c2VjcmV0LXNlY3JldC1zZWNyZXQ=", 0o644), "has mode 0644"),
            ("group", write(dir.path(), "group", b"c2VjcmV0LXNlY3JldC1zZWNyZXQ=", 0o640), "has mode 0640"),
            ("empty", write(dir.path(), "empty", b"", 0o600), "is empty"),
            ("short", write(dir.path(), "short", b"12345678\n", 0o600), "holds 8 bytes; at least 16 are needed"),
            ("directory", dir.path().to_path_buf(), "is not a regular file"),
        ];
        for (what, path, expect) in cases {
            let shown = refusal(&with_peer_key(&path), run);
            assert!(shown.contains(expect), "{what}: {shown}");
            assert!(shown.starts_with("t.toml:8:12: "), "{what}: points at the key_file value: {shown}");
        }
    }

    #[test]
    fn a_fifo_named_as_key_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let shown = refusal(&with_peer_key(&fifo), |c| c.peer.as_ref().unwrap().read_key().map(drop));
        assert!(shown.contains("is not a regular file"), "{shown}");
    }

    #[test]
    fn arbiter_password_file_follows_the_same_rules() {
        let dir = tempfile::tempdir().unwrap();
        let run = |c: &Config| c.arbiter.as_ref().unwrap().read_password().map(drop);
        let good = write(dir.path(), "good", b"arbiter secret\r\n", 0o600);
        assert_eq!(
            with_password_file(&good).arbiter.unwrap().read_password().unwrap().as_deref(),
            Some("arbiter secret")
        );
        for (path, expect) in [
            (write(dir.path(), "world", b"arbiter secret\n", 0o604), "has mode 0604"),
            (write(dir.path(), "blank", b"\n", 0o600), "is empty"),
            (dir.path().join("absent"), "cannot read password_file"),
        ] {
            let shown = refusal(&with_password_file(&path), run);
            assert!(shown.contains(expect), "{shown}");
            assert!(shown.starts_with("t.toml:8:17: "), "points at the password_file value: {shown}");
        }
    }
}
