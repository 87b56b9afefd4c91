//! Volumes that vanish: what to do with this node's PVs whose disk is gone (unmounted, device
//! removed, or replaced by a different disk). An unbound PV is withdrawn so no pod is scheduled
//! onto a disk that is not there; a Bound or Released one is never deleted, only flagged, and
//! unflagged when the disk comes back. Pure, like the other planners.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::identity::disk_identity::may_share_disk;
use crate::core::wipe::cleanup::PvState;

/// One step about a PV's volume being present or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PresenceAction {
    /// Delete the unbound PV, only if unchanged since we saw it (resourceVersion precondition),
    /// so a PV that got bound meanwhile is left alone.
    Withdraw { name: String, uid: String, resource_version: String },
    /// Mark a Bound or Released PV as missing its volume (annotation and Warning event), with
    /// where on this node its disk is now when it was found at another entry (or moved again).
    Flag { name: String, moved_to: Option<String> },
    /// The volume is back: remove the mark.
    Unflag { name: String },
}

/// Where a PV's recorded disk is now, when it is not at its own path: the host path of a found
/// volume that may be that disk (judged by what names a disk, conservatively, so a disk that
/// may hold the PV's data is never taken for gone). `found` holds (host path, identity).
pub(crate) fn where_moved(pv: &PvState, found: &[(String, String)]) -> Option<String> {
    let recorded = pv.identity.as_deref()?;
    found
        .iter()
        .filter(|(path, id)| *path != pv.host_path && may_share_disk(recorded, id))
        .map(|(path, _)| path.clone())
        .min()
}

