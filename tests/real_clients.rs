//! Real DHCP clients (ISC dhclient, busybox udhcpc, dhcpcd, perfdhcp) against the real daemon,
//! each test in its own namespaces. Needs root and the client packages (`make test` installs
//! them when missing).

mod common;

use std::time::Duration;

use common::*;

const LAN: &str = "198.18.0.1/24";

fn body(iface: &str, dhcp_extra: &str, subnet_extra: &str) -> String {
    format!(
        "[dhcp]\ninterfaces = [\"{iface}\"]\n{dhcp_extra}\n\
         [[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n\
         routers = [\"198.18.0.1\"]\ndns_servers = [\"198.18.0.1\"]\ndomain_name = \"branch.example\"\n{subnet_extra}\n"
    )
}

fn busy(rows: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    rows.iter().filter(|r| r["state"] != "free").collect()
}

#[test]
fn dhclient_dora_renew_rebind_release() {
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_text(
        dir.path(),
        &body(&lan.bridge, "ping_check = false", "lease_secs = 60\nrenew_secs = 2\nrebind_secs = 5"),
    );
    let srv = Server::start(&lan.ns, dir.path(), &cfg);
    let (ns, iface) = lan.client(c);
    let (mut client, ev) = dhclient(ns, iface, dir.path(), &[]);

    let bound = wait_event(&ev, &["BOUND"], 0, Duration::from_secs(20));
    assert!(bound.ip.starts_with("198.18.0.1"), "{bound:?}");
    assert_eq!(bound.get("mask"), Some("255.255.255.0"));
    assert_eq!(bound.get("routers"), Some("198.18.0.1"));
    assert_eq!(bound.get("dns"), Some("198.18.0.1"));
    assert_eq!(bound.get("domain"), Some("branch.example"));
    assert_eq!(bound.get("lease"), Some("60"));
    let first = lease_of(&srv.leases(), &bound.ip).cloned().expect("lease in the store");
    assert_eq!(first["state"], "leased");
    assert_eq!(first["hw"], lan.mac(c));

    // T1 = 2 s: dhclient renews by unicast and the lease is extended.
    let renew = wait_event(&ev, &["RENEW"], 0, Duration::from_secs(15));
    assert_eq!(renew.ip, bound.ip);
    let after = wait_for("the renewal in the store", Duration::from_secs(5), || {
        lease_of(&srv.leases(), &bound.ip).filter(|l| l["version"].as_u64() > first["version"].as_u64()).cloned()
    });
    assert!(after["expires"].as_u64() >= first["expires"].as_u64());

    // The server stops hearing unicast: renewals vanish, and past T2 the client rebinds by
    // broadcast (dhclient 4.4 still calls the result RENEW, so the wire tells: its log).
    lan.ns.sh(&format!("nft add table ip tl; nft add chain ip tl in '{{ type filter hook input priority 0; }}'; nft add rule ip tl in ip daddr {} udp dport 67 drop", lan.server_ip));
    let log = dir.path().join(format!("dhclient-{iface}.log"));
    let cut = std::fs::read_to_string(&log).unwrap().len();
    wait_for("a broadcast REQUEST answered after unicast was cut", Duration::from_secs(20), || {
        let tail = std::fs::read_to_string(&log).unwrap()[cut..].to_string();
        let b = tail.find(&format!("DHCPREQUEST for {} on {iface} to 255.255.255.255", bound.ip))?;
        tail[b..].contains(&format!("DHCPACK of {}", bound.ip)).then_some(())
    });
    assert_eq!(lease_of(&srv.leases(), &bound.ip).unwrap()["state"], "leased", "rebinding keeps the address");
    lan.ns.sh("nft delete table ip tl");

    // Release: the address goes back to the queue, remembered for this client.
    let _ = client.kill();
    let _ = client.wait();
    dhclient_release(ns, iface, dir.path());
    let freed = wait_for("the release in the store", Duration::from_secs(5), || {
        lease_of(&srv.leases(), &bound.ip).filter(|l| l["state"] == "free").cloned()
    });
    assert_eq!(freed["client"], first["client"], "the previous owner is kept for affinity");
}

