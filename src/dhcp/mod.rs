//! DHCPv4 protocol logic (RFC 2131/2132) on top of dhcproto's wire format. No I/O here: the
//! driver in `server` feeds requests in and carries the decisions out.

pub mod classify;
pub mod decide;
pub mod encode;
pub mod inbound;
#[cfg(test)]
mod options_tests;
pub mod reply;
#[cfg(test)]
mod tests;

pub use decide::{Answer, Decision, Ingress, PendingOffer, Refused, Reply, Silence, after_probe, handle};
pub use inbound::{Rejected, Request, parse};
pub use reply::{Destination, Scope};
