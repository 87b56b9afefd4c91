//! The mount table, from `/proc/self/mountinfo`: the only reliable way to know whether a
//! directory is a mount point (a bind mount of a directory onto itself included) as seen from
//! inside the agent's container.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::core::volumes::volume_safety::MountFacts;
use crate::host::HostError;
use crate::host::ops::Domain;

/// Where the kernel publishes the mount table of our mount namespace.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo, with the fields discovery uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount ID (unique in the namespace).
    pub id: u32,
    /// `major:minor` of the filesystem's device.
    pub device: String,
    /// Path within the filesystem that is mounted (`/` unless a bind mount of a subdirectory).
    pub root: PathBuf,
    /// Where it is mounted, with octal escapes decoded.
    pub mount_point: PathBuf,
    /// Filesystem type (`ext4`, `tmpfs`...).
    pub fs_type: String,
    /// Mount source (`/dev/sdb1`, `tmpfs`...).
    pub source: String,
    /// The filesystem itself is read-only (super options `ro`, or ext4's `emergency_ro` after an
    /// error), whatever this mount's own options say.
    pub super_read_only: bool,
    /// The filesystem is shut down (super option `shutdown`: ext4 after an error or the
    /// shutdown ioctl; XFS shows none, see host::health::disk_health).
    pub super_shut_down: bool,
    /// The filesystem's own (super) options, as the kernel shows them (`rw,size=16384k,mode=755`).
    pub super_options: String,
}

impl MountEntry {
    /// This mount as the pure safety rules see it.
    pub fn facts(&self) -> MountFacts<'_> {
        MountFacts { device: &self.device, root: &self.root, mount_point: &self.mount_point, fs_type: &self.fs_type }
    }
}

/// The mount points of this namespace, last mount on a path winning (as the kernel shows it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    /// Mount point -> ID of the last mount on it. Each entry is kept once, in `by_id`: a node
    /// with a thousand volume mounts reads this table on every pass.
    by_point: BTreeMap<PathBuf, u32>,
    /// Every mount by ID, covered and stacked ones included (see host::volumes::volume::mount_at).
    by_id: BTreeMap<u32, MountEntry>,
    /// The text it was read from: the mount watch compares the table it reads on a kernel
    /// event with the one the last pass read by the same lines (host::mounts::watch::MountWatch).
    text: String,
}

impl MountTable {
    /// Reads the current mount table.
    pub fn read() -> Result<Self, HostError> {
        let bytes = std::fs::read(MOUNTINFO).map_err(|source| HostError::Io {
            path: PathBuf::from(MOUNTINFO),
            op: "read",
            source,
        })?;
        // Volume paths are UTF-8 (they become PV paths); a mount elsewhere with a non-UTF-8
        // name is kept lossily rather than failing the whole table.
        Self::parse(&String::from_utf8_lossy(&bytes))
    }

    /// Parses mountinfo text; a malformed line is an error naming the line, since guessing
    /// could make a plain directory look like a volume.
    pub fn parse(text: &str) -> Result<Self, HostError> {
        let mut by_point = BTreeMap::new();
        let mut by_id = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let entry = parse_line(line).ok_or_else(|| HostError::Mountinfo { line: n + 1, text: line.to_string() })?;
            by_point.insert(entry.mount_point.clone(), entry.id);
            by_id.insert(entry.id, entry);
        }
        Ok(MountTable { by_point, by_id, text: text.to_string() })
    }

    /// The text the table was read from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The mount whose mount point is exactly `path`.
    pub fn get(&self, path: &Path) -> Option<&MountEntry> {
        self.by_point.get(path).and_then(|id| self.by_id.get(id))
    }

    /// The mount with this ID (the kernel's `stx_mnt_id`), covered or not.
    pub fn by_id(&self, id: u64) -> Option<&MountEntry> {
        u32::try_from(id).ok().and_then(|id| self.by_id.get(&id))
    }

    /// The filesystem a volume mounted exactly at `path` lies on, for the executor
    /// (host::ops::Domain), from the table alone: asking the path itself could hang. `None` for
    /// anything else (a block device entry, a plain directory), whose domain is not known so.
    pub fn domain_of(&self, path: &Path) -> Option<Domain> {
        self.get(path).map(|m| Domain::filesystem(&m.device))
    }

    /// Whether `path` is exactly a mount point.
    #[cfg(test)]
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.by_point.contains_key(path)
    }

    /// Mount points strictly below `path` (nested mounts inside a volume).
    pub fn mounts_below<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountEntry> + 'a {
        self.by_point
            .range(path.to_path_buf()..)
            .skip_while(move |(p, _)| p.as_path() == path)
            .take_while(move |(p, _)| p.starts_with(path))
            .filter_map(|(_, id)| self.by_id.get(id))
    }

    /// Every mount as the pure safety rules see it (core::volumes::volume_safety).
    pub fn facts(&self) -> Vec<MountFacts<'_>> {
        self.visible()
            .map(|e| MountFacts { device: &e.device, root: &e.root, mount_point: &e.mount_point, fs_type: &e.fs_type })
            .collect()
    }

    /// The first mount of the filesystem on device `major:minor`, if it is mounted in this
    /// namespace (a block device in use as a filesystem).
    pub fn mount_of_device(&self, device: &str) -> Option<&MountEntry> {
        self.visible().find(|e| e.device == device)
    }

    /// The mounts not covered by a later mount on the same point, in mount-point order.
    fn visible(&self) -> impl Iterator<Item = &MountEntry> {
        self.by_point.values().filter_map(|id| self.by_id.get(id))
    }

    /// Every mount in ID order, covered and stacked ones included.
    pub fn entries(&self) -> impl Iterator<Item = &MountEntry> {
        self.by_id.values()
    }

    /// Number of mounts, for logs.
    pub fn len(&self) -> usize {
        self.by_point.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.by_point.is_empty()
    }
}

