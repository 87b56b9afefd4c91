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
//!   also recorded in a node-local ledger keyed by disk identity (`host::identity::used_mark`). So is a
//!   filesystem that cannot hold the attribute (vfat, exFAT, NFS, a read-only mount): its mark
//!   is node-local only, and the agent says so (a `UsedMarkNodeLocal` event).
//! - When: written before the PV that publishes the disk is created (no create without it),
//!   and put on PVs made by upstream or older versions once a claim uses them.
//! - Cleared: only by a completed wipe of that very disk (the PV's wipe or a wipe-first).
//!
//! Pure: the host reads and writes the mark; this module says what a found mark means.

use serde::{Deserialize, Serialize};

use crate::core::identity::disk_identity::{DiskIdentity, Kind, may_share_disk, split_partition};

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
    /// The disk identity found then (see core::identity::disk_identity): the ledger's key.
    pub identity: String,
    /// When the mark was written (RFC 3339).
    pub at: String,
    /// The PV's UID, written once the API confirmed the PV was created. A mark without it was
    /// written just before a create whose outcome was not seen: if no PV of that name exists,
    /// the disk was never offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The directory of the filesystem the volume's mount showed (the mount table's root):
    /// tells a volume from its sibling directories on one shared filesystem. None for a
    /// block device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// A claim was seen bound to the PV. A mark that never saw one, whose PV this agent
    /// withdrew (deleted while unclaimed, under a precondition), held no tenant's data.
    #[serde(default)]
    pub claimed: bool,
    /// For a block mark: filesystems made on the device since (by their UUID) whose whole
    /// contents a wipe removed. Their view of the device is clean; the raw device is not (a
    /// filesystem wipe leaves the blocks below it), so the mark stays for the device itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wiped_filesystems: Vec<String>,
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
    /// The disk was published, no claim was ever seen on it, and this agent withdrew its PV
    /// while it was unclaimed: offered, never used.
    Offered(UsedMark),
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
        (None, UsedRead::Offered(_) | UsedRead::Unmarked) => UsedVerdict::Publish,
    }
}

/// How a recorded mark relates to a volume found now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relation {
    /// The mark is this volume's, or the volume is inside the marked one (a subdirectory of a
    /// used volume): it holds what the marked volume held.
    Holds,
    /// It may share data with the marked volume and nothing proves it either way (no stable
    /// name on either side, a partition of a marked disk, a volume containing a marked one).
    Doubt(String),
    /// Another disk, or a sibling directory of one shared filesystem.
    Unrelated,
}

/// Where one directory of a filesystem is relative to another.
fn nesting(recorded: &str, found: &str) -> (bool, bool) {
    let inside = |inner: &str, outer: &str| {
        outer == "/" || inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
    };
    (inside(found, recorded), inside(recorded, found))
}

/// Compares a recorded mark with the volume found now (`identity`, and for a filesystem the
/// directory its mount shows). Judged by what names a disk, as the one-disk rule is: the same
/// device (whatever filesystem is on it now: `mkfs` leaves the old blocks), the same
/// filesystem (UUID, a tmpfs mount's ID); then, between two directories of one filesystem, by
/// where they are in it, so siblings on a shared disk stay apart.
pub fn relate(recorded: &UsedMark, identity: &str, root: Option<&str>) -> Relation {
    let doubt = || {
        Relation::Doubt(format!(
            "PV {}'s used disk ({}) may be this one ({identity}) and nothing proves either way",
            recorded.pv, recorded.identity
        ))
    };
    let (Some(r), Some(f)) = (DiskIdentity::parse(&recorded.identity), DiskIdentity::parse(identity)) else {
        return if recorded.identity == identity {
            Relation::Holds
        } else if may_share_disk(&recorded.identity, identity) {
            doubt()
        } else {
            Relation::Unrelated
        };
    };
    let same_device = r.same_device(&f);
    if r.kind == Kind::Filesystem && f.kind == Kind::Filesystem {
        let same_fs =
            same_device || (r.volatile.is_some() && f.volatile.is_some() && r.fsid.is_some() && r.fsid == f.fsid);
        if !same_fs && !may_share_disk(&recorded.identity, identity) {
            return Relation::Unrelated;
        }
        let (found_inside, recorded_inside) = match (recorded.root.as_deref(), root) {
            (Some(a), Some(b)) => nesting(a, b),
            // No root recorded: the root inode tells the volume from its siblings.
            _ => {
                let same = r.ino.is_some() && r.ino == f.ino;
                (same, same)
            }
        };
        return match (found_inside, recorded_inside) {
            (false, false) => Relation::Unrelated,
            (true, _) if same_fs => Relation::Holds,
            _ => doubt(),
        };
    }
    // A block device on either side: the whole device is in play, except a filesystem on a
    // used raw device whose contents were wiped since.
    let wiped_fs = r.kind == Kind::Block
        && f.kind == Kind::Filesystem
        && root.is_none_or(|r| r == "/")
        && filesystem_key(&f).is_some_and(|k| recorded.wiped_filesystems.contains(&k));
    if same_device && wiped_fs {
        Relation::Unrelated
    } else if same_device {
        Relation::Holds
    } else if may_share_disk(&recorded.identity, identity) {
        doubt()
    } else {
        Relation::Unrelated
    }
}

