//! What a filesystem wipe leaves on the volume's root directory: the root is kept (it is the
//! mount point), so its own metadata would otherwise pass from one tenant to the next. After the
//! wipe the root is as a new volume's: no attribute and no inode flag a tenant could have set,
//! and the mode and owner a fresh filesystem gives its root.
//!
//! The rule, by who can write a thing:
//! - Extended attributes: kept only where a tenant's pod cannot write them. `trusted.*` needs
//!   CAP_SYS_ADMIN in the host's user namespace (the agent's used mark,
//!   `trusted.local-static-provisioner.used`, is one: the disk's record that it was used, which
//!   only the completed wipe's own step clears, see core::identity::used_mark). `security.*` is the LSM's
//!   (an SELinux or Smack label, IMA/EVM): the kernel refuses it without CAP_SYS_ADMIN except
//!   what the LSM's policy allows, and the container runtime relabels the root for the next pod
//!   anyway; removing it would leave the root unlabelled on an enforcing host. The one exception
//!   is `security.capability`, which a container's root sets with CAP_SETFCAP (in Docker's and
//!   containerd's default set): removed. Everything else is removed, whatever its namespace:
//!   `user.*`, the POSIX ACLs `system.posix_acl_access` and `system.posix_acl_default` (the
//!   owner sets them), and any other `system.*` (an NFSv4 ACL, a name this code does not know).
//! - Inode flags (`chattr`): kept only those the filesystem keeps itself (extents, hashed
//!   directory index, inline data, huge file, EA inode, and the like). An encrypted or verity
//!   root cannot be undone while the root exists (a tenant owning the empty root of a bound
//!   directory can set an encryption policy on it; ext4 refuses one on its own root): refused. Every other flag is cleared, the ones a tenant sets
//!   (nodump, noatime, sync, dirsync, compression, no-COW, DAX, project inheritance, casefold,
//!   top-dir, secure deletion, undeletable, no-tail-merge, data journalling) as well as
//!   immutable and append-only (CAP_LINUX_IMMUTABLE, so normally not a tenant) and any bit not
//!   named here.
//! - Mode and owner: those the root had when the agent first published the volume, before any
//!   tenant (recorded then in [`ROOT_RECORD_XATTR`], a `trusted.` attribute a tenant cannot
//!   write and the wipe keeps: an operator who prepared the root, say 0751 or owned by a
//!   service user, keeps that). A volume published before the record existed (by an older
//!   version or by upstream) gets the record at its first publication after a wipe; until then
//!   its root gets what a fresh filesystem gives it. tmpfs and ramfs make the root from
//!   their mount options (`mode=`, `uid=`, `gid=`; tmpfs defaults to 1777 root:root, ramfs to
//!   0755), every other filesystem that stores them 0755 root:root (mkfs.ext4, mkfs.xfs,
//!   mkfs.btrfs, and `mkdir` under the usual umask for a bound directory). Filesystems that
//!   store no owner or mode per inode (vfat, exFAT, ISO 9660...) show the mount's: left alone,
//!   as a tenant cannot change them either.
//!
//! Pure: the host lists what the root has and executes the plan (host::wipe::wipe_fs).

/// The namespace of the agent's own attributes: never removed by the root's reset.
const TRUSTED: &[u8] = b"trusted.";
/// The LSMs' namespace: kept, but for [`FILE_CAPABILITIES`].
const SECURITY: &[u8] = b"security.";
/// File capabilities: set by a container's root with CAP_SETFCAP, so a tenant's.
const FILE_CAPABILITIES: &[u8] = b"security.capability";

/// Whether the wipe removes the extended attribute `name` from the volume root.
pub fn removes_xattr(name: &[u8]) -> bool {
    let kept = name.starts_with(TRUSTED) || (name.starts_with(SECURITY) && name != FILE_CAPABILITIES);
    !kept
}

