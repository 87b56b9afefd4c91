//! Disk identity: the fingerprint recorded on a PV (annotation
//! `local-static-provisioner.io/volume-identity`) and the decision whether the disk found at
//! its path now is provably that disk. Pure: `host::identity::fingerprint` reads the components.
//!
//! Format (version 2), components in this order, absent ones left out, values percent-encoded:
//!
//! ```text
//! v2;fs;disk=<stable device id>;backing=<M:m>;uuid=<superblock uuid>;ino=<root inode>;dev=<M:m>
//! v2;fs;fsid=<statfs fsid>;volatile=tmpfs;ino=<root inode>;dev=<M:m>      (tmpfs)
//! v2;fs;fsid=<statfs fsid>;ino=<root inode>;dev=<M:m>                     (no device under it)
//! v2;blk;disk=<stable device id>;backing=<M:m>;born=<ns>;size=<bytes>;dev=<M:m>
//! ```
//!
//! - `disk` names the device by what the hardware or the administrator gave it, never by a
//!   number the kernel assigns: `wwid:`, `serial:`, `dm:` (device-mapper UUID), `md:`, or
//!   `loop:<M:m>:<inode>@<offset>[+<size limit>]` (see below); a partition is its disk's id
//!   followed by `/part<N>@<start sector>`. A partition's data is where it starts, never its
//!   number: two ids on one disk with the same start are the same device, and the number is
//!   only a name ([`spans_share`] is the one rule; a table rewritten so that the same start is
//!   another number shows the same bytes).
//! - `backing` is the device number of the filesystem holding a loop device's backing file.
//! - `born` is that file's birth time (statx `btime`, nanoseconds since 1970), where the agent
//!   can read it: an inode number is reused once its file is deleted, so a new image can have
//!   the inode, range and size of a deleted one. A file's birth time never changes (not on a
//!   write, a rename or `touch`), and a new file that reuses an inode has its own. It is
//!   compared where both sides know it: a backing file deleted while attached, one attached
//!   from a mount namespace the agent cannot see, a filesystem without birth times, and
//!   records of earlier versions have none, and are judged as before.
//!
//! A loop device is the data of its backing file, named by what LOOP_GET_STATUS64 reports and
//! never by the file's path: `<M:m>` is the device number of the filesystem holding the file,
//! `<inode>` its inode, then the byte range the device shows. A path differs in another mount
//! namespace and changes on rename; these do not, so one image attached again elsewhere, under
//! another name or through a bind mount is the same disk. The cost: a filesystem whose device
//! number changes across a reboot (tmpfs, some network and stacked filesystems) makes the
//! re-attached image another disk. That is the safe direction: a wipe refuses it (its data is
//! kept) and an operator confirms it.
//!
//! Earlier versions wrote `loop:<path>@<offset>[+<size limit>]#<inode>`, with the device number
//! only in `backing`. Every comparison of loop ids goes through [`LoopKey`], which reads both:
//! an old id and a new one are the same disk when inode, range and partition match and the
//! device number matches where both sides know it (an old id takes it from its `backing`).
//! - `uuid` is read from the filesystem's own superblock (ext2/3/4, XFS, btrfs).
//! - `volatile=tmpfs` marks an fsid the kernel draws at random for each mount: it names that
//!   mount, whose data does not outlive it.
//! - `dev` (the device number) is informational: it proves nothing either way, since disks
//!   enumerate in another order after a reboot.
//!
//! Proof of the same disk needs a stable component that matches: `disk` (plus `uuid`, `ino`,
//! `backing` and `size` where recorded), or a volatile fsid (plus `ino`). Proof of another disk
//! needs a stable component that differs. Anything else is unproven, and a wipe then waits for
//! an operator's confirmation (annotation `local-static-provisioner.io/identity-confirmed`
//! set to exactly the identity found).
//!
//! Identities recorded by earlier versions (`fs:fsid=<a>,<b>;ino=<n>`, `blk:wwid=..;size=<n>`,
//! `blk:dev=<M:m>;size=<n>`...) are compared with the same legacy computation of the disk found
//! now: a filesystem one proves only where its fsid comes from the filesystem UUID (ext2/3/4,
//! btrfs, tmpfs), a block one only when it holds a stable id rather than a device number.

use std::fmt::Write as _;

/// First field of every identity in the current format.
pub const FORMAT: &str = "v2";

/// Filesystems whose statfs fsid (what legacy `fs:` identities hold) comes from the filesystem
/// UUID or, for tmpfs, is drawn at random per mount. XFS and most others derive it from the
/// device number, which can change for the same disk and stay for another one.
pub const LEGACY_FSID_FROM_UUID: [&str; 5] = ["ext2", "ext3", "ext4", "btrfs", "tmpfs"];

/// What kind of volume an identity describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// A mounted filesystem (a Filesystem volume).
    #[default]
    Filesystem,
    /// A block device (a Block volume).
    Block,
}

/// A parsed identity in the current format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskIdentity {
    /// Filesystem or block device.
    pub kind: Kind,
    /// Stable id of the device (see the module documentation).
    pub disk: Option<String>,
    /// Device number of the filesystem holding a loop device's backing file.
    pub backing: Option<String>,
    /// Birth time of a loop device's backing file (ns since 1970), where it could be read.
    pub born: Option<u64>,
    /// Filesystem UUID from the superblock.
    pub uuid: Option<String>,
    /// statfs fsid, for filesystems with no block device under them.
    pub fsid: Option<String>,
    /// The fsid is drawn at random per mount by this filesystem type (tmpfs).
    pub volatile: Option<String>,
    /// Inode of the volume's root directory.
    pub ino: Option<u64>,
    /// Size of a block device in bytes.
    pub size: Option<u64>,
    /// Device number (`major:minor`), informational.
    pub dev: Option<String>,
}

impl DiskIdentity {
    /// The loop key of its device id, with the device number from `backing` where the id is
    /// in the old format; `None` when the device is not a loop device.
    pub fn loop_key(&self) -> Option<LoopKey> {
        let key = LoopKey::parse(self.disk.as_deref()?)?;
        Some(key.with_backing(self.backing.as_deref()).with_born(self.born).with_size(self.size))
    }

    /// Whether both name a device and it is the same one: one whole device and the same span
    /// of it ([`spans_share`]: a partition by its start, whatever its number), or, for loop
    /// devices, one [`LoopKey`] (either id format, with each side's `backing` and `born`).
    pub fn same_device(&self, other: &DiskIdentity) -> bool {
        match (self.loop_key(), other.loop_key(), &self.disk, &other.disk) {
            (Some(x), Some(y), _, _) => x.same(&y),
            (None, None, Some(a), Some(b)) => devices_share(a, None, b, None, str::to_string) == Some(Shared::Same),
            _ => false,
        }
    }

    /// The annotation value.
    pub fn render(&self) -> String {
        let mut out = format!("{FORMAT};{}", if self.kind == Kind::Block { "blk" } else { "fs" });
        let mut add = |key: &str, value: Option<&str>| {
            if let Some(v) = value {
                let _ = write!(out, ";{key}={}", escape(v));
            }
        };
        add("disk", self.disk.as_deref());
        add("backing", self.backing.as_deref());
        add("born", self.born.map(|n| n.to_string()).as_deref());
        add("uuid", self.uuid.as_deref());
        add("fsid", self.fsid.as_deref());
        add("volatile", self.volatile.as_deref());
        add("ino", self.ino.map(|n| n.to_string()).as_deref());
        add("size", self.size.map(|n| n.to_string()).as_deref());
        add("dev", self.dev.as_deref());
        out
    }

    /// Parses a current-format identity; `None` for anything else (legacy, unknown, damaged),
    /// including unknown or repeated components, so nothing unread is taken as compared.
    pub fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split(';');
        if fields.next()? != FORMAT {
            return None;
        }
        let kind = match fields.next()? {
            "fs" => Kind::Filesystem,
            "blk" => Kind::Block,
            _ => return None,
        };
        let mut id = DiskIdentity { kind, ..Default::default() };
        for field in fields {
            let (key, raw) = field.split_once('=')?;
            let value = unescape(raw)?;
            let number = || value.parse::<u64>().ok().filter(|_| value.bytes().all(|b| b.is_ascii_digit()));
            let slot_was_empty = match key {
                "disk" => id.disk.replace(value.clone()).is_none(),
                "backing" => id.backing.replace(value.clone()).is_none(),
                "born" => id.born.replace(number()?).is_none(),
                "uuid" => id.uuid.replace(value.clone()).is_none(),
                "fsid" => id.fsid.replace(value.clone()).is_none(),
                "volatile" => id.volatile.replace(value.clone()).is_none(),
                "ino" => id.ino.replace(number()?).is_none(),
                "size" => id.size.replace(number()?).is_none(),
                "dev" => id.dev.replace(value.clone()).is_none(),
                _ => return None,
            };
            if !slot_was_empty {
                return None;
            }
        }
        // Re-rendering must give the same text: one spelling per identity, so string equality
        // (used for confirmations) means component equality.
        (id.render() == text).then_some(id)
    }
}

