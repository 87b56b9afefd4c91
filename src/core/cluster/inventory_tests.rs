use super::*;

/// A loop device's backing file, and a later file at the same inode (born later).
const LOOP_1: &str = "v2;blk;disk=loop:7:0:5@0;backing=7:0;born=1000;size=1048576;dev=7:3";
const LOOP_2: &str = "v2;blk;disk=loop:7:0:5@0;backing=7:0;born=2000;size=1048576;dev=7:3";
const DISK_A: &str = "v2;blk;disk=wwid:0x5000a;size=1073741824;dev=8:16";
const DISK_A_ELSEWHERE: &str = "v2;blk;disk=wwid:0x5000a;size=1073741824;dev=8:48";
const DISK_A_PART: &str = "v2;blk;disk=wwid:0x5000a/part1@2048;size=536870912;dev=8:17";
const DISK_A_FS: &str = "v2;fs;disk=wwid:0x5000a;uuid=1111;ino=2;dev=8:16";
const DISK_B: &str = "v2;blk;disk=wwid:0x5000b;size=1073741824;dev=8:32";
const NUMBERS_ONLY: &str = "v2;blk;size=1073741824;dev=8:16";
const TMPFS: &str = "v2;fs;fsid=ab;volatile=tmpfs;ino=1;dev=0:40";

fn record(identity: &str, uid: &str) -> UsedDiskRecord {
    UsedDiskRecord {
        identity: identity.into(),
        pv: format!("local-pv-{uid}"),
        uid: Some(uid.into()),
        path: "/mnt/disks/a".into(),
        at: "2026-11-28T10:00:00Z".into(),
        claimed: true,
        offered: false,
    }
}

fn mark(identity: &str, uid: Option<&str>) -> UsedMark {
    UsedMark {
        pv: "local-pv-1".into(),
        node: "a".into(),
        path: "/mnt/disks/a".into(),
        identity: identity.into(),
        at: "2026-11-28T10:00:00Z".into(),
        uid: uid.map(String::from),
        root: None,
        claimed: false,
        wiped_filesystems: Vec::new(),
    }
}

fn pv(name: &str, class: &str, phase: &str, bytes: u64) -> PvInput {
    PvInput {
        name: name.into(),
        class: class.into(),
        host_path: format!("/mnt/{class}/{name}"),
        phase: phase.into(),
        capacity_bytes: Some(bytes),
        ..Default::default()
    }
}

fn verdict(class: &str, verdict: &str) -> DeviceVerdict {
    DeviceVerdict { class: class.into(), verdict: verdict.into(), reason: None, message: verdict.into() }
}

fn device(name: &str, verdicts: Vec<DeviceVerdict>) -> DeviceInventory {
    DeviceInventory {
        name: name.into(),
        dev: "8:16".into(),
        size: 1 << 30,
        content: "blank".into(),
        classes: verdicts,
        ..Default::default()
    }
}

