//! One battery of store tests, run against an in-memory and an on-disk database.

use std::net::Ipv4Addr;

use super::*;
use crate::lease::{Binding, ClientKey, LeaseState, Transition};

fn leased(addr: u8, client: u8, version: u64, expect: Option<u8>) -> Transition {
    let owner = Some(ClientKey::from_hw(1, &[2, 0, 0, 0, 0, client]));
    Transition {
        expect_version: version - 1,
        expect_owner: expect.map(|c| ClientKey::from_hw(1, &[2, 0, 0, 0, 0, c])),
        new: Binding {
            addr: Ipv4Addr::new(198, 18, 0, addr),
            state: LeaseState::Leased,
            owner,
            expires: 1000 + version,
            cltt: 10 * version,
            version,
            term: 3,
            seq: version,
            hw: vec![2, 0, 0, 0, 0, client],
            hostname: Some(format!("host{client}")),
        },
    }
}

fn roundtrip(mut s: LeaseStore) {
    let t1 = leased(10, 1, 1, None);
    let t2 = leased(11, 2, 1, None);
    s.commit(&[&t1, &t2]).unwrap();
    let all = s.load_all().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].binding, t1.new);
    assert_eq!(all[1].binding, t2.new);
    assert!(!all[0].synced(), "a fresh change is unsynced");
}

fn cas_conflict_rolls_back_the_whole_batch(mut s: LeaseStore) {
    s.commit(&[&leased(10, 1, 1, None)]).unwrap();
    // Second batch: a good change to .11 and a stale one to .10 (expects version 5).
    let good = leased(11, 2, 1, None);
    let stale = leased(10, 1, 6, Some(1));
    let err = s.commit(&[&good, &stale]).unwrap_err();
    assert!(matches!(err, StoreError::Conflict { expected: 5, .. }), "{err}");
    assert!(s.get(Ipv4Addr::new(198, 18, 0, 11)).unwrap().is_none(), "the good half was rolled back");
}

fn cas_checks_the_owner(mut s: LeaseStore) {
    s.commit(&[&leased(10, 1, 1, None)]).unwrap();
    // Right version, wrong expected owner: someone else's release must not apply.
    let foreign = leased(10, 9, 2, Some(9));
    assert!(matches!(s.commit(&[&foreign]), Err(StoreError::Conflict { .. })));
    // A second insert of a never-seen address (expect version 0) also conflicts.
    assert!(matches!(s.commit(&[&leased(10, 1, 1, None)]), Err(StoreError::Conflict { .. })));
    s.commit(&[&leased(10, 1, 2, Some(1))]).unwrap();
}

fn mark_synced_compares_the_version(mut s: LeaseStore) {
    let a = Ipv4Addr::new(198, 18, 0, 10);
    s.commit(&[&leased(10, 1, 1, None)]).unwrap();
    s.commit(&[&leased(10, 1, 2, Some(1))]).unwrap(); // a renew before the partner's ack came back
    assert!(!s.mark_synced(a, 1).unwrap(), "the ack for version 1 must not mark version 2 synced");
    assert!(!s.get(a).unwrap().unwrap().synced());
    assert!(s.mark_synced(a, 2).unwrap());
    assert!(s.get(a).unwrap().unwrap().synced());
}

fn sync_marks_conflicts_and_identity(mut s: LeaseStore) {
    let a = Ipv4Addr::new(198, 18, 0, 10);
    let id = s.store_id().unwrap();
    assert_eq!(s.store_id().unwrap(), id, "the identity is created once");
    assert_eq!(s.partner_store_id().unwrap(), None, "a new store never synced");
    let t = leased(10, 1, 1, None);
    let winner = t.new.clone();
    let mut loser = leased(10, 2, 1, None).new;
    loser.term = 1;
    let c = ConflictRecord { at: 5, kind: ConflictKind::Address, winner: winner.clone(), loser: loser.clone() };
    // The change, its mark (the partner holds version 1) and the conflict, in one transaction.
    s.commit_with(&[&t], &[(a, 1)], std::slice::from_ref(&c)).unwrap();
    assert!(s.get(a).unwrap().unwrap().synced());
    let got = s.conflicts().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].kind, got[0].winner.owner.clone(), got[0].loser.owner.clone(), got[0].loser.term),
        (ConflictKind::Address, winner.owner, loser.owner, 1)
    );
    // A different partner store: every mark is forgotten.
    s.reset_partner(77).unwrap();
    assert_eq!(s.partner_store_id().unwrap(), Some(77));
    assert!(!s.get(a).unwrap().unwrap().synced());
}

