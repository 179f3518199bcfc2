//! The two root slots and their systemd-boot entries, as names on the ESP: I/O-free.
//!
//! Every slot that may boot has one Boot Loader Specification entry,
//! `loader/entries/twinlease-<generation>-<slot>[+<left>[-<done>]].conf`. systemd-boot sorts
//! entries by id in *descending* version order and puts those with no tries left last, and the
//! image's loader.conf picks the first entry: so the newest generation boots while it is good
//! or still has tries, and the previous slot boots again once it has none. A `+3` suffix is
//! systemd-boot's boot counting: before each boot it renames `+3` to `+2-1`, `+1-2`, `+0-3`;
//! `twinlease update mark-good` (what systemd-bless-boot does) drops the suffix once the slot
//! is healthy.

use std::fmt;

/// The tries a freshly installed slot gets before the previous one boots again.
pub const TRIES: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    A,
    B,
}

impl Slot {
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    pub fn letter(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
        }
    }

    /// The slot's partition label (GPT name), as the kernel command line names it.
    pub fn partlabel(self) -> String {
        format!("root-{}", self.letter())
    }

    fn from_letter(s: &str) -> Option<Slot> {
        match s {
            "a" => Some(Slot::A),
            "b" => Some(Slot::B),
            _ => None,
        }
    }

    /// The booted slot, from the kernel command line's `root=PARTLABEL=root-<slot>`.
    pub fn from_cmdline(cmdline: &str) -> Option<Slot> {
        cmdline.split_whitespace().find_map(|w| w.strip_prefix("root=PARTLABEL=root-")).and_then(Slot::from_letter)
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.letter())
    }
}

/// Where a slot's entry stands in boot assessment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assessment {
    /// No counter: marked good (or never on trial, as the factory slot).
    Good,
    /// On trial: `left` boots remain, `done` were started.
    Trying { left: u32, done: u32 },
    /// No tries left: systemd-boot no longer picks it.
    Bad { done: u32 },
}

impl Assessment {
    /// One word for `update status --json`: "good", "trying" or "bad".
    pub fn word(self) -> &'static str {
        match self {
            Assessment::Good => "good",
            Assessment::Trying { .. } => "trying",
            Assessment::Bad { .. } => "bad",
        }
    }
}

impl fmt::Display for Assessment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Assessment::Good => f.write_str("good"),
            Assessment::Trying { left, done } => write!(f, "on trial ({done} boots tried, {left} left)"),
            Assessment::Bad { done } => write!(f, "BAD (failed {done} boots)"),
        }
    }
}

/// One boot entry file on the ESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub file: String,
    pub generation: u64,
    pub slot: Slot,
    pub assessment: Assessment,
}

impl Entry {
    /// Parses `twinlease-<generation>-<slot>[+<left>[-<done>]].conf`; other names are not ours.
    pub fn parse(file: &str) -> Option<Entry> {
        let stem = file.strip_prefix("twinlease-")?.strip_suffix(".conf")?;
        let (id, counter) = match stem.split_once('+') {
            Some((id, counter)) => (id, Some(counter)),
            None => (stem, None),
        };
        let (generation, slot) = id.split_once('-')?;
        let generation = generation.parse().ok()?;
        let slot = Slot::from_letter(slot)?;
        let assessment = match counter {
            None => Assessment::Good,
            Some(c) => {
                let (left, done) = match c.split_once('-') {
                    Some((l, d)) => (l.parse().ok()?, d.parse().ok()?),
                    None => (c.parse().ok()?, 0),
                };
                if left == 0 { Assessment::Bad { done } } else { Assessment::Trying { left, done } }
            }
        };
        Some(Entry { file: file.to_string(), generation, slot, assessment })
    }

    /// The file name of this entry marked good.
    pub fn good_name(&self) -> String {
        entry_name(self.generation, self.slot, None)
    }
}

/// `twinlease-<generation>-<slot>.conf`, with `+<tries>` when on trial.
pub fn entry_name(generation: u64, slot: Slot, tries: Option<u32>) -> String {
    match tries {
        Some(t) => format!("twinlease-{generation}-{slot}+{t}.conf"),
        None => format!("twinlease-{generation}-{slot}.conf"),
    }
}