/// Plans presence actions. `missing` holds the UIDs of PVs whose volume has been absent for
/// longer than the settle window; `moved` where the missing ones' disks are now, for those
/// found at another entry. PVs being deleted get nothing (the cleanup planner owns them).
/// Sorted by name.
pub(crate) fn plan_presence(
    pvs: &[PvState],
    missing: &BTreeSet<String>,
    moved: &BTreeMap<String, String>,
) -> Vec<PresenceAction> {
    let mut sorted: Vec<&PvState> = pvs.iter().filter(|pv| !pv.deleting).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .into_iter()
        .filter_map(|pv| {
            let is_missing = missing.contains(&pv.uid);
            let unbound = matches!(pv.phase.as_str(), "Available" | "Pending") && !pv.claimed;
            let moved_to = moved.get(&pv.uid).cloned();
            match (is_missing, pv.flagged_missing) {
                (true, _) if unbound => Some(PresenceAction::Withdraw {
                    name: pv.name.clone(),
                    uid: pv.uid.clone(),
                    resource_version: pv.resource_version.clone(),
                }),
                (true, false) => Some(PresenceAction::Flag { name: pv.name.clone(), moved_to }),
                (true, true) if moved_to.is_some() && pv.moved_to != moved_to => {
                    Some(PresenceAction::Flag { name: pv.name.clone(), moved_to })
                }
                (false, true) => Some(PresenceAction::Unflag { name: pv.name.clone() }),
                // Back at its path after a move noted by succession (no missing flag): unflag.
                (false, false) if pv.moved_to.is_some() => Some(PresenceAction::Unflag { name: pv.name.clone() }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, phase: &str, claimed: bool, flagged: bool, deleting: bool) -> PvState {
        PvState {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "7".into(),
            phase: phase.into(),
            claimed,
            flagged_missing: flagged,
            deleting,
            has_finalizer: true,
            ..Default::default()
        }
    }

    fn missing(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| format!("uid-{n}")).collect()
    }

    #[test]
    fn decision_table() {
        use PresenceAction::*;
        let withdraw =
            |n: &str| Some(Withdraw { name: n.into(), uid: format!("uid-{n}"), resource_version: "7".into() });
        let cases: Vec<(PvState, bool, Option<PresenceAction>)> = vec![
            (pv("a", "Available", false, false, false), true, withdraw("a")),
            (pv("a", "Pending", false, false, false), true, withdraw("a")),
            (pv("a", "Available", false, false, false), false, None),
            // Bound and Released PVs are never deleted, only flagged once.
            (pv("a", "Bound", true, false, false), true, Some(Flag { name: "a".into(), moved_to: None })),
            (pv("a", "Released", true, false, false), true, Some(Flag { name: "a".into(), moved_to: None })),
            (pv("a", "Failed", true, false, false), true, Some(Flag { name: "a".into(), moved_to: None })),
            (pv("a", "Bound", true, true, false), true, None),
            // An Available PV with a claimRef is being bound right now: flag, never withdraw.
            (pv("a", "Available", true, false, false), true, Some(Flag { name: "a".into(), moved_to: None })),
            // Back again.
            (pv("a", "Bound", true, true, false), false, Some(Unflag { name: "a".into() })),
            (pv("a", "Released", true, true, false), false, Some(Unflag { name: "a".into() })),
            (pv("a", "Bound", true, false, false), false, None),
            // Being deleted: the cleanup planner's business.
            (pv("a", "Available", false, false, true), true, None),
            (pv("a", "Released", true, true, true), false, None),
        ];
        for (state, is_missing, want) in cases {
            let m = if is_missing { missing(&["a"]) } else { BTreeSet::new() };
            let got = plan_presence(std::slice::from_ref(&state), &m, &BTreeMap::new());
            assert_eq!(got.into_iter().next(), want, "{state:?} missing={is_missing}");
        }
    }

    #[test]
    fn sorted_and_independent_of_order() {
        let pvs = vec![
            pv("c", "Available", false, false, false),
            pv("a", "Bound", true, false, false),
            pv("b", "Bound", true, true, false),
        ];
        let m = missing(&["a", "c"]);
        let forward = plan_presence(&pvs, &m, &BTreeMap::new());
        let mut reversed = pvs.clone();
        reversed.reverse();
        assert_eq!(forward, plan_presence(&reversed, &m, &BTreeMap::new()));
        let names: Vec<&str> = forward
            .iter()
            .map(|a| match a {
                PresenceAction::Withdraw { name, .. }
                | PresenceAction::Flag { name, .. }
                | PresenceAction::Unflag { name } => name.as_str(),
            })
            .collect();
        assert_eq!(names, vec!["a", "b", "c"]);
    }

    #[test]
    fn a_moved_disk_is_named_where_it_went_and_never_withdrawn_when_used() {
        let mut bound = pv("a", "Bound", true, false, false);
        bound.identity = Some("v2;fs;disk=wwid:1;uuid=u;ino=2;dev=8:1".into());
        bound.host_path = "/mnt/disks/a".into();
        let found = vec![
            ("/mnt/disks/a".to_string(), "v2;fs;disk=wwid:2;uuid=w;ino=2;dev=8:2".to_string()),
            ("/mnt/disks/z".to_string(), "v2;fs;disk=wwid:1;uuid=u;ino=2;dev=8:1".to_string()),
        ];
        assert_eq!(where_moved(&bound, &found), Some("/mnt/disks/z".into()));
        assert_eq!(where_moved(&bound, &found[..1]), None);
        let moved: BTreeMap<String, String> = [("uid-a".to_string(), "/mnt/disks/z".to_string())].into();
        let flag = Some(PresenceAction::Flag { name: "a".into(), moved_to: Some("/mnt/disks/z".into()) });
        assert_eq!(plan_presence(std::slice::from_ref(&bound), &missing(&["a"]), &moved).into_iter().next(), flag);
        // Already flagged missing, now found elsewhere (or elsewhere again): flagged anew.
        bound.flagged_missing = true;
        assert_eq!(plan_presence(std::slice::from_ref(&bound), &missing(&["a"]), &moved).into_iter().next(), flag);
        bound.moved_to = Some("/mnt/disks/z".into());
        assert!(plan_presence(std::slice::from_ref(&bound), &missing(&["a"]), &moved).is_empty());
        // Back at its path: both flags go, also when only succession had noted the move.
        let unflag = Some(PresenceAction::Unflag { name: "a".into() });
        assert_eq!(plan_presence(std::slice::from_ref(&bound), &BTreeSet::new(), &moved).into_iter().next(), unflag);
        bound.flagged_missing = false;
        assert_eq!(plan_presence(std::slice::from_ref(&bound), &BTreeSet::new(), &moved).into_iter().next(), unflag);
    }
}
