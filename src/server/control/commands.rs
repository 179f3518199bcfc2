//! What each command does. Read-only commands answer on both sockets; actions only on the
//! control socket, and each is logged with the caller's uid. Lookups read the lease database
//! through a read-only connection of their own, so a slow query never holds up the DHCP path.

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::protocol::{Request, Response, SUCCESS, VERSION};
use super::status::Sources;
use super::update;
use crate::config::Config;
use crate::election::ElectionCommand;
use crate::events::EventKind;
use crate::lease::{Binding, LeaseState, fmt_hw};
use crate::server::eligibility::Maintenance;
use crate::server::engine::EngineCommand;
use crate::store::{ConflictRecord, LeaseStore, StoredBinding};

/// Commands anyone allowed on the status socket may send.
pub const READ_ONLY: &[&str] =
    &["list-commands", "version-get", "status-get", "lease-get", "lease-list", "conflicts-get", "update-status"];
/// Most leases one `lease-list` page carries (about 300 bytes each as JSON).
pub const MAX_PAGE: usize = 1000;
/// Unpaged `lease-list` answers being built (see there).
static WHOLE_TABLE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
/// Commands only the control socket accepts.
pub const ACTIONS: &[&str] =
    &["step-down", "maintenance", "sync-from-partner", "reload", "partner-down", "update-install", "update-pair"];

/// What `partner-down` risks, said before it acts.
pub const PARTNER_DOWN_RISK: &str = "partner-down makes this box active without the arbiter's or the partner's vote. \
If the partner is in fact running (only its cables are cut), both boxes may answer clients and hand out \
the same addresses until they see each other again. Use it only after seeing that the other box is off or unplugged.";

/// Who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: Option<u32>,
    /// Came in on the control socket.
    pub may_act: bool,
}

/// What the commands act on.
#[derive(Clone)]
pub struct Handlers {
    pub sources: Sources,
    pub engine: mpsc::Sender<EngineCommand>,
    pub election: Option<mpsc::Sender<ElectionCommand>>,
}

impl Handlers {
    pub async fn handle(&self, req: &Request, caller: Caller) -> Response {
        let result = match req.command.as_str() {
            "list-commands" => Ok(list_commands(caller)),
            "version-get" => Ok(Response::success(
                format!("twinlease {}", env!("CARGO_PKG_VERSION")),
                json!({"version": env!("CARGO_PKG_VERSION"), "protocol": VERSION}),
            )),
            "status-get" => self.status(),
            "lease-get" => self.lease_get(req).await,
            "lease-list" => self.lease_list(req).await,
            "conflicts-get" => self.conflicts().await,
            "update-status" => Ok(update::status(&self.sources.cfg.control.update_socket).await),
            action if ACTIONS.contains(&action) && !caller.may_act => Ok(Response::error(format!(
                "'{action}' changes what the box does: send it on the control socket (root or the admin group)"
            ))),
            "step-down" => self.step_down(caller).await,
            "maintenance" => self.maintenance(req, caller).await,
            "sync-from-partner" => self.sync_from_partner(caller).await,
            "reload" => self.reload(caller).await,
            "partner-down" => self.partner_down(req, caller).await,
            "update-install" | "update-pair" => Ok(self.update(req, caller).await),
            other => Ok(Response::unsupported(other)),
        };
        result.unwrap_or_else(|r| r)
    }

