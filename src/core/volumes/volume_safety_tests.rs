use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

fn m<'a>(device: &'a str, root: &'a str, mount_point: &'a str, fs_type: &'a str) -> MountFacts<'a> {
    MountFacts { device, root: Path::new(root), mount_point: Path::new(mount_point), fs_type }
}

fn loc(device: &str, path: &str) -> Location {
    Location { device: device.into(), path: path.into() }
}

/// A host with its root filesystem on 8:1, /boot on 8:2, /dev as devtmpfs, a data disk at
/// /data, and the discovery directory /mnt/disks on the root filesystem.
fn host_mounts() -> Vec<MountFacts<'static>> {
    vec![
        m("8:1", "/", "/", "ext4"),
        m("8:2", "/", "/boot", "ext4"),
        m("0:5", "/", "/dev", "devtmpfs"),
        m("0:6", "/", "/dev/shm", "tmpfs"),
        m("0:4", "/", "/proc", "proc"),
        m("8:17", "/", "/data", "xfs"),
    ]
}

#[test]
fn locate_picks_the_deepest_mount_and_maps_through_bind_roots() {
    let mut mounts = host_mounts();
    mounts.push(m("8:17", "/vols/a", "/mnt/disks/a", "xfs"));
    assert_eq!(locate(&mounts, Path::new("/mnt/disks")), Some(loc("8:1", "/mnt/disks")));
    assert_eq!(locate(&mounts, Path::new("/")), Some(loc("8:1", "/")));
    assert_eq!(locate(&mounts, Path::new("/boot/grub")), Some(loc("8:2", "/grub")));
    assert_eq!(locate(&mounts, Path::new("/mnt/disks/a")), Some(loc("8:17", "/vols/a")));
    assert_eq!(locate(&mounts, Path::new("/mnt/disks/a/x/y")), Some(loc("8:17", "/vols/a/x/y")));
    // Component-wise: /data2 is not inside /data.
    assert_eq!(locate(&mounts, Path::new("/data2")), Some(loc("8:1", "/data2")));
    assert_eq!(locate(&[], Path::new("/x")), None);
}

#[test]
fn roots_that_resolve_to_system_directories_are_refused() {
    for bad in SYSTEM_DIRS.iter().chain(SENSITIVE_DIRS.iter()) {
        assert!(root_problem(Path::new(bad)).is_some(), "{bad}");
    }
    for bad in ["/proc/1/root", "/sys/fs/cgroup", "/etc/kubernetes", "/var/lib/kubelet/pods", "/dev/disk/by-id"] {
        assert!(root_problem(Path::new(bad)).is_some(), "{bad}");
    }
    for good in ["/mnt/disks", "/mnt/fast-disks", "/srv/local", "/var/local-disks", "/home/disks", "/tmp/x"] {
        assert_eq!(root_problem(Path::new(good)), None, "{good}");
    }
}

/// Under /dev only /dev/disk/<name>, for a name udev does not use.
const DEV_DIRS: [(&str, bool); 27] = [
    ("/dev/disk/kubernetes", true),
    ("/dev/disk/local-ssd", true),
    ("/dev/disk/kubernetes/nvme", true),
    ("/dev/disk/bypass", true),
    ("/dev", false),
    ("/dev/disk", false),
    ("/dev/disk/by-id", false),
    ("/dev/disk/by-path", false),
    ("/dev/disk/by-uuid", false),
    ("/dev/disk/by-label", false),
    ("/dev/disk/by-partuuid", false),
    ("/dev/disk/by-partlabel", false),
    ("/dev/disk/by-diskseq", false),
    ("/dev/disk/by-loop-ref", false),
    ("/dev/disk/by-loop-inode", false),
    ("/dev/disk/by-id/nvme-x", false),
    ("/dev/disk/.hidden", false),
    ("/dev/mapper", false),
    ("/dev/vg0", false),
    ("/dev/block", false),
    ("/dev/shm", false),
    ("/dev/pts", false),
    ("/dev/hugepages", false),
    ("/dev/kubernetes", false),
    ("/dev/disks/kubernetes", false),
    ("/devices/disk/kubernetes", false),
    ("/mnt/dev/disk/kubernetes", false),
];

