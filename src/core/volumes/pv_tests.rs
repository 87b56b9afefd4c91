use super::*;

use serde_json::json;

use crate::core::config::settings::VolumeMode;
use crate::core::volumes::desired::{ClassProblem, class_policy, desired_pvs};
use crate::core::volumes::naming::provisioner_name;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// Upstream's test node. Its hostname label deliberately differs from its name.
fn node() -> NodeInfo {
    NodeInfo {
        name: "test-node".into(),
        uid: "8f3c2a1e-0000-4000-8000-000000000001".into(),
        labels: BTreeMap::from([
            (LABEL_HOSTNAME.to_string(), "test-node-hostname".to_string()),
            ("topology.kubernetes.io/zone".to_string(), "zone-a".to_string()),
            ("rack".to_string(), "r7".to_string()),
        ]),
    }
}

fn class(host_dir: &str) -> ClassConfig {
    ClassConfig {
        host_dir: host_dir.into(),
        mount_dir: host_dir.into(),
        block_cleaner_command: vec!["/scripts/quick_reset.sh".into()],
        block_clean_method: None,
        volume_mode: VolumeMode::Filesystem,
        access_mode: "ReadWriteOnce".into(),
        fs_type: None,
        name_pattern: "*".into(),
        selector: Vec::new(),
        devices: None,
        root_mode: None,
        root_owner: None,
        encryption: None,
    }
}

fn config_with(classes: &[(&str, ClassConfig)]) -> ProvisionerConfig {
    ProvisionerConfig {
        storage_class_map: classes.iter().map(|(n, c)| (n.to_string(), c.clone())).collect(),
        ..Default::default()
    }
}

/// A discovered volume; the host path is built the way discovery builds it.
fn volume(class: &str, host_dir: &str, entry: &str, bytes: u64) -> FoundVolume {
    FoundVolume {
        class: class.into(),
        entry: entry.into(),
        host_path: host_path(host_dir, entry),
        capacity_bytes: bytes,
        identity: format!("fs:fsid=1,2;ino={}", entry.len()),
        disk: DiskKey::fs("0:99", format!("/{class}/{entry}")),
        in_use: None,
        used: Default::default(),
    }
}

fn uid_provisioner() -> String {
    provisioner_name("test-node", &node().uid, false)
}

/// Builds one PV for class `sc1`, entry `mount1`.
fn build_with(cfg: &ProvisionerConfig, node: &NodeInfo, policy: &ClassPolicy, bytes: u64) -> PersistentVolume {
    let prov = uid_provisioner();
    let ctx = PvContext { config: cfg, node, provisioner_name: &prov };
    let c = &cfg.storage_class_map["sc1"];
    ctx.build("local-pv-aaaafef5", c, policy, volume("sc1", &c.host_dir, "mount1", bytes).source())
}

fn build(cfg: &ProvisionerConfig) -> PersistentVolume {
    build_with(cfg, &node(), &ClassPolicy::default(), 10 * GIB)
}

fn spec(pv: &PersistentVolume) -> &PersistentVolumeSpec {
    pv.spec.as_ref().expect("spec")
}

fn hostname_term(value: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "kubernetes.io/hostname".into(),
            operator: "In".into(),
            values: Some(vec![value.into()]),
        }]),
        match_fields: None,
    }
}

fn terms(pv: &PersistentVolume) -> Vec<NodeSelectorTerm> {
    spec(pv).node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms.clone()
}

// ---------------------------------------------------------------------------------------------
// Golden checks against upstream
// ---------------------------------------------------------------------------------------------

