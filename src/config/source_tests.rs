use std::path::Path;
use std::time::Duration;

use super::*;
use crate::config::load_dir;

/// A class map whose text has the same length for every `n` in 0..10, so an edit keeps the
/// file size.
fn class_map(n: u32) -> String {
    format!("fast:\n  hostDir: /mnt/disks{n}\n  mountDir: /mnt/disks{n}\n")
}

/// The hostDir of the only class, or the error's text.
fn host_dir(loaded: Option<Result<LoadedConfig, ConfigError>>) -> Result<String, String> {
    match loaded {
        Some(Ok(l)) => Ok(l.config.storage_class_map["fast"].host_dir.clone()),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("unchanged".into()),
    }
}

/// Projects `keys` the way kubelet's atomic writer does: files in a new timestamped
/// directory, `..data_tmp` pointing at it renamed over `..data`, key symlinks through
/// `..data` (made once), and the previous timestamped directory removed.
fn project(dir: &Path, stamp: &str, keys: &[(&str, &str)]) {
    let ts = dir.join(stamp);
    std::fs::create_dir(&ts).unwrap();
    for (k, v) in keys {
        std::fs::write(ts.join(k), v).unwrap();
    }
    let previous = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(stamp, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (k, _) in keys {
        let link = dir.join(k);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{k}"), link).unwrap();
        }
    }
    if let Some(previous) = previous {
        std::fs::remove_dir_all(dir.join(previous)).unwrap();
    }
}

#[test]
fn an_unchanged_directory_is_not_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path(), "..1", &[("storageClassMap", &class_map(1))]);
    // Settled at once: only metadata decides.
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::ZERO);
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks1".into()));
    assert_eq!(source.reads(), 1);
    for _ in 0..3 {
        assert!(source.load_if_changed().is_none());
    }
    assert_eq!(source.reads(), 1, "an unchanged pass must not read the files");
}

#[test]
fn the_first_call_loads_like_load_dir() {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path(), "..1", &[("storageClassMap", &class_map(1)), ("oddKey", "1")]);
    let loaded = ConfigSource::new(tmp.path()).load_if_changed().unwrap().unwrap();
    let direct = load_dir(tmp.path()).unwrap();
    assert_eq!(loaded.config, direct.config);
    assert_eq!(loaded.warnings, direct.warnings);
}

#[test]
fn a_same_size_edit_in_the_same_second_is_seen() {
    // Written and rewritten within milliseconds: the stamps may be identical on a filesystem
    // with coarse timestamps, and the unsettled fingerprint makes the bytes decide.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("storageClassMap");
    std::fs::write(&file, class_map(1)).unwrap();
    let mut source = ConfigSource::new(tmp.path());
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks1".into()));
    std::fs::write(&file, class_map(2)).unwrap();
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks2".into()));
    assert!(source.load_if_changed().is_none());
}

#[test]
fn a_changed_mtime_alone_is_enough_to_look() {
    // Metadata only (settled at once): the same size and content, a different mtime. The
    // files are read again, found equal, and nothing is reported.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("storageClassMap");
    std::fs::write(&file, class_map(1)).unwrap();
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::ZERO);
    assert!(source.load_if_changed().is_some());
    let f = std::fs::File::options().write(true).open(&file).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000)).unwrap();
    assert!(source.load_if_changed().is_none());
    assert_eq!(source.reads(), 2);
    // Same size, new content, and an mtime set back to a value seen before: ctime and the
    // bytes still tell.
    std::fs::write(&file, class_map(3)).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000)).unwrap();
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks3".into()));
}

#[test]
fn unsettled_stamps_are_confirmed_by_the_bytes_and_reported_once() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("storageClassMap"), class_map(1)).unwrap();
    // Never settled: every call reads, but only a difference in bytes is reported.
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::from_secs(3600));
    assert!(source.load_if_changed().is_some());
    assert!(source.load_if_changed().is_none());
    assert!(source.load_if_changed().is_none());
    assert_eq!(source.reads(), 3);
    std::fs::write(tmp.path().join("storageClassMap"), class_map(2)).unwrap();
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks2".into()));
    assert!(source.load_if_changed().is_none());
}

