use super::*;

/// An owned mount line: (device, root, mount point, fs type, source).
type Line = (&'static str, &'static str, &'static str, &'static str, &'static str);

fn lines(table: &[Line]) -> Vec<MountLine<'static>> {
    table
        .iter()
        .map(|&(device, root, point, fs_type, source)| MountLine {
            device,
            root: Path::new(root),
            mount_point: Path::new(point),
            fs_type,
            source,
        })
        .collect()
}

/// A typical node: the root filesystem, /var/lib/kubelet on it, a discovery directory with two
/// mounted volumes, kubelet's tmpfs for a pod's token, containerd's overlay.
const NODE: [Line; 7] = [
    ("8:1", "/", "/", "ext4", "/dev/sda1"),
    ("0:22", "/", "/proc", "proc", "proc"),
    ("0:40", "/", "/mnt/disks/vol1", "tmpfs", "tmpfs"),
    ("8:16", "/", "/mnt/disks/vol2", "ext4", "/dev/sdb"),
    ("0:50", "/", "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~projected/token", "tmpfs", "tmpfs"),
    ("0:51", "/", "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs", "overlay", "overlay"),
    ("0:5", "/", "/dev", "devtmpfs", "udev"),
];

fn interest() -> MountInterest {
    MountInterest {
        paths: BTreeSet::from([PathBuf::from("/mnt/disks")]),
        devices: BTreeSet::new(),
        kubelet_dir: Some(PathBuf::from("/var/lib/kubelet")),
        block_devices: false,
    }
}

/// The mount points of the relevant entries.
fn relevant(table: &[Line], interest: Option<&MountInterest>) -> Vec<&'static str> {
    relevant_mounts(&lines(table), interest).iter().map(|m| m.mount_point.to_str().unwrap()).collect()
}

/// Whether `extra` added to the node's table (or removed from it) changes the relevant part.
fn wakes(extra: Line, interest: &MountInterest) -> bool {
    let mut with = NODE.to_vec();
    with.push(extra);
    let (a, b) = (lines(&NODE), lines(&with));
    relevant_mounts(&a, Some(interest)) != relevant_mounts(&b, Some(interest))
}

#[test]
fn before_the_first_pass_every_entry_is_relevant() {
    assert_eq!(relevant(&NODE, None).len(), NODE.len());
    let mut with = NODE.to_vec();
    with.push(("0:99", "/", "/elsewhere", "tmpfs", "tmpfs"));
    assert_ne!(relevant_mounts(&lines(&NODE), None), relevant_mounts(&lines(&with), None));
}

#[test]
fn the_root_covering_mount_the_volumes_and_nothing_else_are_relevant_on_a_quiet_node() {
    assert_eq!(relevant(&NODE, Some(&interest())), vec!["/", "/mnt/disks/vol1", "/mnt/disks/vol2"]);
}

#[test]
fn a_tmpfs_mounted_outside_every_watched_path_is_not_relevant() {
    for point in ["/tmp/churn", "/mnt/other", "/mnt/disks-other/x", "/var/lib/kubelet/pods/u2/volumes/x/y", "/run/x"] {
        assert!(!wakes(("0:99", "/", point, "tmpfs", "tmpfs"), &interest()), "{point}");
    }
    // Nor containerd's overlays, nor a bind of a single file outside kubelet's directory.
    assert!(!wakes(("0:98", "/", "/run/containerd/x/rootfs", "overlay", "overlay"), &interest()));
}

#[test]
fn a_mount_at_below_or_above_a_discovery_directory_is_relevant() {
    let i = interest();
    assert!(wakes(("0:99", "/", "/mnt/disks/vol3", "tmpfs", "tmpfs"), &i), "a new entry mounted");
    assert!(wakes(("0:99", "/", "/mnt/disks/vol1/nested", "tmpfs", "tmpfs"), &i), "a mount nested in a volume");
    assert!(wakes(("0:99", "/", "/mnt/disks", "tmpfs", "tmpfs"), &i), "the directory itself mounted over");
    assert!(wakes(("0:99", "/", "/mnt", "tmpfs", "tmpfs"), &i), "a parent mounted over");
    assert!(wakes(("0:99", "/", "/", "tmpfs", "tmpfs"), &i), "the root mounted over");
}

#[test]
fn a_volume_unmounted_is_relevant() {
    let i = interest();
    let without: Vec<Line> = NODE.iter().copied().filter(|l| l.2 != "/mnt/disks/vol2").collect();
    let (a, b) = (lines(&NODE), lines(&without));
    assert_ne!(relevant_mounts(&a, Some(&i)), relevant_mounts(&b, Some(&i)));
}

