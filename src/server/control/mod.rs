//! The status and control sockets (JSON, one object per line), the commands they answer, the
//! status object, the client the command line uses, and the Prometheus text format.

pub mod client;
pub mod commands;
mod listener;
pub mod metrics;
pub mod protocol;
pub mod status;
#[cfg(test)]
mod tests;
mod update;

pub use commands::{Caller, Handlers};
pub use listener::{ControlError, ControlSockets};
pub use status::{Sources, Status};