#[test]
fn golden_name_and_path_via_desired_pvs() {
    // Upstream's vector: entry mount1, node test-node, class sc1 -> local-pv-aaaafef5.
    let cfg = config_with(&[("sc1", class("/mnt/disks/"))]);
    let n = node();
    let prov = uid_provisioner();
    let ctx = PvContext { config: &cfg, node: &n, provisioner_name: &prov };
    let policies = BTreeMap::from([("sc1".to_string(), Ok(ClassPolicy::default()))]);
    let (desired, problems) = desired_pvs(&ctx, &[volume("sc1", "/mnt/disks/", "mount1", 10 * GIB)], &policies);
    assert!(problems.is_empty());
    assert_eq!(desired.len(), 1);
    assert_eq!(desired[0].name, "local-pv-aaaafef5");
    assert_eq!(desired[0].host_path, "/mnt/disks/mount1");
    let pv = ctx.pv_for(&desired[0]).expect("class sc1 is configured");
    assert_eq!(pv.metadata.name.as_deref(), Some("local-pv-aaaafef5"));
    assert_eq!(local_path(&pv), Some("/mnt/disks/mount1"));
}

#[test]
fn whole_pv_serializes_like_upstream() {
    // Every optional feature on: byte-compat golden of the JSON we send to the API server.
    let mut c = class("/mnt/fast-disks");
    c.fs_type = Some("ext4".into());
    c.selector = vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "pool".into(),
            operator: "In".into(),
            values: Some(vec!["shared".into()]),
        }]),
        match_fields: None,
    }];
    let mut cfg = config_with(&[("sc1", c)]);
    cfg.node_labels_for_pv = vec!["topology.kubernetes.io/zone".into()];
    cfg.labels_for_pv = BTreeMap::from([("pv-labels".to_string(), "can-be-selected".to_string())]);
    cfg.set_pv_owner_ref = true;
    let policy = ClassPolicy { reclaim_policy: "Retain".into(), mount_options: vec!["noatime".into()] };
    let pv = build_with(&cfg, &node(), &policy, 1536 * MIB);
    let want = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "local-pv-aaaafef5",
            "labels": {
                "topology.kubernetes.io/zone": "zone-a",
                "pv-labels": "can-be-selected",
                "local-static-provisioner.io/node": "test-node"
            },
            "annotations": {
                "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-test-node-8f3c2a1e-0000-4000-8000-000000000001",
                "local-static-provisioner.io/volume-identity": "fs:fsid=1,2;ino=6"
            },
            "finalizers": ["local-static-provisioner.io/wipe"],
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": "test-node",
                "uid": "8f3c2a1e-0000-4000-8000-000000000001"
            }]
        },
        "spec": {
            "capacity": { "storage": "1536Mi" },
            "local": { "path": "/mnt/fast-disks/mount1", "fsType": "ext4" },
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "sc1",
            "mountOptions": ["noatime"],
            "volumeMode": "Filesystem",
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["test-node-hostname"] }, { "key": "fence.local-static-provisioner.io/local-pv-aaaafef5", "operator": "DoesNotExist" }, { "key": "local-static-provisioner.io/volumes-unverified", "operator": "DoesNotExist" }] },
                        { "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["shared"] }, { "key": "fence.local-static-provisioner.io/local-pv-aaaafef5", "operator": "DoesNotExist" }, { "key": "local-static-provisioner.io/volumes-unverified", "operator": "DoesNotExist" }] }
                    ]
                }
            }
        }
    });
    assert_eq!(serde_json::to_value(&pv).unwrap(), want);
}

#[test]
fn minimal_pv_serializes_without_optional_fields() {
    // Defaults everywhere: no fsType, no mountOptions, no ownerReferences, no status.
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let pv = build(&cfg);
    let want = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "local-pv-aaaafef5",
            "labels": { "local-static-provisioner.io/node": "test-node" },
            "annotations": {
                "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-test-node-8f3c2a1e-0000-4000-8000-000000000001",
                "local-static-provisioner.io/volume-identity": "fs:fsid=1,2;ino=6"
            },
            "finalizers": ["local-static-provisioner.io/wipe"]
        },
        "spec": {
            "capacity": { "storage": "10Gi" },
            "local": { "path": "/mnt/disks/mount1" },
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "sc1",
            "volumeMode": "Filesystem",
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["test-node-hostname"] }, { "key": "fence.local-static-provisioner.io/local-pv-aaaafef5", "operator": "DoesNotExist" }, { "key": "local-static-provisioner.io/volumes-unverified", "operator": "DoesNotExist" }] }
                    ]
                }
            }
        }
    });
    assert_eq!(serde_json::to_value(&pv).unwrap(), want);
}

