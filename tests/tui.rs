//! The console on a real pair: `twinlease tui` in tmux on each box of a site (two boxes, a
//! PostgreSQL arbiter, nothing pinned). The standby's dashboard names the active; after kill -9
//! of the active the survivor's console shows itself serving within T + I + 2 s (the console
//! refreshes once a second) while the dead box's console shows the daemon-down banner and still
//! reads its lease store; `q` quits and leaves the terminal as it found it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::site::*;
use common::*;

/// A tmux server of its own with one session per console; killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        Tmux { socket: unique("tltui") }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f", "/dev/null"]);
        c
    }

    /// Runs the console of `site`'s box `i` in session `name`, 100×30. When it ends, the pane
    /// shows its exit status and whether the terminal is back in cooked mode with echo.
    fn console(&self, name: &str, site: &Site, i: usize) {
        let script = r#""$0" tui --config "$1" --runtime-dir "$2"; rc=$?; modes=$(stty -a | tr ' ;' '\n\n' | grep -xE -- '-?(icanon|echo)' | tr '\n' ' '); echo "tui exited $rc; tty: $modes"; exec cat"#;
        let srv = site.srv(i);
        run(self
            .cmd()
            .args(["new-session", "-d", "-s", name, "-x", "100", "-y", "30", "sh", "-c", script, BIN])
            .args([&srv.config, &srv.runtime_dir]));
    }

    fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&run(self.cmd().args(["capture-pane", "-p", "-t", name])).stdout).into_owned()
    }

    fn keys(&self, name: &str, keys: &str) {
        run(self.cmd().args(["send-keys", "-t", name, keys]));
    }

    /// Polls the pane until `want` holds; on timeout shows the screen.
    fn wait_screen(&self, name: &str, what: &str, limit: Duration, want: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen(name);
            if want(&screen) {
                return screen;
            }
            assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
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
    tmux.console("active", &site, a);
    tmux.console("standby", &site, b);

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

    // The dead box's console: the banner, and the lease table still read from its store.
    tmux.wait_screen("active", "the daemon-down banner", Duration::from_secs(10), |s| s.contains("DAEMON NOT RUNNING"));
    tmux.keys("active", "2");
    let leases = tmux.wait_screen("active", "the lease table from the store", Duration::from_secs(5), |s| {
        s.contains("Leases: 0 of 0")
    });
    assert!(!leases.contains("not readable"), "{leases}");

    for session in ["standby", "active"] {
        tmux.keys(session, "q");
        let after =
            tmux.wait_screen(session, "the console to quit", Duration::from_secs(5), |s| s.contains("tui exited"));
        assert!(after.contains("tui exited 0;"), "{after}");
        // Raw mode undone (canonical input and echo back) and the alternate screen left.
        assert!(after.contains("tty: icanon echo"), "terminal not restored:\n{after}");
        assert!(!after.contains("1 Dashboard"), "the console's screen stayed:\n{after}");
    }
}
