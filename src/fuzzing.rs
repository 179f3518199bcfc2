//! Fuzzing entry points: one function per target, each taking arbitrary bytes. None may panic
//! or hang on any input; where the code keeps an invariant, the target checks it too. The
//! libFuzzer crate in `fuzz/`, the stable mutation loop (`examples/fuzz_stable.rs`) and the
//! corpus regression test (`tests/fuzz_corpus.rs`) all call these, so a crash found by one is
//! replayed by the others.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::allocator::Allocator;
use crate::config::{Config, LocalAddrs};
use crate::dhcp::{self, Ingress};
use crate::election::backend;
use crate::election::machine::{Effect, Elector, Reply};
use crate::election::{Beat, Params};
use crate::sync::{frame, protocol};

/// A target: arbitrary bytes in, nothing out (a panic is a finding).
pub type Target = fn(&[u8]);

/// Every target by name (the names of `fuzz/fuzz_targets/*.rs` and `fuzz/corpus/*`).
pub const TARGETS: [(&str, Target); 4] =
    [("dhcp", dhcp), ("peer_link", peer_link), ("config", config), ("arbiter_answer", arbiter_answer)];

/// The configuration the DHCP target decides with: a served LAN with a class pool and an alias
/// group's reservation, and a relayed shared network of two subnets.
const DHCP_CONFIG: &str = r#"
[node]
name = "fuzz"
[dhcp]
interfaces = ["lan0"]
offer_hold_secs = 30
[[class]]
name = "phones"
vendor_class = ["Polycom*", "yealink*"]
[[class]]
name = "relayed-port7"
relay = ["198.18.8.1"]
circuit_id = ["0x0004000700*", "*port7*"]
[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.109"]
routers = ["198.18.0.1"]
[[subnet.pool]]
range = "198.18.0.120-198.18.0.124"
allow_classes = ["phones"]
[[subnet]]
cidr = "198.18.8.0/24"
shared_network = "relayed"
pools = ["198.18.8.10-198.18.8.14"]
routers = ["198.18.8.1"]
[[subnet]]
cidr = "198.18.9.0/24"
shared_network = "relayed"
pools = ["198.18.9.10-198.18.9.14"]
[[reservation]]
name = "printer"
hw = ["02:00:00:00:00:01", "02:00:00:00:00:02"]
ip = "198.18.0.50"
"#;

/// The fixed allocator state every DHCP input meets: some addresses leased, some on offer.
fn dhcp_state() -> &'static (Config, Allocator) {
    static STATE: OnceLock<(Config, Allocator)> = OnceLock::new();
    STATE.get_or_init(|| {
        let cfg = Config::parse(Path::new("fuzz.toml"), DHCP_CONFIG, &LocalAddrs::default())
            .expect("the DHCP target's configuration is valid");
        let mut alloc = Allocator::new(&cfg);
        for n in 0..6u8 {
            let hw = [2, 0, 0, 0, 1, n];
            let client = crate::lease::ClientKey::from_hw(1, &hw);
            let addr = Ipv4Addr::new(198, 18, 0, 100 + n);
            match n % 2 {
                0 => drop(alloc.lease(addr, &client, &hw, Some("host"), 3600, NOW - 100)),
                _ => drop(alloc.offer(addr, &client, &hw, NOW - 10)),
            }
        }
        (cfg, alloc)
    })
}

const NOW: u64 = 2_000_000_000;

/// DHCP parse and decide: a datagram as it comes off a socket, through the whole inbound path
/// to a decision on the fixed allocator state, which must stay consistent. An even length
/// arrives as a broadcast on the served LAN, an odd one on the relay socket.
pub fn dhcp(data: &[u8]) {
    let Ok(req) = dhcp::parse(data) else { return };
    let (cfg, alloc) = dhcp_state();
    let mut alloc = alloc.clone();
    let lan = data.len().is_multiple_of(2);
    let ingress = Ingress {
        iface_addrs: vec![if lan { "198.18.0.1/24" } else { "198.18.7.1/24" }.parse().expect("a network")],
        local_dst: if lan { Ipv4Addr::BROADCAST } else { Ipv4Addr::new(198, 18, 7, 1) },
        served: lan,
        interface: lan.then_some(0),
    };
    let decision = dhcp::handle(cfg, &mut alloc, &req, &ingress, NOW, lan);
    if let dhcp::Answer::Probe(p) = decision.answer {
        let _ = dhcp::after_probe(cfg, &mut alloc, p, data.first().is_some_and(|b| b & 1 == 1), NOW);
    }
    if let Err(e) = alloc.check_invariants(NOW) {
        panic!("allocator inconsistent after a request: {e}");
    }
}

