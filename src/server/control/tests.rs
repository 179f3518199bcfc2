//! The command handlers on an in-process engine over a store in a temporary directory: no
//! sockets, no processes (the sockets themselves are tested end to end in tests/control.rs).

use std::sync::Arc;

use dhcproto::v4::{DhcpOption, MessageType};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::commands::{Caller, Handlers};
use super::protocol::{EMPTY, ERROR, Request, SUCCESS, UNSUPPORTED};
use super::status::{Sources, Status};
use crate::config::{Config, LocalAddrs};
use crate::events::Events;
use crate::role::Role;
use crate::server::eligibility::Eligibility;
use crate::server::engine::{Engine, EngineHandle, Input, Transmit};
use crate::server::service::OpenedStore;
use crate::testkit::{Msg, lan};

const ADMIN: Caller = Caller { uid: Some(0), may_act: true };
const READER: Caller = Caller { uid: Some(1000), may_act: false };

struct Discard;

impl Transmit for Discard {
    fn transmit(&self, _: &crate::dhcp::Reply) -> bool {
        true
    }
}

fn config_text(dir: &std::path::Path, lease_secs: u32) -> String {
    format!(
        "[node]\nname='box-t'\nstate_dir='{}'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n\
         [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.109']\nlease_secs={lease_secs}\n\
         [[reservation]]\nname='printer'\nhw=['02:00:00:00:00:50']\nip='198.18.0.50'\n\
         [control]\nruntime_dir='{}'\n",
        dir.join("state").display(),
        dir.join("run").display()
    )
}

fn write_config(dir: &std::path::Path, lease_secs: u32) -> Config {
    let path = dir.join("twinlease.toml");
    std::fs::write(&path, config_text(dir, lease_secs)).unwrap();
    Config::parse(&path, &config_text(dir, lease_secs), &LocalAddrs::default()).unwrap()
}

/// A standalone box running in-process, with the handlers the sockets would use.
struct Lab {
    handlers: Handlers,
    engine: EngineHandle,
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    _role: watch::Sender<Role>,
}

