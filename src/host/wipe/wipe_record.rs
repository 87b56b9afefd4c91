//! The durable record of completed wipes (`wiped.json` in the state directory), so that a
//! wipe whose PV could not be finished (an API error after an hours-long zero-fill, a panic, a
//! crash) is not done again in full: the retry proves that the disk is still the one wiped and
//! that nothing was written to it since, and then only finishes the PV.
//!
//! A record is honoured only for the same PV (UID), released by the same claim (UID), on the
//! same disk (the identity the wipe proved on its own descriptor, proven again now), and only
//! while the disk shows that nothing was written since the wipe:
//! - a filesystem: its root is still empty (the wipe's whole promise: it removes every entry);
//! - a block device: its kernel write counters (writes, sectors, discards, flushes) are those
//!   read right after the wipe, in the same boot (counters start again at a boot); and for a
//!   loop device, whose backing file can be written without the device (its counters do not
//!   move then), the backing file is the same one, unchanged (size, modification and change
//!   times).
//!
//! Why nothing else can have written in between: the wipe starts only once kubelet holds no
//! mount of the volume for a pod, and a Released PV gets no new pod (its claim is gone, and
//! its claimRef names that claim's UID, which no new claim can have). A PV re-bound meanwhile
//! (an operator cleared its claimRef, a new claim bound and released it) names another claim:
//! its record does not apply. Anyone else who wrote (a host process, an operator) moved the
//! counters or left an entry. A record that does not hold is dropped and the disk wiped again.
//!
//! Records are removed once their PV is finished, and pruned when their PV is gone or needs
//! no wipe (wiper::Cleaner::retain), so the file does not only grow.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::core::devices::activity::{IoStat, written_between};
use crate::host::state_file::{StateFileError, read_list, update_list};

/// The file, in the state directory.
pub const FILE: &str = "wiped.json";

/// Why the records cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The state file failed (names the file).
    #[error("completed-wipe records: {0}")]
    State(#[from] StateFileError),
}

/// A device's write counters right after a wipe, and the boot they were read in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Written {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
    /// Write requests completed.
    pub writes: u64,
    /// Sectors written.
    pub sectors: u64,
    /// Discard requests completed.
    pub discards: u64,
    /// Flush requests completed.
    pub flushes: u64,
    /// For a loop device: its backing file's identity and change times
    /// (`dev:ino size mtime ctime`), which a write to the file itself moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing: Option<String>,
}

impl Written {
    /// The counters of `stat`, read in boot `boot`.
    pub fn from_stat(boot: &str, stat: &IoStat, backing: Option<String>) -> Self {
        Written {
            boot: boot.to_string(),
            writes: stat.writes,
            sectors: stat.write_sectors,
            discards: stat.discards,
            flushes: stat.flushes,
            backing,
        }
    }

    fn stat(&self) -> IoStat {
        IoStat {
            writes: self.writes,
            write_sectors: self.sectors,
            in_flight: 0,
            discards: self.discards,
            flushes: self.flushes,
        }
    }
}

/// One completed wipe whose PV is not finished yet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WipedRecord {
    /// The PV's UID.
    pub uid: String,
    /// The UID of the claim the PV was released by (None: it never had one).
    pub claim: Option<String>,
    /// The identity the wipe proved on its own descriptor.
    pub identity: String,
    /// "fs" or "block".
    pub mode: String,
    /// For a block device, its write counters right after the wipe.
    pub written: Option<Written>,
    /// When the wipe completed, how, and the bytes it wiped (for the volume's history,
    /// core::wipe::wipe_history; absent in records of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The encrypted volume's key the wipe destroyed, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_erased: Option<crate::core::wipe::wipe_history::KeyErased>,
}

/// What the disk shows now, for [`honoured`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Now {
    /// A filesystem, with this many entries in its root.
    Filesystem { entries: usize },
    /// A block device with these counters, read in this boot (None: not readable).
    Block { written: Option<Written> },
}

