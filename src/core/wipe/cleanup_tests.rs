use super::*;
use crate::core::volumes::pv_facts::PvFacts;

use serde_json::json;

use crate::core::volumes::naming::{
    ANN_CLEANUP, ANN_CLEANUP_RESULT, ANN_IDENTITY_CONFIRMED, ANN_VOLUME_IDENTITY, CLEANUP_REQUESTED, FINALIZER_WIPE,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const PHASES: [&str; 6] = ["Available", "Bound", "Released", "Failed", "Pending", ""];
const POLICIES: [&str; 5] = ["Delete", "Retain", "Recycle", "Weird", ""];

/// A PV we own (finalizer present), not deleting, unclaimed, no request.
fn pv(name: &str, phase: &str, policy: &str) -> PvState {
    PvState {
        name: name.to_string(),
        uid: format!("uid-{name}"),
        resource_version: format!("rv-{name}"),
        phase: phase.to_string(),
        reclaim_policy: policy.to_string(),
        deleting: false,
        has_finalizer: true,
        claimed: false,
        cleanup_requested: false,
        cleanup_result: None,
        cleanup_requested_at: None,
        host_path: format!("/mnt/disks/{name}"),
        class: "local".to_string(),
        identity: Some(format!("id-{name}")),
        identity_confirmed: None,
        flagged_missing: false,
        flagged_stale: false,
        moved_to: None,
        disk_failing: None,
        claim: None,
        honours_fence: true,
        capacity_bytes: None,
        encryption: None,
        wipe_history: Vec::new(),
    }
}

fn claimed(mut p: PvState) -> PvState {
    p.claimed = true;
    p
}

fn requested(mut p: PvState) -> PvState {
    p.cleanup_requested = true;
    p
}

fn deleting(mut p: PvState) -> PvState {
    p.deleting = true;
    p
}

fn no_finalizer(mut p: PvState) -> PvState {
    p.has_finalizer = false;
    p
}

fn no_busy() -> BTreeSet<String> {
    BTreeSet::new()
}

/// Plans a single PV and returns its action, asserting there is at most one.
fn plan1(p: &PvState) -> Option<CleanupAction> {
    let mut actions = plan_cleanup(std::slice::from_ref(p), &no_busy());
    assert!(actions.len() <= 1, "more than one action for {p:?}: {actions:?}");
    actions.pop()
}

fn wipe(p: &PvState, after: AfterWipe) -> Option<CleanupAction> {
    Some(CleanupAction::Wipe { pv: p.clone(), after })
}

fn refuse(p: &PvState, refusal: Refusal) -> Option<CleanupAction> {
    Some(CleanupAction::Refuse { name: p.name.clone(), refusal })
}

fn action_name(a: &CleanupAction) -> &str {
    match a {
        CleanupAction::AddFinalizer { name }
        | CleanupAction::Withdraw { name, .. }
        | CleanupAction::ReleaseFinalizer { name, .. }
        | CleanupAction::Refuse { name, .. } => name,
        CleanupAction::Wipe { pv, .. } => &pv.name,
    }
}

/// Every combination of the table: phase x policy x deleting x finalizer x claimed x requested x
/// earlier result.
fn all_states() -> Vec<PvState> {
    let results = [None, Some(Refusal::Bound.to_string()), Some("something else".to_string())];
    let mut out = Vec::new();
    let mut i = 0;
    for phase in PHASES {
        for policy in POLICIES {
            for del in [false, true] {
                for fin in [false, true] {
                    for cl in [false, true] {
                        for req in [false, true] {
                            for result in &results {
                                let mut p = pv(&format!("pv-{i:04}"), phase, policy);
                                i += 1;
                                p.deleting = del;
                                p.has_finalizer = fin;
                                p.claimed = cl;
                                p.cleanup_requested = req;
                                p.cleanup_result = result.clone();
                                out.push(p);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The rules of the brief written out independently of the planner.
fn expected(p: &PvState) -> Option<CleanupAction> {
    if p.deleting {
        if !p.has_finalizer || p.phase == "Bound" {
            return None;
        }
        if p.claimed || p.cleanup_requested {
            return wipe(p, AfterWipe::RemoveFinalizer);
        }
        return Some(CleanupAction::ReleaseFinalizer { name: p.name.clone(), uid: p.uid.clone() });
    }
    if !p.has_finalizer {
        return Some(CleanupAction::AddFinalizer { name: p.name.clone() });
    }
    let released_or_failed = p.phase == "Released" || p.phase == "Failed";
    if p.cleanup_requested {
        if released_or_failed {
            return wipe(p, AfterWipe::DeletePv);
        }
        // Pending is not in the brief; an unclaimed Pending PV has no data in use either.
        if (p.phase == "Available" || p.phase == "Pending") && !p.claimed {
            return Some(CleanupAction::Withdraw {
                name: p.name.clone(),
                resource_version: p.resource_version.clone(),
            });
        }
        if p.phase == "Bound" {
            if p.cleanup_result.as_deref() == Some(Refusal::Bound.to_string().as_str()) {
                return None;
            }
            return refuse(p, Refusal::Bound);
        }
    }
    if p.phase == "Released" {
        return match p.reclaim_policy.as_str() {
            "Delete" => wipe(p, AfterWipe::DeletePv),
            "Retain" => None,
            "Recycle" => refuse(p, Refusal::RecyclePolicy),
            other => refuse(p, Refusal::UnknownPolicy(other.to_string())),
        };
    }
    None
}

/// Small deterministic PRNG (xorshift) for shuffles.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            out.push(tail);
        }
    }
    out
}

fn pv_json(value: serde_json::Value) -> PvFacts {
    serde_json::from_value(value).expect("valid PersistentVolume JSON")
}

// ---------------------------------------------------------------------------------------------
// Exhaustive table and invariants
// ---------------------------------------------------------------------------------------------

#[test]
fn table_matches_the_rules_for_every_combination() {
    let states = all_states();
    assert_eq!(states.len(), 6 * 5 * 2 * 2 * 2 * 2 * 3);
    let mut failures = Vec::new();
    for p in &states {
        let got = plan1(p);
        let want = expected(p);
        if got != want {
            failures.push(format!("{p:?}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn whole_table_planned_at_once_equals_per_pv_plans() {
    let states = all_states();
    let together = plan_cleanup(&states, &no_busy());
    let one_by_one: Vec<CleanupAction> = states.iter().filter_map(plan1).collect();
    assert_eq!(together, one_by_one);
}

#[test]
fn safety_invariants_hold_for_every_combination() {
    for p in all_states() {
        let action = plan1(&p);
        let Some(action) = action else { continue };
        assert_eq!(action_name(&action), p.name, "action for the wrong PV: {action:?}");
        match &action {
            CleanupAction::Wipe { pv, after } => {
                assert_ne!(p.phase, "Bound", "wipe of a Bound PV: {p:?}");
                let released_or_failed = p.phase == "Released" || p.phase == "Failed";
                let allowed = (released_or_failed && (p.reclaim_policy == "Delete" || p.cleanup_requested))
                    || (p.deleting && (p.claimed || p.cleanup_requested));
                assert!(allowed, "wipe not allowed by the rules: {p:?}");
                assert!(p.has_finalizer, "wipe of a PV we do not hold: {p:?}");
                assert_eq!(pv, &p, "wipe must carry the PV exactly as seen (uid, path, identity)");
                let want_after = if p.deleting { AfterWipe::RemoveFinalizer } else { AfterWipe::DeletePv };
                assert_eq!(*after, want_after, "{p:?}");
            }
            CleanupAction::Withdraw { resource_version, .. } => {
                assert!(!p.claimed, "withdraw of a claimed PV: {p:?}");
                assert_ne!(p.phase, "Bound", "withdraw of a Bound PV: {p:?}");
                assert!(p.cleanup_requested, "withdraw without a request: {p:?}");
                assert!(!p.deleting && p.has_finalizer, "{p:?}");
                assert_eq!(resource_version, &p.resource_version);
            }
            CleanupAction::ReleaseFinalizer { uid, .. } => {
                assert!(p.deleting && p.has_finalizer && !p.claimed && !p.cleanup_requested, "{p:?}");
                assert_ne!(p.phase, "Bound");
                assert_eq!(uid, &p.uid);
            }
            CleanupAction::AddFinalizer { .. } => {
                assert!(!p.deleting && !p.has_finalizer, "{p:?}");
            }
            CleanupAction::Refuse { refusal, .. } => {
                assert!(!p.deleting && p.has_finalizer, "{p:?}");
                match refusal {
                    Refusal::Bound => {
                        assert_eq!(p.phase, "Bound");
                        assert!(p.cleanup_requested);
                        assert_ne!(p.cleanup_result.as_deref(), Some(Refusal::Bound.to_string().as_str()));
                    }
                    Refusal::RecyclePolicy => {
                        assert_eq!((p.phase.as_str(), p.reclaim_policy.as_str()), ("Released", "Recycle"));
                        assert!(!p.cleanup_requested);
                    }
                    Refusal::UnknownPolicy(policy) => {
                        assert_eq!(p.phase, "Released");
                        assert_eq!(policy, &p.reclaim_policy);
                        assert!(!["Delete", "Retain", "Recycle"].contains(&policy.as_str()));
                        assert!(!p.cleanup_requested);
                    }
                }
            }
        }
    }
}

#[test]
fn bound_pvs_are_never_wiped_or_withdrawn() {
    for policy in POLICIES {
        for del in [false, true] {
            for fin in [false, true] {
                for cl in [false, true] {
                    for req in [false, true] {
                        let mut p = pv("b", "Bound", policy);
                        p.deleting = del;
                        p.has_finalizer = fin;
                        p.claimed = cl;
                        p.cleanup_requested = req;
                        let action = plan1(&p);
                        assert!(
                            !matches!(action, Some(CleanupAction::Wipe { .. } | CleanupAction::Withdraw { .. })),
                            "{p:?} -> {action:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn claimed_pvs_are_never_withdrawn() {
    for phase in PHASES {
        for policy in POLICIES {
            for del in [false, true] {
                for fin in [false, true] {
                    let mut p = requested(claimed(pv("c", phase, policy)));
                    p.deleting = del;
                    p.has_finalizer = fin;
                    let action = plan1(&p);
                    assert!(!matches!(action, Some(CleanupAction::Withdraw { .. })), "{p:?} -> {action:?}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Released PVs by reclaim policy
// ---------------------------------------------------------------------------------------------

#[test]
fn released_delete_is_wiped_then_deleted() {
    let p = claimed(pv("a", "Released", "Delete"));
    assert_eq!(plan1(&p), wipe(&p, AfterWipe::DeletePv));
    // claimRef is not what triggers it: the phase and policy do.
    let p = pv("a", "Released", "Delete");
    assert_eq!(plan1(&p), wipe(&p, AfterWipe::DeletePv));
}

#[test]
fn released_retain_is_left_alone() {
    assert_eq!(plan1(&claimed(pv("a", "Released", "Retain"))), None);
}

#[test]
fn released_recycle_is_refused_with_upstream_reason() {
    let p = claimed(pv("a", "Released", "Recycle"));
    let action = plan1(&p);
    assert_eq!(action, refuse(&p, Refusal::RecyclePolicy));
    let Some(CleanupAction::Refuse { refusal, .. }) = action else { unreachable!() };
    assert_eq!(refusal.reason(), "VolumeUnsupportedReclaimPolicy");
    assert!(!refusal.answers_request());
    assert!(refusal.to_string().contains("Recycle"));
}

#[test]
fn released_unknown_policy_is_refused_with_upstream_reason() {
    for policy in ["Weird", "delete", "retain", " Delete", ""] {
        let p = claimed(pv("a", "Released", policy));
        let action = plan1(&p);
        assert_eq!(action, refuse(&p, Refusal::UnknownPolicy(policy.to_string())), "{policy:?}");
        let Some(CleanupAction::Refuse { refusal, .. }) = action else { unreachable!() };
        assert_eq!(refusal.reason(), "VolumeUnknownReclaimPolicy");
        assert!(!refusal.answers_request());
        assert!(refusal.to_string().contains(&format!("{policy:?}")), "{refusal}");
    }
}

#[test]
fn other_phases_without_request_get_nothing() {
    for phase in ["Available", "Bound", "Failed", "Pending", ""] {
        for policy in POLICIES {
            for cl in [false, true] {
                let mut p = pv("a", phase, policy);
                p.claimed = cl;
                assert_eq!(plan1(&p), None, "{p:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cleanup requests
// ---------------------------------------------------------------------------------------------

#[test]
fn requested_released_or_failed_is_wiped_whatever_the_policy() {
    for phase in ["Released", "Failed"] {
        for policy in POLICIES {
            for cl in [false, true] {
                let mut p = requested(pv("a", phase, policy));
                p.claimed = cl;
                assert_eq!(plan1(&p), wipe(&p, AfterWipe::DeletePv), "{p:?}");
            }
        }
    }
}

#[test]
fn requested_available_unclaimed_is_withdrawn_with_its_resource_version() {
    for policy in POLICIES {
        let mut p = requested(pv("a", "Available", policy));
        p.resource_version = "123456".to_string();
        assert_eq!(
            plan1(&p),
            Some(CleanupAction::Withdraw { name: "a".to_string(), resource_version: "123456".to_string() })
        );
    }
}

#[test]
fn requested_available_but_claimed_is_not_withdrawn() {
    // A pre-bound PV (claimRef set while still Available) is about to be used.
    for policy in POLICIES {
        assert_eq!(plan1(&requested(claimed(pv("a", "Available", policy)))), None);
    }
}

#[test]
fn requested_bound_is_refused_once() {
    for policy in POLICIES {
        let p = requested(claimed(pv("a", "Bound", policy)));
        let action = plan1(&p);
        assert_eq!(action, refuse(&p, Refusal::Bound));
        let Some(CleanupAction::Refuse { refusal, .. }) = action else { unreachable!() };
        assert_eq!(refusal.reason(), "VolumeCleanupRefused");
        assert!(refusal.answers_request());

        // Once recorded, not again.
        let mut answered = p.clone();
        answered.cleanup_result = Some(Refusal::Bound.to_string());
        assert_eq!(plan1(&answered), None);

        // A different recorded result (older text, other outcome) gets the refusal again.
        for other in ["", "refused", "wiped"] {
            let mut stale = p.clone();
            stale.cleanup_result = Some(other.to_string());
            assert_eq!(plan1(&stale), refuse(&stale, Refusal::Bound), "{other:?}");
        }
    }
}

#[test]
fn recorded_bound_result_does_not_block_later_wipe_after_release() {
    let mut p = requested(claimed(pv("a", "Released", "Retain")));
    p.cleanup_result = Some(Refusal::Bound.to_string());
    assert_eq!(plan1(&p), wipe(&p, AfterWipe::DeletePv));
}

// ---------------------------------------------------------------------------------------------
// Deleting PVs
// ---------------------------------------------------------------------------------------------

#[test]
fn deleting_claimed_pv_is_wiped_then_finalizer_removed() {
    for phase in ["Available", "Released", "Failed", "Pending", ""] {
        for policy in POLICIES {
            for req in [false, true] {
                let mut p = deleting(claimed(pv("a", phase, policy)));
                p.cleanup_requested = req;
                assert_eq!(plan1(&p), wipe(&p, AfterWipe::RemoveFinalizer), "{p:?}");
            }
        }
    }
}

#[test]
fn deleting_requested_unclaimed_pv_is_wiped_then_finalizer_removed() {
    // This is the second half of a withdrawal: the Available PV was deleted by us.
    for phase in ["Available", "Released", "Failed", "Pending", ""] {
        for policy in POLICIES {
            let p = deleting(requested(pv("a", phase, policy)));
            assert_eq!(plan1(&p), wipe(&p, AfterWipe::RemoveFinalizer), "{p:?}");
        }
    }
}

#[test]
fn deleting_never_claimed_pv_releases_finalizer() {
    for phase in ["Available", "Released", "Failed", "Pending", ""] {
        for policy in POLICIES {
            let p = deleting(pv("a", phase, policy));
            assert_eq!(
                plan1(&p),
                Some(CleanupAction::ReleaseFinalizer { name: "a".to_string(), uid: "uid-a".to_string() }),
                "{p:?}"
            );
        }
    }
}

#[test]
fn deleting_bound_pv_waits() {
    for policy in POLICIES {
        for cl in [false, true] {
            for req in [false, true] {
                let mut p = deleting(pv("a", "Bound", policy));
                p.claimed = cl;
                p.cleanup_requested = req;
                assert_eq!(plan1(&p), None, "{p:?}");
            }
        }
    }
}

#[test]
fn deleting_without_our_finalizer_is_not_ours_to_touch() {
    for phase in PHASES {
        for policy in POLICIES {
            for cl in [false, true] {
                for req in [false, true] {
                    let mut p = no_finalizer(deleting(pv("a", phase, policy)));
                    p.claimed = cl;
                    p.cleanup_requested = req;
                    assert_eq!(plan1(&p), None, "{p:?}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Adoption
// ---------------------------------------------------------------------------------------------

#[test]
fn pv_without_finalizer_is_adopted_whatever_its_phase() {
    for phase in PHASES {
        for policy in POLICIES {
            for cl in [false, true] {
                for req in [false, true] {
                    let mut p = no_finalizer(pv("a", phase, policy));
                    p.claimed = cl;
                    p.cleanup_requested = req;
                    // Even a Released+Delete PV is adopted first; the wipe comes on the next pass,
                    // so a crash mid-wipe cannot lose the PV.
                    assert_eq!(plan1(&p), Some(CleanupAction::AddFinalizer { name: "a".to_string() }), "{p:?}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Busy UIDs, ordering, one action per PV
// ---------------------------------------------------------------------------------------------

fn mixed_set() -> Vec<PvState> {
    vec![
        claimed(pv("e-released-delete", "Released", "Delete")),
        no_finalizer(pv("a-adopt", "Available", "Delete")),
        requested(pv("c-withdraw", "Available", "Retain")),
        deleting(pv("b-release-fin", "Available", "Delete")),
        claimed(pv("d-recycle", "Released", "Recycle")),
        requested(claimed(pv("f-bound", "Bound", "Delete"))),
        pv("g-quiet", "Available", "Delete"),
        deleting(claimed(pv("h-deleting-used", "Released", "Retain"))),
    ]
}

#[test]
fn busy_uids_get_no_action() {
    let pvs = mixed_set();
    let all = plan_cleanup(&pvs, &no_busy());
    assert_eq!(all.len(), 7); // g-quiet has nothing to do
    for p in &pvs {
        let busy = BTreeSet::from([p.uid.clone()]);
        let got = plan_cleanup(&pvs, &busy);
        let want: Vec<CleanupAction> = all.iter().filter(|a| action_name(a) != p.name).cloned().collect();
        assert_eq!(got, want, "busy {}", p.uid);
    }
    let every_uid: BTreeSet<String> = pvs.iter().map(|p| p.uid.clone()).collect();
    assert_eq!(plan_cleanup(&pvs, &every_uid), Vec::new());
}

#[test]
fn busy_matches_uid_not_name() {
    let p = claimed(pv("a", "Released", "Delete"));
    let by_name = BTreeSet::from(["a".to_string()]);
    assert_eq!(plan_cleanup(std::slice::from_ref(&p), &by_name), vec![wipe(&p, AfterWipe::DeletePv).unwrap()]);
    // A successor PV with the same name but a new UID is not held back by its predecessor's wipe.
    let mut successor = p.clone();
    successor.uid = "uid-new".to_string();
    let busy = BTreeSet::from([p.uid.clone()]);
    assert_eq!(
        plan_cleanup(std::slice::from_ref(&successor), &busy),
        vec![wipe(&successor, AfterWipe::DeletePv).unwrap()]
    );
    // Unknown busy UIDs are harmless.
    let stray = BTreeSet::from(["uid-gone".to_string()]);
    assert_eq!(plan_cleanup(std::slice::from_ref(&p), &stray).len(), 1);
}

#[test]
fn busy_wins_over_every_kind_of_action() {
    for p in all_states() {
        let busy = BTreeSet::from([p.uid.clone()]);
        assert_eq!(plan_cleanup(std::slice::from_ref(&p), &busy), Vec::new(), "{p:?}");
    }
}

#[test]
fn output_is_sorted_by_name() {
    let actions = plan_cleanup(&mixed_set(), &no_busy());
    let names: Vec<&str> = actions.iter().map(action_name).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(
        names,
        ["a-adopt", "b-release-fin", "c-withdraw", "d-recycle", "e-released-delete", "f-bound", "h-deleting-used"]
    );

    let table = plan_cleanup(&all_states(), &no_busy());
    assert!(table.windows(2).all(|w| action_name(&w[0]) < action_name(&w[1])));
}

#[test]
fn output_is_independent_of_input_order() {
    let base: Vec<PvState> = mixed_set().into_iter().take(6).collect();
    let want = plan_cleanup(&base, &no_busy());
    for perm in permutations(&base) {
        assert_eq!(plan_cleanup(&perm, &no_busy()), want);
    }
    let busy = BTreeSet::from(["uid-c-withdraw".to_string()]);
    let want_busy = plan_cleanup(&base, &busy);
    for perm in permutations(&base) {
        assert_eq!(plan_cleanup(&perm, &busy), want_busy);
    }

    let mut states = all_states();
    let want = plan_cleanup(&states, &no_busy());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20 {
        rng.shuffle(&mut states);
        assert_eq!(plan_cleanup(&states, &no_busy()), want);
    }
    states.reverse();
    assert_eq!(plan_cleanup(&states, &no_busy()), want);
}

#[test]
fn each_pv_gets_at_most_one_action() {
    let states = all_states();
    let actions = plan_cleanup(&states, &no_busy());
    let names: Vec<&str> = actions.iter().map(action_name).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(names.len(), unique.len());
    assert!(actions.len() < states.len());
}

#[test]
fn empty_input_plans_nothing() {
    assert_eq!(plan_cleanup(&[], &no_busy()), Vec::new());
    assert_eq!(plan_cleanup(&[], &BTreeSet::from(["x".to_string()])), Vec::new());
}

#[test]
fn wipe_carries_the_pv_as_seen() {
    let mut p = claimed(pv("a", "Released", "Delete"));
    p.identity = None;
    p.host_path = "/mnt/disks/ssd0".to_string();
    let Some(CleanupAction::Wipe { pv: carried, after }) = plan1(&p) else { panic!("expected a wipe") };
    assert_eq!(after, AfterWipe::DeletePv);
    assert_eq!(carried, p);
}

// ---------------------------------------------------------------------------------------------
// Refusal texts
// ---------------------------------------------------------------------------------------------

#[test]
fn refusal_reasons_and_texts() {
    assert_eq!(Refusal::RecyclePolicy.reason(), "VolumeUnsupportedReclaimPolicy");
    assert_eq!(Refusal::UnknownPolicy("X".into()).reason(), "VolumeUnknownReclaimPolicy");
    assert_eq!(Refusal::Bound.reason(), "VolumeCleanupRefused");
    assert_eq!(Refusal::RecyclePolicy.to_string(), "Volume has unsupported PersistentVolumeReclaimPolicy: Recycle");
    assert_eq!(
        Refusal::UnknownPolicy("X".into()).to_string(),
        "Volume has unrecognized PersistentVolumeReclaimPolicy \"X\""
    );
    assert!(Refusal::Bound.to_string().contains("Bound"));
    assert!(Refusal::Bound.answers_request());
    assert!(!Refusal::RecyclePolicy.answers_request());
    assert!(!Refusal::UnknownPolicy(String::new()).answers_request());
}

// ---------------------------------------------------------------------------------------------
// PvState::from_pv
// ---------------------------------------------------------------------------------------------

#[test]
fn naming_constants_are_the_documented_strings() {
    assert_eq!(FINALIZER_WIPE, "local-static-provisioner.io/wipe");
    assert_eq!(ANN_CLEANUP, "local-static-provisioner.io/cleanup");
    assert_eq!(CLEANUP_REQUESTED, "requested");
    assert_eq!(ANN_CLEANUP_RESULT, "local-static-provisioner.io/cleanup-result");
    assert_eq!(ANN_VOLUME_IDENTITY, "local-static-provisioner.io/volume-identity");
    assert_eq!(ANN_IDENTITY_CONFIRMED, "local-static-provisioner.io/identity-confirmed");
}

fn full_pv_json() -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "local-pv-aaaafef5",
            "uid": "0b6c9a5e-1111-4222-8333-444455556666",
            "resourceVersion": "98765",
            "deletionTimestamp": "2024-05-01T12:00:00Z",
            "finalizers": ["kubernetes.io/pv-protection", "local-static-provisioner.io/wipe", "example.com/other"],
            "annotations": {
                "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-u1",
                "local-static-provisioner.io/cleanup": "requested",
                "local-static-provisioner.io/cleanup-result": "refused: earlier",
                "local-static-provisioner.io/cleanup-requested-at": "2026-11-24T08:00:00Z",
                "local-static-provisioner.io/volume-identity": "wwn-0x5000c500a1b2c3d4",
                "local-static-provisioner.io/identity-confirmed": "v2;fs;uuid=u;ino=2;dev=252:1"
            },
            "labels": {"local-static-provisioner.io/node": "n1"}
        },
        "spec": {
            "capacity": {"storage": "100Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "fast-disks",
            "local": {"path": "/mnt/fast-disks/ssd0"},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "db", "name": "data-0", "uid": "c-1"}
        },
        "status": {"phase": "Released"}
    })
}

#[test]
fn from_pv_extracts_every_field() {
    let state = PvState::from_pv(&pv_json(full_pv_json()));
    assert_eq!(
        state,
        PvState {
            name: "local-pv-aaaafef5".to_string(),
            uid: "0b6c9a5e-1111-4222-8333-444455556666".to_string(),
            resource_version: "98765".to_string(),
            phase: "Released".to_string(),
            reclaim_policy: "Delete".to_string(),
            deleting: true,
            has_finalizer: true,
            claimed: true,
            cleanup_requested: true,
            cleanup_result: Some("refused: earlier".to_string()),
            cleanup_requested_at: Some("2026-11-24T08:00:00Z".to_string()),
            host_path: "/mnt/fast-disks/ssd0".to_string(),
            class: "fast-disks".to_string(),
            identity: Some("wwn-0x5000c500a1b2c3d4".to_string()),
            identity_confirmed: Some("v2;fs;uuid=u;ino=2;dev=252:1".to_string()),
            flagged_missing: false,
            flagged_stale: false,
            moved_to: None,
            disk_failing: None,
            claim: Some(("db".into(), "data-0".into(), "c-1".into())),
            // Made before fences: its affinity does not require the fence label's absence.
            honours_fence: false,
            capacity_bytes: Some(100 << 30),
            encryption: None,
            wipe_history: Vec::new(),
        }
    );
    // And the planner reads it as a used PV being deleted: wipe, then let it go.
    assert_eq!(plan1(&state), wipe(&state, AfterWipe::RemoveFinalizer));
}

#[test]
fn from_pv_negative_fields() {
    let mut v = full_pv_json();
    let meta = v["metadata"].as_object_mut().unwrap();
    meta.remove("deletionTimestamp");
    meta.insert("finalizers".into(), json!(["kubernetes.io/pv-protection", "local-static-provisioner.io/wipe-old"]));
    meta.insert("annotations".into(), json!({"pv.kubernetes.io/provisioned-by": "x"}));
    v["spec"].as_object_mut().unwrap().remove("claimRef");
    v["status"]["phase"] = json!("Available");
    let state = PvState::from_pv(&pv_json(v));
    assert!(!state.deleting);
    assert!(!state.has_finalizer, "only the exact finalizer counts");
    assert!(!state.claimed);
    assert!(!state.cleanup_requested);
    assert_eq!(state.cleanup_result, None);
    assert_eq!(state.identity, None);
    assert_eq!(state.identity_confirmed, None);
    assert_eq!(state.phase, "Available");
    assert_eq!(state.host_path, "/mnt/fast-disks/ssd0");
    // Not ours yet: adopt it.
    assert_eq!(plan1(&state), Some(CleanupAction::AddFinalizer { name: "local-pv-aaaafef5".to_string() }));
}

#[test]
fn from_pv_only_requested_means_requested() {
    for value in ["Requested", "REQUESTED", "requested ", " requested", "true", "yes", "", "done"] {
        let mut v = full_pv_json();
        v["metadata"]["annotations"]["local-static-provisioner.io/cleanup"] = json!(value);
        assert!(!PvState::from_pv(&pv_json(v)).cleanup_requested, "{value:?}");
    }
    let mut v = full_pv_json();
    v["metadata"]["annotations"]["local-static-provisioner.io/cleanup"] = json!("requested");
    assert!(PvState::from_pv(&pv_json(v)).cleanup_requested);
}

#[test]
fn from_pv_finalizer_alone_or_absent() {
    let mut v = full_pv_json();
    v["metadata"]["finalizers"] = json!(["local-static-provisioner.io/wipe"]);
    assert!(PvState::from_pv(&pv_json(v.clone())).has_finalizer);
    v["metadata"]["finalizers"] = json!([]);
    assert!(!PvState::from_pv(&pv_json(v.clone())).has_finalizer);
    v["metadata"].as_object_mut().unwrap().remove("finalizers");
    assert!(!PvState::from_pv(&pv_json(v)).has_finalizer);
}

#[test]
fn from_pv_missing_status_and_spec_gives_defaults() {
    let state = PvState::from_pv(&pv_json(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "bare", "uid": "u-bare", "resourceVersion": "1"}
    })));
    assert_eq!(
        state,
        PvState {
            name: "bare".to_string(),
            uid: "u-bare".to_string(),
            resource_version: "1".to_string(),
            ..PvState::default()
        }
    );
    assert_eq!(plan1(&state), Some(CleanupAction::AddFinalizer { name: "bare".to_string() }));

    // Completely empty object.
    let empty = PvState::from_pv(&pv_json(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {}})));
    assert_eq!(empty, PvState::default());

    // Spec without local source, class or policy; status without phase.
    let state = PvState::from_pv(&pv_json(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "hostpath", "finalizers": ["local-static-provisioner.io/wipe"]},
        "spec": {"hostPath": {"path": "/tmp/x"}},
        "status": {}
    })));
    assert_eq!(state.host_path, "");
    assert_eq!(state.class, "");
    assert_eq!(state.reclaim_policy, "");
    assert_eq!(state.phase, "");
    assert!(!state.claimed);
    assert!(state.has_finalizer);
}

#[test]
fn from_pv_of_a_bound_pv_never_plans_a_wipe() {
    for del in [false, true] {
        for req in [false, true] {
            let mut v = full_pv_json();
            v["status"]["phase"] = json!("Bound");
            if !del {
                v["metadata"].as_object_mut().unwrap().remove("deletionTimestamp");
            }
            v["metadata"]["annotations"]["local-static-provisioner.io/cleanup"] =
                json!(if req { "requested" } else { "no" });
            let state = PvState::from_pv(&pv_json(v));
            assert_eq!((state.deleting, state.cleanup_requested), (del, req));
            let action = plan1(&state);
            assert!(
                !matches!(action, Some(CleanupAction::Wipe { .. } | CleanupAction::Withdraw { .. })),
                "{state:?} -> {action:?}"
            );
        }
    }
}
