//! `twinlease update pair` and the partner's update port. The decisions are
//! `twinlease::update::roll`, the wire format `twinlease::update::peer`; this file looks at the
//! two boxes, sends bundles, waits and installs.
//!
//! The port is served by `twinlease-update-peer.socket` (one root process per connection,
//! `update serve-peer`): it answers only the `[peer]` address, and only requests carrying a MAC
//! made with the `[peer]` key.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use twinlease::config::Config;
use twinlease::server::control::client;
use twinlease::server::control::protocol::{Request, SUCCESS};
use twinlease::server::control::status::Status;
use twinlease::update::peer::{self, PeerCommand, PeerReply, PeerRequest};
use twinlease::update::roll::{self, BoxView, DaemonView, Start, Wait};

use super::{Paths, check_bundle, install, lock, read_key, say, slots_view};

/// Where a bundle sent by the partner is kept while it is installed (the data partition: the
/// root is read-only and /run is RAM).
const INCOMING: &str = "var/lib/twinlease-update";
/// Room left on the data partition after a received bundle (leases, journal).
const SPARE_BYTES: u64 = 32 << 20;
/// How long the hand-over to the partner may take (it takes about one election interval).
const HAND_OVER_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Finished,
    /// The roll's last step: this box reboots into the new slot (the caller reports first).
    RebootHere,
}

// ---- the roll -----------------------------------------------------------------------------

