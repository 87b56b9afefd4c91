use super::*;

const PIB: u64 = 1024 * 1024 * GIB;

fn covers(areas: &[(u64, u64)], offset: u64, len: u64) -> bool {
    areas.iter().any(|&(o, l)| o <= offset && offset + len <= o + l)
}

/// A device of `size` bytes as the probe reads it: every signature area, zeroed.
struct Disk {
    size: u64,
    areas: Vec<(u64, Vec<u8>)>,
}

impl Disk {
    fn new(size: u64) -> Self {
        let areas = signature_areas(size).into_iter().map(|(o, l)| (o, vec![0u8; l as usize])).collect();
        Disk { size, areas }
    }

    /// Writes `bytes` at `offset`; they must land inside one area (else the test is wrong).
    fn put(&mut self, offset: u64, bytes: &[u8]) -> &mut Self {
        let (start, buf) = self
            .areas
            .iter_mut()
            .find(|(o, b)| *o <= offset && offset + bytes.len() as u64 <= *o + b.len() as u64)
            .unwrap_or_else(|| {
                panic!("{} bytes at {offset} are outside the signature areas of {}", bytes.len(), self.size)
            });
        let from = (offset - *start) as usize;
        buf[from..from + bytes.len()].copy_from_slice(bytes);
        self
    }

    fn content(&self) -> Content {
        let views: Vec<(u64, &[u8])> = self.areas.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        recognise(self.size, &views)
    }

    fn signatures(&self) -> Vec<String> {
        match self.content() {
            Content::Signatures(found) => found.iter().map(|s| s.to_string()).collect(),
            other => panic!("expected signatures, got {other:?}"),
        }
    }
}

fn one(kind: &'static str, offset: u64) -> Content {
    Content::Signatures(vec![Signature { kind, offset }])
}

#[test]
fn signature_areas_cover_known_offsets() {
    let size = 1024 * GIB;
    let areas = signature_areas(size);
    // Head and tail.
    assert!(covers(&areas, 0, MIB));
    assert!(covers(&areas, size - MIB, MIB));
    // ext, block size 1024: group g at block 1 + g*8192.
    for g in [1u64, 3, 5, 7, 9, 25, 27, 49, 81, 125, 243, 343] {
        assert!(covers(&areas, (1 + g * 8192) * 1024, 64 * KIB), "bs 1024 group {g}");
    }
    // ext, block size 2048 and 4096: group g at block g*8*bs.
    for g in [1u64, 3, 5, 7, 9, 25, 27, 49] {
        assert!(covers(&areas, g * 16384 * 2048, 64 * KIB), "bs 2048 group {g}");
        assert!(covers(&areas, g * 32768 * 4096, 64 * KIB), "bs 4096 group {g}");
    }
    assert_eq!(8193 * 1024, 8_389_632);
    assert!(covers(&areas, 8193 * 1024, 1024));
    assert!(covers(&areas, 32768 * 4096, 4096));
    // Not a backup group: nothing written there.
    assert!(!covers(&areas, (1 + 2 * 8192) * 1024, 1));
    assert!(!covers(&areas, 2 * 32768 * 4096, 1));
    // btrfs mirrors and LUKS2 secondary headers.
    assert!(covers(&areas, 64 * MIB, 64 * KIB));
    assert!(covers(&areas, 256 * GIB, 64 * KIB));
    assert!(covers(&areas, 4 * MIB, 4 * KIB));
    // Sorted, disjoint, inside the device.
    for w in areas.windows(2) {
        assert!(w[0].0 + w[0].1 < w[1].0, "{w:?}");
    }
    assert!(areas.iter().all(|&(o, l)| l > 0 && o + l <= size));
    // Only a few MiB are written on a 1 TiB device.
    let total: u64 = areas.iter().map(|&(_, l)| l).sum();
    assert!(total < 16 * MIB, "{total}");
}

#[test]
fn signature_areas_clip_to_small_devices() {
    assert_eq!(signature_areas(0), Vec::<(u64, u64)>::new());
    assert_eq!(signature_areas(512 * KIB), vec![(0, 512 * KIB)]);
    assert_eq!(signature_areas(3 * MIB / 2), vec![(0, 3 * MIB / 2)]);
    let areas = signature_areas(10 * MIB);
    assert_eq!(areas[0], (0, MIB + 64 * KIB));
    assert!(covers(&areas, 2 * MIB, 64 * KIB));
    assert!(covers(&areas, 8193 * 1024, 64 * KIB));
    assert_eq!(*areas.last().unwrap(), (9 * MIB, MIB));
    assert!(!covers(&areas, 64 * MIB, 1));
}