/// Inode flags (`FS_*_FL` of linux/fs.h) by value, as FS_IOC_GETFLAGS reports them.
pub mod flags {
    pub const SECRM: u32 = 0x0000_0001;
    pub const UNRM: u32 = 0x0000_0002;
    pub const COMPR: u32 = 0x0000_0004;
    pub const SYNC: u32 = 0x0000_0008;
    pub const IMMUTABLE: u32 = 0x0000_0010;
    pub const APPEND: u32 = 0x0000_0020;
    pub const NODUMP: u32 = 0x0000_0040;
    pub const NOATIME: u32 = 0x0000_0080;
    pub const DIRTY: u32 = 0x0000_0100;
    pub const COMPRBLK: u32 = 0x0000_0200;
    pub const NOCOMP: u32 = 0x0000_0400;
    pub const ENCRYPT: u32 = 0x0000_0800;
    pub const INDEX: u32 = 0x0000_1000;
    pub const IMAGIC: u32 = 0x0000_2000;
    pub const JOURNAL_DATA: u32 = 0x0000_4000;
    pub const NOTAIL: u32 = 0x0000_8000;
    pub const DIRSYNC: u32 = 0x0001_0000;
    pub const TOPDIR: u32 = 0x0002_0000;
    pub const HUGE_FILE: u32 = 0x0004_0000;
    pub const EXTENT: u32 = 0x0008_0000;
    pub const VERITY: u32 = 0x0010_0000;
    pub const EA_INODE: u32 = 0x0020_0000;
    pub const EOFBLOCKS: u32 = 0x0040_0000;
    pub const NOCOW: u32 = 0x0080_0000;
    pub const DAX: u32 = 0x0200_0000;
    pub const INLINE_DATA: u32 = 0x1000_0000;
    pub const PROJINHERIT: u32 = 0x2000_0000;
    pub const CASEFOLD: u32 = 0x4000_0000;
}

/// Flags the filesystem sets and keeps itself (a tenant cannot set or clear them): kept.
pub const FS_MAINTAINED: u32 = flags::DIRTY
    | flags::COMPRBLK
    | flags::INDEX
    | flags::IMAGIC
    | flags::HUGE_FILE
    | flags::EXTENT
    | flags::EA_INODE
    | flags::EOFBLOCKS
    | flags::INLINE_DATA;

/// Flags that cannot be taken off a directory that stays: the root is refused with them.
pub const IRREVERSIBLE: u32 = flags::ENCRYPT | flags::VERITY;

/// What to do with the root's inode flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagsPlan {
    /// Nothing to clear.
    Keep,
    /// Set the flags to this value (the current ones, with the tenant-settable cleared).
    Set(u32),
    /// A flag that cannot be cleared: the root keeps it, so the volume is not offered.
    Refuse { flags: u32 },
}

/// What the wipe does with a root whose flags are `current`.
pub fn plan_flags(current: u32) -> FlagsPlan {
    let stuck = current & IRREVERSIBLE;
    if stuck != 0 {
        return FlagsPlan::Refuse { flags: stuck };
    }
    let wanted = current & FS_MAINTAINED;
    if wanted == current { FlagsPlan::Keep } else { FlagsPlan::Set(wanted) }
}

/// `chattr`'s letters for the flags in `bits` (hex for a bit it has no letter for), for events.
pub fn flag_names(bits: u32) -> String {
    const LETTERS: [(u32, &str); 24] = [
        (flags::SECRM, "s"),
        (flags::UNRM, "u"),
        (flags::COMPR, "c"),
        (flags::SYNC, "S"),
        (flags::IMMUTABLE, "i"),
        (flags::APPEND, "a"),
        (flags::NODUMP, "d"),
        (flags::NOATIME, "A"),
        (flags::NOCOMP, "m"),
        (flags::ENCRYPT, "E"),
        (flags::INDEX, "I"),
        (flags::JOURNAL_DATA, "j"),
        (flags::NOTAIL, "t"),
        (flags::DIRSYNC, "D"),
        (flags::TOPDIR, "T"),
        (flags::HUGE_FILE, "h"),
        (flags::EXTENT, "e"),
        (flags::VERITY, "V"),
        (flags::NOCOW, "C"),
        (flags::DAX, "x"),
        (flags::INLINE_DATA, "N"),
        (flags::PROJINHERIT, "P"),
        (flags::CASEFOLD, "F"),
        (flags::EA_INODE, "EA_INODE"),
    ];
    let mut named = 0;
    let mut out = Vec::new();
    for (bit, letter) in LETTERS {
        if bits & bit != 0 {
            named |= bit;
            out.push(letter.to_string());
        }
    }
    let rest = bits & !named;
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    out.join(",")
}

