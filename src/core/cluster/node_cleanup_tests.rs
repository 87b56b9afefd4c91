use super::*;
use crate::core::volumes::pv_facts::PvFacts;

const GRACE: Duration = Duration::from_secs(600);

fn now() -> Timestamp {
    "2026-11-23T12:00:00Z".parse().unwrap()
}

fn node(name: &str) -> NodeView {
    NodeView { name: name.into(), hostname: Some(name.into()) }
}

fn classes() -> BTreeSet<String> {
    BTreeSet::from(["local".to_string()])
}

fn lpv(name: &str, node: &str, phase: &str) -> LocalPv {
    let claim = matches!(phase, "Bound" | "Released").then(|| ClaimRef {
        namespace: "ns".into(),
        name: format!("claim-{name}"),
        uid: format!("claim-uid-{name}"),
    });
    LocalPv {
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "5".into(),
        class: "local".into(),
        phase: phase.into(),
        reclaim_policy: "Delete".into(),
        claim,
        node: node.into(),
        node_label: Some(node.into()),
        deleting: false,
        has_wipe_finalizer: true,
        stale_since: None,
        moved_to: None,
        provisioned_by: PROVISIONED_BY.into(),
    }
}

const PROVISIONED_BY: &str = "local-volume-provisioner-n-0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0";

/// Every PV's stale mark has been seen by us for long enough.
fn all_seen(pvs: &[LocalPv]) -> BTreeSet<String> {
    pvs.iter().map(|pv| pv.uid.clone()).collect()
}

fn plan(nodes: &[NodeView], pvs: &[LocalPv], gone: &[&str]) -> Vec<NodeCleanupAction> {
    let gone: BTreeSet<String> = gone.iter().map(|s| s.to_string()).collect();
    plan_node_cleanup(&classes(), nodes, pvs, &gone, &all_seen(pvs), GRACE, now()).0
}

fn gone_cause(node: &str) -> Cause {
    Cause::NodeGone { node: node.into() }
}

#[test]
fn pvs_of_a_node_gone_past_the_grace_period_are_released() {
    let pvs = [lpv("a", "dead", "Bound"), lpv("b", "dead", "Available"), lpv("c", "dead", "Released")];
    let got = plan(&[node("alive")], &pvs, &["dead"]);
    assert_eq!(
        got,
        vec![
            NodeCleanupAction::DeleteClaim {
                pv: "a".into(),
                claim: ClaimRef { namespace: "ns".into(), name: "claim-a".into(), uid: "claim-uid-a".into() },
                cause: gone_cause("dead"),
            },
            NodeCleanupAction::DeletePv {
                name: "b".into(),
                uid: "uid-b".into(),
                resource_version: "5".into(),
                provisioned_by: PROVISIONED_BY.into(),
                cause: gone_cause("dead")
            },
            NodeCleanupAction::DeletePv {
                name: "c".into(),
                uid: "uid-c".into(),
                resource_version: "5".into(),
                provisioned_by: PROVISIONED_BY.into(),
                cause: gone_cause("dead")
            },
        ]
    );
}

#[test]
fn nothing_happens_within_the_grace_period() {
    let pvs = [lpv("a", "dead", "Bound"), lpv("b", "dead", "Available")];
    assert!(plan(&[node("alive")], &pvs, &[]).is_empty());
}

#[test]
fn absent_nodes_lists_only_opted_in_pvs_of_missing_nodes() {
    let mut other_class = lpv("x", "dead2", "Available");
    other_class.class = "other".into();
    let pvs = [lpv("a", "dead", "Bound"), lpv("b", "alive", "Bound"), other_class];
    assert_eq!(absent_nodes(&classes(), &[node("alive")], &pvs), BTreeSet::from(["dead".to_string()]));
}