#[test]
fn the_cluster_records_witness_a_disk_only_when_they_name_that_very_device_on_another_node() {
    let none = BTreeSet::new();
    let superseded: BTreeSet<String> = ["u-old".to_string()].into();
    let offered = UsedDiskRecord { offered: true, claimed: false, ..record(DISK_A, "u-off") };
    // (case, records of node "a", found on node, identity found, superseded, the UIDs that
    // count: named, not offered, not superseded)
    type Case<'a> = (&'a str, Vec<UsedDiskRecord>, &'a str, &'a str, &'a BTreeSet<String>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        ("the same device under another number", vec![record(DISK_A, "u1")], "b", DISK_A_ELSEWHERE, &none, vec!["u1"]),
        ("the same device", vec![record(DISK_A, "u1")], "b", DISK_A, &none, vec!["u1"]),
        ("a filesystem made on it since", vec![record(DISK_A, "u1")], "b", DISK_A_FS, &none, vec!["u1"]),
        ("one of its partitions", vec![record(DISK_A, "u1")], "b", DISK_A_PART, &none, vec!["u1"]),
        ("a record of a partition", vec![record(DISK_A_PART, "u1")], "b", DISK_A, &none, vec!["u1"]),
        ("another device", vec![record(DISK_A, "u1")], "b", DISK_B, &none, vec![]),
        ("a device named by numbers only", vec![record(DISK_A, "u1")], "b", NUMBERS_ONLY, &none, vec![]),
        ("a tmpfs", vec![record(DISK_A, "u1")], "b", TMPFS, &none, vec![]),
        ("a record by numbers only", vec![record(NUMBERS_ONLY, "u1")], "b", NUMBERS_ONLY, &none, vec![]),
        ("this node's own record (its ledger has it)", vec![record(DISK_A, "u1")], "a", DISK_A, &none, vec![]),
        ("a record this node wiped since", vec![record(DISK_A, "u-old")], "b", DISK_A, &superseded, vec![]),
        (
            "wiped, but a newer record too",
            vec![record(DISK_A, "u-old"), record(DISK_A, "u2")],
            "b",
            DISK_A,
            &superseded,
            vec!["u2"],
        ),
        ("offered only", vec![offered.clone()], "b", DISK_A, &none, vec![]),
        ("offered, and used later", vec![offered, record(DISK_A, "u3")], "b", DISK_A, &none, vec!["u3"]),
        ("no records", vec![], "b", DISK_A, &none, vec![]),
        ("a loop file born again at its inode", vec![record(LOOP_1, "u4")], "b", LOOP_2, &none, vec![]),
        ("the same loop file", vec![record(LOOP_1, "u5")], "b", LOOP_1, &none, vec!["u5"]),
    ];
    for (case, records, node, found, superseded, want) in cases {
        let got = record_witnesses([("a", records.as_slice())], superseded, &BTreeSet::new(), node, found);
        assert!(got.iter().all(|w| w.node == "a"), "{case}: a witness names the node that recorded it");
        let counted: Vec<&str> =
            got.iter().filter(|w| !w.offered && !w.superseded).filter_map(|w| w.uid.as_deref()).collect();
        assert_eq!(counted, want, "{case}: {got:?}");
    }
}

#[test]
fn records_of_several_nodes_are_all_consulted_and_an_operator_release_is_read_by_uid_or_pv() {
    let a = vec![record(DISK_B, "ua")];
    let c = vec![record(DISK_A, "uc"), UsedDiskRecord { pv: "pv-d".into(), ..record(DISK_A, "ud") }];
    let released: BTreeSet<String> = ["uc".to_string(), "pv-d".to_string()].into();
    let none = BTreeSet::new();
    let got = record_witnesses([("a", a.as_slice()), ("c", c.as_slice())], &none, &none, "b", DISK_A);
    assert_eq!(
        got.iter().map(|w| (w.node.as_str(), w.uid.as_deref())).collect::<Vec<_>>(),
        [("c", Some("uc")), ("c", Some("ud"))]
    );
    assert!(got.iter().all(|w| !w.released_by_operator));
    let got = record_witnesses([("c", c.as_slice())], &none, &released, "b", DISK_A);
    assert!(got.iter().all(|w| w.released_by_operator), "{got:?}");
}

#[test]
fn only_portable_block_marks_go_into_the_cluster_copy() {
    let cases = [
        (DISK_A, true),
        (DISK_A_PART, true),
        (DISK_A_FS, false),
        (NUMBERS_ONLY, false),
        (TMPFS, false),
        ("blk:wwid=0x5000a;size=1", false),
        ("v2;blk;disk=loop:254:0:99@0;backing=254:0;size=4096;dev=7:0", true),
    ];
    for (identity, want) in cases {
        assert_eq!(is_portable_block_mark(&mark(identity, None)), want, "{identity}");
    }
    let ledger = vec![
        (mark(DISK_B, Some("u2")), false),
        (mark(DISK_A_FS, Some("u9")), false),
        (mark(DISK_A, Some("u1")), true),
        (mark(DISK_A, Some("u1")), true),
    ];
    let records = own_records(ledger);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].identity, DISK_A);
    assert!(records[0].offered);
    assert_eq!(records[1].identity, DISK_B);
}