#[test]
fn zero_areas_of_any_size_are_blank() {
    for size in [
        0,
        1,
        7,
        511,
        512,
        4097,
        32 * KIB,
        64 * KIB - 1,
        64 * KIB + 3,
        1000 * KIB,
        MIB - 1,
        MIB + 1,
        3 * MIB + 7,
        10 * GIB + 512,
    ] {
        assert_eq!(Disk::new(size).content(), Content::Blank, "size {size}");
    }
    assert_eq!(recognise(1 << 40, &[]), Content::Blank);
    assert_eq!(recognise(1 << 40, &[(0, &[][..]), (4096, &[0u8; 3][..])]), Content::Blank);
}

/// Every fixed magic, at each of its places, written alone on a zeroed device, with the
/// offsets spelled out as libblkid (and the formats) define them, not taken from the table.
fn fixed_cases(size: u64) -> Vec<(&'static str, u64, &'static [u8])> {
    let md1: &[u8] = b"\xfc\x4e\x2b\xa9\x01\x00\x00\x00";
    let md090_le: &[u8] = b"\xfc\x4e\x2b\xa9\x00\x00\x00\x00\x5a\x00\x00\x00";
    let md090_be: &[u8] = b"\xa9\x2b\x4e\xfc\x00\x00\x00\x00\x00\x00\x00\x5a";
    let bcache: &[u8] = b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81";
    let f2fs: &[u8] = b"\x10\x20\xf5\xf2";
    let mut cases = vec![
        ("gpt header", 512, &b"EFI PART"[..]),
        ("gpt header", 4096, b"EFI PART"),
        ("gpt backup header", (size / 512) * 512 - 512, b"EFI PART"),
        ("gpt backup header", (size / 4096) * 4096 - 4096, b"EFI PART"),
        ("xfs superblock", 0, b"XFSB"),
        ("btrfs superblock", 65536 + 64, b"_BHRfS_M"),
        ("btrfs mirror superblock", 64 * MIB + 64, b"_BHRfS_M"),
        ("md superblock 1.1", 0, md1),
        ("md superblock 1.2", 4096, md1),
        ("md superblock 1.0", (size / 4096) * 4096 - 8192, md1),
        ("md superblock 0.90", (size / 65536) * 65536 - 65536, md090_le),
        ("md superblock 0.90", (size / 65536) * 65536 - 65536, md090_be),
        ("LUKS1 header", 0, b"LUKS\xba\xbe\x00\x01"),
        ("LUKS2 header", 0, b"LUKS\xba\xbe\x00\x02"),
        ("vfat boot sector", 54, b"FAT12   "),
        ("vfat boot sector", 54, b"FAT16   "),
        ("vfat boot sector", 82, b"FAT32   "),
        ("vfat backup boot sector", 3072 + 82, b"FAT32   "),
        ("NTFS boot sector", 3, b"NTFS    "),
        ("NTFS backup boot sector", (size / 512) * 512 - 512 + 3, b"NTFS    "),
        ("iso9660 volume descriptor", 32769, b"CD001"),
        ("bcache superblock", 4096 + 24, bcache),
        ("ceph bluestore label", 0, b"bluestore block device"),
        ("squashfs superblock", 0, b"hsqs"),
        ("squashfs superblock", 0, b"sqsh"),
        ("f2fs superblock", 1024, f2fs),
        ("f2fs backup superblock", 4096 + 1024, f2fs),
    ];
    for at in [16, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
        cases.push(("LUKS2 secondary header", at * KIB, b"SKUL\xba\xbe\x00\x02"));
    }
    for page in [4096, 8192, 16384, 65536] {
        cases.push(("swap signature", page - 10, b"SWAPSPACE2"));
        cases.push(("swap signature", page - 10, b"SWAP-SPACE"));
        for hibernated in [&b"S1SUSPEND"[..], b"S2SUSPEND", b"ULSUSPEND", b"LINHIB0001"] {
            cases.push(("swsuspend signature", page - 10, hibernated));
        }
    }
    if size > PIB {
        cases.push(("btrfs mirror superblock", 256 * GIB + 64, b"_BHRfS_M"));
        cases.push(("btrfs mirror superblock", PIB + 64, b"_BHRfS_M"));
    }
    cases
}