#[test]
fn a_node_that_exists_is_never_gone_whatever_its_state() {
    // NotReady, cordoned, tainted: all still exist. Existence is all that counts, by name,
    // by hostname label, or by our node label.
    let pvs = [lpv("a", "n1", "Bound"), lpv("b", "n1", "Available")];
    for nodes in [
        vec![node("n1")],
        vec![NodeView { name: "n1".into(), hostname: None }],
        vec![NodeView { name: "machine-7".into(), hostname: Some("n1".into()) }],
    ] {
        // Even if the caller wrongly thinks it gone.
        assert!(plan(&nodes, &pvs, &["n1"]).is_empty(), "{nodes:?}");
        assert!(absent_nodes(&classes(), &nodes, &pvs).is_empty());
    }
    let mut labelled = lpv("c", "host-c", "Available");
    labelled.node_label = Some("n9".into());
    assert!(plan(&[node("n9")], &[labelled], &["host-c"]).is_empty());
}

#[test]
fn an_empty_node_list_is_never_acted_on() {
    let pvs = [lpv("a", "dead", "Bound"), lpv("b", "dead", "Available")];
    assert!(plan(&[], &pvs, &["dead"]).is_empty());
}

#[test]
fn classes_not_opted_in_are_left_alone() {
    let mut pv = lpv("a", "dead", "Bound");
    pv.class = "precious".into();
    assert!(plan(&[node("alive")], &[pv], &["dead"]).is_empty());
}

#[test]
fn retain_pvs_are_kept_and_said_so() {
    let mut pv = lpv("a", "dead", "Released");
    pv.reclaim_policy = "Retain".into();
    let got = plan(&[node("alive")], &[pv], &["dead"]);
    assert!(matches!(&got[..], [NodeCleanupAction::Keep { name, why }] if name == "a" && why.contains("Retain")));
}

#[test]
fn deleting_pvs_lose_our_finalizer_only() {
    let mut pv = lpv("a", "dead", "Released");
    pv.deleting = true;
    assert_eq!(
        plan(&[node("alive")], std::slice::from_ref(&pv), &["dead"]),
        vec![NodeCleanupAction::ReleaseFinalizer {
            name: "a".into(),
            uid: "uid-a".into(),
            provisioned_by: PROVISIONED_BY.into(),
            cause: gone_cause("dead")
        }]
    );
    pv.has_wipe_finalizer = false;
    assert!(plan(&[node("alive")], &[pv], &["dead"]).is_empty());
}

#[test]
fn a_deleting_bound_pv_gets_its_claim_deleted_first() {
    let mut pv = lpv("a", "dead", "Bound");
    pv.deleting = true;
    assert!(matches!(&plan(&[node("alive")], &[pv], &["dead"])[..], [NodeCleanupAction::DeleteClaim { .. }]));
}

#[test]
fn unsettled_phases_wait() {
    for phase in ["Pending", "Failed", ""] {
        assert!(plan(&[node("alive")], &[lpv("a", "dead", phase)], &["dead"]).is_empty(), "{phase}");
    }
    let mut bound_without_claim = lpv("b", "dead", "Bound");
    bound_without_claim.claim = None;
    assert!(plan(&[node("alive")], &[bound_without_claim], &["dead"]).is_empty());
}

#[test]
fn stale_marks_count_from_their_time_and_from_our_sighting() {
    let mut pv = lpv("a", "n1", "Bound");
    let marked: Timestamp = "2026-11-23T11:55:00Z".parse().unwrap();
    pv.stale_since = Some(Some(marked));
    let pvs = std::slice::from_ref(&pv);
    let none = BTreeSet::new();
    let plan_with = |grace: Duration, seen: &BTreeSet<String>, pvs: &[LocalPv]| {
        plan_node_cleanup(&classes(), &[node("n1")], pvs, &none, seen, grace, now())
    };
    let (actions, next) = plan_with(GRACE, &all_seen(pvs), pvs);
    assert!(actions.is_empty());
    assert_eq!(next, Some("2026-11-23T12:05:00Z".parse().unwrap()));
    let short = Duration::from_secs(300);
    let (actions, _) = plan_with(short, &all_seen(pvs), pvs);
    assert!(matches!(&actions[..], [NodeCleanupAction::DeleteClaim { cause: Cause::Stale { .. }, .. }]));
    // A mark dated long ago by a node with a wrong clock is not due before we have seen it
    // for the grace period ourselves.
    let (actions, _) = plan_with(short, &BTreeSet::new(), pvs);
    assert!(actions.is_empty());
    // An unreadable mark counts only from our own sighting.
    pv.stale_since = Some(None);
    let pvs = std::slice::from_ref(&pv);
    assert!(plan_with(short, &BTreeSet::new(), pvs).0.is_empty());
    assert!(matches!(&plan_with(short, &all_seen(pvs), pvs).0[..], [NodeCleanupAction::DeleteClaim { .. }]));
    assert_eq!(stale_pvs(&classes(), pvs), BTreeSet::from(["uid-a".to_string()]));
}