impl Lab {
    fn start() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Arc::new(write_config(dir.path(), 3600));
        std::fs::create_dir_all(&cfg.node.state_dir).unwrap();
        let (alloc, _, parts) = OpenedStore::open(&cfg).unwrap().spawn_writer();
        let (role_tx, role) = watch::channel(Role::active(0));
        let writer = parts.writer.clone();
        let discard: Arc<dyn Transmit> = Arc::new(Discard);
        let (engine, handle) =
            Engine::new(cfg.clone(), alloc, (parts.writer, parts.events), vec![discard], role.clone());
        tokio::spawn(engine.run());
        let (eligible, _) = watch::channel(true);
        let events = Events::default();
        let sources = Sources {
            cfg,
            started: std::time::Instant::now(),
            role,
            fixed_role: Some("standalone"),
            election: None,
            eligibility: Eligibility::load(&dir.path().join("state"), eligible, events.clone()),
            engine: handle.stats.clone(),
            snapshot: handle.snapshot.clone(),
            writer: writer.stats.clone(),
            can_commit: writer.can_commit(),
            partner: None,
            send_errors: Arc::new(|| 0),
            events,
        };
        let handlers = Handlers { sources, engine: handle.commands.clone(), election: None };
        let path = dir.path().to_path_buf();
        Lab { handlers, engine: handle, _dir: dir, dir: path, _role: role_tx }
    }

    async fn ask(&self, command: &str, args: Value, caller: Caller) -> super::protocol::Response {
        let Value::Object(arguments) = args else { panic!("arguments are an object") };
        self.handlers.handle(&Request::new(command, arguments), caller).await
    }

    async fn status(&self) -> Status {
        let r = self.ask("status-get", json!({}), READER).await;
        assert_eq!(r.result, SUCCESS, "{}", r.text);
        serde_json::from_value(r.arguments.unwrap()).unwrap()
    }

    /// Leases 198.18.0.(100 + n) to client `n` (a REQUEST as after a reboot) and waits until the
    /// lease is on disk.
    async fn lease(&self, n: u8) -> std::net::Ipv4Addr {
        let send = |m: Msg| Input::Packet { req: Box::new(m.req()), ingress: lan(), socket: 0 };
        let addr = std::net::Ipv4Addr::new(198, 18, 0, 100 + n);
        let req = Msg::new(MessageType::Request, n)
            .opt(DhcpOption::RequestedIpAddress(addr))
            .opt(DhcpOption::Hostname(format!("host-{n}")));
        self.engine.inbox.send(send(req)).await.unwrap();
        for _ in 0..200 {
            let found = self.ask("lease-get", json!({"address": addr.to_string()}), READER).await;
            if found.result == SUCCESS {
                return addr;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the lease for client {n} never reached the store");
    }
}

#[tokio::test]
async fn status_counts_leases_per_subnet_and_says_why_the_box_serves() {
    let lab = Lab::start();
    lab.lease(1).await;
    lab.lease(2).await;
    let mut s = lab.status().await;
    for _ in 0..300 {
        if s.subnets[0].leased == 2 {
            break;
        }
        // The engine publishes its counts once a second.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        s = lab.status().await;
    }
    let n = &s.subnets[0];
    assert_eq!((n.cidr.as_str(), n.total, n.leased, n.reserved), ("198.18.0.0/24", 11, 2, 1), "{n:?}");
    assert_eq!(n.utilisation_pct, 18.2);
    assert_eq!((s.role.state.as_str(), s.role.serving, s.role.why.as_deref()), ("active", true, Some("standalone")));
    assert_eq!(s.summary, "serving all clients");
    assert_eq!(s.dhcp.requests["discover"], 0, "counted by the receive thread, which this lab has none of");
    assert_eq!(s.dhcp.replies["ack"], 2);
    assert!(s.store.commits >= 2 && s.store.can_commit);
    assert!(s.election.is_none() && s.partner.is_none());
}

#[tokio::test]
async fn leases_are_found_by_address_hardware_address_and_hostname() {
    let lab = Lab::start();
    let addr = lab.lease(3).await;
    for (key, value) in
        [("address", addr.to_string()), ("hw-address", "02:00:00:00:00:03".into()), ("hostname", "HOST-3".into())]
    {
        let r = lab.ask("lease-get", json!({ key: value }), READER).await;
        assert_eq!(r.result, SUCCESS, "{key}: {}", r.text);
        assert_eq!(r.arguments.unwrap()["leases"][0]["address"], addr.to_string());
    }
    let r = lab.ask("lease-get", json!({"address": "198.18.0.77"}), READER).await;
    assert_eq!(r.result, EMPTY);
    let r = lab.ask("lease-get", json!({"address": "not an address"}), READER).await;
    assert_eq!(r.result, ERROR);
    let r = lab.ask("lease-get", json!({}), READER).await;
    assert_eq!(r.result, ERROR);
    let r = lab.ask("lease-list", json!({}), READER).await;
    assert_eq!(r.arguments.unwrap()["leases"].as_array().unwrap().len(), 1);
}

/// `lease-list` with "limit" pages through the table in address order: "next" is where the
/// following page starts, absent on the last page; bad pages are refused.
#[tokio::test]
async fn lease_list_pages_through_the_table() {
    let lab = Lab::start();
    let mut leased = Vec::new();
    for n in [5, 1, 3] {
        leased.push(lab.lease(n).await.to_string());
    }
    leased.sort_by_key(|a| a.parse::<std::net::Ipv4Addr>().unwrap());
    let lab = &lab;
    let page = |args: Value| async move {
        let r = lab.ask("lease-list", args, READER).await;
        assert_eq!(r.result, SUCCESS, "{}", r.text);
        let a = r.arguments.unwrap();
        let got: Vec<String> =
            a["leases"].as_array().unwrap().iter().map(|l| l["address"].as_str().unwrap().to_string()).collect();
        (got, a.get("next").and_then(Value::as_str).map(str::to_string))
    };
    let (first, next) = page(json!({"limit": 2})).await;
    assert_eq!((first.as_slice(), next.as_deref()), (&leased[..2], Some(leased[1].as_str())));
    let (second, next) = page(json!({"limit": 2, "from": next.unwrap()})).await;
    assert_eq!((second.as_slice(), next), (&leased[2..], None));
    // A page that ends exactly at the end says "next"; the page after it is empty.
    let (all, next) = page(json!({"limit": 3})).await;
    assert_eq!((all, next.as_deref()), (leased.clone(), Some(leased[2].as_str())));
    assert_eq!(page(json!({"limit": 3, "from": leased[2].clone()})).await, (vec![], None));
    for bad in [json!({"limit": 0}), json!({"limit": 1001}), json!({"limit": "2"}), json!({"limit": 2, "from": "x"})] {
        assert_eq!(lab.ask("lease-list", bad.clone(), READER).await.result, ERROR, "{bad}");
    }
}

#[tokio::test]
async fn actions_need_the_control_socket_and_unknown_commands_are_unsupported() {
    let lab = Lab::start();
    for action in ["step-down", "maintenance", "sync-from-partner", "reload", "partner-down"] {
        let r = lab.ask(action, json!({}), READER).await;
        assert_eq!(r.result, ERROR, "{action}");
        assert!(r.text.contains("control socket"), "{}", r.text);
    }
    assert_eq!(lab.ask("frobnicate", json!({}), ADMIN).await.result, UNSUPPORTED);
    let listed = |r: super::protocol::Response| r.arguments.unwrap().as_array().unwrap().len();
    assert_eq!(listed(lab.ask("list-commands", json!({}), READER).await), 7);
    assert_eq!(listed(lab.ask("list-commands", json!({}), ADMIN).await), 14);
    // Without an election or a partner there is nothing to hand over or sync with.
    assert_eq!(lab.ask("step-down", json!({}), ADMIN).await.result, ERROR);
    let r = lab.ask("partner-down", json!({"yes-the-partner-is-off": true}), ADMIN).await;
    assert!(r.result == ERROR && r.text.contains("no election"), "{}", r.text);
    assert_eq!(lab.ask("sync-from-partner", json!({}), ADMIN).await.result, ERROR);
}

#[tokio::test]
async fn maintenance_needs_an_election_and_a_caught_up_partner_or_force_and_is_recorded() {
    let mut lab = Lab::start();
    let r = lab.ask("maintenance", json!({"action": "start", "force": true}), ADMIN).await;
    assert!(r.result == ERROR && r.text.contains("no election"), "{}", r.text);
    // As if an election ran (the step-down it asks for goes nowhere here).
    let (election, _commands) = tokio::sync::mpsc::channel(4);
    lab.handlers.election = Some(election);
    let r = lab.ask("maintenance", json!({"action": "start"}), ADMIN).await;
    assert_eq!(r.result, ERROR);
    assert!(r.text.contains("force=true"), "{}", r.text);
    let r = lab.ask("maintenance", json!({"action": "start", "force": true}), ADMIN).await;
    assert_eq!(r.result, SUCCESS, "{}", r.text);
    let s = lab.status().await;
    assert!(!s.role.eligible && s.role.maintenance.as_ref().is_some_and(|m| m.by_uid == 0));
    assert!(lab.dir.join("state/maintenance").exists(), "recorded for a restart");
    assert!(s.events.iter().any(|e| e.text.contains("maintenance started") && e.text.contains("uid 0")));
    let r = lab.ask("maintenance", json!({"action": "cancel"}), ADMIN).await;
    assert_eq!(r.result, SUCCESS);
    assert!(lab.status().await.role.eligible);
    assert_eq!(lab.ask("maintenance", json!({"action": "pause"}), ADMIN).await.result, ERROR);
}

#[tokio::test]
async fn reload_applies_live_changes_and_refuses_the_rest_whole() {
    let lab = Lab::start();
    let path = lab.dir.join("twinlease.toml");
    // A new lease time can change live.
    std::fs::write(&path, config_text(&lab.dir, 600)).unwrap();
    let r = lab.ask("reload", json!({}), ADMIN).await;
    assert_eq!(r.result, SUCCESS, "{}", r.text);
    // A new pool cannot: nothing is applied, and the answer says what needs a restart.
    let moved = config_text(&lab.dir, 900).replace("198.18.0.109", "198.18.0.120");
    std::fs::write(&path, moved).unwrap();
    let r = lab.ask("reload", json!({}), ADMIN).await;
    assert_eq!(r.result, ERROR);
    assert!(r.text.contains("[[subnet]] cidr, pools or exclusions"), "{}", r.text);
    // An invalid file is refused with its location.
    std::fs::write(&path, "[node]\nname = 3\n").unwrap();
    let r = lab.ask("reload", json!({}), ADMIN).await;
    assert!(r.result == ERROR && r.text.contains("twinlease.toml:2:"), "{}", r.text);
    let reloads: Vec<String> = lab.status().await.events.into_iter().map(|e| e.text).collect();
    assert!(reloads.iter().any(|t| t.contains("configuration reloaded")), "{reloads:?}");
}
