use super::*;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local-provisioner-config\n  namespace: kube-system\ndata:\n  storageClassMap: |\n    fast:\n      hostDir: /mnt/fast\n      mountDir: /mnt/fast\n  useAlphaAPI: \"true\"\n";

#[test]
fn a_configmap_manifest_is_read() {
    let loaded = load_manifest("cm.yaml", CM).unwrap();
    assert_eq!(loaded.config.storage_class_map["fast"].host_dir, "/mnt/fast");
    assert!(loaded.config.use_alpha_api);
}

#[test]
fn other_kinds_are_ignored_in_multi_document_files_and_lists() {
    let multi = format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: sa}}\n---\n{CM}---\n");
    assert!(load_manifest("all.yaml", &multi).unwrap().config.storage_class_map.contains_key("fast"));
    let cm: Value = serde_saphyr::from_str(CM).unwrap();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, cm]});
    let text = serde_json::to_string(&list).unwrap();
    assert!(load_manifest("list.json", &text).unwrap().config.storage_class_map.contains_key("fast"));
}

#[test]
fn the_configmap_with_provisioner_keys_is_chosen_among_several() {
    let other = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: unrelated}\ndata:\n  app.conf: x\n";
    let text = format!("{other}---\n{CM}");
    assert!(load_manifest("f", &text).unwrap().config.use_alpha_api);
    // Two with provisioner keys, or several without: which one is meant cannot be told.
    let e = load_manifest("f", &format!("{CM}---\n{}", CM.replace("local-provisioner-config", "second"))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "f: several ConfigMaps could hold the provisioner config (kube-system/local-provisioner-config, kube-system/second); keep only the provisioner's in the file"
    );
    let e = load_manifest("f", &format!("{other}---\n{}", other.replace("unrelated", "b"))).unwrap_err();
    assert!(matches!(e, ManifestError::SeveralConfigMaps { .. }), "{e}");
}

#[test]
fn clear_errors_for_what_is_not_a_usable_configmap() {
    let cases = [
        (
            "storageClassMap:\n  fast: {}\n",
            "f: document 1 is not a Kubernetes object (it has no kind); give a ConfigMap manifest, or use --config-dir for a directory of key files",
        ),
        (
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: lsp, namespace: x}\n",
            "f: no ConfigMap in it (found: DaemonSet x/lsp)",
        ),
        ("", "f: no ConfigMap in it (found: nothing)"),
        (
            "kind: ConfigMap\nmetadata: {name: c}\nbinaryData:\n  storageClassMap: AAAA\n",
            "f: ConfigMap c has binaryData (storageClassMap); the provisioner reads its config as text, put it under data",
        ),
        (
            "kind: ConfigMap\nmetadata: {name: c}\ndata:\n  useAlphaAPI: true\n",
            "f: ConfigMap c: data.useAlphaAPI must be a string (a block scalar `|` for YAML), got a boolean",
        ),
        ("kind: ConfigMap\nmetadata: {name: c}\ndata: [a]\n", "f: ConfigMap c: data must be a map of keys to strings"),
        ("kind: ConfigMap\ndata: {a: [unclosed\n", "f: not valid YAML"),
    ];
    for (text, want) in cases {
        let e = load_manifest("f", text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{text:?}:\n got {e}\nwant {want}");
    }
}

#[test]
fn the_config_errors_name_the_file_and_the_configmap() {
    let text = CM.replace("useAlphaAPI: \"true\"", "useAlphaAPI: \"maybe\"");
    match load_manifest("cm.yaml", &text) {
        Err(ManifestError::Config(ConfigError::Invalid { source_name, .. })) => {
            assert_eq!(source_name, "cm.yaml (ConfigMap kube-system/local-provisioner-config)");
        }
        other => panic!("expected a refused config, got {other:?}"),
    }
    // A ConfigMap without data is upstream's defaults.
    let loaded = load_manifest("f", "kind: ConfigMap\nmetadata: {name: c}\n").unwrap();
    assert!(loaded.config.storage_class_map.is_empty());
}