#[test]
fn each_fixed_magic_is_recognised_at_each_of_its_offsets() {
    // An odd size (not a multiple of 4 KiB or 64 KiB) shows the end rules round down; the
    // large one reaches the 256 GiB and 1 PiB btrfs mirrors.
    for size in [300 * MIB + 512 * 3, 2 * PIB + 7 * 512] {
        // On the large device only what is beyond the small one (the end rules, the mirrors):
        // each case reads some 10 MiB of areas there.
        let cases = fixed_cases(size).into_iter().filter(|&(_, offset, _)| size < PIB || offset > 300 * MIB);
        for (kind, offset, magic) in cases {
            let mut disk = Disk::new(size);
            disk.put(offset, magic);
            assert_eq!(disk.content(), one(kind, offset), "{kind} at {offset} on {size}");
            assert_eq!(disk.content().to_string(), format!("{kind} at {offset}"));
        }
    }
}

#[test]
fn every_rule_offset_has_a_case_and_lies_inside_the_areas() {
    // The cases above are written from the formats' documentation; this checks the table has
    // nothing they leave out, and that the quick wipe zeroes every place a rule looks at.
    for size in [300 * MIB + 512 * 3, 2 * PIB + 7 * 512, 5 * MIB] {
        let cases = fixed_cases(size);
        let areas = signature_areas(size);
        for rule in RULES {
            for at in rule.at {
                let Some(offset) = at.offset(size).filter(|o| o + rule.magic.len() as u64 <= size) else {
                    continue;
                };
                assert!(covers(&areas, offset, rule.magic.len() as u64), "{} at {offset} not wiped", rule.kind);
                if size > 5 * MIB {
                    assert!(
                        cases.iter().any(|&(k, o, m)| k == rule.kind && o == offset && m == rule.magic),
                        "no test case for {} at {offset}",
                        rule.kind
                    );
                }
            }
        }
    }
}

/// A minimal MBR with one partition entry of type `kind` in slot `slot`.
fn mbr(disk: &mut Disk, slot: u64, boot: u8, kind: u8, sectors: u32) {
    let mut entry = [0u8; 16];
    entry[0] = boot;
    entry[4] = kind;
    entry[8..12].copy_from_slice(&2048u32.to_le_bytes());
    entry[12..16].copy_from_slice(&sectors.to_le_bytes());
    disk.put(446 + 16 * slot, &entry).put(510, b"\x55\xaa");
}

#[test]
fn dos_partition_tables_need_a_plausible_entry() {
    for slot in 0..4 {
        let mut disk = Disk::new(100 * MIB);
        mbr(&mut disk, slot, 0x80, 0x83, 4096);
        assert_eq!(disk.content(), one("dos partition table", 510), "slot {slot}");
    }
    let mut disk = Disk::new(100 * MIB);
    mbr(&mut disk, 0, 0x00, 0xee, u32::MAX);
    assert_eq!(disk.content(), one("protective MBR", 510));
    // 0x55AA alone (no partition), a bad boot flag, an entry without sectors or type: not a
    // partition table, but still not blank.
    let mut disk = Disk::new(100 * MIB);
    disk.put(510, b"\x55\xaa");
    assert_eq!(disk.content(), Content::Data { offset: 510 });
    let mut disk = Disk::new(100 * MIB);
    mbr(&mut disk, 1, 0x12, 0x83, 4096);
    assert_eq!(disk.content(), Content::Data { offset: 446 + 16 });
    let mut disk = Disk::new(100 * MIB);
    mbr(&mut disk, 0, 0, 0x83, 0);
    assert_eq!(disk.content(), Content::Data { offset: 446 + 4 });
    let mut disk = Disk::new(100 * MIB);
    mbr(&mut disk, 0, 0, 0, 4096);
    assert_eq!(disk.content(), Content::Data { offset: 446 + 9 }, "2048 is 00 08 00 00");
}

#[test]
fn a_fat_or_ntfs_boot_sector_is_not_a_partition_table() {
    for (kind, offset, magic) in [("vfat boot sector", 82, &b"FAT32   "[..]), ("NTFS boot sector", 3, b"NTFS    ")] {
        let mut disk = Disk::new(100 * MIB);
        mbr(&mut disk, 0, 0, 0x0c, 4096);
        disk.put(offset, magic);
        assert_eq!(disk.content(), one(kind, offset));
    }
}

