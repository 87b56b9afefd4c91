use super::*;
use crate::core::devices::device_selector::DeviceType;

const DISK: &str = "wwid:naa.5000c500a0b1c2d3";
const PART1: &str = "wwid:naa.5000c500a0b1c2d3/part1@2048";
const PART2: &str = "wwid:naa.5000c500a0b1c2d3/part2@1050624";
const LOOP: &str = "loop:/imgs/a.img@0#12";
const OTHER: &str = "serial:S3Z9NB0K123456";

fn device(name: &str, id: Option<&str>, kind: DeviceKind) -> DeviceFacts {
    DeviceFacts {
        name: name.into(),
        dev: format!("8:{}", name.len()),
        kind: Some(kind),
        size: 1 << 30,
        stable_id: id.map(str::to_string),
        ..Default::default()
    }
}

fn disk_type() -> DeviceKind {
    DeviceKind::Selectable(DeviceType::Disk)
}

/// sda (partitions sda1, sda2), sdb (another disk), loop0 (a loop device), dm-0 (LVM on sdb).
fn devices() -> Vec<DeviceFacts> {
    let mut sda = device("sda", Some(DISK), disk_type());
    sda.partitions = vec!["sda1".into(), "sda2".into()];
    sda.sharing = vec!["sda1".into(), "sda2".into()];
    let mut sda1 = device("sda1", Some(PART1), DeviceKind::Selectable(DeviceType::Partition));
    sda1.parent = Some("sda".into());
    sda1.sharing = vec!["sda".into()];
    let mut sda2 = device("sda2", Some(PART2), DeviceKind::Selectable(DeviceType::Partition));
    sda2.parent = Some("sda".into());
    sda2.sharing = vec!["sda".into()];
    let sdb = device("sdb", Some(OTHER), disk_type());
    let lp = device("loop0", Some(LOOP), DeviceKind::Selectable(DeviceType::Loop));
    let lvm = device("dm-0", Some("dm:LVM-abc"), DeviceKind::Other("device-mapper (LVM)".into()));
    vec![sda, sda1, sda2, sdb, lp, lvm]
}

fn world(id: &str) -> WipeWorld {
    WipeWorld { id: id.into(), devices: devices(), pvs: Ok(Vec::new()), ..Default::default() }
}

fn refusals(w: &WipeWorld) -> Vec<WipeRefusal> {
    decide(w).expect_err("refused")
}

fn codes(w: &WipeWorld) -> Vec<&'static str> {
    refusals(w).iter().map(WipeRefusal::code).collect()
}

fn entry(class: &str, name: &str, device: Option<&str>, link: Option<&str>) -> DirEntry {
    DirEntry {
        unanswered: false,
        class: class.into(),
        name: name.into(),
        link: link.map(str::to_string),
        device: device.map(str::to_string),
    }
}

fn record(class: &str, name: &str, disk: &str) -> ClaimRecord {
    ClaimRecord {
        class: class.into(),
        name: name.into(),
        host_path: format!("/mnt/{class}/{name}"),
        disk: disk.into(),
        target: "/dev/disk/by-id/wwn-0x5000c500a0b1c2d3".into(),
        previous: None,
        held: None,
    }
}

fn pv(name: &str, this_node: bool, path: &str, disk: Option<&str>, device: Option<&str>) -> KnownPv {
    KnownPv {
        name: name.into(),
        this_node,
        disk: PvDisk {
            host_path: path.into(),
            disk: disk.map(str::to_string),
            device: device.map(str::to_string),
            unbound: false,
        },
        volume: None,
    }
}