#[test]
fn every_mount_of_a_volumes_filesystem_is_relevant_wherever_it_is() {
    let i = interest();
    // kubelet's bind mount of vol1 (tmpfs 0:40) and of vol2 (8:16) into pods.
    let pod1 = "/var/lib/kubelet/pods/u2/volumes/kubernetes.io~local-volume/pv1";
    assert!(wakes(("0:40", "/", pod1, "tmpfs", "tmpfs"), &i));
    assert!(wakes(
        ("8:16", "/", "/var/lib/kubelet/pods/u3/volumes/kubernetes.io~local-volume/pv2", "ext4", "/dev/sdb"),
        &i
    ));
    // A subPath of it, and a bind mount of it anywhere else.
    assert!(wakes(("8:16", "/data", "/var/lib/kubelet/pods/u3/volume-subpaths/pv2/c/0", "ext4", "/dev/sdb"), &i));
    assert!(wakes(("0:40", "/", "/srv/elsewhere", "tmpfs", "tmpfs"), &i));
    // A host-area mount of it (makes its source unsafe).
    assert!(wakes(("8:16", "/", "/etc/x", "ext4", "/dev/sdb"), &i));
}

#[test]
fn every_mount_of_the_filesystem_a_discovery_directory_lives_on_is_relevant() {
    // /mnt/disks lives on the root filesystem (8:1): a bind of part of it elsewhere may expose
    // the discovery directory; one of another filesystem may not.
    assert!(wakes(("8:1", "/home", "/srv/home", "ext4", "/dev/sda1"), &interest()));
    assert!(!wakes(("8:2", "/", "/srv/other", "ext4", "/dev/sda2"), &interest()));
}

#[test]
fn the_interest_devices_and_paths_are_relevant_by_themselves() {
    let mut i = interest();
    assert!(!wakes(("253:4", "/", "/srv/lv", "xfs", "/dev/mapper/vg-lv"), &i));
    i.devices.insert("253:4".into());
    assert!(wakes(("253:4", "/", "/srv/lv", "xfs", "/dev/mapper/vg-lv"), &i), "a device a volume is on");
    let mut i = interest();
    i.paths.insert(PathBuf::from("/data/real-disks"));
    assert!(wakes(("0:99", "/", "/data/real-disks/a", "tmpfs", "tmpfs"), &i), "a resolved discovery directory");
    assert!(wakes(("0:99", "/", "/data", "tmpfs", "tmpfs"), &i), "above the resolved directory");
}

#[test]
fn a_mount_covering_kubelets_directory_is_relevant() {
    assert!(wakes(("0:99", "/", "/var/lib/kubelet", "tmpfs", "tmpfs"), &interest()));
    assert!(wakes(("8:3", "/", "/var", "ext4", "/dev/sda3"), &interest()));
    let none = MountInterest { kubelet_dir: None, ..interest() };
    assert!(!wakes(("0:99", "/", "/var/lib/kubelet", "tmpfs", "tmpfs"), &none));
    // The narrower hostPaths of deploy/: each directory kubelet mounts local volumes in.
    for at in [
        "/var/lib/kubelet/pods",
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins/kubernetes.io~local-volume",
        "/var/lib/kubelet/plugins/kubernetes.io/local-volume",
    ] {
        assert!(wakes(("8:3", "/var/lib/kubelet/pods", at, "ext4", "/dev/sda3"), &interest()), "{at}");
        assert!(!wakes(("8:3", "/var/lib/kubelet/pods", at, "ext4", "/dev/sda3"), &none), "{at}");
    }
    // Elsewhere in kubelet's directory, a mount decides nothing of what the agent sees.
    for at in ["/var/lib/kubelet/pki", "/var/lib/kubelet/plugins/kubernetes.io/csi", "/var/lib/kubelet/podsx"] {
        assert!(!wakes(("8:3", "/var/lib/kubelet/x", at, "ext4", "/dev/sda3"), &interest()), "{at}");
    }
}

