//! The glue in-process: two engines on in-memory stores, joined by a fake link the test can hold
//! back, with a capture in place of each DHCP socket. This is where the before-ack gate and
//! the engine's handling of decisions are checked without namespaces or processes.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dhcproto::v4::{DhcpOption, MessageType};
use tokio::sync::{mpsc, watch};

use super::engine::{Engine, EngineHandle, Input, Transmit};
use super::replication::{Replication, SyncStats};
use super::service::OpenedStore;
use crate::config::{Config, LocalAddrs};
use crate::dhcp::Reply;
use crate::lease::LeaseState;
use crate::role::Role;
use crate::store::StoreWriter;
use crate::sync::link::{self, LinkCommand, LinkEvent};
use crate::sync::machine::Readiness;
use crate::testkit::{Msg, lan};

/// Replies "sent" by a box.
#[derive(Default)]
struct Captured(Mutex<Vec<Reply>>);

impl Transmit for Captured {
    fn transmit(&self, reply: &Reply) -> bool {
        self.0.lock().unwrap().push(reply.clone());
        true
    }
}

impl Captured {
    fn kinds(&self) -> Vec<MessageType> {
        self.0.lock().unwrap().iter().map(|r| r.kind).collect()
    }

    fn find(&self, kind: MessageType, xid_client: u8) -> Option<Reply> {
        let mac = crate::testkit::mac(xid_client);
        self.0.lock().unwrap().iter().find(|r| r.kind == kind && r.bytes[28..34] == mac).cloned()
    }
}

fn config(name: &str, ack_timeout_ms: u64) -> Config {
    let text = format!(
        "[node]\nname='{name}'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n\
         [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.120']\n\
         [peer]\nlisten='198.18.1.1:6767'\naddress='198.18.1.2:6767'\nkey_file='/nonexistent/peer.key'\n\
         sync_mode='before-ack'\nack_timeout_ms={ack_timeout_ms}\n"
    );
    Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap()
}

/// One box: its engine, what it sent, its store writer and its sync counters.
struct TestBox {
    engine: EngineHandle,
    replies: Arc<Captured>,
    writer: StoreWriter,
    sync: Arc<SyncStats>,
    _role: watch::Sender<Role>,
    _readiness: watch::Receiver<Readiness>,
}

impl TestBox {
    fn start(
        name: &str,
        role: Role,
        ack_timeout_ms: u64,
    ) -> (TestBox, mpsc::UnboundedSender<LinkEvent>, mpsc::UnboundedReceiver<LinkCommand>) {
        let cfg = config(name, ack_timeout_ms);
        let (alloc, identity, parts) = OpenedStore::in_memory(&cfg).unwrap().spawn_writer();
        let (link, commands) = link::detached();
        let (events_tx, events) = mpsc::unbounded_channel();
        let (ready_tx, readiness) = watch::channel(Readiness::Waiting);
        let peer = cfg.peer.clone().unwrap();
        let replication = Replication::with_link(name, &peer, (link, events), identity, ready_tx, Default::default());
        let sync = replication.0.stats();
        let (role_tx, role_rx) = watch::channel(role);
        let replies = Arc::new(Captured::default());
        let writer = parts.writer.clone();
        let (engine, handle) = Engine::new(
            Arc::new(cfg),
            alloc,
            (parts.writer, parts.events),
            vec![replies.clone() as Arc<dyn Transmit>],
            role_rx,
        );
        tokio::spawn(engine.with_replication(replication).run());
        let b = TestBox { engine: handle, replies, writer, sync, _role: role_tx, _readiness: readiness };
        (b, events_tx, commands)
    }

    async fn send(&self, m: &Msg) {
        let input = Input::Packet { req: Box::new(m.req()), ingress: lan(), socket: 0 };
        self.engine.inbox.send(input).await.unwrap();
    }

    /// The state of `addr` in this box's store (on disk, as far as the store goes).
    async fn stored(&self, addr: Ipv4Addr) -> Option<LeaseState> {
        let rows = self.writer.with(|s| s.load_all().unwrap()).await.unwrap();
        rows.into_iter().find(|r| r.binding.addr == addr).map(|r| r.binding.state)
    }
}

/// The link between two boxes, as a task that forwards each one's messages to the other. The
/// direction to `a` can be held back: its messages queue until released.
struct Bridge {
    hold_to_a: Arc<AtomicBool>,
}

impl Bridge {
    fn join(
        (a_events, mut a_cmds): (mpsc::UnboundedSender<LinkEvent>, mpsc::UnboundedReceiver<LinkCommand>),
        (b_events, mut b_cmds): (mpsc::UnboundedSender<LinkEvent>, mpsc::UnboundedReceiver<LinkCommand>),
    ) -> Bridge {
        let hold_to_a = Arc::new(AtomicBool::new(false));
        let hold = hold_to_a.clone();
        a_events.send(LinkEvent::Up { session: 1, partner: "b".into() }).unwrap();
        b_events.send(LinkEvent::Up { session: 1, partner: "a".into() }).unwrap();
        tokio::spawn(async move {
            let mut held: VecDeque<LinkEvent> = VecDeque::new();
            let mut release = tokio::time::interval(Duration::from_millis(5));
            loop {
                tokio::select! {
                    Some(c) = a_cmds.recv() => forward(c, &b_events),
                    Some(c) = b_cmds.recv() => {
                        if let LinkCommand::Send { msg, .. } = c {
                            held.push_back(LinkEvent::Message { session: 1, msg });
                        }
                    }
                    _ = release.tick() => {
                        while !hold.load(Ordering::SeqCst) && let Some(ev) = held.pop_front() {
                            let _ = a_events.send(ev);
                        }
                    }
                }
            }
        });
        Bridge { hold_to_a }
    }

