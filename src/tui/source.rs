//! The console's driver side: reads the status socket each refresh, the lease store (read-only)
//! when its content may have changed, checks whether the control socket takes our actions, and
//! sends the actions the operator confirmed. An update goes to the control socket too
//! (`update-pair`, `update-install`), from a thread of its own: it takes minutes.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::app::Action;
use super::data::{BundleRow, ConflictRow, ConflictSide, LeaseRow, Snapshot, UpdateChoices};
use crate::config::Config;
use crate::lease::{Binding, LeaseState, fmt_hw};
use crate::server::control::Status;
use crate::server::control::client::{self, ClientError};
use crate::server::control::protocol::{Request, SUCCESS};
use crate::store::{LeaseStore, StoredBinding};
use crate::update::bundle::{self, PublicKey};

/// How long the console waits for the daemon before it says it does not answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// The store is re-read at least this often, and whenever the daemon counts a new transition.
const TABLES_EVERY: Duration = Duration::from_secs(5);
/// How long a check of the control socket holds.
const CONTROL_EVERY: Duration = Duration::from_secs(10);
/// `update-status` starts a root process on the box: a little longer than a status read.
const SLOTS_WITHIN: Duration = Duration::from_secs(10);
/// Longest an update's answer is waited for: a pair roll gives each box 30 minutes to come back.
const UPDATE_WITHIN: Duration = Duration::from_secs(2 * 3600);

/// What the event loop reads from and acts on (the real box, or a fixed feed in tests).
pub trait Feed {
    fn poll(&mut self, now: Instant) -> Snapshot;
    fn act(&mut self, action: Action) -> Result<String, String>;
    /// This box's slots and the bundles the update dialog offers.
    fn update_choices(&mut self) -> UpdateChoices;
    /// Starts an update with `bundle` (of both boxes if `pair`); its answer comes with a later
    /// [`Snapshot::update_answer`].
    fn start_update(&mut self, bundle: &Path, pair: bool);
}

/// The running box and its lease store, as the configuration places them.
pub struct Source {
    status_socket: PathBuf,
    control_socket: PathBuf,
    db_path: PathBuf,
    read_only: bool,
    tables_read: Option<(Instant, Option<u64>)>,
    control_checked: Option<(Instant, Result<(), String>)>,
    bundles: BundleDir,
    update_answer: Option<mpsc::Receiver<Result<String, String>>>,
}

/// Where the update dialog looks for bundles, and the key their manifests must be signed with.
#[derive(Debug, Clone)]
pub struct BundleDir {
    pub dir: PathBuf,
    pub key: PathBuf,
}

impl Source {
    pub fn new(cfg: &Config, read_only: bool, bundles: BundleDir) -> Source {
        Source {
            status_socket: cfg.control.status_socket(),
            control_socket: cfg.control.control_socket(),
            db_path: cfg.lease_db_path(),
            read_only,
            tables_read: None,
            control_checked: None,
            bundles,
            update_answer: None,
        }
    }

    fn status(&self) -> Result<Status, String> {
        let r = client::ask_within(&self.status_socket, &Request::new("status-get", Map::new()), ANSWER_WITHIN)
            .map_err(|e| e.to_string())?;
        if r.result != SUCCESS {
            return Err(format!("the box answered: {}", r.text));
        }
        serde_json::from_value(r.arguments.unwrap_or_default()).map_err(|e| format!("unreadable status: {e}"))
    }

    /// Whether the control socket takes actions from this process.
    fn control(&mut self, now: Instant, daemon_up: bool) -> Result<(), String> {
        if self.read_only {
            return Err("read-only console".to_string());
        }
        if !daemon_up {
            self.control_checked = None;
            return Err("the daemon is not running".to_string());
        }
        if let Some((at, r)) = &self.control_checked
            && now.saturating_duration_since(*at) < CONTROL_EVERY
        {
            return r.clone();
        }
        let req = Request::new("list-commands", Map::new());
        let r = match client::ask_within(&self.control_socket, &req, ANSWER_WITHIN) {
            Ok(resp) if resp.arguments.as_ref().is_some_and(|a| a.to_string().contains("step-down")) => Ok(()),
            Ok(resp) => Err(format!("the control socket answered: {}", resp.text)),
            Err(ClientError::Denied { .. }) => Err("the control socket needs root or the admin group".to_string()),
            Err(e) => Err(e.to_string()),
        };
        self.control_checked = Some((now, r.clone()));
        r
    }

    fn store(&self) -> Result<LeaseStore, String> {
        if !self.db_path.exists() {
            return Err(format!("no lease database at {}", self.db_path.display()));
        }
        LeaseStore::open_for_reading(&self.db_path).map_err(|e| e.to_string())
    }

    fn tables(&self) -> (Result<Vec<LeaseRow>, String>, Result<Vec<ConflictRow>, String>) {
        match self.store() {
            Ok(store) => (
                store
                    .load_all()
                    .map(|rows| rows.iter().filter(|r| r.binding.state != LeaseState::Free).map(lease_row).collect())
                    .map_err(|e| e.to_string()),
                store
                    .conflicts()
                    .map(|list| {
                        list.iter()
                            .map(|c| ConflictRow {
                                at: c.at,
                                kind: c.kind.name().to_string(),
                                kept: conflict_side(&c.winner),
                                lost: conflict_side(&c.loser),
                            })
                            .collect()
                    })
                    .map_err(|e| e.to_string()),
            ),
            Err(e) => (Err(e.clone()), Err(e)),
        }
    }
}

