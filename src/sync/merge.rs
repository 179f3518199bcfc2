//! The conflict rule (seed 003's "CONFLICT – TODO"), and how a binding from the partner is
//! merged into this box's table.
//!
//! Every binding has a rank: (term, cltt), then the address's causal counter `seq` (so a change
//! outranks the one it replaced even within the same second), then a fixed tie-break on
//! content. Higher rank wins.
//! The rule is a pure function of the two contents, so both boxes pick the same winner whatever
//! order the updates arrive in, and a stale copy sent again can never beat what replaced it.
//!
//! * The partner's binding for an address whose current binding the partner already holds
//!   (synced) is the partner's next change: it is applied, unless its term is lower than the
//!   one here (fencing: a deposed active's late write).
//! * If this box changed the address since the partner last confirmed it, the two changes are
//!   concurrent: the higher rank wins. If both are live bindings of different clients, that is
//!   an address conflict: the loser is recorded, its client is NAKed when it next renews (the
//!   address is someone else's now) and rediscovers.
//! * A client may hold one address per subnet: if the winner's client holds another one, the
//!   higher rank keeps its address and the other returns to the queue.

use std::cmp::Ordering;
use std::net::Ipv4Addr;

use crate::allocator::Allocator;
use crate::lease::{Binding, LeaseState, Transition, UnixSecs};
use crate::store::{ConflictKind, ConflictRecord};

use super::protocol::{EntryOutcome, EntryResult, UpdateKind};

/// Ties on (term, cltt) prefer a free binding: the reaper and a withdrawn offer change an
/// address without a new client transaction, and must beat the binding they end.
fn state_rank(s: LeaseState) -> u8 {
    match s {
        LeaseState::Free => 4,
        LeaseState::Declined => 3,
        LeaseState::Leased => 2,
        LeaseState::Offered => 1,
        LeaseState::Probing => 0,
    }
}

/// The conflict rule's total order on binding contents (the local version is not content).
pub fn rank(a: &Binding, b: &Binding) -> Ordering {
    (a.term, a.cltt, a.seq, state_rank(a.state), a.expires)
        .cmp(&(b.term, b.cltt, b.seq, state_rank(b.state), b.expires))
        .then_with(|| a.owner.cmp(&b.owner))
        .then_with(|| a.hw.cmp(&b.hw))
        .then_with(|| a.hostname.cmp(&b.hostname))
}

/// Same replicated content (everything but the version).
pub fn same_content(a: &Binding, b: &Binding) -> bool {
    a.addr == b.addr
        && a.state == b.state
        && a.owner == b.owner
        && a.expires == b.expires
        && a.cltt == b.cltt
        && a.term == b.term
        && a.seq == b.seq
        && a.hw == b.hw
        && a.hostname == b.hostname
}

/// Both live (busy, unexpired) and held by different clients: a real conflict to record.
fn contradicts(a: &Binding, b: &Binding, now: UnixSecs) -> bool {
    a.is_live(now) && b.is_live(now) && a.owner.is_some() && b.owner.is_some() && a.owner != b.owner
}

/// The binding the losing address of a client-holds-two conflict gets: back in the queue,
/// remembered for the client, stamped with the winner's (term, cltt) so that it outranks the
/// binding it ends. Both boxes compute the same content from the same pair.
fn freed(winner: &Binding, loser: &Binding) -> Binding {
    Binding {
        addr: loser.addr,
        state: LeaseState::Free,
        owner: loser.owner.clone(),
        expires: winner.cltt,
        cltt: winner.cltt,
        term: winner.term,
        seq: winner.seq.max(loser.seq) + 1,
        version: loser.version,
        hw: loser.hw.clone(),
        hostname: None,
    }
}

/// What merging one binding from the partner did.
#[derive(Debug, Default)]
pub struct Merged {
    /// Local changes for the store (replica installs and freed addresses).
    pub transitions: Vec<Transition>,
    /// Sync marks (address, local version) for the store.
    pub marks: Vec<(Ipv4Addr, u64)>,
    pub conflicts: Vec<ConflictRecord>,
    /// Whether the partner's content was stale by term (fenced).
    pub fenced: bool,
    /// The partner's bindings refused as impossible, with why (for the log).
    pub refused: Vec<(Ipv4Addr, &'static str)>,
}

/// How far ahead of this box's clock a partner's client transaction may be stamped. Beyond it
/// the partner's clock (or data) is wrong, and such a binding would win every conflict and keep
/// its address for as long as that clock is ahead.
pub const MAX_CLTT_AHEAD_SECS: u64 = 86_400;

/// Why the partner's binding cannot have come from a working box, if it cannot: no
/// configuration grants a lease longer than `u32::MAX` seconds (lease times are 32-bit in
/// DHCP), a busy binding cannot end before its transaction, and a transaction is not stamped
/// far in this box's future. Such a binding (an expiry in year 9999, say) is refused rather
/// than left to hold an address for ever.
pub fn implausible(b: &Binding, now: UnixSecs) -> Option<&'static str> {
    if b.cltt > now.saturating_add(MAX_CLTT_AHEAD_SECS) {
        Some("its client transaction time is more than a day ahead of this box's clock")
    } else if b.expires.saturating_sub(b.cltt) > u64::from(u32::MAX) {
        Some("its lease is longer than any configuration grants (expiry too far ahead)")
    } else if b.state.is_busy() && b.expires < b.cltt {
        Some("it ends before its client transaction")
    } else {
        None
    }
}