#[test]
fn a_lost_ledger_gets_back_what_the_copy_recorded_and_nothing_else() {
    let copy = vec![record(DISK_A, "u1"), record(DISK_B, "u2")];
    let mut kept = mark(DISK_B, Some("u2"));
    kept.pv = "local-pv-u2".into();
    let missing = missing_from_ledger(&copy, &[kept], "a");
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].identity, DISK_A);
    assert_eq!(missing[0].node, "a");
    assert_eq!(missing[0].uid.as_deref(), Some("u1"));
    assert!(missing[0].claimed);
    assert!(missing_from_ledger(&copy, &[], "a").len() == 2);
    assert!(missing_from_ledger(&[], &[mark(DISK_A, None)], "a").is_empty());
}

#[test]
fn superseded_uids_are_kept_only_while_a_record_names_them() {
    let mut superseded: BTreeSet<String> = ["u1".into(), "u2".into()].into();
    assert!(!prune_superseded(&mut superseded, &["u1".into(), "u2".into(), "u3".into()].into()));
    assert!(prune_superseded(&mut superseded, &["u2".into()].into()));
    assert_eq!(superseded, ["u2".to_string()].into());
    assert!(prune_superseded(&mut superseded, &BTreeSet::new()));
    assert!(superseded.is_empty());
}

fn inputs() -> Inputs {
    Inputs {
        node: "node-a".into(),
        version: "1.0.0 (abc)".into(),
        classes: vec![
            ClassInput {
                name: "fast".into(),
                host_dir: "/mnt/fast".into(),
                volume_mode: "Filesystem".into(),
                claims_devices: false,
            },
            ClassInput {
                name: "raw".into(),
                host_dir: "/mnt/raw".into(),
                volume_mode: "Block".into(),
                claims_devices: true,
            },
        ],
        pvs: vec![
            pv("p1", "fast", "Available", 1 << 30),
            pv("p2", "fast", "Bound", 1 << 30),
            pv("p3", "raw", "Available", 3 << 30),
        ],
        entries: vec![
            EntryInput {
                class: "fast".into(),
                host_path: "/mnt/fast/p1".into(),
                capacity_bytes: Some(1 << 30),
                ..Default::default()
            },
            EntryInput {
                class: "fast".into(),
                host_path: "/mnt/fast/new".into(),
                capacity_bytes: Some(1 << 20),
                ..Default::default()
            },
        ],
        devices: vec![(device("sdb", vec![verdict("raw", "Claimed")]), vec![false]), (device("sda", vec![]), vec![])],
        ..Default::default()
    }
}

#[test]
fn the_summary_counts_volumes_available_capacity_and_claimed_disks() {
    let s = build(inputs());
    assert_eq!(s.node_name, "node-a");
    assert_eq!(
        s.summary,
        Summary {
            disks: 2,
            claimed: 1,
            volumes: 3,
            available: 2,
            available_bytes: 4 << 30,
            available_capacity: "4 GiB".into(),
            problems: 0,
        }
    );
    assert!(s.agent.config_valid);
    let fast = &s.classes[0];
    assert_eq!((fast.name.as_str(), fast.volumes, fast.available, fast.available_bytes), ("fast", 2, 1, 1 << 30));
    let raw = &s.classes[1];
    assert_eq!((raw.volume_mode.as_str(), raw.claims_devices, raw.available_bytes), ("Block", true, 3 << 30));
    assert_eq!(s.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["sda", "sdb"]);
    // The entry with a PV is one line; the new one is listed unpublished, without a problem.
    assert_eq!(s.volumes.len(), 4);
    let new = s.volumes.iter().find(|v| v.path == "/mnt/fast/new").expect("new entry");
    assert_eq!((new.pv.as_deref(), new.phase.as_str(), new.message.as_deref()), (None, "Unpublished", None));
}

