use super::*;

use crate::core::volumes::naming::{
    ANN_PROVISIONED_BY, LABEL_HOSTNAME, LABEL_NODE, node_label_value, provisioner_name,
};
use crate::core::volumes::pv_facts::PvFacts;
use crate::core::volumes::pv_inputs::ClassPolicy;
use crate::core::volumes::volume_safety::DiskKey;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const NODE: &str = "node-1";
const UID: &str = "0b6d3a1c-uid-1";

/// This agent, UID-style provisioner name (upstream's default).
fn me() -> Identity {
    Identity {
        node: NODE.into(),
        provisioner: provisioner_name(NODE, UID, false),
        node_label: node_label_value(NODE),
        use_node_name_only: false,
    }
}

/// This agent with useNodeNameOnly.
fn me_name_only() -> Identity {
    Identity { provisioner: provisioner_name(NODE, UID, true), use_node_name_only: true, ..me() }
}

/// A PV object as we would create it (annotation + our label + local path).
fn pv_object(name: &str, path: &str, provisioned_by: &str) -> PvFacts {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "annotations": {ANN_PROVISIONED_BY: provisioned_by},
            "labels": {LABEL_NODE: node_label_value(NODE)},
        },
        "spec": {"local": {"path": path}},
    }))
    .expect("a PV")
}

/// The action that publishes `d`.
fn create(d: &DesiredPv) -> Action {
    Action::Create { name: d.name.clone(), host_path: d.host_path.clone() }
}

fn desired(name: &str, path: &str) -> DesiredPv {
    DesiredPv {
        name: name.into(),
        host_path: path.into(),
        class: "local-storage".into(),
        policy: ClassPolicy::default(),
        capacity_bytes: 0,
        identity: format!("id-of-{path}"),
        disk: DiskKey::fs(format!("dev-of-{path}"), "/"),
        in_use: None,
        used: Default::default(),
        mark_holder: None,
    }
}

/// A PV we (or upstream on this node) made, carrying our label.
fn ours(name: &str, path: &str) -> ObservedPv {
    ObservedPv {
        name: name.into(),
        host_path: Some(path.into()),
        provisioned_by: Some(me().provisioner),
        hostname_label: None,
        node_label: Some(node_label_value(NODE)),
        identity: None,
    }
}

/// A PV with an arbitrary provisioned-by annotation and no labels.
fn other(name: &str, path: Option<&str>, provisioned_by: Option<&str>) -> ObservedPv {
    ObservedPv {
        name: name.into(),
        host_path: path.map(str::to_string),
        provisioned_by: provisioned_by.map(str::to_string),
        hostname_label: None,
        node_label: None,
        identity: None,
    }
}