#[test]
fn while_block_devices_matter_every_mount_that_may_hold_one_is_relevant() {
    let block = MountInterest { block_devices: true, ..interest() };
    // A partition or a stacked device mounted anywhere (its whole disk may be an entry).
    assert!(wakes(("8:33", "/", "/srv/part", "ext4", "/dev/sdc1"), &block));
    assert!(wakes(("253:7", "/", "/srv/lv", "xfs", "/dev/mapper/vg-lv"), &block));
    // btrfs: an anonymous device number, but a source under /dev.
    assert!(wakes(("0:60", "/", "/srv/btrfs", "btrfs", "/dev/sdd"), &block));
    // A device node bind-mounted into a pod (kubelet's map of a Block PV): root is the node.
    let map = "/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv3/u4";
    assert!(wakes(("0:5", "/loop3", map, "devtmpfs", "udev"), &block));
    assert!(wakes(("0:77", "/loop3", map, "tmpfs", "tmpfs"), &block), "a node on another /dev");
    // A devtmpfs anywhere (a container's /dev).
    assert!(wakes(("0:5", "/", "/srv/dev", "devtmpfs", "udev"), &block));
    // tmpfs churn still costs nothing, and nor does a pod's token.
    assert!(!wakes(("0:99", "/", "/tmp/churn", "tmpfs", "tmpfs"), &block));
    assert!(!wakes(
        ("0:99", "/", "/var/lib/kubelet/pods/u5/volumes/kubernetes.io~projected/t", "tmpfs", "tmpfs"),
        &block
    ));
    // None of it matters without block devices.
    assert!(!wakes(("8:33", "/", "/srv/part", "ext4", "/dev/sdc1"), &interest()));
    assert!(!wakes(("0:5", "/loop3", map, "devtmpfs", "udev"), &interest()));
}

#[test]
fn without_kubelets_directory_a_single_file_bound_anywhere_may_be_a_device_node() {
    let block = MountInterest { block_devices: true, kubelet_dir: None, ..interest() };
    assert!(wakes(("0:77", "/loop3", "/srv/node", "tmpfs", "tmpfs"), &block));
    let with_kubelet = MountInterest { block_devices: true, ..interest() };
    assert!(!wakes(("0:77", "/x", "/srv/node", "tmpfs", "tmpfs"), &with_kubelet));
}

#[test]
fn relevant_entries_keep_the_table_order_and_each_entry_once() {
    let i = MountInterest { devices: BTreeSet::from(["0:40".to_string()]), ..interest() };
    let r = relevant(&NODE, Some(&i));
    assert_eq!(r, vec!["/", "/mnt/disks/vol1", "/mnt/disks/vol2"]);
}