/// Whether `record` lets the wipe of PV `uid` (released by claim `claim`) be skipped, given
/// the identity proven now and what the disk shows: `Ok` or why not.
pub fn honoured(record: &WipedRecord, uid: &str, claim: Option<&str>, identity: &str, now: &Now) -> Result<(), String> {
    if record.uid != uid {
        return Err(format!("the record is of another PV ({})", record.uid));
    }
    if record.claim.as_deref() != claim {
        return Err(format!(
            "the PV was released by another claim since ({:?} then, {claim:?} now)",
            record.claim.as_deref()
        ));
    }
    if record.identity != identity {
        return Err(format!("the disk is not the one wiped ({} then, {identity} now)", record.identity));
    }
    match (record.mode.as_str(), now) {
        ("fs", Now::Filesystem { entries: 0 }) => Ok(()),
        ("fs", Now::Filesystem { entries }) => Err(format!("{entries} entries were written to its root since")),
        ("block", Now::Block { written: Some(now) }) => {
            let Some(then) = &record.written else {
                return Err("its write counters were not read after the wipe".into());
            };
            if then.boot != now.boot {
                return Err("the node booted since (its write counters started again)".into());
            }
            if then.backing != now.backing {
                return Err(format!(
                    "its loop device's backing file changed since ({:?} then, {:?} now)",
                    then.backing, now.backing
                ));
            }
            match written_between(&then.stat(), &now.stat()) {
                None => Ok(()),
                Some(what) => Err(format!("it was written since: {what}")),
            }
        }
        ("block", Now::Block { written: None }) => Err("its write counters cannot be read".into()),
        (mode, now) => Err(format!("the record is of a {mode} wipe, the volume now is {now:?}")),
    }
}

/// The records file in `state_dir`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Every record.
pub fn read(state_dir: &Path) -> Result<Vec<WipedRecord>, RecordError> {
    Ok(read_list(&path_in(state_dir))?)
}

/// Adds `record` durably, replacing any record of the same PV.
pub fn keep(state_dir: &Path, record: WipedRecord) -> Result<(), RecordError> {
    update_list(state_dir, &path_in(state_dir), |all: &mut Vec<WipedRecord>| {
        all.retain(|r| r.uid != record.uid);
        all.push(record);
        true
    })?;
    Ok(())
}

