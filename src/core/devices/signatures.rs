//! On-disk signatures: where partition tables, filesystems, RAID, LVM, LUKS and the like keep
//! their magic numbers, and what a device holds judging by the bytes read there.
//!
//! The same list of byte ranges serves two purposes that must agree: the built-in quick wipe
//! zeroes exactly [`signature_areas`], and a device is only claimed when those very ranges read
//! all zero ([`recognise`] says [`Content::Blank`]). So a device our wipe left is claimable again,
//! and a device holding anything we know of is not.
//!
//! Offsets follow util-linux's libblkid (libblkid/src/partitions/*.c, superblocks/*.c), which
//! is what `blkid`, `wipefs`, udev and mkfs's "contains a ... signature" warnings use. Pure:
//! the caller reads the areas.

use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Length of each small area (btrfs mirrors, LUKS2 secondary headers, ext backups): a whole
/// superblock or header of any of them fits.
const SMALL_AREA: u64 = 64 * KIB;

/// Byte ranges `(offset, len)` holding on-disk signatures of a device of `size` bytes,
/// sorted, merged and clipped to the device:
/// - the first and last MiB: MBR, GPT primary and backup, ZFS labels, md 0.90/1.x, LVM,
///   and the primary superblocks of xfs, btrfs, ext2/3/4 and most others;
/// - LUKS2 secondary header candidates beyond the first MiB (1, 2 and 4 MiB);
/// - ext2/3/4 backup superblocks (sparse_super: groups 1 and powers of 3, 5, 7) for block
///   sizes 1024, 2048 and 4096;
/// - btrfs mirror superblocks at 64 MiB, 256 GiB and 1 PiB.
pub fn signature_areas(size: u64) -> Vec<(u64, u64)> {
    let mut areas = vec![(0, MIB), (size.saturating_sub(MIB), MIB)];
    for at in [MIB, 2 * MIB, 4 * MIB, 64 * MIB, 256 * GIB, 1024 * 1024 * GIB] {
        areas.push((at, SMALL_AREA));
    }
    for (offset, _) in ext_backup_superblocks(size) {
        areas.push((offset, SMALL_AREA));
    }
    let mut clipped: Vec<(u64, u64)> = areas
        .into_iter()
        .filter(|&(offset, _)| offset < size)
        .map(|(offset, len)| (offset, len.min(size - offset)))
        .collect();
    clipped.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(clipped.len());
    for (offset, len) in clipped {
        match merged.last_mut() {
            Some((last_off, last_len)) if offset <= *last_off + *last_len => {
                *last_len = (*last_len).max(offset + len - *last_off);
            }
            _ => merged.push((offset, len)),
        }
    }
    merged
}

/// Where ext2/3/4 keeps backup superblocks on a device of `size` bytes, as `(offset, block
/// size)`, for the default layout (8 * block size blocks per group) of block sizes 1024, 2048
/// and 4096: group g starts at block `g * 8192 + 1` with 1 KiB blocks (block 0 is the boot
/// block) and at block `g * 8 * bs` otherwise.
fn ext_backup_superblocks(size: u64) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    for bs in [1024u64, 2048, 4096] {
        for group in ext_backup_groups() {
            let offset = if bs == 1024 {
                group.checked_mul(8192).and_then(|b| b.checked_add(1)).and_then(|b| b.checked_mul(1024))
            } else {
                group.checked_mul(8 * bs * bs)
            };
            match offset {
                Some(o) if o < size => found.push((o, bs)),
                _ => {}
            }
        }
    }
    found
}

/// Block groups carrying an ext backup superblock with sparse_super: 1 and the powers of 3, 5
/// and 7, up to a bound far beyond any device (the caller drops offsets past the end).
fn ext_backup_groups() -> Vec<u64> {
    const LIMIT: u64 = 1 << 40;
    let mut groups = vec![1];
    for base in [3u64, 5, 7] {
        let mut g = base;
        while g < LIMIT {
            groups.push(g);
            g *= base;
        }
    }
    groups
}

