//! Folding a group commit's changes row by row before they are written.
//!
//! Under load most leases are offered and acknowledged within one group commit (the REQUEST
//! follows the OFFER within a fraction of the 2 ms window), so the group holds two changes of
//! the same row, the second expecting exactly what the first wrote. Writing the row once, with
//! the first change's expectation and the last change's binding, leaves the same table as
//! writing it twice and halves the statements (README, "What the boxes run").

use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::lease::{Binding, ClientKey, Transition};

/// One write of a row: the compare-and-swap expectation of the first change in a chain, and
/// the binding of the last.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RowWrite<'a> {
    pub expect_version: u64,
    pub expect_owner: Option<&'a ClientKey>,
    pub new: &'a Binding,
}

/// The writes `batch` comes to, in the order of each row's first change. A change is folded into
/// the previous write of its row only when it expects exactly the (version, owner) that write
/// leaves, i.e. when its own check could not fail; any other change stays a write of its own,
/// after the earlier ones, and fails as it would have unfolded (the whole batch is rolled back).
pub(super) fn fold<'a>(batch: &[&'a Transition]) -> Vec<RowWrite<'a>> {
    let mut writes: Vec<RowWrite<'a>> = Vec::with_capacity(batch.len());
    // A lone change (low load) needs no index.
    let mut last: HashMap<Ipv4Addr, usize> = HashMap::with_capacity(if batch.len() > 1 { batch.len() } else { 0 });
    for t in batch {
        if let Some(&i) = last.get(&t.new.addr) {
            let w = &mut writes[i];
            if t.expect_version == w.new.version && t.expect_owner.as_ref() == w.new.owner.as_ref() {
                w.new = &t.new;
                continue;
            }
        }
        if batch.len() > 1 {
            last.insert(t.new.addr, writes.len());
        }
        writes.push(RowWrite { expect_version: t.expect_version, expect_owner: t.expect_owner.as_ref(), new: &t.new });
    }
    writes
}
