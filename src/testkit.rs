//! Small helpers shared by the unit tests: addresses and clients in the test subnet.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType};
use dhcproto::{Encodable, Encoder};

use crate::dhcp::{Ingress, Request};
use crate::lease::ClientKey;

/// 198.18.0.`last`.
pub(crate) fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, last)
}

/// The hardware address of test client `n`.
pub(crate) fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

/// Test client `n`, identified by its hardware address.
pub(crate) fn key(n: u8) -> ClientKey {
    ClientKey::from_hw(1, &mac(n))
}

/// A request that arrived on the served LAN 198.18.0.0/24 (this server is 198.18.0.1).
pub(crate) fn lan() -> Ingress {
    Ingress {
        iface_addrs: vec!["198.18.0.1/24".parse().unwrap()],
        local_dst: Ipv4Addr::BROADCAST,
        served: true,
        interface: Some(0),
    }
}

/// A client's DHCP message, built field by field.
pub(crate) struct Msg(pub(crate) Message);

impl Msg {
    pub(crate) fn new(kind: MessageType, n: u8) -> Msg {
        let mut m = Message::new_with_id(
            0x1234_5600 + u32::from(n),
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac(n),
        );
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        Msg(m)
    }
    pub(crate) fn opt(mut self, o: DhcpOption) -> Msg {
        self.0.opts_mut().insert(o);
        self
    }
    pub(crate) fn ciaddr(mut self, a: Ipv4Addr) -> Msg {
        self.0.set_ciaddr(a);
        self
    }
    pub(crate) fn giaddr(mut self, a: Ipv4Addr) -> Msg {
        self.0.set_giaddr(a);
        self
    }
    pub(crate) fn broadcast(mut self) -> Msg {
        self.0.set_flags(Flags::default().set_broadcast());
        self
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.0.encode(&mut Encoder::new(&mut v)).unwrap();
        v
    }
    pub(crate) fn req(&self) -> Request {
        crate::dhcp::parse(&self.bytes()).unwrap()
    }
}