fn no_foreign() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// A compact, comparable rendering of a plan: "create NAME" / "refuse NAME PATH: REASON".
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create { name, .. } => format!("create {name}"),
            Action::Refuse { name, host_path, reason } => format!("refuse {name} {host_path}: {reason:?}"),
            Action::WipeFirst { name, host_path, mark, .. } => {
                format!("wipe-first {name} {host_path} (of {})", mark.pv)
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// plan: creates
// ---------------------------------------------------------------------------------------------

#[test]
fn creates_everything_when_nothing_exists() {
    let d = [
        desired("local-pv-b", "/mnt/disks/b"),
        desired("local-pv-a", "/mnt/disks/a"),
        desired("local-pv-c", "/mnt/disks/c"),
    ];
    let actions = plan(&me(), &d, &[], &no_foreign());
    assert_eq!(summary(&actions), ["create local-pv-a", "create local-pv-b", "create local-pv-c"]);
    // The object to create is exactly the desired one.
    assert_eq!(actions[0], create(&d[1]));
}

#[test]
fn empty_desired_plans_nothing() {
    assert!(plan(&me(), &[], &[ours("local-pv-a", "/mnt/disks/a")], &no_foreign()).is_empty());
}

#[test]
fn nothing_to_do_when_our_pv_exists_with_same_name_and_path() {
    let d = [desired("local-pv-a", "/mnt/disks/a")];
    assert!(plan(&me(), &d, &[ours("local-pv-a", "/mnt/disks/a")], &no_foreign()).is_empty());
}

#[test]
fn restart_is_idempotent() {
    let d = [desired("local-pv-a", "/mnt/disks/a"), desired("local-pv-b", "/mnt/disks/b")];
    let first = plan(&me(), &d, &[], &no_foreign());
    assert_eq!(first.len(), 2);
    // What the first plan created is what the watch shows on the next pass.
    let observed: Vec<ObservedPv> = first
        .iter()
        .map(|a| match a {
            Action::Create { name, host_path } => ObservedPv::from_pv(&pv_object(name, host_path, &me().provisioner)),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let second = plan(&me(), &d, &observed, &no_foreign());
    assert!(second.is_empty(), "{:?}", summary(&second));
}

#[test]
fn a_pv_of_another_node_with_the_same_path_does_not_block() {
    // Every node has /mnt/disks/a; only our own PVs count for PathInUse.
    let d = [desired("local-pv-a", "/mnt/disks/a")];
    let o = [other("local-pv-x", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-2-uid2"))];
    assert_eq!(summary(&plan(&me(), &d, &o, &no_foreign())), ["create local-pv-a"]);
}

#[test]
fn unrelated_observed_pvs_do_not_change_the_plan() {
    let d = [desired("local-pv-a", "/mnt/disks/a")];
    let o = [ours("local-pv-z", "/mnt/disks/z"), other("pvc-123", None, Some("ebs.csi.aws.com"))];
    assert_eq!(summary(&plan(&me(), &d, &o, &no_foreign())), ["create local-pv-a"]);
}

// ---------------------------------------------------------------------------------------------
// plan: refusals
// ---------------------------------------------------------------------------------------------

#[test]
fn name_taken_cases() {
    // (observed PV with the desired's name, expected owner description)
    let cases = [
        // Ours, but for another path.
        (
            ours("local-pv-a", "/mnt/disks/other"),
            "PV local-pv-a (path /mnt/disks/other, provisioned by local-volume-provisioner-node-1-0b6d3a1c-uid-1)",
        ),
        // Same path, but made by another node's provisioner (a hash collision across nodes).
        (
            other("local-pv-a", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-2-uid2")),
            "PV local-pv-a (path /mnt/disks/a, provisioned by local-volume-provisioner-node-2-uid2)",
        ),
        // Not a local PV and no annotation at all.
        (other("local-pv-a", None, None), "PV local-pv-a (path <not a local PV>, provisioned by <unknown>)"),
        // Same path, our old UID, but useNodeNameOnly is off: not ours.
        (
            other("local-pv-a", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-1-olduid")),
            "PV local-pv-a (path /mnt/disks/a, provisioned by local-volume-provisioner-node-1-olduid)",
        ),
    ];
    for (existing, owner) in cases {
        let actions =
            plan(&me(), &[desired("local-pv-a", "/mnt/disks/a")], std::slice::from_ref(&existing), &no_foreign());
        assert_eq!(
            actions,
            [Action::Refuse {
                name: "local-pv-a".into(),
                host_path: "/mnt/disks/a".into(),
                reason: Refusal::NameTaken { owner: owner.into() },
            }],
            "{existing:?}"
        );
    }
}

#[test]
fn path_in_use_by_our_pv_with_another_name() {
    let actions =
        plan(&me(), &[desired("local-pv-new", "/mnt/disks/a")], &[ours("local-pv-old", "/mnt/disks/a")], &no_foreign());
    assert_eq!(
        actions,
        [Action::Refuse {
            name: "local-pv-new".into(),
            host_path: "/mnt/disks/a".into(),
            reason: Refusal::PathInUse { pv: "local-pv-old".into() },
        }]
    );
}

#[test]
fn name_collision_on_node_creates_one_and_refuses_the_other() {
    let a = desired("local-pv-same", "/mnt/disks/a");
    let b = desired("local-pv-same", "/mnt/disks/b");
    for input in [vec![a.clone(), b.clone()], vec![b.clone(), a.clone()]] {
        let actions = plan(&me(), &input, &[], &no_foreign());
        assert_eq!(actions.len(), 2);
        assert_eq!(actions[0], create(&a));
        assert_eq!(
            actions[1],
            Action::Refuse {
                name: "local-pv-same".into(),
                host_path: "/mnt/disks/b".into(),
                reason: Refusal::NameCollisionOnNode { other_path: "/mnt/disks/a".into() },
            }
        );
    }
}

#[test]
fn three_way_name_collision_refuses_both_later_paths_against_the_first() {
    let d = [desired("n", "/mnt/c"), desired("n", "/mnt/a"), desired("n", "/mnt/b")];
    let s = summary(&plan(&me(), &d, &[], &no_foreign()));
    assert_eq!(
        s,
        [
            "create n",
            "refuse n /mnt/b: NameCollisionOnNode { other_path: \"/mnt/a\" }",
            "refuse n /mnt/c: NameCollisionOnNode { other_path: \"/mnt/a\" }",
        ]
    );
}

#[test]
fn name_collision_keeps_the_already_published_volume() {
    // local-pv-same is published for /mnt/disks/b. A new entry /mnt/disks/a hashes to the same
    // name. The published volume must stay quiet (it is published); only the newcomer is
    // refused. Actually: /mnt/disks/a sorts first, is refused as NameTaken by our own PV, and
    // then /mnt/disks/b is refused as NameCollisionOnNode with /mnt/disks/a, so the agent emits
    // "volume at /mnt/disks/b not published" for a volume that is published.
    let d = [desired("local-pv-same", "/mnt/disks/a"), desired("local-pv-same", "/mnt/disks/b")];
    let o = [ours("local-pv-same", "/mnt/disks/b")];
    let actions = plan(&me(), &d, &o, &no_foreign());
    assert_eq!(actions.len(), 1, "{:?}", summary(&actions));
    match &actions[0] {
        Action::Refuse { host_path, .. } => assert_eq!(host_path, "/mnt/disks/a"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn duplicate_desired_with_same_path_is_planned_once() {
    let d = [desired("local-pv-a", "/mnt/disks/a"), desired("local-pv-a", "/mnt/disks/a")];
    assert_eq!(summary(&plan(&me(), &d, &[], &no_foreign())), ["create local-pv-a"]);
    // Same path under two names (should not happen after validation): the first name wins.
    let d = [desired("local-pv-b", "/mnt/disks/a"), desired("local-pv-a", "/mnt/disks/a")];
    assert_eq!(summary(&plan(&me(), &d, &[], &no_foreign())), ["create local-pv-a"]);
}

#[test]
fn foreign_names_are_refused_with_the_recorded_owner() {
    let foreign = BTreeMap::from([("local-pv-a".to_string(), "PV local-pv-a on node-9".to_string())]);
    let d = [desired("local-pv-a", "/mnt/disks/a"), desired("local-pv-b", "/mnt/disks/b")];
    let actions = plan(&me(), &d, &[], &foreign);
    assert_eq!(
        actions,
        [
            Action::Refuse {
                name: "local-pv-a".into(),
                host_path: "/mnt/disks/a".into(),
                reason: Refusal::NameTaken { owner: "PV local-pv-a on node-9".into() },
            },
            create(&d[1]),
        ]
    );
}

#[test]
fn foreign_entry_is_ignored_once_the_pv_is_observed_as_ours() {
    let foreign = BTreeMap::from([("local-pv-a".to_string(), "someone".to_string())]);
    let actions =
        plan(&me(), &[desired("local-pv-a", "/mnt/disks/a")], &[ours("local-pv-a", "/mnt/disks/a")], &foreign);
    assert!(actions.is_empty(), "{:?}", summary(&actions));
}

#[test]
fn plan_is_sorted_and_independent_of_input_order() {
    let d = vec![
        desired("local-pv-e", "/mnt/disks/e"),
        desired("local-pv-a", "/mnt/disks/a"),
        desired("local-pv-c", "/mnt/disks/c"),  // name taken (ours at another path)
        desired("local-pv-d", "/mnt/disks/d"),  // path in use
        desired("local-pv-b", "/mnt/disks/b2"), // name collision with b1
        desired("local-pv-b", "/mnt/disks/b1"),
        desired("local-pv-f", "/mnt/disks/f"), // already exists
    ];
    let o = vec![
        ours("local-pv-c", "/mnt/disks/elsewhere"),
        ours("local-pv-old", "/mnt/disks/d"),
        ours("local-pv-f", "/mnt/disks/f"),
    ];
    let want = [
        "create local-pv-a",
        "create local-pv-b",
        "refuse local-pv-b /mnt/disks/b2: NameCollisionOnNode { other_path: \"/mnt/disks/b1\" }",
        "refuse local-pv-c /mnt/disks/c: NameTaken { owner: \"PV local-pv-c (path /mnt/disks/elsewhere, provisioned by local-volume-provisioner-node-1-0b6d3a1c-uid-1)\" }",
        "refuse local-pv-d /mnt/disks/d: PathInUse { pv: \"local-pv-old\" }",
        "create local-pv-e",
    ];
    let base = plan(&me(), &d, &o, &no_foreign());
    assert_eq!(summary(&base), want);
    // Every rotation and the reversal of both inputs give the identical plan.
    for r in 0..d.len() {
        let mut dd = d.clone();
        dd.rotate_left(r);
        let mut oo = o.clone();
        oo.rotate_left(r % o.len());
        assert_eq!(plan(&me(), &dd, &oo, &no_foreign()), base, "rotation {r}");
        dd.reverse();
        oo.reverse();
        assert_eq!(plan(&me(), &dd, &oo, &no_foreign()), base, "reversed rotation {r}");
    }
}

#[test]
fn node_name_only_treats_old_uid_style_pvs_as_ours() {
    let mut old = other("local-pv-a", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-1-olduid"));
    old.hostname_label = Some(NODE.into());
    assert!(plan(&me_name_only(), &[desired("local-pv-a", "/mnt/disks/a")], &[old.clone()], &no_foreign()).is_empty());
    // And it also blocks another name for that path.
    let actions = plan(&me_name_only(), &[desired("local-pv-b", "/mnt/disks/a")], &[old.clone()], &no_foreign());
    assert_eq!(summary(&actions), ["refuse local-pv-b /mnt/disks/a: PathInUse { pv: \"local-pv-a\" }"]);
    // With the hostname label of another node it is not ours.
    old.hostname_label = Some("node-2".into());
    let actions = plan(&me_name_only(), &[desired("local-pv-a", "/mnt/disks/a")], &[old], &no_foreign());
    assert!(
        matches!(&actions[..], [Action::Refuse { reason: Refusal::NameTaken { .. }, .. }]),
        "{:?}",
        summary(&actions)
    );
}

#[test]
fn refusal_messages() {
    let cases = [
        (
            Refusal::NameCollisionOnNode { other_path: "/mnt/disks/a".into() },
            "its PV name collides with the volume at /mnt/disks/a on this node",
        ),
        (Refusal::NameTaken { owner: "PV x".into() }, "its PV name is already used by PV x; refusing to overwrite it"),
        (Refusal::PathInUse { pv: "local-pv-1".into() }, "the path is already published as PV local-pv-1"),
    ];
    for (r, want) in cases {
        assert_eq!(r.to_string(), want);
    }
}

// ---------------------------------------------------------------------------------------------
// Ownership and adoption
// ---------------------------------------------------------------------------------------------

#[test]
fn identity_owns_table() {
    // (annotation, hostname label, owned by me(), owned by me_name_only())
    let cases: [(Option<&str>, Option<&str>, bool, bool); 10] = [
        (Some("local-volume-provisioner-node-1-0b6d3a1c-uid-1"), None, true, false),
        (Some("local-volume-provisioner-node-1-0b6d3a1c-uid-1"), Some("node-1"), true, true),
        (Some("local-volume-provisioner-node-1"), None, false, true),
        (Some("local-volume-provisioner-node-1"), Some("node-2"), false, true),
        (Some("local-volume-provisioner-node-1-otheruid"), Some("node-1"), false, true),
        (Some("local-volume-provisioner-node-1-otheruid"), Some("node-2"), false, false),
        (Some("local-volume-provisioner-node-1-otheruid"), None, false, false),
        (Some("local-volume-provisioner-node-10-uid"), Some("node-1"), false, false),
        (Some("local-volume-provisioner-node-2-uid"), Some("node-1"), false, false),
        (None, Some("node-1"), false, false),
    ];
    for (ann, host, uid_mode, name_mode) in cases {
        let pv = ObservedPv {
            name: "pv".into(),
            host_path: Some("/mnt/disks/a".into()),
            provisioned_by: ann.map(str::to_string),
            hostname_label: host.map(str::to_string),
            node_label: None,
            identity: None,
        };
        assert_eq!(me().owns(&pv), uid_mode, "uid mode: {ann:?} {host:?}");
        assert_eq!(me_name_only().owns(&pv), name_mode, "name-only mode: {ann:?} {host:?}");
    }
}

#[test]
fn adoption_picks_only_our_unlabelled_pvs_sorted() {
    let mut wrong_label = ours("local-pv-c", "/mnt/disks/c");
    wrong_label.node_label = Some("node-2".into());
    let mut upstream_made = ours("local-pv-b", "/mnt/disks/b");
    upstream_made.node_label = None;
    let mut upstream_made_2 = ours("local-pv-a", "/mnt/disks/a");
    upstream_made_2.node_label = None;
    let all = [
        wrong_label,
        ours("local-pv-labelled", "/mnt/disks/l"),
        upstream_made,
        other("local-pv-other-node", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-2-u")),
        other("local-pv-no-ann", Some("/mnt/disks/z"), None),
        other("local-pv-old-uid", Some("/mnt/disks/o"), Some("local-volume-provisioner-node-1-olduid")),
        upstream_made_2,
    ];
    assert_eq!(plan_adoption(&me(), &all), ["local-pv-a", "local-pv-b", "local-pv-c"]);
}

#[test]
fn adoption_with_use_node_name_only() {
    let pv = |name: &str, ann: &str, host: Option<&str>| ObservedPv {
        name: name.into(),
        host_path: Some(format!("/mnt/disks/{name}")),
        provisioned_by: Some(ann.into()),
        hostname_label: host.map(str::to_string),
        node_label: None,
        identity: None,
    };
    let all = [
        pv("e-short", "local-volume-provisioner-node-1", None), // exact name-only annotation
        pv("d-uid-host", "local-volume-provisioner-node-1-0b6d3a1c-uid-1", Some("node-1")), // UID-style, label ok
        pv("c-uid-other-host", "local-volume-provisioner-node-1-0b6d3a1c-uid-1", Some("node-2")),
        pv("b-uid-no-host", "local-volume-provisioner-node-1-0b6d3a1c-uid-1", None),
        pv("a-prefix-node", "local-volume-provisioner-node-10-u", Some("node-1")),
        pv("f-old-uid-host", "local-volume-provisioner-node-1-olduid", Some("node-1")),
    ];
    assert_eq!(plan_adoption(&me_name_only(), &all), ["d-uid-host", "e-short", "f-old-uid-host"]);
    // Without useNodeNameOnly only the exact UID-style annotation counts.
    assert_eq!(plan_adoption(&me(), &all), ["b-uid-no-host", "c-uid-other-host", "d-uid-host"]);
}

#[test]
fn adoption_of_nothing() {
    assert!(plan_adoption(&me(), &[]).is_empty());
    assert!(plan_adoption(&me(), &[ours("a", "/x"), ours("b", "/y")]).is_empty());
}

#[test]
fn classify_existing_cases() {
    let d = desired("local-pv-a", "/mnt/disks/a");
    let mut unlabelled = ours("local-pv-a", "/mnt/disks/a");
    unlabelled.node_label = None;
    let mut other_label = ours("local-pv-a", "/mnt/disks/a");
    other_label.node_label = Some("node-2".into());
    let cases = [
        (ours("local-pv-a", "/mnt/disks/a"), ExistingPv::Ours { needs_label: false }),
        (unlabelled, ExistingPv::Ours { needs_label: true }),
        (other_label, ExistingPv::Ours { needs_label: true }),
        (
            ours("local-pv-a", "/mnt/disks/b"),
            ExistingPv::Foreign {
                owner:
                    "PV local-pv-a (path /mnt/disks/b, provisioned by local-volume-provisioner-node-1-0b6d3a1c-uid-1)"
                        .into(),
            },
        ),
        (
            other("local-pv-a", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-7-u7")),
            ExistingPv::Foreign {
                owner: "PV local-pv-a (path /mnt/disks/a, provisioned by local-volume-provisioner-node-7-u7)".into(),
            },
        ),
        (
            other("local-pv-a", None, None),
            ExistingPv::Foreign { owner: "PV local-pv-a (path <not a local PV>, provisioned by <unknown>)".into() },
        ),
    ];
    for (existing, want) in cases {
        assert_eq!(classify_existing(&me(), &d, &existing), want, "{existing:?}");
    }
}

#[test]
fn classify_existing_in_node_name_only_mode() {
    let d = desired("local-pv-a", "/mnt/disks/a");
    let mut old = other("local-pv-a", Some("/mnt/disks/a"), Some("local-volume-provisioner-node-1-olduid"));
    old.hostname_label = Some(NODE.into());
    assert_eq!(classify_existing(&me_name_only(), &d, &old), ExistingPv::Ours { needs_label: true });
    assert!(matches!(classify_existing(&me(), &d, &old), ExistingPv::Foreign { .. }));
}

// ---------------------------------------------------------------------------------------------
// ObservedPv::from_pv
// ---------------------------------------------------------------------------------------------

#[test]
fn observed_from_full_pv() {
    let pv: PvFacts = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "local-pv-a",
            "annotations": {ANN_PROVISIONED_BY: "local-volume-provisioner-node-1-u", "unrelated": "y"},
            "labels": {LABEL_NODE: node_label_value(NODE), LABEL_HOSTNAME: "node-1", "other": "x"},
        },
        "spec": {"local": {"path": "/mnt/disks/a"}},
    }))
    .expect("a PV");
    assert_eq!(
        ObservedPv::from_pv(&pv),
        ObservedPv {
            name: "local-pv-a".into(),
            host_path: Some("/mnt/disks/a".into()),
            provisioned_by: Some("local-volume-provisioner-node-1-u".into()),
            hostname_label: Some("node-1".into()),
            node_label: Some("node-1".into()),
            identity: None,
        }
    );
}

#[test]
fn observed_from_empty_pv() {
    assert_eq!(
        ObservedPv::from_pv(&PvFacts::default()),
        ObservedPv {
            name: String::new(),
            host_path: None,
            provisioned_by: None,
            hostname_label: None,
            node_label: None,
            identity: None,
        }
    );
}

#[test]
fn observed_from_non_local_pv() {
    // Decoded as the watch decodes it: the NFS source is not even kept.
    let pv: PvFacts = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nfs-1"},
        "spec": {"nfs": {"path": "/export", "server": "nfs.example"}, "storageClassName": "nfs"}
    }))
    .unwrap();
    let o = ObservedPv::from_pv(&pv);
    assert_eq!(o.name, "nfs-1");
    assert_eq!(o.host_path, None);
    assert_eq!(o.provisioned_by, None);
    assert!(!me().owns(&o));
}

#[test]
fn path_in_use_names_the_same_pv_regardless_of_observed_order() {
    // Two of our PVs share a path (e.g. one made by upstream, one by an older version of us).
    // The watch store returns them in arbitrary order; the refusal must not flip between
    // passes (each flip re-emits the "not published" event because the reason text changes).
    let d = [desired("local-pv-new", "/mnt/disks/a")];
    let o = [ours("local-pv-y", "/mnt/disks/a"), ours("local-pv-x", "/mnt/disks/a")];
    let mut rev = o.clone();
    rev.reverse();
    assert_eq!(plan(&me(), &d, &o, &no_foreign()), plan(&me(), &d, &rev, &no_foreign()));
}

const OLD_UID: &str = "11111111-2222-4333-8444-555566667777";

#[test]
fn predecessors_are_pvs_of_the_same_node_name_with_another_uuid() {
    let old = other("local-pv-old", Some("/mnt/disks/o"), Some(&format!("local-volume-provisioner-node-1-{OLD_UID}")));
    assert!(me().is_predecessor(&old));
    assert!(!me().owns(&old));
    // Our own PVs, other nodes' PVs (even ones whose name extends ours) and foreign PVs are not.
    assert!(!me().is_predecessor(&ours("local-pv-mine", "/mnt/disks/m")));
    let longer = other("x", Some("/x"), Some(&format!("local-volume-provisioner-node-10-{OLD_UID}")));
    assert!(!me().is_predecessor(&longer));
    let dashed = other("y", Some("/y"), Some(&format!("local-volume-provisioner-node-1-b-{OLD_UID}")));
    assert!(!me().is_predecessor(&dashed));
    assert!(!me().is_predecessor(&other("z", Some("/z"), None)));
    // In node-name-only mode a UID-style PV of this node that we own (hostname label agrees) is
    // ours, one without the label is a predecessor.
    let mut labelled = old.clone();
    labelled.hostname_label = Some(NODE.into());
    assert!(me_name_only().owns(&labelled) && !me_name_only().is_predecessor(&labelled));
    assert!(me_name_only().is_predecessor(&old));
}

#[test]
fn adoption_labels_unlabelled_predecessors_too() {
    let old = other("local-pv-old", Some("/mnt/disks/o"), Some(&format!("local-volume-provisioner-node-1-{OLD_UID}")));
    let mut labelled_old = old.clone();
    labelled_old.name = "local-pv-old-labelled".into();
    labelled_old.node_label = Some(node_label_value(NODE));
    assert_eq!(plan_adoption(&me(), &[old, labelled_old]), ["local-pv-old"]);
}

#[test]
fn a_predecessor_pv_blocks_its_name_until_succession_decides() {
    // The agent drops desired volumes named like a predecessor PV before planning; if one got
    // through, the planner still never overwrites it.
    let old = other("local-pv-a", Some("/mnt/disks/a"), Some(&format!("local-volume-provisioner-node-1-{OLD_UID}")));
    let actions = plan(&me(), &[desired("local-pv-a", "/mnt/disks/a")], &[old], &no_foreign());
    assert!(matches!(&actions[..], [Action::Refuse { reason: Refusal::NameTaken { .. }, .. }]));
}

/// Every combination of three volumes over a small universe of disks (two directories of one
/// filesystem, nested directories, the whole filesystem, its block device, another disk),
/// each published or not and in use or not: the plan never publishes two volumes that share
/// data, never a second path for a published disk, never a device the host uses, and
/// publishes every volume that is alone on its disk (devices the host uses do not count).
#[test]
fn one_disk_is_published_at_most_once_in_every_combination() {
    let fs = |d: &str, r: &str| DiskKey::fs(d, r);
    let universe =
        [fs("8:1", "/"), fs("8:1", "/x"), fs("8:1", "/x/y"), fs("8:1", "/z"), DiskKey::block("8:1"), fs("8:2", "/")];
    let paths = ["/mnt/disks/a", "/mnt/disks/b", "/mnt/disks/c"];
    let n = universe.len();
    let mut cases = 0;
    for disks in 0..n * n * n {
        let keys = [&universe[disks % n], &universe[disks / n % n], &universe[disks / (n * n)]];
        for published in 0..8u32 {
            for in_use in 0..8u32 {
                cases += 1;
                let desired: Vec<DesiredPv> = (0..3)
                    .map(|i| {
                        let mut d = desired(&format!("pv-{i}"), paths[i]);
                        d.disk = keys[i].clone();
                        d.in_use = (in_use & (1 << i) != 0).then(|| "mounted at /x".to_string());
                        d
                    })
                    .collect();
                let observed: Vec<ObservedPv> =
                    (0..3).filter(|i| published & (1 << i) != 0).map(|i| ours(&format!("pv-{i}"), paths[i])).collect();
                let actions = plan(&me(), &desired, &observed, &BTreeMap::new());
                let created: Vec<usize> = actions
                    .iter()
                    .filter_map(|a| match a {
                        Action::Create { host_path, .. } => Some(paths.iter().position(|p| *p == host_path).unwrap()),
                        _ => None,
                    })
                    .collect();
                let is_pub = |i: usize| published & (1 << i) != 0;
                let live: Vec<usize> = (0..3).filter(|&i| is_pub(i) || created.contains(&i)).collect();
                let ctx = format!("disks {keys:?} published {published:03b} in_use {in_use:03b}: {actions:?}");
                for &i in &created {
                    assert!(!is_pub(i), "published volumes are not created again: {ctx}");
                    assert!(desired[i].in_use.is_none(), "a device in use is never published: {ctx}");
                    for &j in live.iter().filter(|&&j| j != i) {
                        assert!(!keys[i].overlaps(keys[j]), "two PVs on one disk: {ctx}");
                    }
                }
                for i in (0..3).filter(|&i| is_pub(i)) {
                    assert!(
                        !actions.iter().any(|a| matches!(a, Action::Refuse { host_path, .. } if host_path == paths[i])),
                        "a published volume keeps its disk: {ctx}"
                    );
                }
                for i in (0..3).filter(|&i| !is_pub(i) && desired[i].in_use.is_none()) {
                    // Devices the host uses never compete: they cannot be published.
                    let competes = |j: usize| is_pub(j) || desired[j].in_use.is_none();
                    let alone = (0..3).all(|j| j == i || !keys[i].overlaps(keys[j]) || !competes(j));
                    assert_eq!(created.contains(&i), alone, "volume {i} alone on its disk is published: {ctx}");
                }
            }
        }
    }
    assert_eq!(cases, 216 * 64);
}

#[test]
fn disk_refusals_name_the_other_entries_and_the_published_pv() {
    let mut a = desired("pv-a", "/mnt/disks/a");
    let mut b = desired("pv-b", "/mnt/disks/b");
    let mut c = desired("pv-c", "/mnt/disks/c");
    for d in [&mut a, &mut b, &mut c] {
        d.disk = DiskKey::fs("0:50", "/");
    }
    let refusals = |observed: &[ObservedPv]| -> Vec<(String, Refusal)> {
        plan(&me(), &[a.clone(), b.clone(), c.clone()], observed, &BTreeMap::new())
            .into_iter()
            .filter_map(|x| match x {
                Action::Refuse { host_path, reason, .. } => Some((host_path, reason)),
                _ => None,
            })
            .collect()
    };
    let none = refusals(&[]);
    assert_eq!(none.len(), 3);
    assert_eq!(none[0].1, Refusal::SameDisk { others: vec!["/mnt/disks/b".into(), "/mnt/disks/c".into()] }, "{none:?}");
    assert_eq!(none[0].1.code(), "same-disk");
    let with_b = refusals(&[ours("pv-b", "/mnt/disks/b")]);
    assert_eq!(with_b.len(), 2);
    for (_, r) in &with_b {
        assert_eq!(r, &Refusal::DiskPublished { pv: "pv-b".into(), path: "/mnt/disks/b".into() });
    }
    assert!(with_b[0].1.to_string().contains("already published as PV pv-b"));
}

#[test]
fn a_disk_recorded_on_a_pv_at_another_path_is_not_published_again() {
    // The disk moved (or is bound in a second time) to a new entry; its PV still names it.
    let d = desired("pv-new", "/mnt/disks/new");
    let mut old = ours("pv-old", "/mnt/disks/old");
    old.identity = Some(d.identity.clone());
    let actions = plan(&me(), std::slice::from_ref(&d), std::slice::from_ref(&old), &BTreeMap::new());
    assert_eq!(
        actions,
        vec![Action::Refuse {
            name: "pv-new".into(),
            host_path: "/mnt/disks/new".into(),
            reason: Refusal::DiskPublished { pv: "pv-old".into(), path: "/mnt/disks/old".into() },
        }]
    );
    // Another node's PV with the same identity string does not count.
    let mut foreign = other("pv-x", Some("/mnt/disks/old"), Some("local-volume-provisioner-other-node-u"));
    foreign.identity = Some(d.identity.clone());
    assert!(matches!(plan(&me(), std::slice::from_ref(&d), &[foreign], &BTreeMap::new())[..], [Action::Create { .. }]));
    // The PV on the same path is the volume itself.
    old.host_path = Some("/mnt/disks/new".into());
    old.name = "pv-new".into();
    assert!(plan(&me(), &[d], &[old], &BTreeMap::new()).is_empty());
}

#[test]
fn a_device_in_use_is_refused_unless_already_published() {
    let mut d = desired("pv-a", "/mnt/disks/a");
    d.in_use = Some("its partition sdb1 is mounted at /data".into());
    let actions = plan(&me(), &[d.clone()], &[], &BTreeMap::new());
    assert!(
        matches!(&actions[..], [Action::Refuse { reason: Refusal::DeviceInUse { why }, .. }] if why.contains("sdb1")),
        "{actions:?}"
    );
    assert!(plan(&me(), &[d], &[ours("pv-a", "/mnt/disks/a")], &BTreeMap::new()).is_empty());
}

#[test]
fn a_new_directory_of_a_shared_disk_is_published_next_to_a_recorded_one() {
    // Upstream's shared-disk recipe: directories of one filesystem bound in as volumes. The
    // published one records the disk's identity; a new sibling names the same disk (other
    // root inode) but its DiskKey does not overlap, and the recorded volume is present.
    let mut vol1 = desired("pv-1", "/mnt/disks/vol1");
    vol1.identity = "v2;fs;disk=serial:S;uuid=u;ino=11;dev=8:17".into();
    vol1.disk = DiskKey::fs("8:17", "/vol1");
    let mut vol3 = desired("pv-3", "/mnt/disks/vol3");
    vol3.identity = "v2;fs;disk=serial:S;uuid=u;ino=33;dev=8:17".into();
    vol3.disk = DiskKey::fs("8:17", "/vol3");
    let mut published = ours("pv-1", "/mnt/disks/vol1");
    published.identity = Some(vol1.identity.clone());
    let actions = plan(&me(), &[vol1.clone(), vol3.clone()], std::slice::from_ref(&published), &BTreeMap::new());
    assert!(
        matches!(&actions[..], [Action::Create { host_path, .. }] if host_path == "/mnt/disks/vol3"),
        "{actions:?}"
    );
    // When vol1's volume is gone from its path, a volume naming its disk is refused instead.
    let actions = plan(&me(), std::slice::from_ref(&vol3), std::slice::from_ref(&published), &BTreeMap::new());
    assert!(
        matches!(&actions[..], [Action::Refuse { reason: Refusal::DiskPublished { pv, .. }, .. }] if pv == "pv-1"),
        "{actions:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The used mark: a disk that held a tenant's data is never published unwiped, and a disk a
// live PV still names is neither published nor wiped.

const DISK: &str = "v2;fs;disk=wwid:d;uuid=u;ino=2;dev=8:1";
const ELSE: &str = "v2;fs;disk=wwid:e;uuid=w;ino=2;dev=8:2";

fn used_mark(pv: &str, uid: Option<&str>) -> crate::core::identity::used_mark::UsedMark {
    crate::core::identity::used_mark::UsedMark {
        pv: pv.into(),
        node: "node-1".into(),
        path: "/mnt/disks/old".into(),
        identity: DISK.into(),
        at: "t".into(),
        uid: uid.map(str::to_string),
        root: None,
        claimed: true,
        wiped_filesystems: Vec::new(),
    }
}

/// A PV recording `identity` (upstream's shape, made for this node, with our label).
fn recording(name: &str, path: &str, identity: &str) -> ObservedPv {
    ObservedPv { identity: Some(identity.into()), ..ours(name, path) }
}

#[test]
fn a_marked_disk_is_wiped_first_unless_a_live_pv_names_it() {
    use crate::core::identity::used_mark::UsedRead;
    let mut d = desired("pv-new", "/mnt/disks/new");
    d.identity = DISK.into();
    d.used = UsedRead::Marked(used_mark("pv-old", Some("uid-old")));
    // Its PV is gone: wiped first, never created as it is.
    assert_eq!(
        summary(&plan(&me(), std::slice::from_ref(&d), &[], &no_foreign())),
        ["wipe-first pv-new /mnt/disks/new (of pv-old)"]
    );
    // Its PV still exists on this node and its own disk is not at its path (it moved here).
    let old = recording("pv-old", "/mnt/disks/old", DISK);
    let got = summary(&plan(&me(), std::slice::from_ref(&d), std::slice::from_ref(&old), &no_foreign()));
    assert_eq!(got, ["refuse pv-new /mnt/disks/new: DiskPublished { pv: \"pv-old\", path: \"/mnt/disks/old\" }"]);
    // Its PV is on another node (read from the API by the agent) and records this disk.
    let mut moved = d.clone();
    moved.mark_holder = Some(ObservedPv {
        hostname_label: Some("node-2".into()),
        provisioned_by: Some("local-volume-provisioner-node-2-0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0".into()),
        ..recording("pv-old", "/mnt/disks/old", DISK)
    });
    let got = summary(&plan(&me(), std::slice::from_ref(&moved), &[], &no_foreign()));
    assert_eq!(
        got,
        ["refuse pv-new /mnt/disks/new: DiskPublished { pv: \"pv-old\", path: \"/mnt/disks/old on node-2\" }"]
    );
    // A PV of that name exists but records another disk (a disk put at its path since): the
    // marked disk's PV is gone.
    moved.mark_holder = Some(recording("pv-old", "/mnt/disks/old", ELSE));
    assert_eq!(
        summary(&plan(&me(), std::slice::from_ref(&moved), &[], &no_foreign())),
        ["wipe-first pv-new /mnt/disks/new (of pv-old)"]
    );
    // A mark written before a create that never happened (no UID, no such PV): never offered.
    let mut pending = d.clone();
    pending.used = UsedRead::Marked(used_mark("pv-new", None));
    assert_eq!(summary(&plan(&me(), std::slice::from_ref(&pending), &[], &no_foreign())), ["create pv-new"]);
    // The steady state: its own PV exists at its path; nothing to do.
    let mut published = d.clone();
    published.used = UsedRead::Marked(used_mark("pv-new", Some("uid-new")));
    let own = recording("pv-new", "/mnt/disks/new", DISK);
    assert!(plan(&me(), std::slice::from_ref(&published), std::slice::from_ref(&own), &no_foreign()).is_empty());
    // Unreadable: neither published nor wiped.
    let mut unknown = d.clone();
    unknown.used = UsedRead::Unknown("ledger unreadable".into());
    let got = summary(&plan(&me(), std::slice::from_ref(&unknown), &[], &no_foreign()));
    assert_eq!(got, ["refuse pv-new /mnt/disks/new: UsedUnknown { why: \"ledger unreadable\" }"]);
}

/// Two disks swapped between the entries of two PVs: each entry shows the other PV's disk.
/// Neither is published under a new name, nor wiped, while the other PV exists.
#[test]
fn swapped_disks_are_held_by_the_pvs_that_record_them() {
    use crate::core::identity::used_mark::UsedRead;
    let a = recording("pv-a", "/mnt/disks/a", "id-A");
    let b = recording("pv-b", "/mnt/disks/b", "id-B");
    // pv-a was deleted (say by node-cleanup); its entry now shows disk B, marked by pv-b.
    let mut at_a = desired("pv-a", "/mnt/disks/a");
    at_a.identity = "id-B".into();
    at_a.used = UsedRead::Marked(used_mark("pv-b", Some("uid-b")));
    let mut at_b = desired("pv-b", "/mnt/disks/b");
    at_b.identity = "id-A".into();
    at_b.used = UsedRead::Marked(used_mark("pv-a", Some("uid-a")));
    let got = summary(&plan(&me(), &[at_a.clone(), at_b.clone()], std::slice::from_ref(&b), &no_foreign()));
    assert_eq!(got, ["refuse pv-a /mnt/disks/a: DiskPublished { pv: \"pv-b\", path: \"/mnt/disks/b\" }"]);
    // Unmarked (a disk from before marks existed): still held by the PV that records it.
    at_a.used = UsedRead::Unmarked;
    let got = summary(&plan(&me(), &[at_a.clone(), at_b.clone()], std::slice::from_ref(&b), &no_foreign()));
    assert_eq!(got, ["refuse pv-a /mnt/disks/a: DiskPublished { pv: \"pv-b\", path: \"/mnt/disks/b\" }"]);
    // Both PVs exist: their names are published at their paths; nothing is created or wiped.
    assert!(plan(&me(), &[at_a, at_b], &[a, b], &no_foreign()).is_empty());
}

/// Exhaustive over mark states, holders and whether a PV already publishes the path: a disk is
/// created only when nothing says it was offered and no live PV names it, wiped only when it
/// is marked and no live PV names it, and never both.
#[test]
fn used_disks_are_never_created_unwiped_nor_wiped_while_named() {
    use crate::core::identity::used_mark::UsedRead;
    let reads = [
        UsedRead::Unmarked,
        UsedRead::Marked(used_mark("pv-gone", Some("u"))),
        UsedRead::Marked(used_mark("pv-gone", None)),
        UsedRead::Marked(used_mark("pv-held", Some("u"))),
        UsedRead::Marked(used_mark("pv-held", None)),
        UsedRead::Offered(used_mark("pv-gone", Some("u"))),
        UsedRead::Offered(used_mark("pv-held", Some("u"))),
        UsedRead::Unknown("x".into()),
    ];
    for read in &reads {
        for holder in 0..5 {
            for published in [false, true] {
                let mut d = desired("pv-new", "/mnt/disks/new");
                d.identity = DISK.into();
                d.used = read.clone();
                let mut observed = Vec::new();
                match holder {
                    1 => observed.push(recording("pv-held", "/mnt/disks/held", DISK)),
                    2 => d.mark_holder = Some(recording("pv-held", "/mnt/disks/held", DISK)),
                    3 => d.mark_holder = Some(recording("pv-held", "/mnt/disks/held", ELSE)),
                    // The mark's PV recorded no identity (upstream's): it may be this disk's.
                    4 => d.mark_holder = Some(ObservedPv { identity: None, ..ours("pv-held", "/mnt/disks/held") }),
                    _ => {}
                }
                if published {
                    observed.push(recording("pv-new", "/mnt/disks/new", DISK));
                }
                let actions = plan(&me(), std::slice::from_ref(&d), &observed, &no_foreign());
                let ctx = format!("{read:?} holder={holder} published={published}: {}", summary(&actions).join("; "));
                let created = actions.iter().any(|a| matches!(a, Action::Create { .. }));
                let wiped = actions.iter().any(|a| matches!(a, Action::WipeFirst { .. }));
                let names_pv_held = matches!(read, UsedRead::Marked(m) | UsedRead::Offered(m) if m.pv == "pv-held");
                // A PV that records this disk holds it; so does the mark's own PV unless its
                // record proves it is another disk.
                let named = holder == 1 || (matches!(holder, 2 | 4) && names_pv_held);
                let mark_pv_exists = matches!(holder, 1..=4) && names_pv_held;
                let never_offered = match read {
                    UsedRead::Unmarked | UsedRead::Offered(_) => true,
                    UsedRead::Marked(m) => m.uid.is_none() && !mark_pv_exists,
                    UsedRead::Unknown(_) => false,
                };
                if published {
                    assert!(actions.is_empty(), "an existing PV keeps its disk: {ctx}");
                    continue;
                }
                assert_eq!(created, never_offered && !named, "{ctx}");
                assert_eq!(wiped, matches!(read, UsedRead::Marked(_)) && !named && !never_offered, "{ctx}");
                assert!(!(created && wiped), "{ctx}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// plan_expecting: the agent's own creates the store does not show yet
// ---------------------------------------------------------------------------------------------

fn expected_of(d: &DesiredPv) -> Expected {
    Expected {
        name: d.name.clone(),
        uid: "uid-new".into(),
        host_path: d.host_path.clone(),
        identity: d.identity.clone(),
        at: std::time::Instant::now(),
    }
}

/// The used mark the agent wrote on `d`'s disk for the PV it created.
fn own_mark(d: &DesiredPv, uid: Option<&str>) -> UsedMark {
    UsedMark {
        pv: d.name.clone(),
        node: NODE.into(),
        path: d.host_path.clone(),
        identity: d.identity.clone(),
        at: "2026-11-27T00:00:00Z".into(),
        uid: uid.map(str::to_string),
        root: None,
        claimed: false,
        wiped_filesystems: Vec::new(),
    }
}

#[test]
fn an_expected_volume_is_neither_created_nor_refused_whatever_its_mark_says() {
    let base = desired("local-pv-a", "/mnt/disks/a");
    // What the API shows when the mark's PV is read back: the PV just created.
    let holder = ObservedPv { identity: Some(base.identity.clone()), ..ours("local-pv-a", "/mnt/disks/a") };
    let reads = [
        UsedRead::Unmarked,
        UsedRead::Marked(own_mark(&base, None)),
        UsedRead::Marked(own_mark(&base, Some("uid-new"))),
        UsedRead::Offered(own_mark(&base, Some("uid-new"))),
        UsedRead::Unknown("the ledger cannot be read".into()),
    ];
    for used in reads {
        for mark_holder in [None, Some(holder.clone())] {
            let d = DesiredPv { used: used.clone(), mark_holder: mark_holder.clone(), ..base.clone() };
            let without = plan(&me(), std::slice::from_ref(&d), &[], &no_foreign());
            assert!(!without.is_empty(), "without the expectation something is done ({used:?})");
            let with = plan_expecting(&me(), std::slice::from_ref(&d), &[], &no_foreign(), &[expected_of(&base)]);
            assert_eq!(summary(&with), Vec::<String>::new(), "{used:?} holder {:?}", mark_holder.is_some());
        }
    }
}

#[test]
fn an_expectation_never_excuses_another_volume() {
    let base = desired("local-pv-a", "/mnt/disks/a");
    let e = expected_of(&base);
    let holder = ObservedPv { identity: Some(base.identity.clone()), ..ours("local-pv-a", "/mnt/disks/a") };
    // Another disk at the path, the same disk at another path, another name: judged as usual,
    // with and without the mark and its PV read back, and with the store showing the PV.
    let others = [
        DesiredPv { identity: "id-of-another-disk".into(), ..base.clone() },
        DesiredPv { host_path: "/mnt/disks/b".into(), ..base.clone() },
        DesiredPv { name: "local-pv-b".into(), ..base.clone() },
    ];
    let stores = [vec![], vec![ours("local-pv-a", "/mnt/disks/a")], vec![other("local-pv-a", Some("/x"), Some("p"))]];
    for d in &others {
        for used in [UsedRead::Unmarked, UsedRead::Marked(own_mark(&base, Some("uid-new")))] {
            for mark_holder in [None, Some(holder.clone())] {
                for store in &stores {
                    let d = DesiredPv { used: used.clone(), mark_holder: mark_holder.clone(), ..d.clone() };
                    let d = std::slice::from_ref(&d);
                    assert_eq!(
                        plan_expecting(&me(), d, store, &no_foreign(), std::slice::from_ref(&e)),
                        plan(&me(), d, store, &no_foreign()),
                        "{d:?} store {store:?}"
                    );
                }
            }
        }
    }
    // The store shows the name: the store is what counts (ours: nothing to do; another
    // node's: refused as taken).
    for store in &stores[1..] {
        let d = std::slice::from_ref(&base);
        assert_eq!(
            plan_expecting(&me(), d, store, &no_foreign(), std::slice::from_ref(&e)),
            plan(&me(), d, store, &no_foreign())
        );
    }
}

#[test]
fn an_expected_volume_keeps_its_disk_from_other_entries() {
    let a = desired("local-pv-a", "/mnt/disks/a");
    // Another entry of the same disk: the expected volume has it.
    let same_disk = DesiredPv { disk: a.disk.clone(), ..desired("local-pv-b", "/mnt/disks/b") };
    let got = plan_expecting(&me(), &[a.clone(), same_disk], &[], &no_foreign(), &[expected_of(&a)]);
    assert_eq!(
        summary(&got),
        [format!(
            "refuse local-pv-b /mnt/disks/b: {:?}",
            Refusal::DiskPublished { pv: "local-pv-a".into(), path: "/mnt/disks/a".into() }
        )]
    );
}
