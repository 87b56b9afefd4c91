//! The agent's one inotify instance, shared by every watcher (host::mounts::inotify): who holds each
//! watch descriptor with which events, and what a shortage of instances or watches tells the
//! operator. inotify gives one watch descriptor per inode per instance: adding a watch on an
//! inode already watched returns the same descriptor (its mask replaced, unless added to with
//! IN_MASK_ADD), and removing it removes it for everyone. So each descriptor is counted here
//! per owner and removed only when its last hold goes; events go to every owner that asked for
//! them. Pure: the host type makes the calls this decides.

use std::collections::{BTreeMap, BTreeSet};

/// A watch descriptor, as the kernel numbers it (never reused before it wraps around: the
/// kernel allocates them cyclically).
pub(crate) type Wd = i32;

/// One watcher sharing the instance (the directory watcher, the block-device watch).
pub(crate) type Owner = usize;

/// The kernel's event bits (IN_ALL_EVENTS); the other bits of an event (IN_IGNORED,
/// IN_Q_OVERFLOW, IN_UNMOUNT, IN_ISDIR) are sent whatever was asked for.
pub(crate) const ALL_EVENTS: u32 = 0x0000_0fff;

/// What came of an add (inotify_add_watch) once it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// The owner holds the descriptor (one more hold when it held it already).
    Held,
    /// The kernel dropped the descriptor while the add was running (its directory removed, its
    /// filesystem unmounted): nothing is held, the owner adds it again later.
    Gone,
}

/// The holds on each descriptor of the one instance, and the removals that wait for the adds
/// running now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct WatchTable {
    /// Each descriptor's owners, with the event mask of each of their holds.
    holds: BTreeMap<Wd, BTreeMap<Owner, Vec<u32>>>,
    /// Adds started whose result is not recorded yet. Such an add may return a descriptor
    /// whose last hold goes meanwhile: while any runs, a descriptor no one holds is removed
    /// only once they all returned, so an add never records a descriptor the kernel no longer
    /// has. (An add stuck on a directory that does not answer thus keeps the watches let go
    /// meanwhile until it returns: their events go to no one.)
    adds_running: usize,
    /// Descriptors no one holds, removed once no add runs.
    to_remove: BTreeSet<Wd>,
    /// Descriptors the kernel dropped while adds were running: such an add that returns one
    /// holds nothing.
    dropped_meanwhile: BTreeSet<Wd>,
}

impl WatchTable {
    /// An add is about to run (the kernel call comes next, outside any lock).
    pub(crate) fn add_started(&mut self) {
        self.adds_running += 1;
    }

    /// An add started with [`Self::add_started`] returned: `Some((wd, owner, mask))` when the
    /// kernel gave `wd` for the owner's `mask`, `None` when it failed. Returns what came of it
    /// and the descriptors to remove now (those that waited for the running adds).
    pub(crate) fn add_finished(&mut self, added: Option<(Wd, Owner, u32)>) -> (Option<Added>, Vec<Wd>) {
        self.adds_running = self.adds_running.saturating_sub(1);
        let outcome = added.map(|(wd, owner, mask)| {
            if self.dropped_meanwhile.contains(&wd) {
                return Added::Gone;
            }
            self.to_remove.remove(&wd);
            self.holds.entry(wd).or_default().entry(owner).or_default().push(mask);
            Added::Held
        });
        let remove = if self.adds_running == 0 {
            self.dropped_meanwhile.clear();
            std::mem::take(&mut self.to_remove).into_iter().filter(|wd| !self.holds.contains_key(wd)).collect()
        } else {
            Vec::new()
        };
        (outcome, remove)
    }

