//! systemd readiness, status and watchdog (sd_notify). Every call is a no-op without
//! NOTIFY_SOCKET.
//!
//! The watchdog ping (WATCHDOG=1, every WatchdogSec/2) is sent only while both loops that do the
//! work are seen going round: the engine task (`EngineStats::alive_ms`, at least once a second)
//! and the lease store thread (`WriterStats::alive_ms`, at least every 500 ms). If either stops
//! moving for [`STALE_AFTER`], the pings stop and systemd restarts the service once WatchdogSec
//! has passed without one. Health is checked about once a second, so a short stall only delays
//! a ping (see [`PingSchedule`]). A stuck tokio runtime stops the engine's counter, so it stops them
//! too. The pings come from a small thread of their own, which keeps reporting (log, STATUS=)
//! whatever is wedged.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use super::engine::EngineStats;
use super::replication::SyncStats;
use crate::role::RoleRx;
use crate::store::writer::WriterStats;

/// A loop that has not gone round for this long counts as wedged. The engine ticks every
/// second and the store thread every 500 ms when idle, so this is three missed engine ticks.
pub const STALE_AFTER: Duration = Duration::from_secs(3);

/// How often the STATUS= line is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(false, states)
    {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// The watchdog timeout systemd set for this process (WatchdogSec=), from the environment.
pub fn watchdog_from_env() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_timeout(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// As sd_watchdog_enabled(3): WATCHDOG_USEC must be a positive number of microseconds, and
/// WATCHDOG_PID, when set, must name this process (a child does not inherit the duty).
pub fn watchdog_timeout(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec))
}

/// Tells a wedged loop from an idle one: the loop stores a counter that changes every time it
/// goes round; a counter that has not changed for [`STALE_AFTER`] belongs to a wedged loop.
/// Only change matters, so each loop may count from its own start.
#[derive(Debug)]
struct Liveness {
    last: u64,
    since: Instant,
}

impl Liveness {
    fn new(value: u64, now: Instant) -> Liveness {
        Liveness { last: value, since: now }
    }

    /// Records the counter; returns how long it has been unchanged.
    fn observe(&mut self, value: u64, now: Instant) -> Duration {
        if value != self.last {
            self.last = value;
            self.since = now;
        }
        now.saturating_duration_since(self.since)
    }
}

/// Which loop stopped, and for how long it has been still.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wedged {
    pub component: &'static str,
    pub still_for: Duration,
}

/// The health verdict the watchdog pings depend on.
#[derive(Debug)]
pub struct Health {
    engine: Liveness,
    writer: Liveness,
}

impl Health {
    pub fn new(engine_alive: u64, writer_alive: u64, now: Instant) -> Health {
        Health { engine: Liveness::new(engine_alive, now), writer: Liveness::new(writer_alive, now) }
    }

    /// `Ok` while both loops moved within [`STALE_AFTER`]; else the one that stopped (the
    /// store thread first: a wedged store also stalls the engine's commits).
    pub fn check(&mut self, engine_alive: u64, writer_alive: u64, now: Instant) -> Result<(), Wedged> {
        let writer = self.writer.observe(writer_alive, now);
        let engine = self.engine.observe(engine_alive, now);
        if writer >= STALE_AFTER {
            return Err(Wedged { component: "lease store thread", still_for: writer });
        }
        if engine >= STALE_AFTER {
            return Err(Wedged { component: "DHCP engine", still_for: engine });
        }
        Ok(())
    }
}

/// When to ping. Health is checked about once a second (every `tick`), and a ping is sent on
/// the first healthy check once `WatchdogSec/2` has passed since the last one. A short stall
/// (a slow fsync) at the moment of a check therefore only delays a ping by a tick or two; only
/// a loop that stays still for about half of WatchdogSec makes systemd act.
#[derive(Debug)]
struct PingSchedule {
    tick: Duration,
    every: u32,
    since: u32,
}

impl PingSchedule {
    fn new(watchdog: Duration) -> PingSchedule {
        let half = (watchdog / 2).max(Duration::from_millis(10));
        let every = half.as_micros().div_ceil(1_000_000).max(1) as u32;
        // The first check pings at once.
        PingSchedule { tick: half / every, every, since: every }
    }

    /// Called once per tick; true when a ping is due now.
    fn due(&mut self, healthy: bool) -> bool {
        self.since = self.since.saturating_add(1);
        if healthy && self.since > self.every {
            self.since = 1;
            return true;
        }
        false
    }
}

