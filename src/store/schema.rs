//! Numbered schema migrations, applied in order inside one transaction; `PRAGMA user_version`
//! records how far a database has come. Append new steps, never edit old ones.

use rusqlite::Connection;

const MIGRATIONS: &[&str] = &[
    // 1: one row per address that has ever changed; never-touched pool addresses have no row.
    "CREATE TABLE lease (
        addr INTEGER PRIMARY KEY,
        state INTEGER NOT NULL,
        owner BLOB,
        expires INTEGER NOT NULL,
        cltt INTEGER NOT NULL,
        version INTEGER NOT NULL,
        term INTEGER NOT NULL,
        hw BLOB NOT NULL,
        hostname TEXT,
        peer_synced_version INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX lease_unsynced ON lease(addr) WHERE peer_synced_version != version;",
    // 2: lease sync. `seq` is a binding's causal counter (see `Binding::seq`); `meta` holds this
    // store's random identity and the identity of the partner store the sync marks refer to;
    // `conflict` keeps both sides of every resolved conflict.
    "ALTER TABLE lease ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );
    CREATE TABLE conflict (
        id INTEGER PRIMARY KEY,
        at INTEGER NOT NULL,
        addr INTEGER NOT NULL,
        kind TEXT NOT NULL,
        winner_addr INTEGER NOT NULL,
        winner_state INTEGER NOT NULL,
        winner_owner BLOB,
        winner_expires INTEGER NOT NULL,
        winner_cltt INTEGER NOT NULL,
        winner_term INTEGER NOT NULL,
        loser_addr INTEGER NOT NULL,
        loser_state INTEGER NOT NULL,
        loser_owner BLOB,
        loser_expires INTEGER NOT NULL,
        loser_cltt INTEGER NOT NULL,
        loser_term INTEGER NOT NULL
    );",
];

/// The schema version this build writes.
pub(super) const CURRENT: i64 = MIGRATIONS.len() as i64;

/// Structures the numbered steps made that this build no longer keeps. Dropping them is a
/// change every earlier build can still read, so it carries no new version number: a box whose
/// updated slot is rolled back boots the older build, which refuses a store from a newer schema
/// but opens this one.
///
/// `lease_unsynced`: lease sync keeps the unsynced set in memory and never read the index, yet
/// every change of a row's version moved the row's entry in it — a second page written to the
/// log with every lease (about a tenth of a lease's CPU at 4,000 leases/s).
const DROPPED: &str = "DROP INDEX IF EXISTS lease_unsynced;";

/// Brings `conn` up to [`CURRENT`]. Refuses a database from a newer build rather than guess.
pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<Result<(), i64>> {
    let have: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if have > CURRENT {
        return Ok(Err(have));
    }
    let tx = conn.transaction()?;
    for step in &MIGRATIONS[have as usize..] {
        tx.execute_batch(step)?;
    }
    tx.execute_batch(DROPPED)?;
    if have < CURRENT {
        tx.pragma_update(None, "user_version", CURRENT)?;
    }
    tx.commit()?;
    Ok(Ok(()))
}