/// Exhaustive safety table: for every phase, claim, deletion, finalizer, policy, node state and
/// stale mark, a claim is deleted only when its PV is Bound to it and the node is gone past the
/// grace period (or the stale mark is older than it), and a PV is deleted only when Available
/// or Released with reclaim policy Delete.
#[test]
fn safety_table() {
    let mut cases = 0;
    for phase in ["Available", "Bound", "Released", "Pending", "Failed", ""] {
        for has_claim in [false, true] {
            for deleting in [false, true] {
                for finalizer in [false, true] {
                    for policy in ["Delete", "Retain"] {
                        for node_state in ["alive", "absent-recent", "gone"] {
                            for stale in [None, Some(0i64), Some(3600)] {
                                for opted in [false, true] {
                                    cases += 1;
                                    let node_name = if node_state == "alive" { "n1" } else { "n2" };
                                    let mut pv = lpv("p", node_name, phase);
                                    pv.claim = has_claim.then(|| ClaimRef {
                                        namespace: "ns".into(),
                                        name: "c".into(),
                                        uid: "cu".into(),
                                    });
                                    pv.deleting = deleting;
                                    pv.has_wipe_finalizer = finalizer;
                                    pv.reclaim_policy = policy.into();
                                    pv.stale_since = stale.map(|age| {
                                        Some(
                                            now()
                                                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(age))
                                                .unwrap(),
                                        )
                                    });
                                    if !opted {
                                        pv.class = "other".into();
                                    }
                                    let gone: Vec<&str> = if node_state == "gone" { vec!["n2"] } else { vec![] };
                                    let actions = plan(&[node("n1")], std::slice::from_ref(&pv), &gone);
                                    let eligible = opted
                                        && (node_state == "gone" || (node_state == "alive" && stale == Some(3600)));
                                    let ctx = format!(
                                        "{phase} claim={has_claim} deleting={deleting} fin={finalizer} {policy} \
                                         {node_state} stale={stale:?} opted={opted}: {actions:?}"
                                    );
                                    assert!(actions.len() <= 1, "{ctx}");
                                    match actions.first() {
                                        None => {}
                                        Some(NodeCleanupAction::DeleteClaim { .. }) => {
                                            assert!(eligible && phase == "Bound" && has_claim, "{ctx}")
                                        }
                                        Some(NodeCleanupAction::DeletePv { .. }) => assert!(
                                            eligible
                                                && !deleting
                                                && (phase == "Available"
                                                    || (phase == "Released" && policy == "Delete")),
                                            "{ctx}"
                                        ),
                                        Some(NodeCleanupAction::ReleaseFinalizer { .. }) => {
                                            assert!(eligible && deleting && finalizer && phase != "Bound", "{ctx}")
                                        }
                                        Some(NodeCleanupAction::Keep { .. }) => {
                                            assert!(eligible && phase == "Released" && policy == "Retain", "{ctx}")
                                        }
                                    }
                                    if !eligible {
                                        assert!(actions.is_empty(), "{ctx}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 6 * 2 * 2 * 2 * 2 * 3 * 3 * 2);
}

fn pv_json(extra: serde_json::Value) -> PvFacts {
    let mut v = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "local-pv-1",
            "uid": "u1",
            "resourceVersion": "9",
            "annotations": {"pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0"},
            "labels": {"local-static-provisioner.io/node": "n1"},
            "finalizers": ["kubernetes.io/pv-protection", "local-static-provisioner.io/wipe"]
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "local": {"path": "/mnt/disks/a"},
            "storageClassName": "local",
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"namespace": "ns", "name": "data-0", "uid": "cu1"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1"]}]}
            ]}}
        },
        "status": {"phase": "Bound"}
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

#[test]
fn extraction_from_pv_objects() {
    let pv = LocalPv::from_pv(&pv_json(serde_json::json!({}))).unwrap();
    assert_eq!(pv.node, "host-1");
    assert_eq!(pv.node_label.as_deref(), Some("n1"));
    assert_eq!(pv.claim, Some(ClaimRef { namespace: "ns".into(), name: "data-0".into(), uid: "cu1".into() }));
    assert!(pv.has_wipe_finalizer);
    assert_eq!(pv.stale_since, None);
    let stale = LocalPv::from_pv(&pv_json(serde_json::json!({"metadata": {"annotations": {
        "local-static-provisioner.io/volume-stale": "2026-11-23T11:00:00Z"}}})))
    .unwrap();
    assert_eq!(stale.stale_since, Some(Some("2026-11-23T11:00:00Z".parse().unwrap())));
    let garbled = LocalPv::from_pv(&pv_json(serde_json::json!({"metadata": {"annotations": {
        "local-static-provisioner.io/volume-stale": "yesterday"}}})))
    .unwrap();
    assert_eq!(garbled.stale_since, Some(None));
}

#[test]
fn pvs_not_made_by_a_local_static_provisioner_are_ignored() {
    let foreign =
        serde_json::json!({"metadata": {"annotations": {"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com"}}});
    assert_eq!(LocalPv::from_pv(&pv_json(foreign)), None);
    let unannotated = serde_json::json!({"metadata": {"annotations": {"pv.kubernetes.io/provisioned-by": null}}});
    assert_eq!(LocalPv::from_pv(&pv_json(unannotated)), None);
    let not_local = serde_json::json!({"spec": {"local": null, "hostPath": {"path": "/x"}}});
    assert_eq!(LocalPv::from_pv(&pv_json(not_local)), None);
    let no_affinity = serde_json::json!({"spec": {"nodeAffinity": null}});
    assert_eq!(LocalPv::from_pv(&pv_json(no_affinity)), None);
    let two_hosts = serde_json::json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}]}]}}}});
    assert_eq!(LocalPv::from_pv(&pv_json(two_hosts)), None);
    // Terms are ORed: a class selector term makes the volume usable on other nodes too.
    let shared = serde_json::json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}});
    assert_eq!(LocalPv::from_pv(&pv_json(shared)), None);
    let repeated = serde_json::json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1"]}]},
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1"]},
                              {"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}});
    assert_eq!(LocalPv::from_pv(&pv_json(repeated)).unwrap().node, "host-1");
}

/// A stale PV whose disk the agent found at another entry of its live node keeps its claim,
/// whatever its phase and however old the stale mark is; without the moved mark it goes.
#[test]
fn a_stale_pv_whose_disk_moved_on_a_live_node_is_never_released() {
    let old: Timestamp = "2026-11-20T00:00:00Z".parse().unwrap();
    for phase in ["Bound", "Released", "Available"] {
        for deleting in [false, true] {
            let mut pv = lpv("a", "alive", phase);
            pv.deleting = deleting;
            pv.stale_since = Some(Some(old));
            pv.moved_to = Some("/mnt/disks/z".into());
            let got = plan(&[node("alive")], std::slice::from_ref(&pv), &[]);
            assert!(
                got.iter().all(|a| matches!(a, NodeCleanupAction::Keep { .. })) && got.len() == 1,
                "{phase} deleting={deleting}: {got:?}"
            );
            pv.moved_to = None;
            let released = plan(&[node("alive")], std::slice::from_ref(&pv), &[]);
            assert!(released.iter().all(|a| a.cause().is_some()), "{phase}: {released:?}");
        }
    }
}