/// One line of mountinfo as it is, with the fields relevance needs borrowed from it: the mount
/// watch reads the table on every kernel event (kubelet mounts and unmounts for every pod), and
/// a view costs no table built and, unless a path has an escape, no allocation.
pub(crate) struct LineView<'a> {
    /// The whole line.
    pub line: &'a str,
    pub device: &'a str,
    pub root: Cow<'a, Path>,
    pub mount_point: Cow<'a, Path>,
    /// Filesystem type and mount source, undecoded (compared with plain names only).
    pub fs_type: &'a str,
    pub source: &'a str,
}

/// The views of the lines of mountinfo `text`; `Err` with the line for one that is malformed.
pub(crate) fn line_views(text: &str) -> impl Iterator<Item = Result<LineView<'_>, &str>> {
    text.lines().filter(|l| !l.trim().is_empty()).map(|line| view_line(line).ok_or(line))
}

fn view_line(line: &str) -> Option<LineView<'_>> {
    let mut fields = line.split(' ');
    let (_id, _parent, device) = (fields.next()?, fields.next()?, fields.next()?);
    let (root, mount_point) = (fields.next()?, fields.next()?);
    fields.by_ref().find(|f| *f == "-")?;
    let (fs_type, source) = (fields.next()?, fields.next()?);
    Some(LineView { line, device, root: path_field(root), mount_point: path_field(mount_point), fs_type, source })
}

/// A path field, decoded only when it has an escape.
fn path_field(field: &str) -> Cow<'_, Path> {
    if field.contains('\\') { Cow::Owned(unescape_path(field)) } else { Cow::Borrowed(Path::new(OsStr::new(field))) }
}

// Format (proc(5)): id parent major:minor root mount-point options [optional...] - fstype source super-options
fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let id = fields.next()?.parse().ok()?;
    let _parent = fields.next()?;
    let device = fields.next()?.to_string();
    let root = unescape_path(fields.next()?);
    let mount_point = unescape_path(fields.next()?);
    let _options = fields.next()?;
    // Optional fields end at the lone "-" separator.
    fields.by_ref().find(|f| *f == "-")?;
    let fs_type = unescape_text(fields.next()?);
    let source = unescape_text(fields.next()?);
    // The kernel always ends a line with the super options, starting with `ro` or `rw`.
    let super_options = fields.next()?;
    let flag = |name: &str| super_options.split(',').any(|o| o == name);
    let super_read_only = match super_options.split(',').next() {
        Some("ro") => true,
        Some("rw") => flag("emergency_ro"),
        _ => return None,
    };
    let super_shut_down = flag("shutdown");
    let super_options = unescape_text(super_options);
    Some(MountEntry { id, device, root, mount_point, fs_type, source, super_read_only, super_shut_down, super_options })
}

