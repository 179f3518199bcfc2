//! The firmware image as a box runs it: `make image`'s disk booted under QEMU (TCG) with a site
//! directory written onto its ESP, its NICs on tap devices bridged onto a LAN of namespaces, and
//! real DHCP clients on that LAN. `make test-image` (in `make test`) builds the image, sets
//! TWINLEASE_IMAGE and runs the pair and two bad-site boxes, started the way systemd-boot starts
//! them (kernel, initrd and options from the ESP); `make test-image-full` adds one box booted
//! through OVMF and systemd-boot and two more bad sites. `make test-image-aarch64` runs the UEFI
//! box on the aarch64 image (qemu-system-aarch64, AAVMF): the VMs follow the image's architecture
//! (`Arch`, from its file name). A plain `cargo test` has no image and skips them all.

mod common;

use std::time::{Duration, Instant};

use common::vm::*;

const BOOT_LIMIT: Duration = Duration::from_secs(600);

/// The boot report the image prints once boot has finished (twinlease-boot-report.service):
/// the system state, the daemon's and the console's (twinlease tui on tty2) lines.
struct BootReport {
    system: String,
    daemon: String,
    console: String,
}

fn boot_report(vm: &mut Vm) -> BootReport {
    let system = vm.wait_console("twinlease-boot: system=", BOOT_LIMIT);
    let daemon = vm.wait_console("twinlease-boot: twinlease.service=", Duration::from_secs(10));
    let console = vm.wait_console("twinlease-boot: twinlease-console@tty2.service=", Duration::from_secs(30));
    BootReport { system, daemon, console }
}

/// The console of a provisioned box: `twinlease tui` running on tty2 (its standard input),
/// started once and never restarted.
fn assert_console_runs_on_tty2(name: &str, report: &BootReport) {
    let console = &report.console;
    assert!(console.contains("=active restarts=0 tty=/dev/tty2 "), "{name}: {console}");
    assert!(console.contains("cmd=\"/usr/bin/twinlease tui --read-only "), "{name}: {console}");
}

/// A peer section for `ONE_BOX` pointing the key at `key_file`.
fn with_peer(key_file: &str) -> String {
    format!(
        "{ONE_BOX}\n[peer]\nlisten = \"198.18.1.1:6767\"\naddress = \"198.18.1.2:6767\"\nkey_file = \"{key_file}\"\n"
    )
}

#[test]
#[ignore = "boots the firmware image: make test-image"]
fn invalid_or_missing_site_is_refused_on_the_console_without_a_restart_loop() {
    refused_in_pairs(vec![
        (
            "invalid",
            Some(one_box_site().file("twinlease.toml", &format!("{ONE_BOX}\n[bogus]\nx = 1\n"))),
            "unknown field",
        ),
        ("none", None, "NOT CONFIGURED"),
    ]);
}

#[test]
#[ignore = "boots the firmware image: make test-image-full"]
fn missing_or_unreadable_key_is_refused_on_the_console() {
    // FAT has no modes: the box sets them when it installs the site, so a key with a wrong mode
    // can only come from a config that points at a file outside the installed site, here the
    // ESP's root-only copy.
    refused_in_pairs(vec![
        ("missing", Some(one_box_site().file("twinlease.toml", &with_peer("/etc/twinlease/peer.key"))), "peer.key"),
        (
            "mode",
            Some(
                one_box_site()
                    .file("twinlease.toml", &with_peer("/efi/twinlease/peer.key"))
                    .file("peer.key", common::image_pair::KEY),
            ),
            "/efi/twinlease/peer.key",
        ),
    ]);
}

/// Boots one box per (case, site, what the console must name), two VMs at a time (TCG boots
/// are CPU-bound and the machine has two cores), and checks each refused its site.
fn refused_in_pairs(cases: Vec<(&str, Option<SiteDir>, &str)>) {
    let img = image();
    for batch in cases.chunks(2) {
        let nets: Vec<OneBoxLan> = batch.iter().map(|_| one_box_lan()).collect();
        let mut vms: Vec<Vm> = batch
            .iter()
            .zip(&nets)
            .map(|((case, site, _), net)| {
                Vm::start(case, &img, site.as_ref(), Boot::KernelFromEsp, &net.host, &[&net.tap])
            })
            .collect();
        for ((case, _, names), vm) in batch.iter().zip(vms.iter_mut()) {
            refused_as_expected(case, names, vm);
        }
    }
}