#[test]
fn a_configmap_swap_of_data_is_seen() {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path(), "..2026_01_01_00_00_00.1", &[("storageClassMap", &class_map(1))]);
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::ZERO);
    assert!(source.load_if_changed().is_some());
    project(tmp.path(), "..2026_01_01_00_00_00.2", &[("storageClassMap", &class_map(2))]);
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks2".into()));
    assert!(source.load_if_changed().is_none());
    // A new projection with the same bytes is looked at but not reported.
    project(tmp.path(), "..2026_01_01_00_00_00.3", &[("storageClassMap", &class_map(2))]);
    assert!(source.load_if_changed().is_none());
    assert_eq!(source.reads(), 3);
}

#[test]
fn keys_added_or_removed_are_seen_and_kubelet_entries_are_not_keys() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("storageClassMap"), class_map(1)).unwrap();
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::ZERO);
    assert!(!source.load_if_changed().unwrap().unwrap().config.use_node_name_only);
    std::fs::write(tmp.path().join("useNodeNameOnly"), "true").unwrap();
    assert!(source.load_if_changed().unwrap().unwrap().config.use_node_name_only);
    std::fs::remove_file(tmp.path().join("useNodeNameOnly")).unwrap();
    assert!(!source.load_if_changed().unwrap().unwrap().config.use_node_name_only);
    // Entries the loader skips change nothing it reads.
    std::fs::write(tmp.path().join("..stray"), "garbage: [").unwrap();
    assert!(source.load_if_changed().is_none());
    std::fs::create_dir(tmp.path().join("aDirectory")).unwrap();
    assert!(source.load_if_changed().is_none());
}

#[test]
fn an_invalid_config_is_reported_once_until_fixed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("storageClassMap");
    std::fs::write(&file, class_map(1)).unwrap();
    let mut source = ConfigSource::new(tmp.path());
    assert!(matches!(source.load_if_changed(), Some(Ok(_))));
    std::fs::write(&file, "[not, a, map]\n").unwrap();
    assert!(matches!(source.load_if_changed(), Some(Err(ConfigError::Invalid { .. }))));
    assert!(source.load_if_changed().is_none());
    assert!(source.load_if_changed().is_none());
    std::fs::write(&file, class_map(4)).unwrap();
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks4".into()));
    assert!(source.load_if_changed().is_none());
}

#[test]
fn read_errors_and_a_missing_directory_are_reported_once_until_fixed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("config");
    let mut source = ConfigSource::new(&dir);
    assert!(matches!(source.load_if_changed(), Some(Err(ConfigError::Read { .. }))));
    assert!(source.load_if_changed().is_none());
    std::fs::create_dir(&dir).unwrap();
    // A key symlink into a ..data that is not there yet.
    std::os::unix::fs::symlink("..data/storageClassMap", dir.join("storageClassMap")).unwrap();
    match source.load_if_changed() {
        Some(Err(ConfigError::Read { path, .. })) => assert_eq!(path, dir.join("storageClassMap")),
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(source.load_if_changed().is_none());
    project(&dir, "..1", &[("storageClassMap", &class_map(5))]);
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks5".into()));
}

#[test]
fn fingerprints_settle_only_when_every_stamp_is_old_enough() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("storageClassMap"), class_map(1)).unwrap();
    let fp = Fingerprint::take(tmp.path());
    let now = std::time::SystemTime::now();
    assert!(!fp.settled(now, SETTLE), "just written");
    assert!(fp.settled(now + SETTLE + Duration::from_secs(1), SETTLE));
    assert!(Fingerprint::Unlisted("gone".into()).settled(now, SETTLE));
}

#[test]
fn a_forced_load_always_loads_and_is_the_base_for_the_next_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("storageClassMap");
    std::fs::write(&file, "[not, a, map]\n").unwrap();
    let mut source = ConfigSource::with_settle(tmp.path(), Duration::ZERO);
    assert!(matches!(source.load(), Err(ConfigError::Invalid { .. })));
    // Already reported by load(): not again.
    assert!(source.load_if_changed().is_none());
    assert!(matches!(source.load(), Err(ConfigError::Invalid { .. })), "load() reports even when unchanged");
    std::fs::write(&file, class_map(6)).unwrap();
    assert_eq!(host_dir(source.load_if_changed()), Ok("/mnt/disks6".into()));
    assert_eq!(source.load().map(|l| l.config.storage_class_map.len()).ok(), Some(1));
    assert!(source.load_if_changed().is_none());
}
