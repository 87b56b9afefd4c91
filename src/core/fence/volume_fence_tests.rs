use super::*;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity};

const SEEN: [Seen; 5] = [Seen::Own, Seen::NotItsDisk, Seen::Missing, Seen::NoAnswer, Seen::KeyUnavailable];
/// Label values a PV's key may have on the node before the pass (None: absent; "odd": a value
/// set by hand).
const BEFORE: [Option<&str>; 6] =
    [None, Some("not-its-disk"), Some("disk-missing"), Some("unverified"), Some("key-unavailable"), Some("odd")];

fn apply(labels: &BTreeMap<String, String>, plan: &FencePlan) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    for (k, v) in &plan.labels {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    out
}

fn key(name: &str) -> String {
    fence_key(name).unwrap()
}

/// Every combination for two PVs (each: honours or not, what was seen, its label before) and
/// the node-wide label up or not, plus a stray fence label of a PV that is gone and a label
/// that is not ours: the labels after the plan are exactly what the rule says, events match
/// the changes, and a second plan on the result changes nothing.
#[test]
fn every_combination_ends_in_exactly_the_fences_the_rule_asks_for() {
    let mut cases = 0;
    for node_wide in [false, true] {
        for honours in [[true, true], [true, false]] {
            for seen_a in SEEN {
                for seen_b in SEEN {
                    for before_a in BEFORE {
                        for before_b in BEFORE {
                            let pvs = [("pv-a", honours[0], seen_a, before_a), ("pv-b", honours[1], seen_b, before_b)];
                            let mut labels = BTreeMap::from([
                                ("kubernetes.io/hostname".to_string(), "n1".to_string()),
                                (key("pv-gone"), "not-its-disk".to_string()),
                            ]);
                            if node_wide {
                                labels.insert(LABEL_VOLUMES_UNVERIFIED.into(), AGENT_STOPPED.into());
                            }
                            for (name, _, _, before) in pvs {
                                if let Some(v) = before {
                                    labels.insert(key(name), v.to_string());
                                }
                            }
                            let inputs: Vec<FenceInput> = pvs
                                .iter()
                                .map(|(name, honours, seen, _)| FenceInput {
                                    name: name.to_string(),
                                    honours: *honours,
                                    seen: *seen,
                                })
                                .collect();
                            let plan = plan_fences(&inputs, &labels);
                            let after = apply(&labels, &plan);
                            let ctx = format!("{pvs:?} node_wide={node_wide}");
                            assert_eq!(after.get("kubernetes.io/hostname").map(String::as_str), Some("n1"), "{ctx}");
                            assert!(!after.contains_key(LABEL_VOLUMES_UNVERIFIED), "node-wide fence lifted: {ctx}");
                            assert!(!after.contains_key(&key("pv-gone")), "stray fence removed: {ctx}");
                            for (name, honours, seen, before) in pvs {
                                let want = match (honours, seen) {
                                    (false, _) => None,
                                    (true, Seen::Own) => None,
                                    (true, Seen::NotItsDisk) => Some("not-its-disk"),
                                    (true, Seen::Missing) => Some("disk-missing"),
                                    (true, Seen::KeyUnavailable) => Some("key-unavailable"),
                                    (true, Seen::NoAnswer) => match before {
                                        Some("odd") => Some("unverified"),
                                        Some(v) => Some(v),
                                        None if node_wide => Some("unverified"),
                                        None => None,
                                    },
                                };
                                assert_eq!(after.get(&key(name)).map(String::as_str), want, "{name}: {ctx}");
                                let reason_before = before.map(FenceReason::from_label_value);
                                let reason_after = want.map(FenceReason::from_label_value);
                                let fenced = plan.fenced.iter().any(|(n, _)| n == name);
                                assert_eq!(
                                    fenced,
                                    reason_after.is_some() && reason_after != reason_before,
                                    "fenced event for {name}: {ctx}"
                                );
                                let lifted = plan.lifted.iter().any(|n| n == name);
                                assert_eq!(
                                    lifted,
                                    honours && before.is_some() && want.is_none(),
                                    "lifted {name}: {ctx}"
                                );
                                assert_eq!(plan.in_force.get(name).copied(), reason_after, "in force {name}: {ctx}");
                            }
                            // Level-triggered: the same inputs on the labels it produced change nothing.
                            let again = plan_fences(&inputs, &after);
                            assert!(
                                again.labels.is_empty() && again.fenced.is_empty() && again.lifted.is_empty(),
                                "{ctx}"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 2 * SEEN.len() * SEEN.len() * BEFORE.len() * BEFORE.len());
}

#[test]
fn only_what_changes_is_written() {
    let labels = BTreeMap::from([(key("a"), "not-its-disk".to_string())]);
    let still = [FenceInput { name: "a".into(), honours: true, seen: Seen::NotItsDisk }];
    assert_eq!(
        plan_fences(&still, &labels),
        FencePlan { in_force: BTreeMap::from([("a".to_string(), FenceReason::NotItsDisk)]), ..Default::default() }
    );
    assert_eq!(plan_fences(&[], &BTreeMap::new()), FencePlan::default());
}

#[test]
fn fence_keys_are_label_names_or_nothing() {
    assert_eq!(fence_key("local-pv-aaaafef5").as_deref(), Some("fence.local-static-provisioner.io/local-pv-aaaafef5"));
    assert_eq!(fence_key(&"a".repeat(63)).map(|k| k.len()), Some(FENCE_PREFIX.len() + 63));
    for bad in ["", "-a", "a-", "a/b", "a b", "é", &"a".repeat(64)] {
        assert_eq!(fence_key(bad), None, "{bad:?}");
    }
}

fn affinity(terms: Vec<Vec<NodeSelectorRequirement>>) -> VolumeNodeAffinity {
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                .collect(),
        }),
    }
}

#[test]
fn a_pv_honours_its_fence_only_when_every_term_requires_it() {
    let host = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "In".into(),
        values: Some(vec!["n1".into()]),
    };
    let with = |mut e: Vec<NodeSelectorRequirement>| {
        e.extend(fence_requirements("pv-a"));
        e
    };
    assert!(honours_fence("pv-a", Some(&affinity(vec![with(vec![host.clone()])]))));
    assert!(honours_fence("pv-a", Some(&affinity(vec![with(vec![host.clone()]), with(vec![])]))));
    // A term without it (a class selector term of an older PV) lets pods mount it anyway.
    assert!(!honours_fence("pv-a", Some(&affinity(vec![with(vec![host.clone()]), vec![host.clone()]]))));
    // Another PV's fence, or none at all (upstream's PVs), is not this one's.
    assert!(!honours_fence("pv-b", Some(&affinity(vec![with(vec![host.clone()])]))));
    assert!(!honours_fence("pv-a", Some(&affinity(vec![vec![host.clone()]]))));
    assert!(!honours_fence("pv-a", Some(&affinity(vec![]))));
    assert!(!honours_fence("pv-a", None));
    // Exists (the opposite) does not count.
    let exists = NodeSelectorRequirement { key: key("pv-a"), operator: "Exists".into(), values: None };
    assert!(!honours_fence("pv-a", Some(&affinity(vec![vec![host, exists]]))));
}

#[test]
fn the_requirements_name_both_labels() {
    let keys: Vec<String> = fence_requirements("pv-a").into_iter().map(|r| r.key).collect();
    assert_eq!(keys, vec![key("pv-a"), LABEL_VOLUMES_UNVERIFIED.to_string()]);
    // A name that cannot be a label still gets the node-wide one.
    let keys: Vec<String> = fence_requirements(&"x".repeat(70)).into_iter().map(|r| r.key).collect();
    assert_eq!(keys, vec![LABEL_VOLUMES_UNVERIFIED.to_string()]);
}

#[test]
fn an_agent_stops_with_the_node_wide_fence_only_when_a_pv_honours_it() {
    let pv = |honours| FenceInput { name: "a".into(), honours, seen: Seen::Own };
    assert_eq!(stop_label(&[pv(false), pv(true)]), Some((LABEL_VOLUMES_UNVERIFIED.into(), AGENT_STOPPED.into())));
    assert_eq!(stop_label(&[pv(false)]), None);
    assert_eq!(stop_label(&[]), None);
}

#[test]
fn disk_checks_map_to_what_was_seen() {
    use DiskCheck::*;
    for (check, seen) in [
        (Same, Seen::Own),
        (Plausible, Seen::Own),
        (Unrecorded, Seen::Own),
        (Unverified, Seen::Own),
        (Different, Seen::NotItsDisk),
        (Moved, Seen::NotItsDisk),
        (Missing, Seen::Missing),
    ] {
        assert_eq!(Seen::from(check), seen, "{check:?}");
    }
}

#[test]
fn only_a_terminating_pv_no_claim_ever_used_is_beyond_mounting() {
    use crate::core::wipe::cleanup::PvState;
    for (phase, claimed, deleting, want) in [
        ("Available", false, false, true),
        ("Available", false, true, false),
        ("Pending", false, true, false),
        // Being bound right now (a claimRef), or used: a pod may still get it.
        ("Available", true, true, true),
        ("Bound", true, true, true),
        ("Released", true, true, true),
        ("Released", false, true, true),
        ("Bound", true, false, true),
    ] {
        let pv = PvState { phase: phase.into(), claimed, deleting, ..Default::default() };
        assert_eq!(may_be_mounted(&pv), want, "{phase} claimed={claimed} deleting={deleting}");
    }
}

#[test]
fn a_stored_pv_keeps_whether_it_honours_its_fence_not_the_requirements() {
    let pv = |requirements: Vec<NodeSelectorRequirement>| {
        let json = serde_json::json!({
            "metadata": { "name": "pv-a" },
            "spec": { "nodeAffinity": affinity(vec![requirements]) },
        });
        serde_json::from_value::<crate::core::volumes::pv_facts::PvFacts>(json).unwrap()
    };
    let host = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "In".into(),
        values: Some(vec!["n1".into()]),
    };
    let mut fenced = vec![host.clone()];
    fenced.extend(fence_requirements("pv-a"));
    let stored = pv(fenced);
    assert!(stored.fence_honoured);
    assert_eq!(stored.spec.node_affinity, Some(affinity(vec![vec![host.clone()]])), "only the hostname term is kept");
    let old = pv(vec![host.clone()]);
    assert!(!old.fence_honoured);
    assert_eq!(old.spec.node_affinity, Some(affinity(vec![vec![host]])));
}

/// Every combination of what was told of a fence, whether the plan fences it anew, and what
/// this pass knows: the owner is told exactly when the fence is new or a known fact changed,
/// what is recorded is what the last note said, and nothing outlives the fences in force.
#[test]
fn a_fence_is_told_again_exactly_when_something_new_is_known_of_its_disks() {
    let values = [None, Some("x".to_string()), Some("y".to_string())];
    let facts: Vec<FenceFacts> = values
        .iter()
        .flat_map(|d| values.iter().map(|o| FenceFacts { disk_there_of: d.clone(), own_disk_at: o.clone() }))
        .collect();
    let reasons = [FenceReason::NotItsDisk, FenceReason::DiskMissing, FenceReason::Unverified];
    let mut told_states: Vec<Option<(FenceReason, FenceFacts)>> = vec![None];
    for r in reasons {
        told_states.extend(facts.iter().map(|f| Some((r, f.clone()))));
    }
    let mut cases = 0;
    for reason in reasons {
        for newly in [false, true] {
            for told in &told_states {
                for known in &facts {
                    let plan = FencePlan {
                        fenced: if newly { vec![("pv".into(), reason)] } else { vec![] },
                        in_force: BTreeMap::from([("pv".to_string(), reason)]),
                        ..Default::default()
                    };
                    let mut before: BTreeMap<String, (FenceReason, FenceFacts)> =
                        told.iter().map(|t| ("pv".to_string(), t.clone())).collect();
                    before.insert("lifted".into(), (FenceReason::DiskMissing, FenceFacts::default()));
                    let (tell, after) =
                        fences_to_tell(&before, &plan, &BTreeMap::from([("pv".to_string(), known.clone())]));
                    let changed = |now: &Option<String>, was: &Option<String>| now.is_some() && now != was;
                    let expected = match told {
                        _ if newly => true,
                        Some((r, was)) if *r == reason => {
                            changed(&known.disk_there_of, &was.disk_there_of)
                                || changed(&known.own_disk_at, &was.own_disk_at)
                        }
                        _ => false,
                    };
                    let ctx = format!("{reason:?} newly={newly} told={told:?} known={known:?}");
                    assert_eq!(tell, if expected { vec!["pv".to_string()] } else { vec![] }, "{ctx}");
                    assert_eq!(after.keys().collect::<Vec<_>>(), ["pv"], "only fences in force are kept: {ctx}");
                    let recorded = &after["pv"];
                    assert_eq!(recorded.0, reason, "{ctx}");
                    match told {
                        Some((r, was)) if !expected && *r == reason => assert_eq!(&recorded.1, was, "{ctx}"),
                        _ => assert_eq!(&recorded.1, known, "{ctx}"),
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 3 * 2 * 28 * 9);
}

/// A swap seen half-way (the other disk not yet mounted at the other path) and then whole: the
/// owner is told once with half the story and once with the whole; a slow disk after that
/// tells nothing; the lifted fence is forgotten.
#[test]
fn a_half_seen_swap_is_told_again_once_seen_whole() {
    let plan = |newly: bool| FencePlan {
        fenced: if newly { vec![("b".into(), FenceReason::NotItsDisk)] } else { vec![] },
        in_force: BTreeMap::from([("b".to_string(), FenceReason::NotItsDisk)]),
        ..Default::default()
    };
    let facts = |there: Option<&str>, own: Option<&str>| {
        BTreeMap::from([(
            "b".to_string(),
            FenceFacts { disk_there_of: there.map(str::to_string), own_disk_at: own.map(str::to_string) },
        )])
    };
    let (tell, told) = fences_to_tell(&BTreeMap::new(), &plan(true), &facts(None, Some("/mnt/a")));
    assert_eq!(tell, ["b"]);
    let (tell, told) = fences_to_tell(&told, &plan(false), &facts(Some("pv-a"), Some("/mnt/a")));
    assert_eq!(tell, ["b"], "the disk at its path is now known");
    let (tell, told) = fences_to_tell(&told, &plan(false), &facts(Some("pv-a"), Some("/mnt/a")));
    assert!(tell.is_empty(), "nothing new");
    let (tell, told) = fences_to_tell(&told, &plan(false), &facts(None, None));
    assert!(tell.is_empty(), "a disk that did not answer is not news");
    assert_eq!(told["b"].1.disk_there_of.as_deref(), Some("pv-a"));
    let (tell, told) = fences_to_tell(&told, &FencePlan::default(), &BTreeMap::new());
    assert!(tell.is_empty() && told.is_empty(), "lifted: forgotten");
}
