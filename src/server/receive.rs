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
    let mut filtered = Vec::new();
    if !served {
        filter_served(&sock, &ifaces, &mut filtered);
    }
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
        // the interface's socket answers it (out of the right link). The socket filter keeps
        // them out; one that still gets here came before the filter or from an interface whose
        // index changed since, so the filter is renewed.
        if !served && ifaces.is_served(r.ifindex) {
            stats.duplicates.fetch_add(1, Ordering::Relaxed);
            filter_served(&sock, &ifaces, &mut filtered);
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