#[test]
fn a_free_disk_is_allowed_with_what_shares_its_data() {
    let t = decide(&world(DISK)).expect("allowed");
    assert_eq!(t.name, "sda");
    assert_eq!(t.stable_id, DISK);
    assert_eq!(t.size, 1 << 30);
    assert_eq!(t.partitions, vec!["sda1", "sda2"]);
    assert_eq!(t.related, vec!["sda1", "sda2"]);
    assert!(t.own_links.is_empty());
    for id in [PART1, LOOP, OTHER] {
        assert!(decide(&world(id)).is_ok(), "{id}");
    }
    let t = decide(&world(PART1)).unwrap();
    assert_eq!(t.related, vec!["sda"], "a partition shares its whole disk's data");
}

#[test]
fn only_an_exact_id_of_exactly_one_device_is_a_target() {
    for id in ["", "sda", "/dev/sda", "wwid:naa.5000c500a0b1c2d", "WWID:naa.5000c500a0b1c2d3", "loop:/imgs/a.img"] {
        let r = refusals(&world(id));
        assert_eq!(r.len(), 1, "{id}: {r:?}");
        assert_eq!(r[0].code(), "unknown-id", "{id}");
    }
    // A near miss is named.
    let r = refusals(&world("loop:/imgs/a.img@0#13"));
    assert!(r[0].to_string().contains(LOOP), "{}", r[0]);
    let r = refusals(&world("wwid:naa.5000c500a0b1c2d3/part1"));
    assert!(r[0].to_string().contains(PART1), "{}", r[0]);
    // Two devices report one id: none is meant.
    let mut w = world(LOOP);
    let mut twin = device("loop1", Some(LOOP), DeviceKind::Selectable(DeviceType::Loop));
    twin.sharing = vec!["loop0".into()];
    w.devices.push(twin);
    let r = refusals(&w);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0], WipeRefusal::SeveralDevices { id: LOOP.into(), devices: vec!["loop0".into(), "loop1".into()] });
    assert!(r[0].to_string().contains("loop0, loop1"), "{}", r[0]);
    // A device without a stable id can never be named.
    let mut w = world("");
    w.devices.push(device("zram0", None, DeviceKind::Other("zram".into())));
    assert_eq!(codes(&w), vec!["unknown-id"]);
}

#[test]
fn devices_the_host_builds_read_only_and_hidden_ones_are_refused() {
    assert_eq!(codes(&world("dm:LVM-abc")), vec!["not-a-disk"]);
    for (change, code) in [
        (&(|d: &mut DeviceFacts| d.read_only = true) as &dyn Fn(&mut DeviceFacts), "read-only"),
        (&|d: &mut DeviceFacts| d.hidden = true, "hidden"),
        (&|d: &mut DeviceFacts| d.kind = None, "not-a-disk"),
    ] {
        let mut w = world(OTHER);
        change(w.devices.iter_mut().find(|d| d.name == "sdb").unwrap());
        assert_eq!(codes(&w), vec![code]);
    }
    // Every selectable type is allowed.
    for t in [DeviceType::Disk, DeviceType::Partition, DeviceType::Multipath, DeviceType::Loop] {
        let mut w = world(OTHER);
        w.devices.iter_mut().find(|d| d.name == "sdb").unwrap().kind = Some(DeviceKind::Selectable(t));
        assert!(decide(&w).is_ok(), "{t:?}");
    }
}

#[test]
fn holders_of_it_or_of_anything_sharing_its_data_refuse() {
    for holder_of in ["sda", "sda1", "sda2"] {
        for target in [DISK, PART1, PART2] {
            let mut w = world(target);
            w.devices.iter_mut().find(|d| d.name == holder_of).unwrap().holders = vec!["dm-3".into()];
            let shares = target == DISK
                || holder_of == "sda"
                || w.devices.iter().any(|d| d.stable_id.as_deref() == Some(target) && d.name == holder_of);
            match decide(&w) {
                Err(r) if shares => {
                    assert_eq!(r, vec![WipeRefusal::Held { device: holder_of.into(), holders: vec!["dm-3".into()] }])
                }
                Ok(_) if !shares => {}
                other => panic!("{target} with holders on {holder_of}: {other:?}"),
            }
        }
    }
    // Another disk's holders do not matter.
    let mut w = world(DISK);
    w.devices.iter_mut().find(|d| d.name == "sdb").unwrap().holders = vec!["dm-0".into()];
    assert!(decide(&w).is_ok());
}