impl Feed for Source {
    fn poll(&mut self, now: Instant) -> Snapshot {
        let status = self.status();
        let transitions = status.as_ref().ok().map(|s| s.store.transitions);
        let stale = match self.tables_read {
            None => true,
            Some((at, seen)) => seen != transitions || now.saturating_duration_since(at) >= TABLES_EVERY,
        };
        let (leases, conflicts) = if stale {
            self.tables_read = Some((now, transitions));
            let (l, c) = self.tables();
            (Some(l), Some(c))
        } else {
            (None, None)
        };
        let control = self.control(now, status.is_ok());
        let update_answer = self.update_answer.as_ref().and_then(|rx| match rx.try_recv() {
            Ok(answer) => Some(answer),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err("the update's thread ended without an answer".into())),
        });
        if update_answer.is_some() {
            self.update_answer = None;
        }
        Snapshot { taken_unix: crate::clock::unix_now(), status, leases, conflicts, control, update_answer }
    }

    fn act(&mut self, action: Action) -> Result<String, String> {
        let (command, args) = match action {
            Action::StepDown => ("step-down", Map::new()),
            Action::MaintenanceStart => ("maintenance", Map::from_iter([("action".into(), Value::from("start"))])),
            Action::MaintenanceCancel => ("maintenance", Map::from_iter([("action".into(), Value::from("cancel"))])),
            Action::PartnerDown => {
                // The daemon logs who declared it: the person logged in, else the console.
                let operator = client::operator().unwrap_or_else(|| "console".to_string());
                let args = [("yes-the-partner-is-off", Value::Bool(true)), ("operator", Value::from(operator))];
                ("partner-down", args.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }
            // The app asks for these as Command::Update, with the bundle: see start_update.
            Action::UpdatePair | Action::UpdateBox => return Err("an update needs a bundle".to_string()),
        };
        let r = client::ask_within(&self.control_socket, &Request::new(command, args), ANSWER_WITHIN)
            .map_err(|e| e.to_string())?;
        // The next refresh must show what the action did.
        self.tables_read = None;
        if r.result == SUCCESS { Ok(r.text) } else { Err(r.text) }
    }

    fn update_choices(&mut self) -> UpdateChoices {
        let req = Request::new("update-status", Map::new());
        let slots = match client::ask_within(&self.control_socket, &req, SLOTS_WITHIN) {
            Ok(r) if r.result == SUCCESS => Ok(r.text),
            Ok(r) => Err(r.text),
            Err(e) => Err(e.to_string()),
        };
        UpdateChoices { dir: self.bundles.dir.display().to_string(), slots, bundles: self.bundles.list() }
    }

    fn start_update(&mut self, bundle: &Path, pair: bool) {
        let (tx, rx) = mpsc::channel();
        self.update_answer = Some(rx);
        let command = if pair { "update-pair" } else { "update-install" };
        let mut args = Map::from_iter([("bundle".to_string(), Value::from(bundle.display().to_string()))]);
        if !pair {
            args.insert("reboot".into(), Value::Bool(true));
        }
        let (socket, req) = (self.control_socket.clone(), Request::new(command, args));
        std::thread::spawn(move || {
            let answer = match client::ask_within(&socket, &req, UPDATE_WITHIN) {
                Ok(r) if r.result == SUCCESS => Ok(r.text),
                Ok(r) => Err(r.text),
                Err(e) => Err(e.to_string()),
            };
            // The console may have quit meanwhile: nobody is left to tell.
            let _ = tx.send(answer);
        });
    }
}

impl BundleDir {
    /// Every `*.bundle` in the directory, by name, each with the version its manifest names if
    /// the box's key signed it and it is for this machine. Only the manifest is read here; the
    /// install checks every byte again before it writes anything.
    pub fn list(&self) -> Result<Vec<BundleRow>, String> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let key = std::fs::read_to_string(&self.key)
            .map_err(|e| format!("cannot read the bundle key {}: {e}", self.key.display()))
            .and_then(|pem| PublicKey::from_pem(&pem, &self.key.display().to_string()).map_err(|e| e.to_string()));
        let mut rows: Vec<BundleRow> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "bundle"))
            .map(|e| {
                let path = e.path();
                let version = key.clone().and_then(|key| manifest_version(&path, &key));
                let bytes = e.metadata().map_or(0, |m| m.len());
                BundleRow { file: e.file_name().to_string_lossy().into_owned(), path, bytes, version }
            })
            .collect();
        rows.sort_by(|a, b| a.file.cmp(&b.file));
        Ok(rows)
    }
}

fn manifest_version(path: &Path, key: &PublicKey) -> Result<String, String> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| e.to_string())?);
    let manifest = bundle::read_signed_manifest(&mut f, key).map_err(|e| e.to_string())?;
    bundle::check_arch(&manifest, std::env::consts::ARCH).map_err(|e| e.to_string())?;
    Ok(manifest.version)
}

fn lease_row(r: &StoredBinding) -> LeaseRow {
    let b = &r.binding;
    LeaseRow {
        address: b.addr,
        state: b.state.name().to_string(),
        client: b.owner.as_ref().map_or_else(|| "-".to_string(), |o| o.to_string()),
        hw: fmt_hw(&b.hw),
        hostname: b.hostname.clone().unwrap_or_default(),
        expires: b.expires,
        cltt: b.cltt,
        term: b.term,
        version: b.version,
        synced: r.synced(),
    }
}

fn conflict_side(b: &Binding) -> ConflictSide {
    ConflictSide {
        address: b.addr,
        state: b.state.name().to_string(),
        client: b.owner.as_ref().map_or_else(|| "-".to_string(), |o| o.to_string()),
        term: b.term,
        cltt: b.cltt,
    }
}