    /// `owner` lets go of one of its holds on `wd` (the one with `mask` if it has one). Returns
    /// the descriptors to remove now: `wd` when that was its last hold and no add runs.
    pub(crate) fn release(&mut self, owner: Owner, wd: Wd, mask: u32) -> Vec<Wd> {
        let Some(owners) = self.holds.get_mut(&wd) else { return Vec::new() };
        let Some(masks) = owners.get_mut(&owner) else { return Vec::new() };
        let at = masks.iter().position(|m| *m == mask).unwrap_or(0);
        masks.remove(at);
        if masks.is_empty() {
            owners.remove(&owner);
        }
        if !owners.is_empty() {
            return Vec::new();
        }
        self.holds.remove(&wd);
        if self.adds_running > 0 {
            self.to_remove.insert(wd);
            Vec::new()
        } else {
            vec![wd]
        }
    }

    /// The kernel dropped `wd` (IN_IGNORED: removed by us, its inode gone, its filesystem
    /// unmounted): no one holds it any more. Returns the owners that did.
    pub(crate) fn dropped(&mut self, wd: Wd) -> Vec<Owner> {
        self.to_remove.remove(&wd);
        if self.adds_running > 0 {
            self.dropped_meanwhile.insert(wd);
        }
        self.holds.remove(&wd).map(|owners| owners.into_keys().collect()).unwrap_or_default()
    }

    /// The owners an event on `wd` with the bits `mask` goes to: those whose holds asked for
    /// one of its event bits, or all of them for an event without any (IN_UNMOUNT).
    pub(crate) fn owners_of(&self, wd: Wd, mask: u32) -> Vec<Owner> {
        let bits = mask & ALL_EVENTS;
        let Some(owners) = self.holds.get(&wd) else { return Vec::new() };
        owners
            .iter()
            .filter(|(_, masks)| bits == 0 || masks.iter().any(|m| m & bits != 0))
            .map(|(owner, _)| *owner)
            .collect()
    }

    /// The union of the events the holds on `wd` ask for (what the kernel watches for at
    /// least: adds use IN_MASK_ADD, so its mask only grows while the descriptor lives).
    #[cfg(test)]
    pub(crate) fn mask(&self, wd: Wd) -> u32 {
        self.holds.get(&wd).map_or(0, |owners| owners.values().flatten().fold(0, |a, m| a | m))
    }

    /// How many holds `owner` has on `wd`.
    #[cfg(test)]
    fn holds_of(&self, owner: Owner, wd: Wd) -> usize {
        self.holds.get(&wd).and_then(|o| o.get(&owner)).map_or(0, Vec::len)
    }
}

/// What the agent lacks of inotify: an instance (inotify_init1 failed with EMFILE:
/// fs.inotify.max_user_instances reached) or watches (inotify_add_watch failed with ENOSPC:
/// fs.inotify.max_user_watches reached).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortage {
    pub instances: bool,
    pub watches: bool,
}

impl Shortage {
    /// Whether anything is short.
    pub(crate) fn any(self) -> bool {
        self.instances || self.watches
    }
}

/// What the agent tells on its Node about a shortage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShortageNotice {
    /// A Warning: `kinds` became short (that were not told before); the note says which sysctl
    /// to raise and what is degraded.
    Exhausted { note: String },
    /// A Normal event: nothing is short any more (after a shortage was told).
    Restored { note: String },
}

/// The reason of the Warning event, and of the Normal one when it heals.
pub(crate) const EXHAUSTED_REASON: &str = "WatchesExhausted";
pub(crate) const RESTORED_REASON: &str = "WatchesRestored";

/// What to tell now, given the shortage last `told` and the one `now`: a Warning when a kind
/// became short (once per onset; a kind still short is not told again), a Normal event when
/// everything healed after a told shortage, nothing otherwise. The caller then remembers `now`
/// as told.
pub(crate) fn shortage_notice(told: Shortage, now: Shortage) -> Option<ShortageNotice> {
    let new_instances = now.instances && !told.instances;
    let new_watches = now.watches && !told.watches;
    if new_instances || new_watches {
        return Some(ShortageNotice::Exhausted { note: exhausted_note(now) });
    }
    if told.any() && !now.any() {
        return Some(ShortageNotice::Restored {
            note: "inotify is available again: changes are seen at once again".to_string(),
        });
    }
    None
}