macro_rules! battery {
    ($($name:ident),*) => {
        mod in_memory {
            $( #[test] fn $name() { super::$name(super::LeaseStore::open_in_memory().unwrap()) } )*
        }
        mod on_disk {
            $( #[test] fn $name() {
                let dir = tempfile::tempdir().unwrap();
                let (s, report) = super::LeaseStore::open(&dir.path().join("leases.db"), 1).unwrap();
                assert!(report.quarantined.is_none());
                super::$name(s)
            } )*
        }
    };
}

fn a_chain_of_changes_in_one_commit_leaves_the_last(mut s: LeaseStore) {
    // An offer (insert) and the ACK that expects it, in one group: one write of the last.
    let mut offer = leased(10, 1, 1, None);
    offer.new.state = LeaseState::Offered;
    let ack = leased(10, 1, 2, Some(1));
    let other = leased(11, 2, 1, None);
    s.commit(&[&offer, &other, &ack]).unwrap();
    assert_eq!(s.get(Ipv4Addr::new(198, 18, 0, 10)).unwrap().unwrap().binding, ack.new);
    // A change that does not expect what the previous one wrote is not folded: it fails, and
    // the whole batch with it.
    let renew = leased(10, 1, 3, Some(1));
    let stale = leased(10, 1, 3, Some(1));
    let err = s.commit(&[&renew, &stale]).unwrap_err();
    assert!(matches!(err, StoreError::Conflict { expected: 2, .. }), "{err}");
    assert_eq!(s.get(Ipv4Addr::new(198, 18, 0, 10)).unwrap().unwrap().binding, ack.new);
}

battery!(
    a_chain_of_changes_in_one_commit_leaves_the_last,
    roundtrip,
    cas_conflict_rolls_back_the_whole_batch,
    cas_checks_the_owner,
    mark_synced_compares_the_version,
    sync_marks_conflicts_and_identity
);

#[test]
fn a_store_from_an_earlier_build_loses_its_unsynced_index_and_keeps_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    drop(LeaseStore::open(&path, 1).unwrap());
    let indexes = |c: &rusqlite::Connection| -> Vec<String> {
        let mut q = c.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'lease'").unwrap();
        q.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    // What an earlier build left: the index, at the same schema version.
    let old = rusqlite::Connection::open(&path).unwrap();
    assert!(indexes(&old).is_empty(), "a new store has no unsynced index");
    old.execute_batch("CREATE INDEX lease_unsynced ON lease(addr) WHERE peer_synced_version != version").unwrap();
    let version: i64 = old.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    drop(old);
    let (mut s, _) = LeaseStore::open(&path, 2).unwrap();
    s.commit(&[&leased(10, 1, 1, None)]).unwrap();
    drop(s);
    let again = rusqlite::Connection::open(&path).unwrap();
    assert!(indexes(&again).is_empty());
    let now: i64 = again.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(now, version, "an earlier build (a rolled-back slot) must still open it");
}

#[test]
fn committed_data_survives_reopen_and_is_visible_read_only_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (mut s, _) = LeaseStore::open(&path, 1).unwrap();
    let t = leased(10, 1, 1, None);
    s.commit(&[&t]).unwrap();
    let ro = LeaseStore::open_read_only(&path).unwrap();
    assert_eq!(ro.load_all().unwrap()[0].binding, t.new, "a reader sees the writer's commit");
    drop(s);
    let (s, _) = LeaseStore::open(&path, 2).unwrap();
    assert_eq!(s.load_all().unwrap()[0].binding, t.new);
}

