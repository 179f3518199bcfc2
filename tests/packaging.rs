//! The install tree and the systemd units: `make install` lays down a file-system-shaped tree
//! an image recipe can use as is, every unit passes `systemd-analyze verify`, and the service's
//! `systemd-analyze security` exposure of each stays within the target (printed as a report).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{BIN, run};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `make -s install VARS... BIN=<the test build>` from the repository.
fn make_install(vars: &[String]) -> Output {
    run(Command::new("make")
        .current_dir(repo())
        .args(["-s", "--no-print-directory", "install"])
        .args(vars)
        .arg(format!("BIN={BIN}"))
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

/// The units in the repository's systemd/ directory.
fn repo_units() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("systemd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".service"))
        .collect();
    v.sort();
    assert!(
        v.contains(&"twinlease.service".to_string()) && v.contains(&"twinlease-console@.service".to_string()),
        "{v:?}"
    );
    v
}

/// Installs with an absolute PREFIX (no DESTDIR), so the units name a binary that exists and
/// systemd-analyze can check them on this host.
fn install_under_prefix(dir: &Path) -> PathBuf {
    make_install(&[format!("PREFIX={}/usr", dir.display()), format!("SYSCONFDIR={}/etc", dir.display())]);
    dir.join("usr/lib/systemd/system")
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    let units = install_under_prefix(dir.path());
    for u in repo_units() {
        let path = units.join(&u);
        let installed = std::fs::read_to_string(&path).unwrap();
        assert!(
            installed.contains(&format!("{}/usr/bin/twinlease ", dir.path().display())),
            "PREFIX not applied to {u}"
        );
        let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
        let said = text(&out);
        // Complaints about the host's own units are not ours; any line naming ours is.
        let ours: Vec<&str> = said.lines().filter(|l| l.contains("twinlease")).collect();
        assert!(out.status.success() && ours.is_empty(), "systemd-analyze verify {u}:\n{said}");
        eprintln!("systemd-analyze verify {u}: OK");
    }
}

#[test]
fn service_exposure_score_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let units = install_under_prefix(dir.path());
    let mut report = Vec::new();
    for u in repo_units() {
        let out =
            run(Command::new("systemd-analyze").args(["security", "--offline=yes", "--no-pager"]).arg(units.join(&u)));
        let said = text(&out);
        let line = said
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or_else(|| panic!("no score for {u}:\n{said}"))
            .to_string();
        let score: f64 = line
            .split(':')
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("cannot read {line:?}"));
        report.push((u.clone(), score, line.split(':').nth(1).unwrap().trim().to_string()));
        assert!(score <= 2.5, "{u} exposure {score} > 2.5 (target: OK):\n{said}");
    }
    for (u, _, l) in &report {
        eprintln!("systemd-analyze security {u}: {l}");
    }
}

/// The console unit takes its VT like a getty, with no capabilities, read-only, and gives the
/// VT back on stop (its command line runs in `tests/tui.rs`).
#[test]
fn the_console_unit_owns_its_vt_without_capabilities() {
    let unit = std::fs::read_to_string(repo().join("systemd/twinlease-console@.service")).unwrap();
    let settings: Vec<&str> = unit.lines().filter(|l| !l.starts_with('#')).collect();
    for want in [
        "ExecStart=/usr/bin/twinlease tui --read-only --config /etc/twinlease/twinlease.toml",
        "Conflicts=getty@%i.service",
        "TTYPath=/dev/%I",
        "StandardInput=tty",
        "TTYReset=yes",
        "TTYVHangup=yes",
        "TTYVTDisallocate=yes",
        "Environment=TERM=linux",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX",
        "User=twinlease",
    ] {
        assert!(settings.contains(&want), "twinlease-console@.service lacks {want:?}");
    }
}

#[test]
fn install_lays_down_a_tree_an_image_recipe_uses() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    make_install(&[format!("DESTDIR={}", root.display())]);

    let expect = [
        ("usr/bin/twinlease", 0o755),
        ("usr/lib/systemd/system/twinlease.service", 0o644),
        ("usr/lib/systemd/system/twinlease-console@.service", 0o644),
        ("usr/lib/sysusers.d/twinlease.conf", 0o644),
        ("usr/lib/tmpfiles.d/twinlease.conf", 0o644),
        ("etc/twinlease/twinlease.toml", 0o640),
        ("usr/share/doc/twinlease/twinlease.example.toml", 0o644),
        ("usr/share/doc/twinlease/IMAGE.md", 0o644),
    ];
    for (p, m) in expect {
        assert_eq!(mode(&root.join(p)), m, "{p}");
    }
    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/twinlease.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/twinlease run --config /etc/twinlease/twinlease.toml"),
        "DESTDIR must not leak into the units:\n{unit}"
    );
    assert!(!unit.contains(&root.display().to_string()));

    // The default configuration is the commented example, and it is valid.
    let cfg = root.join("etc/twinlease/twinlease.toml");
    assert_eq!(
        std::fs::read_to_string(&cfg).unwrap(),
        std::fs::read_to_string(repo().join("config/twinlease.example.toml")).unwrap()
    );
    run(Command::new(root.join("usr/bin/twinlease")).arg("check-config").arg(&cfg));

    // What an image recipe does next: user, directories, enablement, offline.
    let out = run(Command::new(repo().join("image/apply.sh")).arg(&root));
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let user = passwd
        .lines()
        .find(|l| l.starts_with("twinlease:"))
        .unwrap_or_else(|| panic!("no twinlease user:\n{passwd}\n{}", text(&out)));
    let uid: u32 = user.split(':').nth(2).unwrap().parse().unwrap();
    assert!(user.ends_with(":/var/lib/twinlease:/usr/sbin/nologin"), "{user}");
    let state = std::fs::metadata(root.join("var/lib/twinlease")).unwrap();
    assert_eq!((state.uid(), state.permissions().mode() & 0o7777), (uid, 0o750));
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    let gid: u32 =
        group.lines().find(|l| l.starts_with("twinlease:")).unwrap().split(':').nth(2).unwrap().parse().unwrap();
    assert_eq!(std::fs::metadata(&cfg).unwrap().gid(), gid, "tmpfiles gives the config to the service group");
    let wants = root.join("etc/systemd/system/multi-user.target.wants/twinlease.service");
    assert_eq!(std::fs::read_link(&wants).unwrap(), Path::new("/usr/lib/systemd/system/twinlease.service"));

    // A second install keeps the box's own configuration.
    std::fs::write(&cfg, "# site config\n").unwrap();
    let out = make_install(&[format!("DESTDIR={}", root.display())]);
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), "# site config\n");
    assert!(root.join("etc/twinlease/twinlease.toml.default").exists(), "{}", text(&out));
}
