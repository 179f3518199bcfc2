//! `make demo` stays true: runs `scripts/demo.sh` against the test build (two boxes, a SQLite
//! arbiter, udhcpc, kill -9 of the active, a wiped box catching up) and checks that it passes,
//! that the client kept its address across the failover, and that it removed its lab.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;

/// The demo promises to finish well under two minutes; a debug build on a loaded machine gets
/// this much before the test stops it (SIGTERM: the script's trap still cleans up).
const LIMIT: Duration = Duration::from_secs(110);

#[test]
fn make_demo_fails_over_and_keeps_the_clients_address() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new("bash")
        .arg(repo.join("scripts/demo.sh"))
        .arg(BIN)
        .current_dir(repo)
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            let _ = child.wait();
            panic!("the demo ran over {LIMIT:?}:\n{}", std::fs::read_to_string(out.path()).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(out.path()).unwrap();
    eprintln!("{text}");
    assert!(status.success(), "the demo failed ({status})");
    for expected in [
        "same address kept",
        "catch-up with the partner complete",
        "gets its reservation",
        "stays standby",
        "the lab (processes, namespaces",
    ] {
        assert!(text.contains(expected), "the demo's output lacks {expected:?}");
    }
    // "failover: box-X active N ms after the kill (T = 2000 ms; bound T + I + 1 s = 3500 ms)"
    let line = text.lines().find(|l| l.contains("failover: ")).expect("a failover line");
    let ms: u64 = line
        .split(" active ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(ms <= 3500, "{line}");
    // Nothing left behind: the namespaces are named after the script's pid.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&ns.stdout)
        .lines()
        .filter(|l| l.starts_with("tl-demo-") && l.split_whitespace().next().unwrap().ends_with(&format!("-{pid}")))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