pub struct StatusReporter {
    role: RoleRx,
    engine: Arc<EngineStats>,
    writer: Arc<WriterStats>,
    can_commit: tokio::sync::watch::Receiver<bool>,
    sync: Option<Arc<SyncStats>>,
    /// Why the election made this box active (None: no election).
    election: Option<tokio::sync::watch::Receiver<crate::election::ElectionView>>,
}

impl StatusReporter {
    /// `sync`: the lease-sync counters when this box has a partner.
    pub fn new(
        role: RoleRx,
        engine: Arc<EngineStats>,
        writer: Arc<WriterStats>,
        can_commit: tokio::sync::watch::Receiver<bool>,
        sync: Option<Arc<SyncStats>>,
    ) -> StatusReporter {
        StatusReporter { role, engine, writer, can_commit, sync, election: None }
    }

    /// Says in STATUS= why the election made this box active.
    pub fn with_election(mut self, view: Option<tokio::sync::watch::Receiver<crate::election::ElectionView>>) -> Self {
        self.election = view;
        self
    }

    /// One line for `systemctl status`.
    pub fn line(&self) -> String {
        let role = *self.role.borrow();
        let why = self.election.as_ref().and_then(|v| v.borrow().basis).filter(|_| role.is_active());
        let term = match (role.term(), why) {
            (Some(t), Some(why)) => format!(" (term {t}, {why})"),
            (Some(t), None) => format!(" (term {t})"),
            _ => String::new(),
        };
        let partner = self.sync.as_deref().map(partner_status).unwrap_or_default();
        // A store that cannot commit is the first thing an operator must see.
        let store = if *self.can_commit.borrow() { "" } else { "NOT SERVING: lease store cannot commit; " };
        format!(
            "{store}{}{}, {} leases, {} ACKs, {} store commits{partner}",
            role.name(),
            term,
            self.engine.leases.load(Ordering::Relaxed),
            self.engine.acks.load(Ordering::Relaxed),
            self.writer.commits.load(Ordering::Relaxed)
        )
    }

    fn alive(&self) -> (u64, u64) {
        (self.engine.alive_ms.load(Ordering::Relaxed), self.writer.alive_ms.load(Ordering::Relaxed))
    }

    /// Starts the reporter thread: it refreshes STATUS= every few seconds and, when `watchdog`
    /// is set (WatchdogSec=), sends WATCHDOG=1 every `watchdog / 2` while [`Health::check`]
    /// passes. It is a plain thread, not a task, so that a wedged engine cannot starve it of
    /// its diagnostics; whether the async side is moving is judged by the engine's counter.
    pub fn spawn(self, watchdog: Option<Duration>) -> Reporter {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sd-notify".into())
            .spawn(move || self.run(watchdog, stopped))
            .expect("spawn the sd_notify thread");
        Reporter { stop: Some(stop), thread: Some(thread) }
    }

    fn run(self, watchdog: Option<Duration>, stopped: std::sync::mpsc::Receiver<()>) {
        let mut pings = watchdog.map(PingSchedule::new);
        let period = pings.as_ref().map_or(Duration::from_secs(1), |p| p.tick);
        let (e, w) = self.alive();
        let mut health = Health::new(e, w, Instant::now());
        let mut last_status = Instant::now();
        let mut wedged: Option<&'static str> = None;
        let mut announce = false;
        let mut next = Instant::now();
        loop {
            // Sleeps until the next check, or returns when the daemon stops.
            match stopped.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let now = Instant::now();
            next = (next + period).max(now);
            let (e, w) = self.alive();
            match health.check(e, w, now) {
                Ok(()) => {
                    if pings.as_mut().is_some_and(|p| p.due(true)) {
                        send(&[NotifyState::Watchdog]);
                    }
                    if let Some(c) = wedged.take() {
                        tracing::warn!(component = c, "moving again; watchdog pings resumed");
                        send(&[NotifyState::Status(&self.line())]);
                        last_status = now;
                    }
                }
                Err(Wedged { component, still_for }) => {
                    if let Some(p) = pings.as_mut() {
                        p.due(false);
                    }
                    if wedged.is_none() {
                        tracing::error!(
                            component,
                            still_secs = still_for.as_secs(),
                            "{component} has stopped; withholding watchdog pings so systemd restarts the service"
                        );
                        wedged = Some(component);
                        announce = true;
                    }
                    if announce || now.duration_since(last_status) >= STATUS_EVERY {
                        send(&[NotifyState::Status(&format!(
                            "unhealthy: {component} still for {} s; watchdog pings withheld",
                            still_for.as_secs()
                        ))]);
                        last_status = now;
                        announce = false;
                    }
                    continue;
                }
            }
            if now.duration_since(last_status) >= STATUS_EVERY {
                send(&[NotifyState::Status(&self.line())]);
                last_status = now;
            }
        }
    }
}