/// Drops the records whose PV UID `keep` rejects (written only when one goes); returns the
/// UIDs still recorded.
pub fn retain(state_dir: &Path, keep: &dyn Fn(&str) -> bool) -> Result<Vec<String>, RecordError> {
    let all = update_list(state_dir, &path_in(state_dir), |all: &mut Vec<WipedRecord>| {
        let before = all.len();
        all.retain(|r| keep(&r.uid));
        all.len() != before
    })?;
    Ok(all.into_iter().map(|r| r.uid).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(boot: &str, writes: u64, sectors: u64, discards: u64, flushes: u64) -> Written {
        Written { boot: boot.into(), writes, sectors, discards, flushes, backing: None }
    }

    fn fs_record() -> WipedRecord {
        WipedRecord {
            uid: "u1".into(),
            claim: Some("c1".into()),
            identity: "v2;fs;uuid=a;ino=2;dev=8:1".into(),
            mode: "fs".into(),
            written: None,
            at: None,
            method: None,
            bytes: None,
            key_erased: None,
        }
    }

    fn block_record() -> WipedRecord {
        WipedRecord {
            uid: "u1".into(),
            claim: Some("c1".into()),
            identity: "v2;block;serial=s1".into(),
            mode: "block".into(),
            written: Some(written("b1", 10, 800, 1, 2)),
            at: Some("2026-11-28T10:00:00Z".into()),
            method: Some("quick".into()),
            bytes: Some(800 * 512),
            key_erased: None,
        }
    }

    #[test]
    fn a_record_is_honoured_only_for_the_same_pv_claim_and_disk_with_nothing_written_since() {
        let (fs, block) = (fs_record(), block_record());
        let empty = Now::Filesystem { entries: 0 };
        let same = Now::Block { written: Some(written("b1", 10, 800, 1, 2)) };
        // Every field that can differ, alone, for both kinds: (record, uid, claim, identity, now, honoured).
        type Case<'a> = (&'a WipedRecord, &'a str, Option<&'a str>, &'a str, Now, bool);
        let cases: Vec<Case> = vec![
            (&fs, "u1", Some("c1"), &fs.identity, empty.clone(), true),
            (&fs, "u2", Some("c1"), &fs.identity, empty.clone(), false),
            (&fs, "u1", Some("c2"), &fs.identity, empty.clone(), false),
            (&fs, "u1", None, &fs.identity, empty.clone(), false),
            (&fs, "u1", Some("c1"), "v2;fs;uuid=b;ino=2;dev=8:1", empty.clone(), false),
            (&fs, "u1", Some("c1"), &fs.identity, Now::Filesystem { entries: 1 }, false),
            (&fs, "u1", Some("c1"), &fs.identity, same.clone(), false),
            (&block, "u1", Some("c1"), &block.identity, same.clone(), true),
            (&block, "u2", Some("c1"), &block.identity, same.clone(), false),
            (&block, "u1", Some("c2"), &block.identity, same.clone(), false),
            (&block, "u1", Some("c1"), "v2;block;serial=s2", same.clone(), false),
            (&block, "u1", Some("c1"), &block.identity, Now::Block { written: None }, false),
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b2", 10, 800, 1, 2)) },
                false,
            ),
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b1", 11, 800, 1, 2)) },
                false,
            ),
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b1", 10, 808, 1, 2)) },
                false,
            ),
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b1", 10, 800, 2, 2)) },
                false,
            ),
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b1", 10, 800, 1, 3)) },
                false,
            ),
            // Counters that went down: another device took the number.
            (
                &block,
                "u1",
                Some("c1"),
                &block.identity,
                Now::Block { written: Some(written("b1", 9, 800, 1, 2)) },
                false,
            ),
            (&block, "u1", Some("c1"), &block.identity, empty.clone(), false),
        ];
        for (i, (record, uid, claim, identity, now, want)) in cases.into_iter().enumerate() {
            let got = honoured(record, uid, claim, identity, &now);
            assert_eq!(got.is_ok(), want, "case {i}: {got:?}");
        }
        let no_counters = WipedRecord { written: None, ..block_record() };
        assert!(honoured(&no_counters, "u1", Some("c1"), &no_counters.identity, &same).is_err());
        let unclaimed = WipedRecord { claim: None, ..fs_record() };
        assert!(honoured(&unclaimed, "u1", None, &unclaimed.identity, &empty).is_ok());
    }

    #[test]
    fn a_loop_devices_record_holds_only_while_its_backing_file_is_unchanged() {
        let backed = |b: Option<&str>| Written { backing: b.map(str::to_string), ..written("b1", 10, 800, 1, 2) };
        let record = WipedRecord { written: Some(backed(Some("8:1:12 4096 1.0 1.0"))), ..block_record() };
        let at = |b: Option<&str>| {
            honoured(&record, "u1", Some("c1"), &record.identity, &Now::Block { written: Some(backed(b)) })
        };
        assert!(at(Some("8:1:12 4096 1.0 1.0")).is_ok());
        // The file written directly (the device's counters unmoved), replaced, grown, or no
        // longer to be seen: not honoured, wiped again.
        for now in [Some("8:1:12 4096 2.0 2.0"), Some("8:1:13 4096 1.0 1.0"), Some("8:1:12 8192 1.0 1.0"), None] {
            assert!(at(now).is_err(), "{now:?}");
        }
        // A record of a device that was not a loop device does not hold for one that is.
        let plain = block_record();
        let now = Now::Block { written: Some(backed(Some("8:1:12 4096 1.0 1.0"))) };
        assert!(honoured(&plain, "u1", Some("c1"), &plain.identity, &now).is_err());
    }

    #[test]
    fn records_are_kept_durably_replaced_per_pv_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        keep(dir.path(), fs_record()).unwrap();
        keep(dir.path(), WipedRecord { uid: "u2".into(), ..block_record() }).unwrap();
        keep(dir.path(), WipedRecord { claim: None, ..fs_record() }).unwrap();
        let all = read(dir.path()).unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all.iter().any(|r| r.uid == "u1" && r.claim.is_none()), "replaced: {all:?}");
        assert_eq!(retain(dir.path(), &|uid| uid == "u2").unwrap(), vec!["u2".to_string()]);
        assert_eq!(read(dir.path()).unwrap().len(), 1);
        assert_eq!(retain(dir.path(), &|_| false).unwrap(), Vec::<String>::new());
        assert!(read(dir.path()).unwrap().is_empty());
        std::fs::write(path_in(dir.path()), b"{").unwrap();
        let e = read(dir.path()).unwrap_err();
        assert!(e.to_string().contains(FILE), "{e}");
    }
}
