//! Succession: what the agent of a re-created Node (same name, new UID) does with the PVs the
//! earlier incarnation left. Only the agent on the node can look at the disks, so it decides:
//! a PV whose recorded disk is still at its path is re-adopted with nothing changed but the
//! provisioned-by annotation; one whose disk is different or missing is stale: withdrawn when
//! no claim ever used it, flagged (for an operator, or opted-in node-cleanup) when one did.
//! No PV that may hold data is ever deleted here. Pure, like the other planners.

use crate::core::wipe::cleanup::PvState;

/// What the agent found at a predecessor PV's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskCheck {
    /// The disk recorded in the PV's identity annotation is there.
    Same,
    /// A disk that may be the recorded one is there, and nothing proves it either way (no
    /// stable device ID, or an unchanged old-format identity by device number or on XFS).
    /// Re-adopted like `Same`: its wipe will still need proof or an operator's confirmation.
    Plausible,
    /// A volume is there, and the PV has no recorded identity to compare with (made by
    /// upstream, never adopted by us). Treated as the same disk, as upstream adoption is.
    Unrecorded,
    /// A volume is there, and it is provably not the recorded one.
    Different,
    /// A volume is there that cannot be proven to be the recorded disk or another one (no
    /// stable device ID, or an identity recorded in the old format by device number or on
    /// XFS): no proof either way (see core::identity::disk_identity).
    Unverified,
    /// Nothing is mounted (or no device exists) at the path.
    Missing,
    /// The recorded disk is not at its path but at another entry of this node (moved, or
    /// swapped with another): it still holds the claim's data, on this live node.
    Moved,
}

impl DiskCheck {
    /// Words for events and logs.
    pub fn describe(self) -> &'static str {
        match self {
            DiskCheck::Same => "the recorded disk is at its path",
            DiskCheck::Plausible => {
                "a disk that matches the recorded identity as far as it can tell is at its path (it cannot be \
                 proven the same disk; a wipe will need an operator's confirmation)"
            }
            DiskCheck::Unrecorded => "a volume is at its path and the PV recorded no disk identity",
            DiskCheck::Different => "a different disk is at its path",
            DiskCheck::Unverified => {
                "the disk at its path can be proven neither the recorded one nor another (no stable device \
                 ID, or an old-format identity by device number or on XFS); it may be the same disk"
            }
            DiskCheck::Missing => "no volume is at its path",
            DiskCheck::Moved => "the recorded disk is at another entry of this node",
        }
    }
}

/// One step about a PV of an earlier incarnation of this Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuccessionAction {
    /// Take the PV over: set provisioned-by to this incarnation (resourceVersion precondition),
    /// record the disk identity when none was recorded, and drop a stale mark.
    Readopt { name: String, resource_version: String, record_identity: bool, unflag: bool },
    /// Delete the PV, which no claim ever used, only if unchanged since we saw it.
    Withdraw { name: String, uid: String, resource_version: String },
    /// The PV is being deleted and no claim ever used it: drop our finalizer, nothing to wipe.
    ReleaseFinalizer { name: String, uid: String },
    /// A claim uses (or used) the PV and its disk is not here: mark it stale, Warning event.
    Flag { name: String, check: DiskCheck },
    /// A claim uses (or used) the PV and its disk is at another entry of this node: say where
    /// (never stale, so node-cleanup never releases it), dropping a stale mark, Warning event.
    FlagMoved { name: String },
    /// A claim uses (or used) the PV and nobody can tell whether its disk is here: no mark
    /// (node-cleanup never acts), a Warning event once; an operator decides.
    Report { name: String },
}

