//! DHCPv4 protocol logic (RFC 2131/2132) on top of dhcproto's wire format. No I/O here: the
//! driver in `server` feeds requests in and carries the outcomes out.

pub mod decide;
pub mod inbound;
pub mod reply;
#[cfg(test)]
mod tests;

pub use decide::{Action, Ingress, Outcome, PendingOffer, Reply, Silence, after_probe, handle};
pub use inbound::{Rejected, Request, parse};
pub use reply::Destination;