#[test]
fn udhcpc_and_dhcpcd_get_distinct_leases_with_options() {
    let mut lan = Lan::new(LAN);
    let a = lan.add_client();
    let b = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body(&lan.bridge, "", "")));
    let (ns, iface) = lan.client(a);
    let (out, ev) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success(), "udhcpc: {}", String::from_utf8_lossy(&out.stderr));
    let u = events(&ev).into_iter().find(|e| e.reason == "bound").expect("udhcpc bound");
    assert_eq!(u.get("routers"), Some("198.18.0.1"));
    assert_eq!(u.get("domain"), Some("branch.example"));
    assert_eq!(u.get("server"), Some("198.18.0.1"));

    let (ns, iface) = lan.client(b);
    let (out, ev) = dhcpcd_once(ns, iface, dir.path(), &["-h", "tlhost"]);
    assert!(out.status.success(), "dhcpcd: {}", String::from_utf8_lossy(&out.stderr));
    let d = events(&ev).into_iter().find(|e| e.reason == "BOUND").expect("dhcpcd bound");
    assert_ne!(u.ip, d.ip);
    let rows = srv.leases();
    assert_eq!(busy(&rows).len(), 2);
    for ip in [&u.ip, &d.ip] {
        assert_eq!(lease_of(&rows, ip).unwrap()["state"], "leased");
    }
    // dhcpcd sends the host name it was given; it is recorded.
    assert_eq!(lease_of(&rows, &d.ip).unwrap()["hostname"], "tlhost");
}

#[test]
fn inform_gets_configuration_without_a_lease() {
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body(&lan.bridge, "", "")));
    let (ns, iface) = lan.client(c);
    ns.ip(&format!("addr add 198.18.0.77/24 dev {iface}"));
    let (out, ev) = dhcpcd_once(ns, iface, dir.path(), &["--inform", "198.18.0.77/24"]);
    assert!(out.status.success(), "dhcpcd --inform: {}", String::from_utf8_lossy(&out.stderr));
    let e = events(&ev).into_iter().find(|e| e.reason == "INFORM").expect("dhcpcd INFORM event");
    assert_eq!(e.ip, "198.18.0.77");
    assert!(busy(&srv.leases()).is_empty(), "INFORM creates no lease");
}

#[test]
fn ping_check_skips_an_address_in_use() {
    let mut lan = Lan::new(LAN);
    let squatter = lan.add_client();
    let c = lan.add_client();
    let (sq, sq_if) = lan.client(squatter);
    sq.ip(&format!("addr add 198.18.0.100/24 dev {sq_if}")); // the queue head, without a lease
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        &lan.ns,
        dir.path(),
        &config_text(dir.path(), &body(&lan.bridge, "ping_check = true\nping_timeout_ms = 300", "")),
    );
    let (ns, iface) = lan.client(c);
    let (out, ev) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success());
    let got = events(&ev).into_iter().find(|e| e.reason == "bound").unwrap();
    assert_ne!(got.ip, "198.18.0.100");
    let rows = srv.leases();
    assert_eq!(lease_of(&rows, "198.18.0.100").unwrap()["state"], "declined");
    assert!(srv.log_text().contains("answered a ping"));
}

#[test]
fn decline_puts_the_address_on_probation() {
    let mut lan = Lan::new(LAN);
    let squatter = lan.add_client();
    let c = lan.add_client();
    let (sq, sq_if) = lan.client(squatter);
    sq.ip(&format!("addr add 198.18.0.100/24 dev {sq_if}"));
    let dir = tempfile::tempdir().unwrap();
    // No ping check: the client's own ARP probe finds the conflict and declines.
    let srv = Server::start(
        &lan.ns,
        dir.path(),
        &config_text(dir.path(), &body(&lan.bridge, "ping_check = false\ndecline_probation_secs = 900", "")),
    );
    let (ns, iface) = lan.client(c);
    let (out, ev) = dhcpcd_once(ns, iface, dir.path(), &["-t", "40"]);
    assert!(out.status.success(), "dhcpcd: {}", String::from_utf8_lossy(&out.stderr));
    let got = events(&ev).into_iter().find(|e| e.reason == "BOUND").unwrap();
    assert_ne!(got.ip, "198.18.0.100");
    let rows = srv.leases();
    let declined = lease_of(&rows, "198.18.0.100").expect("declined address recorded");
    assert_eq!(declined["state"], "declined");
    assert!(declined["remaining_secs"].as_u64().unwrap() > 800, "probation from the config: {declined}");
}