/// An ext superblock at `sb` with these feature flags and block size.
fn ext_sb(disk: &mut Disk, sb: u64, log_block_size: u32, compat: u32, incompat: u32, ro_compat: u32) {
    disk.put(sb + 0x18, &log_block_size.to_le_bytes())
        .put(sb + 0x38, &0xEF53u16.to_le_bytes())
        .put(sb + 0x5C, &compat.to_le_bytes())
        .put(sb + 0x60, &incompat.to_le_bytes())
        .put(sb + 0x64, &ro_compat.to_le_bytes());
}

#[test]
fn ext_superblocks_are_told_apart_by_their_features() {
    // mke2fs defaults: ext2 filetype+sparse_super; ext3 adds has_journal; ext4 adds extents,
    // 64bit, flex_bg, metadata_csum...; an external journal has journal_dev.
    let cases = [
        ("ext2 superblock", 0x38, 0x2, 0x3),
        ("ext2 superblock", 0x0, 0x12, 0x7),
        ("ext3 superblock", 0x3c, 0x2, 0x3),
        ("ext3 superblock", 0x4, 0x16, 0x7),
        ("ext4 superblock", 0x3c, 0x2c2, 0x46b),
        ("ext4 superblock", 0x4, 0x42, 0x1),
        ("ext4 superblock", 0x4, 0x2, 0x1 | 0x8),
        ("ext4 superblock", 0x0, 0x2, 0x400),
        ("jbd superblock", 0x0, 0x8, 0x0),
    ];
    for (kind, compat, incompat, ro_compat) in cases {
        let mut disk = Disk::new(100 * MIB);
        ext_sb(&mut disk, 1024, 2, compat, incompat, ro_compat);
        assert_eq!(disk.content(), one(kind, 1080), "{kind} {compat:#x} {incompat:#x} {ro_compat:#x}");
    }
    let mut disk = Disk::new(100 * MIB);
    disk.put(1080, b"\x53\xef");
    assert_eq!(disk.content(), one("ext2 superblock", 1080), "a bare magic is ext2 (no features)");
}

#[test]
fn ext_backup_superblocks_are_recognised_where_mke2fs_puts_them() {
    let size = 400 * GIB;
    // (block size, log, groups): group g's superblock at (1 + 8192 g) KiB with 1 KiB blocks,
    // at g * 8 * bs * bs otherwise.
    let layouts: [(u64, u32, &[u64]); 3] = [
        (1024, 0, &[1, 3, 5, 7, 9, 25, 27, 49, 125]),
        (2048, 1, &[1, 3, 5, 7, 9, 343]),
        (4096, 2, &[1, 3, 5, 7, 81, 2401]),
    ];
    for (bs, log, groups) in layouts {
        for &g in groups {
            let sb = if bs == 1024 { (1 + 8192 * g) * 1024 } else { g * 8 * bs * bs };
            let mut disk = Disk::new(size);
            ext_sb(&mut disk, sb, log, 0x3c, 0x2c2, 0x46b);
            assert_eq!(disk.content(), one("ext4 backup superblock", sb + 0x38), "bs {bs} group {g}");
            // The same superblock claiming another block size is not one mke2fs would put there.
            let mut disk = Disk::new(size);
            ext_sb(&mut disk, sb, log + 1, 0x3c, 0x2c2, 0x46b);
            assert_eq!(disk.content(), Content::Data { offset: sb + 0x18 }, "bs {bs} group {g}");
        }
    }
    // A 200 MiB ext4 with 4 KiB blocks (32768 blocks per group): the primary and group 1's
    // backup at 128 MiB.
    let mut disk = Disk::new(200 * MIB);
    ext_sb(&mut disk, 1024, 2, 0x3c, 0x2c2, 0x46b);
    ext_sb(&mut disk, 128 * MIB, 2, 0x3c, 0x2c2, 0x46b);
    assert_eq!(disk.signatures(), ["ext4 superblock at 1080", "ext4 backup superblock at 134217784"]);
}

