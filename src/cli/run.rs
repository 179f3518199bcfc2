//! `twinlease run`: the daemon. Standalone without `[arbiter]`; otherwise the DHCP service
//! follows the election.

use std::process::ExitCode;
use std::time::Duration;

use twinlease::config::{Arbiter, Config};
use twinlease::election::backend::{AnyBackend, Backend};
use twinlease::election::promise::PromiseFile;
use twinlease::election::{Election, ElectionHooks, Params, Uuid};
use twinlease::events::Events;
use twinlease::role::Role;
use twinlease::server::ElectionLink;
use twinlease::sync::machine::Readiness;

/// `pin_role` (tests only): "standby" or "active:TERM" in place of the election.
pub(super) async fn run(cfg: Config, pin_role: Option<&str>) -> anyhow::Result<ExitCode> {
    let pinned = pin_role.map(parse_pin).transpose()?;
    twinlease::logging::init(cfg.log_filter.as_deref());
    if let Some(r) = pinned {
        let (_role_tx, role) = tokio::sync::watch::channel(r);
        twinlease::server::run(cfg, role, "pinned").await?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(a) = cfg.arbiter.clone() else {
        let (_role_tx, role) = twinlease::role::standalone();
        twinlease::server::run(cfg, role, "standalone").await?;
        return Ok(ExitCode::SUCCESS);
    };
    elected(cfg, a).await
}

fn parse_pin(pin: &str) -> anyhow::Result<Role> {
    if pin == "standby" {
        return Ok(Role::Standby);
    }
    match pin.strip_prefix("active:").and_then(|t| t.parse().ok()) {
        Some(term) => Ok(Role::active(term)),
        None => anyhow::bail!("--pin-role takes \"standby\" or \"active:TERM\""),
    }
}

/// A demoted box stays in the process and re-enters the election (same uuid), so a box whose
/// heartbeat answers were merely lost renews its own row and serves again within one interval.
/// Only a T mismatch with the arbiter's row ends the process (exit 1; systemd restarts it).
async fn elected(cfg: Config, a: Arbiter) -> anyhow::Result<ExitCode> {
    let backend = AnyBackend::from_config(&a)?;
    let mut election = Election::new(backend, Params::from_config(&a), &a.utype, &cfg.node.name, &a.endpoint);
    election.startup_check().await?;
    let uuid = election.uuid();
    let (role_tx, role_rx) = tokio::sync::watch::channel(Role::Standby);
    let events = Events::default();
    let (link, mut side) = ElectionLink::new(events.clone());
    // With a partner, it is the third voter: its votes ride on the peer link, and a promise
    // this box gives it is recorded in the state directory first.
    let promises = match cfg.peer {
        Some(_) => Some(PromiseFile::new(&cfg.node.state_dir)?),
        None => None,
    };
    let peer = cfg.peer.as_ref().map(|_| side.votes);
    let mut elected = tokio::spawn(async move {
        // A box stands only once lease sync has caught up with its partner (or found it
        // unreachable), so a new primary never serves from a stale lease table.
        let _ = side.readiness.wait_for(|r| *r != Readiness::Waiting).await;
        let hooks = ElectionHooks {
            role: role_tx,
            eligible: side.eligible,
            commands: side.commands,
            view: side.view,
            events,
            peer,
            promises,
        };
        election.run(hooks).await
    });
    tokio::select! {
        r = twinlease::server::run_with(cfg, role_rx, link) => {
            r?;
            // The DHCP service has stopped (and sent its last released ACK): hand the row
            // over now, so the partner takes over within an interval instead of after T.
            elected.abort();
            release(&a, uuid).await;
            Ok(ExitCode::SUCCESS)
        }
        halted = &mut elected => {
            let why = halted.map_or_else(|e| format!("election task failed: {e}"), |e| e.to_string());
            anyhow::bail!("{why}")
        }
    }
}

async fn release(a: &Arbiter, uuid: Uuid) {
    let limit = a.interval.max(Duration::from_secs(1));
    let released = match AnyBackend::from_config(a) {
        Ok(mut b) => tokio::time::timeout(limit, b.release(&a.utype, uuid)).await,
        Err(e) => Ok(Err(e)),
    };
    match released {
        Ok(Ok(true)) => {
            tracing::info!(mono_ns = twinlease::clock::monotonic().as_nanos() as u64, "handed the arbiter row over")
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not hand the arbiter row over; the partner takes over after T"),
        Err(_) => tracing::warn!("the arbiter did not answer the hand-over; the partner takes over after T"),
    }
}
