//! The console on a real pair: `twinlease tui` in tmux on each box of a site (two boxes, a
//! PostgreSQL arbiter, nothing pinned). The standby's dashboard names the active; after kill -9
//! of the active the survivor's console shows itself serving within T + I + 2 s (the console
//! refreshes once a second), where the operator then declares the dead partner down (a capital
//! Y in the dialog) and sees the daemon's answer and its event, while the dead box's console
//! shows the daemon-down banner and still reads its lease store; `q` quits and leaves the terminal as it found it. And the console
//! unit's own command line, as an unprivileged user on a Linux console (TERM=linux), reads the
//! store of a cleanly stopped box it may not write beside.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::site::*;
use common::tmux::Tmux;
use common::*;

/// Runs the console of `site`'s box `i` in session `name`, 100×30.
fn console(tmux: &Tmux, name: &str, site: &Site, i: usize) {
    let srv = site.srv(i);
    let args = [BIN, "tui", "--config", path(&srv.config), "--runtime-dir", path(&srv.runtime_dir)];
    tmux.run(name, (100, 30), &args);
}

#[test]
fn the_console_follows_a_failover_and_quits_cleanly() {
    let mut site = Site::new(0);
    site.start(0);
    site.start(1);
    let a =
        wait_for("a box to win the election", Duration::from_secs(30), || (0..2).find(|&i| site.srv(i).is_active()));
    let b = 1 - a;
    let (name_a, name_b) = (["box-a", "box-b"][a], ["box-a", "box-b"][b]);
    let tmux = Tmux::new();
    console(&tmux, "active", &site, a);
    console(&tmux, "standby", &site, b);

    tmux.wait_screen("active", "the active's dashboard", Duration::from_secs(10), |s| {
        s.contains(&format!("{name_a}: serving all clients")) && s.contains("role      active")
    });
    tmux.wait_screen("standby", "the standby's dashboard to name the active", Duration::from_secs(10), |s| {
        s.contains(&format!("{name_b}: standby: {name_a} serves")) && s.contains(&format!("primary   {name_a}"))
    });

    site.boxes[a].as_mut().unwrap().kill9();
    let killed = Instant::now();
    let limit = Duration::from_millis(T_MS + I_MS + 2000);
    tmux.wait_screen("standby", "the survivor's console to show it active", limit, |s| {
        s.contains(&format!("{name_b}: serving all clients")) && s.contains("role      active")
    });
    eprintln!(
        "TUI: the survivor's console showed it active {} ms after kill -9 (bound T + I + 2 s = {} ms)",
        killed.elapsed().as_millis(),
        limit.as_millis()
    );

    // The operator, having seen the dead box, declares it down from the survivor's console:
    // the dialog spells out the risk, a capital Y sends it, the daemon's answer and its event
    // show.
    tmux.keys("standby", "D");
    tmux.wait_screen("standby", "the partner-down dialog", Duration::from_secs(5), |s| {
        s.contains("Declare the partner down?") && s.contains("Y (capital): send it")
    });
    tmux.keys("standby", "Y");
    tmux.wait_screen("standby", "the daemon's answer", Duration::from_secs(10), |s| {
        s.contains("partner-down: this box is active on the operator's word")
    });
    tmux.keys("standby", "4");
    tmux.wait_screen("standby", "the partner-down event", Duration::from_secs(5), |s| {
        s.contains("partner declared down by")
    });

    // The dead box's console: the banner, and the lease table still read from its store.
    tmux.wait_screen("active", "the daemon-down banner", Duration::from_secs(10), |s| s.contains("DAEMON NOT RUNNING"));
    tmux.keys("active", "2");
    let leases = tmux.wait_screen("active", "the lease table from the store", Duration::from_secs(5), |s| {
        s.contains("Leases: 0 of 0")
    });
    assert!(!leases.contains("not readable"), "{leases}");

    tmux.quit("standby");
    tmux.quit("active");
}