#[test]
fn in_use_and_open_devices_are_refused() {
    let mut w = world(DISK);
    w.in_use = Some("sda1, which shares its data, is mounted at /var".into());
    let r = refusals(&w);
    assert_eq!(r.len(), 1);
    assert!(r[0].to_string().contains("mounted at /var"), "{}", r[0]);
    assert_eq!(r[0].code(), "in-use");
    // Openers of it or of a sharing device; not of other devices.
    for (dev, refused) in [("sda", true), ("sda1", true), ("sda2", true), ("sdb", false), ("loop0", false)] {
        let mut w = world(DISK);
        let o = Opener { pid: 4242, comm: "qemu".into(), fd: 3, writable: true, what: dev.into(), backing_file: false };
        w.openers = vec![o.clone(), o];
        match decide(&w) {
            Err(r) => {
                assert!(refused, "{dev}: {r:?}");
                assert_eq!(r.len(), 1);
                assert!(r[0].to_string().contains(&format!("qemu (pid 4242) has {dev} open")), "{}", r[0]);
                assert_eq!(r[0].code(), "open");
            }
            Ok(_) => assert!(!refused, "{dev}"),
        }
    }
}

#[test]
fn entries_of_discovery_directories_refuse_except_the_agents_own_claim_of_this_disk() {
    // Someone's link to it, to a partition of it, a bind-mounted device node: refused.
    for dev in ["sda", "sda1", "sda2"] {
        for link in [Some("/dev/sda"), None] {
            let mut w = world(DISK);
            w.entries = vec![entry("fast", "disk-1", Some(dev), link)];
            let r = refusals(&w);
            assert_eq!(
                r,
                vec![WipeRefusal::Entry { class: "fast".into(), name: "disk-1".into(), device: dev.into() }],
                "{dev}"
            );
            assert!(r[0].to_string().contains("entry disk-1 of class fast"), "{}", r[0]);
        }
    }
    // Entries leading elsewhere, or nowhere (a directory, a dangling link): not this disk's.
    let mut w = world(DISK);
    w.entries = vec![entry("fast", "other", Some("sdb"), Some("/dev/sdb")), entry("fast", "dir", None, None)];
    assert!(decide(&w).is_ok());
    // The agent's own claim link of this very disk: allowed, and reported.
    let mut w = world(DISK);
    let name = "wwid-naa.5000c500a0b1c2d3";
    w.entries = vec![entry("fast", name, Some("sda"), Some("/dev/disk/by-id/wwn-0x5000c500a0b1c2d3"))];
    w.records = vec![record("fast", name, DISK)];
    let t = decide(&w).expect("its own claim");
    assert_eq!(t.own_links, vec![("fast".to_string(), name.to_string())]);
    // A record of another disk, class or name does not make the link the agent's.
    for r in [record("fast", name, OTHER), record("slow", name, DISK), record("fast", "other-name", DISK)] {
        let mut w = world(DISK);
        w.entries = vec![entry("fast", name, Some("sda"), Some("/dev/sda"))];
        w.records = vec![r.clone()];
        assert_eq!(codes(&w), vec!["already-volume"], "{r:?}");
    }
    // The agent's claim of the whole disk does not cover a wipe of one partition.
    let mut w = world(PART1);
    w.entries = vec![entry("fast", name, Some("sda"), Some("/dev/sda"))];
    w.records = vec![record("fast", name, DISK)];
    assert_eq!(codes(&w), vec!["already-volume"]);
    // A record naming the disk, but the entry is no link (replaced by someone): theirs.
    let mut w = world(DISK);
    w.entries = vec![entry("fast", name, Some("sda"), None)];
    w.records = vec![record("fast", name, DISK)];
    assert_eq!(codes(&w), vec!["already-volume"]);
}

