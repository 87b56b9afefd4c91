//! Expectations of the agent's own creates (client-go's ControllerExpectations): a PV the agent
//! has just created may not be in its store yet, since the watch lags the API (seconds in a
//! fleet of busy agents). Until the store shows it, the next passes would see the disk's used
//! mark name a PV the store does not have, read it back and refuse the disk as already
//! published, or create it again. An expectation records what was created (PV name, UID, host
//! path and disk identity, when); while it is pending, the planner neither refuses nor creates
//! that volume. It is met when the store shows the PV, and expires after a bound, so the
//! records never only grow and a PV deleted before the watch showed it is not waited for long.
//!
//! Deletes lag the same way: a PV the agent withdrew (its delete accepted) still shows in the
//! store as it was, and the next passes would withdraw it again and tell it again. Until the
//! store shows it being deleted, or gone, it is taken as being deleted.
//!
//! Data safety: an expectation excuses only the volume the agent created, at the same path
//! with the same disk identity; a different disk found there is judged as usual. A delete
//! expectation only says what the API already answered: the PV with that UID is being deleted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a create is expected to show in the store before the agent judges the disk by
/// the store again (client-go's ExpectationsTimeout).
pub(crate) const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A PV this agent created and its store does not show yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    /// The PV's name.
    pub name: String,
    /// The UID the API gave it.
    pub uid: String,
    /// Its volume's host path.
    pub host_path: String,
    /// The disk identity recorded on it.
    pub identity: String,
    /// When it was created.
    pub at: Instant,
}

impl Expected {
    /// Whether the found volume (PV name, host path, identity) is this created one.
    pub(crate) fn is(&self, name: &str, host_path: &str, identity: &str) -> bool {
        self.name == name && self.host_path == host_path && self.identity == identity
    }
}

/// The pending expectations: creates by PV name, deletes by UID (with when).
#[derive(Debug, Clone, Default)]
pub(crate) struct Expectations {
    created: BTreeMap<String, Expected>,
    deleted: BTreeMap<String, Instant>,
}

/// One PV as the store shows it: name, UID, and whether it is being deleted.
pub(crate) type Shown<'a> = (&'a str, &'a str, bool);

impl Expectations {
    /// Notes a PV the agent created (replacing an earlier expectation of the same name).
    pub(crate) fn created(&mut self, expected: Expected) {
        self.created.insert(expected.name.clone(), expected);
    }

    /// Notes a PV (by UID) whose delete the API accepted.
    pub(crate) fn deleted(&mut self, uid: &str, now: Instant) {
        self.deleted.insert(uid.to_string(), now);
    }

    /// Whether the PV with this UID was deleted by this agent and the store does not show it
    /// being deleted yet.
    pub(crate) fn is_deleted(&self, uid: &str) -> bool {
        self.deleted.contains_key(uid)
    }