    fn status(&self) -> Result<Response, Response> {
        let s = self.sources.status();
        let text = s.summary.clone();
        Ok(Response::success(text, serde_json::to_value(s).expect("status serializes")))
    }

    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&LeaseStore) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, Response> {
        let path = self.sources.cfg.lease_db_path();
        let r = tokio::task::spawn_blocking(move || LeaseStore::open_read_only(&path).and_then(|s| f(&s))).await;
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Response::error(format!("cannot read the lease store: {e}"))),
            Err(e) => Err(Response::error(format!("lease lookup failed: {e}"))),
        }
    }

    /// One lease by "address", "hw-address", "client-id" or "hostname".
    async fn lease_get(&self, req: &Request) -> Result<Response, Response> {
        let keys = ["address", "hw-address", "client-id", "hostname"];
        let Some((key, value)) = keys.iter().find_map(|k| req.text(k).transpose().map(|v| (*k, v))) else {
            return Err(Response::error("give one of: address, hw-address, client-id, hostname"));
        };
        let value = value?.to_string();
        if key == "address" {
            value.parse::<Ipv4Addr>().map_err(|_| Response::error(format!("'{value}' is not an IPv4 address")))?;
        }
        let now = crate::clock::unix_now();
        let wanted = value.clone();
        let found = self
            .with_store(move |s| {
                let mut found = Vec::new();
                s.for_each_binding(|r| {
                    if matches(&r.binding, key, &wanted) {
                        found.push(lease_json(&r, now));
                    }
                })?;
                Ok(found)
            })
            .await?;
        match found.len() {
            0 => Ok(Response::empty(format!("no lease with {key} {value}"))),
            n => Ok(Response::success(format!("{n} lease(s) with {key} {value}"), json!({ "leases": found }))),
        }
    }

    /// Every binding in use ("all": also free addresses with a history). With "limit", one page:
    /// at most that many (up to [`MAX_PAGE`]) after the address "from" (from the start without
    /// it), and "next", the "from" of the following page, while there may be more. Paged, a table
    /// of any size costs the daemon one page of memory per client at a time; without "limit" the
    /// whole table comes in one answer, as protocol 1 clients expect.
    async fn lease_list(&self, req: &Request) -> Result<Response, Response> {
        let all = req.flag("all")?;
        let now = crate::clock::unix_now();
        let Some(limit) = req.number("limit")? else {
            // A whole table of 65,536 leases costs some 350 MB while it is built as one answer:
            // one such answer is built at a time, so clients asking together do not multiply it.
            let _turn = WHOLE_TABLE.acquire().await.map_err(|_| stopped())?;
            let v = self
                .with_store(move |s| {
                    let mut v = Vec::new();
                    s.for_each_binding(|r| {
                        if all || r.binding.state != LeaseState::Free {
                            v.push(lease_json(&r, now));
                        }
                    })?;
                    Ok(v)
                })
                .await?;
            return Ok(Response::success(format!("{} leases", v.len()), json!({ "leases": v })));
        };
        let limit = match usize::try_from(limit) {
            Ok(n @ 1..=MAX_PAGE) => n,
            _ => return Err(Response::error(format!("limit must be 1 to {MAX_PAGE}"))),
        };
        let from = match req.text("from")? {
            None => None,
            Some(a) => {
                Some(a.parse::<Ipv4Addr>().map_err(|_| Response::error(format!("from '{a}' is not an IPv4 address")))?)
            }
        };
        let rows = self.with_store(move |s| s.bindings_after(from, limit, all)).await?;
        let next = rows.last().filter(|_| rows.len() == limit).map(|r| r.binding.addr.to_string());
        let leases: Vec<Value> = rows.iter().map(|r| lease_json(r, now)).collect();
        let text = match &next {
            Some(n) => format!("{} leases; more from {n}", leases.len()),
            None => format!("{} leases; no more", leases.len()),
        };
        let mut arguments = json!({ "leases": leases });
        if let Some(n) = next {
            arguments["next"] = Value::String(n);
        }
        Ok(Response::success(text, arguments))
    }

    async fn conflicts(&self) -> Result<Response, Response> {
        let list = self.with_store(|s| s.conflicts()).await?;
        let v: Vec<Value> = list.iter().map(conflict_json).collect();
        Ok(Response::success(format!("{} conflicts", v.len()), json!({ "conflicts": v })))
    }

    async fn step_down(&self, caller: Caller) -> Result<Response, Response> {
        let Some(election) = &self.election else {
            return Err(Response::error(
                "this box has no election (standalone or pinned): there is no partner to hand to",
            ));
        };
        let (reply, was_active) = oneshot::channel();
        election.send(ElectionCommand::StepDown { reply }).await.map_err(|_| stopped())?;
        let was_active = was_active.await.map_err(|_| stopped())?;
        self.record(
            caller,
            if was_active { "step-down: service handed to the partner" } else { "step-down (was standby)" },
        );
        Ok(Response::done(if was_active {
            "stepped down: the partner takes over within an interval; this box stays standby"
        } else {
            "this box was not active; it holds off for T so the partner keeps the role"
        }))
    }

    async fn maintenance(&self, req: &Request, caller: Caller) -> Result<Response, Response> {
        let eligibility = &self.sources.eligibility;
        if self.election.is_none() {
            return Err(Response::error(
                "this box has no election (standalone or pinned): nobody would serve; stop the service instead",
            ));
        }
        match req.text("action")? {
            Some("start") => {
                if !req.flag("force")? && !self.partner_caught_up() {
                    return Err(Response::error(
                        "the partner is not caught up (or there is none): maintenance would leave nobody serving; send force=true to start it anyway",
                    ));
                }
                let m = Maintenance { since: crate::clock::unix_now(), by_uid: caller.uid.unwrap_or(u32::MAX) };
                eligibility
                    .set_maintenance(Some(m))
                    .map_err(|e| Response::error(format!("cannot record maintenance: {e}")))?;
                if let Some(election) = &self.election {
                    let (reply, _) = oneshot::channel();
                    election.send(ElectionCommand::StepDown { reply }).await.map_err(|_| stopped())?;
                }
                self.record(caller, "maintenance started: this box will not be active until it is cancelled");
                Ok(Response::done(
                    "maintenance started: this box will not be active until cancelled (survives a restart)",
                ))
            }
            Some("cancel") => {
                eligibility
                    .set_maintenance(None)
                    .map_err(|e| Response::error(format!("cannot clear maintenance: {e}")))?;
                self.record(caller, "maintenance cancelled");
                Ok(Response::done("maintenance cancelled: this box may stand in the election again"))
            }
            _ => Err(Response::error(
                "give action=start or action=cancel (and force=true to start without a caught-up partner)",
            )),
        }
    }

    /// The partner is linked, in sync and holds every binding this box has.
    fn partner_caught_up(&self) -> bool {
        let s = self.sources.status();
        s.partner.is_some_and(|p| p.caught_up())
    }

    async fn sync_from_partner(&self, caller: Caller) -> Result<Response, Response> {
        let (reply, started) = oneshot::channel();
        self.engine.send(EngineCommand::SyncFromPartner { reply }).await.map_err(|_| stopped())?;
        if !started.await.map_err(|_| stopped())? {
            return Err(Response::error("this box has no partner ([peer] is not configured)"));
        }
        self.record(caller, "full re-sync with the partner started");
        Ok(Response::done("full re-sync with the partner started: both tables are exchanged and merged"))
    }

    async fn reload(&self, caller: Caller) -> Result<Response, Response> {
        let running = &self.sources.cfg;
        let path = running.path.clone();
        let new = Config::load(&path)
            .and_then(|c| c.check_secret_files().map(|()| c))
            .map_err(|e| Response::error(format!("not reloaded: {e}")))?
            .with_overrides(running.overrides.clone());
        let fixed = running.fixed_differences(&new);
        if !fixed.is_empty() {
            let text = format!("not reloaded: these need a restart: {}", fixed.join(", "));
            self.sources.events.record(EventKind::Config, text.clone());
            return Err(Response::error(text));
        }
        let (reply, done) = oneshot::channel();
        self.engine.send(EngineCommand::Reload { cfg: Arc::new(new.clone()), reply }).await.map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?;
        if let Some(filter) = new.log_filter.as_deref().filter(|_| running.log_filter != new.log_filter) {
            crate::logging::set_filter(filter);
        }
        self.record(caller, format!("configuration reloaded from {}", path.display()));
        Ok(Response::done("reloaded: new lease times, options, holds and log filter apply from now on"))
    }

    /// The operator has seen that the partner is off: this box serves without its vote.
    /// Needs `yes-the-partner-is-off=true`; `operator` names the person (the log also has the uid).
    async fn partner_down(&self, req: &Request, caller: Caller) -> Result<Response, Response> {
        let Some(election) = &self.election else {
            return Err(Response::error(
                "this box has no election (standalone or pinned): it does not need its partner",
            ));
        };
        if !req.flag("yes-the-partner-is-off")? {
            return Err(Response::error(format!("{PARTNER_DOWN_RISK} Send yes-the-partner-is-off=true to go ahead.")));
        }
        let uid = caller.uid.map_or_else(|| "?".to_string(), |u| u.to_string());
        let by = match req.text("operator")? {
            Some(name) => format!("{name} (uid {uid})"),
            None => format!("uid {uid}"),
        };
        let (reply, answer) = oneshot::channel();
        election.send(ElectionCommand::PartnerDown { by: by.clone(), reply }).await.map_err(|_| stopped())?;
        match answer.await.map_err(|_| stopped())? {
            Ok(text) => {
                self.record(caller, format!("partner-down by {by}: active without the partner's vote"));
                Ok(Response::done(text))
            }
            Err(why) => {
                self.record(caller, format!("partner-down by {by} refused: {why}"));
                Err(Response::error(why))
            }
        }
    }

    /// An install or a pair roll, relayed to the update socket; logged before and after, since
    /// it may take minutes (and a roll reboots this box before it can answer).
    async fn update(&self, req: &Request, caller: Caller) -> Response {
        let socket = &self.sources.cfg.control.update_socket;
        let bundle = req.text("bundle").ok().flatten().unwrap_or("?").to_string();
        self.record(caller, format!("{} of {bundle} started", req.command));
        let r = if req.command == "update-pair" {
            update::pair(socket, &self.sources.cfg.path, req).await
        } else {
            update::install(socket, req).await
        };
        let outcome = if r.result == SUCCESS { "done" } else { "refused" };
        self.record(caller, format!("{} of {bundle} {outcome}: {}", req.command, r.text));
        r
    }

    fn record(&self, caller: Caller, what: impl Into<String>) {
        let what = what.into();
        let uid = caller.uid.map_or_else(|| "?".to_string(), |u| u.to_string());
        tracing::warn!(%uid, action = %what, "operator action");
        self.sources.events.record(EventKind::Action, format!("{what} (uid {uid})"));
    }
}