/// Runs the roll from this box. `partner_staged`: the partner already holds the bundle (it
/// handed the roll here), staged under this manifest digest.
pub(super) fn roll(
    paths: &Paths,
    bundle: &Path,
    key_path: &Path,
    config: &Path,
    limit: Duration,
    partner_staged: Option<&str>,
) -> anyhow::Result<Outcome> {
    let _lock = lock(paths, "twinlease-roll.lock", "another pair update is running on this box")?;
    let cfg = Config::load(config)?;
    let link = PartnerLink::from_config(&cfg)?;
    let manifest = check_bundle(bundle, &read_key(key_path)?)?;
    let version = manifest.version.clone();
    let here = view_here(paths, &cfg)?;
    let partner = link.status().with_context(|| format!("asking the partner's update port {}", link.addr))?;
    let (update_partner, update_here) = match roll::start(&here, &partner, &version) {
        Start::Refuse(why) => bail!("pair update not started: {why}; both boxes are as they were"),
        Start::HandToPartner => {
            say(&format!("this box is the standby: the active partner {} drives the roll", link.addr.ip()));
            let digest = manifest_digest(&manifest);
            let _staged = Staged::record(paths, &digest, bundle)?;
            let command = PeerCommand::Roll {
                bundle_len: manifest.bundle_len(),
                timeout_secs: limit.as_secs(),
                staged_manifest_sha256: digest,
            };
            let reply = link.call(&command, Some(bundle), limit * 3)?;
            return match reply.exit {
                0 => Ok(Outcome::Finished),
                _ => bail!("the partner's roll stopped: {}", reply.error.unwrap_or_default()),
            };
        }
        Start::Drive { partner, here } => (partner, here),
    };
    let started = Instant::now();
    if update_partner {
        say(&format!("step 1 of 3: the standby partner {} installs {version} and reboots", link.addr.ip()));
        let reply = match partner_staged {
            Some(digest) => {
                let command = PeerCommand::InstallStaged { manifest_sha256: digest.to_string(), reboot: true };
                link.call(&command, None, limit)?
            }
            None => {
                let command = PeerCommand::Install { bundle_len: manifest.bundle_len(), reboot: true };
                link.call(&command, Some(bundle), limit)?
            }
        };
        if reply.exit != 0 {
            bail!(
                "the partner did not install the bundle ({}); both boxes run the version they ran",
                reply.error.unwrap_or_default()
            );
        }
        let waited = wait_for(limit, &format!("the partner back on {version}"), || {
            Ok(roll::partner_updated(link.status().ok().as_ref(), &view_here(paths, &cfg)?, &version))
        })
        .map_err(|e| e.context("the roll stopped before this box was touched: it runs its old version and serves"))?;
        say(&format!(
            "the partner runs {version}, marked good and caught up ({:.0} s after its install)",
            waited.as_secs_f64()
        ));
    } else {
        say(&format!("step 1 of 3: the partner already runs {version}"));
    }
    if !update_here {
        say(&format!("this box already runs {version}: the pair is updated"));
        return Ok(Outcome::Finished);
    }
    say(&format!("step 2 of 3: this box installs {version} into its other slot while it serves"));
    install(paths, bundle, key_path).map_err(|e| {
        e.context(format!(
            "the roll stopped: the partner runs {version}, this box its old version (run `update pair` again)"
        ))
    })?;
    say("step 3 of 3: this box hands service to the partner");
    step_down(&cfg)?;
    let waited = wait_for(HAND_OVER_LIMIT, "the partner serving", || {
        Ok(roll::handed_over(link.status().ok().as_ref(), &view_here(paths, &cfg)?))
    })?;
    say(&format!(
        "the partner serves ({:.1} s after the step-down); this box reboots into {version} ({:.0} s since step 1)",
        waited.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    Ok(Outcome::RebootHere)
}

/// Looks every 2 s until `look` says done or stop, or `limit` passes; says why it still waits
/// every 30 s. Returns how long it waited.
fn wait_for(limit: Duration, what: &str, mut look: impl FnMut() -> anyhow::Result<Wait>) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut told = Instant::now();
    loop {
        match look()? {
            Wait::Done => return Ok(start.elapsed()),
            Wait::Stop(why) => bail!("{why}"),
            Wait::Keep(why) if start.elapsed() >= limit => bail!("waited {limit:?} for {what}: {why}"),
            Wait::Keep(why) if told.elapsed() >= Duration::from_secs(30) => {
                say(&format!("waiting for {what} ({:.0} s): {why}", start.elapsed().as_secs_f64()));
                told = Instant::now();
            }
            Wait::Keep(_) => {}
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// This box's slots and daemon.
fn view_here(paths: &Paths, cfg: &Config) -> anyhow::Result<BoxView> {
    let req = Request::new("status-get", serde_json::Map::new());
    let daemon = client::ask(&cfg.control.status_socket(), &req)
        .ok()
        .filter(|r| r.result == SUCCESS)
        .and_then(|r| serde_json::from_value::<Status>(r.arguments.unwrap_or_default()).ok())
        .map(|s| DaemonView {
            role: s.role.state,
            serving: s.role.serving,
            partner_caught_up: s.partner.is_some_and(|p| p.caught_up()),
        });
    Ok(BoxView { slots: slots_view(paths)?, daemon })
}

fn step_down(cfg: &Config) -> anyhow::Result<()> {
    let r = client::ask(&cfg.control.control_socket(), &Request::new("step-down", serde_json::Map::new()))?;
    if r.result != SUCCESS {
        bail!("step-down: {}", r.text);
    }
    say(&r.text);
    Ok(())
}

/// SHA-256 (hex) of a bundle's manifest: its identity (the manifest is signed and names every
/// payload's hash).
fn manifest_digest(manifest: &twinlease::update::bundle::Manifest) -> String {
    use sha2::{Digest, Sha256};
    peer::to_hex(&Sha256::digest(manifest.text.as_bytes()))
}

/// The bundle a standby keeps for the partner that drives its roll to install (`run/`: gone at
/// the reboot that install ends with); removed when dropped.
struct Staged(PathBuf);

const STAGED: &str = "run/twinlease-update-staged";

impl Staged {
    fn record(paths: &Paths, digest: &str, bundle: &Path) -> anyhow::Result<Staged> {
        let file = paths.root.join(STAGED);
        let bundle = fs::canonicalize(bundle)?;
        fs::write(&file, format!("{digest} {}\n", bundle.display()))?;
        Ok(Staged(file))
    }

    /// The staged bundle's path, if its digest is `digest`.
    fn find(paths: &Paths, digest: &str) -> anyhow::Result<PathBuf> {
        let text = fs::read_to_string(paths.root.join(STAGED)).unwrap_or_default();
        match text.trim_end().split_once(' ') {
            Some((d, path)) if d == digest => Ok(PathBuf::from(path)),
            _ => bail!("no bundle with manifest {digest} is staged here"),
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

// ---- the caller's side of the partner's port ----------------------------------------------

struct PartnerLink {
    addr: SocketAddr,
    key: Vec<u8>,
}

impl PartnerLink {
    fn from_config(cfg: &Config) -> anyhow::Result<PartnerLink> {
        let peer = cfg
            .peer
            .as_ref()
            .context("this box has no [peer]: it is not in a pair (`twinlease update install` updates a single box)")?;
        Ok(PartnerLink { addr: SocketAddr::new(peer.address.ip(), peer::PORT), key: peer.read_key()? })
    }

    fn status(&self) -> anyhow::Result<BoxView> {
        let reply = self.call(&PeerCommand::Status, None, Duration::from_secs(15))?;
        reply
            .view
            .with_context(|| format!("the partner answered without its state: {}", reply.error.unwrap_or_default()))
    }

    /// One request; the partner's progress lines are passed on (prefixed), the MAC'd result
    /// returned. `wait`: the longest silence from the partner.
    fn call(&self, command: &PeerCommand, bundle: Option<&Path>, wait: Duration) -> anyhow::Result<PeerReply> {
        let stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(wait))?;
        stream.set_write_timeout(Some(Duration::from_secs(120)))?;
        let mut lines = BufReader::new(stream.try_clone()?);
        let mut line = String::new();
        lines.read_line(&mut line)?;
        let server_nonce = match line.trim_end().strip_prefix("nonce ") {
            Some(hex) => peer::from_hex(hex)?,
            None => bail!("the partner's update port said {:?}", line.trim_end()),
        };
        let nonce = random_nonce()?;
        let request = serde_json::to_string(&PeerRequest { nonce: peer::to_hex(&nonce), command: command.clone() })?;
        let sent = self.send(&stream, &request, &server_nonce, command, bundle);
        loop {
            line.clear();
            if lines.read_line(&mut line)? == 0 {
                // A partner that refuses stops reading the bundle: its lines say why, the
                // failed write only that it stopped.
                sent?;
                bail!("the partner closed the connection without a result");
            }
            let text = line.trim_end();
            match text.strip_prefix("result ") {
                Some(rest) => return Ok(peer::open_result(&self.key, &nonce, rest)?),
                None if matches!(command, PeerCommand::Status) => {}
                None => {
                    let text = text.strip_prefix(twinlease::update::socket::PROGRESS_PREFIX).unwrap_or(text);
                    // A roll handed to the partner reports on its partner: this box.
                    match text.strip_prefix("partner: ") {
                        Some(about_us) => say(&format!("this box: {about_us}")),
                        None => say(&format!("partner: {text}")),
                    }
                }
            }
        }
    }
}

impl PartnerLink {
    /// The request, its MAC and the bundle.
    fn send(
        &self,
        stream: &TcpStream,
        request: &str,
        server_nonce: &[u8],
        command: &PeerCommand,
        bundle: Option<&Path>,
    ) -> anyhow::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, stream);
        write!(out, "{request}\nmac {}\n", peer::request_mac(&self.key, server_nonce, request))?;
        if let Some(path) = bundle {
            let sent = std::io::copy(&mut File::open(path)?.take(command.bundle_len()), &mut out)?;
            if sent != command.bundle_len() {
                bail!("{} changed while it was sent", path.display());
            }
        }
        out.flush()?;
        Ok(())
    }
}

fn random_nonce() -> anyhow::Result<[u8; peer::NONCE_LEN]> {
    let mut nonce = [0u8; peer::NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .map_err(|_| anyhow::anyhow!("no random bytes from the kernel"))?;
    Ok(nonce)
}

// ---- the serving side ---------------------------------------------------------------------

/// One connection on the partner's update port (standard input and output are the socket).
pub(super) fn serve_peer(paths: &Paths, config: &Path) -> anyhow::Result<ExitCode> {
    super::SERVING.store(true, std::sync::atomic::Ordering::Relaxed);
    let stdin = std::io::stdin();
    let from = remote_ip(&stdin)?;
    let cfg = Config::load(config)?;
    let Some(peer_cfg) = cfg.peer.as_ref() else {
        say("refused: this box has no [peer]");
        return Ok(ExitCode::FAILURE);
    };
    if from != peer_cfg.address.ip() {
        eprintln!("twinlease-update: refused a connection from {from}: not the partner {}", peer_cfg.address.ip());
        return Ok(ExitCode::FAILURE);
    }
    let key = peer_cfg.read_key()?;
    let nonce = random_nonce()?;
    println!("nonce {}", peer::to_hex(&nonce));
    std::io::stdout().flush()?;
    let mut input = stdin.lock();
    let request_line = read_line(&mut input)?;
    let mac_line = read_line(&mut input)?;
    let request = match peer::open_request(&key, &nonce, &request_line, mac_line.strip_prefix("mac ").unwrap_or("")) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("twinlease-update: refused a request from {from}: {e}");
            println!("refused: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let client_nonce = peer::from_hex(&request.nonce)?;
    let (reply, reboot) = match answer(paths, config, &cfg, &request.command, &mut input) {
        Ok((view, reboot)) => (PeerReply { exit: 0, view, error: None }, reboot),
        Err(e) => {
            say(&format!("failed: {e:#}"));
            (PeerReply { exit: 1, view: None, error: Some(format!("{e:#}")) }, false)
        }
    };
    // The caller may be gone (the standby that handed a roll here reboots during it): the
    // roll's last step, this box's reboot, must not depend on the result reaching it.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", peer::result_line(&key, &client_nonce, &reply)).and_then(|()| out.flush());
    drop(out);
    if reboot {
        say("rebooting into the new slot");
        super::reboot(paths)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Does what the partner asked; returns this box's view (for `status`) and whether to reboot.
fn answer(
    paths: &Paths,
    config: &Path,
    cfg: &Config,
    command: &PeerCommand,
    input: &mut impl Read,
) -> anyhow::Result<(Option<BoxView>, bool)> {
    let key_path = paths.root.join(super::DEFAULT_KEY);
    match *command {
        PeerCommand::Status => Ok((Some(view_here(paths, cfg)?), false)),
        PeerCommand::Install { bundle_len, reboot } => {
            let file = receive(paths, input, bundle_len)?;
            let done = install(paths, &file.0, &key_path);
            drop(file);
            done.map(|()| (None, reboot))
        }
        PeerCommand::InstallStaged { ref manifest_sha256, reboot } => {
            install(paths, &Staged::find(paths, manifest_sha256)?, &key_path).map(|()| (None, reboot))
        }
        PeerCommand::Roll { bundle_len, timeout_secs, ref staged_manifest_sha256 } => {
            let file = receive(paths, input, bundle_len)?;
            let limit = Duration::from_secs(timeout_secs);
            let outcome = roll(paths, &file.0, &key_path, config, limit, Some(staged_manifest_sha256));
            drop(file);
            Ok((None, outcome? == Outcome::RebootHere))
        }
    }
}

/// A received bundle, deleted when dropped.
struct Received(PathBuf);

impl Drop for Received {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn receive(paths: &Paths, input: &mut impl Read, len: u64) -> anyhow::Result<Received> {
    let dir = paths.root.join(INCOMING);
    fs::create_dir_all(&dir)?;
    let free = nix::sys::statvfs::statvfs(&dir).map(|s| s.blocks_available() * s.fragment_size())?;
    if len + SPARE_BYTES > free {
        bail!("a {len}-byte bundle does not fit in {} ({free} bytes free)", dir.display());
    }
    let file = Received(dir.join("from-partner.bundle"));
    let started = Instant::now();
    let mut out = File::create(&file.0)?;
    let got = std::io::copy(&mut input.take(len), &mut out)?;
    if got != len {
        bail!("the bundle was cut short after {got} of {len} bytes");
    }
    out.sync_all()?;
    say(&format!("received {len} bytes of bundle in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(file)
}

fn read_line(input: &mut impl BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    input.take(peer::MAX_REQUEST_LINE as u64).read_line(&mut line)?;
    if !line.ends_with('\n') {
        bail!("no request line");
    }
    Ok(line.trim_end().to_string())
}

/// The caller's address, from the socket systemd passed as standard input; its read timeout is
/// set on the way (a silent caller must not hold a root process forever).
fn remote_ip(stdin: &std::io::Stdin) -> anyhow::Result<IpAddr> {
    use nix::sys::socket::{SockaddrStorage, getpeername, setsockopt, sockopt};
    use std::os::fd::AsRawFd;
    let fd = stdin.as_fd();
    setsockopt(&fd, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(120, 0))?;
    let addr: SockaddrStorage = getpeername(fd.as_raw_fd()).context("standard input is not a socket")?;
    if let Some(v4) = addr.as_sockaddr_in() {
        return Ok(IpAddr::V4(v4.ip()));
    }
    match addr.as_sockaddr_in6().map(|v6| v6.ip()) {
        Some(ip) => Ok(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4)),
        None => bail!("the caller is not on IP"),
    }
}
