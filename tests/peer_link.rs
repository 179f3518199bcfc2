//! The peer link on loopback: two links find each other and keep one connection; garbage, a
//! wrong key and a replayed recording of a real session are refused before any message reaches
//! the sync layer (so nothing can reach the store).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;
use twinlease::sync::link::{self, LinkConfig, LinkEvent, LinkHandle};
use twinlease::sync::protocol::{CatchUpRequest, Message};

const KEY: &[u8] = b"a shared secret of enough length";

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn cfg(node: &str, listen: SocketAddr, partner: SocketAddr, key: &[u8]) -> LinkConfig {
    LinkConfig { node: node.into(), listen, partner, key: Arc::new(key.to_vec()) }
}

async fn next_up(ev: &mut UnboundedReceiver<LinkEvent>, limit: Duration) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, ev.recv()).await {
            Ok(Some(LinkEvent::Up { session, .. })) => return Some(session),
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

/// Every event within `limit` (for "nothing happened" checks).
async fn drain(ev: &mut UnboundedReceiver<LinkEvent>, limit: Duration) -> Vec<LinkEvent> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, ev.recv()).await {
        out.push(e);
    }
    out
}

fn hello() -> Message {
    Message::Hello {
        node: "x".into(),
        store_id: 7,
        catch_up: CatchUpRequest::Unsynced,
        term: None,
        config_digest: [0; 32],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_boxes_keep_one_connection_and_exchange_messages() {
    let (pa, pb) = (free_port(), free_port());
    let (ha, mut ea) = link::spawn(cfg("box-a", pa, pb, KEY));
    let (hb, mut eb) = link::spawn(cfg("box-b", pb, pa, KEY));
    let sa = next_up(&mut ea, Duration::from_secs(5)).await.expect("a up");
    let sb = next_up(&mut eb, Duration::from_secs(5)).await.expect("b up");
    // Both dial at once: whatever came up first, both settle on one connection. Let any
    // replacement happen, then check the current sessions carry messages both ways.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sa, sb) = (last_session(&mut ea, sa), last_session(&mut eb, sb));
    ha.send(sa, hello());
    hb.send(sb, Message::Heartbeat { sent_ms: 1 });
    let got_b = drain(&mut eb, Duration::from_millis(500)).await;
    let got_a = drain(&mut ea, Duration::from_millis(300)).await;
    assert!(got_b.iter().any(|e| matches!(e, LinkEvent::Message { msg, .. } if *msg == hello())), "{got_b:?}");
    assert!(
        got_a.iter().any(|e| matches!(e, LinkEvent::Message { msg: Message::Heartbeat { sent_ms: 1 }, .. })),
        "{got_a:?}"
    );
    assert!(
        !got_a.iter().chain(&got_b).any(|e| matches!(e, LinkEvent::Down { .. })),
        "the kept connection must stay up"
    );
    assert_eq!(ha.stats.rejected.load(Ordering::Relaxed) + hb.stats.rejected.load(Ordering::Relaxed), 0);
}

fn last_session(ev: &mut UnboundedReceiver<LinkEvent>, mut s: u64) -> u64 {
    while let Ok(e) = ev.try_recv() {
        if let LinkEvent::Up { session, .. } = e {
            s = session;
        }
    }
    s
}

/// A box that only listens (its partner address leads nowhere).
fn listener_only(node: &str) -> (SocketAddr, LinkHandle, UnboundedReceiver<LinkEvent>) {
    let p = free_port();
    let nowhere = free_port();
    let (h, e) = link::spawn(cfg(node, p, nowhere, KEY));
    (p, h, e)
}

async fn wait_rejected(h: &LinkHandle, n: u64) {
    for _ in 0..200 {
        if h.stats.rejected.load(Ordering::Relaxed) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("expected {n} rejected connections, saw {}", h.stats.rejected.load(Ordering::Relaxed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_a_wrong_key_are_rejected() {
    let (p, h, mut ev) = listener_only("box-b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Garbage: a plausible length then noise.
    let mut s = TcpStream::connect(p).await.unwrap();
    let mut junk = 300u32.to_be_bytes().to_vec();
    junk.extend((0..300u32).map(|i| (i * 7 + 3) as u8));
    s.write_all(&junk).await.unwrap();
    wait_rejected(&h, 1).await;
    // An absurd length is refused without reading (or allocating) it.
    let mut s2 = TcpStream::connect(p).await.unwrap();
    s2.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    wait_rejected(&h, 2).await;
    // A real twinlease with the wrong key.
    let (_hc, mut ec) = link::spawn(cfg("box-a", free_port(), p, b"some other key, also long enough"));
    wait_rejected(&h, 3).await;
    let seen: Vec<LinkEvent> = drain(&mut ev, Duration::from_millis(300)).await;
    assert!(seen.is_empty(), "nothing may reach the sync layer: {seen:?}");
    assert!(drain(&mut ec, Duration::from_millis(100)).await.iter().all(|e| !matches!(e, LinkEvent::Up { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_session_is_rejected() {
    let (pb, hb, mut eb) = listener_only("box-b");
    // A recording proxy between box-a and box-b.
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = proxy.local_addr().unwrap();
    let (rec_tx, mut rec_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let (mut a, _) = proxy.accept().await.unwrap();
        let mut b = TcpStream::connect(pb).await.unwrap();
        let (mut ar, mut aw) = a.split();
        let (mut br, mut bw) = b.split();
        let up = async {
            let mut buf = vec![0u8; 65536];
            loop {
                let n = ar.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                let _ = rec_tx.send(buf[..n].to_vec());
                if bw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        };
        let down = tokio::io::copy(&mut br, &mut aw);
        tokio::select! { _ = up => {}, _ = down => {} }
    });
    let (ha, mut ea) = link::spawn(cfg("box-a", free_port(), paddr, KEY));
    let sa = next_up(&mut ea, Duration::from_secs(5)).await.expect("a up through the proxy");
    let sb = next_up(&mut eb, Duration::from_secs(5)).await.expect("b up");
    ha.send(sa, hello());
    let got = drain(&mut eb, Duration::from_millis(500)).await;
    assert!(got.iter().any(|e| matches!(e, LinkEvent::Message { .. })), "{got:?}");
    let _ = sb;
    let mut recording = Vec::new();
    while let Ok(chunk) = rec_rx.try_recv() {
        recording.extend(chunk);
    }
    assert!(recording.len() > 100);
    let before = hb.stats.rejected.load(Ordering::Relaxed);
    // Replay everything box-a sent, byte for byte, on a fresh connection.
    let mut s = TcpStream::connect(pb).await.unwrap();
    s.write_all(&recording).await.unwrap();
    wait_rejected(&hb, before + 1).await;
    let seen = drain(&mut eb, Duration::from_millis(300)).await;
    assert!(
        !seen.iter().any(|e| matches!(e, LinkEvent::Message { .. } | LinkEvent::Up { .. })),
        "a replayed session got through: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_frame_drops_the_link_and_it_comes_back() {
    let (pb, hb, mut eb) = listener_only("box-b");
    // A proxy that flips one bit in box-a's first data after the handshake, on its first
    // connection only.
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = proxy.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let (mut a, _) = proxy.accept().await.unwrap();
            let tamper = n == 0;
            n += 1;
            tokio::spawn(async move {
                let mut b = TcpStream::connect(pb).await.unwrap();
                let (mut ar, mut aw) = a.split();
                let (mut br, mut bw) = b.split();
                let up = async {
                    let mut buf = vec![0u8; 65536];
                    let mut seen = 0usize;
                    let mut done = !tamper;
                    loop {
                        let k = ar.read(&mut buf).await.unwrap_or(0);
                        if k == 0 {
                            break;
                        }
                        // Handshake (67 bytes) and confirmation (44) pass; the next data is hit.
                        if !done && seen + k > 111 {
                            let at = 111usize.saturating_sub(seen) + 20;
                            if at < k {
                                buf[at] ^= 0x40;
                                done = true;
                            }
                        }
                        seen += k;
                        if bw.write_all(&buf[..k]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = tokio::io::copy(&mut br, &mut aw);
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    let (ha, mut ea) = link::spawn(cfg("box-a", free_port(), paddr, KEY));
    let sa = next_up(&mut ea, Duration::from_secs(5)).await.expect("a up");
    next_up(&mut eb, Duration::from_secs(5)).await.expect("b up");
    ha.send(sa, hello());
    // Box b drops the frame, closes; box a dials again and a new session carries messages.
    let sb2 = next_up(&mut eb, Duration::from_secs(10)).await.expect("b up again");
    assert_eq!(hb.stats.bad_frames.load(Ordering::Relaxed), 1);
    let sa2 = next_up(&mut ea, Duration::from_secs(5)).await.expect("a up again");
    assert!(sa2 > sa && sb2 > 1);
    ha.send(sa2, hello());
    let got = drain(&mut eb, Duration::from_millis(500)).await;
    assert!(
        got.iter().any(|e| matches!(e, LinkEvent::Message { session, msg } if *session == sb2 && *msg == hello())),
        "{got:?}"
    );
}

/// Copies bytes both ways between two streams until either side closes or `limit` passes.
async fn splice(mut x: TcpStream, mut y: TcpStream, limit: Duration) {
    let _ = tokio::time::timeout(limit, tokio::io::copy_bidirectional(&mut x, &mut y)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_between_the_two_listeners_gets_no_session_and_leaves_the_link_alone() {
    let (pa, pb) = (free_port(), free_port());
    let (ha, mut ea) = link::spawn(cfg("box-a", pa, pb, KEY));
    let (hb, mut eb) = link::spawn(cfg("box-b", pb, pa, KEY));
    next_up(&mut ea, Duration::from_secs(5)).await.expect("a up");
    next_up(&mut eb, Duration::from_secs(5)).await.expect("b up");
    // Let a simultaneous dial settle on its one connection first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = (drain(&mut ea, Duration::from_millis(50)).await, drain(&mut eb, Duration::from_millis(50)).await);
    let rejected = |h: &LinkHandle| h.stats.rejected.load(Ordering::Relaxed);
    let sessions = |h: &LinkHandle| h.stats.sessions.load(Ordering::Relaxed);
    let before = (rejected(&ha), rejected(&hb));
    let sessions_before = (sessions(&ha), sessions(&hb));
    // An attacker at the partner's own address (here: loopback) connects to both listeners and
    // relays each one's handshake to the other: both claim to be the acceptor, so neither
    // gets a session, however often it is tried.
    for _ in 0..20 {
        let (x, y) = (TcpStream::connect(pa).await.unwrap(), TcpStream::connect(pb).await.unwrap());
        splice(x, y, Duration::from_millis(300)).await;
    }
    wait_rejected(&ha, before.0 + 20).await;
    wait_rejected(&hb, before.1 + 20).await;
    for ev in [&mut ea, &mut eb] {
        let seen = drain(ev, Duration::from_millis(200)).await;
        assert!(seen.is_empty(), "the relay reached the link's user (a flap or a message): {seen:?}");
    }
    assert_eq!((sessions(&ha), sessions(&hb)), sessions_before, "no session was made or replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_lock_the_partner_out() {
    let (pb, hb, mut eb) = listener_only("box-b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Idle connections from the partner's address, opened faster than a handshake times out,
    // for the whole time the real partner needs to come up (bounded: 3 s, 300 connections).
    let flood = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..300 {
            if let Ok(s) = TcpStream::connect(pb).await {
                held.push(s);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        held
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_ha, mut ea) = link::spawn(cfg("box-a", free_port(), pb, KEY));
    next_up(&mut ea, Duration::from_secs(3)).await.expect("the partner got a handshake slot during the flood");
    next_up(&mut eb, Duration::from_secs(1)).await.expect("b up");
    assert!(hb.stats.rejected.load(Ordering::Relaxed) > 0, "the flood took slots that were taken back");
    drop(flood.await.unwrap());
}