fn stopped() -> Response {
    Response::error("the daemon is stopping")
}

fn list_commands(caller: Caller) -> Response {
    let mut names: Vec<&str> = READ_ONLY.to_vec();
    if caller.may_act {
        names.extend_from_slice(ACTIONS);
    }
    Response::success(format!("{} commands", names.len()), json!(names))
}

fn matches(b: &Binding, key: &str, value: &str) -> bool {
    match key {
        "address" => b.addr.to_string() == value,
        "hw-address" => fmt_hw(&b.hw).eq_ignore_ascii_case(value),
        "client-id" => b.owner.as_ref().is_some_and(|o| o.to_string().eq_ignore_ascii_case(value)),
        "hostname" => b.hostname.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(value)),
        _ => false,
    }
}

/// A lease as every client of the sockets (and `twinlease leases --json`) shows it.
pub fn lease_json(r: &StoredBinding, now: u64) -> Value {
    let b = &r.binding;
    json!({
        "address": b.addr.to_string(),
        "state": b.state.name(),
        "client": b.owner.as_ref().map(|o| o.to_string()),
        "hw": fmt_hw(&b.hw),
        "hostname": b.hostname,
        "expires": b.expires,
        "expires_utc": humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(b.expires)).to_string(),
        "remaining_secs": b.expires.saturating_sub(now),
        "cltt": b.cltt,
        "version": b.version,
        "term": b.term,
        "synced": r.synced(),
    })
}

/// A resolved conflict as every client of the sockets (and `twinlease conflicts --json`) shows
/// it: both sides and which one was kept.
pub fn conflict_json(c: &ConflictRecord) -> Value {
    let side = |b: &Binding| {
        json!({
            "address": b.addr.to_string(), "state": b.state.name(), "client": b.owner.as_ref().map(|o| o.to_string()),
            "expires": b.expires, "cltt": b.cltt, "term": b.term,
        })
    };
    let at_utc = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(c.at));
    json!({
        "at": c.at, "at_utc": at_utc.to_string(), "kind": c.kind.name(), "winner": side(&c.winner), "loser": side(&c.loser),
    })
}