fn reservation_body(iface: &str, policy: &str) -> String {
    format!(
        "{}\n[[reservation]]\nname = \"laptop-anna\"\nhw = [\"02:00:00:00:aa:01\", \"02:00:00:00:aa:02\"]\nip = \"198.18.0.50\"\non_alias_busy = \"{policy}\"\n",
        body(iface, "ping_check = false", "")
    )
}

#[test]
fn reservation_by_mac_and_alias_hold_off() {
    let mut lan = Lan::new(LAN);
    let m1 = lan.add_client();
    let m2 = lan.add_client();
    lan.set_mac(m1, "02:00:00:00:aa:01");
    lan.set_mac(m2, "02:00:00:00:aa:02");
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &reservation_body(&lan.bridge, "hold-off")));
    let (ns1, if1) = lan.client(m1);
    let (mut c1, ev1) = dhclient(ns1, if1, dir.path(), &[]);
    let b1 = wait_event(&ev1, &["BOUND"], 0, Duration::from_secs(20));
    assert_eq!(b1.ip, "198.18.0.50", "reservation by MAC");

    // The second member is held off while the first holds the group's address.
    let (ns2, if2) = lan.client(m2);
    let (out, ev2) = udhcpc_once(ns2, if2, dir.path(), &["-t", "2", "-T", "1"]);
    assert!(!out.status.success(), "held-off member must get no lease");
    assert!(events(&ev2).iter().all(|e| e.reason != "bound"));
    assert!(srv.log_text().contains("alias group busy"));

    // Once the first member releases, the second gets the address.
    let _ = c1.kill();
    let _ = c1.wait();
    dhclient_release(ns1, if1, dir.path());
    let (out, ev2) = udhcpc_once(ns2, if2, dir.path(), &[]);
    assert!(out.status.success());
    assert_eq!(events(&ev2).into_iter().find(|e| e.reason == "bound").unwrap().ip, "198.18.0.50");
    assert_eq!(lease_of(&srv.leases(), "198.18.0.50").unwrap()["hw"], "02:00:00:00:aa:02");
}

#[test]
fn alias_take_over_moves_the_address() {
    let mut lan = Lan::new(LAN);
    let m1 = lan.add_client();
    let m2 = lan.add_client();
    lan.set_mac(m1, "02:00:00:00:aa:01");
    lan.set_mac(m2, "02:00:00:00:aa:02");
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &reservation_body(&lan.bridge, "take-over")));
    let (ns1, if1) = lan.client(m1);
    let (out, _) = udhcpc_once(ns1, if1, dir.path(), &[]);
    assert!(out.status.success());
    assert_eq!(lease_of(&srv.leases(), "198.18.0.50").unwrap()["hw"], "02:00:00:00:aa:01");
    let (ns2, if2) = lan.client(m2);
    let (out, ev2) = udhcpc_once(ns2, if2, dir.path(), &[]);
    assert!(out.status.success(), "take-over: the second member is served at once");
    assert_eq!(events(&ev2).into_iter().find(|e| e.reason == "bound").unwrap().ip, "198.18.0.50");
    assert_eq!(lease_of(&srv.leases(), "198.18.0.50").unwrap()["hw"], "02:00:00:00:aa:02");
}

#[test]
fn pool_exhaustion_means_no_offer() {
    let mut lan = Lan::new(LAN);
    let clients: Vec<usize> = (0..3).map(|_| lan.add_client()).collect();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.101\"]\n",
        lan.bridge
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    for &c in &clients[..2] {
        let (ns, iface) = lan.client(c);
        assert!(udhcpc_once(ns, iface, dir.path(), &[]).0.status.success());
    }
    let (ns, iface) = lan.client(clients[2]);
    let (out, _) = udhcpc_once(ns, iface, dir.path(), &["-t", "2", "-T", "1"]);
    assert!(!out.status.success(), "a third client must not get an address from a pool of two");
    assert!(srv.log_text().contains("pool exhausted"));
    assert_eq!(busy(&srv.leases()).len(), 2);
}

#[test]
fn restart_keeps_every_lease_and_renewals_keep_the_address() {
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_text(
        dir.path(),
        &body(&lan.bridge, "ping_check = false", "lease_secs = 60\nrenew_secs = 3\nrebind_secs = 50"),
    );
    let mut srv = Server::start(&lan.ns, dir.path(), &cfg);
    let (ns, iface) = lan.client(c);
    let (_client, ev) = dhclient(ns, iface, dir.path(), &[]);
    let bound = wait_event(&ev, &["BOUND"], 0, Duration::from_secs(20));
    let before = events(&ev).len();
    srv.stop();
    let srv = Server::start(&lan.ns, dir.path(), &cfg);
    assert_eq!(lease_of(&srv.leases(), &bound.ip).unwrap()["state"], "leased");
    let renew = wait_event(&ev, &["RENEW"], before, Duration::from_secs(20));
    assert_eq!(renew.ip, bound.ip, "same address after the restart");
}