/// What names a filesystem on a device for [`UsedMark::wiped_filesystems`]: its UUID.
fn filesystem_key(d: &DiskIdentity) -> Option<String> {
    d.uuid.as_ref().map(|u| format!("uuid:{u}"))
}

/// The block marks a completed filesystem wipe of the volume found as `identity` (at `root`)
/// makes clean for that filesystem: the device's raw marks get the filesystem added to
/// their `wiped_filesystems` (the device itself stays marked). Returns whether `recorded`
/// changed. Only a wipe of the filesystem's root counts.
pub fn note_filesystem_wiped(recorded: &mut UsedMark, identity: &str, root: Option<&str>) -> bool {
    let (Some(r), Some(f)) = (DiskIdentity::parse(&recorded.identity), DiskIdentity::parse(identity)) else {
        return false;
    };
    let applies =
        r.kind == Kind::Block && f.kind == Kind::Filesystem && r.same_device(&f) && root.is_none_or(|r| r == "/");
    match filesystem_key(&f) {
        Some(key) if applies && !recorded.wiped_filesystems.contains(&key) => {
            recorded.wiped_filesystems.push(key);
            true
        }
        _ => false,
    }
}

/// Whether a completed wipe of the volume found as `identity` (at `root` for a filesystem)
/// removes what a recorded mark stands for: a block wipe, everything on the device; a
/// filesystem wipe, the marks of that very directory of that device or filesystem (never a
/// block mark: a filesystem wipe leaves the blocks below it).
pub fn wiped_by(recorded: &UsedMark, identity: &str, root: Option<&str>) -> bool {
    if recorded.identity == identity && recorded.root.as_deref() == root {
        return true;
    }
    let (Some(r), Some(f)) = (DiskIdentity::parse(&recorded.identity), DiskIdentity::parse(identity)) else {
        return false;
    };
    let same_device = r.same_device(&f);
    match (r.kind, f.kind) {
        (_, Kind::Block) => same_device,
        (Kind::Filesystem, Kind::Filesystem) => {
            let same_fs =
                same_device || (r.volatile.is_some() && r.fsid.is_some() && r.fsid == f.fsid && f.volatile.is_some());
            let same_dir = match (recorded.root.as_deref(), root) {
                (Some(a), Some(b)) => a == b,
                _ => r.ino.is_some() && r.ino == f.ino,
            };
            same_fs && same_dir
        }
        (Kind::Block, Kind::Filesystem) => false,
    }
}

