//! Safe updates of the appliance (README "Updating"): a signed bundle goes into the root slot
//! that is not running, behind a systemd-boot entry with boot counting; a slot that does not
//! come up healthy three times is left for the previous one. This module is I/O-free: the
//! bundle format and its checks ([`bundle`]), the slots and their boot entries ([`slots`]), the
//! rolling update of a pair ([`roll`]) and the partner's update port ([`peer`]).
//! The command that reads and writes the disk is `twinlease update` (src/cli/update.rs).

pub mod bundle;
pub mod peer;
pub mod roll;
pub mod slots;
pub mod socket;
