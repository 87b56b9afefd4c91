//! The durable "used" mark: the record, kept with the disk itself where it can be, that a disk
//! was published and so may hold a tenant's data. A PV object alone cannot carry that fact: once
//! the PV is gone (deleted by node-cleanup, by an operator, with the finalizer forced off) or
//! the disk moves away from the path it names, nothing would remember it, and the disk would be
//! offered again with the data on it.
//!
//! - Where: on a filesystem volume's root directory as the extended attribute
//!   [`XATTR_NAME`] (`trusted.` namespace: only a process with CAP_SYS_ADMIN in the host's user
//!   namespace can read or change it, so a tenant's pod cannot; it is not a file, so the tenant
//!   does not see it in the volume; and it moves, is copied and is cloned with the filesystem).
//!   A block device cannot carry anything outside the tenant's own bytes, so block volumes (and
//!   filesystems with a device under them, which could later be exposed as a block volume) are
//!   also recorded in a node-local ledger keyed by disk identity (`host::used_mark`).
//! - When: written before the PV that publishes the disk is created (no create without it),
//!   and put on PVs made by upstream or older versions once a claim uses them.
//! - Cleared: only by a completed wipe of that very disk (the PV's wipe or a wipe-first).
//!
//! Pure: the host reads and writes the mark; this module says what a found mark means.

use serde::{Deserialize, Serialize};

/// The extended attribute that carries the mark on a filesystem volume's root directory.
pub const XATTR_NAME: &str = "trusted.local-static-provisioner.used";

/// What the mark says: which PV published the disk, where and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsedMark {
    /// The PV the disk was published as.
    pub pv: String,
    /// The node it was published on.
    pub node: String,
    /// The volume's host path then.
    pub path: String,
    /// The disk identity found then (see core::disk_identity): the ledger's key.
    pub identity: String,
    /// When the mark was written (RFC 3339).
    pub at: String,
    /// The PV's UID, written once the API confirmed the PV was created. A mark without it was
    /// written just before a create whose outcome was not seen: if no PV of that name exists,
    /// the disk was never offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl UsedMark {
    /// The value stored in the attribute or ledger line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored value; `None` for anything that is not a mark of ours.
    pub fn from_json(text: &[u8]) -> Option<Self> {
        serde_json::from_slice(text).ok()
    }
}

/// What the host found about a disk's mark.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UsedRead {
    /// Neither the disk nor the ledger says it was published.
    #[default]
    Unmarked,
    /// The disk was published (and not wiped since).
    Marked(UsedMark),
    /// The mark could not be read, or does not settle it (unreadable attribute or ledger, a
    /// ledger entry that may or may not be this disk): the disk may hold a tenant's data.
    Unknown(String),
}

/// What discovery may do with a disk, given its mark and the live PVs that name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsedVerdict {
    /// Publish as usual: nothing says the disk holds anyone's data.
    Publish,
    /// The disk was ours and no live PV names it: wipe it, then publish it clean.
    WipeFirst,
    /// A live PV (name, host path) still names the disk: it holds that PV's data. Neither
    /// published nor wiped.
    HeldBy { pv: String, path: String },
    /// Whether the disk was used cannot be told: neither published nor wiped.
    Unknown(String),
}

/// Decides about a disk about to be published under a new PV. `holder` is a live PV (not the
/// one about to be made) whose recorded disk this is, as the planner found it by identity;
/// `mark_pv_exists` whether a PV with the name in the mark exists at all. A live holder wins
/// over everything (its data is on the disk, so no wipe); then a mark that cannot be read
/// holds the disk back; then a mark means the disk is wiped first, except a mark written for
/// a create that never happened (no UID recorded and no such PV).
pub fn used_verdict(read: &UsedRead, holder: Option<(&str, &str)>, mark_pv_exists: bool) -> UsedVerdict {
    match (holder, read) {
        (Some((pv, path)), _) => UsedVerdict::HeldBy { pv: pv.to_string(), path: path.to_string() },
        (None, UsedRead::Unknown(why)) => UsedVerdict::Unknown(why.clone()),
        (None, UsedRead::Marked(m)) if m.uid.is_none() && !mark_pv_exists => UsedVerdict::Publish,
        (None, UsedRead::Marked(_)) => UsedVerdict::WipeFirst,
        (None, UsedRead::Unmarked) => UsedVerdict::Publish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> UsedMark {
        UsedMark {
            pv: "local-pv-1".into(),
            node: "n1".into(),
            path: "/mnt/disks/v1".into(),
            identity: "v2;blk;disk=wwid:x;size=1;dev=8:0".into(),
            at: "2026-11-24T00:00:00Z".into(),
            uid: Some("uid-1".into()),
        }
    }

    #[test]
    fn round_trips_and_rejects_what_is_not_a_mark() {
        let m = mark();
        assert_eq!(UsedMark::from_json(m.to_json().as_bytes()), Some(m));
        for junk in [&b""[..], b"used", b"{}", b"{\"pv\":1}", b"\xff\xfe"] {
            assert_eq!(UsedMark::from_json(junk), None, "{junk:?}");
        }
    }

    /// Exhaustive: a disk that is marked, unknown or held is never published as it is, and a
    /// disk a live PV names is never wiped.
    #[test]
    fn used_disks_are_never_published_unwiped_and_held_ones_never_wiped() {
        let pending = UsedMark { uid: None, ..mark() };
        let reads = [
            UsedRead::Unmarked,
            UsedRead::Marked(mark()),
            UsedRead::Marked(pending.clone()),
            UsedRead::Unknown("ledger unreadable".into()),
        ];
        for read in &reads {
            for holder in [None, Some(("local-pv-2", "/mnt/disks/v2"))] {
                for exists in [false, true] {
                    let verdict = used_verdict(read, holder, exists);
                    let ctx = format!("{read:?} holder={holder:?} exists={exists} -> {verdict:?}");
                    // Published as it is only when nothing says it was ever offered.
                    let never_offered =
                        *read == UsedRead::Unmarked || (*read == UsedRead::Marked(pending.clone()) && !exists);
                    assert_eq!(verdict == UsedVerdict::Publish, never_offered && holder.is_none(), "{ctx}");
                    if holder.is_some() {
                        assert!(matches!(verdict, UsedVerdict::HeldBy { .. }), "{ctx}");
                    }
                    if verdict == UsedVerdict::WipeFirst {
                        assert!(matches!(read, UsedRead::Marked(_)) && holder.is_none(), "{ctx}");
                    }
                    if matches!(read, UsedRead::Unknown(_)) {
                        assert!(!matches!(verdict, UsedVerdict::Publish | UsedVerdict::WipeFirst), "{ctx}");
                    }
                }
            }
        }
    }
}