/// What may tie an identity to another: every name a disk goes by (its device ID and that of
/// its whole disk, filesystem UUID, fsid, device number). Two identities that
/// [`relate`] share one, so a ledger is searched through these, not entry by entry.
pub fn relation_keys(identity: &str) -> Vec<String> {
    let Some(d) = DiskIdentity::parse(identity) else { return vec![format!("text:{identity}")] };
    let mut keys = Vec::new();
    if let Some(disk) = &d.disk {
        // The whole device only: a partition's number and start are left out, so every span
        // of a disk (a partition renumbered since, or the disk itself) is found by it.
        keys.push(format!("disk:{}", split_partition(disk).0));
        // A loop device by its backing file's inode alone: what ids of both formats share
        // (an old one names the file by path), and what every loop device over it shares.
        if let Some(key) = d.loop_key() {
            keys.push(format!("loopino:{}", key.ino));
        }
    }
    keys.extend(d.uuid.iter().map(|u| format!("uuid:{u}")));
    keys.extend(d.fsid.iter().map(|f| format!("fsid:{f}")));
    keys.extend(d.dev.iter().map(|v| format!("dev:{v}")));
    keys
}

/// Positions of a ledger's entries by [`relation_keys`], rebuilt when the ledger changes: one
/// sorted vector of (key hash, position), 16 bytes per key, instead of a map of key strings to
/// vectors (about 170 bytes per key: half a MiB for a ledger of a thousand disks, held twice
/// while a batch of marks is recorded). Two keys with the same hash only make an entry a
/// candidate that [`relate`] then finds unrelated: the answers are those of [`ledger_lookup`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerIndex(Vec<(u64, usize)>);

/// The index's hash of a relation key (std's SipHash with fixed keys: the index lives in one
/// process only, so the hash need not be stable across versions).
fn key_hash(key: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl LedgerIndex {
    /// Indexes `entries`.
    pub fn build(entries: &[UsedMark]) -> Self {
        let mut at: Vec<(u64, usize)> = entries
            .iter()
            .enumerate()
            .flat_map(|(i, e)| relation_keys(&e.identity).into_iter().map(move |key| (key_hash(&key), i)))
            .collect();
        at.sort_unstable();
        at.dedup();
        at.shrink_to_fit();
        LedgerIndex(at)
    }

    /// The entries that may relate to `identity`, in ledger order.
    pub fn candidates<'a>(&self, entries: &'a [UsedMark], identity: &str) -> Vec<&'a UsedMark> {
        let mut at: Vec<usize> = Vec::new();
        for key in relation_keys(identity) {
            let hash = key_hash(&key);
            let from = self.0.partition_point(|(h, _)| *h < hash);
            at.extend(self.0[from..].iter().take_while(|(h, _)| *h == hash).map(|(_, i)| *i));
        }
        at.sort_unstable();
        at.dedup();
        at.into_iter().filter_map(|i| entries.get(i)).collect()
    }
}

/// What a ledger of marks says about the volume found as `identity` (at `root`). `withdrawn`
/// holds the UIDs of PVs this agent withdrew while unclaimed. Several entries may relate to
/// one disk (it was published, withdrawn unclaimed, published again...): the strongest
/// answer wins, whatever their order: used, then unknown, then offered only. Pure.
pub fn ledger_lookup(entries: &[UsedMark], withdrawn: &[String], identity: &str, root: Option<&str>) -> UsedRead {
    lookup_in(entries.iter(), withdrawn, identity, root)
}

/// [`ledger_lookup`] over the entries an index names as candidates: the same answer, without
/// comparing every entry.
pub fn ledger_lookup_indexed(
    entries: &[UsedMark],
    index: &LedgerIndex,
    withdrawn: &[String],
    identity: &str,
    root: Option<&str>,
) -> UsedRead {
    lookup_in(index.candidates(entries, identity).into_iter(), withdrawn, identity, root)
}

fn lookup_in<'a>(
    entries: impl Iterator<Item = &'a UsedMark>,
    withdrawn: &[String],
    identity: &str,
    root: Option<&str>,
) -> UsedRead {
    let (mut doubt, mut offered) = (None, None);
    for entry in entries {
        match relate(entry, identity, root) {
            Relation::Holds => match offered_or_marked(entry.clone(), withdrawn) {
                used @ UsedRead::Marked(_) => return used,
                other => {
                    offered.get_or_insert(other);
                }
            },
            Relation::Doubt(why) => {
                doubt.get_or_insert(why);
            }
            Relation::Unrelated => {}
        }
    }
    match (doubt, offered) {
        (Some(why), _) => UsedRead::Unknown(why),
        (None, Some(offered)) => offered,
        (None, None) => UsedRead::Unmarked,
    }
}