// ---------------------------------------------------------------------------------------------
// Individual fields
// ---------------------------------------------------------------------------------------------

#[test]
fn provisioned_by_annotation_both_forms() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let n = node();
    for (name_only, want) in [
        (false, "local-volume-provisioner-test-node-8f3c2a1e-0000-4000-8000-000000000001"),
        (true, "local-volume-provisioner-test-node"),
    ] {
        let prov = provisioner_name(&n.name, &n.uid, name_only);
        let ctx = PvContext { config: &cfg, node: &n, provisioner_name: &prov };
        let pv = ctx.build(
            "x",
            &cfg.storage_class_map["sc1"],
            &ClassPolicy::default(),
            volume("sc1", "/mnt/disks", "m", GIB).source(),
        );
        let ann = pv.metadata.annotations.unwrap();
        assert_eq!(
            ann,
            BTreeMap::from([
                (ANN_PROVISIONED_BY.to_string(), want.to_string()),
                // Ours, checked before every wipe.
                (ANN_VOLUME_IDENTITY.to_string(), "fs:fsid=1,2;ino=1".to_string()),
            ])
        );
    }
}

#[test]
fn local_path_is_host_dir_joined_with_entry() {
    // (hostDir, entry, spec.local.path)
    let cases = [
        ("/mnt/disks", "mount1", "/mnt/disks/mount1"),
        ("/mnt/disks/", "mount1", "/mnt/disks/mount1"),
        ("/mnt//disks/./", "ssd1", "/mnt/disks/ssd1"),
        ("/dev/disk/by-id", "nvme-Samsung_SSD_1", "/dev/disk/by-id/nvme-Samsung_SSD_1"),
    ];
    for (dir, entry, want) in cases {
        let cfg = config_with(&[("sc1", class(dir))]);
        let n = node();
        let prov = uid_provisioner();
        let ctx = PvContext { config: &cfg, node: &n, provisioner_name: &prov };
        let pv = ctx.build(
            "x",
            &cfg.storage_class_map["sc1"],
            &ClassPolicy::default(),
            volume("sc1", dir, entry, GIB).source(),
        );
        assert_eq!(spec(&pv).local.as_ref().unwrap().path, want, "{dir} + {entry}");
    }
}

#[test]
fn capacity_is_a_canonical_binary_quantity() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let cases = [
        (10 * GIB, "10Gi"),
        (1536 * MIB, "1536Mi"),
        (100 * 1024, "100Ki"),
        (1000, "1000"),
        (1024 * GIB, "1Ti"),
        (3 * GIB, "3Gi"),
    ];
    for (bytes, want) in cases {
        let pv = build_with(&cfg, &node(), &ClassPolicy::default(), bytes);
        let cap = spec(&pv).capacity.clone().unwrap();
        assert_eq!(cap, BTreeMap::from([("storage".to_string(), Quantity(want.into()))]), "{bytes}");
    }
}

#[test]
fn access_mode_class_name_volume_mode_and_fs_type() {
    // (volumeMode, accessMode, fsType)
    let cases = [
        (VolumeMode::Filesystem, "ReadWriteOnce", None),
        (VolumeMode::Filesystem, "ReadWriteMany", Some("xfs")),
        (VolumeMode::Block, "ReadWriteOncePod", None),
    ];
    for (mode, access, fs) in cases {
        let mut c = class("/mnt/disks");
        c.volume_mode = mode;
        c.access_mode = access.into();
        c.fs_type = fs.map(str::to_string);
        let pv = build(&config_with(&[("sc1", c)]));
        let s = spec(&pv);
        assert_eq!(s.access_modes, Some(vec![access.to_string()]));
        assert_eq!(s.storage_class_name.as_deref(), Some("sc1"));
        assert_eq!(s.volume_mode.as_deref(), Some(mode.as_str()));
        assert_eq!(s.local.as_ref().unwrap().fs_type.as_deref(), fs);
    }
}

