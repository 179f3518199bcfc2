//! One receive task per DHCP socket: reads a datagram, parses and sanity-checks it, notes where
//! it came in, and queues it for the engine (dropping it when the engine is that far behind).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::engine::{EngineStats, Inbox, Input};
use super::interfaces::Interfaces;
use super::socket::DhcpSocket;
use crate::dhcp::{self, Ingress};

pub(super) async fn receive(
    sock: DhcpSocket,
    index: usize,
    ifaces: Arc<Interfaces>,
    inbox: Inbox,
    stats: Arc<EngineStats>,
) {
    let mut buf = vec![0u8; 4096];
    let served = sock.device.is_some();
    loop {
        let r = match sock.recv(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // A broadcast on a served interface reaches that interface's socket and this one too;
        // the interface's socket answers it (out of the right link).
        if !served && ifaces.is_served(r.ifindex) {
            continue;
        }
        stats.received.fetch_add(1, Ordering::Relaxed);
        let req = match dhcp::parse(&buf[..r.len]) {
            Ok(req) => req,
            Err(why) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(from = %r.src, reason = %why, "dropped");
                continue;
            }
        };
        stats.count_request(req.kind);
        // Served sockets are bound in the order of [dhcp] interfaces, the relay socket last.
        let interface = served.then_some(index);
        let ingress = Ingress { iface_addrs: ifaces.addrs_of(r.ifindex), local_dst: r.dst, served, interface };
        if inbox.try_send(Input::Packet { req: Box::new(req), ingress, socket: index }).is_err() {
            stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}