fn partitions(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> =
        ["major minor  #blocks  name", "", "   8        0   10485760 sda", "   8       16    1048576 sdb"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
    v.sort();
    v
}

#[test]
fn a_device_change_matters_before_the_first_pass_and_while_devices_are_claimed() {
    let (before, after) = (partitions(&[]), partitions(&["   7        3      8192 loop3"]));
    assert!(device_change_matters(&before, &after, None));
    assert!(!device_change_matters(&before, &before, None));
    let all = DeviceInterest { all: true, devices: BTreeSet::new() };
    assert!(device_change_matters(&before, &after, Some(&all)));
    assert!(!device_change_matters(&before, &before, Some(&all)));
}

#[test]
fn a_loop_device_of_someone_else_does_not_matter() {
    let (before, after) = (partitions(&[]), partitions(&["   7        3      8192 loop3"]));
    let none = DeviceInterest::default();
    assert!(!device_change_matters(&before, &after, Some(&none)), "attached");
    assert!(!device_change_matters(&after, &before, Some(&none)), "detached");
    let on_sdb = DeviceInterest { all: false, devices: BTreeSet::from(["8:16".to_string()]) };
    assert!(!device_change_matters(&before, &after, Some(&on_sdb)));
}

#[test]
fn a_device_a_volume_is_on_going_appearing_or_resized_matters() {
    let on_sdb = DeviceInterest { all: false, devices: BTreeSet::from(["8:16".to_string()]) };
    let without = vec!["major minor  #blocks  name".to_string(), "   8        0   10485760 sda".to_string()];
    assert!(device_change_matters(&partitions(&[]), &without, Some(&on_sdb)), "gone");
    assert!(device_change_matters(&without, &partitions(&[]), Some(&on_sdb)), "back");
    let mut resized = without.clone();
    resized.push("   8       16    2097152 sdb".to_string());
    resized.sort();
    assert!(device_change_matters(&partitions(&[]), &resized, Some(&on_sdb)), "resized");
}

#[test]
fn a_by_id_name_changing_matters_only_while_a_device_is_depended_on() {
    let before = partitions(&[]);
    let after = partitions(&["by-id wwn-0x5000"]);
    assert!(!device_change_matters(&before, &after, Some(&DeviceInterest::default())));
    let on_sdb = DeviceInterest { all: false, devices: BTreeSet::from(["8:16".to_string()]) };
    assert!(device_change_matters(&before, &after, Some(&on_sdb)));
}

#[test]
fn near_path_agrees_with_comparing_every_path() {
    // Every set of up to three paths from a pool of look-alikes (a shared prefix that is not a
    // component, nesting, the root), against every mount point from the same pool.
    let pool = ["/", "/a", "/a/b", "/a/b/c", "/a/bc", "/a/b-c", "/a-x", "/a-x/b", "/b", "/a/b/", "/ab/b"];
    let pool: Vec<PathBuf> = pool.iter().map(PathBuf::from).collect();
    for bits in 0u32..(1 << pool.len()) {
        if bits.count_ones() > 3 {
            continue;
        }
        let paths: BTreeSet<PathBuf> =
            (0..pool.len()).filter(|i| bits & (1 << i) != 0).map(|i| pool[i].clone()).collect();
        for m in &pool {
            let naive = paths.iter().any(|p| m.starts_with(p) || p.starts_with(m));
            assert_eq!(near_path(&paths, m), naive, "{m:?} near {paths:?}");
        }
    }
}

#[test]
fn the_table_is_read_unless_only_new_mounts_came_and_only_fresh_irrelevant_ones_went() {
    // Every listing before (none, or any subset of four mounts), every listing now, every set
    // of fresh irrelevant mounts.
    let subset = |bits: u32| -> Vec<u64> { (0..4u64).filter(|i| bits & (1 << i) != 0).collect() };
    for before_bits in 0..=16u32 {
        let before = (before_bits < 16).then(|| subset(before_bits));
        for now_bits in 0..16u32 {
            let now = subset(now_bits);
            for fresh_bits in 0..16u32 {
                let fresh: BTreeSet<u64> = subset(fresh_bits).into_iter().collect();
                let got = id_change(before.as_deref(), &now, &fresh);
                let case = format!("{before:?} -> {now:?}, fresh {fresh:?}: {got:?}");
                let Some(before) = &before else {
                    assert_eq!(got, IdChange::ReadTable, "{case}");
                    continue;
                };
                let gone: Vec<u64> = before.iter().copied().filter(|i| !now.contains(i)).collect();
                let came: Vec<u64> = now.iter().copied().filter(|i| !before.contains(i)).collect();
                if *before == now || gone.iter().any(|g| !fresh.contains(g)) {
                    // Only the table shows a remount, and a mount that went may have mattered.
                    assert_eq!(got, IdChange::ReadTable, "{case}");
                } else {
                    // Exactly the mounts that came are looked at.
                    assert_eq!(got, IdChange::LookAt(came), "{case}");
                }
            }
        }
    }
}

#[test]
fn a_new_mount_is_judged_by_the_same_rule_as_a_line_of_the_table() {
    // Each line of a table, judged alone with the table's near devices, as relevant_indices
    // judges it within the table: a mount that came later is held to the same rule.
    let interest = MountInterest {
        paths: ["/mnt/disks".into(), "/mnt/disks/a".into()].into(),
        devices: ["8:16".to_string()].into(),
        kubelet_dir: Some("/var/lib/kubelet".into()),
        block_devices: false,
    };
    let table: Vec<Line> = vec![
        ("0:30", "/", "/", "ext4", "/dev/vda"),
        ("0:40", "/", "/mnt/disks/a", "tmpfs", "a"),
        ("0:40", "/sub", "/var/lib/kubelet/pods/p/volumes/kubernetes.io~local-volume/pv", "tmpfs", "a"),
        ("8:16", "/", "/elsewhere", "ext4", "/dev/sdb"),
        ("0:50", "/", "/run/noise", "tmpfs", "noise"),
        ("0:51", "/", "/var/lib/kubelet", "tmpfs", "k"),
        ("0:52", "/", "/mnt", "tmpfs", "over"),
    ];
    let lines = lines(&table);
    for block_devices in [false, true] {
        let interest = MountInterest { block_devices, ..interest.clone() };
        let near = near_devices(&lines, &interest);
        let whole = relevant_indices(&lines, Some(&interest));
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(relevant_line(l, &interest, &near), whole.contains(&i), "{l:?} block {block_devices}");
        }
        assert!(!whole.contains(&4), "a tmpfs elsewhere is not relevant");
    }
}