#[test]
fn reclaim_policy_and_mount_options_come_from_the_class_policy() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    // (reclaim policy, class mount options, expected spec.mountOptions)
    type Case = (&'static str, Vec<String>, Option<Vec<String>>);
    let cases: [Case; 3] = [
        ("Delete", vec![], None),
        ("Retain", vec!["noatime".into(), "discard".into()], Some(vec!["noatime".into(), "discard".into()])),
        ("Delete", vec!["ro".into()], Some(vec!["ro".into()])),
    ];
    for (policy, opts, want_opts) in cases {
        let pv = build_with(&cfg, &node(), &ClassPolicy { reclaim_policy: policy.into(), mount_options: opts }, GIB);
        let s = spec(&pv);
        assert_eq!(s.persistent_volume_reclaim_policy.as_deref(), Some(policy));
        assert_eq!(s.mount_options, want_opts);
    }
}

#[test]
fn class_policy_default_is_delete_without_mount_options() {
    assert_eq!(ClassPolicy::default(), ClassPolicy { reclaim_policy: "Delete".into(), mount_options: vec![] });
}

#[test]
fn node_affinity_uses_hostname_label_value_not_node_name() {
    let pv = build(&config_with(&[("sc1", class("/mnt/disks"))]));
    assert_eq!(terms(&pv), vec![fenced(hostname_term("test-node-hostname"))]);
}

#[test]
fn node_affinity_falls_back_to_node_name_without_hostname_label() {
    let mut n = node();
    n.labels.remove(LABEL_HOSTNAME);
    assert_eq!(n.hostname(), "test-node");
    let pv = build_with(&config_with(&[("sc1", class("/mnt/disks"))]), &n, &ClassPolicy::default(), GIB);
    assert_eq!(terms(&pv), vec![fenced(hostname_term("test-node"))]);
}

#[test]
fn class_selector_terms_follow_as_separate_terms() {
    let sel_a = NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "storage/shared".into(),
            operator: "Exists".into(),
            values: None,
        }]),
        match_fields: None,
    };
    let sel_b = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec!["node-b".into()]),
        }]),
    };
    let mut c = class("/mnt/shared");
    c.selector = vec![sel_a.clone(), sel_b.clone()];
    let pv = build(&config_with(&[("sc1", c)]));
    // ORed terms, hostname first; the hostname term is not merged with the selector. Each term
    // requires the volume's fence labels to be absent: no term lets a pod past a fence.
    assert_eq!(terms(&pv), vec![fenced(hostname_term("test-node-hostname")), fenced(sel_a), fenced(sel_b)]);
    assert!(crate::core::fence::volume_fence::honours_fence("local-pv-aaaafef5", spec(&pv).node_affinity.as_ref()));
}

/// `term` with the fence requirements of the test's PV appended.
fn fenced(mut term: NodeSelectorTerm) -> NodeSelectorTerm {
    term.match_expressions
        .get_or_insert_with(Vec::new)
        .extend(crate::core::fence::volume_fence::fence_requirements("local-pv-aaaafef5"));
    term
}

#[test]
fn labels_from_node_and_config_plus_our_node_label() {
    let mut cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    // `missing` is not on the node: skipped. `rack` is overridden by labelsForPV.
    cfg.node_labels_for_pv = vec!["topology.kubernetes.io/zone".into(), "missing".into(), "rack".into()];
    cfg.labels_for_pv = BTreeMap::from([
        ("rack".to_string(), "fixed".to_string()),
        ("pv-labels".to_string(), "can-be-selected".to_string()),
    ]);
    let pv = build(&cfg);
    assert_eq!(
        pv.metadata.labels.unwrap(),
        BTreeMap::from([
            ("topology.kubernetes.io/zone".to_string(), "zone-a".to_string()),
            ("rack".to_string(), "fixed".to_string()),
            ("pv-labels".to_string(), "can-be-selected".to_string()),
            (LABEL_NODE.to_string(), "test-node".to_string()),
        ])
    );
}