/// A mark whose PV this agent withdrew while no claim had been seen on it counts as offered,
/// not used.
pub fn offered_or_marked(mark: UsedMark, withdrawn: &[String]) -> UsedRead {
    if is_offered(&mark, withdrawn) { UsedRead::Offered(mark) } else { UsedRead::Marked(mark) }
}

/// Whether `offered_or_marked` reads the mark as offered only (a PV withdrawn unclaimed).
pub fn is_offered(mark: &UsedMark, withdrawn: &[String]) -> bool {
    mark.uid.as_ref().is_some_and(|uid| !mark.claimed && withdrawn.contains(uid))
}

/// Keeps of a ledger's `withdrawn` UIDs only those that can still make a mark read as offered:
/// the UIDs of its entries that never saw a claim, each once. The others (a mark superseded
/// when the disk was published again, wiped, or claimed since; a PV that had no mark) only grow
/// the file and every lookup. Forgetting one can only turn "offered" into "used", which costs a
/// wipe-first, never a disk offered unwiped: the bound errs on the safe side for marks read
/// from a disk whose ledger entry went another way. Returns whether anything was dropped.
pub fn prune_withdrawn(entries: &[UsedMark], withdrawn: &mut Vec<String>) -> bool {
    let live: std::collections::HashSet<&str> =
        entries.iter().filter(|e| !e.claimed).filter_map(|e| e.uid.as_deref()).collect();
    let mut seen = std::collections::HashSet::new();
    let before = withdrawn.len();
    withdrawn.retain(|uid| live.contains(uid.as_str()) && seen.insert(uid.clone()));
    withdrawn.len() != before
}

/// Which mark already on a disk a new mark may replace: the rule for each writer of marks,
/// kept here (pure) so it is tested apart from the I/O that applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replace {
    /// Before a PV is created: no mark, our own written before a create that never happened,
    /// or exactly the mark discovery judged (a gone PV's, or one only offered).
    BeforeCreate { judged: Option<UsedMark> },
    /// Keeping the mark of an existing PV (`mark.pv`, `mark.uid`) complete; `used` says a claim
    /// uses or used it.
    Keep { used: bool },
}

