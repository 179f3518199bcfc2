//! The status in the Prometheus (OpenMetrics) text format, encoded by `prometheus-client`, and
//! the optional HTTP listener for it (`[metrics] listen`). Every scrape encodes a fresh
//! snapshot, so the counters are exactly those `status-get` shows.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::status::{Sources, Status};

type Labels = Vec<(String, String)>;

/// A gauge that holds fractions (ratios, seconds).
type Real = Gauge<f64, AtomicU64>;

/// Registers one family per name as metrics are added.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn gauge(&mut self, name: &str, help: &str, samples: &[(Labels, i64)]) {
        self.add(name, help, samples, |g: &Gauge, v| {
            g.set(v);
        });
    }

    fn real(&mut self, name: &str, help: &str, samples: &[(Labels, f64)]) {
        self.add(name, help, samples, |g: &Real, v| {
            g.set(v);
        });
    }

    fn counter(&mut self, name: &str, help: &str, samples: &[(Labels, u64)]) {
        self.add(name, help, samples, |c: &Counter, v| {
            c.inc_by(v);
        });
    }

    /// One metric without labels, or a family of labelled ones.
    fn add<M, V>(&mut self, name: &str, help: &str, samples: &[(Labels, V)], set: impl Fn(&M, V))
    where
        M: prometheus_client::metrics::TypedMetric
            + prometheus_client::encoding::EncodeMetric
            + Default
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        V: Copy,
    {
        if let [(labels, v)] = samples
            && labels.is_empty()
        {
            let m = M::default();
            set(&m, *v);
            self.registry.register(name, help, m);
            return;
        }
        let f = Family::<Labels, M>::default();
        for (labels, v) in samples {
            set(&f.get_or_create(labels), *v);
        }
        self.registry.register(name, help, f);
    }
}

fn none() -> Labels {
    Vec::new()
}

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}

/// The whole status as metrics.
pub fn encode_status(s: &Status) -> String {
    let mut b = Builder { registry: Registry::default() };
    b.gauge(
        "twinlease_info",
        "The build and the node it runs as",
        &[(vec![("node".into(), s.node.clone()), ("version".into(), s.version.clone())], 1)],
    );
    b.gauge("twinlease_uptime_seconds", "Seconds since the daemon started", &[(none(), s.uptime_secs as i64)]);
    b.gauge(
        "twinlease_role",
        "1 while this box holds the active role",
        &[(none(), i64::from(s.role.state == "active"))],
    );
    b.gauge("twinlease_serving", "1 while this box answers clients", &[(none(), i64::from(s.role.serving))]);
    b.gauge(
        "twinlease_eligible",
        "1 while this box may stand in the election",
        &[(none(), i64::from(s.role.eligible))],
    );
    b.gauge(
        "twinlease_term",
        "The election term of the active role (0 while standby)",
        &[(none(), s.role.term.unwrap_or(0) as i64)],
    );
    subnets(&mut b, s);
    dhcp(&mut b, s);
    store(&mut b, s);
    partner(&mut b, s);
    election(&mut b, s);
    let mut out = String::new();
    encode(&mut out, &b.registry).expect("encoding into a String cannot fail");
    out
}

fn partner(b: &mut Builder, s: &Status) {
    let Some(p) = &s.partner else { return };
    b.gauge("twinlease_partner_link_up", "1 while the link to the partner is up", &[(none(), i64::from(p.link_up))]);
    b.gauge(
        "twinlease_partner_in_sync",
        "1 while before-ack ACKs wait for the partner",
        &[(none(), i64::from(p.in_sync))],
    );
    b.real("twinlease_partner_rtt_seconds", "Round trip to the partner", &[(none(), p.rtt_ms.unwrap_or(0.0) / 1000.0)]);
    b.gauge(
        "twinlease_partner_config_differs",
        "1 while the partner's configuration digest differs",
        &[(none(), i64::from(p.config_differs))],
    );
    b.gauge("twinlease_partner_unsynced", "Bindings the partner does not hold yet", &[(none(), p.unsynced as i64)]);
    b.counter("twinlease_partner_updates_sent", "Lease changes sent to the partner", &[(none(), p.updates_sent)]);
    b.counter("twinlease_partner_updates_applied", "Partner changes applied here", &[(none(), p.updates_applied)]);
    b.counter("twinlease_conflicts", "Conflicts between the two boxes' bindings resolved", &[(none(), p.conflicts)]);
    b.counter("twinlease_partner_ack_timeouts", "Times the partner fell behind an ACK", &[(none(), p.ack_timeouts)]);
    b.counter("twinlease_partner_catch_ups", "Catch-ups with the partner completed", &[(none(), p.catch_ups)]);
    b.counter(
        "twinlease_partner_rejected_connections",
        "Peer-port connections refused",
        &[
            (label("reason", "handshake"), p.rejected_connections),
            (label("reason", "foreign-address"), p.foreign_connections),
            (label("reason", "bad-frame"), p.bad_frames),
        ],
    );
}