#[test]
fn only_a_dedicated_directory_under_dev_disk_may_be_a_root_under_dev() {
    for (dir, dedicated) in DEV_DIRS {
        assert_eq!(dedicated_dev_dir(Path::new(dir)), dedicated, "{dir}");
        let under_dev = dir == "/dev" || dir.starts_with("/dev/");
        // Accepted exactly where dedicated; refused everywhere else under /dev, with the advice.
        let problem = root_problem(Path::new(dir));
        if dedicated {
            assert_eq!(problem, None, "{dir}");
        } else if under_dev {
            let p = problem.unwrap_or_else(|| panic!("{dir} accepted"));
            assert!(p.contains("/dev/disk/kubernetes") && p.contains("`devices` section"), "{dir}: {p}");
        }
    }
}

#[test]
fn a_dedicated_dev_directory_is_accepted_only_where_it_really_is_that_directory_of_the_devtmpfs() {
    let host_dir = Path::new("/dev/disk/kubernetes");
    let resolved = Path::new("/dev/disk/kubernetes");
    let cases = [
        // Seen through the host's /dev, or a bind of just that directory (the chart's hostPath).
        (m("0:5", "/", "/dev", "devtmpfs"), loc("0:5", "/disk/kubernetes"), true),
        (m("0:5", "/disk/kubernetes", "/dev/disk/kubernetes", "devtmpfs"), loc("0:5", "/disk/kubernetes"), true),
        // The whole of /dev bound there, or another part of it: refused.
        (m("0:5", "/", "/dev/disk/kubernetes", "devtmpfs"), loc("0:5", "/"), false),
        (m("0:5", "/disk/by-id", "/dev/disk/kubernetes", "devtmpfs"), loc("0:5", "/disk/by-id"), false),
        // Another kernel filesystem put there: refused.
        (m("0:9", "/", "/dev/disk/kubernetes", "sysfs"), loc("0:9", "/"), false),
        // The host root bound there: refused (it exposes the host root).
        (m("8:1", "/", "/dev/disk/kubernetes", "ext4"), loc("8:1", "/"), false),
        // A filesystem mounted there is one of the host's mounts under /dev: refused.
        (m("0:40", "/", "/dev/disk/kubernetes", "tmpfs"), loc("0:40", "/"), false),
    ];
    for (mount, location, ok) in cases {
        // The places as the scanner finds them, the mount there included.
        let mut mounts = host_mounts();
        if mount.mount_point != Path::new("/dev") {
            mounts.push(mount);
        }
        let places = places(&mounts, &[]);
        let problem = root_source_problem(&mount, &location, host_dir, &places, Some(resolved));
        assert_eq!(problem.is_none(), ok, "{mount:?} {location:?}: {problem:?}");
    }
    // Not dedicated (a by-* directory): the host's devtmpfs is refused.
    let (mount, places) = (m("0:5", "/", "/dev", "devtmpfs"), places(&host_mounts(), &[]));
    assert!(root_source_problem(&mount, &loc("0:5", "/disk/kubernetes"), host_dir, &places, None).is_some());
}

fn root(class: &str, resolved: &str, dev_ino: (u64, u64), location: Option<Location>) -> RootFacts {
    RootFacts { class: class.into(), resolved: resolved.into(), dev_ino, location }
}

#[test]
fn classes_sharing_or_nesting_a_root_are_all_refused() {
    // Every way two roots can be one directory or nest, and the unrelated case.
    let cases: Vec<(RootFacts, RootFacts, bool)> = vec![
        (root("a", "/mnt/x", (1, 2), None), root("b", "/mnt/x", (1, 2), None), true),
        // Same inode through two bind mounts: different paths.
        (root("a", "/mnt/x", (1, 2), None), root("b", "/srv/y", (1, 2), None), true),
        (
            root("a", "/mnt/x", (1, 2), Some(loc("8:1", "/d"))),
            root("b", "/srv/y", (1, 3), Some(loc("8:1", "/d"))),
            true,
        ),
        (root("a", "/mnt/x", (1, 2), None), root("b", "/mnt/x/sub", (1, 3), None), true),
        // Nested through a bind mount of a parent.
        (
            root("a", "/mnt/x", (1, 2), Some(loc("8:1", "/d"))),
            root("b", "/srv/y", (1, 3), Some(loc("8:1", "/d/e"))),
            true,
        ),
        (
            root("a", "/mnt/x", (1, 2), Some(loc("8:1", "/d"))),
            root("b", "/mnt/y", (1, 3), Some(loc("8:1", "/e"))),
            false,
        ),
        (root("a", "/mnt/x", (1, 2), None), root("b", "/mnt/xy", (1, 3), None), false),
        (
            root("a", "/mnt/x", (1, 2), Some(loc("8:1", "/d"))),
            root("b", "/mnt/y", (1, 3), Some(loc("8:2", "/d"))),
            false,
        ),
    ];
    for (a, b, shared) in cases {
        let problems = shared_roots(&[a.clone(), b.clone()]);
        let expected: Vec<&str> = if shared { vec!["a", "b"] } else { vec![] };
        assert_eq!(problems.keys().map(String::as_str).collect::<Vec<_>>(), expected, "{a:?} {b:?}");
        // Order of the classes does not matter.
        assert_eq!(shared_roots(&[b, a]).len(), problems.len());
    }
    assert!(shared_roots(&[root("a", "/mnt/x", (1, 2), None)]).is_empty());
}