/// The console's update dialog on a box without a partner: `u`, the bundle, Enter, `y`. The
/// install goes through the daemon's control socket to the update socket (served as on a box,
/// by `twinlease update serve` over a box laid out in a directory), writes slot b with its
/// boot entry and asks for the reboot; the console shows the answer.
#[test]
fn the_console_updates_a_box_from_a_bundle() {
    use common::bundle::{self, Key};
    use common::fake_box::{FakeBox, UpdateSocket};

    let b = FakeBox::new();
    let key = Key::generate(b.dir.path(), "product");
    let box_key = b.path("usr/share/twinlease/bundle-key.pem");
    std::fs::create_dir_all(box_key.parent().unwrap()).unwrap();
    std::fs::copy(&key.public, &box_key).unwrap();
    let bundles = b.path("bundles");
    std::fs::create_dir(&bundles).unwrap();
    let payloads: [&[u8]; 3] = [b"root", b"kernel", b"initrd"];
    let made = bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", payloads);
    std::fs::write(bundles.join("twinlease-2.0.bundle"), made).unwrap();
    let other = Key::generate(b.dir.path(), "other");
    std::fs::write(
        bundles.join("forged.bundle"),
        bundle::make(&other, b.dir.path(), std::env::consts::ARCH, "9.9", payloads),
    )
    .unwrap();
    let socket = UpdateSocket::serve(&b);

    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n\
         [control]\nupdate_socket = \"{}\"\n",
        lan.bridge,
        socket.path.display()
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let tmux = Tmux::new();
    let args = [
        BIN,
        "tui",
        "--config",
        path(&srv.config),
        "--runtime-dir",
        path(&srv.runtime_dir),
        "--bundles",
        path(&bundles),
        "--bundle-key",
        path(&box_key),
    ];
    tmux.run("update", (100, 30), &args);
    tmux.wait_screen("update", "the dashboard", Duration::from_secs(10), |s| s.contains("u update"));
    tmux.keys("update", "u");
    let dialog = tmux.wait_screen("update", "the update dialog", Duration::from_secs(10), |s| s.contains("Bundles in"));
    assert!(dialog.contains("slot a: 1.0, good, booted"), "{dialog}");
    assert!(
        dialog.contains("forged.bundle  bad signature"),
        "a bundle the box's key did not sign is marked:\n{dialog}"
    );
    assert!(dialog.contains("twinlease-2.0.bundle  2.0"), "{dialog}");
    // The forged bundle sorts first: move to the good one.
    tmux.keys("update", "Down");
    tmux.keys("update", "Enter");
    tmux.wait_screen("update", "the confirmation", Duration::from_secs(5), |s| s.contains("Update this box?"));
    tmux.keys("update", "y");
    let done =
        tmux.wait_screen("update", "the update's answer", Duration::from_secs(60), |s| s.contains("update to 2.0"));
    assert!(done.contains("update to 2.0: rebooting into the new slot"), "{done}");
    assert!(b.path("run/reboot-requested").exists(), "the install asked for the reboot");
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-2-b+3.conf"]);
    tmux.quit("update");
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// The unit's ExecStart= words, the binary replaced by the test build and the configuration
/// file by `config`.
fn console_unit_command(config: &std::path::Path) -> Vec<String> {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/twinlease-console@.service")).unwrap();
    let line = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart= line");
    line.split_whitespace()
        .map(|w| match w {
            "/usr/bin/twinlease" => BIN.to_string(),
            "/etc/twinlease/twinlease.toml" => path(config).to_string(),
            w => w.to_string(),
        })
        .collect()
}

#[test]
fn the_console_unit_command_runs_unprivileged_on_a_linux_console() {
    // A box that granted one lease and then stopped cleanly.
    let mut lan = Lan::new("198.18.0.1/24");
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\n\
         pools = [\"198.18.0.100-198.18.0.150\"]\n[control]\nruntime_dir = \"{}\"\n",
        lan.bridge,
        dir.path().join("run").display()
    );
    let mut srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let (ns, iface) = lan.client(c);
    assert!(udhcpc_once(ns, iface, dir.path(), &[]).0.status.success());
    srv.stop();
    assert!(!dir.path().join("state/leases.db-wal").exists(), "a clean stop leaves no log beside the store");
    // The unit's user may read the store but write nothing beside it (there: a read-only file
    // system; here: directories it does not own).
    sh(&format!("chmod -R a+rX,go-w {0} && chmod 0755 {0}", dir.path().display()));

    // `twinlease leases` for the same user reads the stopped store too.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", BIN, "leases", "--json", "--config"])
        .arg(&srv.config)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains("\"leased\""),
        "leases as nobody:\n{listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let unit = console_unit_command(&srv.config);
    assert!(unit.contains(&"--read-only".to_string()), "the VT console is read-only: {unit:?}");
    let mut argv = vec!["env", "TERM=linux", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"];
    argv.extend(unit.iter().map(String::as_str));
    let tmux = Tmux::new();
    tmux.run("vt", (80, 25), &argv);
    let screen =
        tmux.wait_screen("vt", "the daemon-down banner", Duration::from_secs(10), |s| s.contains("DAEMON NOT RUNNING"));
    assert!(screen.contains("+ This box -") && !screen.contains('┌'), "ASCII borders on TERM=linux:\n{screen}");
    tmux.keys("vt", "2");
    tmux.wait_screen("vt", "the lease from the store", Duration::from_secs(5), |s| {
        s.contains("Leases: 1 of 1") && s.contains("198.18.0.1") && s.contains("leased")
    });
    tmux.keys("vt", "s");
    tmux.wait_screen("vt", "actions refused", Duration::from_secs(5), |s| s.contains("read-only console"));
    tmux.quit("vt");
}

/// `make bench-tui`: the console's own CPU time while it shows the dashboard of a running, idle
/// box for TUI_IDLE_SECS (60) seconds, read from /proc/PID/schedstat (nanoseconds on a CPU) and
/// /proc/PID/stat (utime + stime ticks).
#[test]
#[ignore = "a benchmark: make bench-tui"]
fn bench_console_idle_cpu() {
    let secs: u64 = std::env::var("TUI_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n",
        lan.bridge
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let tmux = Tmux::new();
    let args = [BIN, "tui", "--config", path(&srv.config), "--runtime-dir", path(&srv.runtime_dir)];
    tmux.run("idle", (80, 25), &args);
    tmux.wait_screen("idle", "the dashboard", Duration::from_secs(10), |s| s.contains("serving all clients"));
    let shell = String::from_utf8(run(tmux.cmd().args(["display", "-p", "-t", "idle", "#{pane_pid}"])).stdout).unwrap();
    let pid = String::from_utf8(run(Command::new("pgrep").args(["-P", shell.trim()])).stdout).unwrap();
    let pid = pid.trim().to_string();
    let read = || {
        let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
        let on_cpu_ns: u64 = sched.split_whitespace().next().unwrap().parse().unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the command name.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        (Instant::now(), on_cpu_ns, ticks)
    };
    let (t0, ns0, ticks0) = read();
    let end = t0 + Duration::from_secs(secs);
    wait_for("the measuring window", Duration::from_secs(secs + 5), || (Instant::now() >= end).then_some(()));
    let (t1, ns1, ticks1) = read();
    let wall = t1.duration_since(t0).as_secs_f64();
    let pct = (ns1 - ns0) as f64 / 1e9 / wall * 100.0;
    eprintln!(
        "TUI idle: {pct:.3} % of one core over {wall:.0} s ({:.1} ms on a CPU; {} utime+stime ticks); build: {}",
        (ns1 - ns0) as f64 / 1e6,
        ticks1 - ticks0,
        if cfg!(debug_assertions) { "debug" } else { "optimised" }
    );
    assert!(tmux.screen("idle").contains("serving all clients"), "the console still shows the box");
    tmux.quit("idle");
}