#[test]
fn an_unscanned_directory_refuses_whatever_else_holds() {
    let mut w = world(OTHER);
    w.unscanned = vec!["slow".into()];
    let r = refusals(&w);
    assert_eq!(r, vec![WipeRefusal::Unscanned(vec!["slow".into()])]);
    assert!(r[0].to_string().contains("class slow"), "{}", r[0]);
}

#[test]
fn pvs_that_recorded_it_or_lead_to_it_refuse() {
    // Recorded ids: the disk, a partition (either way round), any node.
    for (target, recorded, refused) in [
        (DISK, DISK, true),
        (DISK, PART1, true),
        (PART1, DISK, true),
        (PART1, PART1, true),
        (PART1, PART2, false),
        (DISK, OTHER, false),
        (LOOP, "loop:/imgs/a.img@0#13", false),
        (LOOP, LOOP, true),
    ] {
        for this_node in [true, false] {
            let mut w = world(target);
            w.pvs = Ok(vec![pv("pv-1", this_node, "/mnt/fast/x", Some(recorded), None)]);
            match decide(&w) {
                Err(r) => {
                    assert!(refused, "{target} vs {recorded}: {r:?}");
                    assert_eq!(
                        r,
                        vec![WipeRefusal::PvRecorded {
                            pv: "pv-1".into(),
                            path: "/mnt/fast/x".into(),
                            disk: recorded.into()
                        }]
                    );
                    assert!(r[0].to_string().contains("PV pv-1"), "{}", r[0]);
                }
                Ok(_) => assert!(!refused, "{target} vs {recorded}"),
            }
        }
    }
    // Another loop device over a range of the same file shares its data: a PV of it counts;
    // a PV of a device sharing nothing does not.
    let other_range = "loop:/imgs/a.img@1048576#12";
    let mut w = world(LOOP);
    w.devices.iter_mut().find(|d| d.name == "loop0").unwrap().sharing = vec!["loop9".into()];
    let mut loop9 = device("loop9", Some(other_range), DeviceKind::Selectable(DeviceType::Loop));
    loop9.sharing = vec!["loop0".into()];
    w.devices.push(loop9);
    w.pvs = Ok(vec![pv("pv-l", true, "/mnt/l/x", Some(other_range), None)]);
    assert_eq!(codes(&w), vec!["has-pv"]);
    // The ids alone say so too: the same file (inode), overlapping ranges.
    w.devices.iter_mut().find(|d| d.name == "loop0").unwrap().sharing.clear();
    assert_eq!(codes(&w), vec!["has-pv"], "one file, overlapping ranges: one disk");
    w.pvs = Ok(vec![pv("pv-l", true, "/mnt/l/x", Some("loop:/imgs/b.img@0#13"), None)]);
    assert!(decide(&w).is_ok(), "a PV of another file shares nothing with loop0");
    // The same LUN seen as a multipath map is the same disk.
    let mut w = world(DISK);
    w.pvs = Ok(vec![pv("pv-m", false, "/mnt/m/x", Some("dm:mpath-35000c500a0b1c2d3"), None)]);
    assert_eq!(codes(&w), vec!["has-pv"]);
    // A path of this node's PV leading to it or a sharing device; another node's path means
    // nothing here.
    for (dev, this_node, refused) in
        [("sda", true, true), ("sda2", true, true), ("sdb", true, false), ("sda", false, false)]
    {
        let mut w = world(DISK);
        w.pvs = Ok(vec![pv("pv-2", this_node, "/dev/sda", None, Some(dev))]);
        match decide(&w) {
            Err(r) => {
                assert!(refused, "{dev} {this_node}: {r:?}");
                assert!(matches!(&r[..], [WipeRefusal::PvPath { device, .. }] if device == dev), "{r:?}");
            }
            Ok(_) => assert!(!refused, "{dev} {this_node}"),
        }
    }
    // A PV with neither: not this disk's.
    let mut w = world(DISK);
    w.pvs = Ok(vec![pv("pv-3", true, "/mnt/fast/y", None, None)]);
    assert!(decide(&w).is_ok());
}