/// The Warning's note: what ran out, which sysctl raises it, what is degraded meanwhile.
fn exhausted_note(now: Shortage) -> String {
    let mut lacks = Vec::new();
    if now.instances {
        lacks.push("inotify instances are exhausted (raise fs.inotify.max_user_instances)");
    }
    if now.watches {
        lacks.push("inotify watches are exhausted (raise fs.inotify.max_user_watches)");
    }
    format!(
        "{}: new volumes, config changes and devices are found only by the periodic resync until it heals; \
         the agent retries on its own, no restart needed",
        lacks.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = 0;
    const B: Owner = 1;
    const CREATE: u32 = 0x100;
    const DELETE: u32 = 0x200;
    const WRITE: u32 = 0x8;
    const IGNORED: u32 = 0x8000;
    const UNMOUNT: u32 = 0x2000;

    /// An add that starts and returns at once.
    fn add(t: &mut WatchTable, wd: Wd, owner: Owner, mask: u32) -> Vec<Wd> {
        t.add_started();
        let (outcome, remove) = t.add_finished(Some((wd, owner, mask)));
        assert_eq!(outcome, Some(Added::Held));
        remove
    }

    #[test]
    fn a_descriptor_is_removed_only_when_its_last_owner_lets_go() {
        let mut t = WatchTable::default();
        assert!(add(&mut t, 1, A, CREATE).is_empty());
        assert!(add(&mut t, 1, B, DELETE).is_empty());
        assert_eq!(t.mask(1), CREATE | DELETE, "the union of both owners' masks");
        assert!(t.release(A, 1, CREATE).is_empty(), "B still holds it");
        assert_eq!(t.mask(1), DELETE);
        assert_eq!(t.release(B, 1, DELETE), vec![1], "the last hold went");
        assert_eq!(t, WatchTable::default());
        // Releasing what is not held changes nothing.
        assert!(t.release(A, 1, CREATE).is_empty());
        assert!(t.release(A, 7, CREATE).is_empty());
    }

    #[test]
    fn every_sequence_of_adds_and_releases_by_three_owners_agrees_with_counting_holds() {
        // Every sequence of up to six steps, each an add or a release of one descriptor by one
        // of three owners (each with its own mask), against a plain count of holds: the
        // descriptor is removed exactly when its last hold goes, its mask is the union of its
        // holders' masks, and events go to its holders.
        const OWNERS: [(Owner, u32); 3] = [(A, CREATE), (B, WRITE), (2, CREATE | DELETE)];
        let steps: Vec<(usize, bool)> = (0..3).flat_map(|o| [(o, true), (o, false)]).collect();
        let mut sequences = 0;
        for len in 0..=6u32 {
            for n in 0..steps.len().pow(len) {
                let mut t = WatchTable::default();
                let mut counts = [0usize; 3];
                let mut rest = n;
                for _ in 0..len {
                    let (o, adding) = steps[rest % steps.len()];
                    rest /= steps.len();
                    let (owner, mask) = OWNERS[o];
                    let removed = if adding {
                        counts[o] += 1;
                        add(&mut t, 5, owner, mask)
                    } else {
                        let held = counts[o] > 0;
                        counts[o] = counts[o].saturating_sub(1);
                        let out = t.release(owner, 5, mask);
                        let last = held && counts.iter().all(|c| *c == 0);
                        assert_eq!(out, if last { vec![5] } else { vec![] }, "sequence {n} of {len}");
                        out
                    };
                    if adding {
                        assert!(removed.is_empty());
                    }
                    let union = (0..3).filter(|i| counts[*i] > 0).fold(0, |a, i| a | OWNERS[i].1);
                    assert_eq!(t.mask(5), union, "sequence {n} of {len}");
                    let holders: Vec<Owner> = (0..3).filter(|i| counts[*i] > 0).map(|i| OWNERS[i].0).collect();
                    assert_eq!(t.owners_of(5, UNMOUNT), holders);
                    let creators: Vec<Owner> = holders.iter().copied().filter(|h| OWNERS[*h].1 & CREATE != 0).collect();
                    assert_eq!(t.owners_of(5, CREATE), creators);
                    for (i, c) in counts.iter().enumerate() {
                        assert_eq!(t.holds_of(OWNERS[i].0, 5), *c);
                    }
                }
                if counts.iter().all(|c| *c == 0) {
                    assert_eq!(t, WatchTable::default(), "nothing left after sequence {n} of {len}");
                }
                sequences += 1;
            }
        }
        assert_eq!(sequences, (0..=6).map(|l| 6usize.pow(l)).sum::<usize>());
    }

    #[test]
    fn one_owner_holding_a_descriptor_twice_keeps_it_until_both_holds_go() {
        // Two paths of one inode (a directory and a symlink to it, a device's node twice).
        let mut t = WatchTable::default();
        add(&mut t, 3, A, CREATE);
        add(&mut t, 3, A, WRITE);
        assert_eq!(t.holds_of(A, 3), 2);
        assert_eq!(t.mask(3), CREATE | WRITE);
        assert!(t.release(A, 3, WRITE).is_empty());
        assert_eq!(t.mask(3), CREATE, "the hold with the released mask went");
        assert_eq!(t.release(A, 3, CREATE), vec![3]);
        // A release with a mask no hold has still lets go of one hold.
        add(&mut t, 4, A, CREATE);
        assert_eq!(t.release(A, 4, DELETE), vec![4]);
    }

    #[test]
    fn events_go_to_every_owner_that_asked_for_them() {
        let mut t = WatchTable::default();
        add(&mut t, 1, A, CREATE | DELETE);
        add(&mut t, 1, B, WRITE);
        assert_eq!(t.owners_of(1, CREATE), vec![A]);
        assert_eq!(t.owners_of(1, WRITE), vec![B]);
        assert_eq!(t.owners_of(1, DELETE | WRITE), vec![A, B]);
        // IN_ISDIR with a create: still only the owner that asked for creates.
        assert_eq!(t.owners_of(1, CREATE | 0x4000_0000), vec![A]);
        // An event with no event bit (IN_UNMOUNT) goes to all owners.
        assert_eq!(t.owners_of(1, UNMOUNT), vec![A, B]);
        // No one holds descriptor 2 (a late event after its removal).
        assert!(t.owners_of(2, CREATE).is_empty());
        // After A let go, its events are no longer sent to it.
        t.release(A, 1, CREATE | DELETE);
        assert!(t.owners_of(1, CREATE).is_empty());
        assert_eq!(t.owners_of(1, IGNORED), vec![B]);
    }

    #[test]
    fn a_descriptor_the_kernel_dropped_is_held_by_no_one_and_not_removed_again() {
        let mut t = WatchTable::default();
        add(&mut t, 1, A, CREATE);
        add(&mut t, 1, B, CREATE);
        add(&mut t, 2, A, CREATE);
        assert_eq!(t.dropped(1), vec![A, B]);
        assert!(t.release(A, 1, CREATE).is_empty(), "no remove of a descriptor the kernel has not");
        assert!(t.owners_of(1, CREATE).is_empty());
        assert_eq!(t.dropped(1), Vec::<Owner>::new());
        assert_eq!(t.owners_of(2, CREATE), vec![A], "others are untouched");
    }

    #[test]
    fn a_descriptor_released_while_an_add_runs_is_removed_once_the_add_returned() {
        // A's add is running (it may return the very descriptor whose last hold goes now).
        let mut t = WatchTable::default();
        add(&mut t, 1, B, CREATE);
        t.add_started();
        assert!(t.release(B, 1, CREATE).is_empty(), "deferred while an add runs");
        // The add returned that descriptor: it is held, and not removed.
        assert_eq!(t.add_finished(Some((1, A, CREATE))), (Some(Added::Held), vec![]));
        assert_eq!(t.owners_of(1, CREATE), vec![A]);
        // The same, but the add returned another descriptor: the deferred removal happens.
        add(&mut t, 2, B, CREATE);
        t.add_started();
        assert!(t.release(B, 2, CREATE).is_empty());
        assert_eq!(t.add_finished(Some((3, A, CREATE))), (Some(Added::Held), vec![2]));
        // Or failed: likewise. With two adds running, only the last to return removes.
        add(&mut t, 4, B, CREATE);
        t.add_started();
        t.add_started();
        assert!(t.release(B, 4, CREATE).is_empty());
        assert_eq!(t.add_finished(None), (None, vec![]));
        assert_eq!(t.add_finished(None), (None, vec![4]));
        assert_eq!(t.mask(1) | t.mask(3), CREATE);
        assert!(t.to_remove.is_empty() && t.adds_running == 0);
    }

    #[test]
    fn an_add_that_returns_a_descriptor_the_kernel_dropped_meanwhile_holds_nothing() {
        let mut t = WatchTable::default();
        t.add_started();
        t.add_started();
        assert!(t.dropped(9).is_empty());
        assert_eq!(t.add_finished(Some((9, A, CREATE))), (Some(Added::Gone), vec![]));
        assert!(t.owners_of(9, CREATE).is_empty());
        assert_eq!(t.add_finished(Some((10, A, CREATE))), (Some(Added::Held), vec![]));
        // Once no add runs, what was dropped meanwhile is forgotten (a later add of 9 is new).
        assert_eq!(add(&mut t, 9, A, CREATE), Vec::<Wd>::new());
        assert_eq!(t.owners_of(9, CREATE), vec![A]);
    }

    #[test]
    fn a_shortage_is_told_once_per_onset_and_its_end_once() {
        let none = Shortage::default();
        let inst = Shortage { instances: true, watches: false };
        let watches = Shortage { instances: false, watches: true };
        let both = Shortage { instances: true, watches: true };
        let exhausted = |s| matches!(shortage_notice(none, s), Some(ShortageNotice::Exhausted { .. }));
        assert!(exhausted(inst) && exhausted(watches) && exhausted(both));
        assert_eq!(shortage_notice(none, none), None);
        for s in [inst, watches, both] {
            assert_eq!(shortage_notice(s, s), None, "still short: not told again");
            assert!(matches!(shortage_notice(s, none), Some(ShortageNotice::Restored { .. })));
        }
        // A second kind running out is told; one of two healing is not.
        assert!(matches!(shortage_notice(inst, both), Some(ShortageNotice::Exhausted { .. })));
        assert!(matches!(shortage_notice(watches, both), Some(ShortageNotice::Exhausted { .. })));
        assert_eq!(shortage_notice(both, inst), None);
        assert_eq!(shortage_notice(both, watches), None);
        // One kind healing while the other runs out: the new one is told.
        assert!(matches!(shortage_notice(inst, watches), Some(ShortageNotice::Exhausted { .. })));
    }

    #[test]
    fn the_warning_names_the_sysctl_to_raise_and_what_is_degraded() {
        let note = |s| match shortage_notice(Shortage::default(), s) {
            Some(ShortageNotice::Exhausted { note }) => note,
            other => panic!("{other:?}"),
        };
        let inst = note(Shortage { instances: true, watches: false });
        assert!(inst.contains("fs.inotify.max_user_instances") && !inst.contains("max_user_watches"), "{inst}");
        assert!(inst.contains("periodic resync"), "{inst}");
        let watches = note(Shortage { instances: false, watches: true });
        assert!(watches.contains("fs.inotify.max_user_watches") && !watches.contains("max_user_instances"));
        let both = note(Shortage { instances: true, watches: true });
        assert!(both.contains("max_user_instances") && both.contains("max_user_watches"));
    }
}