/// Mode (permission bits, set-id and sticky) and owner of a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootOwnership {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The extended attribute recording the root's mode and owner as first published.
pub const ROOT_RECORD_XATTR: &str = "trusted.local-static-provisioner.root";

impl RootOwnership {
    /// The value of [`ROOT_RECORD_XATTR`]: `mode=0751 uid=0 gid=0`.
    pub fn to_record(self) -> String {
        format!("mode={:04o} uid={} gid={}", self.mode & 0o7777, self.uid, self.gid)
    }

    /// Reads a [`Self::to_record`] value; None for anything else.
    pub fn from_record(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(' ');
        let mut field = |key: &str| fields.next()?.strip_prefix(key)?.strip_prefix('=');
        let mode = u32::from_str_radix(field("mode")?, 8).ok().filter(|m| *m <= 0o7777)?;
        let uid = field("uid")?.parse().ok()?;
        let gid = field("gid")?.parse().ok()?;
        if fields.next().is_some() || uid == u32::MAX || gid == u32::MAX {
            return None;
        }
        Some(RootOwnership { mode, uid, gid })
    }
}

/// The mode and owner a class's configuration gives every root it wipes (`rootMode`,
/// `rootOwner`): each, when set, wins over the record and a fresh filesystem's. For operators
/// whose workloads need a root other than mkfs's (0777 for pods running as any user, a service
/// user's directory) on volumes published before the record existed, by upstream say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfiguredRoot {
    /// Permission bits, set-id and sticky (at most 0o7777).
    pub mode: Option<u32>,
    /// Owner and group, numeric.
    pub owner: Option<(u32, u32)>,
}

impl ConfiguredRoot {
    /// Reads `rootMode`: an octal string (`"0775"`, `"775"`, `"1777"`), at most 0o7777.
    pub fn parse_mode(text: &str) -> Result<u32, String> {
        let digits = text.strip_prefix("0o").unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(format!("{text:?} is not an octal mode (write it quoted, e.g. \"0775\")"));
        }
        match u32::from_str_radix(digits, 8) {
            Ok(m) if m <= 0o7777 => Ok(m),
            _ => Err(format!("{text:?} is more than a mode holds (at most 7777)")),
        }
    }

    /// Reads `rootOwner`: `UID:GID`, numeric (a name means another user on another host).
    pub fn parse_owner(text: &str) -> Result<(u32, u32), String> {
        let bad = || format!("{text:?} is not UID:GID (numeric, e.g. \"1000:1000\")");
        let (u, g) = text.split_once(':').ok_or_else(bad)?;
        let id = |s: &str| s.parse::<u32>().ok().filter(|v| *v != u32::MAX && !s.starts_with('+'));
        Ok((id(u).ok_or_else(bad)?, id(g).ok_or_else(bad)?))
    }
}

/// The mode and owner the wipe gives the root: the configured ones, else the recorded ones,
/// else a fresh filesystem's, each of mode and owner on its own; nothing where the filesystem
/// stores none (`fresh` None), whatever a record or the configuration says.
pub fn target_ownership(
    configured: ConfiguredRoot,
    recorded: Option<RootOwnership>,
    fresh: Option<RootOwnership>,
) -> Option<RootOwnership> {
    let fresh = fresh?;
    let base = recorded.unwrap_or(fresh);
    let (uid, gid) = configured.owner.unwrap_or((base.uid, base.gid));
    Some(RootOwnership { mode: configured.mode.unwrap_or(base.mode) & 0o7777, uid, gid })
}

/// What a new filesystem's mkfs makes, and `mkdir` under umask 022.
const MKFS_ROOT: RootOwnership = RootOwnership { mode: 0o755, uid: 0, gid: 0 };

/// Filesystems whose inodes carry no owner or mode of their own (the mount's options give all).
const NO_UNIX_OWNERSHIP: &[&str] = &["vfat", "msdos", "exfat", "iso9660", "udf", "ntfs", "hfs", "hfsplus"];