#[test]
fn relayed_clients_from_perfdhcp_all_get_leases() {
    // perfdhcp acts as a relay agent: giaddr = its own address selects the subnet.
    let lab = RelayLab::new("198.18.2", 24);
    let (srv_ns, relay) = (&lab.srv, &lab.relay);
    let dir = tempfile::tempdir().unwrap();
    let body = "[dhcp]\ninterfaces = []\nlisten_relayed = true\nping_check = false\n[[subnet]]\ncidr = \"198.18.2.0/24\"\npools = [\"198.18.2.10-198.18.2.250\"]\n";
    let srv = Server::start(srv_ns, dir.path(), &config_text(dir.path(), body));
    let macs = mac_file(dir.path(), 200, 7);
    let out = run(relay
        .cmd("perfdhcp")
        .args(["-4", "-l", "198.18.2.2", "-r", "100", "-n", "200", "-W", "1000000", "-M"])
        .arg(&macs)
        .arg("198.18.2.1"));
    let p = parse_perfdhcp(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(p.acks, p.requests_sent, "every REQUEST was ACKed:\n{}", p.text);
    assert!(p.acks >= 190, "{}", p.text);
    // perfdhcp draws MACs from the file with replacement: one lease per distinct client.
    let rows = srv.leases();
    let leased: Vec<&serde_json::Value> = rows.iter().filter(|r| r["state"] == "leased").collect();
    let macs_text = std::fs::read_to_string(&macs).unwrap();
    let mut hws: Vec<&str> = leased.iter().map(|r| r["hw"].as_str().unwrap()).collect();
    assert!(hws.iter().all(|h| macs_text.contains(h)), "leases belong to perfdhcp's clients");
    hws.sort();
    hws.dedup();
    assert_eq!(hws.len(), leased.len(), "one address per client");
    assert!(leased.len() >= 100 && leased.len() as u64 <= p.acks, "{} leases for {} ACKs", leased.len(), p.acks);
}

#[test]
fn garbage_on_port_67_is_dropped_and_service_continues() {
    let mut lan = Lan::new(LAN);
    let noisy = lan.add_client();
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let mut srv =
        Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body(&lan.bridge, "ping_check = false", "")));
    let (ns, iface) = lan.client(noisy);
    ns.ip(&format!("addr add 198.18.0.66/24 dev {iface}"));
    // Random bytes, truncated headers, a BOOTREPLY, bogus option lengths, oversized datagrams:
    // broadcast and unicast, 600 datagrams in all, bounded in count.
    let script = r#"
import os, random, socket
r = random.Random(67)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.bind(("198.18.0.66", 68))
def valid():
    m = bytearray(240); m[0] = 1; m[1] = 1; m[2] = 6; m[28:34] = bytes([2,0,0,0,0,r.randrange(256)])
    m[236:240] = bytes([99,130,83,99]); return m
for i in range(600):
    kind = i % 6
    if kind == 0: p = os.urandom(r.randrange(0, 1500))
    elif kind == 1: p = bytes(valid()[:r.randrange(0, 240)])
    elif kind == 2: m = valid(); m[0] = 2; p = bytes(m + bytes([53,1,1,255]))
    elif kind == 3: p = bytes(valid() + bytes([53,1,1, 12,200]) + b"x" * 5)
    elif kind == 4: p = bytes(valid() + bytes([53,1,1]) + os.urandom(r.randrange(0, 3000)))
    else: m = valid(); m[2] = r.randrange(17, 256); p = bytes(m + bytes([53,1,1,255]))
    dst = "255.255.255.255" if i % 2 else "198.18.0.1"
    try: s.sendto(p, (dst, 67))
    except OSError: pass
"#;
    run(ns.cmd("python3").arg("-c").arg(script));
    let (ns, iface) = lan.client(c);
    let (out, _) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success(), "a real client is still served after the garbage");
    assert!(srv.child.try_wait().unwrap().is_none(), "the server survived");
    srv.stop();
}