/// A recognised on-disk structure and where its magic was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Signature {
    /// What it is, e.g. "ext4 superblock", "gpt backup header", "LVM2 label".
    pub kind: &'static str,
    /// Byte offset of its magic on the device.
    pub offset: u64,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.kind, self.offset)
    }
}

/// What the signature areas of a device hold: the verdict that decides whether a device may
/// be claimed (only `Blank`) and, if not, what to tell the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Every byte of every area is zero: what our wipes and `blkdiscard -z` leave.
    Blank,
    /// At least one known signature, sorted by offset.
    Signatures(Vec<Signature>),
    /// Non-zero bytes but no signature we know; `offset` is the first non-zero byte.
    Data {
        /// Byte offset on the device of the first non-zero byte.
        offset: u64,
    },
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Blank => write!(f, "blank"),
            Content::Signatures(found) => {
                for (i, signature) in found.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{signature}")?;
                }
                Ok(())
            }
            Content::Data { offset } => {
                write!(f, "non-zero data at offset {offset} with no signature this agent recognises")
            }
        }
    }
}

/// Where a magic sits on a device of a given size.
#[derive(Debug, Clone, Copy)]
enum At {
    /// At this byte offset from the start.
    Start(u64),
    /// `back` bytes before the device's size rounded down to a multiple of `align` (a power of
    /// two), then `plus` bytes in: structures kept at the end of the device.
    End { align: u64, back: u64, plus: u64 },
}

impl At {
    fn offset(self, size: u64) -> Option<u64> {
        match self {
            At::Start(offset) => Some(offset),
            At::End { align, back, plus } => (size & !(align - 1)).checked_sub(back)?.checked_add(plus),
        }
    }
}

/// A fixed magic: `magic` at each offset of `at` means `kind`.
struct Rule {
    kind: &'static str,
    at: &'static [At],
    magic: &'static [u8],
}

/// The end of the device, for [`Rule`]s.
const fn end(align: u64, back: u64) -> At {
    At::End { align, back, plus: 0 }
}

/// Where a swap area's signature sits: the last 10 bytes of its first page, for page sizes
/// 4K, 8K, 16K and 64K (libblkid swap.c).
const SWAP_PAGES: &[At] =
    &[At::Start(4 * KIB - 10), At::Start(8 * KIB - 10), At::Start(16 * KIB - 10), At::Start(64 * KIB - 10)];

/// LUKS2 secondary header candidates: the binary header is duplicated after the primary
/// header's JSON area, whose size is one of these (LUKS2 on-disk format, libblkid luks.c).
const LUKS2_SECONDARY: &[At] = &[
    At::Start(16 * KIB),
    At::Start(32 * KIB),
    At::Start(64 * KIB),
    At::Start(128 * KIB),
    At::Start(256 * KIB),
    At::Start(512 * KIB),
    At::Start(MIB),
    At::Start(2 * MIB),
    At::Start(4 * MIB),
];

