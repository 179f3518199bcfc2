//! The two kernel clocks the election needs, read directly.
//!
//! * `boottime` (CLOCK_BOOTTIME) times the primary's lease: it is monotonic and, unlike
//!   CLOCK_MONOTONIC, keeps counting while the box is suspended, so a box that sleeps through its
//!   lease wakes up knowing the lease is gone.
//! * `monotonic` (CLOCK_MONOTONIC) stamps role-change log lines: it is one kernel clock shared by
//!   every network namespace, so logs of several processes can be merged on one time line.

use std::time::Duration;

fn read(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; both clock ids exist on every Linux we support.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock}) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Time since boot, including suspend. Used for lease deadlines.
pub fn boottime() -> Duration {
    read(libc::CLOCK_BOOTTIME)
}

/// CLOCK_MONOTONIC. Used for log timestamps that must be comparable across processes.
pub fn monotonic() -> Duration {
    read(libc::CLOCK_MONOTONIC)
}

/// Converts a future boottime instant into the CLOCK_MONOTONIC time line (for logs).
pub fn boot_to_mono(at: Duration) -> Duration {
    let (b, m) = (boottime(), monotonic());
    if at >= b { m + (at - b) } else { m.saturating_sub(b - at) }
}

/// Wall-clock seconds since the Unix epoch: the time lease records carry (0 before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
