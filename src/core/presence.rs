//! Volumes that vanish: what to do with this node's PVs whose disk is gone (unmounted, device
//! removed, or replaced by a different disk). An unbound PV is withdrawn so no pod is scheduled
//! onto a disk that is not there; a Bound or Released one is never deleted, only flagged, and
//! unflagged when the disk comes back. Pure, like the other planners.

use std::collections::BTreeSet;

use super::cleanup::PvState;

/// One step about a PV's volume being present or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresenceAction {
    /// Delete the unbound PV, only if unchanged since we saw it (resourceVersion precondition),
    /// so a PV that got bound meanwhile is left alone.
    Withdraw { name: String, uid: String, resource_version: String },
    /// Mark a Bound or Released PV as missing its volume (annotation and Warning event).
    Flag { name: String },
    /// The volume is back: remove the mark.
    Unflag { name: String },
}

/// Plans presence actions. `missing` holds the UIDs of PVs whose volume has been absent for
/// longer than the settle window. PVs being deleted get nothing (the cleanup planner owns
/// them). Sorted by name.
pub fn plan_presence(pvs: &[PvState], missing: &BTreeSet<String>) -> Vec<PresenceAction> {
    let mut sorted: Vec<&PvState> = pvs.iter().filter(|pv| !pv.deleting).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .into_iter()
        .filter_map(|pv| {
            let is_missing = missing.contains(&pv.uid);
            let unbound = matches!(pv.phase.as_str(), "Available" | "Pending") && !pv.claimed;
            match (is_missing, pv.flagged_missing) {
                (true, _) if unbound => Some(PresenceAction::Withdraw {
                    name: pv.name.clone(),
                    uid: pv.uid.clone(),
                    resource_version: pv.resource_version.clone(),
                }),
                (true, false) => Some(PresenceAction::Flag { name: pv.name.clone() }),
                (false, true) => Some(PresenceAction::Unflag { name: pv.name.clone() }),
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
            (pv("a", "Bound", true, false, false), true, Some(Flag { name: "a".into() })),
            (pv("a", "Released", true, false, false), true, Some(Flag { name: "a".into() })),
            (pv("a", "Failed", true, false, false), true, Some(Flag { name: "a".into() })),
            (pv("a", "Bound", true, true, false), true, None),
            // An Available PV with a claimRef is being bound right now: flag, never withdraw.
            (pv("a", "Available", true, false, false), true, Some(Flag { name: "a".into() })),
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
            let got = plan_presence(std::slice::from_ref(&state), &m);
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
        let forward = plan_presence(&pvs, &m);
        let mut reversed = pvs.clone();
        reversed.reverse();
        assert_eq!(forward, plan_presence(&reversed, &m));
        let names: Vec<&str> = forward
            .iter()
            .map(|a| match a {
                PresenceAction::Withdraw { name, .. }
                | PresenceAction::Flag { name }
                | PresenceAction::Unflag { name } => name.as_str(),
            })
            .collect();
        assert_eq!(names, vec!["a", "b", "c"]);
    }
}