/// The partner part of the status line: whether the link is up (with its last heartbeat
/// round trip), the updates sent and applied, the conflicts resolved so far (which
/// `twinlease conflicts` lists) and, loudly, a partner whose configuration digest differs.
fn partner_status(s: &SyncStats) -> String {
    let link = if s.reachable.load(Ordering::Relaxed) {
        format!("partner reachable (rtt {:.1} ms)", s.rtt_us.load(Ordering::Relaxed) as f64 / 1000.0)
    } else {
        "partner unreachable".to_string()
    };
    let config = match s.partner_config() {
        Some(d) if s.config_differs.load(Ordering::Relaxed) => format!(", CONFIG DIFFERS from the partner's ({d})"),
        _ => String::new(),
    };
    format!(
        "; {link}, {} updates sent, {} applied, {} conflicts{config}",
        s.sent.load(Ordering::Relaxed),
        s.applied.load(Ordering::Relaxed),
        s.conflicts.load(Ordering::Relaxed)
    )
}

/// The running reporter thread; [`Reporter::stop`] ends it (also on drop).
pub struct Reporter {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.shut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_timeout_follows_sd_watchdog_enabled() {
        assert_eq!(watchdog_timeout(Some("30000000"), None, 7), Some(Duration::from_secs(30)));
        assert_eq!(watchdog_timeout(Some("2000000"), Some("7"), 7), Some(Duration::from_secs(2)));
        assert_eq!(watchdog_timeout(Some("2000000"), Some("8"), 7), None, "meant for another process");
        assert_eq!(watchdog_timeout(Some("0"), None, 7), None);
        assert_eq!(watchdog_timeout(Some("soon"), None, 7), None);
        assert_eq!(watchdog_timeout(None, Some("7"), 7), None);
    }

    #[test]
    fn pings_every_half_timeout_in_ticks_of_at_most_a_second() {
        let p = PingSchedule::new(Duration::from_secs(30));
        assert_eq!((p.tick, p.every), (Duration::from_secs(1), 15));
        let p = PingSchedule::new(Duration::from_secs(2));
        assert_eq!((p.tick, p.every), (Duration::from_secs(1), 1));
        let p = PingSchedule::new(Duration::from_millis(500));
        assert_eq!((p.tick, p.every), (Duration::from_millis(250), 1));
        let p = PingSchedule::new(Duration::from_secs(5));
        assert_eq!((p.tick, p.every), (Duration::from_nanos(833_333_333), 3));
    }

    #[test]
    fn a_short_stall_delays_a_ping_and_a_long_one_stops_them() {
        let mut p = PingSchedule::new(Duration::from_secs(6)); // 3 ticks of 1 s
        let run = |p: &mut PingSchedule, health: &[bool]| health.iter().map(|&h| p.due(h)).collect::<Vec<_>>();
        assert_eq!(
            run(&mut p, &[true, true, true, true, true, true, true]),
            [true, false, false, true, false, false, true]
        );
        // Unhealthy when a ping was due: it goes out at the first healthy tick.
        assert_eq!(
            run(&mut p, &[true, true, false, true, true, true, true]),
            [false, false, false, true, false, false, true]
        );
        // Wedged: no pings at all.
        assert!(run(&mut p, &[false; 20]).iter().all(|d| !d));
        assert_eq!(run(&mut p, &[true]), [true]);
    }

    #[test]
    fn idle_but_moving_loops_are_healthy() {
        let t0 = Instant::now();
        let mut h = Health::new(0, 0, t0);
        for i in 1..100u64 {
            // The engine ticks once a second, the store thread twice.
            assert_eq!(h.check(i * 1000, i * 1000 + 500, t0 + Duration::from_secs(i)), Ok(()));
        }
    }

    #[test]
    fn a_still_store_thread_or_engine_is_reported_after_the_grace_period() {
        let t0 = Instant::now();
        let mut h = Health::new(5, 9, t0);
        assert_eq!(h.check(6, 9, t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(h.check(7, 9, t0 + Duration::from_millis(2900)), Ok(()));
        let e = h.check(8, 9, t0 + STALE_AFTER).unwrap_err();
        assert_eq!(e.component, "lease store thread");
        assert_eq!(e.still_for, STALE_AFTER);
        // It moves again: healthy again.
        assert_eq!(h.check(9, 10, t0 + Duration::from_secs(4)), Ok(()));

        let mut h = Health::new(5, 9, t0);
        assert_eq!(h.check(5, 10, t0 + Duration::from_secs(2)), Ok(()));
        assert_eq!(h.check(5, 11, t0 + Duration::from_secs(3)).unwrap_err().component, "DHCP engine");
    }
}
