use super::*;

/// Real kernel messages (Linux 4.x to 6.18, as `dmesg` prints them after the timestamp) and
/// the device each names as failing; None: not a disk failure, or not about a device.
const LINES: &[(&str, Option<&str>)] = &[
    // The block layer (blk_print_req_error), 6.x, as a loop device shrunk under ext4 gives.
    ("I/O error, dev loop1, sector 65664 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2", Some("loop1")),
    ("I/O error, dev sdb, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 0", Some("sdb")),
    ("critical medium error, dev sdc, sector 1953524992 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", Some("sdc")),
    ("critical target error, dev sdd, sector 0 op 0x1:(WRITE) flags 0x0 phys_seg 1 prio class 0", Some("sdd")),
    ("timeout error, dev nvme0n1, sector 100 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", Some("nvme0n1")),
    ("device offline error, dev sde, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", Some("sde")),
    // 5.x and 4.x prefixes.
    (
        "blk_update_request: I/O error, dev sdb, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0",
        Some("sdb"),
    ),
    ("print_req_error: I/O error, dev sda, sector 12345", Some("sda")),
    ("blk_update_request: critical medium error, dev sdf, sector 77", Some("sdf")),
    // The caller's or the kernel's, not the disk's.
    (
        "operation not supported error, dev loop0, sector 556 op 0x9:(WRITE_ZEROES) flags 0x800 phys_seg 0 prio class 2",
        None,
    ),
    ("nonblocking retry error, dev sdb, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", None),
    ("kernel resource error, dev sdb, sector 0", None),
    // The buffer cache.
    ("Buffer I/O error on dev sdb1, logical block 8208, lost async page write", Some("sdb1")),
    ("Buffer I/O error on dev dm-3, logical block 0, async page read", Some("dm-3")),
    // ext4.
    // Counted in errors_count (the sign filesystem-errors, which fsck clears): not a line's.
    ("EXT4-fs error (device sdb1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0", None),
    ("EXT4-fs error (device loop3): ext4_journal_check_start:84: comm kworker/u4:1: Detected aborted journal", None),
    (
        "EXT4-fs warning (device loop1): ext4_end_bio:343: I/O error 10 writing to inode 12 starting block 16385)",
        Some("loop1"),
    ),
    (
        "EXT4-fs warning (device sdb1): ext4_dx_add_entry:2581: Directory (ino: 2) index full, reach max htree level :2",
        None,
    ),
    ("EXT4-fs (sdb1): I/O error while writing superblock", Some("sdb1")),
    // States with their own signs (read-only, shut-down), which a repair clears.
    ("EXT4-fs (loop3): Remounting filesystem read-only", None),
    ("EXT4-fs (loop3): shut down requested (2)", None),
    (
        "EXT4-fs (loop3): mounted filesystem 4b0f0a0c-5f2e-4a5b-9f61-2e0c6a6a2b1d r/w with ordered data mode. Quota mode: none.",
        None,
    ),
    ("EXT4-fs (loop3): unmounting filesystem 4b0f0a0c-5f2e-4a5b-9f61-2e0c6a6a2b1d.", None),
    // jbd2.
    ("JBD2: Error -5 detected when updating journal superblock for sdb1-8.", Some("sdb1")),
    ("JBD2: I/O error when updating journal superblock for loop1-8.", Some("loop1")),
    ("Aborting journal on device loop1-8.", Some("loop1")),
    ("Aborting journal on device dm-0-8.", Some("dm-0")),
    (
        "JBD2: Spotted dirty metadata buffer (dev = sdb1, blocknr = 0). There's a risk of filesystem corruption in case of system crash.",
        None,
    ),
    // XFS.
    ("XFS (sdb1): metadata I/O error in \"xfs_buf_ioend+0x1a0/0x4a0 [xfs]\" at daddr 0x2 len 1 error 5", Some("sdb1")),
    ("XFS (loop2): log I/O error -5", Some("loop2")),
    ("XFS (loop2): Filesystem has been shut down due to log error (0x2).", None),
    (
        "XFS (dm-1): Corruption of in-memory data (0x8) detected at xfs_trans_cancel+0x12c/0x150 [xfs] (fs/xfs/xfs_trans.c:1098).  Shutting down filesystem.",
        None,
    ),
    ("XFS (sdc): writeback error on inode 131, offset 0, sector 64", Some("sdc")),
    ("XFS (sdb1): Mounting V5 Filesystem 0b9d1b6e-6a55-4b55-8c38-8dd0a2b2a7a1", None),
    ("XFS (sdb1): Ending clean mount", None),
    // NVMe.
    ("nvme0n1: I/O Cmd(0x2) @ LBA 1234, 8 blocks, I/O Error (sct 0x2 / sc 0x81) DNR", Some("nvme0n1")),
    ("nvme nvme0: 8/0/0 default/read/poll queues", None),
    // SCSI sense data.
    ("sd 2:0:0:0: [sdb] tag#0 Sense Key : Medium Error [current]", Some("sdb")),
    ("sd 2:0:0:0: [sdb] tag#12 Sense Key : Hardware Error [current] [descriptor]", Some("sdb")),
    ("sd 2:0:0:0: [sdb] Attached SCSI disk", None),
    ("sd 2:0:0:0: [sdb] tag#0 Sense Key : Unit Attention [current]", None),
    // Anything else, and names that are no device names.
    ("loop3: detected capacity change from 131072 to 65536", None),
    ("", None),
    ("I/O error, dev , sector 1", None),
    ("I/O error, dev ../../etc, sector 1", None),
    ("Buffer I/O error on dev sd b, logical block 1", None),
];

