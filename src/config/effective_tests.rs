use super::*;
use crate::config::parse_entries;

fn load(class_map: &str) -> LoadedConfig {
    parse_entries("cm", &[("storageClassMap".to_string(), class_map.to_string())]).unwrap()
}

fn class(name: &str, dir: &str) -> String {
    format!("{name}:\n  hostDir: {dir}\n  mountDir: {dir}\n")
}

fn bad(name: &str, dir: &str) -> String {
    format!("{name}:\n  hostDir: {dir}\n  mountDir: {dir}\n  accessMode: RWX\n")
}

fn names(cfg: &ProvisionerConfig) -> Vec<&str> {
    cfg.storage_class_map.keys().map(String::as_str).collect()
}

#[test]
fn at_start_up_a_failed_class_is_left_out_and_the_others_run() {
    let eff = effective(&load(&(class("a", "/mnt/a") + &bad("b", "/mnt/b"))), None);
    assert_eq!(names(&eff.config), ["a"]);
    assert!(eff.kept.is_empty());
    assert_eq!(eff.left_out.keys().collect::<Vec<_>>(), ["b"]);
    assert!(!eff.is_complete());
    assert_eq!(
        eff.describe_failures(),
        [
            "class \"b\" is invalid and not used (the other classes are): storageClassMap.b.accessMode: \"RWX\" is not an access mode (use one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod)"
        ]
    );
}

#[test]
fn on_reload_a_class_that_became_invalid_keeps_its_last_valid_definition() {
    let before = effective(&load(&(class("a", "/mnt/a") + &class("b", "/mnt/b"))), None).config;
    let eff = effective(&load(&(class("a", "/mnt/a2") + &bad("b", "/mnt/b-new"))), Some(&before));
    assert_eq!(names(&eff.config), ["a", "b"]);
    assert_eq!(eff.config.storage_class_map["a"].host_dir, "/mnt/a2", "valid changes apply");
    assert_eq!(eff.config.storage_class_map["b"], before.storage_class_map["b"], "b runs as before");
    assert_eq!(eff.kept.keys().collect::<Vec<_>>(), ["b"]);
    assert!(eff.left_out.is_empty());
    assert!(eff.describe_failures()[0].starts_with("class \"b\" is invalid, its last valid definition stays in use: "));
    // A new class that is invalid has nothing to keep.
    let eff = effective(&load(&(class("a", "/mnt/a") + &class("b", "/mnt/b") + &bad("c", "/mnt/c"))), Some(&before));
    assert_eq!(names(&eff.config), ["a", "b"]);
    assert_eq!(eff.left_out.keys().collect::<Vec<_>>(), ["c"]);
    // Fixed: used as written again.
    let eff = effective(&load(&(class("a", "/mnt/a") + &class("b", "/mnt/b3"))), Some(&eff.config));
    assert!(eff.is_complete());
    assert_eq!(eff.config.storage_class_map["b"].host_dir, "/mnt/b3");
}

#[test]
fn a_class_removed_from_the_configmap_is_removed() {
    let before = effective(&load(&(class("a", "/mnt/a") + &class("b", "/mnt/b"))), None).config;
    let eff = effective(&load(&class("a", "/mnt/a")), Some(&before));
    assert_eq!(names(&eff.config), ["a"]);
    assert!(eff.is_complete());
}

#[test]
fn a_new_definition_that_clashes_with_a_kept_one_fails_in_turn() {
    let before = effective(&load(&(class("a", "/mnt/a") + &class("b", "/mnt/b"))), None).config;
    // b moves away (with a typo, so it keeps /mnt/b); new class c takes /mnt/b: c would
    // publish b's volumes a second time.
    let map = bad("b", "/mnt/elsewhere") + &class("a", "/mnt/a") + &class("c", "/mnt/b");
    let eff = effective(&load(&map), Some(&before));
    assert_eq!(names(&eff.config), ["a", "b"]);
    assert_eq!(eff.config.storage_class_map["b"].host_dir, "/mnt/b");
    assert_eq!(eff.left_out.keys().collect::<Vec<_>>(), ["c"]);
    let why = &eff.left_out["c"][0];
    assert_eq!(why.location, "storageClassMap.c.hostDir");
    assert!(why.message.contains("class \"b\", which keeps its last valid definition"), "{}", why.message);
    // Nesting inside a kept class, either way round, is a clash too.
    for dir in ["/mnt/b/inner", "/mnt"] {
        let map = bad("b", "/mnt/elsewhere") + &class("a", "/mnt/a") + &class("c", dir);
        let eff = effective(&load(&map), Some(&before));
        assert_eq!(eff.left_out.keys().collect::<Vec<_>>(), ["c"], "{dir}");
        assert!(eff.left_out["c"][0].message.contains("nest"), "{dir}");
    }
    // A class that had a definition and now clashes falls back to its own old one; the chain
    // ends when nothing clashes.
    let map = bad("b", "/mnt/elsewhere") + &class("a", "/mnt/b");
    let eff = effective(&load(&map), Some(&before));
    assert_eq!(names(&eff.config), ["a", "b"]);
    assert_eq!(eff.config.storage_class_map["a"].host_dir, "/mnt/a");
    assert_eq!(eff.kept.keys().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn every_class_invalid_leaves_nothing_to_publish() {
    let eff = effective(&load(&(bad("a", "/mnt/a") + &bad("b", "/mnt/b"))), None);
    assert!(eff.config.storage_class_map.is_empty());
    assert_eq!(eff.left_out.len(), 2);
}