/// The mode and owner a fresh filesystem of type `fs_type` mounted with `super_options` (the
/// last field of its mountinfo line) gives its root; None where the filesystem stores none per
/// inode (the root shows the mount's, which a tenant cannot change).
pub fn fresh_root(fs_type: &str, super_options: &str) -> Option<RootOwnership> {
    let base = fs_type.split('.').next().unwrap_or(fs_type);
    if NO_UNIX_OWNERSHIP.contains(&base) {
        return None;
    }
    let from_options = |default_mode: u32| {
        let mut root = RootOwnership { mode: default_mode, uid: 0, gid: 0 };
        for option in super_options.split(',') {
            match option.split_once('=') {
                Some(("mode", v)) => {
                    if let Ok(m) = u32::from_str_radix(v, 8) {
                        root.mode = m & 0o7777;
                    }
                }
                Some(("uid", v)) => root.uid = v.parse().unwrap_or(root.uid),
                Some(("gid", v)) => root.gid = v.parse().unwrap_or(root.gid),
                _ => {}
            }
        }
        root
    };
    Some(match base {
        "tmpfs" => from_options(0o1777),
        "ramfs" => from_options(0o755),
        _ => MKFS_ROOT,
    })
}

/// What the host does to a root whose mode and owner are `current`, to make them `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnershipPlan {
    /// New owner and group (changed first: chown clears set-id bits).
    pub chown: Option<(u32, u32)>,
    /// New mode (after the chown).
    pub chmod: Option<u32>,
}