#[test]
fn a_deleting_pv_and_a_pv_of_a_class_no_longer_configured_are_counted_but_not_available() {
    let mut i = inputs();
    i.pvs[0].deleting = true;
    i.pvs.push(pv("gone", "old-class", "Available", 1 << 30));
    let s = build(i);
    assert_eq!((s.summary.volumes, s.summary.available, s.summary.available_bytes), (4, 2, 4 << 30));
    let old = s.classes.iter().find(|c| c.name == "old-class").expect("class of a PV is listed");
    assert_eq!((old.volumes, old.available, old.host_dir.as_str()), (1, 1, ""));
    let p1 = s.volumes.iter().find(|v| v.pv.as_deref() == Some("p1")).expect("p1");
    assert_eq!(p1.flags, ["deleting"]);
    assert_eq!(s.summary.problems, 0, "a PV being deleted is no problem");
}

#[test]
fn flags_and_refusals_are_problems() {
    // (case, change, problems)
    type Change = fn(&mut Inputs);
    let cases: Vec<(&str, Change, u32)> = vec![
        ("nothing", |_| {}, 0),
        ("invalid config", |i| i.config_problem = Some("bad yaml".into()), 1),
        ("missing", |i| i.pvs[0].missing = true, 1),
        ("stale", |i| i.pvs[0].stale = true, 1),
        ("moved", |i| i.pvs[0].moved_to = Some("/mnt/fast/x".into()), 1),
        ("failing", |i| i.pvs[1].failing = Some("I/O errors".into()), 1),
        (
            "two flags on one PV",
            |i| {
                i.pvs[1].missing = true;
                i.pvs[1].stale = true;
            },
            1,
        ),
        (
            "unresponsive entry of a PV",
            |i| {
                i.entries[0].unresponsive = true;
                i.entries[0].refused = Some(("unresponsive".into(), "statfs timed out".into()));
            },
            1,
        ),
        (
            "refused entry an operator must fix",
            |i| {
                i.entries[1].refused = Some(("symlink".into(), "a symlink".into()));
                i.entries[1].needs_operator = true;
            },
            1,
        ),
        (
            "entry skipped in the ordinary way",
            |i| i.entries[1].refused = Some(("not-mount-point".into(), "not a mount point".into())),
            0,
        ),
        ("held device", |i| i.devices[1].0.classes.push(verdict("raw", "Held")), 1),
        (
            "refused device needing an operator",
            |i| {
                i.devices[1].0.classes.push(verdict("raw", "Refused"));
                i.devices[1].1.push(true);
            },
            1,
        ),
        (
            "refused device, nothing to do",
            |i| {
                i.devices[1].0.classes.push(verdict("raw", "Refused"));
                i.devices[1].1.push(false);
            },
            0,
        ),
    ];
    for (case, change, want) in cases {
        let mut i = inputs();
        change(&mut i);
        let s = build(i);
        assert_eq!(s.summary.problems, want, "{case}: {s:#?}");
    }
    let mut i = inputs();
    i.pvs[0].failing = Some("I/O errors".into());
    i.pvs[0].moved_to = Some("/mnt/fast/x".into());
    let s = build(i);
    let p1 = s.volumes.iter().find(|v| v.pv.as_deref() == Some("p1")).expect("p1");
    assert_eq!(p1.flags, ["moved", "failing"]);
    assert_eq!(p1.message.as_deref(), Some("I/O errors"));
}