/// The entries found on the ESP (names that are not ours are ignored), newest first.
pub fn entries<'a>(files: impl IntoIterator<Item = &'a str>) -> Vec<Entry> {
    let mut out: Vec<Entry> = files.into_iter().filter_map(Entry::parse).collect();
    out.sort_by(|a, b| b.generation.cmp(&a.generation).then(a.file.cmp(&b.file)));
    out
}

/// The entry systemd-boot starts: the newest that is good or has tries left.
pub fn next_boot(entries: &[Entry]) -> Option<&Entry> {
    entries.iter().find(|e| !matches!(e.assessment, Assessment::Bad { .. }))
}

/// The generation a new install gets.
pub fn next_generation(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| e.generation).max().unwrap_or(0) + 1
}

/// The booted slot's entry (newest first, should there be two).
pub fn booted_entry(entries: &[Entry], booted: Slot) -> Option<&Entry> {
    entries.iter().find(|e| e.slot == booted)
}

/// A rollback happened when the newest entry is another slot's and has no tries left while
/// `booted` runs: that entry, if so.
pub fn rollback(entries: &[Entry], booted: Slot) -> Option<&Entry> {
    entries.first().filter(|e| e.slot != booted && matches!(e.assessment, Assessment::Bad { .. }))
}

/// The booted entry's `options` line for the other slot: the same command line with the
/// other slot's root.
pub fn options_for(options: &str, target: Slot) -> String {
    options
        .split_whitespace()
        .map(|w| {
            if w.starts_with("root=PARTLABEL=root-") {
                format!("root=PARTLABEL={}", target.partlabel())
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An entry's text.
pub fn entry_text(slot: Slot, version: &str, options: &str) -> String {
    format!(
        "title twinlease {version} (slot {l})\nversion {version}\nlinux /slot-{l}/vmlinuz\ninitrd /slot-{l}/initrd.img\noptions {options}\n",
        l = slot.letter()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_follow_systemd_boot_counting() {
        let e = Entry::parse("twinlease-2-b+1-2.conf").unwrap();
        assert_eq!((e.generation, e.slot, e.assessment), (2, Slot::B, Assessment::Trying { left: 1, done: 2 }));
        assert_eq!(e.good_name(), "twinlease-2-b.conf");
        assert_eq!(Entry::parse("twinlease-2-b+3.conf").unwrap().assessment, Assessment::Trying { left: 3, done: 0 });
        assert_eq!(Entry::parse("twinlease-2-b+0-3.conf").unwrap().assessment, Assessment::Bad { done: 3 });
        assert_eq!(Entry::parse("twinlease-1-a.conf").unwrap().assessment, Assessment::Good);
        assert!(Entry::parse("twinlease-a.conf").is_none());
        assert!(Entry::parse("other.conf").is_none());
    }

    #[test]
    fn the_new_slot_boots_while_it_has_tries_then_the_old_one_again() {
        for (new, boots) in [
            ("twinlease-2-b+3.conf", Slot::B),
            ("twinlease-2-b+1-2.conf", Slot::B),
            ("twinlease-2-b.conf", Slot::B),
            ("twinlease-2-b+0-3.conf", Slot::A),
        ] {
            let list = entries(["twinlease-1-a.conf", new]);
            assert_eq!(next_boot(&list).unwrap().slot, boots, "{new}");
            assert_eq!(next_generation(&list), 3);
            assert_eq!(rollback(&list, Slot::A).is_some(), boots == Slot::A, "{new}");
        }
    }

    #[test]
    fn a_later_generation_wins_over_a_good_older_one() {
        let list = entries(["twinlease-2-b.conf", "twinlease-3-a+3.conf"]);
        assert_eq!(next_boot(&list).unwrap().file, "twinlease-3-a+3.conf");
        assert_eq!(booted_entry(&list, Slot::B).unwrap().generation, 2);
    }

    #[test]
    fn the_other_slots_command_line_changes_only_the_root() {
        let cmdline = "root=PARTLABEL=root-a rootfstype=squashfs ro console=ttyS0,115200";
        assert_eq!(Slot::from_cmdline(cmdline), Some(Slot::A));
        assert_eq!(options_for(cmdline, Slot::B), "root=PARTLABEL=root-b rootfstype=squashfs ro console=ttyS0,115200");
        assert_eq!(Slot::from_cmdline("root=/dev/sda1"), None);
    }
}