    /// Drops the expectations the store meets and those older than `EXPECTATION_TIMEOUT`. A
    /// create is met when the store shows its name with its UID (a PV of the same name with
    /// another UID, an older one still being deleted, does not meet it); a delete when the
    /// store shows its UID being deleted, or no longer shows it.
    pub(crate) fn observe<'a>(&mut self, store: impl IntoIterator<Item = Shown<'a>>, now: Instant) {
        let mut still_there = std::collections::BTreeSet::new();
        for (name, uid, deleting) in store {
            if self.created.get(name).is_some_and(|e| e.uid == uid) {
                self.created.remove(name);
            }
            if !deleting && self.deleted.contains_key(uid) {
                still_there.insert(uid.to_string());
            }
        }
        let live = |at: &Instant| now.saturating_duration_since(*at) < EXPECTATION_TIMEOUT;
        self.created.retain(|_, e| live(&e.at));
        self.deleted.retain(|uid, at| still_there.contains(uid) && live(at));
    }

    /// The pending expectations, sorted by name.
    pub(crate) fn pending(&self) -> Vec<Expected> {
        self.created.values().cloned().collect()
    }

    /// The pending expectation of the found volume, if it is one the agent created.
    #[cfg(test)]
    pub(crate) fn pending_for(&self, name: &str, host_path: &str, identity: &str) -> Option<&Expected> {
        self.created.get(name).filter(|e| e.is(name, host_path, identity))
    }

    /// When the oldest expectation expires, so the loop can look again then.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        let created = self.created.values().map(|e| e.at);
        created.chain(self.deleted.values().copied()).min().map(|at| at + EXPECTATION_TIMEOUT)
    }

    /// Expectations pending (creates and deletes).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.created.len() + self.deleted.len()
    }

    /// Whether none is pending (the inventory waits for them: core::cluster::inventory::WriteWait).
    pub(crate) fn is_empty(&self) -> bool {
        self.created.is_empty() && self.deleted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(name: &str, uid: &str, at: Instant) -> Expected {
        Expected {
            name: name.into(),
            uid: uid.into(),
            host_path: format!("/mnt/disks/{name}"),
            identity: format!("id-{name}"),
            at,
        }
    }

    #[test]
    fn an_expectation_excuses_only_the_same_name_path_and_identity() {
        let now = Instant::now();
        let mut x = Expectations::default();
        x.created(expected("a", "u1", now));
        assert!(x.pending_for("a", "/mnt/disks/a", "id-a").is_some());
        // Each part that differs is another volume: judged as usual.
        for (name, path, id) in [
            ("b", "/mnt/disks/a", "id-a"),
            ("a", "/mnt/disks/b", "id-a"),
            ("a", "/mnt/disks/a", "id-b"),
            ("a", "/mnt/disks/a", ""),
            ("a", "/mnt/disks/a", "id-a "),
        ] {
            assert!(x.pending_for(name, path, id).is_none(), "{name} {path} {id:?} excused");
        }
    }

    #[test]
    fn met_when_the_store_shows_the_same_uid_and_expired_after_the_bound() {
        let t0 = Instant::now();
        let mut x = Expectations::default();
        x.created(expected("a", "u1", t0));
        x.created(expected("b", "u2", t0 + Duration::from_secs(60)));
        x.created(expected("c", "u3", t0));
        // The store: a with its UID (met), b not yet, c under an older UID (not met).
        x.observe([("a", "u1", false), ("c", "old", false)], t0 + Duration::from_secs(1));
        let names: Vec<String> = x.pending().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(x.next_expiry(), Some(t0 + EXPECTATION_TIMEOUT));
        x.observe([], t0 + EXPECTATION_TIMEOUT - Duration::from_millis(1));
        assert_eq!(x.len(), 2, "not expired before the bound");
        x.observe([], t0 + EXPECTATION_TIMEOUT);
        assert_eq!(x.pending().into_iter().map(|e| e.name).collect::<Vec<_>>(), ["b"], "c expired");
        x.observe([], t0 + Duration::from_secs(60) + EXPECTATION_TIMEOUT);
        assert!(x.is_empty(), "nothing only grows");
        assert_eq!(x.next_expiry(), None);
    }

    #[test]
    fn a_new_create_of_a_name_replaces_its_expectation() {
        let t0 = Instant::now();
        let mut x = Expectations::default();
        x.created(expected("a", "u1", t0));
        x.created(expected("a", "u2", t0 + Duration::from_secs(10)));
        assert_eq!(x.len(), 1);
        x.observe([("a", "u1", true)], t0 + Duration::from_secs(11));
        assert_eq!(x.len(), 1, "the store shows the old PV, not the new one");
        x.observe([("a", "u2", false)], t0 + Duration::from_secs(12));
        assert!(x.is_empty());
    }

    #[test]
    fn a_delete_is_expected_until_the_store_shows_it_deleting_or_gone() {
        let t0 = Instant::now();
        let mut x = Expectations::default();
        for uid in ["u1", "u2", "u3", "u4"] {
            x.deleted(uid, t0);
        }
        assert!(x.is_deleted("u1") && !x.is_deleted("u9"));
        // u1 still shown as it was; u2 shown being deleted; u3 gone; u4's name shows another UID.
        x.observe([("a", "u1", false), ("b", "u2", true), ("d", "u5", false)], t0 + Duration::from_secs(1));
        assert!(x.is_deleted("u1"), "the store has not caught up");
        for uid in ["u2", "u3", "u4"] {
            assert!(!x.is_deleted(uid), "{uid}: the store shows it deleting or gone");
        }
        assert_eq!(x.next_expiry(), Some(t0 + EXPECTATION_TIMEOUT));
        x.observe([("a", "u1", false)], t0 + EXPECTATION_TIMEOUT);
        assert!(x.is_empty(), "expired: the store is trusted again");
    }
}