#[test]
fn kernel_lines_name_the_failing_device() {
    for (line, want) in LINES {
        let got = disk_error(line);
        assert_eq!(got.as_ref().map(|e| e.device.as_str()), *want, "{line:?}");
        if let Some(e) = got {
            assert_eq!(e.what, *line, "the line is the reason");
        }
    }
}

#[test]
fn records_as_dev_kmsg_returns_them() {
    type Case<'a> = (&'a str, Option<(u64, bool, &'a str)>);
    let table: &[Case] = &[
        ("3,1234,5678901,-;I/O error, dev loop1, sector 8\n", Some((1234, true, "I/O error, dev loop1, sector 8"))),
        // Written by a program (facility user, 8 and up): not the kernel's word.
        ("12,1235,5678902,-;I/O error, dev loop1, sector 8\n", Some((1235, false, "I/O error, dev loop1, sector 8"))),
        ("14,1236,5678903,-;x\n", Some((1236, false, "x"))),
        ("7,1237,5678904,-;x\n", Some((1237, true, "x"))),
        // Continuation lines (the device's dictionary) are not the message.
        (
            "3,77,123,-;Buffer I/O error on dev sdb1, logical block 8\n SUBSYSTEM=block\n DEVICE=b8:17\n",
            Some((77, true, "Buffer I/O error on dev sdb1, logical block 8")),
        ),
        // Newer kernels add fields (the caller) after the flags.
        ("4,99,1000,-,caller=T123;XFS (sdb1): log I/O error -5\n", Some((99, true, "XFS (sdb1): log I/O error -5"))),
        // A message with a `;` in it keeps it.
        ("6,5,1,c;a;b\n", Some((5, true, "a;b"))),
        ("", None),
        ("no prefix\n", None),
        ("x,1,2,-;m\n", None),
        ("6,y,2,-;m\n", None),
    ];
    for (raw, want) in table {
        let got = parse_record(raw).map(|r| (r.seq, r.kernel, r.message));
        assert_eq!(got, *want, "{raw:?}");
    }
}

#[test]
fn a_long_line_is_cut_at_a_character_boundary() {
    let line = format!("Buffer I/O error on dev sdb1, {}", "é".repeat(300));
    let e = disk_error(&line).unwrap();
    assert!(e.what.len() <= MAX_WHAT + 3 && e.what.ends_with("..."), "{}", e.what.len());
    assert!(e.what.starts_with("Buffer I/O error on dev sdb1, é"));
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn error(device: &str, what: &str) -> DiskError {
    DiskError { device: device.into(), what: what.into() }
}

#[test]
fn a_volume_fails_while_a_line_names_a_device_under_it_then_clears() {
    let t0 = Instant::now();
    let mut m = KernelLogMemory::default();
    let on_sdb1 = names(&["sdb1", "sdb"]);
    let on_sdc = names(&["sdc"]);
    assert_eq!(m.failing(&on_sdb1, t0, t0), None);
    // The block layer names the whole disk: every volume on it.
    m.note(error("sdb", "I/O error, dev sdb, sector 8"), t0);
    let failing = Some(Failing::KernelLog("I/O error, dev sdb, sector 8".into()));
    assert_eq!(m.failing(&on_sdb1, t0, t0), failing);
    assert_eq!(m.failing(&on_sdc, t0, t0), None);
    // The latest line about any device under the volume says why.
    let later = t0 + Duration::from_secs(60);
    m.note(error("sdb1", "EXT4-fs error (device sdb1): x"), later);
    assert_eq!(m.failing(&on_sdb1, t0, later), Some(Failing::KernelLog("EXT4-fs error (device sdb1): x".into())));
    // A partition's line is not about its sibling.
    assert_eq!(m.failing(&names(&["sdb2"]), t0, later), None);
    // Held KERNEL_LOG_HOLD after the latest line, then forgotten.
    assert!(m.failing(&on_sdb1, t0, later + KERNEL_LOG_HOLD - Duration::from_secs(1)).is_some());
    assert_eq!(m.failing(&on_sdb1, t0, later + KERNEL_LOG_HOLD), None);
    assert!(m.is_empty());
    // No names (tmpfs): nothing.
    m.note(error("sdb", "x"), later);
    assert_eq!(m.failing(&[], t0, later), None);
}

#[test]
fn the_memory_is_bounded_and_forgets_the_oldest() {
    let t0 = Instant::now();
    let mut m = KernelLogMemory::default();
    for i in 0..MAX_DEVICES + 10 {
        m.note(error(&format!("loop{i}"), "I/O error"), t0 + Duration::from_millis(i as u64));
    }
    assert_eq!(m.len(), MAX_DEVICES);
    let now = t0 + Duration::from_secs(5);
    assert_eq!(m.failing(&names(&["loop0"]), t0, now), None, "the oldest is forgotten");
    assert!(m.failing(&names(&[&format!("loop{}", MAX_DEVICES + 9)]), t0, now).is_some());
}

#[test]
fn a_line_from_before_the_volume_was_seen_is_about_another_disk() {
    let t0 = Instant::now();
    let mut m = KernelLogMemory::default();
    let on_loop3 = names(&["loop3"]);
    // loop3 failed, was detached, and the name given to a new volume's device 5 s later.
    m.note(error("loop3", "I/O error, dev loop3, sector 8"), t0);
    let attached = t0 + Duration::from_secs(5);
    assert_eq!(m.failing(&on_loop3, attached, attached), None);
    // A line about the new one counts.
    let later = attached + Duration::from_secs(1);
    m.note(error("loop3", "I/O error, dev loop3, sector 16"), later);
    assert_eq!(
        m.failing(&on_loop3, attached, later),
        Some(Failing::KernelLog("I/O error, dev loop3, sector 16".into()))
    );
    // Seen since exactly the line's time: it counts.
    assert!(m.failing(&on_loop3, later, later).is_some());
}

#[test]
fn a_size_change_is_read_from_the_block_layers_line_and_nothing_else() {
    let cases: [(&str, Option<&str>); 7] = [
        ("loop3: detected capacity change from 65536 to 98304", Some("loop3")),
        ("sdb: detected capacity change from 0 to 2097152", Some("sdb")),
        ("nvme0n1: detected capacity change from 1000 to 0", Some("nvme0n1")),
        // Not a device name, or another message of the same device.
        ("some thing: detected capacity change from 1 to 2", None),
        ("loop3: partition table beyond EOD, truncated", None),
        ("detected capacity change from 1 to 2", None),
        ("I/O error, dev loop3, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", None),
    ];
    for (line, device) in cases {
        assert_eq!(capacity_change(line), device, "{line}");
    }
}
