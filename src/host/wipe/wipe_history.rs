//! The last completed wipe of each volume (`last-wipes.json` in the state directory), kept
//! durably from the moment its PV is finished until the new PV of the clean volume exists
//! (core::wipe::wipe_history): a restart in between does not lose the volume's history.
//!
//! One record per host path (a newer wipe replaces an older one); records are dropped once
//! their volume is published again or after core::wipe::wipe_history::KEEP_FOR, so the file holds
//! at most one record per volume and only for a while.

use std::path::{Path, PathBuf};

use crate::core::wipe::wipe_history::LastWipe;
use crate::host::state_file::{StateFileError, update_list};

/// The file, in the state directory.
pub const FILE: &str = "last-wipes.json";

/// The records file in `state_dir`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Adds `wipe` durably, replacing the record of the same path.
pub fn note(state_dir: &Path, wipe: &LastWipe) -> Result<(), StateFileError> {
    update_list(state_dir, &path_in(state_dir), |all: &mut Vec<LastWipe>| {
        all.retain(|w| w.host_path != wipe.host_path);
        all.push(wipe.clone());
        true
    })
    .map(drop)
}

/// Drops the records `keep` rejects (the file is written only when one goes); returns the
/// records kept.
pub fn retain(state_dir: &Path, keep: &dyn Fn(&LastWipe) -> bool) -> Result<Vec<LastWipe>, StateFileError> {
    update_list(state_dir, &path_in(state_dir), |all: &mut Vec<LastWipe>| {
        let before = all.len();
        all.retain(|w| keep(w));
        all.len() != before
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wipe(path: &str, at: &str) -> LastWipe {
        LastWipe {
            host_path: path.into(),
            identity: "v2;fs;fsid=1;volatile=tmpfs;ino=2;dev=0:50".into(),
            at: at.into(),
            method: "filesystem".into(),
            bytes: 1,
            elapsed_ms: Some(2),
            pv: "local-pv-x".into(),
            pv_uid: "u".into(),
            key_erased: None,
            earlier: Vec::new(),
        }
    }

    #[test]
    fn one_record_per_path_replaced_and_dropped_when_rejected() {
        let dir = tempfile::tempdir().unwrap();
        assert!(retain(dir.path(), &|_| true).unwrap().is_empty(), "no file: no records");
        note(dir.path(), &wipe("/a", "2026-01-01T00:00:00Z")).unwrap();
        note(dir.path(), &wipe("/b", "2026-01-01T00:00:00Z")).unwrap();
        note(dir.path(), &wipe("/a", "2026-01-02T00:00:00Z")).unwrap();
        let all = retain(dir.path(), &|_| true).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all.iter().find(|w| w.host_path == "/a").unwrap().at, "2026-01-02T00:00:00Z");
        let left = retain(dir.path(), &|w| w.host_path != "/a").unwrap();
        assert_eq!(left, vec![wipe("/b", "2026-01-01T00:00:00Z")]);
        assert_eq!(retain(dir.path(), &|_| true).unwrap(), left, "the drop is durable");
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path_in(dir.path()), b"{not a list").unwrap();
        let e = retain(dir.path(), &|_| true).unwrap_err().to_string();
        assert!(e.contains(FILE), "{e}");
    }
}