#[test]
fn the_content_does_not_depend_on_the_order_things_were_found_in() {
    let a = build(inputs());
    let mut i = inputs();
    i.pvs.reverse();
    i.entries.reverse();
    i.devices.reverse();
    i.classes.reverse();
    i.used_disks = vec![record(DISK_B, "2"), record(DISK_A, "1")];
    i.superseded = vec!["z".into(), "a".into(), "z".into()];
    let b = build(i);
    let mut i = inputs();
    i.used_disks = vec![record(DISK_A, "1"), record(DISK_B, "2")];
    i.superseded = vec!["a".into(), "z".into()];
    let c = build(i);
    assert_eq!(b, c);
    assert_eq!(a.volumes, b.volumes);
    assert_eq!(a.devices, b.devices);
}

#[test]
fn the_time_of_the_pass_is_not_content() {
    let a = build(inputs());
    let mut b = a.clone();
    b.observed_at = Some("2026-11-28T10:00:00Z".into());
    assert!(same_content(&a, &b));
    let mut i = inputs();
    i.pvs[0].phase = "Bound".into();
    assert!(!same_content(&a, &build(i)));
    let mut i = inputs();
    i.used_disks.push(record(DISK_A, "1"));
    assert!(!same_content(&a, &build(i)));
}

#[test]
fn the_status_reads_back_as_written_in_camel_case() {
    let mut i = inputs();
    i.used_disks.push(record(DISK_A, "1"));
    let s = build(i);
    let json = serde_json::to_value(&s).expect("json");
    for key in ["nodeName", "summary", "agent", "classes", "devices", "volumes", "usedDisks"] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert_eq!(json["summary"]["availableCapacity"], "4 GiB");
    assert!(json.get("superseded").is_none(), "an empty list of superseded UIDs is left out");
    let back: InventoryStatus = serde_json::from_value(json).expect("back");
    assert_eq!(back, s);
}

#[test]
fn a_status_with_fields_missing_or_unknown_is_read_for_what_it_has() {
    let text = r#"{"nodeName":"n2","usedDisks":[{"identity":"v2;blk;disk=wwid:0x5000a","pv":"p","path":"/x","at":"t"}],"future":1}"#;
    let s: InventoryStatus = serde_json::from_str(text).expect("read");
    assert_eq!(s.node_name, "n2");
    assert_eq!(s.used_disks.len(), 1);
    assert!(!s.used_disks[0].offered && s.used_disks[0].uid.is_none());
    let empty: InventoryStatus = serde_json::from_str("{}").expect("read");
    assert_eq!(empty, InventoryStatus::default());
}

/// `inputs()` with a volume entry behind every PV and p2 bound to a claim: what was written
/// before a claim was deleted.
fn before_release() -> Inputs {
    let mut i = inputs();
    i.pvs[1].claim = Some("ns/data".into());
    for pv in &i.pvs {
        if !i.entries.iter().any(|e| e.host_path == pv.host_path) {
            i.entries.push(EntryInput {
                class: pv.class.clone(),
                host_path: pv.host_path.clone(),
                capacity_bytes: pv.capacity_bytes,
                ..Default::default()
            });
        }
    }
    i
}