#[test]
fn a_corrupt_file_is_quarantined_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    std::fs::write(&path, b"this is not an SQLite database, just some bytes that say so....................................................").unwrap();
    let (s, report) = LeaseStore::open(&path, 77).unwrap();
    let moved = report.quarantined.expect("quarantined");
    assert!(moved.to_string_lossy().ends_with("leases.db.corrupt-77"));
    assert!(moved.exists());
    assert!(s.load_all().unwrap().is_empty());
}

#[test]
fn a_damaged_page_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    {
        let (mut s, _) = LeaseStore::open(&path, 1).unwrap();
        let ts: Vec<Transition> = (1..=200).map(|i| leased(i, i, 1, None)).collect();
        s.commit(&ts.iter().collect::<Vec<_>>()).unwrap();
        s.conn.pragma_update(None, "wal_checkpoint", "TRUNCATE").unwrap();
    }
    // Scribble over the second page (the lease table's b-tree).
    let mut bytes = std::fs::read(&path).unwrap();
    for b in &mut bytes[4096..4096 + 600] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let (_, report) = LeaseStore::open(&path, 5).unwrap();
    assert!(report.quarantined.is_some(), "damage must be noticed at open");
}

#[test]
fn migrations_are_idempotent_and_refuse_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    drop(LeaseStore::open(&path, 1).unwrap());
    drop(LeaseStore::open(&path, 1).unwrap());
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
    }
    let err = LeaseStore::open(&path, 1).err().expect("too new");
    assert!(err.to_string().contains("newer twinlease"), "{err}");
}

#[test]
fn a_reader_opens_after_the_log_was_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (mut s, _) = LeaseStore::open(&path, 1).unwrap();
    let t = leased(10, 1, 1, None);
    s.commit(&[&t]).unwrap();
    assert!(s.trim_wal(true).unwrap(), "an idle writer empties the log");
    assert_eq!(s.wal_bytes(), 0);
    let ro = LeaseStore::open_read_only(&path).unwrap();
    assert_eq!(ro.load_all().unwrap()[0].binding, t.new);
}

#[test]
fn a_cleanly_closed_store_reads_as_immutable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd?name#%.db");
    let (mut s, _) = LeaseStore::open(&path, 1).unwrap();
    let t = leased(10, 1, 1, None);
    s.commit(&[&t]).unwrap();
    drop(s);
    assert!(!dir.path().join("odd?name#%.db-wal").exists(), "a clean close leaves no log");
    let ro = LeaseStore::open_immutable(&path).unwrap();
    assert_eq!(ro.load_all().unwrap()[0].binding, t.new);
}

/// A store on disk with one lease, for the file checks.
fn store_with_a_lease(dir: &std::path::Path) -> (LeaseStore, Transition) {
    let (mut s, _) = LeaseStore::open(&dir.join("leases.db"), 1).unwrap();
    let t = leased(10, 1, 1, None);
    s.commit(&[&t]).unwrap();
    s.trim_wal(true).unwrap();
    (s, t)
}

#[test]
fn a_file_replaced_truncated_or_overwritten_underneath_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let lost = |s: &LeaseStore| match s.check_file() {
        Err(StoreError::FileLost { what, .. }) => what,
        other => panic!("not noticed: {other:?}"),
    };
    let wipe = || {
        for part in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{part}", path.display()));
        }
    };
    let (s, _) = store_with_a_lease(dir.path());
    s.check_file().unwrap();
    let other = dir.path().join("other.db");
    std::fs::copy(&path, &other).unwrap();
    std::fs::rename(&other, &path).unwrap();
    assert!(lost(&s).contains("replaced"));
    drop(s);

    wipe();
    let (s, _) = store_with_a_lease(dir.path());
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    assert!(lost(&s).contains("truncated"));
    drop(s);

    wipe();
    let (s, _) = store_with_a_lease(dir.path());
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::File::options().write(true).open(&path).unwrap(),
        &[0x5a; 512],
        0,
    )
    .unwrap();
    assert!(lost(&s).contains("overwritten"));
    drop(s);

    wipe();
    let (s, _) = store_with_a_lease(dir.path());
    std::fs::remove_file(&path).unwrap();
    assert!(lost(&s).contains("deleted"));
}