#[test]
fn the_agents_claim_with_a_pv_is_a_tenants_volume() {
    let name = "wwid-naa.5000c500a0b1c2d3";
    let mut w = world(DISK);
    w.entries = vec![entry("fast", name, Some("sda"), Some("/dev/sda"))];
    w.records = vec![record("fast", name, DISK)];
    // Its PV has not recorded the disk yet (no identity): still refused, by its path.
    w.pvs = Ok(vec![pv("pv-c", true, &format!("/mnt/fast/{name}"), None, None)]);
    let r = refusals(&w);
    assert_eq!(r, vec![WipeRefusal::ClaimPublished { class: "fast".into(), name: name.into(), pv: "pv-c".into() }]);
    assert_eq!(r[0].code(), "has-pv");
    // With its identity: one refusal for the PV, not two.
    w.pvs = Ok(vec![pv("pv-c", true, &format!("/mnt/fast/{name}"), Some(DISK), None)]);
    assert_eq!(refusals(&w).len(), 1);
}

#[test]
fn unreadable_pvs_refuse() {
    let mut w = world(OTHER);
    w.pvs = Err("connection refused".into());
    let r = refusals(&w);
    assert_eq!(r.len(), 1);
    assert!(r[0].to_string().starts_with("cannot prove no PV has it"), "{}", r[0]);
    assert!(r[0].to_string().contains("connection refused"), "{}", r[0]);
    assert_eq!(r[0].code(), "api-unreadable");
}

#[test]
fn every_rule_that_refuses_is_reported() {
    let mut w = world(DISK);
    w.devices[0].read_only = true;
    w.devices[1].holders = vec!["md0".into()];
    w.in_use = Some("it is mounted at /srv".into());
    w.openers =
        vec![Opener { pid: 7, comm: "dd".into(), fd: 3, writable: true, what: "sda".into(), backing_file: false }];
    w.entries = vec![entry("fast", "mine", Some("sda2"), Some("/dev/sda2"))];
    w.unscanned = vec!["slow".into()];
    w.pvs = Err("timed out".into());
    assert_eq!(codes(&w), vec!["read-only", "held", "in-use", "open", "already-volume", "unscanned", "api-unreadable"]);
}

#[test]
fn the_default_deadline_grows_with_the_size() {
    assert_eq!(default_timeout(0).as_secs(), 600);
    assert_eq!(default_timeout(97 << 20).as_secs(), 610);
    assert_eq!(default_timeout(1 << 40).as_secs(), 600 + 104_858, "1 TiB at 10 MiB/s, rounded up");
    assert_eq!(default_timeout(u64::MAX).as_secs(), 600 + u64::MAX.div_ceil(10 << 20));
}

#[test]
fn read_back_covers_both_ends_and_a_spread_inside_the_device() {
    const MIB: u64 = 1 << 20;
    for size in [0, 512, MIB, MIB + 512, 2 * MIB, 3 * MIB, 97 * MIB, 1 << 40, (1 << 40) + 512] {
        let ranges = read_back_ranges(size, 64);
        assert!(ranges.iter().all(|(at, len)| at + len <= size), "{size}: {ranges:?}");
        assert_eq!(ranges[0], (0, size.min(MIB)), "{size}");
        assert!(ranges.contains(&(size - size.min(MIB), size.min(MIB))), "{size}: the last MiB");
        if size >= 3 * MIB {
            assert_eq!(ranges.len(), 66, "{size}");
            assert!(ranges.windows(2).all(|w| w[0].0 < w[1].0), "{size}: sorted, distinct");
            let inner: Vec<u64> = ranges[1..65].iter().map(|r| r.0).collect();
            assert!(inner.iter().all(|a| a % 4096 == 0 && *a >= MIB), "{size}: {inner:?}");
            // Spread: the largest gap between samples is about size / 64.
            let gaps = inner.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            assert!(gaps <= size / 64 + 4096, "{size}: gap {gaps}");
        }
    }
}