    fn hold(&self, on: bool) {
        self.hold_to_a.store(on, Ordering::SeqCst);
    }
}

fn forward(c: LinkCommand, to: &mpsc::UnboundedSender<LinkEvent>) {
    if let LinkCommand::Send { msg, .. } = c {
        let _ = to.send(LinkEvent::Message { session: 1, msg });
    }
}

/// Polls `f` every 5 ms until it holds, for at most `limit`.
async fn until<F: std::future::Future<Output = bool>>(what: &str, limit: Duration, mut f: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Two boxes in sync, `a` active: (a, b, the link).
async fn pair(ack_timeout_ms: u64) -> (TestBox, TestBox, Bridge) {
    let (a, a_events, a_cmds) = TestBox::start("a", Role::active(1), ack_timeout_ms);
    let (b, b_events, b_cmds) = TestBox::start("b", Role::Standby, ack_timeout_ms);
    let bridge = Bridge::join((a_events, a_cmds), (b_events, b_cmds));
    until("the partner in sync", Duration::from_secs(5), || async { a.sync.reachable.load(Ordering::SeqCst) }).await;
    (a, b, bridge)
}

/// DISCOVER and REQUEST for client `n`; returns the offered address (the ACK may be held).
async fn request(a: &TestBox, n: u8) -> Ipv4Addr {
    a.send(&Msg::new(MessageType::Discover, n)).await;
    let mut offer = None;
    until("an OFFER (offers are never held)", Duration::from_secs(5), || {
        offer = a.replies.find(MessageType::Offer, n);
        std::future::ready(offer.is_some())
    })
    .await;
    let addr = offer.unwrap().yiaddr;
    let req = Msg::new(MessageType::Request, n)
        .opt(DhcpOption::ServerIdentifier(Ipv4Addr::new(198, 18, 0, 1)))
        .opt(DhcpOption::RequestedIpAddress(addr));
    a.send(&req).await;
    addr
}

#[tokio::test]
async fn a_before_ack_ack_waits_for_the_partners_disk() {
    let (a, b, bridge) = pair(10_000).await;
    bridge.hold(true);
    let addr = request(&a, 10).await;
    // The lease is durable on both boxes, but the partner's acknowledgement is held back.
    until("the lease on the active's disk", Duration::from_secs(5), || async {
        a.stored(addr).await == Some(LeaseState::Leased)
    })
    .await;
    until("the lease on the partner's disk", Duration::from_secs(5), || async {
        b.stored(addr).await == Some(LeaseState::Leased)
    })
    .await;
    assert!(
        a.replies.find(MessageType::Ack, 10).is_none(),
        "ACK sent before the partner confirmed: {:?}",
        a.replies.kinds()
    );
    bridge.hold(false);
    until("the ACK once the partner confirmed", Duration::from_secs(5), || {
        std::future::ready(a.replies.find(MessageType::Ack, 10).is_some())
    })
    .await;
    assert_eq!(a.sync.held_timeouts.load(Ordering::SeqCst), 0, "released by the partner, not by the timeout");
    assert!(b.replies.kinds().is_empty(), "the standby never answers a client");
}

#[tokio::test]
async fn a_silent_partner_delays_an_ack_only_until_the_ack_timeout() {
    let (a, b, bridge) = pair(200).await;
    bridge.hold(true);
    let first = request(&a, 11).await;
    until("the ACK after the ack timeout", Duration::from_secs(5), || {
        std::future::ready(a.replies.find(MessageType::Ack, 11).is_some())
    })
    .await;
    assert_eq!(a.sync.held_timeouts.load(Ordering::SeqCst), 1);
    assert!(!a.sync.reachable.load(Ordering::SeqCst), "the partner now counts as behind");
    // Later ACKs do not wait for a partner that is behind: this one leaves while the link is
    // still held, without a second timeout.
    request(&a, 12).await;
    until("the next ACK", Duration::from_secs(5), || {
        std::future::ready(a.replies.find(MessageType::Ack, 12).is_some())
    })
    .await;
    assert_eq!(a.sync.held_timeouts.load(Ordering::SeqCst), 1);
    // The partner has the leases all the same, and catches up once it answers again.
    until("the partner's copy", Duration::from_secs(5), || async { b.stored(first).await == Some(LeaseState::Leased) })
        .await;
    bridge.hold(false);
    until("the partner in sync again", Duration::from_secs(10), || async { a.sync.reachable.load(Ordering::SeqCst) })
        .await;
}