fn election(b: &mut Builder, s: &Status) {
    let Some(e) = &s.election else { return };
    let a = &e.arbiter;
    b.gauge("twinlease_arbiter_reachable", "1 while the arbiter answers", &[(none(), i64::from(a.reachable))]);
    b.real(
        "twinlease_arbiter_rtt_seconds",
        "Round trip of the last arbiter call",
        &[(none(), a.rtt_ms.unwrap_or(0.0) / 1000.0)],
    );
    b.counter("twinlease_arbiter_calls", "Arbiter calls made", &[(none(), a.calls)]);
    b.counter("twinlease_arbiter_call_failures", "Arbiter calls without a usable answer", &[(none(), a.failed_calls)]);
    b.counter("twinlease_failovers", "Times this box became active", &[(none(), e.promotions)]);
}

fn subnets(b: &mut Builder, s: &Status) {
    let mut leases = Vec::new();
    let mut totals = Vec::new();
    let mut ratios = Vec::new();
    for n in &s.subnets {
        for (state, v) in [
            ("free", n.free),
            ("probing", n.probing),
            ("offered", n.offered),
            ("leased", n.leased),
            ("declined", n.declined),
        ] {
            leases.push((vec![("subnet".into(), n.cidr.clone()), ("state".into(), state.into())], v as i64));
        }
        totals.push((label("subnet", &n.cidr), n.total as i64));
        ratios.push((label("subnet", &n.cidr), n.utilisation_pct / 100.0));
    }
    b.gauge("twinlease_leases", "Addresses per subnet and lease state", &leases);
    b.gauge("twinlease_pool_addresses", "Addresses per subnet (pools and reservations)", &totals);
    b.real("twinlease_pool_utilisation_ratio", "Busy addresses per address, per subnet", &ratios);
}

fn dhcp(b: &mut Builder, s: &Status) {
    let d = &s.dhcp;
    let by = |m: &std::collections::BTreeMap<String, u64>, key: &str| {
        m.iter().map(|(k, v)| (label(key, k), *v)).collect::<Vec<_>>()
    };
    b.counter("twinlease_dhcp_received", "Datagrams received on the DHCP sockets", &[(none(), d.received)]);
    b.counter("twinlease_dhcp_requests", "DHCP requests by message type", &by(&d.requests, "type"));
    b.counter("twinlease_dhcp_malformed", "Datagrams that were not a usable request", &[(none(), d.malformed)]);
    b.counter("twinlease_dhcp_replies", "Replies sent by message type", &by(&d.replies, "type"));
    b.counter("twinlease_dhcp_dropped", "Requests dropped, by reason", &by(&d.dropped, "reason"));
    b.counter("twinlease_pool_exhausted", "DISCOVERs with no address to offer", &[(none(), d.pool_exhausted)]);
    b.counter(
        "twinlease_offers_reclaimed",
        "OFFERs of an address taken from another client's unrequested offer",
        &[(none(), d.offers_reclaimed)],
    );
    b.counter("twinlease_dhcp_send_errors", "Replies the kernel refused to send", &[(none(), d.send_errors)]);
}

fn store(b: &mut Builder, s: &Status) {
    let st = &s.store;
    b.gauge("twinlease_store_can_commit", "1 while the lease store commits", &[(none(), i64::from(st.can_commit))]);
    b.counter("twinlease_store_commits", "Group commits", &[(none(), st.commits)]);
    b.counter("twinlease_store_commit_failures", "Commits that failed", &[(none(), st.commit_failures)]);
    b.real(
        "twinlease_store_last_commit_seconds",
        "Duration of the last commit, fsync included",
        &[(none(), st.last_commit_us as f64 / 1e6)],
    );
    b.gauge("twinlease_store_size_bytes", "Database file size", &[(none(), st.size_bytes as i64)]);
    b.gauge("twinlease_store_wal_bytes", "Write-ahead log size", &[(none(), st.wal_bytes as i64)]);
    b.gauge(
        "twinlease_store_disk_free_bytes",
        "Free space for the state directory",
        &[(none(), st.disk_free_bytes.unwrap_or(0) as i64)],
    );
    b.counter(
        "twinlease_store_files_lost",
        "Times the database file was lost under the box",
        &[(none(), st.files_lost)],
    );
}

/// Serves `GET /metrics` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, sources: Sources) {
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen for metrics scrapes; no metrics over HTTP");
            return;
        }
    };
    tracing::info!(%addr, "serving metrics at /metrics");
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let sources = sources.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), scrape(stream, &sources)).await;
        });
    }
}

/// One HTTP/1.1 exchange: the request head (at most 8 KiB), then the answer, then close.
async fn scrape(mut stream: TcpStream, sources: &Sources) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() + n > 8192 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, kind, body) = if head.starts_with(b"GET /metrics ") {
        let body = encode_status(&sources.status());
        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
    } else {
        ("404 Not Found", "text/plain", "metrics are at /metrics\n".to_string())
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await
}