/// Percent-encodes everything but a conservative set, so values never contain the separators
/// and the identity can be pasted into a shell command inside single quotes.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"._:/@+#,-".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What the host found at a volume's path now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// The identity in the current format.
    pub identity: String,
    /// The identity as earlier versions computed it, for PVs they recorded.
    pub legacy: String,
    /// The filesystem type (`ext4`, `xfs`...), none for a block device.
    pub fs_type: Option<String>,
}

/// How the same disk was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The current identity's stable components match.
    Identity,
    /// A legacy identity of a kind that cannot match another disk matches.
    Legacy,
    /// Nothing proved it, and an operator confirmed exactly the identity found.
    Confirmed,
}

/// Whether the disk found is the recorded one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Proven the same disk (or confirmed by an operator).
    Same(Proof),
    /// Proven another disk (or another filesystem, directory or mount); the reason says which.
    Different(String),
    /// No proof either way. `plausible`: nothing found contradicts it being the recorded disk
    /// (for presence: a volume that may well be this one is there).
    Unproven { reason: String, plausible: bool },
}

/// Whether two identities may name the same data, judged only by what names a disk (the
/// stable device ID, the filesystem UUID, a tmpfs mount's ID), never by the root inode or the
/// device number: a directory of a recorded filesystem, or the recorded disk under another
/// device number, is that disk. A whole disk shares data with its partitions, and partitions
/// of one disk share data as [`spans_share`] says (the same start, or overlapping byte ranges
/// where both sizes are known), whatever their numbers. When either side
/// names no device, the filesystem UUID decides, conservatively: a clone with the same UUID
/// counts as the recorded disk. Old-format records only match themselves.
pub fn may_share_disk(recorded: &str, found: &str) -> bool {
    let (Some(r), Some(f)) = (DiskIdentity::parse(recorded), DiskIdentity::parse(found)) else {
        return recorded == found;
    };
    if let (Some(a), Some(b)) = (&r.disk, &f.disk) {
        // Both name their device: that settles it (clones on two disks are two disks). Two
        // loop devices over overlapping ranges of one backing file are one disk.
        if let (Some(x), Some(y)) = (r.loop_key(), f.loop_key()) {
            return x.overlaps(&y);
        }
        return devices_share(a, r.size, b, f.size, str::to_string).is_some_and(|s| s != Shared::Apart);
    }
    let uuids = matches!((&r.uuid, &f.uuid), (Some(a), Some(b)) if a == b);
    let volatile =
        r.volatile.is_some() && f.volatile.is_some() && matches!((&r.fsid, &f.fsid), (Some(a), Some(b)) if a == b);
    // A side that names nothing (no device ID, UUID or tmpfs mount ID) may be any disk at that
    // device number: the same number counts as the same disk, conservatively.
    let names = |d: &DiskIdentity| d.disk.is_some() || d.uuid.is_some() || d.volatile.is_some();
    let unnamed_same_number = (!names(&r) || !names(&f)) && r.dev.is_some() && r.dev == f.dev;
    uuids || volatile || unnamed_same_number
}

/// Which part of its whole device a device id names: `/part<N>@<start sector>` or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The whole device (no partition suffix).
    Whole,
    /// A partition: its number in the table and its first sector (512-byte units, as sysfs
    /// gives `start` whatever the sector size).
    Partition { number: u64, start: u64 },
    /// A partition suffix that cannot be read (`/part1` with no start): some part of the disk.
    Unreadable,
}

impl Span {
    /// Reads a partition suffix (`""` for the whole device).
    pub fn parse(suffix: &str) -> Self {
        if suffix.is_empty() {
            return Span::Whole;
        }
        let parsed = suffix.strip_prefix("/part").and_then(|p| p.split_once('@')).and_then(|(n, start)| {
            Some(Span::Partition { number: canonical_number(n)?, start: canonical_number(start)? })
        });
        parsed.unwrap_or(Span::Unreadable)
    }
}

/// A device id split into the id of its whole device and the [`Span`] it names. The partition
/// suffix is the last `/part` in the id (a device id never holds one elsewhere: the host adds
/// it, once, to its disk's id).
pub fn split_partition(id: &str) -> (&str, Span) {
    match id.rfind("/part") {
        Some(i) => (&id[..i], Span::parse(&id[i..])),
        None => (id, Span::Whole),
    }
}

/// What two devices of one whole device share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    /// The same bytes from the same first sector: one device.
    Same,
    /// Some of the same bytes: a disk and one of its partitions, two partitions whose ranges
    /// overlap, or a partition that cannot be placed.
    Overlap,
    /// No byte in common: two partitions at different starts that do not overlap (or whose
    /// sizes are not both known; see [`spans_share`]).
    Apart,
}

/// THE rule for what two spans of one whole device share, with each one's size in bytes where
/// known. A partition is where its data starts, never its number: a table rewritten so the
/// same start is another partition number shows the same bytes, so it is the same device.
/// Two partitions at different starts overlap when both sizes are known and their byte ranges
/// do; with a size unknown they are taken as apart (a partition table's entries do not
/// overlap, and a partition's size is recorded only for a Block volume). The whole device
/// shares data with each of its partitions; a partition that cannot be placed overlaps
/// everything on its disk.
pub fn spans_share(a: Span, a_size: Option<u64>, b: Span, b_size: Option<u64>) -> Shared {
    match (a, b) {
        (Span::Whole, Span::Whole) => Shared::Same,
        (Span::Partition { start: x, .. }, Span::Partition { start: y, .. }) if x == y => Shared::Same,
        (Span::Partition { start: x, .. }, Span::Partition { start: y, .. }) => {
            let range = |start: u64, size: u64| {
                let from = u128::from(start) * 512;
                (from, from + u128::from(size))
            };
            match (a_size, b_size) {
                (Some(sa), Some(sb)) => {
                    let ((a0, a1), (b0, b1)) = (range(x, sa), range(y, sb));
                    if a0 < b1 && b0 < a1 { Shared::Overlap } else { Shared::Apart }
                }
                _ => Shared::Apart,
            }
        }
        _ => Shared::Overlap,
    }
}

/// What two device ids (with each device's size in bytes where known) share; `None` when
/// they are on different whole devices. `whole` maps a whole device's id to the one spelling
/// compared (the identity itself, or one LUN's spelling across its paths).
pub fn devices_share(
    a: &str,
    a_size: Option<u64>,
    b: &str,
    b_size: Option<u64>,
    whole: impl Fn(&str) -> String,
) -> Option<Shared> {
    if a == b {
        return Some(Shared::Same);
    }
    let ((wa, sa), (wb, sb)) = (split_partition(a), split_partition(b));
    (whole(wa) == whole(wb)).then(|| spans_share(sa, a_size, sb, b_size))
}

/// What a loop device's stable id names, in either format (see the module documentation):
/// the backing file (the device number of its filesystem when known, and its inode), the byte
/// range of it the device shows, and the partition of the loop device, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopKey {
    /// `major:minor` of the filesystem holding the backing file; `None` in an old-format id
    /// whose identity recorded no `backing`.
    pub dev: Option<String>,
    /// Inode of the backing file.
    pub ino: u64,
    /// Byte offset into the file where the device starts.
    pub offset: u64,
    /// Size limit in bytes; `None`: up to the end of the file.
    pub limit: Option<u64>,
    /// The partition suffix (`/part<N>@<start>`), for a partition of the loop device.
    pub part: Option<String>,
    /// The backing file's birth time (ns), from the identity's `born`: never part of the id
    /// (device-claim link names and `wipe-disk --id` stay what they were).
    pub born: Option<u64>,
    /// The device's size in bytes, from the identity's `size` (a Block volume's): places a
    /// partition's end. Never part of the id.
    pub size: Option<u64>,
}

impl LoopKey {
    /// Reads a loop id in the current format (`loop:<M:m>:<inode>@<offset>[+<limit>]`) or the
    /// old one (`loop:<path>@<offset>[+<limit>]#<inode>`), either perhaps with a partition
    /// suffix; `None` for anything else. Numbers must be spelled canonically.
    pub fn parse(disk: &str) -> Option<Self> {
        let rest = disk.strip_prefix("loop:")?;
        Self::parse_current(rest).or_else(|| Self::parse_old(rest))
    }

    fn parse_current(rest: &str) -> Option<Self> {
        let (main, part) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let (file, range) = main.split_once('@')?;
        let mut numbers = file.split(':');
        let (major, minor, ino) = (numbers.next()?, numbers.next()?, numbers.next()?);
        if numbers.next().is_some() {
            return None;
        }
        let (offset, limit) = parse_range(range)?;
        let key = LoopKey {
            dev: Some(format!("{}:{}", canonical_number(major)?, canonical_number(minor)?)),
            ino: canonical_number(ino)?,
            offset,
            limit,
            part: part.map(str::to_string),
            born: None,
            size: None,
        };
        (part.is_none_or(is_part_suffix)).then_some(key)
    }

    fn parse_old(rest: &str) -> Option<Self> {
        let (before, after) = rest.rsplit_once('#')?;
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let (ino, part) = after.split_at(digits);
        let (_path, range) = before.rsplit_once('@')?;
        let (offset, limit) = parse_range(range)?;
        let part = (!part.is_empty()).then(|| part.to_string());
        if !part.as_deref().is_none_or(is_part_suffix) {
            return None;
        }
        Some(LoopKey { dev: None, ino: canonical_number(ino)?, offset, limit, part, born: None, size: None })
    }