#[test]
fn lvm2_labels_are_found_in_the_first_four_sectors() {
    for sector in 0..4u64 {
        let mut disk = Disk::new(100 * MIB);
        disk.put(sector * 512, b"LABELONE").put(sector * 512 + 24, b"LVM2 001");
        assert_eq!(disk.content(), one("LVM2 label", sector * 512), "sector {sector}");
    }
    let mut disk = Disk::new(100 * MIB);
    disk.put(4 * 512, b"LABELONE").put(4 * 512 + 24, b"LVM2 001");
    assert_eq!(disk.content(), Content::Data { offset: 2048 }, "sector 4 is not looked at");
    let mut disk = Disk::new(100 * MIB);
    disk.put(512, b"LABELONE");
    assert_eq!(disk.content(), Content::Data { offset: 512 }, "no LVM2 type");
}

#[test]
fn zfs_uberblocks_are_found_in_each_label() {
    // 100 MiB + 100 KiB: the end labels are placed from the size rounded down to 256 KiB.
    let size = 100 * MIB + 100 * KIB;
    let aligned = 100 * MIB;
    let labels = [0, 256 * KIB, aligned - 512 * KIB, aligned - 256 * KIB];
    for label in labels {
        for (slot, magic) in
            [(0u64, 0x00bab10cu64.to_le_bytes()), (4, 0x00bab10cu64.to_le_bytes()), (127, 0x00bab10cu64.to_be_bytes())]
        {
            let at = label + 128 * KIB + slot * KIB;
            let mut disk = Disk::new(size);
            disk.put(at, &magic);
            assert_eq!(disk.content(), one("zfs uberblock", at), "label at {label}, slot {slot}");
        }
    }
    // Not on a 1 KiB boundary of the uberblock array: not an uberblock.
    let mut disk = Disk::new(size);
    disk.put(128 * KIB + 8, &0x00bab10cu64.to_le_bytes());
    assert_eq!(disk.content(), Content::Data { offset: 128 * KIB + 8 });
    // One signature per label, at its first uberblock.
    let mut disk = Disk::new(size);
    for slot in [3u64, 9] {
        disk.put(128 * KIB + slot * KIB, &0x00bab10cu64.to_le_bytes());
        disk.put(aligned - 128 * KIB + slot * KIB, &0x00bab10cu64.to_le_bytes());
    }
    assert_eq!(
        disk.signatures(),
        ["zfs uberblock at 134144".to_string(), format!("zfs uberblock at {}", aligned - 125 * KIB)]
    );
}

#[test]
fn data_without_a_signature_reports_the_first_non_zero_byte() {
    let mut disk = Disk::new(10 * GIB);
    disk.put(10 * GIB - 1, b"\x01").put(4096, b"junk").put(64 * MIB + 5, b"x");
    assert_eq!(disk.content(), Content::Data { offset: 4096 });
    assert_eq!(disk.content().to_string(), "non-zero data at offset 4096 with no signature this agent recognises");
    // Areas given in any order.
    let tail = [0u8, 0, 7];
    let head = [0u8; 16];
    assert_eq!(recognise(1 << 30, &[(1 << 29, &tail[..]), (0, &head[..])]), Content::Data { offset: (1 << 29) + 2 });
    // A magic one byte short is data.
    let mut disk = Disk::new(10 * GIB);
    disk.put(0, b"XFS");
    assert_eq!(disk.content(), Content::Data { offset: 0 });
}

#[test]
fn several_signatures_are_listed_by_offset() {
    // What sgdisk/sfdisk leave for a GPT on a 512-byte-sector disk.
    let size = 300 * MIB;
    let mut disk = Disk::new(size);
    mbr(&mut disk, 0, 0, 0xee, u32::MAX);
    disk.put(512, b"EFI PART").put(size - 512, b"EFI PART");
    assert_eq!(
        disk.content().to_string(),
        format!("protective MBR at 510, gpt header at 512, gpt backup header at {}", size - 512)
    );
    // A partition table over an old filesystem.
    let mut disk = Disk::new(size);
    ext_sb(&mut disk, 1024, 2, 0x3c, 0x2c2, 0x46b);
    mbr(&mut disk, 0, 0, 0x83, 2048);
    assert_eq!(disk.content().to_string(), "dos partition table at 510, ext4 superblock at 1080");
    // LUKS2 with its secondary header, and btrfs with its first mirror.
    let mut disk = Disk::new(size);
    disk.put(0, b"LUKS\xba\xbe\x00\x02").put(16 * KIB, b"SKUL\xba\xbe\x00\x02");
    disk.put(64 * KIB + 64, b"_BHRfS_M").put(64 * MIB + 64, b"_BHRfS_M");
    assert_eq!(
        disk.signatures(),
        [
            "LUKS2 header at 0",
            "LUKS2 secondary header at 16384",
            "btrfs superblock at 65600",
            "btrfs mirror superblock at 67108928"
        ]
    );
}

