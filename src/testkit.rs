//! Small helpers shared by the unit tests: addresses and clients in the test subnet.

use std::net::Ipv4Addr;

use crate::lease::ClientKey;

/// 198.18.0.`last`.
pub fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, last)
}

/// The hardware address of test client `n`.
pub fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

/// Test client `n`, identified by its hardware address.
pub fn key(n: u8) -> ClientKey {
    ClientKey::from_hw(1, &mac(n))
}
