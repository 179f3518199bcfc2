//! The rolling update of a pair (`twinlease update pair`), as decisions: each takes what the
//! two boxes look like now and says what to do next; `src/cli/update/pair.rs` does the
//! looking, the waiting and the installing.
//!
//! The order: the standby first (installed, rebooted, back on the new version, marked good —
//! which its boot assessment allows only once it has caught up with the active box), then the
//! active box installs into its other slot while it still serves, hands service to the partner
//! (`step-down`) and reboots. A failure before the active box's own install leaves both boxes
//! on the version they ran; the command stops and says where.

use serde::{Deserialize, Serialize};

/// A box's slots, as its `update status` sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotsView {
    /// "a" or "b".
    pub booted: String,
    pub booted_version: Option<String>,
    /// "good", "trying" or "bad" ("bad" while the last try runs), None without an entry.
    pub booted_state: Option<String>,
    /// The version a rollback left, while its entry says so.
    pub rolled_back_from: Option<String>,
}

/// A box's daemon, from its status socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonView {
    /// "active" or "standby".
    pub role: String,
    pub serving: bool,
    /// Linked to its partner, in sync, nothing unsynced.
    pub partner_caught_up: bool,
}

/// One box as the roll sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxView {
    pub slots: SlotsView,
    /// None when twinlease does not answer on the box.
    pub daemon: Option<DaemonView>,
}

impl BoxView {
    fn runs(&self, version: &str) -> bool {
        self.slots.booted_version.as_deref() == Some(version)
    }

    fn settled(&self) -> bool {
        self.slots.booted_state.as_deref() == Some("good")
    }

    fn active(&self) -> bool {
        self.daemon.as_ref().is_some_and(|d| d.role == "active" && d.serving)
    }

    fn caught_up(&self) -> bool {
        self.daemon.as_ref().is_some_and(|d| d.partner_caught_up)
    }

    fn describe(&self) -> String {
        let d = match &self.daemon {
            Some(d) => format!(
                "{}{}, partner {}",
                d.role,
                if d.serving { "" } else { " (not serving)" },
                if d.partner_caught_up { "caught up" } else { "not caught up" }
            ),
            None => "twinlease not answering".into(),
        };
        format!(
            "slot {} ({}, {}), {d}",
            self.slots.booted,
            self.slots.booted_version.as_deref().unwrap_or("no version"),
            self.slots.booted_state.as_deref().unwrap_or("no entry")
        )
    }
}

/// What `update pair` does, decided before anything is sent or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// This box is active: it drives. `partner` / `here`: whether each still needs the bundle.
    Drive {
        partner: bool,
        here: bool,
    },
    /// This box is the standby: the active partner drives the roll (the standby goes first,
    /// and a box cannot wait for itself across its own reboot).
    HandToPartner,
    Refuse(String),
}

pub fn start(here: &BoxView, partner: &BoxView, version: &str) -> Start {
    let refuse = |why: String| Start::Refuse(why);
    if here.daemon.is_none() {
        return refuse("twinlease is not running on this box".into());
    }
    if partner.daemon.is_none() {
        return refuse(format!("the partner's twinlease does not answer ({})", partner.describe()));
    }
    for (who, b) in [("this box", here), ("the partner", partner)] {
        if !b.settled() {
            return refuse(format!(
                "{who} has not settled on its slot ({}): wait until it is marked good, or see `twinlease update status` there",
                b.describe()
            ));
        }
    }
    if here.runs(version) && partner.runs(version) {
        return refuse(format!("both boxes already run {version}"));
    }
    if partner.active() && !here.active() {
        return Start::HandToPartner;
    }
    if !here.active() {
        return refuse(format!(
            "neither box is active (this box: {}; partner: {})",
            here.describe(),
            partner.describe()
        ));
    }
    if !here.caught_up() {
        return refuse(format!(
            "the partner is not caught up ({}): the roll would leave it serving without every lease",
            partner.describe()
        ));
    }
    Start::Drive { partner: !partner.runs(version), here: !here.runs(version) }
}

/// What a wait step says after one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Not yet: why.
    Keep(String),
    Done,
    /// Give up: why. Nothing further is installed.
    Stop(String),
}

/// After the partner was told to install and reboot: back on `version`, marked good, and
/// caught up with this box. `partner` is None while it does not answer (rebooting).
pub fn partner_updated(partner: Option<&BoxView>, here: &BoxView, version: &str) -> Wait {
    let Some(p) = partner else {
        return Wait::Keep("the partner does not answer (rebooting)".into());
    };
    if p.slots.rolled_back_from.as_deref() == Some(version) && !p.runs(version) {
        return Wait::Stop(format!(
            "the partner rolled back: {version} did not come up healthy there; it runs {} again",
            p.slots.booted_version.as_deref().unwrap_or("its previous version")
        ));
    }
    if !p.runs(version) {
        return Wait::Keep(format!("the partner still runs the old slot ({})", p.describe()));
    }
    if !p.settled() {
        return Wait::Keep(format!("the partner runs {version} on trial ({})", p.describe()));
    }
    if !here.caught_up() {
        return Wait::Keep("the partner is marked good; this box does not see it caught up yet".into());
    }
    Wait::Done
}