#[test]
fn only_our_label_by_default() {
    let pv = build(&config_with(&[("sc1", class("/mnt/disks"))]));
    assert_eq!(pv.metadata.labels.unwrap(), BTreeMap::from([(LABEL_NODE.to_string(), "test-node".to_string())]));
}

#[test]
fn our_node_label_cannot_be_overridden_by_labels_for_pv() {
    let mut cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    cfg.labels_for_pv = BTreeMap::from([(LABEL_NODE.to_string(), "someone-else".to_string())]);
    let pv = build(&cfg);
    assert_eq!(pv.metadata.labels.unwrap()[LABEL_NODE], "test-node");
}

#[test]
fn long_node_names_get_a_valid_node_label() {
    let mut n = node();
    n.name = format!("{}.example.com", "worker".repeat(12));
    let pv = build_with(&config_with(&[("sc1", class("/mnt/disks"))]), &n, &ClassPolicy::default(), GIB);
    let v = pv.metadata.labels.unwrap()[LABEL_NODE].clone();
    assert!(v.len() <= 63, "{v}");
    assert_eq!(v, crate::core::volumes::naming::node_label_value(&n.name));
}

#[test]
fn owner_reference_only_with_set_pv_owner_ref() {
    let mut cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    assert_eq!(build(&cfg).metadata.owner_references, None);
    cfg.set_pv_owner_ref = true;
    assert_eq!(
        build(&cfg).metadata.owner_references,
        Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "test-node".into(),
            uid: "8f3c2a1e-0000-4000-8000-000000000001".into(),
            controller: None,
            block_owner_deletion: None,
        }])
    );
}

#[test]
fn alpha_api_puts_affinity_in_the_annotation() {
    let mut c = class("/mnt/disks");
    c.selector = vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "pool".into(),
            operator: "In".into(),
            values: Some(vec!["x".into()]),
        }]),
        match_fields: None,
    }];
    let mut cfg = config_with(&[("sc1", c)]);
    cfg.use_alpha_api = true;
    let pv = build(&cfg);
    assert_eq!(spec(&pv).node_affinity, None);
    let ann = pv.metadata.annotations.unwrap();
    assert_eq!(ann.len(), 3);
    assert_eq!(ann[ANN_PROVISIONED_BY], uid_provisioner());
    let raw = &ann[ANN_ALPHA_NODE_AFFINITY];
    let parsed: serde_json::Value = serde_json::from_str(raw).unwrap();
    assert_eq!(
        parsed,
        json!({
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["test-node-hostname"] }] },
                    { "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["x"] }] }
                ]
            }
        })
    );
}

#[test]
fn alpha_annotation_text_matches_go_json_marshal() {
    // Go's json.Marshal of v1.NodeAffinity: compact, fields in struct order.
    let mut cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    cfg.use_alpha_api = true;
    let pv = build(&cfg);
    assert_eq!(
        pv.metadata.annotations.unwrap()[ANN_ALPHA_NODE_AFFINITY],
        r#"{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"In","values":["test-node-hostname"]}]}]}}"#
    );
}

// ---------------------------------------------------------------------------------------------
// host_path / clean_path / local_path
// ---------------------------------------------------------------------------------------------

