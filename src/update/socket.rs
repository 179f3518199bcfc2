//! The update socket's line protocol, spoken by `twinlease update` for callers who are not root
//! and by the daemon's control socket (`update-*` commands): the request is one line, the
//! JSON array of `twinlease update` arguments; the answer is the root side's output, line by
//! line, ending with [`EXIT_LINE`] and the command's exit status.

/// Where the firmware image's update socket is (`twinlease-update.socket`).
pub const SOCKET: &str = "/run/twinlease-update.sock";
/// The last line of an answer: this, then the exit status.
pub const EXIT_LINE: &str = "exit-status ";
/// What the root side puts before each progress line.
pub const PROGRESS_PREFIX: &str = "twinlease-update: ";

/// The exit status if `line` is the answer's last line.
pub fn exit_status(line: &str) -> Option<u8> {
    line.strip_prefix(EXIT_LINE).map(|c| c.trim().parse().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_carries_the_exit_status() {
        assert_eq!(exit_status("exit-status 0"), Some(0));
        assert_eq!(exit_status("exit-status 2\r"), Some(2));
        assert_eq!(exit_status("exit-status what"), Some(1));
        assert_eq!(exit_status("twinlease-update: exit-status 0"), None);
    }
}
