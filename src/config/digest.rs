//! The configuration digest: a SHA-256 over everything that decides what a client is answered
//! (subnets, pools, shared networks, options, classes, reservations and the lease timing
//! rules), written field by field in a fixed order. The two boxes of a pair must give the same
//! answers, so they exchange digests when their sync session starts and warn when they differ.
//!
//! Left out on purpose, because they differ between the boxes or do not change an answer: the
//! node name, state directory, served interface names (except as class matches), ping settings,
//! limits, logging, the arbiter and the peer link.

use std::fmt;

use sha2::{Digest, Sha256};

use super::{AddrSet, Class, Config, OptionSet, Pattern};

#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConfigDigest(pub [u8; 32]);

impl ConfigDigest {
    /// The first 8 bytes in hex: what logs and status lines show.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for ConfigDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

impl fmt::Debug for ConfigDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigDigest({})", self.short())
    }
}

/// Writes values with their lengths, so that no two different configurations write the same
/// byte stream.
struct H(Sha256);

impl H {
    fn u64(&mut self, v: u64) {
        self.0.update(v.to_be_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.update(b);
    }
    fn text(&mut self, t: &str) {
        self.bytes(t.as_bytes());
    }
    fn opt_text(&mut self, t: Option<&str>) {
        match t {
            Some(t) => {
                self.u64(1);
                self.text(t);
            }
            None => self.u64(0),
        }
    }
    fn addrs(&mut self, s: &AddrSet) {
        self.u64(s.ranges().len() as u64);
        for r in s.ranges() {
            self.u64(u32::from(r.first).into());
            self.u64(u32::from(r.last).into());
        }
    }
    fn options(&mut self, o: &OptionSet) {
        self.u64(o.iter().count() as u64);
        for v in o.iter() {
            self.u64(v.code.into());
            self.u64(v.enterprise.map_or(u64::MAX, u64::from));
            self.bytes(&v.data);
            self.u64(v.always_send.into());
        }
        self.u64(o.next_server.map_or(u64::MAX, |a| u32::from(a).into()));
        self.opt_text(o.boot_file.as_deref());
        self.opt_text(o.server_name.as_deref());
    }
    fn patterns(&mut self, list: &[Pattern]) {
        self.u64(list.len() as u64);
        for p in list {
            self.bytes(&p.bytes);
            self.u64(p.kind as u64);
        }
    }
    fn class(&mut self, c: &Class, interfaces: &[String]) {
        self.text(&c.name);
        self.patterns(&c.vendor_class);
        self.patterns(&c.user_class);
        self.u64(c.hw_prefix.len() as u64);
        for h in &c.hw_prefix {
            self.bytes(h);
        }
        self.patterns(&c.circuit_id);
        self.patterns(&c.remote_id);
        self.u64(c.interfaces.len() as u64);
        for i in &c.interfaces {
            self.text(&interfaces[*i]);
        }
        self.u64(c.relays.len() as u64);
        for r in &c.relays {
            self.u64(u32::from(r.network()).into());
            self.u64(r.prefix_len().into());
        }
        self.options(&c.options);
    }
}

pub(super) fn of(c: &Config) -> ConfigDigest {
    let mut h = H(Sha256::new());
    h.text("twinlease config digest 1");
    let d = &c.dhcp;
    for v in [d.offer_hold_secs, d.decline_probation_secs, d.affinity_hold_secs, d.on_alias_busy as u64] {
        h.u64(v);
    }
    h.options(&c.options);
    h.u64(c.classes.len() as u64);
    for class in &c.classes {
        h.class(class, &d.interfaces);
    }
    h.u64(c.subnets.len() as u64);
    for s in &c.subnets {
        h.u64(u32::from(s.net.network()).into());
        h.u64(s.net.prefix_len().into());
        h.u64(s.network as u64);
        for t in [s.lease_secs, s.renew_secs, s.rebind_secs] {
            h.u64(t.into());
        }
        h.options(&s.options);
        h.u64(s.pools.len() as u64);
        for p in &s.pools {
            let pool = &c.pools[*p];
            h.addrs(&pool.addrs);
            h.u64(pool.allow.0);
            h.u64(pool.deny.0);
            h.options(&pool.options);
        }
    }
    h.u64(c.networks.len() as u64);
    for n in &c.networks {
        h.opt_text(n.name.as_deref());
        h.u64(n.subnets.len() as u64);
        for s in &n.subnets {
            h.u64(*s as u64);
        }
    }
    h.u64(c.reservations.len() as u64);
    for r in &c.reservations {
        h.text(&r.name);
        h.u64(u32::from(r.ip).into());
        h.u64(r.on_alias_busy as u64);
        h.u64(r.hw.len() as u64);
        for m in &r.hw {
            h.bytes(m);
        }
        h.u64(r.client_ids.len() as u64);
        for id in &r.client_ids {
            h.bytes(id);
        }
        h.options(&r.options);
    }
    ConfigDigest(h.0.finalize().into())
}