/// Merges `inc` (the partner's binding) into `alloc`. Returns what to tell the partner.
/// An impossible binding is answered `Unknown`, like an address this box does not manage: the
/// partner stops sending it, and the table here is left as it was.
pub fn merge(alloc: &mut Allocator, inc: &Binding, kind: UpdateKind, now: UnixSecs, out: &mut Merged) -> EntryOutcome {
    let Some(local) = alloc.binding(inc.addr).cloned() else {
        out.refused.push((inc.addr, "this box manages no such address (the two boxes' pools differ)"));
        return EntryOutcome::Unknown;
    };
    if let Some(why) = implausible(inc, now) {
        out.refused.push((inc.addr, why));
        return EntryOutcome::Unknown;
    }
    if same_content(&local, inc) {
        if alloc.mark_synced(local.addr, local.version) {
            out.marks.push((local.addr, local.version));
        }
        return EntryOutcome::Applied;
    }
    let concurrent = kind == UpdateKind::Repair || !alloc.is_synced(inc.addr);
    let inc_wins = if inc.term < local.term {
        out.fenced = true;
        false
    } else if concurrent {
        rank(inc, &local) == Ordering::Greater
    } else {
        true // the partner's next change of a binding it holds
    };
    if !inc_wins {
        if contradicts(&local, inc, now) {
            out.conflicts.push(ConflictRecord {
                at: now,
                kind: ConflictKind::Address,
                winner: local.clone(),
                loser: inc.clone(),
            });
        }
        return EntryOutcome::Superseded(local);
    }
    if contradicts(inc, &local, now) {
        out.conflicts.push(ConflictRecord {
            at: now,
            kind: ConflictKind::Address,
            winner: inc.clone(),
            loser: local.clone(),
        });
    }
    // One client, two addresses: the higher rank keeps its address.
    if inc.state.is_busy()
        && let Some(owner) = &inc.owner
        && let Some(other_addr) = alloc.other_busy_of(inc.addr, owner)
    {
        let other = alloc.binding(other_addr).cloned().expect("indexed address exists");
        if rank(inc, &other) == Ordering::Greater {
            push(alloc, out, &freed(inc, &other), false);
            out.conflicts.push(ConflictRecord {
                at: now,
                kind: ConflictKind::Client,
                winner: inc.clone(),
                loser: other,
            });
        } else {
            // The incoming binding loses to the client's address here: this address goes back
            // to the queue instead. The partner gets the freed content back and adopts it.
            let f = freed(&other, inc);
            out.conflicts.push(ConflictRecord {
                at: now,
                kind: ConflictKind::Client,
                winner: other,
                loser: inc.clone(),
            });
            let mut freed_here = f.clone();
            freed_here.version = local.version;
            if same_content(&local, &freed_here) {
                return EntryOutcome::Superseded(local);
            }
            push(alloc, out, &f, false);
            return EntryOutcome::Superseded(alloc.binding(inc.addr).cloned().expect("exists"));
        }
    }
    push(alloc, out, inc, true);
    EntryOutcome::Applied
}

fn push(alloc: &mut Allocator, out: &mut Merged, content: &Binding, synced: bool) {
    if let Some(t) = alloc.install_replica(content, synced) {
        if synced {
            out.marks.push((t.new.addr, t.new.version));
        }
        out.transitions.push(t);
    }
}

/// Merges a batch from the partner; returns the per-entry results to acknowledge once `out`
/// is durable.
pub fn apply_batch(
    alloc: &mut Allocator,
    entries: &[Binding],
    kind: UpdateKind,
    now: UnixSecs,
    out: &mut Merged,
) -> Vec<EntryResult> {
    entries
        .iter()
        .map(|e| EntryResult { addr: e.addr, version: e.version, outcome: merge(alloc, e, kind, now, out) })
        .collect()
}

/// Takes the partner's results for one of our batches: marks what it applied as synced (only
/// if still at the version sent: a change made meanwhile stays unsynced), merges what it
/// answered with. Returns the addresses whose local binding the partner still lacks (ours won
/// after all, or an address was freed), to send again.
pub fn settle(alloc: &mut Allocator, results: Vec<EntryResult>, now: UnixSecs, out: &mut Merged) -> Vec<Ipv4Addr> {
    let mut resend = Vec::new();
    for r in results {
        match r.outcome {
            EntryOutcome::Applied | EntryOutcome::Unknown => {
                if alloc.mark_synced(r.addr, r.version) {
                    out.marks.push((r.addr, r.version));
                }
            }
            EntryOutcome::Superseded(b) => {
                if let EntryOutcome::Superseded(_) = merge(alloc, &b, UpdateKind::Repair, now, out) {
                    resend.push(r.addr);
                }
            }
        }
    }
    resend.extend(out.transitions.iter().map(|t| t.new.addr));
    resend.retain(|a| !alloc.is_synced(*a));
    resend.sort_unstable();
    resend.dedup();
    resend
}