    /// The id in the current format; `None` without a device number.
    pub fn render(&self) -> Option<String> {
        let dev = self.dev.as_deref()?;
        let limit = self.limit.map(|l| format!("+{l}")).unwrap_or_default();
        Some(format!("loop:{dev}:{}@{}{limit}{}", self.ino, self.offset, self.part.as_deref().unwrap_or("")))
    }

    /// The key with the device number taken from an identity's `backing` where the id has none
    /// (an old-format id).
    pub fn with_backing(mut self, backing: Option<&str>) -> Self {
        if self.dev.is_none() {
            self.dev = backing.map(str::to_string);
        }
        self
    }

    /// The key with the backing file's birth time (an identity's `born`).
    pub fn with_born(mut self, born: Option<u64>) -> Self {
        self.born = born;
        self
    }

    /// The key with the device's size (an identity's `size`).
    pub fn with_size(mut self, size: Option<u64>) -> Self {
        self.size = size;
        self
    }

    /// What the partition suffix names.
    fn span(&self) -> Span {
        self.part.as_deref().map_or(Span::Whole, Span::parse)
    }

    /// What two keys over one range of one file share, by their partitions ([`spans_share`]).
    fn spans(&self, other: &LoopKey) -> Shared {
        spans_share(self.span(), self.size, other.span(), other.size)
    }

    /// One backing file: the same inode, and the same device number and birth time where both
    /// are known (a file that reused a deleted one's inode was born later).
    pub fn same_file(&self, other: &LoopKey) -> bool {
        self.ino == other.ino
            && both(self.dev.as_ref(), other.dev.as_ref()).is_none_or(|(a, b)| a == b)
            && both(self.born.as_ref(), other.born.as_ref()).is_none_or(|(a, b)| a == b)
    }

    /// The same data: one file, one range, one partition start (whatever its number), or both
    /// the whole device.
    pub fn same(&self, other: &LoopKey) -> bool {
        self.same_range(other) && self.spans(other) == Shared::Same
    }

    fn same_range(&self, other: &LoopKey) -> bool {
        self.same_file(other) && self.offset == other.offset && self.limit == other.limit
    }

    /// Some of the same bytes: one file and overlapping ranges, except two partitions of one
    /// loop device that [`spans_share`] keeps apart. Partitions of loop devices over different
    /// ranges count as overlapping when the ranges do (where a partition lies is not compared).
    pub fn overlaps(&self, other: &LoopKey) -> bool {
        let end = |k: &LoopKey| k.limit.map_or(u64::MAX, |l| k.offset.saturating_add(l));
        let ranges = self.offset < end(other) && other.offset < end(self);
        let apart = self.same_range(other) && self.spans(other) == Shared::Apart;
        self.same_file(other) && ranges && !apart
    }
}

/// A birth time in words (RFC 3339), or the nanoseconds when out of range.
fn born_words(ns: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns)).map_or_else(|_| format!("{ns} ns"), |t| t.to_string())
}

/// `<offset>[+<limit>]`.
fn parse_range(range: &str) -> Option<(u64, Option<u64>)> {
    match range.split_once('+') {
        Some((o, l)) => Some((canonical_number(o)?, Some(canonical_number(l)?))),
        None => Some((canonical_number(range)?, None)),
    }
}

/// A decimal number spelled one way (digits only, no leading zero).
fn canonical_number(text: &str) -> Option<u64> {
    let n: u64 = text.parse().ok().filter(|_| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))?;
    (n.to_string() == text).then_some(n)
}

/// `/part<N>@<start>`.
fn is_part_suffix(part: &str) -> bool {
    matches!(Span::parse(part), Span::Partition { .. })
}

/// Whether a recorded identity is in the format of earlier versions (`fs:...`, `blk:...`).
pub fn is_legacy(recorded: &str) -> bool {
    recorded.starts_with("fs:") || recorded.starts_with("blk:")
}

/// The identity to record instead of an old-format one: the current identity of the disk
/// found, but only when the old record proves it is the same disk (never on a confirmation,
/// never on an unproven match), so re-recording trusts nothing the wipe would not.
pub fn upgrade(recorded: &str, found: &Found) -> Option<String> {
    (is_legacy(recorded) && matches!(judge_unconfirmed(recorded, found), Verdict::Same(_)))
        .then(|| found.identity.clone())
}

/// Compares the recorded identity with what was found. `confirmed` is the operator's
/// confirmation annotation: it turns an unproven verdict into `Same(Confirmed)` only when it
/// equals the identity found now, and never overrides a proven difference.
pub fn judge(recorded: &str, found: &Found, confirmed: Option<&str>) -> Verdict {
    match judge_unconfirmed(recorded, found) {
        Verdict::Unproven { .. } if confirmed == Some(found.identity.as_str()) => Verdict::Same(Proof::Confirmed),
        verdict => verdict,
    }
}

/// Whether a volume that may be the recorded one is there: proven the same, or unproven with
/// nothing contradicting it. A proven difference, or a weak identity (device number only) that
/// differs, counts as absent.
pub fn is_present(recorded: &str, found: &Found) -> bool {
    matches!(judge(recorded, found, None), Verdict::Same(_) | Verdict::Unproven { plausible: true, .. })
}

fn judge_unconfirmed(recorded: &str, found: &Found) -> Verdict {
    if let Some(r) = DiskIdentity::parse(recorded) {
        return match DiskIdentity::parse(&found.identity) {
            Some(f) => judge_current(&r, &f),
            None => Verdict::Unproven {
                reason: format!("the identity found, {:?}, cannot be read", found.identity),
                plausible: false,
            },
        };
    }
    if is_legacy(recorded) {
        return judge_legacy(recorded, found);
    }
    Verdict::Unproven {
        reason: format!("the recorded identity {recorded:?} is in a format this agent does not know"),
        plausible: recorded == found.identity || recorded == found.legacy,
    }
}

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Filesystem => "a filesystem",
        Kind::Block => "a block device",
    }
}

fn both<'a, T: PartialEq + ?Sized>(r: Option<&'a T>, f: Option<&'a T>) -> Option<(&'a T, &'a T)> {
    r.zip(f)
}

fn judge_current(r: &DiskIdentity, f: &DiskIdentity) -> Verdict {
    let different = |why: String| Verdict::Different(why);
    if r.kind != f.kind {
        return different(format!("{} is there, where {} was recorded", kind_word(f.kind), kind_word(r.kind)));
    }
    // A tmpfs names its mount: another fsid is another mount, and its data went with the old one.
    match (&r.volatile, &f.volatile) {
        (Some(kind), Some(_)) => {
            if r.fsid.is_none() || f.fsid.is_none() {
                return Verdict::Unproven {
                    reason: format!("the {kind} mount's ID was not recorded"),
                    plausible: false,
                };
            }
            if r.fsid != f.fsid {
                return different(format!(
                    "another {kind} mount (fsid {} recorded, {} found); the recorded one was unmounted and its data went with it",
                    r.fsid.as_deref().unwrap_or("-"),
                    f.fsid.as_deref().unwrap_or("-")
                ));
            }
            if r.ino != f.ino {
                return different(format!("another directory of the same {kind} mount"));
            }
            return Verdict::Same(Proof::Identity);
        }
        (Some(kind), None) => {
            return different(format!(
                "the recorded {kind} mount is gone (its data went with it); another filesystem is there"
            ));
        }
        (None, Some(kind)) => return different(format!("a {kind} mount is there, not the recorded filesystem")),
        (None, None) => {}
    }
    if let Some((a, b)) = both(r.disk.as_deref(), f.disk.as_deref())
        && !r.same_device(f)
    {
        if let (Some(x), Some(y)) = (r.loop_key(), f.loop_key()) {
            let file = |k: &LoopKey| {
                let born = k.born.map(|b| format!(", born {}", born_words(b))).unwrap_or_default();
                format!("inode {} on {}{born}", k.ino, k.dev.as_deref().unwrap_or("an unknown filesystem"))
            };
            return different(format!(
                "the device is another one: a loop device over other data (recorded {a}: {}, found {b}: {})",
                file(&x),
                file(&y)
            ));
        }
        return different(format!("the device is another one (recorded {a}, found {b})"));
    }
    if let Some((a, b)) = both(r.uuid.as_deref(), f.uuid.as_deref())
        && a != b
    {
        return different(format!("another filesystem is there (UUID {a} recorded, {b} found)"));
    }
    let disk_matches = both(r.disk.as_deref(), f.disk.as_deref()).is_some();
    let uuid_matches = both(r.uuid.as_deref(), f.uuid.as_deref()).is_some();
    if let Some((a, b)) = both(r.ino.as_ref(), f.ino.as_ref())
        && a != b
        && (disk_matches || uuid_matches)
    {
        return different(format!(
            "another directory of the same filesystem is mounted there (root inode {a} recorded, {b} found)"
        ));
    }
    if disk_matches {
        let unproven = |reason: String| Verdict::Unproven { reason, plausible: true };
        if r.uuid.is_some() != f.uuid.is_some() {
            return unproven(match &r.uuid {
                Some(u) => format!("the filesystem UUID (recorded {u}) cannot be read now"),
                None => "no filesystem UUID was recorded, and one is there now".to_string(),
            });
        }
        if r.backing != f.backing {
            return unproven(format!(
                "the loop device's backing file is on a filesystem with another device number (recorded {}, found {})",
                r.backing.as_deref().unwrap_or("none"),
                f.backing.as_deref().unwrap_or("none")
            ));
        }
        if r.size != f.size {
            return unproven(format!(
                "the device's size changed (recorded {}, found {})",
                r.size.map_or("none".to_string(), |s| s.to_string()),
                f.size.map_or("none".to_string(), |s| s.to_string())
            ));
        }
        return Verdict::Same(Proof::Identity);
    }
    let reason = match (&r.disk, &f.disk) {
        (None, None) if r.fsid.is_some() || f.fsid.is_some() => {
            "no block device is under this filesystem and it has no per-mount ID, so nothing names the disk".to_string()
        }
        (None, None) => "the device has no stable ID (WWID, serial, device-mapper or md UUID, loop backing file), so a copy of the disk would look the same".to_string(),
        (None, Some(_)) => "the recorded identity names no stable device ID, so a copy of the disk would look the same".to_string(),
        (Some(d), None) => format!("no stable device ID can be read for the device there now (recorded {d})"),
        (Some(_), Some(_)) => unreachable!("compared above"),
    };
    let eq_where_both = |a: Option<&u64>, b: Option<&u64>| both(a, b).is_none_or(|(a, b)| a == b);
    let inode_and_size =
        eq_where_both(r.ino.as_ref(), f.ino.as_ref()) && eq_where_both(r.size.as_ref(), f.size.as_ref());
    // The best component both sides have decides whether the disk there may be the recorded one.
    let plausible = if uuid_matches {
        inode_and_size
    } else if let Some((a, b)) = both(r.fsid.as_deref(), f.fsid.as_deref()) {
        a == b && inode_and_size
    } else if let Some((a, b)) = both(r.dev.as_deref(), f.dev.as_deref()) {
        a == b && inode_and_size && r.uuid.is_none() && f.uuid.is_none()
    } else {
        false
    };
    Verdict::Unproven { reason, plausible }
}