/// Magic numbers at fixed places (relative to the start or the end of the device). The
/// structures that need more than a fixed magic (dos, ext, LVM2, ZFS) are in [`recognise`].
const RULES: &[Rule] = &[
    // GPT header at LBA 1 ("EFI PART"), for 512 and 4096 byte logical sectors; its backup
    // is at the last LBA (UEFI spec 5.3; libblkid gpt.c).
    Rule { kind: "gpt header", at: &[At::Start(512), At::Start(4096)], magic: b"EFI PART" },
    Rule { kind: "gpt backup header", at: &[end(512, 512), end(4096, 4096)], magic: b"EFI PART" },
    // xfs: superblock at 0 (xfs_sb.sb_magicnum, libblkid xfs.c).
    Rule { kind: "xfs superblock", at: &[At::Start(0)], magic: b"XFSB" },
    // btrfs: superblock at 64 KiB, mirrors at 64 MiB, 256 GiB and 1 PiB; magic at +0x40
    // (btrfs_super_block.magic; libblkid btrfs.c checks the primary).
    Rule { kind: "btrfs superblock", at: &[At::Start(64 * KIB + 0x40)], magic: b"_BHRfS_M" },
    Rule {
        kind: "btrfs mirror superblock",
        at: &[At::Start(64 * MIB + 0x40), At::Start(256 * GIB + 0x40), At::Start(1024 * 1024 * GIB + 0x40)],
        magic: b"_BHRfS_M",
    },
    // md RAID (Linux md superblocks, libblkid md_raid.c; kernel drivers/md/md.c). The magic
    // 0xa92b4efc, then major_version: 1.x is little endian with major_version 1, at 0 (1.1),
    // 4 KiB (1.2), or 8 KiB before the end rounded down to 4 KiB (1.0).
    Rule { kind: "md superblock 1.1", at: &[At::Start(0)], magic: b"\xfc\x4e\x2b\xa9\x01\x00\x00\x00" },
    Rule { kind: "md superblock 1.2", at: &[At::Start(4 * KIB)], magic: b"\xfc\x4e\x2b\xa9\x01\x00\x00\x00" },
    Rule { kind: "md superblock 1.0", at: &[end(4 * KIB, 8 * KIB)], magic: b"\xfc\x4e\x2b\xa9\x01\x00\x00\x00" },
    // 0.90: in the last 64 KiB-aligned 64 KiB block, in host byte order; major 0, minor 90.
    Rule {
        kind: "md superblock 0.90",
        at: &[end(64 * KIB, 64 * KIB)],
        magic: b"\xfc\x4e\x2b\xa9\x00\x00\x00\x00\x5a\x00\x00\x00",
    },
    Rule {
        kind: "md superblock 0.90",
        at: &[end(64 * KIB, 64 * KIB)],
        magic: b"\xa9\x2b\x4e\xfc\x00\x00\x00\x00\x00\x00\x00\x5a",
    },
    // LUKS: "LUKS\xba\xbe" then the version (big endian u16) at 0; LUKS2 keeps a second
    // binary header, magic "SKUL\xba\xbe" (LUKS2 on-disk format; libblkid luks.c).
    Rule { kind: "LUKS1 header", at: &[At::Start(0)], magic: b"LUKS\xba\xbe\x00\x01" },
    Rule { kind: "LUKS2 header", at: &[At::Start(0)], magic: b"LUKS\xba\xbe\x00\x02" },
    Rule { kind: "LUKS2 secondary header", at: LUKS2_SECONDARY, magic: b"SKUL\xba\xbe\x00\x02" },
    // Swap (mkswap's v1 and the old v0), and a swap area holding a hibernation image.
    Rule { kind: "swap signature", at: SWAP_PAGES, magic: b"SWAPSPACE2" },
    Rule { kind: "swap signature", at: SWAP_PAGES, magic: b"SWAP-SPACE" },
    Rule { kind: "swsuspend signature", at: SWAP_PAGES, magic: b"S1SUSPEND" },
    Rule { kind: "swsuspend signature", at: SWAP_PAGES, magic: b"S2SUSPEND" },
    Rule { kind: "swsuspend signature", at: SWAP_PAGES, magic: b"ULSUSPEND" },
    Rule { kind: "swsuspend signature", at: SWAP_PAGES, magic: b"LINHIB0001" },
    // FAT boot sector: the file system type string of the BIOS parameter block, at 0x36 for
    // FAT12/16 and 0x52 for FAT32; FAT32 keeps a backup boot sector in sector 6 (libblkid
    // vfat.c; Microsoft FAT specification).
    Rule { kind: "vfat boot sector", at: &[At::Start(0x36)], magic: b"FAT12   " },
    Rule { kind: "vfat boot sector", at: &[At::Start(0x36)], magic: b"FAT16   " },
    Rule { kind: "vfat boot sector", at: &[At::Start(0x52)], magic: b"FAT32   " },
    Rule { kind: "vfat backup boot sector", at: &[At::Start(6 * 512 + 0x52)], magic: b"FAT32   " },
    // NTFS: OEM id at 3 of the boot sector; mkntfs puts a backup in the device's last sector.
    Rule { kind: "NTFS boot sector", at: &[At::Start(3)], magic: b"NTFS    " },
    Rule { kind: "NTFS backup boot sector", at: &[At::End { align: 512, back: 512, plus: 3 }], magic: b"NTFS    " },
    // iso9660: the first volume descriptor at 32 KiB, "CD001" after its type byte.
    Rule { kind: "iso9660 volume descriptor", at: &[At::Start(32 * KIB + 1)], magic: b"CD001" },
    // bcache: superblock at 4 KiB, 16-byte magic after csum, offset and version (libblkid
    // bcache.c).
    Rule {
        kind: "bcache superblock",
        at: &[At::Start(4 * KIB + 24)],
        magic: b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81",
    },
    // Ceph BlueStore: the label at 0 starts with this text (libblkid ceph.c).
    Rule { kind: "ceph bluestore label", at: &[At::Start(0)], magic: b"bluestore block device" },
    // squashfs: "hsqs" (little endian) or "sqsh" (big endian, squashfs 3) at 0.
    Rule { kind: "squashfs superblock", at: &[At::Start(0)], magic: b"hsqs" },
    Rule { kind: "squashfs superblock", at: &[At::Start(0)], magic: b"sqsh" },
    // f2fs: magic 0xF2F52010 (little endian) at 1 KiB in each of its two 4 KiB superblock
    // blocks (libblkid f2fs.c; f2fs_fs.h F2FS_SUPER_OFFSET).
    Rule { kind: "f2fs superblock", at: &[At::Start(KIB)], magic: b"\x10\x20\xf5\xf2" },
    Rule { kind: "f2fs backup superblock", at: &[At::Start(4 * KIB + KIB)], magic: b"\x10\x20\xf5\xf2" },
];