#[test]
fn only_the_apis_view_of_this_nodes_pvs_may_wait() {
    const P2: &str = "/mnt/fast/p2";
    let written = build(before_release());
    type Change = fn(&mut Inputs);
    let released: Change = |i| i.pvs[1].phase = "Released".into();
    let unpublished: Change = |i| {
        i.pvs.remove(1);
    };
    // (case, change, may wait)
    let cases: Vec<(&str, Change, bool)> = vec![
        ("released, for this agent to wipe", released, true),
        (
            "released and being deleted",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.pvs[1].deleting = true;
            },
            true,
        ),
        ("bound and being deleted", |i| i.pvs[1].deleting = true, true),
        ("its PV gone, the volume not yet published again", unpublished, true),
        (
            "published again, not yet Available",
            |i| {
                i.pvs[1].phase = "Pending".into();
                i.pvs[1].claim = None;
            },
            true,
        ),
        (
            "another volume's PV released too",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.pvs[0].deleting = true;
            },
            true,
        ),
        (
            "Available again: the cycle's end",
            |i| {
                i.pvs[1].phase = "Available".into();
                i.pvs[1].claim = None;
            },
            true,
        ),
        ("a claim bound", |i| i.pvs[0].claim = Some("ns/new".into()), true),
        ("released under Retain", released, true),
        // Everything that is not the API's view.
        (
            "released and missing",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.pvs[1].missing = true;
            },
            false,
        ),
        (
            "deleting and failing",
            |i| {
                i.pvs[1].deleting = true;
                i.pvs[1].failing = Some("I/O errors".into());
            },
            false,
        ),
        (
            "its PV gone and the volume refused",
            |i| {
                i.pvs.remove(1);
                let e = i.entries.iter_mut().find(|e| e.host_path == P2).expect("p2 entry");
                e.refused = Some(("wipe-first".into(), "used".into()));
            },
            false,
        ),
        (
            "its PV gone and the volume gone",
            |i| {
                i.pvs.remove(1);
                i.entries.retain(|e| e.host_path != P2);
            },
            false,
        ),
        (
            "a step and a new claim elsewhere",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.pvs[0].claim = Some("ns/other".into());
            },
            true,
        ),
        (
            "a step and a shrunk disk",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.pvs[0].capacity_bytes = Some(1 << 20);
            },
            false,
        ),
        (
            "a step and a device's verdict",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.devices[0].0.classes[0].verdict = "Held".into();
            },
            false,
        ),
        (
            "a step and an invalid config",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.config_problem = Some("bad".into());
            },
            false,
        ),
        (
            "a step and a used-disk record",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.used_disks.push(record(DISK_A, "1"));
            },
            false,
        ),
        (
            "a step and a new disk",
            |i| {
                i.pvs[1].phase = "Released".into();
                i.entries.push(EntryInput {
                    class: "fast".into(),
                    host_path: "/mnt/fast/brand-new".into(),
                    ..Default::default()
                });
            },
            false,
        ),
        (
            "a new disk published, Pending",
            |i| {
                i.pvs.push(pv("p9", "fast", "Pending", 1 << 30));
            },
            false,
        ),
        (
            "a new disk found",
            |i| {
                i.entries.push(EntryInput {
                    class: "fast".into(),
                    host_path: "/mnt/fast/brand-new".into(),
                    ..Default::default()
                });
            },
            false,
        ),
        ("an Available PV's capacity", |i| i.pvs[0].capacity_bytes = Some(2 << 30), false),
    ];
    for (case, change, want) in cases {
        let mut i = before_release();
        change(&mut i);
        let now = build(i);
        assert!(!same_content(&written, &now), "{case}: the change must be content");
        assert_eq!(only_pv_view_changes(&written, &now), want, "{case}");
    }
    // What a device no class judges holds is the host's view too; its size is not.
    let with_plain = |content: &str, size: u64| {
        let mut i = before_release();
        let mut d = i.devices[0].clone();
        d.0.name = "sdz".into();
        d.0.classes.clear();
        d.1.clear();
        d.0.content = content.into();
        d.0.size = size;
        i.devices.push(d);
        build(i)
    };
    assert!(only_pv_view_changes(&with_plain("not probed", 1), &with_plain("in use: mounted at /x", 1)));
    assert!(!only_pv_view_changes(&with_plain("not probed", 1), &with_plain("not probed", 2)), "resized");
    assert!(!only_pv_view_changes(&written, &with_plain("not probed", 1)), "a new disk");
    // A volume shown with a problem: its recovery is no view change, it goes out at once.
    let mut failing = before_release();
    failing.pvs[1].failing = Some("I/O errors".into());
    let mut healthy = before_release();
    released(&mut healthy);
    assert!(!only_pv_view_changes(&build(failing), &build(healthy)), "a problem cleared");
    // A new PV shown Pending: Available is shown at once (a node's new volumes are offered).
    let mut pending = before_release();
    pending.pvs[0].phase = "Pending".into();
    assert!(!only_pv_view_changes(&build(pending), &written), "a new PV Available");
    // Nothing written before: nothing to wait against (the caller writes its first status).
    let mut i = before_release();
    unpublished(&mut i);
    assert!(!only_pv_view_changes(&build(Inputs { pvs: vec![], ..before_release() }), &build(i)));
}