#[test]
fn a_rebuild_writes_the_rows_and_identity_to_a_fresh_file_and_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (mut s, t) = store_with_a_lease(dir.path());
    let id = s.store_id().unwrap();
    s.reset_partner(99).unwrap();
    let rows = vec![StoredBinding { binding: t.new.clone(), peer_synced_version: t.new.version }];
    let identity = s.identity();
    drop(s);
    std::fs::write(&path, b"garbage").unwrap();
    let (mut fresh, moved) = LeaseStore::rebuild(&path, &rows, identity, 7).unwrap();
    assert_eq!(moved.as_deref(), Some(dir.path().join("leases.db.lost-7").as_path()));
    assert_eq!(std::fs::read(dir.path().join("leases.db.lost-7")).unwrap(), b"garbage");
    assert_eq!(fresh.load_all().unwrap(), rows);
    assert_eq!((fresh.store_id().unwrap(), fresh.partner_store_id().unwrap()), (id, Some(99)));
    fresh.check_file().unwrap();
    // A second loss in the same second keeps the first one's file.
    drop(fresh);
    let (_, moved) = LeaseStore::rebuild(&path, &rows, identity, 7).unwrap();
    assert_eq!(moved.as_deref(), Some(dir.path().join("leases.db.lost-7.1").as_path()));
}

mod folding {
    use proptest::prelude::*;

    use super::*;

    /// A step: which of three rows, whether it expects the row's real (version, owner), the
    /// version it expects otherwise, and its new owner (none, or one of two clients).
    type Step = (u8, bool, u64, u8);

    fn transitions(steps: &[Step]) -> Vec<Transition> {
        let mut rows: std::collections::HashMap<u8, (u64, Option<u8>)> = Default::default();
        let mut out = Vec::new();
        for &(row, honest, guess, owner) in steps {
            let (have, had) = rows.get(&row).copied().unwrap_or((0, None));
            let expect = if honest { have } else { guess };
            let mut t = leased(row, 1, expect + 1, if honest { had } else { Some(1) });
            let owner = (owner > 0).then_some(owner);
            t.new.owner = owner.map(|c| ClientKey::from_hw(1, &[2, 0, 0, 0, 0, c]));
            rows.insert(row, (expect + 1, owner));
            out.push(t);
        }
        out
    }

    proptest! {
        /// One commit of a batch (folded) leaves exactly what committing its changes one by
        /// one leaves when every one of them applies, and nothing at all when any one fails.
        #[test]
        fn a_folded_batch_equals_its_changes_one_by_one(
            before in proptest::collection::vec((0u8..3, any::<bool>(), 0u64..3, 0u8..3), 0..6),
            batch in proptest::collection::vec((0u8..3, prop::bool::weighted(0.8), 0u64..4, 0u8..3), 1..10),
        ) {
            let before = transitions(&before);
            let mut batched = LeaseStore::open_in_memory().unwrap();
            let mut one_by_one = LeaseStore::open_in_memory().unwrap();
            for t in &before {
                let _ = batched.commit(&[t]);
                let _ = one_by_one.commit(&[t]);
            }
            let start = batched.load_all().unwrap();
            let changes = transitions(&batch);
            let every_one_applied = changes.iter().all(|t| one_by_one.commit(&[t]).is_ok());
            let refs: Vec<&Transition> = changes.iter().collect();
            let result = batched.commit(&refs);
            prop_assert_eq!(result.is_ok(), every_one_applied);
            let expected = if every_one_applied { one_by_one.load_all().unwrap() } else { start };
            prop_assert_eq!(batched.load_all().unwrap(), expected);
        }
    }
}
