//! Sets of IPv4 addresses kept as sorted, disjoint ranges. Pools, exclusions and their difference
//! cost time in the number of ranges written in the configuration, never in the number of
//! addresses they cover, so a /8 pool or 20,000 exclusions are checked as fast as a /24.

use std::net::Ipv4Addr;

use super::AddrRange;

/// A set of addresses: sorted by address, no two ranges overlapping or touching.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrSet {
    ranges: Vec<AddrRange>,
}

impl AddrSet {
    /// The union of `ranges`, given in any order and possibly overlapping: one sort, one pass.
    pub fn from_ranges(ranges: impl IntoIterator<Item = AddrRange>) -> AddrSet {
        let mut sorted: Vec<AddrRange> = ranges.into_iter().collect();
        sorted.sort_unstable_by_key(|r| r.first);
        let mut merged: Vec<AddrRange> = Vec::with_capacity(sorted.len());
        for r in sorted {
            count_step();
            match merged.last_mut() {
                Some(last) if u64::from(u32::from(r.first)) <= u64::from(u32::from(last.last)) + 1 => {
                    last.last = last.last.max(r.last);
                }
                _ => merged.push(r),
            }
        }
        AddrSet { ranges: merged }
    }

    /// The ranges in address order.
    pub fn ranges(&self) -> &[AddrRange] {
        &self.ranges
    }

    /// How many addresses the set holds (up to 2^32, hence u64).
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(AddrRange::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Binary search over the ranges.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        let i = self.ranges.partition_point(|r| r.last < addr);
        self.ranges.get(i).is_some_and(|r| r.first <= addr)
    }

    /// Every address, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.ranges.iter().flat_map(AddrRange::iter)
    }

    /// The addresses of `self` that are not in `cut`. Both lists are sorted, so one walk over
    /// each does it: every step either moves to the next range of `cut` or finishes a range of
    /// `self`.
    pub fn minus(&self, cut: &AddrSet) -> AddrSet {
        let wide = |a: Ipv4Addr| u64::from(u32::from(a));
        let range = |first: u64, last: u64| AddrRange {
            first: Ipv4Addr::from(first as u32),
            last: Ipv4Addr::from(last as u32),
        };
        let mut out = Vec::with_capacity(self.ranges.len());
        let mut next_cut = 0;
        for r in &self.ranges {
            // Addresses of `r` from `start` on are not yet decided.
            let (mut start, end) = (wide(r.first), wide(r.last));
            while let Some(c) = cut.ranges.get(next_cut) {
                count_step();
                let (cut_first, cut_last) = (wide(c.first), wide(c.last));
                if cut_first > end {
                    break; // after `r`: it may still cut the next range
                }
                if cut_first > start {
                    out.push(range(start, cut_first - 1));
                }
                start = start.max(cut_last + 1);
                if cut_last > end {
                    break; // runs on past `r`: it may cut the next range too
                }
                next_cut += 1;
            }
            if start <= end {
                out.push(range(start, end));
            }
        }
        AddrSet { ranges: out }
    }
}

/// The first pair of `ranges` that overlap, as indices (lower index first), or `None`. Sorting
/// by start is enough to find one: if any two ranges overlap, the earlier of them also overlaps
/// the range that follows it in that order.
pub(super) fn first_overlap(ranges: &[AddrRange]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_unstable_by_key(|&i| (ranges[i].first, ranges[i].last));
    order.windows(2).find(|w| ranges[w[0]].overlaps(&ranges[w[1]])).map(|w| (w[0].min(w[1]), w[0].max(w[1])))
}

#[cfg(test)]
thread_local! {
    /// Range steps taken by this thread, for the tests that pin down the cost of a check.
    static STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Range steps this thread has taken so far.
#[cfg(test)]
pub(crate) fn steps_taken() -> u64 {
    STEPS.with(std::cell::Cell::get)
}

fn count_step() {
    #[cfg(test)]
    STEPS.with(|s| s.set(s.get() + 1));
}