/// The pairwise definition `shared_roots` must agree with: every class against every other,
/// the first conflicting class in order naming the problem.
fn shared_roots_pairwise(roots: &[RootFacts]) -> BTreeMap<String, String> {
    let mut problems = BTreeMap::new();
    for a in roots {
        for b in roots {
            if let Some(p) = root_pair_problem(a, b) {
                problems.entry(a.class.clone()).or_insert(p);
            }
        }
    }
    problems
}

#[test]
fn shared_roots_compares_paths_by_component_and_names_the_first_conflict() {
    let roots = [
        root("a", "/mnt/disk2", (1, 1), None),
        root("b", "/mnt/disk", (1, 2), None),
        root("c", "/mnt/disk/", (1, 3), None),
        root("d", "/mnt/disk/x/y", (1, 4), None),
        root("e", "/mnt/dis", (1, 5), None),
        root("f", "/mnt//disk3/./", (1, 6), None),
        root("g", "/mnt/disk3", (1, 7), None),
        root("h", "/srv/h", (1, 2), None),
    ];
    let problems = shared_roots(&roots);
    let expected: BTreeMap<String, String> = [
        ("b", "its discovery directory is the same directory as class \"c\"'s"),
        ("c", "its discovery directory is the same directory as class \"b\"'s"),
        ("d", "its discovery directory and class \"b\"'s are nested"),
        ("f", "its discovery directory is the same directory as class \"g\"'s"),
        ("g", "its discovery directory is the same directory as class \"f\"'s"),
        ("h", "its discovery directory is the same directory as class \"b\"'s"),
    ]
    .into_iter()
    .map(|(c, p)| (c.to_string(), p.to_string()))
    .collect();
    assert_eq!(problems, expected);
    assert_eq!(shared_roots_pairwise(&roots), expected);
}

#[test]
fn shared_roots_agrees_with_the_pairwise_definition() {
    // Small alphabets so that equal, nested, sibling and common-string-prefix paths, shared
    // inodes and shared locations all occur often.
    let names = ["a", "ab", "b", "a.b", "a b"];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % bound
    };
    let mut conflicts = 0;
    for round in 0..400 {
        let n = 1 + next(24) as usize;
        let mut roots = Vec::new();
        for i in 0..n {
            let mut path = String::from("/");
            for _ in 0..next(4) {
                path.push_str(names[next(names.len() as u64) as usize]);
                path.push_str(["/", "//", "/./"][next(3) as usize]);
            }
            if next(2) == 0 && path.len() > 1 {
                path.pop();
            }
            let location = match next(3) {
                0 => None,
                _ => {
                    let mut p = String::from("/");
                    for _ in 0..next(3) {
                        p.push_str(names[next(2) as usize]);
                        p.push('/');
                    }
                    Some(loc(["8:1", "8:2"][next(2) as usize], &p))
                }
            };
            roots.push(root(&format!("c{i}"), &path, (1, next(3 * n as u64)), location));
        }
        let expected = shared_roots_pairwise(&roots);
        conflicts += expected.len();
        assert_eq!(shared_roots(&roots), expected, "round {round}: {roots:?}");
    }
    // The generator must actually produce conflicts and non-conflicts for this to mean anything.
    assert!(conflicts > 400, "{conflicts}");
}