/// The steps from `current` to `target` (None: the filesystem stores none, nothing to do).
pub fn plan_ownership(current: RootOwnership, target: Option<RootOwnership>) -> OwnershipPlan {
    let Some(target) = target else { return OwnershipPlan::default() };
    let chown = ((current.uid, current.gid) != (target.uid, target.gid)).then_some((target.uid, target.gid));
    // A chown clears the set-id bits, so the mode is set again after one.
    let chmod = (chown.is_some() || current.mode & 0o7777 != target.mode & 0o7777).then_some(target.mode & 0o7777);
    OwnershipPlan { chown, chmod }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattrs_a_tenant_can_write_are_removed_the_hosts_kept() {
        let cases: &[(&[u8], bool)] = &[
            (b"user.tenant", true),
            (b"user.", true),
            (b"system.posix_acl_access", true),
            (b"system.posix_acl_default", true),
            (b"system.nfs4_acl", true),
            (b"system.richacl", true),
            (b"security.capability", true),
            (b"weird.namespace", true),
            (b"", true),
            (b"user.trusted.local-static-provisioner.used", true),
            (b"trustedx", true),
            (b"securityx.selinux", true),
            (b"security.capabilityx", false),
            (b"trusted.local-static-provisioner.used", false),
            (b"trusted.overlay.opaque", false),
            (b"trusted.", false),
            (b"security.selinux", false),
            (b"security.SMACK64", false),
            (b"security.ima", false),
            (b"security.evm", false),
        ];
        for (name, removed) in cases {
            assert_eq!(removes_xattr(name), *removed, "{}", String::from_utf8_lossy(name));
        }
        // The agent's own mark is never among the removed.
        assert!(!removes_xattr(crate::core::identity::used_mark::XATTR_NAME.as_bytes()));
    }

    #[test]
    fn every_flag_is_kept_cleared_or_refused_exactly_once() {
        // Each single bit: kept when the filesystem keeps it, refused when irreversible,
        // otherwise cleared; no bit is in two classes.
        assert_eq!(FS_MAINTAINED & IRREVERSIBLE, 0);
        for shift in 0..32 {
            let bit = 1u32 << shift;
            let want = if bit & IRREVERSIBLE != 0 {
                FlagsPlan::Refuse { flags: bit }
            } else if bit & FS_MAINTAINED != 0 {
                FlagsPlan::Keep
            } else {
                FlagsPlan::Set(0)
            };
            assert_eq!(plan_flags(bit), want, "bit {bit:#x} ({})", flag_names(bit));
        }
    }

    #[test]
    fn flags_a_tenant_sets_are_cleared_the_filesystems_kept() {
        use flags::*;
        let cases = [
            (0, FlagsPlan::Keep),
            (EXTENT, FlagsPlan::Keep),
            (EXTENT | INDEX, FlagsPlan::Keep),
            (EXTENT | NODUMP | NOATIME, FlagsPlan::Set(EXTENT)),
            (NODUMP, FlagsPlan::Set(0)),
            (IMMUTABLE | APPEND | EXTENT, FlagsPlan::Set(EXTENT)),
            (CASEFOLD | PROJINHERIT | DAX | NOCOW | SYNC | DIRSYNC | TOPDIR | EXTENT, FlagsPlan::Set(EXTENT)),
            (JOURNAL_DATA | INLINE_DATA, FlagsPlan::Set(INLINE_DATA)),
            (0x8000_0000 | EXTENT, FlagsPlan::Set(EXTENT)),
            (ENCRYPT | EXTENT | NODUMP, FlagsPlan::Refuse { flags: ENCRYPT }),
            (VERITY | ENCRYPT, FlagsPlan::Refuse { flags: VERITY | ENCRYPT }),
        ];
        for (current, want) in cases {
            assert_eq!(plan_flags(current), want, "{}", flag_names(current));
        }
        // Whatever the flags, a plan never sets a bit that is not set now.
        for current in [u32::MAX, 0x1234_5678, 0xdead_beef & !IRREVERSIBLE, FS_MAINTAINED | NODUMP] {
            if let FlagsPlan::Set(v) = plan_flags(current) {
                assert_eq!(v & !current, 0);
                assert_eq!(v, current & FS_MAINTAINED);
            }
        }
    }

    #[test]
    fn flag_names_are_chattrs_letters() {
        use flags::*;
        assert_eq!(flag_names(NODUMP | NOATIME), "d,A");
        assert_eq!(flag_names(ENCRYPT), "E");
        assert_eq!(flag_names(0x8000_0000 | IMMUTABLE), "i,0x80000000");
        assert_eq!(flag_names(0), "");
    }

    #[test]
    fn a_fresh_root_by_filesystem_and_mount_options() {
        let r = |mode, uid, gid| Some(RootOwnership { mode, uid, gid });
        let cases = [
            ("ext4", "rw,relatime", r(0o755, 0, 0)),
            ("xfs", "rw,attr2,inode64", r(0o755, 0, 0)),
            ("btrfs", "rw,ssd", r(0o755, 0, 0)),
            // A mode= on ext4 is no ext4 option: only tmpfs and ramfs take their root from it.
            ("ext4", "rw,mode=777,uid=5", r(0o755, 0, 0)),
            ("tmpfs", "rw,size=16384k,inode64", r(0o1777, 0, 0)),
            ("tmpfs", "rw,size=16384k,mode=755,inode64", r(0o755, 0, 0)),
            ("tmpfs", "rw,mode=700,uid=1000,gid=2000", r(0o700, 1000, 2000)),
            ("tmpfs", "rw,mode=4755", r(0o4755, 0, 0)),
            ("tmpfs", "rw,mode=zz,uid=x", r(0o1777, 0, 0)),
            ("ramfs", "rw", r(0o755, 0, 0)),
            ("ramfs", "rw,mode=750", r(0o750, 0, 0)),
            ("fuse.sshfs", "rw", r(0o755, 0, 0)),
            ("vfat", "rw,uid=1000,fmask=0022", None),
            ("exfat", "rw", None),
            ("iso9660", "ro", None),
        ];
        for (fs, options, want) in cases {
            assert_eq!(fresh_root(fs, options), want, "{fs} {options}");
        }
    }

    #[test]
    fn the_first_published_root_is_recorded_and_read_back_exactly() {
        let o = |mode, uid, gid| RootOwnership { mode, uid, gid };
        for root in [o(0o751, 0, 0), o(0o2770, 1000, 2000), o(0o1777, 0, 0), o(0, 7, 8)] {
            assert_eq!(RootOwnership::from_record(root.to_record().as_bytes()), Some(root));
        }
        // The file type bits are not part of it.
        assert_eq!(o(0o40755, 1, 2).to_record(), "mode=0755 uid=1 gid=2");
        for bad in [
            "",
            "mode=0755",
            "mode=0755 uid=0",
            "mode=0755 uid=0 gid=0 extra",
            "mode=0855 uid=0 gid=0",
            "mode=17777 uid=0 gid=0",
            "uid=0 mode=0755 gid=0",
            "mode=0755 uid=-1 gid=0",
            "mode=0755 uid=4294967295 gid=0",
            "mode=0755  uid=0 gid=0",
            "{\"mode\":493}",
        ] {
            assert_eq!(RootOwnership::from_record(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(RootOwnership::from_record(b"\xff"), None);
    }

    #[test]
    fn the_target_is_the_configuration_else_the_record_else_a_fresh_root_and_nothing_without_ownership() {
        let o = |mode, uid, gid| RootOwnership { mode, uid, gid };
        let (rec, fresh) = (o(0o751, 5, 6), o(0o755, 0, 0));
        let none = ConfiguredRoot::default();
        assert_eq!(target_ownership(none, Some(rec), Some(fresh)), Some(rec));
        assert_eq!(target_ownership(none, None, Some(fresh)), Some(fresh));
        assert_eq!(target_ownership(none, Some(rec), None), None);
        assert_eq!(target_ownership(none, None, None), None);
        // Every combination of a configured mode and owner over a record or none.
        for mode in [None, Some(0o777), Some(0o1770)] {
            for owner in [None, Some((1000, 2000))] {
                let configured = ConfiguredRoot { mode, owner };
                for recorded in [None, Some(rec)] {
                    let base = recorded.unwrap_or(fresh);
                    let want =
                        o(mode.unwrap_or(base.mode), owner.map_or(base.uid, |o| o.0), owner.map_or(base.gid, |o| o.1));
                    assert_eq!(
                        target_ownership(configured, recorded, Some(fresh)),
                        Some(want),
                        "{configured:?} {recorded:?}"
                    );
                    // A filesystem without ownership of its own: nothing, whatever is configured.
                    assert_eq!(target_ownership(configured, recorded, None), None);
                }
            }
        }
    }

    #[test]
    fn configured_modes_and_owners_are_read_strictly() {
        for (text, want) in
            [("0775", Ok(0o775)), ("775", Ok(0o775)), ("1777", Ok(0o1777)), ("0o700", Ok(0o700)), ("0", Ok(0))]
        {
            assert_eq!(ConfiguredRoot::parse_mode(text), want, "{text}");
        }
        for bad in ["", "0o", "775a", "0x1ff", "-755", "8", "17777", "rwxr-xr-x", " 755"] {
            let e = ConfiguredRoot::parse_mode(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert_eq!(ConfiguredRoot::parse_owner("1000:2000"), Ok((1000, 2000)));
        assert_eq!(ConfiguredRoot::parse_owner("0:0"), Ok((0, 0)));
        for bad in ["", "1000", "root:root", "1000:", ":1000", "-1:0", "+1:0", "4294967295:0", "1:2:3", "1000 :1000"] {
            let e = ConfiguredRoot::parse_owner(bad).unwrap_err();
            assert!(e.contains("UID:GID"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_record_is_an_attribute_the_wipe_keeps() {
        assert!(!removes_xattr(ROOT_RECORD_XATTR.as_bytes()));
    }

    #[test]
    fn ownership_is_changed_only_where_it_differs_and_the_mode_after_a_chown() {
        let o = |mode, uid, gid| RootOwnership { mode, uid, gid };
        let fresh = Some(o(0o755, 0, 0));
        let cases = [
            (o(0o40755, 0, 0), fresh, OwnershipPlan { chown: None, chmod: None }),
            (o(0o40777, 0, 0), fresh, OwnershipPlan { chown: None, chmod: Some(0o755) }),
            (o(0o42775, 0, 2000), fresh, OwnershipPlan { chown: Some((0, 0)), chmod: Some(0o755) }),
            (o(0o40755, 1000, 0), fresh, OwnershipPlan { chown: Some((0, 0)), chmod: Some(0o755) }),
            (o(0o41777, 0, 0), Some(o(0o1777, 0, 0)), OwnershipPlan { chown: None, chmod: None }),
            (o(0o40777, 1000, 1000), None, OwnershipPlan { chown: None, chmod: None }),
        ];
        for (current, target, want) in cases {
            assert_eq!(plan_ownership(current, target), want, "{current:?} -> {target:?}");
        }
    }
}
