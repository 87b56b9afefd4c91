use super::*;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn entries(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Parses and expects success.
fn ok(list: &[(&str, &str)]) -> LoadedConfig {
    parse_entries("test-configmap", &entries(list)).unwrap_or_else(|e| panic!("expected a valid config, got: {e}"))
}

/// Parses and expects problems: `ConfigError::Invalid` (a top-level problem refuses the
/// whole config), or a config with failed classes (their problems, class by class).
fn problems(list: &[(&str, &str)]) -> Vec<Problem> {
    match parse_entries("test-configmap", &entries(list)) {
        Err(ConfigError::Invalid { source_name, problems, .. }) => {
            assert_eq!(source_name, "test-configmap");
            problems
        }
        Err(other) => panic!("expected Invalid, got {other}"),
        Ok(loaded) if !loaded.failed_classes.is_empty() => {
            for class in loaded.failed_classes.keys() {
                assert!(!loaded.config.storage_class_map.contains_key(class), "failed class {class} is still used");
            }
            loaded.failed_classes.into_values().flatten().collect()
        }
        Ok(loaded) => panic!("expected problems, got a valid config: {:?}", loaded.config),
    }
}

/// Parses and expects only class problems: the classes that failed, and the config of the
/// others.
fn failed(list: &[(&str, &str)]) -> (BTreeMap<String, Vec<Problem>>, ProvisionerConfig) {
    match parse_entries("test-configmap", &entries(list)) {
        Ok(loaded) => (loaded.failed_classes, loaded.config),
        Err(e) => panic!("expected failed classes only, got {e}"),
    }
}

fn locations(ps: &[Problem]) -> Vec<&str> {
    ps.iter().map(|p| p.location.as_str()).collect()
}

/// A class with both directories set to `dir`.
fn one_class(name: &str, dir: &str) -> String {
    format!("{name}:\n  hostDir: {dir}\n  mountDir: {dir}\n")
}

/// The class every default test expects: only hostDir/mountDir given.
fn default_class(dir: &str) -> ClassConfig {
    ClassConfig {
        host_dir: dir.into(),
        mount_dir: dir.into(),
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

/// The `storageClassMap` block exactly as the upstream Helm chart renders it.
const HELM_CLASS_MAP: &str = r#"fast-disks:
  hostDir: /mnt/fast-disks
  mountDir: /mnt/fast-disks
  blockCleanerCommand:
    - "/scripts/shred.sh"
    - "2"
  volumeMode: Filesystem
  fsType: ext4
  namePattern: "*"
"#;

/// A fresh, unique directory under the system temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("lsp-config-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Lays out `keys` the way kubelet mounts a ConfigMap: files in a timestamped `..` directory,
/// `..data` pointing at it, and one symlink per key through `..data`.
fn kubelet_layout(dir: &Path, keys: &[(&str, &str)]) {
    let stamp = dir.join("..2026_01_01_00_00_00.123456789");
    std::fs::create_dir(&stamp).unwrap();
    for (k, v) in keys {
        std::fs::write(stamp.join(k), v).unwrap();
    }
    std::os::unix::fs::symlink("..2026_01_01_00_00_00.123456789", dir.join("..data")).unwrap();
    for (k, _) in keys {
        std::os::unix::fs::symlink(format!("..data/{k}"), dir.join(k)).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream ConfigMaps
// ---------------------------------------------------------------------------------------------

#[test]
fn helm_chart_rendering_is_accepted_with_every_value() {
    // The `data:` of the newest upstream Helm chart, key by key, as kubelet hands it to us.
    let loaded = ok(&[
        ("nodeLabelsForPV", "- topology.kubernetes.io/zone\n"),
        ("labelsForPV", "pv-labels : can-be-selected\n"),
        ("setPVOwnerRef", "true"),
        ("useJobForCleaning", "yes"),
        ("useNodeNameOnly", "\"true\""),
        ("minResyncPeriod", "5m0s"),
        ("storageClassMap", HELM_CLASS_MAP),
    ]);
    let want = ProvisionerConfig {
        storage_class_map: BTreeMap::from([(
            "fast-disks".to_string(),
            ClassConfig {
                host_dir: "/mnt/fast-disks".into(),
                mount_dir: "/mnt/fast-disks".into(),
                block_cleaner_command: vec!["/scripts/shred.sh".into(), "2".into()],
                block_clean_method: None,
                volume_mode: VolumeMode::Filesystem,
                access_mode: "ReadWriteOnce".into(),
                fs_type: Some("ext4".into()),
                name_pattern: "*".into(),
                selector: Vec::new(),
                devices: None,
                root_mode: None,
                root_owner: None,
                encryption: None,
            },
        )]),
        node_labels_for_pv: vec!["topology.kubernetes.io/zone".into()],
        labels_for_pv: BTreeMap::from([("pv-labels".to_string(), "can-be-selected".to_string())]),
        use_alpha_api: false,
        use_job_for_cleaning: true,
        job_tolerations: Vec::new(),
        min_resync_period: Duration::from_secs(300),
        use_node_name_only: true,
        set_pv_owner_ref: true,
        remove_node_not_ready_taint: false,
        provisioner_not_ready_node_taint_key: String::new(),
    };
    assert_eq!(loaded.config, want);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn helm_generated_baremetal_cleanbyjobs_example() {
    // helm/generated_examples/baremetal-cleanbyjobs.yaml
    let loaded = ok(&[
        ("useJobForCleaning", "yes"),
        (
            "storageClassMap",
            "local-storage:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n  blockCleanerCommand:\n    - \"/scripts/quick_reset.sh\"\n  volumeMode: Block\n",
        ),
    ]);
    assert!(loaded.config.use_job_for_cleaning);
    let class = &loaded.config.storage_class_map["local-storage"];
    assert_eq!(class.volume_mode, VolumeMode::Block);
    assert_eq!(class.block_cleaner_command, vec!["/scripts/quick_reset.sh".to_string()]);
    assert_eq!(class.host_dir, "/mnt/disks");
}

#[test]
fn helm_selector_and_tolerations_are_parsed_as_k8s_types() {
    let loaded = ok(&[
        (
            "storageClassMap",
            "shared:\n  hostDir: /mnt/shared\n  mountDir: /mnt/shared\n  selector:\n    - matchExpressions:\n        - key: pool\n          operator: In\n          values:\n            - a\n            - b\n",
        ),
        (
            "jobTolerations",
            "- key: dedicated\n  operator: Equal\n  value: storage\n  effect: NoSchedule\n- operator: Exists\n  tolerationSeconds: 300\n",
        ),
    ]);
    let class = &loaded.config.storage_class_map["shared"];
    assert_eq!(
        class.selector,
        vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "pool".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            }]),
            match_fields: None,
        }]
    );
    let t = &loaded.config.job_tolerations;
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].key.as_deref(), Some("dedicated"));
    assert_eq!(t[0].value.as_deref(), Some("storage"));
    assert_eq!(t[0].effect.as_deref(), Some("NoSchedule"));
    assert_eq!(t[1].operator.as_deref(), Some("Exists"));
    assert_eq!(t[1].toleration_seconds, Some(300));
}

#[test]
fn taint_remover_keys_are_read() {
    let loaded = ok(&[
        ("removeNodeNotReadyTaint", "true"),
        ("provisionerNotReadyNodeTaintKey", "example.com/local-provisioner-not-ready"),
    ]);
    assert!(loaded.config.remove_node_not_ready_taint);
    assert_eq!(loaded.config.provisioner_not_ready_node_taint_key, "example.com/local-provisioner-not-ready");
}

// ---------------------------------------------------------------------------------------------
// Defaults
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_configmap_gives_upstream_defaults() {
    let loaded = ok(&[]);
    assert_eq!(loaded.config, ProvisionerConfig::default());
    assert_eq!(loaded.config.min_resync_period, Duration::from_secs(300));
    assert!(loaded.config.storage_class_map.is_empty());
    assert!(!loaded.config.use_alpha_api);
    assert!(!loaded.config.use_node_name_only);
    assert!(!loaded.config.set_pv_owner_ref);
    assert!(!loaded.config.use_job_for_cleaning);
    assert!(loaded.warnings.is_empty());
}