#[test]
fn host_path_joins_like_go_filepath_join() {
    let cases = [
        ("/mnt/disks", "ssd1", "/mnt/disks/ssd1"),
        ("/mnt/disks/", "ssd1", "/mnt/disks/ssd1"),
        ("/mnt/disks//", "ssd1", "/mnt/disks/ssd1"),
        ("/mnt//disks", "ssd1", "/mnt/disks/ssd1"),
        ("/mnt/./disks/.", "ssd1", "/mnt/disks/ssd1"),
        ("/", "ssd1", "/ssd1"),
        ("/mnt/disks", "with space", "/mnt/disks/with space"),
        ("/mnt/disks", "a.b", "/mnt/disks/a.b"),
    ];
    for (dir, entry, want) in cases {
        assert_eq!(host_path(dir, entry), want, "{dir:?} + {entry:?}");
    }
}

#[test]
fn clean_path_like_go_filepath_clean() {
    let cases = [
        ("/", "/"),
        ("//", "/"),
        ("/mnt", "/mnt"),
        ("/mnt/", "/mnt"),
        ("/mnt///disks//", "/mnt/disks"),
        ("/./mnt/./disks/.", "/mnt/disks"),
        ("/mnt/.hidden", "/mnt/.hidden"),
        ("/mnt/..data", "/mnt/..data"),
    ];
    for (input, want) in cases {
        assert_eq!(clean_path(input), want, "{input:?}");
    }
}

#[test]
fn local_path_of_pvs() {
    assert_eq!(local_path(&PersistentVolume::default()), None);
    let pv = build(&config_with(&[("sc1", class("/mnt/disks"))]));
    assert_eq!(local_path(&pv), Some("/mnt/disks/mount1"));
}

// ---------------------------------------------------------------------------------------------
// class_policy and desired_pvs
// ---------------------------------------------------------------------------------------------

#[test]
fn class_policy_table() {
    let opts = vec!["noatime".to_string()];
    assert_eq!(
        class_policy("sc1", None, None),
        Ok(ClassPolicy { reclaim_policy: "Delete".into(), mount_options: vec![] })
    );
    assert_eq!(class_policy("sc1", Some("Delete"), None), Ok(ClassPolicy::default()));
    assert_eq!(
        class_policy("sc1", Some("Retain"), Some(&opts)),
        Ok(ClassPolicy { reclaim_policy: "Retain".into(), mount_options: opts.clone() })
    );
    assert_eq!(class_policy("sc1", None, Some(&[])), Ok(ClassPolicy::default()));
    for bad in ["Recycle", "delete", "Keep"] {
        let err = class_policy("fast-disks", Some(bad), None).unwrap_err();
        assert!(err.contains("\"fast-disks\""), "{err}");
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
}

#[test]
fn desired_pvs_holds_back_classes_without_a_policy_and_reports_each_once() {
    let cfg = config_with(&[
        ("good", class("/mnt/good")),
        ("recycle", class("/mnt/recycle")),
        ("unknown", class("/mnt/unknown")),
    ]);
    let n = node();
    let prov = uid_provisioner();
    let ctx = PvContext { config: &cfg, node: &n, provisioner_name: &prov };
    let recycle_err = class_policy("recycle", Some("Recycle"), None).unwrap_err();
    let policies = BTreeMap::from([
        ("good".to_string(), Ok(ClassPolicy::default())),
        ("recycle".to_string(), Err(recycle_err.clone())),
    ]);
    let volumes = [
        volume("recycle", "/mnt/recycle", "r1", GIB),
        volume("good", "/mnt/good", "g1", GIB),
        volume("recycle", "/mnt/recycle", "r2", GIB),
        volume("unknown", "/mnt/unknown", "u1", GIB),
        volume("recycle", "/mnt/recycle", "r3", GIB),
        volume("unknown", "/mnt/unknown", "u2", GIB),
        volume("good", "/mnt/good", "g2", GIB),
        // A class no longer in the config: silently dropped, not a problem.
        volume("removed", "/mnt/removed", "x1", GIB),
    ];
    let (desired, problems) = desired_pvs(&ctx, &volumes, &policies);
    let names: Vec<(&str, &str)> = desired.iter().map(|d| (d.name.as_str(), d.host_path.as_str())).collect();
    let want_g1 = crate::core::volumes::naming::pv_name("g1", "test-node", "good");
    let want_g2 = crate::core::volumes::naming::pv_name("g2", "test-node", "good");
    assert_eq!(names, [(want_g1.as_str(), "/mnt/good/g1"), (want_g2.as_str(), "/mnt/good/g2")]);
    assert_eq!(
        problems,
        [
            ClassProblem { class: "recycle".into(), message: recycle_err },
            ClassProblem { class: "unknown".into(), message: "StorageClass \"unknown\" is not known".into() },
        ]
    );
}

#[test]
fn pv_for_builds_the_same_object_as_build() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let n = node();
    let prov = uid_provisioner();
    let ctx = PvContext { config: &cfg, node: &n, provisioner_name: &prov };
    let policy = ClassPolicy { reclaim_policy: "Retain".into(), mount_options: vec![] };
    let policies = BTreeMap::from([("sc1".to_string(), Ok(policy.clone()))]);
    let v = volume("sc1", "/mnt/disks", "mount1", 10 * GIB);
    let (desired, _) = desired_pvs(&ctx, std::slice::from_ref(&v), &policies);
    assert_eq!(desired[0].class, "sc1");
    assert_eq!(desired[0].policy, policy);
    assert_eq!(
        ctx.pv_for(&desired[0]),
        Some(ctx.build("local-pv-aaaafef5", &cfg.storage_class_map["sc1"], &policy, v.source()))
    );
    // A class dropped from the config since the pass began builds nothing.
    let other = config_with(&[("sc2", class("/mnt/other"))]);
    let ctx = PvContext { config: &other, node: &n, provisioner_name: &prov };
    assert_eq!(ctx.pv_for(&desired[0]), None);
}