/// The areas read from a device, by device offset.
struct Areas<'a> {
    areas: &'a [(u64, &'a [u8])],
}

impl Areas<'_> {
    /// The `len` bytes at device offset `offset`, when one area holds them whole.
    fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        self.areas.iter().find_map(|&(start, bytes)| {
            let from = usize::try_from(offset.checked_sub(start)?).ok()?;
            bytes.get(from..from.checked_add(len)?)
        })
    }

    fn has(&self, offset: u64, magic: &[u8]) -> bool {
        self.get(offset, magic.len()) == Some(magic)
    }

    fn le16(&self, offset: u64) -> Option<u16> {
        let b = self.get(offset, 2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    fn le32(&self, offset: u64) -> Option<u32> {
        let b = self.get(offset, 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// What a device of `size` bytes holds, judging by `areas`: `(offset, bytes read there)` for
/// the ranges of [`signature_areas`]`(size)` (any ranges work; a structure is only recognised
/// when one area holds all the bytes it needs, so a short read or a magic running past the
/// end of an area is simply not recognised).
pub fn recognise(size: u64, areas: &[(u64, &[u8])]) -> Content {
    let Some(first_non_zero) = areas
        .iter()
        .filter_map(|&(start, bytes)| {
            let at = bytes.iter().position(|&b| b != 0)?;
            start.checked_add(u64::try_from(at).ok()?)
        })
        .min()
    else {
        return Content::Blank;
    };
    let areas = Areas { areas };
    let mut found = Vec::new();
    for rule in RULES {
        for at in rule.at {
            if let Some(offset) = at.offset(size)
                && areas.has(offset, rule.magic)
            {
                found.push(Signature { kind: rule.kind, offset });
            }
        }
    }
    found.extend(dos_table(&areas, &found));
    found.extend(ext_superblocks(size, &areas));
    found.extend(lvm2_label(&areas));
    found.extend(zfs_uberblocks(size, &areas));
    found.sort_by_key(|s| s.offset);
    found.dedup();
    if found.is_empty() { Content::Data { offset: first_non_zero } } else { Content::Signatures(found) }
}

/// A DOS (MBR) partition table: 0x55AA at 510 and four 16-byte entries at 446 whose boot
/// flags are 0x00 or 0x80 with at least one partition (non-zero type and sector count). A
/// FAT or NTFS boot sector also ends in 0x55AA, so sector 0 is not read as a partition table
/// when one of those was recognised there (libblkid dos.c does the same). An entry of type
/// 0xEE makes it the protective MBR in front of a GPT.
fn dos_table(areas: &Areas<'_>, found: &[Signature]) -> Option<Signature> {
    const ENTRIES: u64 = 446;
    const ENTRY_LEN: usize = 16;
    const MAGIC_AT: u64 = 510;
    if !areas.has(MAGIC_AT, b"\x55\xaa") {
        return None;
    }
    let boot_sector = |s: &Signature| s.offset < 512 && matches!(s.kind, "vfat boot sector" | "NTFS boot sector");
    if found.iter().any(boot_sector) {
        return None;
    }
    let table = areas.get(ENTRIES, 4 * ENTRY_LEN)?;
    let entries: Vec<&[u8]> = table.chunks_exact(ENTRY_LEN).collect();
    // Each entry: boot flag at 0, type at 4, sector count (little endian u32) at 12.
    if entries.iter().any(|e| e[0] != 0x00 && e[0] != 0x80) {
        return None;
    }
    let used = |e: &&&[u8]| e[4] != 0 && e[12..16].iter().any(|&b| b != 0);
    let kind = match entries.iter().filter(used).map(|e| e[4]).collect::<Vec<_>>() {
        types if types.contains(&0xee) => "protective MBR",
        types if !types.is_empty() => "dos partition table",
        _ => return None,
    };
    Some(Signature { kind, offset: MAGIC_AT })
}

/// ext2/3/4 superblocks: the primary at 1 KiB and the backups of [`ext_backup_superblocks`]
/// (a backup only counts when its block size is the one its place implies). Magic 0xEF53 at
/// 0x38; which of ext2, ext3, ext4 (or an external journal, jbd) follows libblkid ext.c from
/// the feature flags at 0x5C (compat), 0x60 (incompat) and 0x64 (ro_compat).
fn ext_superblocks(size: u64, areas: &Areas<'_>) -> Vec<Signature> {
    const MAGIC: u16 = 0xEF53;
    let mut found = Vec::new();
    let primary = std::iter::once((KIB, None));
    let backups = ext_backup_superblocks(size).into_iter().map(|(offset, bs)| (offset, Some(bs)));
    for (sb, block_size) in primary.chain(backups) {
        let Some(magic_at) = sb.checked_add(0x38) else { continue };
        if areas.le16(magic_at) != Some(MAGIC) {
            continue;
        }
        let field = |at: u64| sb.checked_add(at).and_then(|o| areas.le32(o));
        let (Some(log_block_size), Some(compat), Some(incompat), Some(ro_compat)) =
            (field(0x18), field(0x5C), field(0x60), field(0x64))
        else {
            continue;
        };
        if let Some(bs) = block_size
            && 1024u64.checked_shl(log_block_size) != Some(bs)
        {
            continue;
        }
        let flavour = ext_flavour(compat, incompat, ro_compat);
        let kind = match (flavour, block_size.is_some()) {
            (ExtFlavour::Jbd, false) => "jbd superblock",
            (ExtFlavour::Jbd, true) => "jbd backup superblock",
            (ExtFlavour::Ext2, false) => "ext2 superblock",
            (ExtFlavour::Ext2, true) => "ext2 backup superblock",
            (ExtFlavour::Ext3, false) => "ext3 superblock",
            (ExtFlavour::Ext3, true) => "ext3 backup superblock",
            (ExtFlavour::Ext4, false) => "ext4 superblock",
            (ExtFlavour::Ext4, true) => "ext4 backup superblock",
        };
        found.push(Signature { kind, offset: magic_at });
    }
    found
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExtFlavour {
    Jbd,
    Ext2,
    Ext3,
    Ext4,
}

/// libblkid's rule: an external journal has INCOMPAT_JOURNAL_DEV; ext2 and ext3 use only the
/// features they know (ext3 adds the journal and needs_recovery); anything more is ext4.
fn ext_flavour(compat: u32, incompat: u32, ro_compat: u32) -> ExtFlavour {
    const COMPAT_HAS_JOURNAL: u32 = 0x0004;
    const INCOMPAT_FILETYPE: u32 = 0x0002;
    const INCOMPAT_RECOVER: u32 = 0x0004;
    const INCOMPAT_JOURNAL_DEV: u32 = 0x0008;
    const INCOMPAT_META_BG: u32 = 0x0010;
    // sparse_super, large_file, btree_dir.
    const RO_COMPAT_EXT2_EXT3: u32 = 0x0001 | 0x0002 | 0x0004;
    let old_ro_compat = ro_compat & !RO_COMPAT_EXT2_EXT3 == 0;
    if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        ExtFlavour::Jbd
    } else if compat & COMPAT_HAS_JOURNAL == 0
        && old_ro_compat
        && incompat & !(INCOMPAT_FILETYPE | INCOMPAT_META_BG) == 0
    {
        ExtFlavour::Ext2
    } else if compat & COMPAT_HAS_JOURNAL != 0
        && old_ro_compat
        && incompat & !(INCOMPAT_FILETYPE | INCOMPAT_RECOVER | INCOMPAT_META_BG) == 0
    {
        ExtFlavour::Ext3
    } else {
        ExtFlavour::Ext4
    }
}

/// An LVM2 physical volume label: in one of the first four 512-byte sectors, "LABELONE" at
/// its start and the type "LVM2 001" at +24 (LVM2 label_header; libblkid lvm.c).
fn lvm2_label(areas: &Areas<'_>) -> Option<Signature> {
    (0..4u64)
        .map(|sector| sector * 512)
        .find(|&at| areas.has(at, b"LABELONE") && areas.has(at + 24, b"LVM2 001"))
        .map(|offset| Signature { kind: "LVM2 label", offset })
}

/// ZFS: four 256 KiB labels, L0 at 0, L1 at 256 KiB, L2 and L3 in the last 512 KiB of the
/// device rounded down to 256 KiB; each holds 128 uberblocks of 1 KiB from 128 KiB in, whose
/// first u64 is the magic 0x00bab10c in host byte order (libblkid zfs.c). One signature per
/// label holding any uberblock (at the first one found).
fn zfs_uberblocks(size: u64, areas: &Areas<'_>) -> Vec<Signature> {
    const LABEL: u64 = 256 * KIB;
    const MAGIC: u64 = 0x00ba_b10c;
    let labels =
        [Some(0), Some(LABEL), (size & !(LABEL - 1)).checked_sub(2 * LABEL), (size & !(LABEL - 1)).checked_sub(LABEL)];
    let mut found = Vec::new();
    for label in labels.into_iter().flatten() {
        let first = (0..128u64)
            .map(|i| label + 128 * KIB + i * KIB)
            .find(|&at| areas.has(at, &MAGIC.to_le_bytes()) || areas.has(at, &MAGIC.to_be_bytes()));
        if let Some(offset) = first {
            found.push(Signature { kind: "zfs uberblock", offset });
        }
    }
    found.dedup();
    found
}

#[cfg(test)]
#[path = "signatures_tests.rs"]
mod tests;
