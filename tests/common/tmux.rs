//! A terminal for console tests: a tmux server of its own, one session per program, keys in
//! and the screen out.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{run, unique};

/// A tmux server of its own with one session per console; killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn new() -> Tmux {
        Tmux { socket: unique("tltui") }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f", "/dev/null"]);
        c
    }

    /// Runs `argv` in session `name` of `size`. When it ends, the pane shows its exit status and
    /// whether the terminal is back in cooked mode with echo.
    pub fn run(&self, name: &str, (w, h): (u16, u16), argv: &[&str]) {
        let script = r#""$@"; rc=$?; modes=$(stty -a | tr ' ;' '\n\n' | grep -xE -- '-?(icanon|echo)' | tr '\n' ' '); echo "tui exited $rc; tty: $modes"; exec cat"#;
        let (w, h) = (w.to_string(), h.to_string());
        let session = ["new-session", "-d", "-s", name, "-x", &w, "-y", &h, "sh", "-c", script, "sh"];
        run(self.cmd().args(session).args(argv));
    }

    /// Presses `q` and checks the console ended well and put the terminal back.
    pub fn quit(&self, name: &str) {
        self.keys(name, "q");
        let after = self.wait_screen(name, "the console to quit", Duration::from_secs(5), |s| s.contains("tui exited"));
        assert!(after.contains("tui exited 0;"), "{after}");
        // Raw mode undone (canonical input and echo back) and the alternate screen left.
        assert!(after.contains("tty: icanon echo"), "terminal not restored:\n{after}");
        assert!(!after.contains("1 Dashboard"), "the console's screen stayed:\n{after}");
    }

    pub fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&run(self.cmd().args(["capture-pane", "-p", "-t", name])).stdout).into_owned()
    }

    pub fn keys(&self, name: &str, keys: &str) {
        run(self.cmd().args(["send-keys", "-t", name, keys]));
    }

    /// Polls the pane until `want` holds; on timeout shows the screen.
    pub fn wait_screen(&self, name: &str, what: &str, limit: Duration, want: impl Fn(&str) -> bool) -> String {
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