#[test]
fn desired_pvs_of_nothing() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let n = node();
    let ctx = PvContext { config: &cfg, node: &n, provisioner_name: "p" };
    let (d, p) = desired_pvs(&ctx, &[], &BTreeMap::new());
    assert!(d.is_empty());
    assert!(p.is_empty());
}

#[test]
fn container_paths_are_direct_entries_of_the_host_dir_only() {
    let map = |p: &str| container_path(p, "/mnt//disks/", "/in/disks").map(|p| p.display().to_string());
    assert_eq!(map("/mnt/disks/vol1").as_deref(), Ok("/in/disks/vol1"));
    for bad in [
        "/mnt/disks",
        "/mnt/disks/",
        "/mnt/disks/a/b",
        "/mnt/disks/..",
        "/mnt/disks/.",
        "/mnt/disks2/vol1",
        "/mnt/disksvol1",
        "/other/vol1",
        "",
        "mnt/disks/vol1",
    ] {
        let e = map(bad).unwrap_err();
        assert!(e.contains("is not an entry of hostDir /mnt/disks"), "{bad}: {e}");
    }
}

#[test]
fn a_pv_of_a_disk_named_by_a_stable_id_carries_its_disk_label() {
    let cfg = config_with(&[("sc1", class("/mnt/disks"))]);
    let prov = uid_provisioner();
    let ctx = PvContext { config: &cfg, node: &node(), provisioner_name: &prov };
    let c = &cfg.storage_class_map["sc1"];
    let mut v = volume("sc1", &c.host_dir, "mount1", GIB);
    v.identity = "v2;blk;disk=wwid:0x5000c/part1;size=1073741824;dev=8:17".into();
    let pv = ctx.build("local-pv-aaaafef5", c, &ClassPolicy::default(), v.source());
    let labels = pv.metadata.labels.unwrap();
    assert_eq!(
        labels.get(crate::core::volumes::naming::LABEL_DISK_ID),
        crate::core::identity::disk_trust::disk_label(&v.identity).as_ref()
    );
    assert!(labels.contains_key(crate::core::volumes::naming::LABEL_DISK_ID));
}