#[test]
fn tiny_devices_are_recognised_without_reading_past_the_end() {
    // Smaller than 64 KiB: only the start rules fit; the end rules never go below 0.
    let mut disk = Disk::new(32 * KIB);
    disk.put(0, b"XFSB");
    assert_eq!(disk.content(), one("xfs superblock", 0));
    let mut disk = Disk::new(4096);
    disk.put(4086, b"SWAPSPACE2");
    assert_eq!(disk.content(), one("swap signature", 4086));
    let mut disk = Disk::new(1024);
    disk.put(512, b"EFI PART");
    assert_eq!(
        disk.content(),
        Content::Signatures(vec![
            Signature { kind: "gpt header", offset: 512 },
            Signature { kind: "gpt backup header", offset: 512 },
        ])
    );
    // Smaller than 1 MiB: head and tail area are one; md 0.90 and 1.0 at the end.
    let size = 700 * KIB + 512;
    let mut disk = Disk::new(size);
    disk.put(640 * KIB - 64 * KIB, b"\xfc\x4e\x2b\xa9\x00\x00\x00\x00\x5a\x00\x00\x00");
    assert_eq!(disk.content(), one("md superblock 0.90", 576 * KIB));
    let mut disk = Disk::new(size);
    disk.put(700 * KIB - 8 * KIB, b"\xfc\x4e\x2b\xa9\x01\x00\x00\x00");
    assert_eq!(disk.content(), one("md superblock 1.0", 692 * KIB));
    // A btrfs superblock cut short by the end of the device is data.
    let mut disk = Disk::new(64 * KIB + 68);
    disk.put(64 * KIB + 64, b"_BHR");
    assert_eq!(disk.content(), Content::Data { offset: 64 * KIB + 64 });
    // Devices of a few bytes, full of non-zero bytes, do not make any rule panic.
    for size in [1u64, 2, 3, 7, 63, 511, 513, 1081, 4095] {
        let bytes = vec![0xffu8; size as usize];
        assert_eq!(recognise(size, &[(0, &bytes[..])]), Content::Data { offset: 0 }, "size {size}");
    }
}

#[test]
fn a_magic_straddling_the_end_of_an_area_is_not_read_and_does_not_panic() {
    // The area ends in the middle of the btrfs magic, of the ext superblock fields, of the MBR.
    let mut buf = vec![0u8; 64 * 1024 + 0x44];
    buf[64 * 1024 + 0x40..].copy_from_slice(b"_BHR");
    assert_eq!(recognise(1 << 30, &[(0, &buf[..])]), Content::Data { offset: 64 * 1024 + 0x40 });
    let mut buf = vec![0u8; 1024 + 0x3A];
    buf[1024 + 0x38..].copy_from_slice(&0xEF53u16.to_le_bytes());
    assert_eq!(recognise(1 << 30, &[(0, &buf[..])]), Content::Data { offset: 1080 });
    let mut buf = vec![0u8; 511];
    buf[510] = 0x55;
    assert_eq!(recognise(1 << 30, &[(0, &buf[..])]), Content::Data { offset: 510 });
    // The magic split over two adjacent areas: each area is looked at alone.
    let head = b"XF".to_vec();
    let rest = b"SB".to_vec();
    assert_eq!(recognise(1 << 30, &[(0, &head[..]), (2, &rest[..])]), Content::Data { offset: 0 });
    // Areas near the top of the offset range.
    let top = [0xffu8; 16];
    assert_eq!(recognise(u64::MAX, &[(u64::MAX - 16, &top[..])]), Content::Data { offset: u64::MAX - 16 });
}

#[test]
fn display_names_every_state() {
    assert_eq!(Content::Blank.to_string(), "blank");
    assert_eq!(one("ext4 superblock", 1080).to_string(), "ext4 superblock at 1080");
    assert_eq!(
        Content::Signatures(vec![
            Signature { kind: "ext4 superblock", offset: 1080 },
            Signature { kind: "dos partition table", offset: 510 }
        ])
        .to_string(),
        "ext4 superblock at 1080, dos partition table at 510"
    );
}