/// After this box stepped down: the partner active and serving, this box not.
pub fn handed_over(partner: Option<&BoxView>, here: &BoxView) -> Wait {
    let Some(p) = partner else {
        return Wait::Stop("the partner stopped answering during the hand-over".into());
    };
    if p.active() && !here.active() {
        return Wait::Done;
    }
    Wait::Keep(format!("partner: {}; this box: {}", p.describe(), here.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(version: &str, state: &str, role: Option<&str>, caught_up: bool) -> BoxView {
        BoxView {
            slots: SlotsView {
                booted: "a".into(),
                booted_version: Some(version.into()),
                booted_state: Some(state.into()),
                rolled_back_from: None,
            },
            daemon: role.map(|r| DaemonView { role: r.into(), serving: r == "active", partner_caught_up: caught_up }),
        }
    }

    #[test]
    fn the_active_box_drives_and_the_standby_hands_the_roll_to_it() {
        let active = view("1", "good", Some("active"), true);
        let standby = view("1", "good", Some("standby"), true);
        assert_eq!(start(&active, &standby, "2"), Start::Drive { partner: true, here: true });
        assert_eq!(start(&standby, &active, "2"), Start::HandToPartner);
    }

    #[test]
    fn a_roll_stopped_after_the_partner_goes_on_with_this_box_only() {
        let active = view("1", "good", Some("active"), true);
        let standby = view("2", "good", Some("standby"), true);
        assert_eq!(start(&active, &standby, "2"), Start::Drive { partner: false, here: true });
        let both = view("2", "good", Some("active"), true);
        assert!(matches!(start(&both, &standby, "2"), Start::Refuse(w) if w.contains("already run")));
    }

    #[test]
    fn nothing_starts_on_a_pair_that_is_not_settled_caught_up_and_running() {
        let active = view("1", "good", Some("active"), true);
        let cases = [
            (view("1", "good", Some("active"), false), view("1", "good", Some("standby"), true), "not caught up"),
            (active.clone(), view("1", "trying", Some("standby"), true), "not settled"),
            (active.clone(), view("1", "good", None, true), "does not answer"),
            (view("1", "good", None, true), active.clone(), "not running on this box"),
            (view("1", "good", Some("standby"), true), view("1", "good", Some("standby"), true), "neither box"),
        ];
        for (here, partner, says) in cases {
            match start(&here, &partner, "2") {
                Start::Refuse(why) => assert!(why.contains(says), "{why} / {says}"),
                other => panic!("{other:?} for {says}"),
            }
        }
    }

    #[test]
    fn the_partner_is_updated_only_when_back_on_the_version_marked_good_and_caught_up() {
        let here = view("1", "good", Some("active"), true);
        let lagging = view("1", "good", Some("active"), false);
        assert!(matches!(partner_updated(None, &here, "2"), Wait::Keep(_)));
        assert!(matches!(partner_updated(Some(&view("1", "good", Some("standby"), true)), &here, "2"), Wait::Keep(_)));
        assert!(matches!(
            partner_updated(Some(&view("2", "trying", Some("standby"), true)), &here, "2"),
            Wait::Keep(_)
        ));
        let updated = view("2", "good", Some("standby"), true);
        assert!(matches!(partner_updated(Some(&updated), &lagging, "2"), Wait::Keep(_)));
        assert_eq!(partner_updated(Some(&updated), &here, "2"), Wait::Done);
    }

    #[test]
    fn a_partner_that_rolled_back_stops_the_roll() {
        let here = view("1", "good", Some("active"), true);
        let mut back = view("1", "good", Some("standby"), true);
        back.slots.rolled_back_from = Some("2".into());
        assert!(matches!(partner_updated(Some(&back), &here, "2"), Wait::Stop(w) if w.contains("rolled back")));
    }

    #[test]
    fn the_hand_over_is_done_when_the_partner_serves_and_this_box_does_not() {
        let now_standby = view("1", "good", Some("standby"), true);
        let still_active = view("1", "good", Some("active"), true);
        let partner_active = view("2", "good", Some("active"), true);
        let partner_standby = view("2", "good", Some("standby"), true);
        assert_eq!(handed_over(Some(&partner_active), &now_standby), Wait::Done);
        assert!(matches!(handed_over(Some(&partner_standby), &now_standby), Wait::Keep(_)));
        assert!(matches!(handed_over(Some(&partner_active), &still_active), Wait::Keep(_)));
        assert!(matches!(handed_over(None, &now_standby), Wait::Stop(_)));
    }
}