/// How long each kind of change may wait, with and without publishing under way, after a
/// write and before any: only the view waits its minute; publishing folds every other change
/// but one to the used-disk records, which is always prompt.
#[test]
fn a_change_waits_for_publishing_unless_it_touches_the_used_disk_records() {
    let written = build(before_release());
    fn new_disk(i: &mut Inputs) {
        i.entries.push(EntryInput {
            class: "fast".into(),
            host_path: "/mnt/fast/brand-new".into(),
            ..Default::default()
        })
    }
    /// (case, change, a view change only, touches the records)
    type Case = (&'static str, fn(&mut Inputs), bool, bool);
    let cases: Vec<Case> = vec![
        ("a step of a released PV's cycle", |i| i.pvs[1].phase = "Released".into(), true, false),
        ("a new disk found", new_disk, false, false),
        ("a new PV, Pending", |i| i.pvs.push(pv("p9", "fast", "Pending", 1 << 30)), false, false),
        ("a used-disk record", |i| i.used_disks.push(record(DISK_A, "1")), false, true),
        (
            "a new disk and a used-disk record",
            |i| {
                new_disk(i);
                i.used_disks.push(record(DISK_A, "1"));
            },
            false,
            true,
        ),
    ];
    for (case, change, view, records) in cases {
        for publishing in [false, true] {
            let mut i = before_release();
            change(&mut i);
            let now = build(i);
            let want = match (view, publishing && !records) {
                (true, _) => WriteWait::View,
                (false, true) => WriteWait::Publishing,
                (false, false) => WriteWait::Prompt,
            };
            assert_eq!(write_wait(Some(&written), &now, publishing), want, "{case}, publishing={publishing}");
            // Before any write: the view is not known to the API, so nothing is a view change;
            // a status without records waits for publishing, one with records does not.
            let first = if publishing && now.used_disks.is_empty() && now.superseded.is_empty() {
                WriteWait::Publishing
            } else {
                WriteWait::Prompt
            };
            assert_eq!(write_wait(None, &now, publishing), first, "{case}, first write, publishing={publishing}");
        }
    }
}

/// The object's `Resource` and its CRD are one definition: kube's derive of the types.
#[test]
fn the_resource_and_its_crd_say_the_same() {
    use kube::Resource as _;
    let crd = crd();
    assert_eq!(LocalStorageNode::api_version(&()), "local-static-provisioner.io/v1alpha1");
    assert_eq!(crd.spec.group, LocalStorageNode::group(&()));
    assert_eq!(crd.spec.names.kind, LocalStorageNode::kind(&()));
    assert_eq!(crd.spec.names.plural, LocalStorageNode::plural(&()));
    assert_eq!(crd.metadata.name.as_deref(), Some("localstoragenodes.local-static-provisioner.io"));
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["lsn".to_string()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["local-storage".to_string()]));
    let [version] = crd.spec.versions.as_slice() else { panic!("one version: {:?}", crd.spec.versions) };
    assert_eq!(version.name, LocalStorageNode::version(&()));
    assert!(version.served && version.storage);
    assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "status subresource");
}