#[test]
fn class_defaults_match_upstream() {
    let loaded = ok(&[("storageClassMap", &one_class("local", "/mnt/disks"))]);
    assert_eq!(loaded.config.storage_class_map["local"], default_class("/mnt/disks"));
}

#[test]
fn empty_or_null_values_fall_back_to_defaults() {
    // Keys present but empty behave like absent ones (upstream's "" -> default).
    let map = "local:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n  volumeMode: \"\"\n  accessMode: \"\"\n  fsType: \"\"\n  namePattern: \"\"\n  blockCleanerCommand:\n";
    let loaded = ok(&[("storageClassMap", map), ("useAlphaAPI", ""), ("nodeLabelsForPV", ""), ("labelsForPV", "")]);
    assert_eq!(loaded.config.storage_class_map["local"], default_class("/mnt/disks"));
    assert!(!loaded.config.use_alpha_api);
    assert!(loaded.config.node_labels_for_pv.is_empty());
    assert!(loaded.config.labels_for_pv.is_empty());
}

#[test]
fn explicit_class_settings_are_kept() {
    let map = "fast:\n  hostDir: /mnt/fast\n  mountDir: /host/fast\n  volumeMode: Block\n  accessMode: ReadWriteOncePod\n  namePattern: \"nvme*, ssd?\"\n  blockCleanerCommand: [\"/scripts/dd_zero.sh\"]\n";
    let loaded = ok(&[("storageClassMap", map)]);
    let c = &loaded.config.storage_class_map["fast"];
    assert_eq!(c.host_dir, "/mnt/fast");
    assert_eq!(c.mount_dir, "/host/fast");
    assert_eq!(c.volume_mode, VolumeMode::Block);
    assert_eq!(c.access_mode, "ReadWriteOncePod");
    assert_eq!(c.name_pattern, "nvme*, ssd?");
    assert_eq!(c.block_cleaner_command, vec!["/scripts/dd_zero.sh".to_string()]);
    assert_eq!(c.fs_type, None);
}

#[test]
fn several_classes_are_all_read() {
    let map = format!("{}{}{}", one_class("a", "/mnt/a"), one_class("b", "/mnt/b"), one_class("c", "/mnt/c"));
    let loaded = ok(&[("storageClassMap", &map)]);
    let names: Vec<&str> = loaded.config.storage_class_map.keys().map(String::as_str).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(loaded.config.storage_class_map["b"].host_dir, "/mnt/b");
}

// ---------------------------------------------------------------------------------------------
// Scalars: booleans, durations, lists and maps
// ---------------------------------------------------------------------------------------------

#[test]
fn yaml11_booleans_in_any_case_and_quoted() {
    let cases = [
        ("true", true),
        ("True", true),
        ("TRUE", true),
        ("\"true\"", true),
        ("'true'", true),
        ("yes", true),
        ("Yes", true),
        ("YES", true),
        ("\"yes\"", true),
        ("on", true),
        ("ON", true),
        ("On", true),
        ("y", true),
        ("Y", true),
        ("false", false),
        ("False", false),
        ("\"false\"", false),
        ("no", false),
        ("No", false),
        ("NO", false),
        ("off", false),
        ("OFF", false),
        ("n", false),
        ("N", false),
        ("", false),
        ("true\n", true),
    ];
    let keys = ["useAlphaAPI", "useJobForCleaning", "useNodeNameOnly", "setPVOwnerRef", "removeNodeNotReadyTaint"];
    for key in keys {
        for (text, want) in cases {
            let c = ok(&[(key, text)]).config;
            let got = match key {
                "useAlphaAPI" => c.use_alpha_api,
                "useJobForCleaning" => c.use_job_for_cleaning,
                "useNodeNameOnly" => c.use_node_name_only,
                "setPVOwnerRef" => c.set_pv_owner_ref,
                "removeNodeNotReadyTaint" => c.remove_node_not_ready_taint,
                _ => unreachable!(),
            };
            assert_eq!(got, want, "{key}: {text:?}");
        }
    }
}

#[test]
fn non_booleans_are_rejected_at_their_key() {
    for text in ["maybe", "\"enabled\"", "1", "[true]", "{a: b}"] {
        let ps = problems(&[("setPVOwnerRef", text)]);
        assert_eq!(locations(&ps), ["setPVOwnerRef"], "{text:?}");
    }
}

#[test]
fn min_resync_period_go_durations() {
    let cases = [
        ("5m0s", 300),
        ("\"5m0s\"", 300),
        ("\"1h30m\"", 5400),
        ("1h30m", 5400),
        ("30s", 30),
        ("1h", 3600),
        ("'10m'", 600),
        ("2h0m0s", 7200),
    ];
    for (text, secs) in cases {
        let c = ok(&[("minResyncPeriod", text)]).config;
        assert_eq!(c.min_resync_period, Duration::from_secs(secs), "{text:?}");
    }
}

#[test]
fn bad_min_resync_periods_are_rejected() {
    // Unparsable, unit-less, negative, zero.
    for text in ["soon", "5", "300", "-5m", "0s", "0", "5 minutes"] {
        let ps = problems(&[("minResyncPeriod", text)]);
        assert_eq!(locations(&ps), ["minResyncPeriod"], "{text:?}");
    }
}

#[test]
fn node_labels_for_pv_list() {
    let c =
        ok(&[("nodeLabelsForPV", "- topology.kubernetes.io/zone\n- topology.kubernetes.io/region\n- rack\n")]).config;
    assert_eq!(c.node_labels_for_pv, ["topology.kubernetes.io/zone", "topology.kubernetes.io/region", "rack"]);
}

#[test]
fn labels_for_pv_map_in_helm_style() {
    // Helm renders `<k> : <v>` with a space before the colon; numbers become strings.
    let c = ok(&[("labelsForPV", "pv-labels : can-be-selected\ntier : 1\nexample.com/team : storage\n")]).config;
    assert_eq!(
        c.labels_for_pv,
        BTreeMap::from([
            ("example.com/team".to_string(), "storage".to_string()),
            ("pv-labels".to_string(), "can-be-selected".to_string()),
            ("tier".to_string(), "1".to_string()),
        ])
    );
}

