//! One battery, three real arbiters: the local PostgreSQL (127.0.0.1:5432, database `test`), the
//! local MariaDB (127.0.0.1:3306, database `test`) and a SQLite file. Every test uses its own
//! utype, so tests run in parallel on the shared table. Waits for expiry poll the arbiter's own
//! verdict (`live`) with a deadline instead of sleeping a fixed time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use twinlease::config::TlsMode;
use twinlease::election::backend::{
    AnyBackend, Backend, InitOutcome, mysql::MyBackend, postgres::PgBackend, sqlite::LiteBackend,
};
use twinlease::election::{ArbiterError, Beat, Claim, Election, ElectionHooks, ElectionView, Params, Uuid};
use twinlease::role::Role;

const PG_URL: &str = "postgres://root@127.0.0.1:5432/test";
const MY_URL: &str = "mysql://root@127.0.0.1:3306/test";

static N: AtomicU32 = AtomicU32::new(0);

fn utype(tag: &str) -> String {
    format!(
        "test/{tag}/{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        Instant::now().elapsed().as_nanos() % 1000
    )
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Pg,
    My,
    Lite,
}

fn sqlite_url() -> String {
    // One file per test process, shared by every backend instance in it (as two processes on one
    // host would share it); utypes keep tests apart.
    let dir = std::env::temp_dir().join(format!("twinlease-arbiter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    format!("sqlite://{}/arbiter.db", dir.display())
}

fn backend(k: Kind) -> AnyBackend {
    match k {
        Kind::Pg => AnyBackend::Postgres(Box::new(PgBackend::new(PG_URL, None, TlsMode::Off, None).unwrap())),
        Kind::My => AnyBackend::Mysql(MyBackend::new(MY_URL, None, TlsMode::Off, None).unwrap()),
        Kind::Lite => AnyBackend::Sqlite(LiteBackend::new(&sqlite_url()).unwrap()),
    }
}

fn claim(utype: &str, t_ms: u64) -> Claim {
    let uuid = Uuid::new_v4();
    Claim {
        utype: utype.into(),
        uuid,
        name: format!("node-{}", &uuid.to_string()[..8]),
        endpoint: "198.18.0.1".into(),
        timeout_ms: t_ms,
        min_term: 0,
    }
}

async fn ready(k: Kind, utype: &str, t_ms: u64) -> AnyBackend {
    let mut b = backend(k);
    assert_eq!(b.init(utype, t_ms).await.unwrap(), InitOutcome::Ready);
    b
}

async fn wait_expired(b: &mut AnyBackend, utype: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let r = b.read(utype).await.unwrap().expect("row");
        if !r.live {
            return;
        }
        assert!(start.elapsed() < limit, "row still live after {limit:?}: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn applied_term(b: Beat) -> u64 {
    match b {
        Beat::Applied { term, .. } => term,
        Beat::NotApplied => panic!("expected the heartbeat to apply"),
    }
}

async fn insert_renew_and_reject(k: Kind) {
    let u = utype("basic");
    let mut b = ready(k, &u, 5000).await;
    assert_eq!(b.init(&u, 5000).await.unwrap(), InitOutcome::Ready, "init is idempotent");
    assert_eq!(b.read(&u).await.unwrap(), None);
    let a = claim(&u, 5000);
    let first = b.heartbeat(&a).await.unwrap();
    assert_eq!(applied_term(first), 1, "an absent row is inserted with term 1");
    let row = b.read(&u).await.unwrap().expect("row");
    assert!(
        row.live
            && row.uuid == a.uuid
            && row.term == 1
            && row.timeout_ms == 5000
            && row.name == a.name
            && row.endpoint == a.endpoint,
        "{row:?}"
    );
    assert!((0..2000).contains(&row.age_ms), "age {}", row.age_ms);
    let Beat::Applied { ts_us: ts1, .. } = first else { unreachable!() };
    assert_eq!(row.ts_us, ts1, "the ts returned is the ts written");
    let renew = b.heartbeat(&a).await.unwrap();
    assert_eq!(applied_term(renew), 1, "a renewal keeps the term");
    let Beat::Applied { ts_us: ts2, .. } = renew else { unreachable!() };
    assert!(ts2 >= ts1);
    // A rival cannot take a live row, and its attempt changes nothing.
    let rival = claim(&u, 5000);
    assert_eq!(b.heartbeat(&rival).await.unwrap(), Beat::NotApplied);
    let after = b.read(&u).await.unwrap().unwrap();
    assert_eq!((after.uuid, after.term, after.ts_us), (a.uuid, 1, ts2));
}

async fn takeover_after_expiry(k: Kind) {
    let u = utype("takeover");
    let t = 400;
    let mut b = ready(k, &u, t).await;
    let a = claim(&u, t);
    assert_eq!(applied_term(b.heartbeat(&a).await.unwrap()), 1);
    wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    let row = b.read(&u).await.unwrap().unwrap();
    assert!(row.age_ms >= t as i64, "{row:?}");
    let rival = claim(&u, t);
    assert_eq!(applied_term(b.heartbeat(&rival).await.unwrap()), 2, "take-over bumps the term");
    assert_eq!(b.heartbeat(&a).await.unwrap(), Beat::NotApplied, "the old holder cannot renew");
    // A holder that lets its own row expire gets it back only as a new term.
    wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    assert_eq!(applied_term(b.heartbeat(&rival).await.unwrap()), 3);
}

/// A box elected by its partner's vote carries its term to the row: the row's term never goes
/// below the floor, and never backwards.
async fn the_term_floor_only_moves_terms_forward(k: Kind) {
    let u = utype("floor");
    let t = 400;
    let mut b = ready(k, &u, t).await;
    let mut a = claim(&u, t);
    a.min_term = 5;
    assert_eq!(applied_term(b.heartbeat(&a).await.unwrap()), 5, "an absent row starts at the floor");
    a.min_term = 2;
    assert_eq!(applied_term(b.heartbeat(&a).await.unwrap()), 5, "a lower floor never lowers the term");
    a.min_term = 7;
    assert_eq!(applied_term(b.heartbeat(&a).await.unwrap()), 7, "the holder's renewal raises it to the floor");
    let mut rival = claim(&u, t);
    rival.min_term = 20;
    assert_eq!(b.heartbeat(&rival).await.unwrap(), Beat::NotApplied, "a floor never takes a live row");
    assert_eq!(b.read(&u).await.unwrap().unwrap().term, 7);
    wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    rival.min_term = 3;
    assert_eq!(applied_term(b.heartbeat(&rival).await.unwrap()), 8, "take-over: term + 1 above a low floor");
    wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    a.min_term = 12;
    assert_eq!(applied_term(b.heartbeat(&a).await.unwrap()), 12, "take-over at a higher floor");
}

async fn a_different_t_never_renews_nor_takes_over(k: Kind) {
    let u = utype("tmismatch");
    let mut b = ready(k, &u, 400).await;
    let a = claim(&u, 400);
    b.heartbeat(&a).await.unwrap();
    let mut other_t = claim(&u, 9000);
    assert_eq!(b.heartbeat(&other_t).await.unwrap(), Beat::NotApplied);
    other_t.uuid = a.uuid;
    assert_eq!(b.heartbeat(&other_t).await.unwrap(), Beat::NotApplied, "not even the holder with another T");
    match b.init(&u, 9000).await {
        Err(ArbiterError::TimeoutMismatch { stored_ms: 400, wanted_ms: 9000, .. }) => {}
        other => panic!("init must refuse to change T of a live row: {other:?}"),
    }
    wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    assert_eq!(b.heartbeat(&claim(&u, 9000)).await.unwrap(), Beat::NotApplied, "expired, but still another T");
    assert_eq!(b.init(&u, 9000).await.unwrap(), InitOutcome::AdoptedTimeout { old_ms: 400 });
    assert_eq!(applied_term(b.heartbeat(&claim(&u, 9000)).await.unwrap()), 2);
}

/// N contenders with their own connections hit an absent row, then an expired one, at once:
/// exactly one wins each time, and each win is a new term.
async fn concurrent_takeover_races(k: Kind) {
    let u = utype("race");
    // Long enough that the round's first winner still holds its row when the last contender's
    // statement runs: twelve connections queue on one SQLite file, and on a loaded machine
    // that took longer than 300 ms (a second, legitimate take-over after expiry).
    let t = 1500;
    let mut b = ready(k, &u, t).await;
    let n = 12;
    let mut last_term = 0;
    for round in 0..4 {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let (u, barrier) = (u.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let mut b = backend(k);
                let c = claim(&u, t);
                b.read(&u).await.unwrap(); // connect before the start line
                barrier.wait().await;
                (c.uuid, b.heartbeat(&c).await.unwrap())
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (uuid, beat) = task.await.unwrap();
            if let Beat::Applied { term, .. } = beat {
                winners.push((uuid, term));
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner, got {winners:?}");
        let (uuid, term) = winners[0];
        assert_eq!(term, last_term + 1, "round {round}");
        last_term = term;
        let row = b.read(&u).await.unwrap().unwrap();
        assert_eq!((row.uuid, row.term), (uuid, term));
        wait_expired(&mut b, &u, Duration::from_secs(5)).await;
    }
}

/// A clean stop expires the holder's row at once; nobody else can expire it.
async fn release_hands_over(k: Kind) {
    let u = utype("release");
    let mut b = ready(k, &u, 5000).await;
    let a = claim(&u, 5000);
    b.heartbeat(&a).await.unwrap();
    assert!(!b.release(&u, Uuid::new_v4()).await.unwrap(), "a stranger cannot release it");
    assert!(b.read(&u).await.unwrap().unwrap().live);
    assert!(b.release(&u, a.uuid).await.unwrap());
    assert!(!b.read(&u).await.unwrap().unwrap().live, "released means expired");
    assert_eq!(
        applied_term(b.heartbeat(&claim(&u, 5000)).await.unwrap()),
        2,
        "the next box takes over at once, as a new term"
    );
}

/// Rows idle for decades: no overflow in the age, and they can be taken over.
async fn long_idle_rows(k: Kind) {
    let u = utype("idle");
    let mut b = ready(k, &u, 5000).await;
    b.heartbeat(&claim(&u, 5000)).await.unwrap();
    age_row(k, &u, 40).await;
    let row = b.read(&u).await.unwrap().unwrap();
    let forty_years_ms = 40 * 365 * 86_400_000i64;
    assert!(!row.live && row.age_ms >= forty_years_ms && row.age_ms < forty_years_ms + 30 * 86_400_000, "{row:?}");
    assert_eq!(applied_term(b.heartbeat(&claim(&u, 5000)).await.unwrap()), 2);
}

/// Moves the row's ts `years` into the past, straight in the database.
async fn age_row(k: Kind, utype: &str, years: i64) {
    match k {
        Kind::Pg => {
            let (c, conn) = tokio_postgres::connect(PG_URL, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            c.execute(
                &format!("UPDATE twinlease_heartbeat SET ts = ts - interval '{years} years' WHERE utype = $1"),
                &[&utype],
            )
            .await
            .unwrap();
        }
        Kind::My => {
            use mysql_async::prelude::Queryable;
            let mut c = mysql_async::Conn::from_url(MY_URL).await.unwrap();
            c.exec_drop(
                format!("UPDATE twinlease_heartbeat SET ts = ts - INTERVAL {years} YEAR WHERE utype = ?"),
                (utype,),
            )
            .await
            .unwrap();
        }
        Kind::Lite => {
            let url = sqlite_url();
            let c = rusqlite::Connection::open(url.strip_prefix("sqlite://").unwrap()).unwrap();
            c.busy_timeout(Duration::from_secs(5)).unwrap();
            c.execute(
                "UPDATE twinlease_heartbeat SET ts = ts - ?2 WHERE utype = ?1",
                rusqlite::params![utype, years * 365 * 86_400_000_000i64 + 10 * 86_400_000_000],
            )
            .unwrap();
        }
    }
}

/// Two real election drivers: one becomes active; when it becomes ineligible (its store cannot
/// commit) it steps down at once and the other takes over within T + I (+ slack for the test
/// machine); when that one stops, the first, eligible again, takes over. Never both at once.
async fn two_drivers_fail_over(k: Kind) {
    let u = utype("drivers");
    let params = Params { interval: Duration::from_millis(100), timeout: Duration::from_millis(500) };
    ready(k, &u, 500).await;
    let (a_tx, a_rx) = tokio::sync::watch::channel(Role::Standby);
    let (b_tx, b_rx) = tokio::sync::watch::channel(Role::Standby);
    let (a_ok, a_ok_rx) = tokio::sync::watch::channel(true);
    let (b_ok, b_ok_rx) = tokio::sync::watch::channel(true);
    let a = tokio::spawn(Election::new(backend(k), params, &u, "a", "198.18.0.1").run(hooks(a_tx, a_ok_rx)));
    let b = tokio::spawn(Election::new(backend(k), params, &u, "b", "198.18.0.2").run(hooks(b_tx, b_ok_rx)));
    let both = || (a_rx.borrow().is_active(), b_rx.borrow().is_active());
    let start = Instant::now();
    let first = loop {
        let (ra, rb) = both();
        assert!(!(ra && rb), "both active");
        if ra || rb {
            break if ra { 'a' } else { 'b' };
        }
        assert!(start.elapsed() < Duration::from_secs(5), "nobody became active");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Watch for overlap for a few intervals.
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        assert!(!(a_rx.borrow().is_active() && b_rx.borrow().is_active()), "both active");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ((sick, sick_rx), (other, other_rx)) =
        if first == 'a' { ((&a_ok, &a_rx), (b, &b_rx)) } else { ((&b_ok, &b_rx), (a, &a_rx)) };
    // On a loaded machine the first holder may miss a renewal and take its row back, so the
    // terms are compared with what they were, not with fixed numbers.
    let sick_term = sick_rx.borrow().term().expect("the active has a term");
    sick.send_replace(false);
    let stepped = Instant::now();
    wait_active(other_rx, stepped, "after the active became ineligible", &both).await;
    assert!(!sick_rx.borrow().is_active(), "an ineligible box stays standby");
    let takeover_term = other_rx.borrow().term().expect("the new active has a term");
    assert!(takeover_term > sick_term, "take-over term {takeover_term} moves past {sick_term}");
    eprintln!("{k:?}: take-over {:?} after the active became ineligible (T = 500 ms, I = 100 ms)", stepped.elapsed());

    sick.send_replace(true);
    other.abort();
    let died = Instant::now();
    wait_active(sick_rx, died, "after the new active stopped", &both).await;
    let back_term = sick_rx.borrow().term().expect("the active has a term");
    assert!(back_term > takeover_term, "eligible again, it takes over with term {back_term} > {takeover_term}");
    eprintln!("{k:?}: take-over {:?} after the active stopped", died.elapsed());
}

/// An election's hooks with only a role and an eligibility to watch.
fn hooks(role: tokio::sync::watch::Sender<Role>, eligible: tokio::sync::watch::Receiver<bool>) -> ElectionHooks {
    let (_, commands) = tokio::sync::mpsc::channel(1);
    let (view, _) = tokio::sync::watch::channel(ElectionView::default());
    ElectionHooks {
        role,
        eligible,
        commands,
        view,
        events: twinlease::events::Events::default(),
        peer: None,
        promises: None,
    }
}

/// Waits for `rx` to be active within T + I + slack of `since`, checking for overlap.
async fn wait_active(
    rx: &tokio::sync::watch::Receiver<Role>,
    since: Instant,
    what: &str,
    both: &impl Fn() -> (bool, bool),
) {
    while !rx.borrow().is_active() {
        let (ra, rb) = both();
        assert!(!(ra && rb), "both active");
        assert!(since.elapsed() < Duration::from_millis(500 + 100 + 700), "no take-over within T + I + slack {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

macro_rules! battery {
    ($($m:ident: $kind:expr;)*) => {$(
        mod $m {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn insert_renew_and_reject() { super::insert_renew_and_reject($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn takeover_after_expiry() { super::takeover_after_expiry($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_term_floor_only_moves_terms_forward() { super::the_term_floor_only_moves_terms_forward($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_different_t_never_renews_nor_takes_over() { super::a_different_t_never_renews_nor_takes_over($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_takeover_races() { super::concurrent_takeover_races($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_hands_over() { super::release_hands_over($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn long_idle_rows() { super::long_idle_rows($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_drivers_fail_over() { super::two_drivers_fail_over($kind).await }
        }
    )*};
}

battery! {
    postgres: Kind::Pg;
    mariadb: Kind::My;
    sqlite: Kind::Lite;
}

// ---- TLS -----------------------------------------------------------------------------------

/// Debian's PostgreSQL serves TLS with the "snakeoil" certificate (CN and SAN = localhost).
const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

#[tokio::test]
async fn postgres_tls_require_verifies_the_server_certificate() {
    if !std::path::Path::new(SNAKEOIL).exists() {
        eprintln!("SKIP: {SNAKEOIL} absent; the local PostgreSQL has no certificate to verify");
        return;
    }
    let mut b = PgBackend::new(
        "postgres://root@localhost:5432/test",
        None,
        TlsMode::Require,
        Some(std::path::Path::new(SNAKEOIL)),
    )
    .unwrap();
    assert!(b.is_encrypted().await.unwrap(), "the session must be encrypted");
    let u = utype("tls");
    b.init(&u, 5000).await.unwrap();
    assert_eq!(applied_term(b.heartbeat(&claim(&u, 5000)).await.unwrap()), 1);

    // Prefer also ends up encrypted; off does not.
    let mut p = PgBackend::new(
        "postgres://root@localhost:5432/test",
        None,
        TlsMode::Prefer,
        Some(std::path::Path::new(SNAKEOIL)),
    )
    .unwrap();
    assert!(p.is_encrypted().await.unwrap());
    let mut o = PgBackend::new(PG_URL, None, TlsMode::Off, None).unwrap();
    assert!(!o.is_encrypted().await.unwrap());

    // A certificate for another name, or an untrusted CA, is refused.
    let mut wrong_name = PgBackend::new(
        "postgres://root@127.0.0.1:5432/test",
        None,
        TlsMode::Require,
        Some(std::path::Path::new(SNAKEOIL)),
    )
    .unwrap();
    let e = wrong_name.read(&u).await.expect_err("127.0.0.1 is not in the certificate");
    assert!(matches!(e, ArbiterError::Connect { .. }), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let other_ca = dir.path().join("other.pem");
    std::fs::write(
        &other_ca,
        std::fs::read_to_string("/etc/ssl/certs/ISRG_Root_X1.pem")
            .unwrap_or_else(|_| std::fs::read_to_string(first_system_ca()).unwrap()),
    )
    .unwrap();
    let mut untrusted =
        PgBackend::new("postgres://root@localhost:5432/test", None, TlsMode::Require, Some(&other_ca)).unwrap();
    let e = untrusted.read(&u).await.expect_err("the snakeoil certificate is not signed by that CA");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}

fn first_system_ca() -> std::path::PathBuf {
    std::fs::read_dir("/etc/ssl/certs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pem") && !p.ends_with("ssl-cert-snakeoil.pem"))
        .expect("a system CA")
}

#[tokio::test]
async fn mariadb_without_tls_is_refused_by_require_and_used_by_prefer() {
    // The local MariaDB has TLS disabled (have_ssl = DISABLED): "require" must fail rather than
    // fall back; "prefer" connects in plain text.
    let u = utype("mytls");
    let mut req = MyBackend::new(MY_URL, None, TlsMode::Require, None).unwrap();
    let e = req.read(&u).await.expect_err("require must not fall back to plain text");
    assert!(matches!(e, ArbiterError::Connect { .. }), "{e}");
    let mut pre = MyBackend::new(MY_URL, None, TlsMode::Prefer, None).unwrap();
    pre.init(&u, 5000).await.unwrap();
    assert!(!pre.is_encrypted().await.unwrap());
    assert_eq!(applied_term(pre.heartbeat(&claim(&u, 5000)).await.unwrap()), 1);
}