/// Checks the console of a box booted with a bad or no site: the provisioning verdict names
/// `names`, the daemon never started.
fn refused_as_expected(case: &str, names: &str, vm: &mut Vm) {
    let BootReport { system, daemon, console: tui } = boot_report(vm);
    let console = vm.console_text();
    let verdict: Vec<&str> =
        console.lines().filter(|l| l.contains("twinlease: ") || l.contains("twinlease:   ")).collect();
    assert!(verdict.iter().any(|l| l.contains(names)), "{case}: the console does not name {names:?}:\n{}", vm.tail());
    if case == "none" {
        assert!(system.contains("system=running failed=[]"), "{case}: {system}");
    } else {
        assert!(verdict.iter().any(|l| l.contains("SITE CONFIGURATION INVALID")), "{case}: {verdict:?}");
        assert!(system.contains("failed=[twinlease-provision.service]"), "{case}: {system}");
    }
    // Never started, so never restarted: the message stays the last word on the console.
    assert!(daemon.contains("twinlease.service=inactive restarts=0"), "{case}: {daemon}");
    // The console on tty2 waits for a valid site too: not started, so not in a restart loop.
    assert!(tui.contains("twinlease-console@tty2.service=inactive restarts=0"), "{case}: {tui}");
    eprintln!("{case}: {}", verdict.join(" / "));
}

#[test]
#[ignore = "boots the firmware image: make test-image"]
fn pair_of_appliances_fails_over_when_the_serving_box_loses_power() {
    use common::image_pair::*;
    let p = ImagePair::new(2, |site| site);
    let mut vms = [p.boot(0, Boot::KernelFromEsp), p.boot(1, Boot::KernelFromEsp)];
    // Both boxes up, with the partner reachable: the ACK below then waits for the partner's copy.
    for vm in vms.iter_mut() {
        vm.wait_console("partner reachable", BOOT_LIMIT);
        let report = boot_report(vm);
        let BootReport { system, daemon, .. } = &report;
        assert!(system.contains("system=running failed=[]"), "{}: {system}\n{}", vm.name, vm.tail());
        assert!(daemon.contains("twinlease.service=active restarts=0"), "{}: {daemon}", vm.name);
        assert_console_runs_on_tty2(&vm.name, &report);
        eprintln!("{}: {}", vm.name, report.console);
    }
    let dir = tempfile::tempdir().unwrap();
    let (ip, server, _) = udhcpc_bound(&p.lan, 0, dir.path(), None, 60).expect("a lease from the pair");
    let active = ["198.18.0.1", "198.18.0.2"].iter().position(|s| *s == server).expect("served by a box");
    let standby = 1 - active;
    let serving_after = vms[active].started.elapsed();
    eprintln!("pair: first lease {ip} from box {active} {:.1} s after QEMU start", serving_after.as_secs_f64());

    vms[active].power_cut();
    let cut = Instant::now();
    let bound = Duration::from_millis(T_MS + I_MS + 2000);
    let lan = &p.lan;
    let (fresh, renewed) = std::thread::scope(|s| {
        let fresh = s.spawn(|| udhcpc_bound(lan, 1, dir.path(), None, 30));
        let renewed = s.spawn(|| udhcpc_bound(lan, 0, dir.path(), Some(&ip), 30));
        (fresh.join().unwrap(), renewed.join().unwrap())
    });
    let survivor = ["198.18.0.1", "198.18.0.2"][standby];
    let (fresh_ip, fresh_server, fresh_at) = fresh.expect("the surviving box serves a new client");
    let (again_ip, again_server, again_at) = renewed.expect("the surviving box renews the old client");
    assert_eq!(fresh_server, survivor, "new client {fresh_ip}");
    assert_eq!((again_ip.as_str(), again_server.as_str()), (ip.as_str(), survivor), "the old client keeps its address");
    let (t_fresh, t_again) = (fresh_at - cut, again_at - cut);
    eprintln!(
        "pair: after the power cut the standby served a new client in {:.1} s and renewed {ip} in {:.1} s (bound {:.1} s)",
        t_fresh.as_secs_f64(),
        t_again.as_secs_f64(),
        bound.as_secs_f64()
    );
    assert!(
        t_fresh <= bound && t_again <= bound,
        "failover took {t_fresh:?} / {t_again:?}, over T + I + 2 s = {bound:?}"
    );
}

#[test]
#[ignore = "boots the firmware image through OVMF: make test-image-full"]
fn boot_through_uefi_and_systemd_boot() {
    let net = one_box_lan();
    let site = one_box_site();
    let mut vm = Vm::start("uefi", &image(), Some(&site), Boot::Uefi, &net.host, &[&net.tap]);
    let dir = tempfile::tempdir().unwrap();
    let ip = lease_within(&net.lan, 0, dir.path(), BOOT_LIMIT);
    let serving = vm.started.elapsed();
    assert!(ip.starts_with("198.18.0."), "lease {ip} outside the pool");
    let report = boot_report(&mut vm);
    let BootReport { system, daemon, .. } = &report;
    assert!(system.contains("system=running failed=[]"), "{system}\n{}", vm.tail());
    assert!(daemon.contains("twinlease.service=active"), "{daemon}");
    assert_console_runs_on_tty2(&vm.name, &report);
    // OVMF ran systemd-boot from the ESP, which started slot A's kernel (and says so in an EFI
    // variable the boot report reads).
    let loader = vm.wait_console("twinlease-boot: loader=", Duration::from_secs(10));
    assert!(loader.contains("loader=systemd-boot"), "{loader}");
    eprintln!("{:?}: UEFI boot to first lease: {:.1} s; {system}", Arch::of(&image()), serving.as_secs_f64());
}