#[test]
fn wrongly_shaped_lists_and_maps_are_rejected() {
    let cases = [
        ("nodeLabelsForPV", "zone", "nodeLabelsForPV"),
        ("nodeLabelsForPV", "- [a]", "nodeLabelsForPV[0]"),
        ("labelsForPV", "- a", "labelsForPV"),
        ("labelsForPV", "enabled : [true]", "labelsForPV"),
        ("jobTolerations", "not-a-list", "jobTolerations"),
    ];
    for (key, text, loc) in cases {
        let ps = problems(&[(key, text)]);
        assert_eq!(locations(&ps), [loc], "{key}: {text:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Key matching and unknown keys
// ---------------------------------------------------------------------------------------------

#[test]
fn top_level_keys_are_case_insensitive() {
    let map = one_class("local", "/mnt/disks");
    let spellings = ["storageClassMap", "storageclassmap", "STORAGECLASSMAP", "StorageClassMap"];
    for key in spellings {
        let loaded = ok(&[(key, &map)]);
        assert_eq!(loaded.config.storage_class_map.len(), 1, "{key}");
        assert!(loaded.warnings.is_empty(), "{key}: {:?}", loaded.warnings);
    }
    let c = ok(&[
        ("SETPVOWNERREF", "true"),
        ("usenodenameonly", "yes"),
        ("MinResyncPeriod", "1m"),
        ("NODELABELSFORPV", "- a"),
    ])
    .config;
    assert!(c.set_pv_owner_ref);
    assert!(c.use_node_name_only);
    assert_eq!(c.min_resync_period, Duration::from_secs(60));
    assert_eq!(c.node_labels_for_pv, ["a"]);
}

#[test]
fn class_keys_are_case_insensitive() {
    let map = "local:\n  HOSTDIR: /mnt/disks\n  MountDir: /mnt/disks\n  VOLUMEMODE: Block\n  blockcleanercommand: [\"/scripts/shred.sh\", \"2\"]\n  ACCESSMODE: ReadWriteMany\n  NamePattern: \"sd*\"\n";
    let loaded = ok(&[("storageClassMap", map)]);
    let c = &loaded.config.storage_class_map["local"];
    assert_eq!(c.host_dir, "/mnt/disks");
    assert_eq!(c.mount_dir, "/mnt/disks");
    assert_eq!(c.volume_mode, VolumeMode::Block);
    assert_eq!(c.block_cleaner_command, ["/scripts/shred.sh", "2"]);
    assert_eq!(c.access_mode, "ReadWriteMany");
    assert_eq!(c.name_pattern, "sd*");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);

    let c = &ok(&[("storageClassMap", "local:\n  hostdir: /mnt/x\n  MOUNTDIR: /mnt/x\n  FsType: xfs\n")])
        .config
        .storage_class_map["local"];
    assert_eq!(c.fs_type.as_deref(), Some("xfs"));
}

#[test]
fn unknown_top_level_key_warns_and_succeeds() {
    let loaded = ok(&[("storageClassMap", &one_class("local", "/mnt/disks")), ("someFutureKey", "42")]);
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0].contains("someFutureKey"), "{}", loaded.warnings[0]);
    assert_eq!(loaded.config.storage_class_map.len(), 1);
}

#[test]
fn unknown_key_with_invalid_yaml_is_only_a_warning() {
    // The value of an unknown key is never parsed.
    let loaded = ok(&[("notes", "this: [is not: valid")]);
    assert_eq!(loaded.warnings.len(), 1);
    assert!(loaded.warnings[0].contains("\"notes\""), "{}", loaded.warnings[0]);
}

#[test]
fn unknown_class_key_warns_naming_class_and_key() {
    let map = "local:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n  reclaimPolicy: Retain\n";
    let loaded = ok(&[("storageClassMap", map)]);
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    let w = &loaded.warnings[0];
    assert!(w.contains("storageClassMap.local"), "{w}");
    assert!(w.contains("reclaimPolicy"), "{w}");
    assert_eq!(loaded.config.storage_class_map["local"], default_class("/mnt/disks"));
}

#[test]
fn misspelled_class_key_is_a_problem_with_a_suggestion_and_the_required_key_is_reported_missing() {
    let map = "local:\n  hostDirr: /mnt/disks\n  mountDir: /mnt/disks\n";
    let ps = problems(&[("storageClassMap", map)]);
    assert_eq!(locations(&ps), ["storageClassMap.local.hostDirr", "storageClassMap.local.hostDir"]);
    assert!(ps[0].message.contains("did you mean \"hostDir\"?"), "{}", ps[0].message);
}

