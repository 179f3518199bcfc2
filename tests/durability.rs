//! A DHCPACK means the lease is on disk: kill -9 the server in the middle of a 2,000-lease
//! perfdhcp run, restart it, and every ACK captured on the wire must be in the store.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use common::*;

#[test]
fn kill_9_during_a_perfdhcp_run_loses_no_acked_lease() {
    let lab = RelayLab::new("198.18.4", 22);
    let (srv_ns, relay, b) = (&lab.srv, &lab.relay, &lab.relay_if);
    let dir = tempfile::tempdir().unwrap();
    let body = "[dhcp]\ninterfaces = []\nping_check = false\n[[subnet]]\ncidr = \"198.18.4.0/22\"\npools = [\"198.18.4.10-198.18.7.250\"]\n[log]\nfilter = \"warn\"\n";
    let cfg = config_text(dir.path(), body);
    let mut srv = Server::start(srv_ns, dir.path(), &cfg);

    // Capture every reply the relay (perfdhcp) receives; tcpdump says when it is listening.
    let pcap = dir.path().join("replies.pcap");
    let capture = Capture::start(relay, b, &pcap);

    let macs = mac_file(dir.path(), 2000, 42);
    let mut perf = relay
        .cmd("perfdhcp")
        .args(["-4", "-l", "198.18.4.2", "-r", "400", "-n", "2000", "-M"])
        .arg(&macs)
        .arg("198.18.4.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Kill the server once a good share of the run is committed.
    let config = srv.config.clone();
    wait_for("600 leases in the store", Duration::from_secs(30), || {
        (leases(&config).iter().filter(|r| r["state"] == "leased").count() >= 600).then_some(())
    });
    srv.kill9();
    let _ = perf.kill();
    let _ = perf.wait();
    let acks: Vec<_> =
        capture.stop().into_iter().filter(|r| r.kind == 5).map(|r| (r.kind, r.chaddr, r.yiaddr)).collect();
    assert!(acks.len() >= 600, "captured only {} ACKs", acks.len());
    let mut by_addr: HashMap<String, String> = HashMap::new();
    for (_, mac, ip) in &acks {
        if let Some(prev) = by_addr.insert(ip.to_string(), fmt_mac(mac)) {
            assert_eq!(prev, fmt_mac(mac), "{ip} was ACKed to two clients");
        }
    }

    let srv = Server::builder(srv_ns, dir.path()).config(&srv.config.clone()).start();
    let rows = srv.leases();
    let mut missing = Vec::new();
    for (ip, mac) in &by_addr {
        match lease_of(&rows, ip) {
            Some(l) if l["state"] == "leased" && l["hw"] == mac.as_str() => {}
            other => missing.push(format!("{ip} ACKed to {mac}, store has {other:?}")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} ACKed leases lost after kill -9:\n{}",
        missing.len(),
        by_addr.len(),
        missing.join("\n")
    );
    eprintln!("kill -9 after {} ACKs on the wire: all {} in the store after restart", acks.len(), by_addr.len());
}
