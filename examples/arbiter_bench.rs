//! `make bench-arbiter`: N branch pairs heartbeating against one PostgreSQL arbiter.
//!
//! Every simulated box runs the real election machine (`twinlease::election::Elector`) on its
//! own tokio task, with its own utype per pair, so the statement mix is the production one: the
//! active box sends UpdateHeartBeat every I, the standby GetPrimary every I. The boxes share a
//! small pool of pipelined connections (a head-office arbiter would sit behind a pooler).
//! Reports statements/s, per-statement latency percentiles, statements per box per interval,
//! and checks that each pair ended with exactly one active box.
//!
//! Options: --pairs N (5000) --seconds S (20) --interval-ms I (1000) --timeout-ms T (5000)
//!          --connections C (16) --url URL (postgres://root@127.0.0.1:5432/test)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use twinlease::clock::boottime;
use twinlease::config::TlsMode;
use twinlease::election::backend::postgres::{PgBackend, PgConn};
use twinlease::election::backend::{Backend, TABLE};
use twinlease::election::{Call, Claim, Effect, Elector, Params, Reply, Uuid};

struct Opts {
    pairs: usize,
    seconds: u64,
    interval_ms: u64,
    timeout_ms: u64,
    connections: usize,
    url: String,
}

fn opts() -> Opts {
    let mut o = Opts {
        pairs: 5000,
        seconds: 20,
        interval_ms: 1000,
        timeout_ms: 5000,
        connections: 16,
        url: "postgres://root@127.0.0.1:5432/test".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < args.len() {
        let v = &args[i + 1];
        match args[i].as_str() {
            "--pairs" => o.pairs = v.parse().expect("--pairs N"),
            "--seconds" => o.seconds = v.parse().expect("--seconds S"),
            "--interval-ms" => o.interval_ms = v.parse().expect("--interval-ms I"),
            "--timeout-ms" => o.timeout_ms = v.parse().expect("--timeout-ms T"),
            "--connections" => o.connections = v.parse().expect("--connections C"),
            "--url" => o.url = v.clone(),
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    o
}

#[derive(Default)]
struct Totals {
    statements: AtomicU64,
    reads: AtomicU64,
    beats: AtomicU64,
    failures: AtomicU64,
}

/// One box: runs the machine until `stop`; returns latencies (µs) measured after `warm`, and
/// whether it ended active.
async fn node(
    conn: Arc<PgConn>,
    params: Params,
    claim: Claim,
    offset: Duration,
    warm: Instant,
    stop: Instant,
    totals: Arc<Totals>,
) -> (Vec<u32>, bool) {
    tokio::time::sleep(offset).await;
    let mut m = Elector::new(params, claim.uuid, &claim.utype, boottime());
    let mut lat = Vec::new();
    let mut pending = m.poll(boottime());
    loop {
        let mut next = Vec::new();
        for e in pending.drain(..) {
            if let Effect::Send { id, call, deadline } = e {
                let left = deadline.saturating_sub(boottime());
                let t0 = Instant::now();
                let r = match call {
                    Call::Read => tokio::time::timeout(left, conn.read(&claim.utype)).await.map(|r| r.map(Reply::Read)),
                    Call::Heartbeat => {
                        tokio::time::timeout(left, conn.heartbeat(&claim)).await.map(|r| r.map(Reply::Beat))
                    }
                    // Simulated boxes never step down.
                    Call::Release => unreachable!("no step-down in the benchmark"),
                };
                let took = t0.elapsed();
                if t0 >= warm && t0 < stop {
                    totals.statements.fetch_add(1, Ordering::Relaxed);
                    match call {
                        Call::Read => totals.reads.fetch_add(1, Ordering::Relaxed),
                        Call::Heartbeat | Call::Release => totals.beats.fetch_add(1, Ordering::Relaxed),
                    };
                    lat.push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                }
                let reply = match r {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => {
                        totals.failures.fetch_add(1, Ordering::Relaxed);
                        Reply::Failed(e.to_string())
                    }
                    Err(_) => {
                        totals.failures.fetch_add(1, Ordering::Relaxed);
                        Reply::Failed("timeout".into())
                    }
                };
                next.extend(m.on_reply(boottime(), id, reply));
            }
        }
        if !next.is_empty() {
            pending = next;
            continue;
        }
        if Instant::now() >= stop {
            return (lat, m.active_term(boottime()).is_some());
        }
        tokio::time::sleep(m.wake_at().saturating_sub(boottime())).await;
        pending = m.poll(boottime());
    }
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = opts();
    let params =
        Params { interval: Duration::from_millis(o.interval_ms), timeout: Duration::from_millis(o.timeout_ms) };
    assert!(params.timeout > params.interval * 2, "T > 2I");
    let run = format!("bench/{}", std::process::id());
    let mut admin = PgBackend::new(&o.url, None, TlsMode::Off, None).expect("url");
    admin.init(&format!("{run}/0"), o.timeout_ms).await.expect("arbiter init");
    let mut conns = Vec::new();
    for _ in 0..o.connections {
        conns.push(Arc::new(PgConn::prepare(admin.connect().await.expect("connect")).await.expect("prepare")));
    }
    let totals = Arc::new(Totals::default());
    let warmup = Duration::from_secs(3).max(params.interval * 3);
    let start = Instant::now();
    let (warm, stop) = (start + warmup, start + warmup + Duration::from_secs(o.seconds));
    let mut tasks = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for p in 0..o.pairs {
        for side in 0..2 {
            // Spread start times over one interval, as independent boxes would be.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = Duration::from_micros(x % (o.interval_ms * 1000));
            let claim = Claim {
                utype: format!("{run}/{p}"),
                uuid: Uuid::new_v4(),
                name: format!("b{p}-{side}"),
                endpoint: String::new(),
                timeout_ms: o.timeout_ms,
                min_term: 0,
            };
            let conn = conns[(2 * p + side) % conns.len()].clone();
            tasks.push(tokio::spawn(node(conn, params, claim, offset, warm, stop, totals.clone())));
        }
    }
    let mut lat: Vec<u32> = Vec::new();
    let mut active = vec![0u8; o.pairs];
    for (k, t) in tasks.into_iter().enumerate() {
        let (l, is_active) = t.await.expect("node task");
        lat.extend(l);
        active[k / 2] += u8::from(is_active);
    }
    lat.sort_unstable();
    let secs = o.seconds as f64;
    let stmts = totals.statements.load(Ordering::Relaxed) as f64;
    let boxes = (2 * o.pairs) as f64;
    let intervals = secs * 1000.0 / o.interval_ms as f64;
    let pairs_ok = active.iter().filter(|a| **a == 1).count();
    let pairs_two = active.iter().filter(|a| **a > 1).count();
    println!(
        "arbiter benchmark: {} pairs ({} boxes), I = {} ms, T = {} ms, {} connections, {} s measured after {} s warm-up",
        o.pairs,
        2 * o.pairs,
        o.interval_ms,
        o.timeout_ms,
        o.connections,
        o.seconds,
        warmup.as_secs()
    );
    println!(
        "  statements/s            {:>10.0}  (heartbeats {:.0}/s, reads {:.0}/s)",
        stmts / secs,
        totals.beats.load(Ordering::Relaxed) as f64 / secs,
        totals.reads.load(Ordering::Relaxed) as f64 / secs
    );
    println!("  per box per interval    {:>10.2}", stmts / boxes / intervals);
    println!("  latency p50 / p99 / max {:>7.2} / {:.2} / {:.2} ms", pct(&lat, 0.5), pct(&lat, 0.99), pct(&lat, 1.0));
    println!("  failed or timed out     {:>10}", totals.failures.load(Ordering::Relaxed));
    println!("  pairs with one active   {:>10} of {} ({} with two)", pairs_ok, o.pairs, pairs_two);
    let cleanup = admin.connect().await.expect("connect");
    let _ = cleanup.execute(&format!("DELETE FROM {TABLE} WHERE utype LIKE $1"), &[&format!("{run}/%")]).await;
    if pairs_two > 0 {
        std::process::exit(2);
    }
}