const PEER_KEY: &[u8] = b"fuzzing key, 32 bytes or so long";

/// The peer link: the first byte picks what the rest is. 0: a handshake frame (before
/// authentication); 1: a data frame from someone without the key (the tag must fail); else a
/// message body the partner sealed, opened and decoded as after authentication (a decoded
/// message must encode and decode to itself).
pub fn peer_link(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mine = frame::Hello { side: frame::Side::Acceptor, node: "a".into(), nonce: [1; frame::NONCE_LEN] };
    let theirs = frame::Hello { side: frame::Side::Dialer, node: "b".into(), nonce: [2; frame::NONCE_LEN] };
    match mode {
        0 => drop(frame::open_handshake(PEER_KEY, rest)),
        1 => {
            let (_, mut opener) = frame::session(PEER_KEY, &mine, &theirs).expect("opposite sides");
            assert!(opener.open(rest).is_err(), "a frame forged without the key was accepted");
        }
        _ => {
            let (_, mut opener) = frame::session(PEER_KEY, &mine, &theirs).expect("opposite sides");
            let (mut sealer, _) = frame::session(PEER_KEY, &theirs, &mine).expect("opposite sides");
            let sealed = sealer.seal(rest);
            let Ok(body) = opener.open(&sealed[4..]) else { return }; // too large a frame
            if let Ok(m) = protocol::decode(body) {
                let again = protocol::decode(&protocol::encode(&m)).expect("an encoded message decodes");
                assert_eq!(again, m, "a message changed in an encode-decode round trip");
            }
        }
    }
}

/// The configuration parser and validator on any text (bytes that are not UTF-8 as lossily
/// converted, the way a file with a bad byte is reported).
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = Config::parse(Path::new("fuzz.toml"), &text, &LocalAddrs::default());
}

/// Reads `n` bytes (fewer at the end) as a string, and moves on.
fn take_str(data: &mut &[u8]) -> String {
    let n = data.first().map_or(0, |b| usize::from(*b % 48));
    let rest = data.get(1..).unwrap_or_default();
    let (s, tail) = rest.split_at(n.min(rest.len()));
    *data = tail;
    String::from_utf8_lossy(s).into_owned()
}

fn take_i64(data: &mut &[u8]) -> i64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    i64::from_be_bytes(b)
}

/// The arbiter's answers: columns of a holder row as any database could return them (checked
/// by the backends' common row reader), or a heartbeat's outcome, fed to an election machine
/// that asked; the machine must keep its promise never to be active past its lease.
pub fn arbiter_answer(mut data: &[u8]) {
    let params = Params { interval: Duration::from_secs(1), timeout: Duration::from_secs(5) };
    let me = uuid::Uuid::from_u128(0xa);
    let mut m = Elector::new(params, me, "fuzz/dhcp", Duration::ZERO);
    let mut now = Duration::ZERO;
    for _ in 0..8 {
        let Some(&kind) = data.first() else { return };
        data = &data[1..];
        let id = m.poll(now).iter().find_map(|e| match e {
            Effect::Send { id, .. } => Some(*id),
            _ => None,
        });
        let reply = match kind % 4 {
            0 => {
                let (utype, uuid, name, endpoint) =
                    (take_str(&mut data), take_str(&mut data), take_str(&mut data), take_str(&mut data));
                let uuid = if uuid.is_empty() { me.to_string() } else { uuid };
                let utype = if utype.is_empty() { "fuzz/dhcp".to_string() } else { utype };
                let (term, timeout_ms, ts_us, age_ms) =
                    (take_i64(&mut data), take_i64(&mut data), take_i64(&mut data), take_i64(&mut data));
                match backend::row(utype, &uuid, name, endpoint, term, timeout_ms, ts_us, age_ms, kind & 16 != 0) {
                    Ok(row) => Reply::Read(Some(row)),
                    Err(e) => Reply::Failed(e.to_string()),
                }
            }
            1 => Reply::Beat(Beat::Applied { ts_us: take_i64(&mut data), term: take_i64(&mut data) as u64 }),
            2 => Reply::Beat(Beat::NotApplied),
            _ => Reply::Read(None),
        };
        if let Some(id) = id {
            m.on_reply(now, id, reply);
        }
        if let Some(end) = m.lease_end()
            && m.active_term(now).is_some()
        {
            assert!(end <= now + params.timeout, "a lease past T from now: {end:?} at {now:?}");
        }
        now += Duration::from_millis(u64::from(kind) * 8);
    }
}