impl Replace {
    /// Whether `mark` may be written over `there` (the mark on the disk now, if any).
    pub fn allows(&self, mark: &UsedMark, there: Option<&UsedMark>) -> bool {
        match self {
            Replace::BeforeCreate { judged } => match there {
                None => true,
                Some(m) if m.uid.is_none() && m.pv == mark.pv => true,
                Some(m) => judged.as_ref().is_some_and(|j| j.pv == m.pv && j.uid == m.uid),
            },
            Replace::Keep { used } => {
                let ours =
                    |m: &UsedMark| m.pv == mark.pv && m.uid.as_ref().is_none_or(|u| Some(u) == mark.uid.as_ref());
                match there {
                    // Complete: nothing to do.
                    Some(m) if ours(m) && m.uid.is_some() && (m.claimed || !used) => false,
                    // Ours, without the UID (written before the create) or the claim.
                    Some(m) if ours(m) => true,
                    // Upstream's or an older version's PV: marked once a claim uses it.
                    _ => *used,
                }
            }
        }
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
            root: None,
            claimed: true,
            wiped_filesystems: Vec::new(),
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
            UsedRead::Offered(UsedMark { claimed: false, ..mark() }),
            UsedRead::Unknown("ledger unreadable".into()),
        ];
        for read in &reads {
            for holder in [None, Some(("local-pv-2", "/mnt/disks/v2"))] {
                for exists in [false, true] {
                    let verdict = used_verdict(read, holder, exists);
                    let ctx = format!("{read:?} holder={holder:?} exists={exists} -> {verdict:?}");
                    // Published as it is only when nothing says it was ever offered.
                    let never_offered = matches!(read, UsedRead::Unmarked | UsedRead::Offered(_))
                        || (*read == UsedRead::Marked(pending.clone()) && !exists);
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

    fn fs_mark(identity: &str, root: &str) -> UsedMark {
        UsedMark { identity: identity.into(), root: Some(root.into()), ..mark() }
    }

    const EXT4: &str = "v2;fs;disk=wwid:abc;uuid=u1;ino=2;dev=8:16";
    const EXT4_SUB: &str = "v2;fs;disk=wwid:abc;uuid=u1;ino=77;dev=8:16";
    const REFORMATTED: &str = "v2;fs;disk=wwid:abc;uuid=u2;ino=2;dev=8:16";
    const RAW: &str = "v2;blk;disk=wwid:abc;size=100;dev=8:16";
    const PART: &str = "v2;blk;disk=wwid:abc/part1@2048;size=50;dev=8:17";
    const OTHER: &str = "v2;fs;disk=wwid:zzz;uuid=u9;ino=2;dev=8:32";
    const TMPFS: &str = "v2;fs;fsid=f1;volatile=tmpfs;ino=1;dev=0:50";
    const TMPFS_SUB: &str = "v2;fs;fsid=f1;volatile=tmpfs;ino=9;dev=0:50";
    const UNNAMED: &str = "v2;fs;fsid=f2;ino=2;dev=0:60";
    const UNNAMED_SAME_NUMBER: &str = "v2;fs;fsid=f3;ino=2;dev=0:60";

    #[test]
    fn a_volume_is_related_to_its_mark_by_disk_and_place_never_to_a_sibling() {
        let r = |m: &UsedMark, id: &str, root: Option<&str>| relate(m, id, root);
        let whole = fs_mark(EXT4, "/");
        assert_eq!(r(&whole, EXT4, Some("/")), Relation::Holds);
        // A subdirectory of a used volume holds its data; a volume containing one may.
        assert_eq!(r(&fs_mark(EXT4, "/vols"), EXT4_SUB, Some("/vols/a")), Relation::Holds);
        assert!(matches!(r(&fs_mark(EXT4, "/vols/a"), EXT4, Some("/vols")), Relation::Doubt(_)));
        // Siblings on one shared filesystem stay apart.
        assert_eq!(r(&fs_mark(EXT4, "/vols/a"), EXT4_SUB, Some("/vols/b")), Relation::Unrelated);
        assert_eq!(r(&fs_mark(EXT4, "/vols/a"), EXT4_SUB, Some("/vols/ab")), Relation::Unrelated);
        // The same device under a new filesystem, or exposed raw, or raw then formatted.
        assert_eq!(r(&whole, REFORMATTED, Some("/")), Relation::Holds);
        assert_eq!(r(&whole, RAW, None), Relation::Holds);
        assert_eq!(r(&UsedMark { identity: RAW.into(), ..mark() }, EXT4, Some("/")), Relation::Holds);
        // A partition of a used disk shares its data but is not it.
        assert!(matches!(r(&UsedMark { identity: RAW.into(), ..mark() }, PART, None), Relation::Doubt(_)));
        assert_eq!(r(&whole, OTHER, Some("/")), Relation::Unrelated);
        // tmpfs: its mount's ID; a bind of a subdirectory of a used tmpfs holds its data.
        assert_eq!(r(&fs_mark(TMPFS, "/"), TMPFS_SUB, Some("/sub")), Relation::Holds);
        assert_eq!(r(&fs_mark(TMPFS, "/"), TMPFS, Some("/")), Relation::Holds);
        // Nothing names either disk: the same device number proves nothing.
        assert!(matches!(r(&fs_mark(UNNAMED, "/"), UNNAMED_SAME_NUMBER, Some("/")), Relation::Doubt(_)));
        // No root recorded (a mark from a block-less era): the root inode decides.
        let no_root = UsedMark { identity: EXT4.into(), ..mark() };
        assert_eq!(r(&no_root, EXT4, Some("/")), Relation::Holds);
        assert_eq!(r(&no_root, EXT4_SUB, Some("/x")), Relation::Unrelated);
    }

    #[test]
    fn a_wipe_clears_only_what_it_wiped() {
        let whole = fs_mark(EXT4, "/");
        assert!(wiped_by(&whole, EXT4, Some("/")));
        assert!(wiped_by(&whole, REFORMATTED, Some("/")), "the disk's filesystem, wiped at its root");
        assert!(!wiped_by(&fs_mark(EXT4, "/vols/a"), EXT4_SUB, Some("/vols/b")), "a sibling keeps its mark");
        let raw = UsedMark { identity: RAW.into(), ..mark() };
        assert!(!wiped_by(&raw, EXT4, Some("/")), "a filesystem wipe leaves the blocks below it");
        assert!(wiped_by(&raw, RAW, None));
        assert!(wiped_by(&whole, RAW, None), "a block wipe wipes every filesystem on the device");
        assert!(!wiped_by(&raw, PART, None), "a partition's wipe leaves the rest of the disk");
        assert!(!wiped_by(&whole, OTHER, Some("/")));
    }

    #[test]
    fn the_ledger_answers_offered_only_for_marks_withdrawn_unclaimed() {
        let unclaimed = UsedMark { claimed: false, ..fs_mark(EXT4, "/") };
        let withdrawn = vec!["uid-1".to_string()];
        assert!(matches!(
            ledger_lookup(std::slice::from_ref(&unclaimed), &withdrawn, EXT4, Some("/")),
            UsedRead::Offered(_)
        ));
        assert!(matches!(ledger_lookup(std::slice::from_ref(&unclaimed), &[], EXT4, Some("/")), UsedRead::Marked(_)));
        let claimed = UsedMark { claimed: true, ..unclaimed.clone() };
        assert!(matches!(
            ledger_lookup(std::slice::from_ref(&claimed), &withdrawn, EXT4, Some("/")),
            UsedRead::Marked(_)
        ));
        assert!(matches!(
            ledger_lookup(&[unclaimed.clone(), fs_mark(UNNAMED, "/")], &[], UNNAMED_SAME_NUMBER, Some("/")),
            UsedRead::Unknown(_)
        ));
        assert_eq!(ledger_lookup(std::slice::from_ref(&unclaimed), &[], OTHER, Some("/")), UsedRead::Unmarked);
        // The disk was offered (withdrawn unclaimed), then published again and used: used,
        // in whichever order the entries are.
        let used_later = UsedMark { uid: Some("uid-2".into()), claimed: true, ..unclaimed.clone() };
        for entries in [[unclaimed.clone(), used_later.clone()], [used_later.clone(), unclaimed.clone()]] {
            let got = ledger_lookup(&entries, &withdrawn, EXT4, Some("/"));
            assert!(matches!(&got, UsedRead::Marked(m) if m.uid.as_deref() == Some("uid-2")), "{got:?}");
        }
    }

    /// The hashed index names each entry that shares a key once, in ledger order, however many
    /// keys it shares, and nothing for an identity no entry shares a key with.
    #[test]
    fn the_index_names_each_candidate_once_in_ledger_order() {
        let entries: Vec<UsedMark> = [EXT4, OTHER, EXT4_SUB, RAW, EXT4]
            .iter()
            .enumerate()
            .map(|(i, id)| UsedMark { identity: id.to_string(), uid: Some(format!("u{i}")), ..mark() })
            .collect();
        let index = LedgerIndex::build(&entries);
        for id in [EXT4, OTHER, EXT4_SUB, RAW, PART, TMPFS, "junk"] {
            let got: Vec<&str> = index.candidates(&entries, id).iter().filter_map(|m| m.uid.as_deref()).collect();
            let keys = relation_keys(id);
            let want: Vec<&str> = entries
                .iter()
                .filter(|e| relation_keys(&e.identity).iter().any(|k| keys.contains(k)))
                .filter_map(|e| e.uid.as_deref())
                .collect();
            assert_eq!(got, want, "{id}");
        }
        assert!(index.candidates(&entries, "junk").is_empty());
    }

    /// The index finds every entry a full scan relates, over all the identity shapes used in
    /// these tests.
    #[test]
    fn the_index_answers_as_a_full_scan() {
        let ids =
            [EXT4, EXT4_SUB, REFORMATTED, RAW, PART, OTHER, TMPFS, TMPFS_SUB, UNNAMED, UNNAMED_SAME_NUMBER, "junk"];
        let roots = [Some("/"), Some("/vols"), Some("/vols/a"), None];
        let mut entries = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            for root in roots {
                entries.push(UsedMark {
                    identity: id.to_string(),
                    root: root.map(str::to_string),
                    uid: Some(format!("u{i}")),
                    claimed: i % 2 == 0,
                    ..mark()
                });
            }
        }
        let withdrawn: Vec<String> = (0..ids.len()).map(|i| format!("u{i}")).collect();
        for n in 0..=entries.len() {
            let part = &entries[..n];
            let index = LedgerIndex::build(part);
            for id in ids {
                for root in roots {
                    assert_eq!(
                        ledger_lookup_indexed(part, &index, &withdrawn, id, root),
                        ledger_lookup(part, &withdrawn, id, root),
                        "{n} entries, {id} at {root:?}"
                    );
                }
            }
        }
    }

    /// A used raw device formatted afterwards: its filesystem is wiped once, then published;
    /// the device itself stays marked.
    #[test]
    fn a_filesystem_made_on_a_used_raw_device_is_clean_once_wiped() {
        let mut raw = UsedMark { identity: RAW.into(), ..mark() };
        assert_eq!(relate(&raw, EXT4, Some("/")), Relation::Holds);
        assert!(!note_filesystem_wiped(&mut raw, EXT4, Some("/vols")), "a subdirectory's wipe is not the filesystem's");
        assert!(note_filesystem_wiped(&mut raw, EXT4, Some("/")));
        assert!(!note_filesystem_wiped(&mut raw, EXT4, Some("/")), "once");
        assert_eq!(relate(&raw, EXT4, Some("/")), Relation::Unrelated);
        assert_eq!(relate(&raw, REFORMATTED, Some("/")), Relation::Holds, "another filesystem made since");
        assert_eq!(relate(&raw, RAW, None), Relation::Holds, "the raw device still holds the old blocks");
        assert!(!note_filesystem_wiped(&mut raw, OTHER, Some("/")));
    }
    #[test]
    fn replace_rules_for_each_writer() {
        let mark = |pv: &str, uid: Option<&str>, claimed: bool| UsedMark {
            pv: pv.into(),
            node: "n".into(),
            path: "/p".into(),
            identity: "id".into(),
            at: "t".into(),
            uid: uid.map(str::to_string),
            root: None,
            claimed,
            wiped_filesystems: Vec::new(),
        };
        let new = mark("a", None, false);
        let before = Replace::BeforeCreate { judged: None };
        assert!(before.allows(&new, None));
        assert!(before.allows(&new, Some(&mark("a", None, false))), "our own, create never seen");
        assert!(!before.allows(&new, Some(&mark("a", Some("u1"), false))), "a PV of that name existed");
        assert!(!before.allows(&new, Some(&mark("b", None, false))));
        let judged = Replace::BeforeCreate { judged: Some(mark("b", Some("u2"), true)) };
        assert!(judged.allows(&new, Some(&mark("b", Some("u2"), true))), "the mark discovery judged gone");
        assert!(!judged.allows(&new, Some(&mark("b", Some("u3"), true))), "another one since");

        let ours = mark("a", Some("u1"), true);
        for used in [false, true] {
            let keep = Replace::Keep { used };
            assert!(keep.allows(&ours, None) == used, "no mark: written only for a used PV");
            assert!(keep.allows(&ours, Some(&mark("a", None, false))), "completes our mark with the UID");
            assert!(!keep.allows(&ours, Some(&mark("a", Some("u1"), true))), "complete already");
            assert_eq!(keep.allows(&ours, Some(&mark("a", Some("u1"), false))), used, "adds the claim");
            assert_eq!(keep.allows(&ours, Some(&mark("a", Some("u9"), true))), used, "another incarnation's");
            assert_eq!(keep.allows(&ours, Some(&mark("z", Some("u1"), true))), used);
        }
    }

    #[test]
    fn withdrawn_uids_are_kept_only_while_an_unclaimed_mark_names_them() {
        let entry = |uid: Option<&str>, claimed: bool| UsedMark { uid: uid.map(str::to_string), claimed, ..mark() };
        let s = |v: &[&str]| v.iter().map(|u| u.to_string()).collect::<Vec<String>>();
        let cases: &[(&[UsedMark], &[&str], &[&str])] = &[
            (&[], &[], &[]),
            (&[], &["u1"], &[]),
            (&[entry(Some("u1"), false)], &["u1"], &["u1"]),
            (&[entry(Some("u1"), false)], &["u1", "u1"], &["u1"]),
            (&[entry(Some("u1"), true)], &["u1"], &[]),
            (&[entry(None, false)], &["u1"], &[]),
            (&[entry(Some("u2"), false)], &["u1", "u2", "u3"], &["u2"]),
            (&[entry(Some("u3"), false), entry(Some("u1"), false)], &["u1", "u2", "u3"], &["u1", "u3"]),
        ];
        for (entries, before, after) in cases {
            let mut withdrawn = s(before);
            let dropped = prune_withdrawn(entries, &mut withdrawn);
            assert_eq!(withdrawn, s(after), "{before:?}");
            assert_eq!(dropped, before.len() != after.len(), "{before:?}");
            // Every mark reads as it did before: offered stays offered.
            for e in entries.iter() {
                assert_eq!(is_offered(e, &withdrawn), is_offered(e, &s(before)), "{e:?}");
            }
        }
    }

    #[test]
    fn a_loop_disk_marked_under_its_old_id_is_found_under_its_current_one() {
        let old = UsedMark {
            identity: "v2;blk;disk=loop:/img/a.img@0+4096#12;backing=7:0;size=4096;dev=7:3".into(),
            ..mark()
        };
        let marked = [old.clone()];
        let index = LedgerIndex::build(&marked);
        let read = |identity: &str| ledger_lookup_indexed(&marked, &index, &[], identity, None);
        for renamed in ["v2;blk;disk=loop:7:0:12@0+4096;backing=7:0;size=4096;dev=7:9", old.identity.as_str()] {
            assert_eq!(read(renamed), UsedRead::Marked(old.clone()), "{renamed}");
            assert_eq!(ledger_lookup(&marked, &[], renamed, None), UsedRead::Marked(old.clone()));
        }
        // A window of it, or its partition: it may hold what the disk held.
        for part in [
            "v2;blk;disk=loop:7:0:12@1024+1024;backing=7:0;size=1024;dev=7:9",
            "v2;fs;disk=loop:7:0:12@0+4096/part1@2;backing=7:0;uuid=u;ino=2;dev=259:0",
        ] {
            assert!(matches!(read(part), UsedRead::Unknown(_)), "{part}: {:?}", read(part));
        }
        // Another file, range or filesystem: unrelated.
        for other in [
            "v2;blk;disk=loop:7:0:13@0+4096;backing=7:0;size=4096;dev=7:9",
            "v2;blk;disk=loop:7:1:12@0+4096;backing=7:1;size=4096;dev=7:9",
            "v2;blk;disk=loop:7:0:12@4096+4096;backing=7:0;size=4096;dev=7:9",
        ] {
            assert_eq!(read(other), UsedRead::Unmarked, "{other}");
        }
        // A wipe of the disk under its current id clears the old mark.
        assert!(wiped_by(&old, "v2;blk;disk=loop:7:0:12@0+4096;backing=7:0;size=4096;dev=7:9", None));
        assert!(!wiped_by(&old, "v2;blk;disk=loop:7:0:13@0+4096;backing=7:0;size=4096;dev=7:9", None));
    }
}