#[test]
fn a_misspelt_filter_key_fails_its_class_instead_of_widening_it() {
    // Upstream ignores `namePatern` and publishes every entry; here the class is left out
    // (the other classes run) and the unknown key is named for --strict.
    let map = "wide:\n  hostDir: /mnt/a\n  mountDir: /mnt/a\n  namePatern: \"nvme*\"\nother:\n  hostDir: /mnt/b\n  mountDir: /mnt/b\n";
    let loaded = ok(&[("storageClassMap", map)]);
    assert_eq!(loaded.config.storage_class_map.keys().collect::<Vec<_>>(), ["other"]);
    let ps = &loaded.failed_classes["wide"];
    assert_eq!(locations(ps), ["storageClassMap.wide.namePatern"]);
    assert!(ps[0].message.contains("did you mean \"namePattern\"?"), "{}", ps[0].message);
    assert_eq!(loaded.unknown_keys, ["storageClassMap.wide.namePatern"]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn a_misspelt_top_level_key_refuses_the_config_instead_of_emptying_it() {
    // Upstream ignores `storageClasMap` and publishes nothing, silently.
    let err = parse_entries("cm", &entries(&[("storageClasMap", &one_class("local", "/mnt/disks"))])).unwrap_err();
    match err {
        ConfigError::Invalid { problems, .. } => {
            assert_eq!(locations(&problems), ["storageClasMap"]);
            assert!(problems[0].message.contains("did you mean \"storageClassMap\"?"), "{}", problems[0].message);
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn unknown_keys_unlike_any_known_one_stay_warnings_and_are_listed_for_strict() {
    let map = "local:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n  reclaimPolicy: Retain\n";
    let loaded = ok(&[("storageClassMap", map), ("notes", "hello")]);
    assert_eq!(loaded.config.storage_class_map.len(), 1);
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    assert_eq!(loaded.unknown_keys, ["storageClassMap.local.reclaimPolicy", "notes"]);
}

#[test]
fn a_misspelt_device_filter_names_the_likely_key() {
    let map =
        "local:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n  volumeMode: Block\n  devices:\n    minSise: 10Gi\n";
    let loaded = ok(&[("storageClassMap", map)]);
    let ps = &loaded.failed_classes["local"];
    assert!(ps.iter().any(|p| p.message.contains("did you mean \"minSize\"?")), "{ps:?}");
}

// ---------------------------------------------------------------------------------------------
// Validation: one problem per case, at the right location
// ---------------------------------------------------------------------------------------------

#[test]
fn each_invalid_class_setting_is_one_problem_at_its_location() {
    // (storageClassMap content, expected location, text the message must contain)
    let cases: &[(&str, &str, &str)] = &[
        ("fast:\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "required"),
        ("fast:\n  hostDir: /mnt/fast\n", "storageClassMap.fast.mountDir", "required"),
        ("fast:\n  hostDir: \"\"\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "required"),
        ("fast:\n  hostDir: mnt/fast\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "absolute"),
        ("fast:\n  hostDir: /mnt/fast\n  mountDir: ./fast\n", "storageClassMap.fast.mountDir", "absolute"),
        ("fast:\n  hostDir: /mnt/../etc\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "'..'"),
        ("fast:\n  hostDir: /mnt/fast/..\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "'..'"),
        ("fast:\n  hostDir: /\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /proc\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /sys\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /sys/block\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "pseudo-filesystem"),
        (
            "fast:\n  hostDir: /proc/1/root\n  mountDir: /mnt/fast\n",
            "storageClassMap.fast.hostDir",
            "pseudo-filesystem",
        ),
        ("fast:\n  hostDir: /dev\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /etc\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /etc/\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: //usr\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        ("fast:\n  hostDir: /./usr/.\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "system directory"),
        (
            "fast:\n  hostDir: /var/lib/kubelet\n  mountDir: /mnt/fast\n",
            "storageClassMap.fast.hostDir",
            "system directory",
        ),
        ("fast:\n  hostDir: /mnt/fast\n  mountDir: /\n", "storageClassMap.fast.mountDir", "system directory"),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  volumeMode: block\n",
            "storageClassMap.fast.volumeMode",
            "\"block\"",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  volumeMode: Raw\n",
            "storageClassMap.fast.volumeMode",
            "Raw",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanerCommand: []\n",
            "storageClassMap.fast.blockCleanerCommand",
            "empty list",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanerCommand: [\"\"]\n",
            "storageClassMap.fast.blockCleanerCommand",
            "empty string",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanerCommand: /scripts/shred.sh\n",
            "storageClassMap.fast.blockCleanerCommand",
            "list",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  accessMode: ReadWriteSometimes\n",
            "storageClassMap.fast.accessMode",
            "ReadWriteSometimes",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  accessMode: rwo\n",
            "storageClassMap.fast.accessMode",
            "rwo",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  namePattern: \"[\"\n",
            "storageClassMap.fast.namePattern",
            "[",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  namePattern: \",,\"\n",
            "storageClassMap.fast.namePattern",
            "holds no glob",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  selector:\n    - {}\n",
            "storageClassMap.fast.selector[0]",
            "empty term",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  selector: 3\n",
            "storageClassMap.fast.selector",
            "NodeSelectorTerm",
        ),
        ("fast:\n  hostDir: [/mnt/fast]\n  mountDir: /mnt/fast\n", "storageClassMap.fast.hostDir", "string"),
        (
            "Fast_Disks:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n",
            "storageClassMap.Fast_Disks",
            "StorageClass name",
        ),
        ("fast-:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n", "storageClassMap.fast-", "StorageClass name"),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootMode: 0775\n",
            "storageClassMap.fast.rootMode",
            "quoted",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootMode: \"0789\"\n",
            "storageClassMap.fast.rootMode",
            "octal",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootMode: \"17777\"\n",
            "storageClassMap.fast.rootMode",
            "at most 7777",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootOwner: \"app:app\"\n",
            "storageClassMap.fast.rootOwner",
            "UID:GID",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootOwner: 1000\n",
            "storageClassMap.fast.rootOwner",
            "quoted",
        ),
        (
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  volumeMode: Block\n  rootMode: \"0777\"\n",
            "storageClassMap.fast.rootMode",
            "Filesystem classes",
        ),
        ("fast: 3\n", "storageClassMap.fast", "map"),
        ("fast:\n", "storageClassMap.fast", "map"),
        ("- fast\n", "storageClassMap", "map"),
        ("fast: [\n", "storageClassMap", "YAML"),
    ];
    for (map, loc, text) in cases {
        let ps = problems(&[("storageClassMap", map)]);
        // A key the parser could not read must not also be reported as "missing".
        let at_loc: Vec<&Problem> = ps.iter().filter(|p| p.location == *loc).collect();
        assert!(!at_loc.is_empty(), "{map:?}: no problem at {loc}, got {ps:?}");
        assert!(at_loc.iter().any(|p| p.message.contains(text)), "{map:?}: {ps:?} should mention {text:?}");
        assert!(ps.iter().all(|p| p.location == *loc), "{map:?}: unexpected extra problems {ps:?}");
    }
}

#[test]
fn a_key_of_the_wrong_type_is_reported_at_that_key() {
    // `hostDir: [..]` is reported as "expected a string" and (since no value was read) as
    // "is required"; both at the same location.
    let ps = problems(&[("storageClassMap", "fast:\n  hostDir: [/mnt/fast]\n  mountDir: /mnt/fast\n")]);
    assert_eq!(ps.len(), 2, "{ps:?}");
    assert!(ps[0].message.contains("expected a string"), "{ps:?}");
    assert!(ps[1].message.contains("required"), "{ps:?}");
}

#[test]
fn acceptable_discovery_roots() {
    for dir in ["/mnt/disks", "/mnt/disks/", "/mnt//fast/./disks", "/var/lib/local-disks", "/data", "/mnt/proc"] {
        let c = ok(&[("storageClassMap", &one_class("local", dir))]).config;
        assert_eq!(c.storage_class_map["local"].host_dir, dir);
    }
}

#[test]
fn discovery_roots_inside_sensitive_host_directories_are_refused() {
    // /dev/disk/by-id would offer every unmounted disk of the host, data or not; /etc and
    // kubelet's directory hold the host's own files.
    for dir in ["/dev/disk/by-id", "/etc/lsp-disks", "/var/lib/kubelet/pods", "/usr/local/disks", "/run/disks"] {
        let p = problems(&[("storageClassMap", &one_class("local", dir))]);
        assert!(p.iter().any(|p| p.message.contains("inside the host directory")), "{dir}: {p:?}");
    }
}

#[test]
fn valid_class_names() {
    for name in ["a", "fast-disks", "local.storage.example.com", "ssd1", "0nvme"] {
        let c = ok(&[("storageClassMap", &one_class(name, "/mnt/disks"))]).config;
        assert!(c.storage_class_map.contains_key(name), "{name}");
    }
}

#[test]
fn same_host_dir_in_two_classes_is_rejected() {
    // `/mnt/disks/` and `/mnt/disks` are one directory; the class sorted second is blamed.
    let map = "a:\n  hostDir: /mnt/disks/\n  mountDir: /mnt/a\nb:\n  hostDir: /mnt/disks\n  mountDir: /mnt/b\n";
    let ps = problems(&[("storageClassMap", map)]);
    assert_eq!(locations(&ps), ["storageClassMap.b.hostDir"]);
    assert!(ps[0].message.contains("\"a\""), "{}", ps[0].message);

    let map = "a:\n  hostDir: /mnt/disks\n  mountDir: /mnt/a\nb:\n  hostDir: /mnt//disks/.\n  mountDir: /mnt/b\n";
    assert_eq!(locations(&problems(&[("storageClassMap", map)])), ["storageClassMap.b.hostDir"]);
}

#[test]
fn same_mount_dir_in_two_classes_is_rejected() {
    let map = "a:\n  hostDir: /mnt/a\n  mountDir: /disks\nb:\n  hostDir: /mnt/b\n  mountDir: /disks/\n";
    assert_eq!(locations(&problems(&[("storageClassMap", map)])), ["storageClassMap.b.mountDir"]);
}

#[test]
fn three_classes_sharing_a_host_dir_give_two_problems() {
    let map = "a:\n  hostDir: /mnt/d\n  mountDir: /m/a\nb:\n  hostDir: /mnt/d\n  mountDir: /m/b\nc:\n  hostDir: /mnt/d/\n  mountDir: /m/c\n";
    let ps = problems(&[("storageClassMap", map)]);
    assert_eq!(locations(&ps), ["storageClassMap.b.hostDir", "storageClassMap.c.hostDir"]);
    assert!(ps.iter().all(|p| p.message.contains("\"a\"")), "{ps:?}");
}

#[test]
fn other_top_level_validation() {
    let cases = [
        ("nodeLabelsForPV", "- zone\n- \"\"\n", "nodeLabelsForPV[1]"),
        ("labelsForPV", &format!("big : {}\n", "x".repeat(64)), "labelsForPV.big"),
        ("minResyncPeriod", "soon", "minResyncPeriod"),
        ("useAlphaAPI", "maybe", "useAlphaAPI"),
    ];
    for (key, text, loc) in cases {
        assert_eq!(locations(&problems(&[(key, text)])), [loc], "{key}: {text:?}");
    }
    // 63 characters is still fine.
    ok(&[("labelsForPV", &format!("big : {}\n", "x".repeat(63)))]);
}

#[test]
fn all_problems_are_reported_at_once() {
    let map = "\
Fast_Disks:
  hostDir: /mnt/fast
  mountDir: /mnt/fast
fast:
  mountDir: relative/dir
  volumeMode: Blok
  accessMode: RWX
  namePattern: \"[\"
  blockCleanerCommand: []
slow:
  hostDir: /mnt/fast/
  mountDir: /etc
";
    let ps = problems(&[
        ("storageClassMap", map),
        ("minResyncPeriod", "later"),
        ("setPVOwnerRef", "perhaps"),
        ("nodeLabelsForPV", "- \"\""),
        ("mysteryKey", "1"),
    ]);
    let mut locs = locations(&ps);
    locs.sort();
    assert_eq!(
        locs,
        [
            "minResyncPeriod",
            "nodeLabelsForPV[0]",
            "setPVOwnerRef",
            "storageClassMap.Fast_Disks",
            "storageClassMap.fast.accessMode",
            "storageClassMap.fast.blockCleanerCommand",
            "storageClassMap.fast.hostDir",
            "storageClassMap.fast.mountDir",
            "storageClassMap.fast.namePattern",
            "storageClassMap.fast.volumeMode",
            "storageClassMap.slow.hostDir",
            "storageClassMap.slow.mountDir",
        ]
    );
    assert_eq!(ps.len(), 12);
    // slow's hostDir is a duplicate of Fast_Disks' (sorted first).
    let dup = ps.iter().find(|p| p.location == "storageClassMap.slow.hostDir").unwrap();
    assert!(dup.message.contains("Fast_Disks"), "{}", dup.message);
}

#[test]
fn invalid_error_display_names_source_class_key_and_reason() {
    // A top-level problem refuses the config; the class problems are listed with it.
    let err = parse_entries(
        "/etc/provisioner/config",
        &entries(&[("storageClassMap", "fast:\n  mountDir: /mnt/fast\n"), ("useAlphaAPI", "maybe")]),
    )
    .unwrap_err();
    let text = err.to_string();
    assert_eq!(
        text,
        "invalid config in /etc/provisioner/config: 2 problem(s)\n  - useAlphaAPI: \"maybe\" is not a boolean (use true/false, yes/no or on/off)\n  - storageClassMap.fast.hostDir: is required"
    );

    let err = parse_entries(
        "cm",
        &entries(&[
            ("storageClassMap", "fast:\n  hostDir: /proc\n  mountDir: /mnt/fast\n  volumeMode: Blok\n"),
            ("minResyncPeriod", "0s"),
        ]),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("invalid config in cm: 3 problem(s)\n"), "{text}");
    assert!(text.contains("\n  - storageClassMap.fast.volumeMode: \"Blok\" is not a volume mode"), "{text}");
    assert!(text.contains("\n  - storageClassMap.fast.hostDir: \"/proc\" is a system directory"), "{text}");
}

#[test]
fn problem_display_is_location_then_message() {
    let p = Problem { location: "storageClassMap.fast.hostDir".into(), message: "is required".into() };
    assert_eq!(p.to_string(), "storageClassMap.fast.hostDir: is required");
}

#[test]
fn effective_config_serializes_like_upstream_keys() {
    let c = ok(&[("storageClassMap", &one_class("local", "/mnt/disks")), ("minResyncPeriod", "1h30m")]).config;
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["minResyncPeriod"], "1h30m0s");
    assert_eq!(v["setPVOwnerRef"], false);
    assert_eq!(v["storageClassMap"]["local"]["hostDir"], "/mnt/disks");
    assert_eq!(v["storageClassMap"]["local"]["volumeMode"], "Filesystem");
    assert_eq!(v["storageClassMap"]["local"]["blockCleanerCommand"], serde_json::json!(["/scripts/quick_reset.sh"]));
    assert!(v["storageClassMap"]["local"].get("fsType").is_none());
}

// ---------------------------------------------------------------------------------------------
// load_dir
// ---------------------------------------------------------------------------------------------

#[test]
fn load_dir_reads_kubelet_configmap_layout() {
    let tmp = TempDir::new("kubelet");
    kubelet_layout(
        tmp.path(),
        &[
            ("storageClassMap", HELM_CLASS_MAP),
            ("useNodeNameOnly", "\"true\""),
            ("minResyncPeriod", "\"1h30m\""),
            ("labelsForPV", "pv-labels : can-be-selected\n"),
        ],
    );
    let loaded = load_dir(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    // `..data` and the timestamped directory are not keys: no unknown-key warnings.
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.use_node_name_only);
    assert_eq!(loaded.config.min_resync_period, Duration::from_secs(5400));
    assert_eq!(loaded.config.storage_class_map["fast-disks"].fs_type.as_deref(), Some("ext4"));
    assert_eq!(loaded.config.labels_for_pv["pv-labels"], "can-be-selected");
}

#[test]
fn load_dir_ignores_subdirectories_and_dot_dot_entries() {
    let tmp = TempDir::new("subdir");
    std::fs::write(tmp.path().join("storageClassMap"), one_class("local", "/mnt/disks")).unwrap();
    // A subdirectory (even one named like a key) is not a key.
    std::fs::create_dir(tmp.path().join("setPVOwnerRef")).unwrap();
    std::fs::write(tmp.path().join("setPVOwnerRef").join("x"), "not a bool").unwrap();
    // A regular `..`-prefixed file is kubelet machinery, not a key.
    std::fs::write(tmp.path().join("..stray"), "garbage: [").unwrap();
    let loaded = load_dir(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(!loaded.config.set_pv_owner_ref);
    assert_eq!(loaded.config.storage_class_map["local"], default_class("/mnt/disks"));
}

#[test]
fn load_dir_plain_files_work_too() {
    let tmp = TempDir::new("plain");
    std::fs::write(tmp.path().join("storageClassMap"), one_class("local", "/mnt/disks")).unwrap();
    std::fs::write(tmp.path().join("useJobForCleaning"), "yes").unwrap();
    std::fs::write(tmp.path().join("unknownThing"), "1").unwrap();
    let loaded = load_dir(tmp.path()).unwrap();
    assert!(loaded.config.use_job_for_cleaning);
    assert_eq!(loaded.warnings.len(), 1);
    assert!(loaded.warnings[0].contains("unknownThing"));
}

#[test]
fn load_dir_reports_invalid_config_with_the_directory_as_source() {
    let tmp = TempDir::new("invalid");
    kubelet_layout(tmp.path(), &[("storageClassMap", "- not\n- a map\n")]);
    match load_dir(tmp.path()) {
        Err(ConfigError::Invalid { source_name, problems, .. }) => {
            assert_eq!(source_name, tmp.path().display().to_string());
            assert_eq!(locations(&problems), ["storageClassMap"]);
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn load_dir_missing_directory_is_a_read_error() {
    let tmp = TempDir::new("missing");
    let missing = tmp.path().join("does-not-exist");
    match load_dir(&missing) {
        Err(ConfigError::Read { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Read, got {other:?}"),
    }
}

#[test]
fn load_dir_dangling_key_symlink_is_a_read_error() {
    let tmp = TempDir::new("dangling");
    std::os::unix::fs::symlink("..data/storageClassMap", tmp.path().join("storageClassMap")).unwrap();
    match load_dir(tmp.path()) {
        Err(ConfigError::Read { path, .. }) => assert_eq!(path, tmp.path().join("storageClassMap")),
        other => panic!("expected Read, got {other:?}"),
    }
}

#[test]
fn load_dir_empty_directory_gives_defaults() {
    let tmp = TempDir::new("empty");
    let loaded = load_dir(tmp.path()).unwrap();
    assert_eq!(loaded.config, ProvisionerConfig::default());
}

#[test]
fn warnings_are_kept_when_the_config_is_refused() {
    let err = parse_entries(
        "cm",
        &entries(&[
            ("storageClassMap", "fast:\n  mountDir: /mnt/fast\n  hostPlace: /x\n"),
            ("oddKey", "1"),
            ("setPVOwnerRef", "perhaps"),
        ]),
    )
    .unwrap_err();
    match err {
        ConfigError::Invalid { problems, warnings, .. } => {
            assert_eq!(locations(&problems), ["setPVOwnerRef", "storageClassMap.fast.hostDir"]);
            assert_eq!(warnings.len(), 2, "{warnings:?}");
            assert!(warnings.iter().any(|w| w.contains("oddKey")), "{warnings:?}");
            assert!(
                warnings.iter().any(|w| w.contains("storageClassMap.fast") && w.contains("hostPlace")),
                "{warnings:?}"
            );
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn labels_for_pv_with_invalid_label_syntax_are_rejected() {
    // A label value with a space, and a key with a space: Kubernetes rejects both, so every
    // PV create would fail at runtime instead of the config being refused up front.
    for text in ["team : storage team\n", "\"pv labels\" : x\n", "tier : -bad-\n"] {
        let ps = problems(&[("labelsForPV", text)]);
        assert_eq!(ps.len(), 1, "{text:?}: {ps:?}");
        assert!(ps[0].location.starts_with("labelsForPV."), "{ps:?}");
    }
}

#[test]
fn nested_host_dirs_are_rejected_in_either_order() {
    let map = format!("{}{}", one_class("outer", "/mnt/disks"), one_class("inner", "/mnt/disks/ssd1"));
    // Both fail: the outer class would publish the inner one's directory as one volume.
    let ps = problems(&[("storageClassMap", &map)]);
    assert_eq!(locations(&ps), vec!["storageClassMap.inner.hostDir", "storageClassMap.outer.hostDir"]);
    assert!(ps.iter().all(|p| p.message.contains("must not nest")), "{ps:?}");
    // Siblings with a common name prefix are not nested.
    ok(&[("storageClassMap", &format!("{}{}", one_class("a", "/mnt/disks"), one_class("b", "/mnt/disks2")))]);
}

#[test]
fn every_enclosing_host_dir_is_reported_once_per_class_in_class_order() {
    // Three levels, a duplicate outer (also written with a trailing slash), a sibling with a
    // common string prefix, and a class whose dir only looks nested as text ("/mnt/d" vs
    // "/mnt/disks"). The duplicate is its own problem; nesting names every enclosing class.
    let map = [
        one_class("a-top", "/mnt/disks"),
        one_class("b-mid", "/mnt/disks/ssd"),
        one_class("c-leaf", "/mnt//disks/ssd/one/"),
        one_class("d-dup", "/mnt/disks/"),
        one_class("e-sibling", "/mnt/disks2"),
        one_class("f-prefix", "/mnt/d"),
    ]
    .concat();
    let ps = problems(&[("storageClassMap", &map)]);
    let got: Vec<String> = ps.iter().map(ToString::to_string).collect();
    let nest = |inner: &str, dir: &str, outer_dir: &str, outer: &str| {
        format!(
            "storageClassMap.{inner}.hostDir: {dir:?} is inside the hostDir {outer_dir:?} of class {outer:?}; discovery directories must not nest"
        )
    };
    // The outer class of a nesting fails too: it would publish the inner one's directory.
    let holds = |outer: &str, dir: &str, inner_dir: &str, inner: &str| {
        format!(
            "storageClassMap.{outer}.hostDir: {dir:?} contains the hostDir {inner_dir:?} of class {inner:?}; discovery directories must not nest"
        )
    };
    // Class by class (problems() lists failed classes in name order).
    assert_eq!(
        got,
        [
            holds("a-top", "/mnt/disks", "/mnt/disks/ssd", "b-mid"),
            holds("a-top", "/mnt/disks", "/mnt/disks/ssd/one", "c-leaf"),
            nest("b-mid", "/mnt/disks/ssd", "/mnt/disks", "a-top"),
            nest("b-mid", "/mnt/disks/ssd", "/mnt/disks", "d-dup"),
            holds("b-mid", "/mnt/disks/ssd", "/mnt/disks/ssd/one", "c-leaf"),
            nest("c-leaf", "/mnt/disks/ssd/one", "/mnt/disks", "a-top"),
            nest("c-leaf", "/mnt/disks/ssd/one", "/mnt/disks/ssd", "b-mid"),
            nest("c-leaf", "/mnt/disks/ssd/one", "/mnt/disks", "d-dup"),
            "storageClassMap.d-dup.hostDir: \"/mnt/disks/\" is already the hostDir of class \"a-top\"; one directory can serve one class".to_string(),
            "storageClassMap.d-dup.mountDir: \"/mnt/disks/\" is already the mountDir of class \"a-top\"; one directory can serve one class".to_string(),
            holds("d-dup", "/mnt/disks", "/mnt/disks/ssd", "b-mid"),
            holds("d-dup", "/mnt/disks", "/mnt/disks/ssd/one", "c-leaf"),
        ]
    );
    // The classes without a clash are used.
    let (failed_classes, config) = failed(&[("storageClassMap", &map)]);
    assert_eq!(failed_classes.keys().collect::<Vec<_>>(), ["a-top", "b-mid", "c-leaf", "d-dup"]);
    assert_eq!(config.storage_class_map.keys().collect::<Vec<_>>(), ["e-sibling", "f-prefix"]);
}

#[test]
fn nested_dirs_matches_the_pairwise_definition() {
    let pairwise = |dirs: &[&str]| {
        let mut out = Vec::new();
        for (i, inner) in dirs.iter().enumerate() {
            for (o, outer) in dirs.iter().enumerate() {
                if i != o && inner.starts_with(&format!("{outer}/")) {
                    out.push((i, o));
                }
            }
        }
        out
    };
    assert_eq!(nested_dirs(&["/mnt/disk", "/mnt/disk2", "/mnt/disk/a"]), [(2, 0)]);
    assert_eq!(nested_dirs(&["/a/b/c", "/a", "/a/b", "/a"]), [(0, 1), (0, 2), (0, 3), (2, 1), (2, 3)]);
    assert!(nested_dirs(&[]).is_empty());
    let parts = ["a", "ab", "b", "a.b"];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |bound: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % bound
    };
    let mut nested = 0;
    for _ in 0..300 {
        let dirs: Vec<String> = (0..1 + next(20))
            .map(|_| (0..1 + next(4)).map(|_| format!("/{}", parts[next(4) as usize])).collect())
            .collect();
        let dirs: Vec<&str> = dirs.iter().map(String::as_str).collect();
        let expected = pairwise(&dirs);
        nested += expected.len();
        assert_eq!(nested_dirs(&dirs), expected, "{dirs:?}");
    }
    assert!(nested > 300, "the generator must produce nesting: {nested}");
}

#[test]
fn block_class_with_fs_type_is_accepted_like_upstream() {
    let map = "raw:\n  hostDir: /mnt/raw\n  mountDir: /mnt/raw\n  volumeMode: Block\n  fsType: ext4\n";
    let loaded = ok(&[("storageClassMap", map)]);
    assert_eq!(loaded.config.storage_class_map["raw"].volume_mode, VolumeMode::Block);
}

// ---------------------------------------------------------------------------------------------
// One class's problem fails that class only
// ---------------------------------------------------------------------------------------------

#[test]
fn an_invalid_glob_fails_only_its_class() {
    let map = format!(
        "{}{}",
        one_class("good", "/mnt/good"),
        "typo:\n  hostDir: /mnt/typo\n  mountDir: /mnt/typo\n  namePattern: \"[\"\n"
    );
    let (failed_classes, config) = failed(&[("storageClassMap", &map)]);
    assert_eq!(config.storage_class_map.keys().collect::<Vec<_>>(), ["good"]);
    assert_eq!(locations(&failed_classes["typo"]), ["storageClassMap.typo.namePattern"]);
}

#[test]
fn empty_name_pattern_pieces_are_skipped_like_upstream() {
    for pattern in ["nvme*,", ",sd?", "nvme*,,sd?"] {
        let map = format!("a:\n  hostDir: /mnt/a\n  mountDir: /mnt/a\n  namePattern: \"{pattern}\"\n");
        let loaded = ok(&[("storageClassMap", &map)]);
        assert_eq!(loaded.config.storage_class_map["a"].name_pattern, pattern);
    }
}

#[test]
fn which_problems_fail_one_class_and_which_refuse_the_config() {
    let class_level = [
        "fast:\n  mountDir: /mnt/fast\n",
        "fast:\n  hostDir: relative\n  mountDir: /mnt/fast\n",
        "fast:\n  hostDir: /etc\n  mountDir: /mnt/fast\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  volumeMode: Raw\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  accessMode: RWX\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanerCommand: []\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanerCommand: [\"\"]\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  blockCleanMethod: scrub\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  selector: [{}]\n",
        "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  selector: nope\n",
        "fast:\n  hostDir: [a]\n  mountDir: /mnt/fast\n",
        "fast: just-a-string\n",
        "Fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n",
    ];
    for spec in class_level {
        let map = format!("{spec}{}", one_class("other", "/mnt/other"));
        let (failed_classes, config) = failed(&[("storageClassMap", &map)]);
        assert_eq!(failed_classes.len(), 1, "{spec:?}: {failed_classes:?}");
        assert!(!failed_classes.values().next().unwrap().is_empty(), "{spec:?}");
        assert_eq!(config.storage_class_map.keys().collect::<Vec<_>>(), ["other"], "{spec:?}");
    }
    let map = one_class("other", "/mnt/other");
    let whole = [
        ("storageClassMap", "[a, b]"),
        ("storageClassMap", "fast: [unclosed"),
        ("minResyncPeriod", "soon"),
        ("minResyncPeriod", "0s"),
        ("useNodeNameOnly", "perhaps"),
        ("nodeLabelsForPV", "- \"\""),
        ("labelsForPV", "team : storage team"),
        ("labelsForPV", "k: [a]"),
        ("jobTolerations", "not-a-list"),
    ];
    for (key, text) in whole {
        let list = [("storageClassMap", map.as_str()), (key, text)];
        let list: Vec<(&str, &str)> = if key == "storageClassMap" { vec![(key, text)] } else { list.to_vec() };
        match parse_entries("cm", &entries(&list)) {
            Err(ConfigError::Invalid { .. }) => {}
            other => panic!("{key}: {text:?} should refuse the config, got {other:?}"),
        }
    }
}

#[test]
fn labels_for_pv_unquoted_scalars_are_read_as_upstream_reads_them_with_a_warning_each() {
    let loaded = ok(&[("labelsForPV", "local : true\ntier : 1.10\ncount : 3\nname : fast\nquoted : \"012\"\n")]);
    assert_eq!(
        loaded.config.labels_for_pv,
        BTreeMap::from([
            ("count".to_string(), "3".to_string()),
            ("local".to_string(), "true".to_string()),
            ("name".to_string(), "fast".to_string()),
            ("quoted".to_string(), "012".to_string()),
            ("tier".to_string(), "1.1".to_string()),
        ])
    );
    assert_eq!(
        loaded.warnings,
        [
            "labelsForPV.local: the unquoted boolean true is read as the label value \"true\", as upstream reads it; quote it to make that explicit",
            "labelsForPV.tier: the unquoted number 1.10 is read as the label value \"1.1\", as upstream reads it, not \"1.10\"; quote it if you meant \"1.10\"",
            "labelsForPV.count: the unquoted number 3 is read as the label value \"3\", as upstream reads it; quote it to make that explicit",
        ]
    );
    // Null and empty values are the empty label value; only the written null is mentioned.
    let loaded = ok(&[("labelsForPV", "a: ~\nb:\n")]);
    assert_eq!(loaded.config.labels_for_pv["a"], "");
    assert_eq!(loaded.config.labels_for_pv["b"], "");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    // A converted key is named too.
    let loaded = ok(&[("labelsForPV", "yes: a\n")]);
    assert_eq!(loaded.config.labels_for_pv["true"], "a");
    assert!(loaded.warnings[0].starts_with("labelsForPV: the unquoted boolean yes is read as the label key \"true\""));
    // A value upstream turns into something Kubernetes refuses as a label is a problem.
    let ps = problems(&[("labelsForPV", "big: .inf\n")]);
    assert_eq!(locations(&ps), ["labelsForPV.big"]);
    assert!(ps[0].message.contains("\"+Inf\""), "{}", ps[0].message);
}

#[test]
fn cleaner_warnings_name_class_and_command() {
    let map = "\
a:\n  hostDir: /mnt/a\n  mountDir: /mnt/a\n
b:\n  hostDir: /mnt/b\n  mountDir: /mnt/b\n  blockCleanerCommand: [\"/scripts/shred.sh\", \"2\"]\n
c:\n  hostDir: /mnt/c\n  mountDir: /mnt/c\n  blockCleanerCommand: [\"/opt/wipe\", \"-x\"]\n
d:\n  hostDir: /mnt/d\n  mountDir: /mnt/d\n  blockCleanerCommand: [\"/scripts/shred.sh\", \"-h\"]\n
e:\n  hostDir: /mnt/e\n  mountDir: /mnt/e\n  blockCleanerCommand: [\"/opt/present\"]\n
f:\n  hostDir: /mnt/f\n  mountDir: /mnt/f\n  blockCleanerCommand: [\"/opt/wipe\"]\n  blockCleanMethod: zero\n";
    // blockCleanMethod together with blockCleanerCommand is a problem of class f: leave it out.
    let (_, cfg) = failed(&[("storageClassMap", map), ("useJobForCleaning", "\"yes\"")]);
    let exists = |p: &str| p == "/opt/present";
    let builtin = |argv: &[String]| -> Option<Result<String, String>> {
        match argv.first().map(String::as_str) {
            Some("/scripts/quick_reset.sh") => Some(Ok("quick".into())),
            Some("/scripts/shred.sh") if argv.get(1).is_some_and(|a| a == "-h") => Some(Err("bad argument".into())),
            Some("/scripts/shred.sh") => Some(Ok("shred".into())),
            _ => None,
        }
    };
    let warnings = cleaner_warnings(&cfg, &exists, &builtin);
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    assert_eq!(
        warnings[0],
        "storageClassMap.c.blockCleanerCommand: \"/opt/wipe\" does not exist in this container and has no built-in equivalent; released block volumes of class \"c\" will not be wiped (each wipe is refused) until the program is there (mount it) or blockCleanMethod is set"
    );
    assert!(
        warnings[1]
            .starts_with("storageClassMap.d.blockCleanerCommand: [\"/scripts/shred.sh\", \"-h\"] is upstream's script"),
        "{}",
        warnings[1]
    );
    assert!(warnings[1].contains("bad argument"), "{}", warnings[1]);
    assert!(
        warnings[2].starts_with("useJobForCleaning is set, but this provisioner runs no cleaning Jobs"),
        "{}",
        warnings[2]
    );
    // Nothing to say about a config without either.
    let (_, cfg) = failed(&[("storageClassMap", "a:\n  hostDir: /mnt/a\n  mountDir: /mnt/a\n")]);
    assert!(cleaner_warnings(&cfg, &exists, &builtin).is_empty());
}

#[test]
fn devices_section_is_read_with_every_key() {
    let map = "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  volumeMode: Block\n  devices:\n    types: [multipath, disk, disk]\n    minSize: 100Gi\n    maxSize: 2T\n    rotational: false\n    models: [\"Samsung SSD 9*\"]\n    vendors: [ATA, \"NVME*\"]\n    exclude: [sda, \"wwn-0x5000*\"]\n    maxPerNode: 4\n";
    let loaded = ok(&[("storageClassMap", map)]);
    let devices = loaded.config.storage_class_map["fast"].devices.clone().expect("devices read");
    assert_eq!(
        devices,
        DeviceSelector {
            types: vec![DeviceType::Disk, DeviceType::Multipath],
            min_size: Some(100 << 30),
            max_size: Some(2_000_000_000_000),
            rotational: Some(false),
            models: vec!["Samsung SSD 9*".into()],
            vendors: vec!["ATA".into(), "NVME*".into()],
            exclude: vec!["sda".into(), "wwn-0x5000*".into()],
            max_per_node: Some(4),
            ..Default::default()
        }
    );
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn an_empty_devices_section_claims_clean_whole_disks_and_no_section_claims_nothing() {
    let map = "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  devices:\nslow:\n  hostDir: /mnt/slow\n  mountDir: /mnt/slow\n  devices: {}\nplain:\n  hostDir: /mnt/plain\n  mountDir: /mnt/plain\n";
    let c = ok(&[("storageClassMap", map)]).config;
    assert_eq!(c.storage_class_map["fast"].devices, Some(DeviceSelector::default()));
    assert_eq!(c.storage_class_map["slow"].devices, Some(DeviceSelector::default()));
    assert_eq!(DeviceSelector::default().types, vec![DeviceType::Disk]);
    assert_eq!(c.storage_class_map["plain"].devices, None);
}

#[test]
fn a_bad_devices_section_fails_its_class_only_and_names_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        ("types: [disk, lvm]", "storageClassMap.fast.devices.types", "\"lvm\" is not a device type"),
        ("types: []", "storageClassMap.fast.devices.types", "is empty"),
        ("minSize: 10GB", "storageClassMap.fast.devices.minSize", "unknown unit \"GB\""),
        ("maxSize: lots", "storageClassMap.fast.devices.maxSize", "is not a size"),
        ("minSize: 2Ti\n    maxSize: 1Ti", "storageClassMap.fast.devices.minSize", "more than maxSize"),
        ("rotational: maybe", "storageClassMap.fast.devices.rotational", "not a boolean"),
        ("models: [\"[abc\"]", "storageClassMap.fast.devices.models[0]", "bad glob"),
        ("exclude: sda", "storageClassMap.fast.devices.exclude", "expected a list"),
        ("maxPerNode: 0", "storageClassMap.fast.devices.maxPerNode", "is 0"),
        ("maxPerNode: -1", "storageClassMap.fast.devices.maxPerNode", "positive whole number"),
        ("maxPerNode: two", "storageClassMap.fast.devices.maxPerNode", "positive whole number"),
        ("exlude: [sda]", "storageClassMap.fast.devices", "unknown key \"exlude\""),
    ];
    for (yaml, location, message) in cases {
        let map = format!(
            "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  devices:\n    {yaml}\nslow:\n  hostDir: /mnt/slow\n  mountDir: /mnt/slow\n"
        );
        let (failed_classes, config) = failed(&[("storageClassMap", &map)]);
        let ps = failed_classes.get("fast").unwrap_or_else(|| panic!("{yaml}: class fast did not fail"));
        assert!(ps.iter().any(|p| p.location == *location && p.message.contains(message)), "{yaml}: {ps:?}");
        assert!(config.storage_class_map.contains_key("slow"), "{yaml}: the other class is lost");
    }
    let map = "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  devices: [disk]\n";
    assert!(
        problems(&[("storageClassMap", map)]).iter().any(|p| p.message.contains("expected a map of device filters"))
    );
}

// ---------------------------------------------------------------------------------------------
// The devices section (its types are core::devices::device_selector's)
// ---------------------------------------------------------------------------------------------

/// The devices section of class `fast` read from `yaml`, or the problems of that class.
fn read_devices(yaml: &str) -> Result<DeviceSelector, Vec<String>> {
    let map = format!("fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  devices:\n    {yaml}\n");
    match parse_entries("t", &[("storageClassMap".into(), map)]) {
        Ok(loaded) if !loaded.failed_classes.contains_key("fast") => {
            Ok(loaded.config.storage_class_map["fast"].devices.clone().unwrap_or_default())
        }
        Ok(loaded) => {
            Err(loaded.failed_classes["fast"].iter().map(|p| format!("{}: {}", p.location, p.message)).collect())
        }
        Err(e) => Err(vec![e.to_string()]),
    }
}

#[test]
fn verify_is_sample_unless_full_is_asked_for() {
    assert_eq!(read_devices("types: [disk]").unwrap().verify, Verify::Sample);
    assert_eq!(read_devices("verify: sample").unwrap().verify, Verify::Sample);
    assert_eq!(read_devices("verify: full").unwrap().verify, Verify::Full);
    assert_eq!(read_devices("verify:").unwrap().verify, Verify::Sample, "null is left out");
    assert_eq!(DeviceSelector::default().verify, Verify::Sample);
    // Only full is written out (the effective config shows what differs).
    let full = DeviceSelector { verify: Verify::Full, ..Default::default() };
    assert_eq!(serde_json::to_value(&full).unwrap()["verify"], "full");
    assert!(serde_json::to_value(DeviceSelector::default()).unwrap().get("verify").is_none());
}

#[test]
fn a_bad_verify_value_names_the_key_and_the_choices() {
    for (yaml, message) in [
        ("verify: Full", "\"Full\" is not a verify mode (use sample, the default, or full"),
        ("verify: always", "\"always\" is not a verify mode"),
        ("verify: yes", "expected a string, got a boolean"),
        ("verify: 1", "\"1\" is not a verify mode"),
        ("verify: [full]", "expected a string"),
        ("verfy: full", "unknown key \"verfy\""),
    ] {
        let problems = read_devices(yaml).expect_err(yaml);
        let location = if yaml.starts_with("verfy") {
            "storageClassMap.fast.devices: "
        } else {
            "storageClassMap.fast.devices.verify: "
        };
        assert!(problems.iter().any(|p| p.starts_with(location) && p.contains(message)), "{yaml}: {problems:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Block classes under /dev (upstream's EKS example)
// ---------------------------------------------------------------------------------------------

#[test]
fn upstreams_eks_class_under_dev_disk_is_accepted() {
    // helm/examples/eks-nvme-ssd.yaml of upstream, as its chart renders the class (Filesystem:
    // kubelet formats each disk), and the same as a Block class.
    for mode in ["", "  volumeMode: Block\n"] {
        let map = format!(
            "nvme-ssd:\n  hostDir: /dev/disk/kubernetes\n  mountDir: /dev/disk/kubernetes\n  blockCleanerCommand:\n    - \"/scripts/shred.sh\"\n    - \"2\"\n{mode}"
        );
        let loaded = ok(&[("storageClassMap", &map)]);
        assert!(loaded.failed_classes.is_empty(), "{:?}", loaded.failed_classes);
        assert_eq!(loaded.config.storage_class_map["nvme-ssd"].host_dir, "/dev/disk/kubernetes");
    }
}

#[test]
fn dev_directories_other_than_a_dedicated_one_under_dev_disk_are_refused() {
    let class = |dir: &str, mode: &str| format!("c:\n  hostDir: {dir}\n  mountDir: {dir}\n  volumeMode: {mode}\n");
    for mode in ["Filesystem", "Block"] {
        for dir in ["/dev/disk/by-id", "/dev/disk", "/dev", "/dev/mapper", "/dev/vg0", "/dev/shm/x"] {
            let loaded = ok(&[("storageClassMap", &class(dir, mode))]);
            let problems = loaded.failed_classes.get("c").unwrap_or_else(|| panic!("{dir} ({mode}) accepted"));
            assert_eq!(locations(problems), ["storageClassMap.c.hostDir", "storageClassMap.c.mountDir"], "{dir}");
            assert!(problems[0].message.contains("/dev/disk/kubernetes"), "{dir}: {}", problems[0].message);
        }
    }
}

#[test]
fn root_mode_and_owner_are_read_and_shown_as_written() {
    let map = "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n  rootMode: \"1777\"\n  rootOwner: \"1000:2000\"\n";
    let loaded = ok(&[("storageClassMap", map)]);
    let class = &loaded.config.storage_class_map["fast"];
    assert_eq!((class.root_mode, class.root_owner), (Some(0o1777), Some((1000, 2000))));
    assert_eq!(
        class.configured_root(),
        crate::core::wipe::volume_root::ConfiguredRoot { mode: Some(0o1777), owner: Some((1000, 2000)) }
    );
    // validate-config prints them as they are written, not as numbers.
    let shown = serde_json::to_value(class).unwrap();
    assert_eq!(shown["rootMode"], "1777");
    assert_eq!(shown["rootOwner"], "1000:2000");
    // Left out: nothing configured, and nothing shown.
    let plain = ok(&[("storageClassMap", &one_class("fast", "/mnt/fast"))]);
    let plain = &plain.config.storage_class_map["fast"];
    assert_eq!(plain.configured_root(), crate::core::wipe::volume_root::ConfiguredRoot::default());
    assert!(serde_json::to_value(plain).unwrap().get("rootMode").is_none());
}