/// A loop device whose backing file lies in a PV's volume is that volume's disk, by the rule
/// discovery applies (DiskKey::overlaps): every combination of where the file lives, whose PV
/// it is (this node's or another's), and what the PV recorded.
#[test]
fn a_loop_device_over_a_file_inside_a_pvs_volume_is_that_volumes_disk() {
    use crate::core::volumes::volume_safety::{Extent, Location};
    use std::path::PathBuf;
    let file_in = |device: &str, path: &str| Extent {
        base: "file:0:52:77".into(),
        start: 0,
        end: 1 << 30,
        file: Some(Location { device: device.into(), path: PathBuf::from(path) }),
    };
    let loop_key = |e: Option<Extent>| DiskKey::block("7:0").with_extent(e);
    // The PV's volume: the whole tmpfs 0:52, a subdirectory of it, or another filesystem.
    let volumes = [
        ("the tmpfs", Some(DiskKey::fs("0:52", "/")), true),
        ("the directory holding the image", Some(DiskKey::fs("0:52", "/vol")), true),
        ("a sibling directory", Some(DiskKey::fs("0:52", "/other")), false),
        ("another filesystem", Some(DiskKey::fs("8:1", "/")), false),
        ("no volume at its path", None, false),
    ];
    for (what, volume, inside) in volumes {
        for this_node in [true, false] {
            for target in [Some(loop_key(Some(file_in("0:52", "/vol/a.img")))), Some(loop_key(None)), None] {
                let mut w = world(LOOP);
                w.target_disk = target.clone();
                let mut p = pv("tenant", this_node, "/mnt/disks/vol", None, None);
                p.volume = volume.clone();
                w.pvs = Ok(vec![p]);
                let known_file = target.as_ref().is_some_and(|t| *t == loop_key(Some(file_in("0:52", "/vol/a.img"))));
                let refused = inside && this_node && known_file;
                let ctx = format!("{what}, this node {this_node}, target {target:?}");
                match decide(&w) {
                    Ok(_) => assert!(!refused, "allowed: {ctx}"),
                    Err(r) => {
                        assert!(refused, "refused: {ctx}: {r:?}");
                        assert_eq!(r.len(), 1, "{ctx}");
                        assert_eq!(r[0].code(), "has-pv");
                        assert!(r[0].to_string().contains("PV tenant"), "names the PV: {}", r[0]);
                    }
                }
            }
        }
    }
    // The disk under the backing file's filesystem, recorded by a PV of this node (another
    // node's record names a disk of that machine, whatever serial it shares with this one's).
    for (recorded, backing, refused) in [
        (Some(DISK), Some(PART1), true),  // a Block PV of the whole disk: the file is in its data
        (Some(PART1), Some(PART1), true), // a Filesystem PV of that partition
        (Some(PART2), Some(PART1), false),
        (Some(OTHER), Some(PART1), false),
        (None, Some(PART1), false),
        (Some(PART1), None, false),
    ] {
        for this_node in [true, false] {
            let mut w = world(LOOP);
            w.backing_disk = backing.map(str::to_string);
            w.pvs = Ok(vec![pv("tenant", this_node, "/mnt/disks/vol", recorded, None)]);
            let got = decide(&w).err().map(|r| r.iter().map(|r| r.to_string()).collect::<Vec<_>>());
            assert_eq!(got.is_some(), refused && this_node, "{recorded:?} / {backing:?} / {this_node}: {got:?}");
            if let Some(r) = got {
                assert!(r[0].contains("PV tenant") && r[0].contains("backing file"), "{r:?}");
            }
        }
    }
}