/// The size part of a legacy block identity.
fn legacy_size(id: &str) -> Option<&str> {
    id.rsplit_once(";size=").map(|(_, s)| s)
}

fn judge_legacy(recorded: &str, found: &Found) -> Verdict {
    let (r_blk, f_blk) = (recorded.starts_with("blk:"), found.legacy.starts_with("blk:"));
    if r_blk != f_blk {
        let word = |blk: bool| if blk { "a block device" } else { "a filesystem" };
        return Verdict::Different(format!("{} is there, where {} was recorded", word(f_blk), word(r_blk)));
    }
    let equal = recorded == found.legacy;
    if r_blk {
        let by_number = |id: &str| id.starts_with("blk:dev=");
        if !(by_number(recorded) || by_number(&found.legacy)) {
            return if equal {
                Verdict::Same(Proof::Legacy)
            } else {
                Verdict::Different(format!(
                    "the device is another one (recorded {recorded}, found {} in the old format)",
                    found.legacy
                ))
            };
        }
        if !equal && legacy_size(recorded) != legacy_size(&found.legacy) {
            return Verdict::Different(format!(
                "a device of another size is there (recorded {recorded}, found {})",
                found.legacy
            ));
        }
        return Verdict::Unproven {
            reason: "the identity was recorded in the old format by device number only, which another disk can have"
                .to_string(),
            plausible: equal,
        };
    }
    let fs_type = found.fs_type.as_deref().unwrap_or("unknown");
    // A zero fsid (tmpfs on older kernels, some other filesystems) names nothing.
    let zero_fsid = recorded.starts_with("fs:fsid=0,0;");
    if LEGACY_FSID_FROM_UUID.contains(&fs_type) && !zero_fsid {
        return if equal {
            Verdict::Same(Proof::Legacy)
        } else {
            Verdict::Different(format!(
                "another {fs_type} filesystem or directory is there (recorded {recorded}, found {} in the old format)",
                found.legacy
            ))
        };
    }
    Verdict::Unproven {
        reason: format!(
            "the identity was recorded in the old format, whose filesystem ID for {fs_type} comes from the device number, not from the disk"
        ),
        plausible: equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(disk: Option<&str>, uuid: Option<&str>, ino: u64, dev: &str) -> DiskIdentity {
        DiskIdentity {
            kind: Kind::Filesystem,
            disk: disk.map(String::from),
            uuid: uuid.map(String::from),
            ino: Some(ino),
            dev: Some(dev.to_string()),
            ..Default::default()
        }
    }

    fn blk(disk: Option<&str>, backing: Option<&str>, size: u64, dev: &str) -> DiskIdentity {
        DiskIdentity {
            kind: Kind::Block,
            disk: disk.map(String::from),
            backing: backing.map(String::from),
            size: Some(size),
            dev: Some(dev.to_string()),
            ..Default::default()
        }
    }

    fn tmpfs(fsid: Option<&str>, ino: u64) -> DiskIdentity {
        DiskIdentity {
            fsid: fsid.map(String::from),
            volatile: Some("tmpfs".into()),
            ino: Some(ino),
            dev: Some("0:39".into()),
            ..Default::default()
        }
    }

    fn found(id: &DiskIdentity) -> Found {
        Found { identity: id.render(), legacy: "fs:fsid=9,9;ino=9".into(), fs_type: Some("ext4".into()) }
    }

    fn verdict(r: &DiskIdentity, f: &DiskIdentity) -> Verdict {
        judge(&r.render(), &found(f), None)
    }

    /// Same / Different / Unproven(plausible) / Unproven(implausible), for tables.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum V {
        Same,
        Diff,
        Plausible,
        Doubt,
    }

    fn short(v: &Verdict) -> V {
        match v {
            Verdict::Same(_) => V::Same,
            Verdict::Different(_) => V::Diff,
            Verdict::Unproven { plausible: true, .. } => V::Plausible,
            Verdict::Unproven { plausible: false, .. } => V::Doubt,
        }
    }

    const WWID: &str = "wwid:naa.5000c500a1b2c3d4";
    const SERIAL: &str = "serial:BTWA1234";
    const LOOP: &str = "loop:/var/disks/a.img@0#131";
    const U1: &str = "0b6c9a5e-1111-4222-8333-444455556666";
    const U2: &str = "7d1e0000-aaaa-4bbb-8ccc-dddddddddddd";

    #[test]
    fn current_format_table() {
        let cases: Vec<(&str, DiskIdentity, DiskIdentity, V)> = vec![
            (
                "same disk, filesystem, directory",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(Some(WWID), Some(U1), 2, "8:16"),
                V::Same,
            ),
            (
                "same disk renumbered after a reboot",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(Some(WWID), Some(U1), 2, "8:32"),
                V::Same,
            ),
            (
                "clone with the same UUID on another disk",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(Some(SERIAL), Some(U1), 2, "8:16"),
                V::Diff,
            ),
            (
                "filesystem remade on the same disk",
                fs(Some(WWID), Some(U1), 128, "8:16"),
                fs(Some(WWID), Some(U2), 128, "8:16"),
                V::Diff,
            ),
            (
                "another directory of the same disk",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(Some(WWID), Some(U1), 12, "8:16"),
                V::Diff,
            ),
            (
                "another directory, same UUID, no device id",
                fs(None, Some(U1), 2, "8:16"),
                fs(None, Some(U1), 12, "8:16"),
                V::Diff,
            ),
            ("another UUID, no device id", fs(None, Some(U1), 2, "8:16"), fs(None, Some(U2), 2, "8:16"), V::Diff),
            (
                "no device id, same UUID: a clone looks the same",
                fs(None, Some(U1), 2, "252:1"),
                fs(None, Some(U1), 2, "252:2"),
                V::Plausible,
            ),
            (
                "no device id and no UUID, same number",
                fs(None, None, 2, "252:1"),
                fs(None, None, 2, "252:1"),
                V::Plausible,
            ),
            (
                "no device id and no UUID, another number",
                fs(None, None, 2, "252:1"),
                fs(None, None, 2, "252:2"),
                V::Doubt,
            ),
            (
                "device id recorded, none readable now",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(None, Some(U1), 2, "8:16"),
                V::Plausible,
            ),
            (
                "device id found, none recorded",
                fs(None, Some(U1), 2, "8:16"),
                fs(Some(WWID), Some(U1), 2, "8:16"),
                V::Plausible,
            ),
            (
                "same disk, UUID not readable now",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                fs(Some(WWID), None, 2, "8:16"),
                V::Plausible,
            ),
            (
                "same disk, unknown filesystem both times",
                fs(Some(WWID), None, 2, "8:16"),
                fs(Some(WWID), None, 2, "8:16"),
                V::Same,
            ),
            ("block, same disk", blk(Some(WWID), None, 100, "8:16"), blk(Some(WWID), None, 100, "8:48"), V::Same),
            ("block, another disk", blk(Some(WWID), None, 100, "8:16"), blk(Some(SERIAL), None, 100, "8:16"), V::Diff),
            (
                "block, same disk resized",
                blk(Some(WWID), None, 100, "8:16"),
                blk(Some(WWID), None, 200, "8:16"),
                V::Plausible,
            ),
            (
                // The device number of the file's filesystem is part of a loop disk's name.
                "block, loop file on a renumbered filesystem",
                blk(Some(LOOP), Some("8:1"), 100, "7:0"),
                blk(Some(LOOP), Some("8:17"), 100, "7:3"),
                V::Diff,
            ),
            (
                "block, loop file reattached elsewhere",
                blk(Some(LOOP), Some("8:1"), 100, "7:0"),
                blk(Some(LOOP), Some("8:1"), 100, "7:3"),
                V::Same,
            ),
            ("block, number only, same", blk(None, None, 100, "8:16"), blk(None, None, 100, "8:16"), V::Plausible),
            (
                "block, number only, another number",
                blk(None, None, 100, "8:16"),
                blk(None, None, 100, "8:32"),
                V::Doubt,
            ),
            ("block, number only, another size", blk(None, None, 100, "8:16"), blk(None, None, 200, "8:16"), V::Doubt),
            (
                "block where a filesystem was",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                blk(Some(WWID), None, 100, "8:16"),
                V::Diff,
            ),
            (
                "filesystem where a block device was",
                blk(Some(WWID), None, 100, "8:16"),
                fs(Some(WWID), Some(U1), 2, "8:16"),
                V::Diff,
            ),
            ("tmpfs, same mount", tmpfs(Some("3741be4d0138e263"), 1), tmpfs(Some("3741be4d0138e263"), 1), V::Same),
            ("tmpfs remounted", tmpfs(Some("3741be4d0138e263"), 1), tmpfs(Some("620ff0110fd9cb33"), 1), V::Diff),
            (
                "tmpfs, another directory",
                tmpfs(Some("3741be4d0138e263"), 1),
                tmpfs(Some("3741be4d0138e263"), 5),
                V::Diff,
            ),
            (
                "tmpfs where a disk was",
                fs(Some(WWID), Some(U1), 2, "8:16"),
                tmpfs(Some("3741be4d0138e263"), 1),
                V::Diff,
            ),
            (
                "a disk where a tmpfs was",
                tmpfs(Some("3741be4d0138e263"), 1),
                fs(Some(WWID), Some(U1), 2, "8:16"),
                V::Diff,
            ),
            ("tmpfs with no ID recorded", tmpfs(None, 1), tmpfs(None, 1), V::Doubt),
        ];
        for (what, r, f, want) in cases {
            let got = verdict(&r, &f);
            assert_eq!(short(&got), want, "{what}: {} vs {} -> {got:?}", r.render(), f.render());
            assert_eq!(short(&verdict(&f, &r)), want, "{what} (reversed)");
        }
    }

    #[test]
    fn filesystems_with_no_device_under_them_are_never_proven() {
        let nfs = |fsid: &str, ino| DiskIdentity {
            fsid: Some(fsid.into()),
            ino: Some(ino),
            dev: Some("0:52".into()),
            ..Default::default()
        };
        assert_eq!(short(&verdict(&nfs("aa", 2), &nfs("aa", 2))), V::Plausible);
        assert_eq!(short(&verdict(&nfs("aa", 2), &nfs("bb", 2))), V::Doubt);
        assert_eq!(short(&verdict(&nfs("aa", 2), &nfs("aa", 3))), V::Doubt);
        let Verdict::Unproven { reason, .. } = verdict(&nfs("aa", 2), &nfs("aa", 2)) else { panic!() };
        assert!(reason.contains("no block device"), "{reason}");
    }

    /// Every combination of components, recorded against found: the verdict follows the rules
    /// in the module documentation, is symmetric, ignores device numbers for proof, and a
    /// confirmation only ever settles an unproven verdict for exactly the identity found.
    #[test]
    fn exhaustive_rules_over_every_combination() {
        let disks = [None, Some(WWID), Some(SERIAL)];
        let uuids = [None, Some(U1), Some(U2)];
        let devs = ["8:16", "8:32"];
        let mut all = Vec::new();
        for d in disks {
            for dev in devs {
                for u in uuids {
                    for ino in [2, 3] {
                        all.push(fs(d, u, ino, dev));
                    }
                }
                for backing in [None, Some("8:1"), Some("8:2")] {
                    for size in [100, 200] {
                        all.push(blk(d, backing, size, dev));
                    }
                }
            }
        }
        for s in ["aa", "bb"] {
            for ino in [1, 2] {
                all.push(tmpfs(Some(s), ino));
            }
        }
        for r in &all {
            assert_eq!(DiskIdentity::parse(&r.render()).as_ref(), Some(r), "round trip {}", r.render());
            for f in &all {
                let got = verdict(r, f);
                let ctx = format!("{} vs {} -> {got:?}", r.render(), f.render());
                let pair = |a: &Option<String>, b: &Option<String>| a.as_ref().zip(b.as_ref()).map(|(a, b)| a == b);
                let (disk, uuid) = (pair(&r.disk, &f.disk), pair(&r.uuid, &f.uuid));
                let volatile = r.volatile.is_some() || f.volatile.is_some();
                let proven_different = r.kind != f.kind
                    || r.volatile.is_some() != f.volatile.is_some()
                    || (volatile && (r.fsid != f.fsid || r.ino != f.ino))
                    || disk == Some(false)
                    || uuid == Some(false)
                    || (r.ino != f.ino && (disk == Some(true) || uuid == Some(true)));
                assert_eq!(matches!(got, Verdict::Different(_)), proven_different, "{ctx}");
                if matches!(got, Verdict::Same(_)) {
                    assert!(volatile || disk == Some(true), "proof needs a stable device id: {ctx}");
                    assert!(r.uuid == f.uuid && r.ino == f.ino && r.size == f.size && r.backing == f.backing, "{ctx}");
                }
                if !proven_different && !volatile && disk == Some(true) {
                    let complete = r.uuid.is_some() == f.uuid.is_some() && r.backing == f.backing && r.size == f.size;
                    assert_eq!(matches!(got, Verdict::Same(_)), complete, "{ctx}");
                }
                assert_eq!(short(&got), short(&verdict(f, r)), "symmetric: {ctx}");
                let mut renumbered = f.clone();
                renumbered.dev = Some("259:7".into());
                let moved = short(&verdict(r, &renumbered));
                match short(&got) {
                    V::Plausible | V::Doubt => assert!(matches!(moved, V::Plausible | V::Doubt), "{ctx}"),
                    v => assert_eq!(moved, v, "device numbers prove nothing: {ctx}"),
                }
                if r == f {
                    assert!(matches!(short(&got), V::Same | V::Plausible), "identical is never doubtful: {ctx}");
                }
                // Confirmations.
                let fd = found(f);
                let confirmed = judge(&r.render(), &fd, Some(&fd.identity));
                match &got {
                    Verdict::Unproven { .. } => assert_eq!(confirmed, Verdict::Same(Proof::Confirmed), "{ctx}"),
                    v => assert_eq!(&confirmed, v, "{ctx}"),
                }
                assert_eq!(
                    judge(&r.render(), &fd, Some(&r.render())) == got,
                    r.render() != fd.identity || !matches!(got, Verdict::Unproven { .. }),
                    "{ctx}"
                );
                assert_eq!(judge(&r.render(), &fd, Some("v2;fs;dev=1:1")), got, "{ctx}");
                assert_eq!(is_present(&r.render(), &fd), matches!(short(&got), V::Same | V::Plausible), "{ctx}");
            }
        }
    }

    fn legacy(recorded: &str, found_legacy: &str, fs_type: Option<&str>) -> Verdict {
        let f = Found {
            identity: fs(Some(WWID), Some(U1), 2, "8:16").render(),
            legacy: found_legacy.to_string(),
            fs_type: fs_type.map(String::from),
        };
        judge(recorded, &f, None)
    }

    #[test]
    fn legacy_identities_keep_working() {
        let ext = "fs:fsid=-1282380397,1234;ino=2";
        let other = "fs:fsid=77,88;ino=2";
        let cases = [
            ("ext4 unchanged", ext, ext, Some("ext4"), V::Same),
            ("ext3 unchanged", ext, ext, Some("ext3"), V::Same),
            ("btrfs unchanged", ext, ext, Some("btrfs"), V::Same),
            ("tmpfs unchanged", ext, ext, Some("tmpfs"), V::Same),
            ("ext4 another filesystem", ext, other, Some("ext4"), V::Diff),
            ("tmpfs remounted", ext, other, Some("tmpfs"), V::Diff),
            ("xfs unchanged: fsid is the device number", ext, ext, Some("xfs"), V::Plausible),
            ("xfs another device number", ext, other, Some("xfs"), V::Doubt),
            ("unknown type", ext, ext, None, V::Plausible),
            ("zero fsid names nothing", "fs:fsid=0,0;ino=1", "fs:fsid=0,0;ino=1", Some("tmpfs"), V::Plausible),
            ("block where a filesystem was", ext, "blk:wwid=naa.1;size=100", None, V::Diff),
            ("filesystem where a block device was", "blk:wwid=naa.1;size=100", ext, Some("ext4"), V::Diff),
            ("wwid unchanged", "blk:wwid=naa.1;size=100", "blk:wwid=naa.1;size=100", None, V::Same),
            ("serial unchanged", "blk:serial=X;size=100", "blk:serial=X;size=100", None, V::Same),
            ("loop unchanged", "blk:loop=/a.img@0;size=100", "blk:loop=/a.img@0;size=100", None, V::Same),
            ("another wwid", "blk:wwid=naa.1;size=100", "blk:wwid=naa.2;size=100", None, V::Diff),
            ("wwid now a serial", "blk:wwid=naa.1;size=100", "blk:serial=X;size=100", None, V::Diff),
            ("device number unchanged", "blk:dev=8:16;size=100", "blk:dev=8:16;size=100", None, V::Plausible),
            ("another device number", "blk:dev=8:16;size=100", "blk:dev=8:32;size=100", None, V::Doubt),
            ("device number, another size", "blk:dev=8:16;size=100", "blk:dev=8:16;size=200", None, V::Diff),
            ("device number now a serial", "blk:dev=8:16;size=100", "blk:serial=X;size=100", None, V::Doubt),
        ];
        for (what, r, f, t, want) in cases {
            let got = legacy(r, f, t);
            assert_eq!(short(&got), want, "{what}: {got:?}");
            if want == V::Same {
                assert_eq!(got, Verdict::Same(Proof::Legacy), "{what}");
            }
        }
        // A confirmation settles an unproven legacy identity too, for the identity found now.
        let f =
            Found { identity: "v2;fs;uuid=x;ino=128;dev=7:1".into(), legacy: ext.into(), fs_type: Some("xfs".into()) };
        assert_eq!(judge(ext, &f, Some("v2;fs;uuid=x;ino=128;dev=7:1")), Verdict::Same(Proof::Confirmed));
        assert_eq!(short(&judge(ext, &f, Some(ext))), V::Plausible, "confirming the old record is not enough");
    }

    #[test]
    fn disks_are_shared_by_what_names_them_not_by_inode_or_number() {
        let cases = [
            // A directory of the recorded filesystem, or the same filesystem under another number.
            ("v2;fs;disk=serial:S;uuid=u;ino=2;dev=7:0", "v2;fs;disk=serial:S;uuid=u;ino=77;dev=7:0", true),
            ("v2;fs;disk=serial:S;uuid=u;ino=2;dev=7:0", "v2;fs;disk=serial:S;uuid=u;ino=2;dev=7:9", true),
            (
                "v2;fs;disk=loop:/i.img@0#5;uuid=u;ino=2;dev=7:0",
                "v2;fs;disk=loop:/i.img@0#5;uuid=u;ino=2;dev=7:3",
                true,
            ),
            // Two devices that name themselves are two disks, clones or not.
            ("v2;fs;disk=serial:S;uuid=u;ino=2", "v2;fs;disk=serial:T;uuid=u;ino=2", false),
            ("v2;fs;disk=serial:S;uuid=u;ino=2", "v2;fs;disk=serial:T;uuid=w;ino=2", false),
            // Without a device ID on one side the UUID decides, conservatively.
            ("v2;fs;uuid=u;ino=2;dev=252:0", "v2;fs;uuid=u;ino=2;dev=252:1", true),
            ("v2;fs;disk=serial:S;uuid=u;ino=2", "v2;fs;uuid=u;ino=2;dev=252:1", true),
            ("v2;fs;uuid=u;ino=2;dev=252:0", "v2;fs;uuid=w;ino=2;dev=252:0", false),
            // Whole disk and its partitions; two partitions are not.
            ("v2;blk;disk=wwid:W;size=100", "v2;fs;disk=wwid:W/part1@2048;uuid=u;ino=2", true),
            ("v2;fs;disk=wwid:W/part1@2048;uuid=u;ino=2", "v2;blk;disk=wwid:W;size=100", true),
            ("v2;blk;disk=wwid:W/part1@2048;size=1", "v2;blk;disk=wwid:W/part2@4096;size=1", false),
            // A partition renumbered (the same start) is the same data.
            ("v2;blk;disk=wwid:W/part1@2048;size=1", "v2;blk;disk=wwid:W/part2@2048;size=1", true),
            ("v2;fs;disk=wwid:W/part1@2048;uuid=u;ino=2", "v2;blk;disk=wwid:W/part5@2048;size=1", true),
            // Another start whose range overlaps the recorded one (both sizes known).
            ("v2;blk;disk=wwid:W/part1@2048;size=1048576", "v2;blk;disk=wwid:W/part1@2049;size=512", true),
            ("v2;blk;disk=wwid:W/part1@2048;size=1048576", "v2;blk;disk=wwid:W/part2@4096;size=512", false),
            // tmpfs: the mount's ID names it; a directory of it is it.
            ("v2;fs;fsid=ab;volatile=tmpfs;ino=1", "v2;fs;fsid=ab;volatile=tmpfs;ino=9", true),
            ("v2;fs;fsid=ab;volatile=tmpfs;ino=1", "v2;fs;fsid=cd;volatile=tmpfs;ino=1", false),
            // A disk that names nothing may be any disk at its device number: the same number
            // counts as the same disk (conservative), another number does not.
            ("v2;blk;size=100;dev=7:0", "v2;blk;size=100;dev=7:0", true),
            ("v2;fs;ino=2;dev=7:0", "v2;fs;ino=9;dev=7:0", true),
            ("v2;blk;size=100;dev=7:0", "v2;blk;size=100;dev=7:1", false),
            ("v2;fs;disk=serial:S;uuid=u;ino=2;dev=7:0", "v2;fs;ino=2;dev=7:0", true),
            // Old records match only themselves.
            ("fs:fsid=1,2;ino=2", "fs:fsid=1,2;ino=2", true),
            ("fs:fsid=1,2;ino=2", "v2;fs;fsid=ab;volatile=tmpfs;ino=2", false),
        ];
        for (r, f, shared) in cases {
            assert_eq!(may_share_disk(r, f), shared, "{r} vs {f}");
            assert_eq!(may_share_disk(f, r), shared, "symmetric: {f} vs {r}");
        }
    }

    #[test]
    fn old_records_are_upgraded_only_when_they_prove_the_same_disk() {
        let current = "v2;fs;disk=serial:S1;uuid=u;ino=2;dev=8:16";
        let found = |legacy: &str, fs_type: &str| Found {
            identity: current.into(),
            legacy: legacy.into(),
            fs_type: Some(fs_type.into()),
        };
        let ext = "fs:fsid=1,2;ino=2";
        assert_eq!(upgrade(ext, &found(ext, "ext4")), Some(current.into()), "ext4: the old fsid proves it");
        assert_eq!(upgrade(ext, &found(ext, "xfs")), None, "XFS: the old fsid proves nothing");
        assert_eq!(upgrade(ext, &found("fs:fsid=3,4;ino=2", "ext4")), None, "another disk");
        let blk = "blk:serial=S1;size=100";
        let f = Found { identity: "v2;blk;disk=serial:S1;size=100".into(), legacy: blk.into(), fs_type: None };
        assert_eq!(upgrade(blk, &f), Some(f.identity.clone()));
        let by_number = "blk:dev=8:16;size=100";
        let f = Found { legacy: by_number.into(), ..f };
        assert_eq!(upgrade(by_number, &f), None, "a device number proves nothing");
        // Current records are never "upgraded", whatever is found.
        assert_eq!(upgrade(current, &found(ext, "ext4")), None);
        assert!(is_legacy(ext) && is_legacy(blk) && !is_legacy(current));
    }

    #[test]
    fn unknown_and_damaged_records_are_unproven() {
        let f = found(&fs(Some(WWID), Some(U1), 2, "8:16"));
        for bad in [
            "wwn-0x5000c500a1b2c3d4",
            "",
            "v3;fs;uuid=a",
            "v2;fs;bogus=1",
            "v2;fs;ino=2;ino=2",
            "v2;fs;ino=x",
            "v2;tape",
        ] {
            assert_eq!(short(&judge(bad, &f, None)), V::Doubt, "{bad:?}");
        }
        // Equal strings in an unknown format are at least plausibly the same.
        let weird = Found { identity: "v9;fs;x".into(), ..f.clone() };
        assert_eq!(short(&judge("v9;fs;x", &weird, None)), V::Plausible);
        assert_eq!(judge("v9;fs;x", &weird, Some("v9;fs;x")), Verdict::Same(Proof::Confirmed));
    }

    #[test]
    fn values_are_escaped_and_spelled_one_way() {
        let id = DiskIdentity {
            kind: Kind::Block,
            disk: Some("loop:/var/lib/my disks/a;b=c%d'e\u{e9}.img@512+1024#77".into()),
            backing: Some("8:1".into()),
            size: Some(4096),
            dev: Some("7:3".into()),
            ..Default::default()
        };
        let text = id.render();
        assert_eq!(
            text,
            "v2;blk;disk=loop:/var/lib/my%20disks/a%3Bb%3Dc%25d%27e%C3%A9.img@512+1024#77;backing=8:1;size=4096;dev=7:3"
        );
        assert_eq!(DiskIdentity::parse(&text), Some(id));
        for other in [
            "v2;blk;disk=a%3bb;size=1", // lower-case escape: not the canonical spelling
            "v2;blk;size=1;disk=a",     // order
            "v2;blk;disk=a%ZZ",         // bad escape
            "v2;blk;disk=a%C3",         // not UTF-8
            "v2;blk;size=+1",           // not canonical number
            "v2;fs;uuid=a;=b",          // empty key
        ] {
            assert_eq!(DiskIdentity::parse(other), None, "{other}");
        }
        let plain = fs(Some(WWID), Some(U1), 2, "8:16").render();
        assert_eq!(plain, format!("v2;fs;disk={WWID};uuid={U1};ino=2;dev=8:16"));
    }

    #[test]
    fn loop_devices_over_overlapping_ranges_of_one_file_share_a_disk() {
        let blk = |disk: &str| format!("v2;blk;disk={disk};size=1;dev=7:0");
        let whole = blk("loop:/i.img@0#5");
        assert!(may_share_disk(&whole, &blk("loop:/i.img@1048576#5")), "a partition-like range of the image");
        assert!(may_share_disk(&blk("loop:/i.img@0+1048576#5"), &blk("loop:/i.img@4096+4096#5")));
        assert!(!may_share_disk(&blk("loop:/i.img@0+1048576#5"), &blk("loop:/i.img@1048576#5")), "disjoint");
        assert!(!may_share_disk(&whole, &blk("loop:/i.img@0#6")), "another file (inode)");
        // The same inode under another path is the same file renamed (or seen from another
        // mount namespace): a path names nothing.
        assert!(may_share_disk(&whole, &blk("loop:/j.img@0#5")));
        assert!(may_share_disk(&whole, &blk("loop:7:0:5@0")), "old and current formats");
        assert!(!may_share_disk(&blk("loop:7:0:5@0"), &blk("loop:7:1:5@0")), "another filesystem");
    }

    /// Every combination of whole device (same, other), span (whole, partition, unreadable
    /// suffix), partition number (same, other), start (same, other, overlapping or not) and
    /// sizes (known, unknown): the one rule, and that every caller follows it.
    #[test]
    fn partitions_are_the_same_data_by_disk_and_start_never_by_number() {
        const MIB: u64 = 1 << 20;
        // (suffix, size): sizes are in bytes, starts in 512-byte sectors (2048 = 1 MiB).
        let spans: [(&str, Option<u64>); 9] = [
            ("", Some(64 * MIB)),
            ("", None),
            ("/part1@2048", Some(8 * MIB)),
            ("/part1@2048", None),
            ("/part2@2048", Some(4 * MIB)),  // partition 1 renumbered (another size too)
            ("/part2@4096", Some(8 * MIB)),  // starts at 2 MiB: inside partition 1 (8 MiB)
            ("/part1@20480", Some(8 * MIB)), // starts at 10 MiB: after both
            ("/part3@20480", None),
            ("/part1", None), // no start: cannot be placed
        ];
        let bytes = |suffix: &str, size: Option<u64>| -> Option<(u64, u64)> {
            let start: u64 = suffix.rsplit_once('@')?.1.parse().ok()?;
            Some((start * 512, start * 512 + size?))
        };
        for whole_b in ["wwid:naa.1", "wwid:naa.2"] {
            for (sa, za) in spans {
                for (sb, zb) in spans {
                    let (a, b) = (format!("wwid:naa.1{sa}"), format!("{whole_b}{sb}"));
                    let ctx = format!("{a} ({za:?}) vs {b} ({zb:?})");
                    let got = devices_share(&a, za, &b, zb, str::to_string);
                    let start = |s: &str| s.rsplit_once('@').map(|(_, st)| st.to_string());
                    let want = if whole_b != "wwid:naa.1" {
                        None
                    } else if a == b || (sa.is_empty() && sb.is_empty()) {
                        Some(Shared::Same)
                    } else if sa.is_empty() || sb.is_empty() || start(sa).is_none() || start(sb).is_none() {
                        Some(Shared::Overlap)
                    } else if start(sa) == start(sb) {
                        Some(Shared::Same)
                    } else {
                        match (bytes(sa, za), bytes(sb, zb)) {
                            (Some((a0, a1)), Some((b0, b1))) if a0 < b1 && b0 < a1 => Some(Shared::Overlap),
                            _ => Some(Shared::Apart),
                        }
                    };
                    assert_eq!(got, want, "{ctx}");
                    assert_eq!(devices_share(&b, zb, &a, za, str::to_string), got, "symmetric: {ctx}");
                    // Callers: identities of each kind, the device claims' id rule, loop keys.
                    let id = |disk: &str, size: Option<u64>| DiskIdentity {
                        kind: Kind::Block,
                        disk: Some(disk.into()),
                        size,
                        ..Default::default()
                    };
                    let (ia, ib) = (id(&a, za), id(&b, zb));
                    assert_eq!(ia.same_device(&ib), got == Some(Shared::Same), "same_device: {ctx}");
                    let shares = got.is_some_and(|s| s != Shared::Apart);
                    assert_eq!(may_share_disk(&ia.render(), &ib.render()), shares, "may_share_disk: {ctx}");
                    let ids_only =
                        devices_share(&a, None, &b, None, str::to_string).is_some_and(|s| s != Shared::Apart);
                    assert_eq!(crate::core::devices::device_claim::ids_overlap(&a, &b), ids_only, "ids_overlap: {ctx}");
                    let whole_loop = if whole_b == "wwid:naa.1" { "loop:7:0:5@0" } else { "loop:7:0:6@0" };
                    if !sa.ends_with("/part1") && !sb.ends_with("/part1") {
                        let (la, lb) = (id(&format!("loop:7:0:5@0{sa}"), za), id(&format!("{whole_loop}{sb}"), zb));
                        assert_eq!(la.same_device(&lb), got == Some(Shared::Same), "loop same_device: {ctx}");
                        assert_eq!(may_share_disk(&la.render(), &lb.render()), shares, "loop may_share_disk: {ctx}");
                    }
                }
            }
        }
        assert_eq!(split_partition("wwid:x/part12@4096"), ("wwid:x", Span::Partition { number: 12, start: 4096 }));
        assert_eq!(split_partition("wwid:x"), ("wwid:x", Span::Whole));
        assert_eq!(split_partition("wwid:x/part1@02048"), ("wwid:x", Span::Unreadable), "not canonical");
    }

    fn key(dev: Option<&str>, ino: u64, offset: u64, limit: Option<u64>, part: Option<&str>) -> LoopKey {
        LoopKey { dev: dev.map(String::from), ino, offset, limit, part: part.map(String::from), born: None, size: None }
    }

    #[test]
    fn loop_ids_are_read_in_both_formats() {
        let cases = [
            ("loop:7:0:12@0", Some(key(Some("7:0"), 12, 0, None, None))),
            ("loop:259:3:9978155@1048576+4096", Some(key(Some("259:3"), 9978155, 1048576, Some(4096), None))),
            ("loop:0:45:2@0/part1@2048", Some(key(Some("0:45"), 2, 0, None, Some("/part1@2048")))),
            ("loop:/tmp/a.img@0#12", Some(key(None, 12, 0, None, None))),
            ("loop:/a@b.img@512+1024#77/part1@2048", Some(key(None, 77, 512, Some(1024), Some("/part1@2048")))),
            ("loop:/a#b/c d.img@0#5", Some(key(None, 5, 0, None, None))),
            ("loop:/my/part7@9.img@0#5", Some(key(None, 5, 0, None, None))),
            ("wwid:naa.1", None),
            ("loop:", None),
            ("loop:7:0@0", None),
            ("loop:7:0:12", None),
            ("loop:7:0:12@", None),
            ("loop:7:0:012@0", None),
            ("loop:7:0:12@0+", None),
            ("loop:7:0:12@-1", None),
            ("loop:7:0:12:1@0", None),
            ("loop:7:0:12@0/part", None),
            ("loop:7:0:12@0/partx@1", None),
            ("loop:7:0:12@0/part1@2048/part2@1", None),
            ("loop:/a.img@0#", None),
            ("loop:/a.img#5", None),
            ("loop:/a.img@x#5", None),
            ("loop:/a.img@0#5x", None),
        ];
        for (text, want) in cases {
            let got = LoopKey::parse(text);
            assert_eq!(got, want, "{text}");
            if let Some(k) = got.filter(|k| k.dev.is_some()) {
                assert_eq!(k.render().as_deref(), Some(text), "one spelling: {text}");
            }
        }
        assert_eq!(key(None, 1, 0, None, None).render(), None, "no device number, no current id");
        let old = LoopKey::parse("loop:/a.img@4096+512#9/part2@8").unwrap().with_backing(Some("8:3"));
        assert_eq!(old.render().as_deref(), Some("loop:8:3:9@4096+512/part2@8"));
        let new = LoopKey::parse("loop:8:3:9@0").unwrap().with_backing(Some("8:4"));
        assert_eq!(new.dev.as_deref(), Some("8:3"), "a current id keeps its own device number");
    }

    /// Every pair of a set of loop ids in both formats: "same" and "overlaps" follow from
    /// inode, device number (where both know it), range and partition alone, never the path,
    /// and are symmetric.
    #[test]
    fn loop_ids_compare_by_file_and_range_across_formats() {
        let mut ids: Vec<(String, Option<&str>)> = Vec::new();
        for dev in [None, Some("7:0"), Some("7:1")] {
            for ino in [5, 6] {
                for range in ["0", "0+4096", "4096+4096", "8192"] {
                    // "/part3@8": partition 1 renumbered (the same start).
                    for part in ["", "/part1@8", "/part2@16", "/part3@8"] {
                        match dev {
                            Some(d) => ids.push((format!("loop:{d}:{ino}@{range}{part}"), None)),
                            None => {
                                ids.push((format!("loop:/i.img@{range}#{ino}{part}"), None));
                                ids.push((format!("loop:/renamed/j.img@{range}#{ino}{part}"), Some("7:0")));
                            }
                        }
                    }
                }
            }
        }
        // Device ids `a` and `b`, with each side's `backing`, as the identities' devices.
        let same_disk_id = |a: &str, ab: Option<&str>, b: &str, bb: Option<&str>| {
            let device = |disk: &str, backing: Option<&str>| DiskIdentity {
                disk: Some(disk.into()),
                backing: backing.map(String::from),
                ..Default::default()
            };
            device(a, ab).same_device(&device(b, bb))
        };
        for (a, ab) in &ids {
            let ka = LoopKey::parse(a).unwrap().with_backing(*ab);
            for (b, bb) in &ids {
                let kb = LoopKey::parse(b).unwrap().with_backing(*bb);
                let ctx = format!("{a} ({ab:?}) vs {b} ({bb:?})");
                let devs_agree = ka.dev.is_none() || kb.dev.is_none() || ka.dev == kb.dev;
                let file = ka.ino == kb.ino && devs_agree;
                let end = |k: &LoopKey| k.limit.map_or(u64::MAX, |l| k.offset + l);
                let range = ka.offset == kb.offset && ka.limit == kb.limit;
                let start = |k: &LoopKey| k.part.as_deref().map(|p| p.rsplit_once('@').map(|(_, s)| s.to_string()));
                let same = file && range && start(&ka) == start(&kb);
                assert_eq!(same_disk_id(a, *ab, b, *bb), same, "{ctx}");
                assert_eq!(same_disk_id(b, *bb, a, *ab), same, "symmetric: {ctx}");
                let overlap = file
                    && ka.offset < end(&kb)
                    && kb.offset < end(&ka)
                    && !(range && ka.part.is_some() && kb.part.is_some() && start(&ka) != start(&kb));
                assert_eq!(ka.overlaps(&kb), overlap, "{ctx}");
                assert_eq!(kb.overlaps(&ka), overlap, "symmetric: {ctx}");
                assert!(!same || overlap, "the same data overlaps itself: {ctx}");
            }
        }
        assert!(!same_disk_id("loop:7:0:5@0", None, "wwid:x", None));
        assert!(same_disk_id("wwid:x", None, "wwid:x", None));
        assert!(!DiskIdentity::default().same_device(&DiskIdentity::default()), "no device named");
    }

    #[test]
    fn a_pv_recorded_with_an_old_loop_id_is_still_proven_by_its_own_disk() {
        let old = |disk: &str, backing: &str| format!("v2;blk;disk={disk};backing={backing};size=1048576;dev=7:3");
        let now = |disk: &str| Found {
            identity: format!("v2;blk;disk={disk};backing=7:0;size=1048576;dev=7:9"),
            legacy: "blk:loop=/elsewhere.img@0;size=1048576".into(),
            fs_type: None,
        };
        let cases = [
            ("unchanged", old("loop:/i.img@0#5", "7:0"), "loop:7:0:5@0", V::Same),
            ("renamed, attached again", old("loop:/i.img@0#5", "7:0"), "loop:7:0:5@0", V::Same),
            ("another inode", old("loop:/i.img@0#5", "7:0"), "loop:7:0:6@0", V::Diff),
            ("another offset", old("loop:/i.img@0#5", "7:0"), "loop:7:0:5@512", V::Diff),
            ("a size limit now", old("loop:/i.img@0#5", "7:0"), "loop:7:0:5@0+4096", V::Diff),
            ("another filesystem", old("loop:/i.img@0#5", "7:1"), "loop:7:0:5@0", V::Diff),
            ("a partition of it", old("loop:/i.img@0#5", "7:0"), "loop:7:0:5@0/part1@2048", V::Diff),
            ("current, unchanged", old("loop:7:0:5@0", "7:0"), "loop:7:0:5@0", V::Same),
            ("current, another filesystem", old("loop:7:1:5@0", "7:1"), "loop:7:0:5@0", V::Diff),
        ];
        // (what, recorded, found, verdict, whether they may share data)
        for (what, recorded, found_disk, want) in cases {
            let got = judge(&recorded, &now(found_disk), None);
            assert_eq!(short(&got), want, "{what}: {got:?}");
            let overlapping = ["another offset", "a size limit now", "a partition of it"];
            let shared = may_share_disk(&recorded, &now(found_disk).identity);
            assert_eq!(shared, want == V::Same || overlapping.contains(&what), "{what}");
        }
        let fs_old = "v2;fs;disk=loop:/i.img@0#5/part1@2048;backing=7:0;uuid=u;ino=2;dev=259:1";
        let fs_now = Found {
            identity: "v2;fs;disk=loop:7:0:5@0/part1@2048;backing=7:0;uuid=u;ino=2;dev=259:4".into(),
            legacy: "fs:fsid=1,2;ino=2".into(),
            fs_type: Some("ext4".into()),
        };
        assert_eq!(judge(fs_old, &fs_now, None), Verdict::Same(Proof::Identity));
    }

    #[test]
    fn a_backing_file_that_reused_a_deleted_ones_inode_is_another_disk_where_birth_times_are_known() {
        // A loop device over inode 5 of 7:0, its file born at `born` (None: not readable).
        let id = |kind: Kind, born: Option<u64>, part: &str| DiskIdentity {
            kind,
            disk: Some(format!("loop:7:0:5@0{part}")),
            backing: Some("7:0".into()),
            born,
            uuid: (kind == Kind::Filesystem).then(|| "u".to_string()),
            ino: (kind == Kind::Filesystem).then_some(2),
            size: (kind == Kind::Block).then_some(1 << 20),
            dev: Some("7:3".into()),
            ..Default::default()
        };
        const A: u64 = 1_795_882_644_123_456_789;
        const B: u64 = 1_795_882_699_000_000_001;
        let old_record = "v2;blk;disk=loop:/i.img@0#5;backing=7:0;size=1048576;dev=7:3";
        for (kind, part) in [(Kind::Block, ""), (Kind::Filesystem, "/part1@2048")] {
            // (what, recorded born, found born, verdict)
            let cases = [
                ("the same file", Some(A), Some(A), V::Same),
                ("a new file on the deleted one's inode", Some(A), Some(B), V::Diff),
                ("the file deleted while attached (birth unreadable)", Some(A), None, V::Same),
                ("recorded by an earlier version", None, Some(B), V::Same),
                ("neither knows", None, None, V::Same),
            ];
            for (what, r, f, want) in cases {
                let (r, f) = (id(kind, r, part), id(kind, f, part));
                assert_eq!(DiskIdentity::parse(&r.render()).as_ref(), Some(&r), "round trip {}", r.render());
                let got = verdict(&r, &f);
                assert_eq!(short(&got), want, "{kind:?} {what}: {got:?}");
                assert_eq!(short(&verdict(&f, &r)), want, "symmetric: {what}");
                assert_eq!(may_share_disk(&r.render(), &f.render()), want == V::Same, "{kind:?} {what}");
                assert_eq!(r.same_device(&f), want == V::Same, "{kind:?} {what}");
                if let Verdict::Different(why) = got {
                    assert!(why.contains("born 2026-11-28T") && why.contains("inode 5 on 7:0"), "{why}");
                }
            }
        }
        // An old-format record knows no birth time: proven by the file's inode as before.
        let now = Found { identity: id(Kind::Block, Some(B), "").render(), ..Default::default() };
        assert_eq!(judge(old_record, &now, None), Verdict::Same(Proof::Identity));
        // The birth time is never part of the stable id (link names, `wipe-disk --id`).
        let key = id(Kind::Block, Some(A), "").loop_key().expect("a loop key");
        assert_eq!((key.born, key.render().as_deref()), (Some(A), Some("loop:7:0:5@0")));
        // One spelling: digits only.
        for bad in ["born=", "born=01", "born=1.5", "born=-1"] {
            let text = format!("v2;blk;disk=loop:7:0:5@0;backing=7:0;{bad};size=1048576");
            assert_eq!(DiskIdentity::parse(&text), None, "{text}");
        }
    }
}