/// Decodes the kernel's `\ooo` octal escapes (space, tab, newline, backslash) byte-exactly, so
/// non-UTF-8 names survive.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = (oct[0] - b'0') as u32 * 64 + (oct[1] - b'0') as u32 * 8 + (oct[2] - b'0') as u32;
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn unescape_path(field: &str) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape(field)))
}

fn unescape_text(field: &str) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
40 22 0:35 / /mnt/disks/vol1 rw,relatime shared:20 - tmpfs tmpfs rw,size=1024k
41 22 0:36 / /mnt/disks/with\\040space rw - tmpfs tmpfs rw
42 22 8:17 /data /mnt/disks/bind rw master:3 - ext4 /dev/sdb1 rw
43 40 0:37 / /mnt/disks/vol1/nested rw - tmpfs tmpfs rw
44 22 0:38 / /mnt/disks/tab\\011and\\012newline\\134 rw - tmpfs none rw
45 22 0:39 / /mnt/disks/vol10 rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_fields_and_escapes() {
        let t = MountTable::parse(SAMPLE).unwrap();
        assert_eq!(t.len(), 8);
        assert!(t.is_mount_point(Path::new("/mnt/disks/vol1")));
        assert!(t.is_mount_point(Path::new("/mnt/disks/with space")));
        assert!(t.is_mount_point(Path::new("/mnt/disks/tab\tand\nnewline\\")));
        assert!(!t.is_mount_point(Path::new("/mnt/disks")));
        let bind = t.get(Path::new("/mnt/disks/bind")).unwrap();
        assert_eq!(bind.root, PathBuf::from("/data"));
        assert_eq!(bind.fs_type, "ext4");
        assert_eq!(bind.source, "/dev/sdb1");
        assert_eq!(bind.device, "8:17");
        assert_eq!(bind.id, 42);
    }

    #[test]
    fn nested_mounts_are_found_without_siblings() {
        let t = MountTable::parse(SAMPLE).unwrap();
        let below: Vec<_> = t.mounts_below(Path::new("/mnt/disks/vol1")).map(|e| e.mount_point.clone()).collect();
        assert_eq!(below, vec![PathBuf::from("/mnt/disks/vol1/nested")]);
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "garbage",
            "1 2 3:4 / /x rw",
            "x 1 0:1 / /y rw - tmpfs t rw",
            "1 2 0:1 / /y rw - tmpfs t",
            "1 2 0:1 / /y rw - tmpfs",
            "1 2 0:1 / /y rw - tmpfs t size=1k",
            "1 2 0:1 / /y rw - tmpfs t ,rw",
        ] {
            assert!(MountTable::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn super_options_give_read_only_and_shut_down() {
        // (super options, read-only, shut down): the filesystem's state, not this mount's.
        let cases = [
            ("rw", false, false),
            ("ro", true, false),
            ("ro,relatime", true, false),
            ("rw,errors=remount-ro", false, false),
            ("rw,errors=remount-ro,emergency_ro", true, false),
            ("rw,errors=remount-ro,shutdown", false, true),
            ("rw,emergency_ro,shutdown", true, true),
            ("ro,shutdown", true, true),
            ("rw,noemergency_ro,shutdowns,xro", false, false),
        ];
        for (opts, ro, shut) in cases {
            let t = MountTable::parse(&format!("40 22 7:0 / /mnt/v ro,relatime - ext4 /dev/loop0 {opts}\n")).unwrap();
            let e = t.get(Path::new("/mnt/v")).unwrap();
            assert_eq!((e.super_read_only, e.super_shut_down), (ro, shut), "{opts}");
        }
        // A read-only mount of a read-write filesystem (mount options `ro`) is not read-only.
        let bind = MountTable::parse("40 22 7:0 / /mnt/v ro,relatime - ext4 /dev/loop0 rw\n").unwrap();
        assert!(!bind.get(Path::new("/mnt/v")).unwrap().super_read_only);
        let t = MountTable::parse(SAMPLE).unwrap();
        assert!(t.get(Path::new("/mnt/disks/vol1")).is_some_and(|e| !e.super_read_only && !e.super_shut_down));
    }

    #[test]
    fn unescape_leaves_other_backslashes() {
        assert_eq!(unescape_text("a\\040b"), "a b");
        assert_eq!(unescape_text("a\\9"), "a\\9");
        assert_eq!(unescape_text("end\\"), "end\\");
        assert_eq!(unescape_text("\\04"), "\\04");
        assert_eq!(unescape("\\377"), vec![0xff]);
    }
}
