//! One receive thread per DHCP socket: reads datagrams, parses and sanity-checks them, notes
//! where each came in, and queues them for the engine (dropping one when the engine is that far
//! behind).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::engine::{EngineStats, Inbox, Input};
use super::interfaces::Interfaces;
use super::socket::{DhcpSocket, RECV_BATCH, Received, RecvBatch};
use crate::dhcp::{self, Ingress};

/// Under load the thread gathers: once datagrams come closer together than this, it reads
/// whatever has queued, hands it all to the engine, and sleeps this long before reading again,
/// instead of waking (and waking the engine) for every datagram. On a shared core each wake-up
/// is two context switches, and they were the largest share of the server's CPU at 4,000
/// leases/s (README, "What the boxes run"); a request waits at most this much longer, which no
/// DHCP client notices. A lone request at low load is read at once. 2 ms rather than 1: with
/// the writer's 4 ms window the shipped binary spent about a fifth less CPU per lease at 4,000
/// leases/s, for about 2.5 ms more latency (5.5 ms from REQUEST to ACK).
///
/// This is a thread of its own, not a task on the engine's runtime: the runtime's poller is
/// woken by every datagram that arrives on a registered socket, even while the task sleeps.
const GATHER_WINDOW: Duration = Duration::from_millis(2);

/// At most this many datagrams in one round, read [`RECV_BATCH`] at a time (the engine's lanes
/// hold [`super::engine::INBOX`] each).
const MAX_ROUND: usize = 256;

/// How often an idle thread looks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(200);

/// A running receive thread; it stops when told, or once the engine is gone.
pub(super) struct Receiver {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Stops the thread and waits for it (within [`STOP_POLL`]).
    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the thread that reads socket `index` and queues its requests in `inbox`.
pub(super) fn spawn(
    sock: DhcpSocket,
    index: usize,
    ifaces: Arc<Interfaces>,
    inbox: Inbox,
    stats: Arc<EngineStats>,
) -> std::io::Result<Receiver> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("dhcp-receive-{index}"))
        .stack_size(256 * 1024)
        .spawn(move || Reader { sock, index, ifaces, inbox, stats, filtered: Vec::new() }.run(&flag))?;
    Ok(Receiver { stop, thread: Some(thread) })
}

struct Reader {
    sock: DhcpSocket,
    index: usize,
    ifaces: Arc<Interfaces>,
    inbox: Inbox,
    stats: Arc<EngineStats>,
    /// The interfaces the relay socket's filter names (see [`filter_served`]).
    filtered: Vec<u32>,
}

impl Reader {
    fn run(mut self, stop: &AtomicBool) {
        let mut batch = RecvBatch::default();
        if self.sock.device.is_none() {
            filter_served(&self.sock, &self.ifaces, &mut self.filtered);
        }
        let mut last_round: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) && !self.inbox.is_closed() {
            match self.sock.wait(STOP_POLL) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
            let round = Instant::now();
            let read = self.read_queued(&mut batch);
            let gather = gathering(read, round, last_round);
            last_round = Some(round);
            if gather {
                std::thread::sleep(GATHER_WINDOW);
            }
        }
    }

    /// Reads and queues what is waiting (at most [`MAX_ROUND`]); returns how many were read.
    fn read_queued(&mut self, batch: &mut RecvBatch) -> usize {
        let mut read = 0;
        while read < MAX_ROUND {
            match self.sock.recv_batch(batch) {
                Ok(n) => {
                    for i in 0..n {
                        let (bytes, r) = batch.datagram(i);
                        self.accept(bytes, r);
                    }
                    read += n;
                    // A short batch took everything that was queued.
                    if n < RECV_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        read
    }

    /// Parses and checks one datagram and queues it for the engine.
    fn accept(&mut self, bytes: &[u8], r: Received) {
        let served = self.sock.device.is_some();
        // A broadcast on a served interface reaches that interface's socket and this one too;
        // the interface's socket answers it (out of the right link). The socket filter keeps
        // them out; one that still gets here came before the filter or from an interface
        // whose index changed since, so the filter is renewed.
        if !served && self.ifaces.is_served(r.ifindex) {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            filter_served(&self.sock, &self.ifaces, &mut self.filtered);
            return;
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let req = match dhcp::parse(bytes) {
            Ok(req) => req,
            Err(why) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(from = %r.src, reason = %why, "dropped");
                return;
            }
        };
        self.stats.count_request(req.kind);
        // Served sockets are bound in the order of [dhcp] interfaces, the relay socket last.
        let interface = served.then_some(self.index);
        let ingress = Ingress { iface_addrs: self.ifaces.addrs_of(r.ifindex), local_dst: r.dst, served, interface };
        let input = Input::Packet { req: Box::new(req), ingress, socket: self.index };
        if self.inbox.try_send(input).is_err() {
            self.stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether to gather for [`GATHER_WINDOW`] before reading again: more than one datagram was
/// waiting in this round, or it began within a window of the last one.
fn gathering(read: usize, round: Instant, last_round: Option<Instant>) -> bool {
    read > 1 || last_round.is_some_and(|t| round.duration_since(t) < GATHER_WINDOW)
}

/// Installs the relay socket's filter against the served interfaces' traffic, unless the one
/// installed (`filtered`) already names the same interfaces.
fn filter_served(sock: &DhcpSocket, ifaces: &Interfaces, filtered: &mut Vec<u32>) {
    let now = ifaces.served_indexes();
    if now.is_empty() || *filtered == now {
        return;
    }
    match sock.ignore_interfaces(&now) {
        Ok(()) => *filtered = now,
        Err(e) => {
            tracing::debug!(error = %e, "relay socket filter not installed; served interfaces' broadcasts are skipped when read")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_only_under_load() {
        let now = Instant::now();
        let ago = |ms: u64| Some(now - Duration::from_micros(ms * 1000));
        assert!(!gathering(1, now, None), "a lone request at start-up is answered at once");
        assert!(!gathering(1, now, ago(5)), "nor one a while after the last");
        assert!(gathering(2, now, ago(5)), "two waiting at once: requests come faster than they are read");
        assert!(gathering(1, now, Some(now - GATHER_WINDOW / 2)), "one, but within a window of the last");
    }
}