#[test]
fn shared_roots_scales_past_thousands_of_classes() {
    // Correctness at scale, not speed: 5000 sibling roots, one nested pair and one duplicate.
    let mut roots: Vec<RootFacts> =
        (0..5000).map(|i| root(&format!("c{i:04}"), &format!("/mnt/disk{i}"), (1, i), None)).collect();
    roots.push(root("d-nested", "/mnt/disk17/inner", (2, 1), None));
    roots.push(root("d-same", "/mnt/disk42/", (2, 2), None));
    let problems = shared_roots(&roots);
    assert_eq!(problems.keys().collect::<Vec<_>>(), ["c0017", "c0042", "d-nested", "d-same"]);
    assert_eq!(problems["d-nested"], "its discovery directory and class \"c0017\"'s are nested");
}

#[test]
fn host_anchors_follow_where_the_discovery_directory_lives() {
    let a = |host: &str, l: Location| host_anchor(Path::new(host), &l).map(|a| a.host_prefix);
    assert_eq!(a("/mnt/disks", loc("8:1", "/mnt/disks")), Some(PathBuf::from("/")));
    assert_eq!(a("/mnt/disks", loc("8:3", "/disks")), Some(PathBuf::from("/mnt")));
    assert_eq!(a("/mnt/disks", loc("8:3", "/")), Some(PathBuf::from("/mnt/disks")));
    assert_eq!(a("/mnt/disks", loc("8:3", "/other")), None);
    assert_eq!(a("/mnt/disks", loc("8:3", "/a/mnt/disks")), None);
}