/// Plans succession for one predecessor PV, given what is at its path. `check` must have held
/// for the settle window, so a disk still being mounted at boot does not count as missing.
pub fn plan_succession(pv: &PvState, check: DiskCheck) -> Option<SuccessionAction> {
    let unbound = !pv.used_by_a_claim();
    match check {
        // A PV being deleted is re-adopted too: our cleanup then wipes the disk before the
        // PV goes, as for any other of our PVs.
        DiskCheck::Same | DiskCheck::Plausible | DiskCheck::Unrecorded => Some(SuccessionAction::Readopt {
            name: pv.name.clone(),
            resource_version: pv.resource_version.clone(),
            record_identity: check == DiskCheck::Unrecorded,
            unflag: pv.flagged_stale,
        }),
        DiskCheck::Different | DiskCheck::Missing | DiskCheck::Unverified | DiskCheck::Moved if pv.deleting => (unbound
            && pv.has_finalizer)
            .then(|| SuccessionAction::ReleaseFinalizer { name: pv.name.clone(), uid: pv.uid.clone() }),
        // No claim ever used it: withdrawing gives nothing up, whatever the disk is.
        DiskCheck::Different | DiskCheck::Missing | DiskCheck::Unverified | DiskCheck::Moved if unbound => {
            Some(SuccessionAction::Withdraw {
                name: pv.name.clone(),
                uid: pv.uid.clone(),
                resource_version: pv.resource_version.clone(),
            })
        }
        DiskCheck::Unverified => Some(SuccessionAction::Report { name: pv.name.clone() }),
        DiskCheck::Moved => {
            (pv.flagged_stale || pv.moved_to.is_none()).then(|| SuccessionAction::FlagMoved { name: pv.name.clone() })
        }
        DiskCheck::Different | DiskCheck::Missing => {
            (!pv.flagged_stale).then(|| SuccessionAction::Flag { name: pv.name.clone(), check })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(phase: &str, claimed: bool) -> PvState {
        PvState {
            name: "local-pv-1".into(),
            uid: "uid-1".into(),
            resource_version: "42".into(),
            phase: phase.into(),
            reclaim_policy: "Delete".into(),
            claimed,
            has_finalizer: true,
            identity: Some("fs:1:2".into()),
            ..Default::default()
        }
    }

    const ALL_CHECKS: [DiskCheck; 7] = [
        DiskCheck::Moved,
        DiskCheck::Same,
        DiskCheck::Plausible,
        DiskCheck::Unrecorded,
        DiskCheck::Different,
        DiskCheck::Unverified,
        DiskCheck::Missing,
    ];
    const PHASES: [(&str, bool); 6] =
        [("Available", false), ("Pending", false), ("", false), ("Bound", true), ("Released", true), ("Failed", true)];

    #[test]
    fn same_disk_is_readopted_whatever_the_phase() {
        for (phase, claimed) in PHASES {
            for (deleting, check) in
                [false, true].into_iter().flat_map(|d| [(d, DiskCheck::Same), (d, DiskCheck::Plausible)])
            {
                let mut p = pv(phase, claimed);
                p.deleting = deleting;
                let got = plan_succession(&p, check);
                assert_eq!(
                    got,
                    Some(SuccessionAction::Readopt {
                        name: "local-pv-1".into(),
                        resource_version: "42".into(),
                        record_identity: false,
                        unflag: false
                    }),
                    "{phase} deleting={deleting}"
                );
            }
        }
    }

    #[test]
    fn unrecorded_disk_is_readopted_and_recorded() {
        let mut p = pv("Bound", true);
        p.identity = None;
        p.flagged_stale = true;
        assert_eq!(
            plan_succession(&p, DiskCheck::Unrecorded),
            Some(SuccessionAction::Readopt {
                name: "local-pv-1".into(),
                resource_version: "42".into(),
                record_identity: true,
                unflag: true
            })
        );
    }

    #[test]
    fn stale_unbound_pv_is_withdrawn_with_preconditions() {
        for check in [DiskCheck::Different, DiskCheck::Missing] {
            for phase in ["Available", "Pending", ""] {
                assert_eq!(
                    plan_succession(&pv(phase, false), check),
                    Some(SuccessionAction::Withdraw {
                        name: "local-pv-1".into(),
                        uid: "uid-1".into(),
                        resource_version: "42".into()
                    })
                );
            }
        }
    }

    #[test]
    fn stale_used_pv_is_flagged_once_and_never_deleted() {
        for check in [DiskCheck::Different, DiskCheck::Missing] {
            for (phase, _) in PHASES {
                // A claimRef on any phase means a claim used the volume.
                let p = pv(phase, true);
                assert_eq!(
                    plan_succession(&p, check),
                    Some(SuccessionAction::Flag { name: "local-pv-1".into(), check }),
                    "{phase}"
                );
                let mut flagged = p.clone();
                flagged.flagged_stale = true;
                assert_eq!(plan_succession(&flagged, check), None, "{phase} flagged");
            }
        }
    }

    #[test]
    fn deleting_stale_pv_keeps_our_finalizer_when_used() {
        let mut used = pv("Released", true);
        used.deleting = true;
        assert_eq!(plan_succession(&used, DiskCheck::Missing), None);
        let mut unused = pv("Available", false);
        unused.deleting = true;
        assert_eq!(
            plan_succession(&unused, DiskCheck::Different),
            Some(SuccessionAction::ReleaseFinalizer { name: "local-pv-1".into(), uid: "uid-1".into() })
        );
        unused.has_finalizer = false;
        assert_eq!(plan_succession(&unused, DiskCheck::Different), None);
    }

    #[test]
    fn unverified_used_pv_is_only_reported() {
        for (phase, _) in PHASES {
            let mut p = pv(phase, true);
            assert_eq!(
                plan_succession(&p, DiskCheck::Unverified),
                Some(SuccessionAction::Report { name: "local-pv-1".into() })
            );
            p.flagged_stale = true;
            assert!(!matches!(plan_succession(&p, DiskCheck::Unverified), Some(SuccessionAction::Flag { .. })));
        }
        assert!(matches!(
            plan_succession(&pv("Available", false), DiskCheck::Unverified),
            Some(SuccessionAction::Withdraw { .. })
        ));
    }

    /// Exhaustive safety property: whatever the PV and the disk, a PV a claim ever used is
    /// never deleted and never loses our finalizer here.
    #[test]
    fn used_pvs_are_never_given_up() {
        for (phase, claimed) in PHASES.into_iter().chain([("Bound", false), ("Available", true)]) {
            for deleting in [false, true] {
                for has_finalizer in [false, true] {
                    for flagged_stale in [false, true] {
                        for check in ALL_CHECKS {
                            let mut p = pv(phase, claimed);
                            p.deleting = deleting;
                            p.has_finalizer = has_finalizer;
                            p.flagged_stale = flagged_stale;
                            let action = plan_succession(&p, check);
                            let destructive = matches!(
                                action,
                                Some(SuccessionAction::Withdraw { .. } | SuccessionAction::ReleaseFinalizer { .. })
                            );
                            let used = claimed || !matches!(phase, "Available" | "Pending" | "");
                            assert!(!(destructive && used), "{phase} claimed={claimed} {check:?} -> {action:?}");
                            // Only a proven absence marks a PV stale (which node-cleanup acts on): a
                            // disk found elsewhere on this node never does.
                            if matches!(action, Some(SuccessionAction::Flag { .. })) {
                                assert!(matches!(check, DiskCheck::Different | DiskCheck::Missing));
                            }
                            if check == DiskCheck::Moved && used {
                                assert!(
                                    matches!(action, None | Some(SuccessionAction::FlagMoved { .. })),
                                    "{phase} {action:?}"
                                );
                            }
                            if matches!(check, DiskCheck::Same | DiskCheck::Plausible | DiskCheck::Unrecorded) {
                                assert!(matches!(action, Some(SuccessionAction::Readopt { .. })));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_used_pv_whose_disk_moved_is_flagged_moved_and_unstaled_once() {
        let mut p = pv("Bound", true);
        assert_eq!(
            plan_succession(&p, DiskCheck::Moved),
            Some(SuccessionAction::FlagMoved { name: "local-pv-1".into() })
        );
        p.moved_to = Some("/mnt/disks/z".into());
        assert_eq!(plan_succession(&p, DiskCheck::Moved), None);
        p.flagged_stale = true;
        assert_eq!(
            plan_succession(&p, DiskCheck::Moved),
            Some(SuccessionAction::FlagMoved { name: "local-pv-1".into() })
        );
        assert!(matches!(
            plan_succession(&pv("Available", false), DiskCheck::Moved),
            Some(SuccessionAction::Withdraw { .. })
        ));
    }
}
