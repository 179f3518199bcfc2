//! What lease sync keeps in the store besides the leases: this store's identity, the identity
//! of the partner store the sync marks refer to, and the record of resolved conflicts.

use std::net::Ipv4Addr;

use rusqlite::{OptionalExtension, params};

use super::{LeaseColumns, LeaseStore, StoreError, StoredBinding};
use crate::lease::{Binding, ClientKey, LeaseState};

/// Two bindings that contradicted each other and which one the conflict rule kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRecord {
    pub at: u64,
    pub kind: ConflictKind,
    pub winner: Binding,
    pub loser: Binding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    /// One address held by two different clients.
    Address,
    /// One client holding two addresses in a subnet.
    Client,
}

impl ConflictKind {
    pub fn name(self) -> &'static str {
        match self {
            ConflictKind::Address => "address-held-by-two-clients",
            ConflictKind::Client => "client-holds-two-addresses",
        }
    }
}

const STORE_ID: &str = "store_id";
const PEER_STORE_ID: &str = "partner_store_id";

/// This store's identity and the partner store its sync marks refer to. A store rebuilt
/// without its identity gets a new one: the partner then treats it as a wiped store and sends
/// it everything, which is safe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreIdentity {
    pub store: Option<u64>,
    pub partner_store: Option<u64>,
}

fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    // /dev/urandom never blocks once the kernel is seeded; the time is a fallback only.
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    // Stored as a SQLite integer (signed); keep it positive and non-zero.
    (u64::from_le_bytes(b) >> 1).max(1)
}

impl LeaseStore {
    fn meta(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> =
            self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?;
        Ok(v.map(|v| v as u64))
    }

    /// Both identities as far as they can still be read (a damaged file may not say).
    pub fn identity(&self) -> StoreIdentity {
        StoreIdentity {
            store: self.meta(STORE_ID).ok().flatten(),
            partner_store: self.meta(PEER_STORE_ID).ok().flatten(),
        }
    }

    /// This store's identity, created with the store. A wiped or replaced disk gets a new one,
    /// which is how the partner knows its sync marks no longer mean anything.
    pub fn store_id(&mut self) -> Result<u64, StoreError> {
        if let Some(id) = self.meta(STORE_ID)? {
            return Ok(id);
        }
        let id = random_u64();
        self.conn.execute("INSERT INTO meta (key, value) VALUES (?1, ?2)", params![STORE_ID, id as i64])?;
        Ok(id)
    }

    /// The partner store that `peer_synced_version` refers to; `None` for a store that never
    /// synced (new or wiped).
    pub fn partner_store_id(&self) -> Result<Option<u64>, StoreError> {
        self.meta(PEER_STORE_ID)
    }

    /// The partner is a different store from the one the marks refer to: forget every mark (so
    /// everything is sent again) and remember the new partner, in one transaction.
    pub fn reset_partner(&mut self, partner_store_id: u64) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        tx.execute("UPDATE lease SET peer_synced_version = 0 WHERE peer_synced_version != 0", [])?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![PEER_STORE_ID, partner_store_id as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Fills a new, empty store with `rows` (sync marks included) and the given identities, in
    /// one transaction.
    pub(super) fn restore(&mut self, rows: &[StoredBinding], identity: StoreIdentity) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO lease (addr, state, owner, expires, cltt, version, term, hw, hostname, seq, peer_synced_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )?;
            for r in rows {
                LeaseColumns::of(&r.binding).execute(&mut insert, &[&(r.peer_synced_version as i64)])?;
            }
            let mut meta = tx.prepare(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?;
            if let Some(id) = identity.store {
                meta.execute(params![STORE_ID, id as i64])?;
            }
            if let Some(peer) = identity.partner_store {
                meta.execute(params![PEER_STORE_ID, peer as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Every recorded conflict, oldest first.
    pub fn conflicts(&self) -> Result<Vec<ConflictRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT at, kind, winner_addr, winner_state, winner_owner, winner_expires, winner_cltt, winner_term, loser_addr, loser_state, loser_owner, loser_expires, loser_cltt, loser_term FROM conflict ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            let side = |o: usize| -> rusqlite::Result<Option<Binding>> {
                let addr = Ipv4Addr::from(r.get::<_, u32>(o)?);
                let Some(state) = LeaseState::from_code(r.get(o + 1)?) else { return Ok(None) };
                let owner: Option<Vec<u8>> = r.get(o + 2)?;
                let mut b = Binding::fresh(addr);
                b.state = state;
                b.owner = owner.and_then(|o| ClientKey::from_bytes(&o));
                b.expires = r.get::<_, i64>(o + 3)? as u64;
                b.cltt = r.get::<_, i64>(o + 4)? as u64;
                b.term = r.get::<_, i64>(o + 5)? as u64;
                Ok(Some(b))
            };
            let kind: String = r.get(1)?;
            let kind = if kind == ConflictKind::Client.name() { ConflictKind::Client } else { ConflictKind::Address };
            Ok((r.get::<_, i64>(0)? as u64, kind, side(2)?, side(8)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (at, kind, w, l) = row?;
            if let (Some(winner), Some(loser)) = (w, l) {
                out.push(ConflictRecord { at, kind, winner, loser });
            }
        }
        Ok(out)
    }

    pub(super) fn insert_conflicts(tx: &rusqlite::Connection, list: &[ConflictRecord]) -> Result<(), StoreError> {
        if list.is_empty() {
            return Ok(());
        }
        let mut stmt = tx.prepare_cached(
            "INSERT INTO conflict (at, kind, winner_addr, winner_state, winner_owner, winner_expires, winner_cltt, winner_term, loser_addr, loser_state, loser_owner, loser_expires, loser_cltt, loser_term, addr) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?9)",
        )?;
        for c in list {
            let (w, l) = (&c.winner, &c.loser);
            stmt.execute(params![
                c.at as i64,
                c.kind.name(),
                u32::from(w.addr),
                w.state.code(),
                w.owner.as_ref().map(ClientKey::as_bytes),
                w.expires as i64,
                w.cltt as i64,
                w.term as i64,
                u32::from(l.addr),
                l.state.code(),
                l.owner.as_ref().map(ClientKey::as_bytes),
                l.expires as i64,
                l.cltt as i64,
                l.term as i64
            ])?;
        }
        Ok(())
    }
}