/// Protected places as the scanner builds them on `host_mounts()` with one discovery root.
fn places(mounts: &[MountFacts<'_>], discovery: &[&str]) -> Vec<ProtectedPlace> {
    let mut out = Vec::new();
    for dir in SYSTEM_DIRS {
        if let Some(location) = locate(mounts, Path::new(dir)) {
            out.push(ProtectedPlace {
                what: format!("the system directory {dir}"),
                location,
                no_volume_inside: SENSITIVE_DIRS.contains(&dir),
            });
        }
    }
    out.extend(host_area_places(mounts));
    for dir in discovery {
        out.push(ProtectedPlace {
            what: format!("the discovery directory {dir}"),
            location: locate(mounts, Path::new(dir)).unwrap(),
            no_volume_inside: false,
        });
    }
    out
}

#[test]
fn mounts_exposing_the_host_are_refused_by_source_not_by_name() {
    let mounts = host_mounts();
    let places = places(&mounts, &["/mnt/disks"]);
    let anchors = vec![host_anchor(Path::new("/mnt/disks"), &loc("8:1", "/mnt/disks")).unwrap()];
    let host_dirs = vec![PathBuf::from("/mnt/disks")];
    let check = |v: MountFacts<'_>| exposure(&v, &places, &anchors, &host_dirs);
    let refused = [
        m("8:1", "/", "/mnt/disks/root", "ext4"),            // bind of /
        m("8:1", "/mnt", "/mnt/disks/parent", "ext4"),       // bind of a parent of the discovery dir
        m("8:1", "/mnt/disks", "/mnt/disks/self", "ext4"),   // bind of the discovery dir itself
        m("8:1", "/etc", "/mnt/disks/etc", "ext4"),          // a system directory
        m("8:1", "/etc/kubernetes", "/mnt/disks/k", "ext4"), // inside a sensitive directory
        m("8:1", "/var", "/mnt/disks/var", "ext4"),          // contains /var/lib/kubelet
        m("8:1", "/var/lib/kubelet/pods", "/mnt/disks/p", "ext4"),
        m("8:2", "/", "/mnt/disks/boot", "ext4"),    // the /boot filesystem
        m("0:5", "/", "/mnt/disks/dev", "devtmpfs"), // by type, and it contains /dev
        m("0:6", "/", "/mnt/disks/shm", "tmpfs"),    // the host's /dev/shm
        m("0:4", "/", "/mnt/disks/proc", "proc"),
        m("0:9", "/", "/mnt/disks/sys", "sysfs"),
        m("0:10", "/", "/mnt/disks/ovl", "overlay"),
    ];
    for v in refused {
        assert!(check(v).is_some(), "{v:?} must be refused");
    }
    let allowed = [
        m("0:50", "/", "/mnt/disks/vol1", "tmpfs"),        // a tmpfs of its own
        m("8:17", "/vols/a", "/mnt/disks/a", "xfs"),       // a directory of a shared disk
        m("8:17", "/", "/mnt/disks/whole", "xfs"),         // the data disk (also at /data)
        m("8:33", "/", "/mnt/disks/ssd", "ext4"),          // a disk mounted only here
        m("8:1", "/srv/vols/v1", "/mnt/disks/v1", "ext4"), // root filesystem directory bound in
        m("8:1", "/mnt/fs-disk/v2", "/mnt/disks/v2", "ext4"),
    ];
    for v in allowed {
        assert_eq!(check(v), None, "{v:?} must be allowed");
    }
}

#[test]
fn in_a_container_the_host_paths_come_from_the_anchor() {
    // The agent's own / is an overlay; the host's root filesystem (8:1) is visible only as the
    // hostPath mount of the discovery directory.
    let mounts = vec![
        m("0:60", "/", "/", "overlay"),
        m("8:1", "/mnt/disks", "/mnt/disks", "ext4"),
        m("0:5", "/", "/dev", "devtmpfs"),
    ];
    let places = places(&mounts, &["/mnt/disks"]);
    let anchor = host_anchor(Path::new("/mnt/disks"), &locate(&mounts, Path::new("/mnt/disks")).unwrap()).unwrap();
    let host_dirs = vec![PathBuf::from("/mnt/disks")];
    let check = |root: &str| {
        exposure(&m("8:1", root, "/mnt/disks/e", "ext4"), &places, std::slice::from_ref(&anchor), &host_dirs)
    };
    for bad in ["/", "/etc", "/etc/ssl", "/var/lib/kubelet", "/root", "/usr/bin", "/var/log/pods", "/mnt"] {
        assert!(check(bad).is_some(), "{bad}");
    }
    for good in ["/srv/v1", "/mnt/other/v", "/data/v"] {
        assert_eq!(check(good), None, "{good}");
    }
}

#[test]
fn disk_keys_overlap_exactly_when_data_is_shared() {
    let fs = |d: &str, r: &str| DiskKey::fs(d, r);
    let blk = |d: &str| DiskKey::block(d);
    let keys =
        [fs("8:1", "/"), fs("8:1", "/a"), fs("8:1", "/a/b"), fs("8:1", "/ab"), fs("8:2", "/a"), blk("8:1"), blk("8:2")];
    // Expected overlap table, row by row (symmetric).
    let expected = [
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 0, 0, 1, 0, 1, 0],
        [0, 0, 0, 0, 1, 0, 1],
        [1, 1, 1, 1, 0, 1, 0],
        [0, 0, 0, 0, 1, 0, 1],
    ];
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate() {
            assert_eq!(a.overlaps(b), expected[i][j] == 1, "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn a_wipe_never_hits_a_disk_another_live_pv_names() {
    let fs = |r: &str| DiskKey::fs("0:50", r);
    let other = |name: &str, phase: &str, deleting: bool, disk: DiskKey| PublishedDisk {
        name: name.into(),
        phase: phase.into(),
        deleting,
        disk,
    };
    for phase in ["Bound", "Available", "Pending", ""] {
        for (disk, hits) in [(fs("/"), true), (fs("/sub"), true), (fs("/other"), false)] {
            let others = [other("pv-b", phase, false, disk.clone())];
            let got = wipe_would_hit_another_pv("pv-a", &fs("/sub"), &others);
            assert_eq!(got.is_some(), hits, "{phase} {disk:?}");
            if hits {
                assert!(got.unwrap().contains("also published as PV pv-b"));
            }
        }
        // Being deleted changes nothing while the PV is still Bound (pv-protection keeps it).
        let deleting = [other("pv-b", phase, true, fs("/"))];
        assert!(wipe_would_hit_another_pv("pv-a", &fs("/"), &deleting).is_some(), "{phase} and deleting");
    }
    for phase in ["Released", "Failed"] {
        assert_eq!(wipe_would_hit_another_pv("pv-a", &fs("/"), &[other("pv-b", phase, false, fs("/"))]), None);
    }
    // The PV itself is not "another" PV.
    assert_eq!(wipe_would_hit_another_pv("pv-a", &fs("/"), &[other("pv-a", "Bound", false, fs("/"))]), None);
}

#[test]
fn extents_make_partitions_loops_and_backing_files_one_disk() {
    let ext = |base: &str, start: u64, end: u64| Extent { base: base.into(), start, end, file: None };
    let disk = DiskKey::block("7:0").with_extent(Some(ext("dev:7:0", 0, 100)));
    let p1 = DiskKey::block("259:0").with_extent(Some(ext("dev:7:0", 10, 50)));
    let p2 = DiskKey::block("259:1").with_extent(Some(ext("dev:7:0", 50, 100)));
    let other = DiskKey::block("7:1").with_extent(Some(ext("dev:7:1", 0, 100)));
    // A filesystem on a partition, mounted: its device is the partition's.
    let fs_on_p1 = DiskKey::fs("259:0", "/").with_extent(Some(ext("dev:7:0", 10, 50)));
    // Two loop devices over one image, and a loop over a file that lives in a tmpfs volume.
    let loop_a = DiskKey::block("7:2").with_extent(Some(ext("file:0:50:12", 0, 100)));
    let loop_b = DiskKey::block("7:3").with_extent(Some(ext("file:0:50:12", 0, 100)));
    let loop_tail = DiskKey::block("7:4").with_extent(Some(ext("file:0:50:12", 100, 200)));
    let in_volume = DiskKey::block("7:5").with_extent(Some(Extent {
        base: "file:0:50:13".into(),
        start: 0,
        end: 10,
        file: Some(loc("0:50", "/vol/disk.img")),
    }));
    let volume = DiskKey::fs("0:50", "/vol");
    let elsewhere = DiskKey::fs("0:50", "/other");
    let cases = [
        (&disk, &p1, true),
        (&disk, &p2, true),
        (&p1, &p2, false),
        (&disk, &other, false),
        (&fs_on_p1, &p1, true),
        (&fs_on_p1, &disk, true),
        (&fs_on_p1, &p2, false),
        (&loop_a, &loop_b, true),
        (&loop_a, &loop_tail, false),
        (&in_volume, &volume, true),
        (&in_volume, &elsewhere, false),
        (&in_volume, &loop_a, false),
    ];
    for (a, b, shared) in cases {
        assert_eq!(a.overlaps(b), shared, "{a:?} vs {b:?}");
        assert_eq!(b.overlaps(a), shared, "symmetric: {b:?} vs {a:?}");
        if shared {
            assert!(a.tokens().iter().any(|t| b.tokens().contains(t)), "overlapping keys share a token: {a:?} {b:?}");
        }
    }
}

/// Every combination of where a mount is (inside kubelet's directory, at it, beside it with a
/// shared name prefix, elsewhere), which device it is on, how its root relates to the volume's,
/// and whether it is a bind-mounted device node, for both kinds of volume: kubelet still holds
/// the volume exactly when the mount is strictly inside kubelet's directory and is the volume's
/// filesystem with an overlapping root, or a filesystem on / a node of the volume's device.
#[test]
fn kubelet_mount_of_finds_exactly_the_pod_mounts_of_the_volume() {
    let kubelet = Path::new("/var/lib/kubelet");
    let places = [
        ("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/pv1", true),
        ("/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv1/u1", true),
        ("/var/lib/kubelet/pods/u1/volume-subpaths/pv1/app/0", true),
        ("/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv1", true),
        ("/var/lib/kubelet", false),
        ("/var/lib/kubelet-other/pods/u1", false),
        ("/var/lib/kubeletx", false),
        ("/mnt/disks/vol1", false),
        ("/", false),
    ];
    let roots = ["/", "/vols/a", "/vols/a/sub", "/vols", "/vols/b", "/vols/ab", "/other"];
    let devices = ["8:17", "8:18", "0:5"];
    let nodes = [None, Some("8:17"), Some("8:18")];
    let subjects = [
        WipeSubject::Filesystem { device: "8:17", root: Path::new("/") },
        WipeSubject::Filesystem { device: "8:17", root: Path::new("/vols/a") },
        WipeSubject::Device { rdev: "8:17" },
    ];
    // The rule restated over strings: a directory "contains" another when it is equal to it
    // or its text with a trailing slash is a prefix of the other's.
    let within = |inner: &str, outer: &str| {
        inner == outer || outer == "/" || inner.starts_with(&format!("{}/", outer.trim_end_matches('/')))
    };
    let mut held = 0;
    for subject in subjects {
        for (place, inside) in places {
            for root in roots {
                for device in devices {
                    for node in nodes {
                        let mounts = [KubeletMount {
                            mount: MountFacts {
                                device,
                                root: Path::new(root),
                                mount_point: Path::new(place),
                                fs_type: "ext4",
                            },
                            node_rdev: node,
                        }];
                        let expected = inside
                            && match subject {
                                WipeSubject::Filesystem { device: d, root: r } => {
                                    let r = r.to_str().unwrap();
                                    device == d && (within(root, r) || within(r, root))
                                }
                                WipeSubject::Device { rdev } => device == rdev || node == Some(rdev),
                            };
                        let found = kubelet_mount_of(subject, &mounts, kubelet);
                        assert_eq!(
                            found.is_some(),
                            expected,
                            "{subject:?} against {device} {root} at {place} (node {node:?})"
                        );
                        if let Some(p) = found {
                            assert_eq!(p, Path::new(place));
                            held += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(held > 0, "some combination must be held");
}

/// Among many mounts, the one kubelet holds is found whatever its position, and a table with
/// only other volumes' pod mounts holds nothing.
#[test]
fn kubelet_mount_of_looks_at_every_mount() {
    let kubelet = Path::new("/var/lib/kubelet");
    let pod = |device, point| KubeletMount {
        mount: MountFacts { device, root: Path::new("/"), mount_point: Path::new(point), fs_type: "xfs" },
        node_rdev: None,
    };
    let others: Vec<_> = (0..5).map(|_| pod("8:33", "/var/lib/kubelet/pods/u2/volumes/x/pv2")).collect();
    let subject = WipeSubject::Filesystem { device: "8:17", root: Path::new("/") };
    assert_eq!(kubelet_mount_of(subject, &others, kubelet), None);
    for at in 0..=others.len() {
        let mut mounts = others.clone();
        mounts.insert(at, pod("8:17", "/var/lib/kubelet/pods/u1/volumes/x/pv1"));
        assert_eq!(
            kubelet_mount_of(subject, &mounts, kubelet),
            Some(Path::new("/var/lib/kubelet/pods/u1/volumes/x/pv1"))
        );
    }
}

/// kubelet's mounts in a directory show only through a mount from the host that holds it: the
/// whole kubelet directory or the directory itself (deploy/), or anything above them other than
/// the container's root filesystem; never through `/` (an image's own directory, or the parent
/// the runtime made for a narrower mount), nor through a mount whose directory was removed on
/// the host, nor in a table that holds nothing.
#[test]
fn kubelet_mounts_show_only_through_a_live_mount_from_the_host() {
    let pods = Path::new("/var/lib/kubelet/pods");
    let rootfs = m("0:30", "/", "/", "overlay");
    let cases: [(&[MountFacts<'_>], &Path, bool); 11] = [
        (&[], pods, false),
        (&[rootfs], pods, false),
        (&[rootfs, m("8:1", "/var/lib/kubelet", "/var/lib/kubelet", "ext4")], pods, true),
        (&[rootfs, m("8:1", "/var/lib/kubelet/pods", "/var/lib/kubelet/pods", "ext4")], pods, true),
        (&[rootfs, m("8:1", "/var/lib", "/var/lib", "ext4")], pods, true),
        // A narrower mount beside it: the directory itself is still the image's.
        (&[rootfs, m("8:1", "/k/plugins/x", "/var/lib/kubelet/plugins/x", "ext4")], pods, false),
        // Not made by kubelet yet: its parent must be on a mount from the host.
        (
            &[rootfs, m("8:1", "/var/lib/kubelet", "/var/lib/kubelet", "ext4")],
            Path::new("/var/lib/kubelet/plugins"),
            true,
        ),
        (
            &[rootfs, m("8:1", "/var/lib/kubelet/pods", "/var/lib/kubelet/pods", "ext4")],
            Path::new("/var/lib/kubelet/plugins"),
            false,
        ),
        // Removed on the host and made again: nothing kubelet mounts now reaches the container.
        (&[rootfs, m("8:1", "/var/lib/kubelet/pods//deleted", "/var/lib/kubelet/pods", "ext4")], pods, false),
        (&[rootfs, m("8:1", "/var/lib/kubelet//deleted", "/var/lib/kubelet", "ext4")], pods, false),
        // A directory that is merely called so is not a removed one.
        (&[rootfs, m("8:1", "/srv/deleted", "/var/lib/kubelet/pods", "ext4")], pods, true),
    ];
    for (mounts, nearest, visible) in cases {
        assert_eq!(kubelet_mounts_visible(nearest, mounts), visible, "{} in {mounts:?}", nearest.display());
    }
}
