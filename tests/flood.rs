//! A DISCOVER flood at a small pool, from a host on the LAN: thousands of mutated DISCOVERs
//! with random hardware addresses (some with a bad hlen, truncated, or with an option running
//! past the end). Real clients still get a lease promptly, during and after the flood; the
//! lease and the reservation made before it are untouched; each broadcast is received and
//! counted once; and the log stays short, with the exact numbers in the status counters.

mod common;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType};
use dhcproto::{Encodable, Encoder};

/// A small seeded PRNG (xorshift64*): the same flood every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One flood datagram: a DISCOVER from a random (locally administered) hardware address, six in
/// ten sent as they are, the rest mutated the way broken or hostile senders do.
fn mutated_discover(rng: &mut Rng) -> Vec<u8> {
    let r = rng.next().to_be_bytes();
    let hw = [0x02, r[0], r[1], r[2], r[3], r[4]];
    let z = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(rng.next() as u32, z, z, z, z, &hw);
    m.set_flags(Flags::default().set_broadcast());
    m.opts_mut().insert(DhcpOption::MessageType(MessageType::Discover));
    let mut bytes = Vec::new();
    m.encode(&mut Encoder::new(&mut bytes)).unwrap();
    match rng.below(10) {
        6 => bytes[2] = rng.below(256) as u8, // hlen
        7 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
        8 => {
            // An option whose length runs past the end of the datagram.
            let end = bytes.len() - 1; // the END option
            bytes.truncate(end);
            bytes.extend_from_slice(&[12, 200, b'x', b'y']);
        }
        9 => {
            for _ in 0..4 {
                let i = 240 + rng.below((bytes.len() - 240) as u64) as usize;
                bytes[i] = rng.next() as u8;
            }
        }
        _ => {}
    }
    bytes
}

/// Floods from `sock` at about `rate` datagrams a second until `stop` is set (and at least
/// `min` are sent, at most `max`), counting them in `sent`.
fn flood(sock: UdpSocket, rate: u64, min: u64, max: u64, stop: &AtomicBool, sent: &AtomicU64) {
    let to = SocketAddr::from(([255, 255, 255, 255], 67));
    let mut rng = Rng(0x5eed_f100d);
    let start = Instant::now();
    let mut n = 0;
    while n < max && (n < min || !stop.load(Ordering::Relaxed)) {
        // Paced in slices of 10 ms, so the rate holds without a sleep per datagram.
        let due = start.elapsed().as_millis() as u64 * rate / 1000;
        while n < due.min(max) {
            if sock.send_to(&mutated_discover(&mut rng), to).is_ok() {
                n += 1;
                sent.store(n, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs udhcpc (retrying every second for up to 40 s): how long it ran, and its lease if it
/// got one.
fn timed_lease(ns: &Netns, iface: &str, dir: &std::path::Path) -> (Duration, Option<ClientEvent>) {
    let started = Instant::now();
    let (out, ev) = udhcpc_once(ns, iface, dir, &["-t", "40", "-T", "1"]);
    let took = started.elapsed();
    let bound = events(&ev).into_iter().rfind(|e| e.get("reason") == Some("bound"));
    (took, bound.filter(|_| out.status.success()))
}

fn lines_since(log: &str, skip: usize) -> Vec<String> {
    log.lines().skip(skip).map(str::to_string).collect()
}

#[test]
fn a_discover_flood_starves_no_real_client_and_writes_a_short_log() {
    let mut lan = Lan::new("198.18.0.1/24");
    let (attacker, resident, reserved, during, after) =
        (lan.add_client(), lan.add_client(), lan.add_client(), lan.add_client(), lan.add_client());
    lan.set_mac(reserved, "02:00:00:00:0f:01");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.200\"]\n\
         [[reservation]]\nname = \"printer\"\nhw = [\"02:00:00:00:0f:01\"]\nip = \"198.18.0.20\"\n",
        lan.bridge
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let (rns, rif) = lan.client(resident);
    let (_, before) = timed_lease(rns, rif, dir.path());
    let resident_ip = before.expect("a lease before the flood").get("ip").unwrap().to_string();

    // The flood: at least 6,000 datagrams at 1,000/s, on until the real client is done.
    let log_mark = srv.log_text().lines().count();
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (ans, aif) = lan.client(attacker);
    let sock = client::client_socket(ans, aif);
    let flooding = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || flood(sock, 1000, 6000, 60_000, &stop, &sent))
    };
    let flood_start = Instant::now();
    // Every address is on offer to the flood before the real client asks.
    // Every address is on offer to the flood before the real client asks (200 DISCOVERs
    // answered or refused, for 101 addresses).
    srv.wait_until("the pool held by the flood's offers", Duration::from_secs(30), |s| {
        s.dhcp.replies["offer"] + s.dhcp.pool_exhausted >= 200
    });
    let (dns, dif) = lan.client(during);
    let (took_during, got) = timed_lease(dns, dif, dir.path());
    let (pns, pif) = lan.client(reserved);
    let (_, printer) = timed_lease(pns, pif, dir.path());
    stop.store(true, Ordering::Relaxed);
    flooding.join().unwrap();
    let flood_secs = flood_start.elapsed().as_secs_f64();
    let flood_log = lines_since(&srv.log_text(), log_mark);

    let (ans, aif) = lan.client(after);
    let (took_after, after_lease) = timed_lease(ans, aif, dir.path());
    let sent = sent.load(Ordering::Relaxed);
    let status = srv.status();
    eprintln!(
        "FLOOD {sent} datagrams in {flood_secs:.1} s: real client's lease {} ms during, {} ms after; \
         {} log lines during the flood; status: {:?}",
        took_during.as_millis(),
        took_after.as_millis(),
        flood_log.len(),
        status.dhcp
    );

    let got = got.expect("a lease during the flood");
    assert_eq!(got.get("server"), Some("198.18.0.1"));
    assert!(took_during < Duration::from_secs(20), "{took_during:?} to a lease during the flood");
    let printer = printer.expect("the reserved host's lease during the flood");
    assert_eq!(printer.get("ip"), Some("198.18.0.20"), "the reserved host got its address");
    assert!(after_lease.is_some(), "no lease after the flood");
    let rows = srv.leases();
    let row = lease_of(&rows, &resident_ip).expect("the resident's lease");
    assert_eq!(row["state"], "leased", "the flood took a leased address: {row}");
    // Each broadcast is received (and counted, parsed) once, not once per socket.
    let d = &status.dhcp;
    assert!(d.received >= sent / 2 && d.received < sent + 100, "{} received for {sent} sent", d.received);
    assert!(d.dropped["duplicate"] < 10, "the relay socket read the served interface's broadcasts: {d:?}");
    assert!(d.offers_reclaimed > 0, "{d:?}");
    // Summaries, not a line per packet: at most two per kind per 10 s, plus the clients' own.
    let bound = 10 + 8 * (flood_secs / 10.0).ceil() as usize;
    assert!(flood_log.len() <= bound, "{} lines (bound {bound}):\n{}", flood_log.len(), flood_log.join("\n"));
    wait_for("the reclaim summary", Duration::from_secs(15), || {
        srv.log_text().contains("offers reclaimed for new clients in the last 10 s").then_some(())
    });
}