/// The schema is one the API server takes as structural and says only what it is to enforce:
/// no references or combinators, a type everywhere, no defaults for it to write into stored
/// objects, no nulls kept, only Kubernetes's formats, `required` naming properties, and
/// descriptions as prose (no line breaks of the code's wrapping, an array's items not described
/// again).
#[test]
fn the_crd_schema_is_structural_and_plain() {
    fn check(at: &str, schema: &serde_json::Value, problems: &mut Vec<String>) {
        let Some(map) = schema.as_object() else {
            problems.push(format!("{at}: not an object"));
            return;
        };
        for key in map.keys() {
            let allowed =
                ["type", "description", "properties", "required", "items", "enum", "format", "minimum", "title"];
            if !allowed.contains(&key.as_str()) {
                problems.push(format!("{at}: {key}"));
            }
        }
        if map.get("type").and_then(|t| t.as_str()).is_none() {
            problems.push(format!("{at}: no type"));
        }
        if let Some(format) = map.get("format").and_then(|f| f.as_str())
            && !["int64", "date-time"].contains(&format)
        {
            problems.push(format!("{at}: format {format}"));
        }
        if map.get("description").and_then(|d| d.as_str()).is_some_and(|d| d.contains('\n') || d.contains("::")) {
            problems.push(format!("{at}: description {}", map["description"]));
        }
        let properties = map.get("properties").and_then(|p| p.as_object());
        for name in map.get("required").and_then(|r| r.as_array()).into_iter().flatten() {
            if !properties.is_some_and(|p| name.as_str().is_some_and(|n| p.contains_key(n))) {
                problems.push(format!("{at}: required {name} is no property"));
            }
        }
        for (name, property) in properties.into_iter().flatten() {
            check(&format!("{at}.{name}"), property, problems);
        }
        if let Some(items) = map.get("items") {
            if map.contains_key("description") && items.get("description").is_some() {
                problems.push(format!("{at}[]: described twice"));
            }
            check(&format!("{at}[]"), items, problems);
        }
    }
    let crd = serde_json::to_value(crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut problems = Vec::new();
    check("", schema, &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    let status = &schema["properties"]["status"]["properties"];
    assert_eq!(
        status["devices"]["items"]["properties"]["classes"]["items"]["properties"]["verdict"]["enum"],
        serde_json::json!(["Claimed", "Claiming", "NotSelected", "Refused", "Held", "Kept"])
    );
    assert_eq!(status["observedAt"]["format"], "date-time");
    assert_eq!(status["summary"]["properties"]["disks"]["minimum"], 0.0);
}

/// An object as another version may have written it reads for what it has: a spec without its
/// name, a status cut short, none.
#[test]
fn an_object_reads_for_what_it_has() {
    let object: LocalStorageNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "local-static-provisioner.io/v1alpha1", "kind": "LocalStorageNode",
        "metadata": {"name": "n1"}, "spec": {}, "status": {"summary": {"disks": 2}, "future": 1},
    }))
    .unwrap();
    assert_eq!(object.spec, InventorySpec::default());
    let status = object.status.unwrap();
    assert_eq!(status.summary.disks, 2);
    assert!(status.volumes.is_empty());
    let bare: LocalStorageNode =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}})).unwrap();
    assert_eq!(bare.status, None);
    assert_eq!(bare.spec.node_name, "n1");
    // Without a spec (stored before the CRD required one), or a null one: the default.
    for spec in [None, Some(serde_json::Value::Null)] {
        let mut json = serde_json::json!({"metadata": {"name": "n1"}, "status": {"nodeName": "n1"}});
        if let Some(spec) = spec {
            json["spec"] = spec;
        }
        let object: LocalStorageNode = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(object.spec, InventorySpec::default(), "{json}");
        assert_eq!(object.status.unwrap().node_name, "n1");
    }
    let list: Vec<LocalStorageNode> =
        serde_saphyr::from_str("- metadata: {name: n1}\n- metadata: {name: n2}\n  spec: {nodeName: n2}\n").unwrap();
    assert_eq!(list[1].spec.node_name, "n2", "YAML too");
    let written = serde_json::to_value(&bare).unwrap();
    assert_eq!(written["apiVersion"], "local-static-provisioner.io/v1alpha1");
    assert_eq!(written["kind"], "LocalStorageNode");
}
