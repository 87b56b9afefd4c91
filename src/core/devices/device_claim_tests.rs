use super::*;

fn disk(name: &str, id: &str) -> DeviceFacts {
    DeviceFacts {
        name: name.into(),
        dev: "8:0".into(),
        kind: Some(DeviceKind::Selectable(DeviceType::Disk)),
        size: 100 << 30,
        rotational: Some(false),
        model: Some("Samsung SSD 980".into()),
        vendor: Some("ATA".into()),
        stable_id: Some(id.into()),
        by_id: vec![format!("wwn-{name}")],
        probe: Probe { done: true, in_use: None, content: Content::Blank, activity: None },
        ..Default::default()
    }
}

fn class(name: &str, selector: Option<DeviceSelector>) -> ClassClaims {
    ClassClaims { class: name.into(), host_dir: format!("/mnt/{name}"), name_pattern: "*".into(), selector }
}

/// The agent's view: class `fast` claims whole disks, and this node's PVs are known.
fn world(devices: Vec<DeviceFacts>) -> World {
    World {
        classes: vec![class("fast", Some(DeviceSelector::default()))],
        devices,
        pvs_known: true,
        ..Default::default()
    }
}

fn verdict(plan: &ClaimPlan, class: &str, device: &str) -> Verdict {
    plan.decisions
        .iter()
        .find(|d| d.class == class && d.device == device)
        .map(|d| d.verdict.clone())
        .unwrap_or_else(|| panic!("no decision for {class}/{device}: {plan:?}"))
}

fn record(class: &str, device: &DeviceFacts) -> ClaimRecord {
    let id = device.stable_id.clone().unwrap();
    let name = link_name(&id);
    ClaimRecord {
        class: class.into(),
        host_path: host_path(&format!("/mnt/{class}"), &name),
        name,
        disk: id,
        target: link_target(device).unwrap(),
        previous: None,
        held: None,
    }
}

/// A symlink entry leading to `device`, written as this agent writes its links to a device
/// made by [`disk`] (its by-id name), so a record of that device matches it.
fn link_entry(class: &str, name: &str, device: Option<&str>) -> DirEntry {
    let link = device.map_or_else(|| "/dev/x".to_string(), |d| format!("/dev/disk/by-id/wwn-{d}"));
    DirEntry {
        unanswered: false,
        class: class.into(),
        name: name.into(),
        link: Some(link),
        device: device.map(Into::into),
    }
}

#[test]
fn a_clean_disk_is_claimed_under_its_stable_name_pointing_at_by_id() {
    let mut d = disk("sdb", "wwid:naa.5000c500a0b1c2d3");
    d.by_id = vec!["scsi-35000c500a0b1c2d3".into(), "wwn-0x5000c500a0b1c2d3".into(), "lvm-pv-uuid-x".into()];
    let plan = plan(&world(vec![d]));
    let want_name = "wwid-naa.5000c500a0b1c2d3";
    assert_eq!(
        verdict(&plan, "fast", "sdb"),
        Verdict::Claim {
            name: want_name.into(),
            target: "/dev/disk/by-id/wwn-0x5000c500a0b1c2d3".into(),
            relink: false
        }
    );
    assert_eq!(
        plan.actions,
        vec![LinkAction::Create(ClaimRecord {
            class: "fast".into(),
            name: want_name.into(),
            host_path: format!("/mnt/fast/{want_name}"),
            disk: "wwid:naa.5000c500a0b1c2d3".into(),
            target: "/dev/disk/by-id/wwn-0x5000c500a0b1c2d3".into(),
            previous: None,
            held: None,
        })]
    );
}

#[test]
fn without_by_id_only_a_loop_device_is_claimed_and_its_link_points_at_the_dev_node() {
    let mut d = disk("vdb", "serial:abc123");
    d.by_id.clear();
    assert_eq!(verdict(&plan(&world(vec![d])), "fast", "vdb"), Verdict::Refused(Refusal::NoById));
    let mut lp = disk("loop3", "loop:/img/a@0#1");
    lp.by_id.clear();
    lp.kind = Some(DeviceKind::Selectable(DeviceType::Loop));
    let sel = DeviceSelector { types: vec![DeviceType::Loop], ..Default::default() };
    let p = plan(&World { classes: vec![class("fast", Some(sel))], devices: vec![lp], ..Default::default() });
    assert!(matches!(verdict(&p, "fast", "loop3"), Verdict::Claim { target, .. } if target == "/dev/loop3"));
}

#[test]
fn an_upstream_pv_whose_path_leads_to_the_device_makes_it_already_a_volume() {
    let mut w = world(vec![disk("nvme1n1", "wwid:eui.1")]);
    w.pvs = vec![PvDisk {
        host_path: "/dev/disk/kubernetes/nvme1".into(),
        disk: None,
        device: Some("nvme1n1".into()),
        unbound: false,
    }];
    let v = verdict(&plan(&w), "fast", "nvme1n1");
    assert!(
        matches!(v, Verdict::Refused(Refusal::AlreadyVolume(ref w)) if w.contains("/dev/disk/kubernetes/nvme1")),
        "{v:?}"
    );
}

/// Every combination of the facts that make a device unsafe: it is claimed only when none
/// holds, and the refusal names the first that does.
#[test]
fn exhaustively_a_device_is_claimed_only_when_every_safety_fact_is_clear() {
    const FACTS: usize = 13;
    for bits in 0u32..(1 << FACTS) {
        let on = |i: usize| bits & (1 << i) != 0;
        let mut d = disk("sdb", "wwid:naa.1");
        let mut w = World { classes: vec![class("fast", Some(DeviceSelector::default()))], ..Default::default() };
        if on(0) {
            d.stable_id = None;
        }
        d.read_only = on(1);
        d.removable = on(2);
        d.hidden = on(3);
        if on(4) {
            d.partitions = vec!["sdb1".into()];
        }
        if on(5) {
            d.holders = vec!["dm-0".into()];
        }
        if on(6) {
            d.probe.in_use = Some("it is mounted at /data".into());
        }
        if on(7) {
            d.probe.content = Content::NotBlank("ext4 superblock at 1080".into());
        }
        if on(8) {
            d.probe.content = Content::Busy;
        }
        if on(9) {
            d.probe = Probe::default();
        }
        if on(10) {
            w.entries.push(DirEntry {
                unanswered: false,
                class: "other".into(),
                name: "manual".into(),
                link: Some("/dev/sdb".into()),
                device: Some("sdb".into()),
            });
        }
        if on(11) {
            w.pvs.push(PvDisk {
                host_path: "/mnt/other/x".into(),
                disk: Some("wwid:naa.1/part1@2048".into()),
                device: None,
                unbound: false,
            });
        }
        if on(12) {
            w.host_processes_unseen = Some("its PID namespace is its own and PID 1 is sh".into());
        }
        w.devices = vec![d];
        let v = verdict(&plan(&w), "fast", "sdb");
        if bits == 0 {
            assert!(matches!(v, Verdict::Claim { relink: false, .. }), "{v:?}");
        } else {
            assert!(matches!(v, Verdict::Refused(_)), "facts {bits:#b}: {v:?}");
        }
        let p = plan(&w);
        assert_eq!(p.actions.is_empty(), bits != 0, "facts {bits:#b}: {:?}", p.actions);
        // A device whose probe is missing is asked for, and only then.
        let needs_probe = matches!(v, Verdict::Refused(Refusal::NotProbed));
        assert_eq!(p.to_probe.contains("sdb"), needs_probe, "facts {bits:#b}");
        // Without the host's processes alone, that is the reason given.
        if bits == 1 << 12 {
            assert!(
                matches!(v, Verdict::Refused(Refusal::HostProcessesUnseen(ref w)) if w.contains("PID 1 is sh")),
                "{v:?}"
            );
        }
    }
}

/// Without the host's processes no candidate is claimed, and that is the reason it is given
/// exactly when nothing the probe or the device's facts show refuses it first: whatever the
/// probe read (a blank disk, one not answering, one read whole under `verify: full`), a device
/// not probed yet is still asked for, and a device in use or used by a writer says so. With
/// them, the same devices are judged as before.
#[test]
fn exhaustively_without_the_hosts_processes_no_device_is_claimed_and_that_is_said() {
    let probes: Vec<(&str, Probe, Option<&str>)> = {
        let p = finished_probe;
        vec![
            ("blank", p(None, None, Content::Blank), None),
            ("not blank", p(None, None, Content::NotBlank("xfs superblock at 0".into())), Some("not-blank")),
            ("busy", p(None, None, Content::Busy), Some("in-use")),
            ("unreadable", p(None, None, Content::Unreadable("EIO".into())), Some("unreadable")),
            ("unresponsive", p(None, None, Content::Unresponsive("probe".into())), Some("unresponsive")),
            ("mounted", p(Some("it is mounted at /srv"), None, Content::Blank), Some("in-use")),
            ("written", p(None, Some("someone is using it: 3 writes (12 KiB)"), Content::Blank), Some("in-use")),
            ("not probed", Probe::default(), Some("not-probed")),
        ]
    };
    for (what, probe, with_hosts) in probes {
        for verify in [Verify::Sample, Verify::Full] {
            for unseen in [None, Some("its PID namespace is its own and PID 1 is pause")] {
                let mut d = disk("sdb", "wwid:naa.1");
                d.probe = probe.clone();
                let selector = DeviceSelector { verify, ..Default::default() };
                let mut w = world(vec![d]);
                w.classes = vec![class("fast", Some(selector))];
                w.host_processes_unseen = unseen.map(Into::into);
                let p = plan(&w);
                let v = verdict(&p, "fast", "sdb");
                let case = format!("{what}, verify {verify:?}, unseen {unseen:?}");
                // What refuses it first, the host's processes aside.
                let first = match (with_hosts, verify) {
                    (None, Verify::Full) => Some("verifying"),
                    (found, _) => found,
                };
                let stands = matches!(what, "mounted" | "written" | "not probed");
                let expected = match (unseen, stands) {
                    (Some(_), false) => Some("host-processes-unseen"),
                    _ => first,
                };
                match (&v, expected) {
                    (Verdict::Claim { .. }, None) => {}
                    (Verdict::Refused(r), Some(code)) => {
                        assert_eq!(r.code(), code, "{case}: {r}");
                        if code == "host-processes-unseen" {
                            let text = r.to_string();
                            assert!(
                                text.contains("cannot see the host's processes (its PID namespace is its own and PID 1 is pause: hostPID is off)")
                                    && text.contains("deploy/components/host-pid")
                                    && !text.contains("does not answer"),
                                "{case}: {text}"
                            );
                            assert!(r.needs_operator(), "{case}");
                        }
                    }
                    _ => panic!("{case}: {v:?}, expected {expected:?}"),
                }
                assert_eq!(p.to_probe.contains("sdb"), what == "not probed", "{case}");
                assert!(unseen.is_none() || p.actions.is_empty(), "{case}: {:?}", p.actions);
            }
        }
    }
}

#[test]
fn each_refusal_says_why() {
    type Change = Box<dyn Fn(&mut DeviceFacts)>;
    let cases: Vec<(Change, &str, &str)> = vec![
        (Box::new(|d| d.read_only = true), "read-only", "read-only"),
        (Box::new(|d| d.removable = true), "removable", "removable"),
        (Box::new(|d| d.partitions = vec!["sdb1".into()]), "partitioned", "partitions (sdb1)"),
        (Box::new(|d| d.holders = vec!["md0".into()]), "held", "held by md0"),
        (Box::new(|d| d.probe.in_use = Some("it is mounted at /x".into())), "in-use", "mounted at /x"),
        (Box::new(|d| d.probe.content = Content::NotBlank("LVM2 label at 512".into())), "not-blank", "LVM2 label"),
        (Box::new(|d| d.probe.content = Content::Unreadable("EIO".into())), "unreadable", "EIO"),
        (Box::new(|d| d.stable_id = None), "no-stable-id", "stable id"),
    ];
    for (change, code, text) in cases {
        let mut d = disk("sdb", "wwid:naa.1");
        change(&mut d);
        match verdict(&plan(&world(vec![d])), "fast", "sdb") {
            Verdict::Refused(r) => {
                assert_eq!(r.code(), code);
                assert!(r.to_string().contains(text), "{r}");
            }
            v => panic!("{code}: {v:?}"),
        }
    }
}

#[test]
fn filters_select_by_type_size_rotational_model_vendor_and_exclusion() {
    let sel = |f: &dyn Fn(&mut DeviceSelector)| {
        let mut s = DeviceSelector::default();
        f(&mut s);
        s
    };
    let d = {
        let mut d = disk("sdb", "wwid:naa.1");
        d.by_id = vec!["wwn-0x1".into()];
        d
    };
    let cases: Vec<(DeviceSelector, bool)> = vec![
        (sel(&|_| {}), true),
        (sel(&|s| s.types = vec![DeviceType::Partition]), false),
        (sel(&|s| s.min_size = Some(100 << 30)), true),
        (sel(&|s| s.min_size = Some((100 << 30) + 1)), false),
        (sel(&|s| s.max_size = Some(100 << 30)), true),
        (sel(&|s| s.max_size = Some((100 << 30) - 1)), false),
        (sel(&|s| s.rotational = Some(false)), true),
        (sel(&|s| s.rotational = Some(true)), false),
        (sel(&|s| s.models = vec!["Samsung*".into()]), true),
        (sel(&|s| s.models = vec!["WDC*".into(), "Samsung SSD 9?0".into()]), true),
        (sel(&|s| s.models = vec!["WDC*".into()]), false),
        (sel(&|s| s.vendors = vec!["ATA".into()]), true),
        (sel(&|s| s.vendors = vec!["NVME".into()]), false),
        (sel(&|s| s.exclude = vec!["sdb".into()]), false),
        (sel(&|s| s.exclude = vec!["/dev/sd*".into()]), false),
        (sel(&|s| s.exclude = vec!["wwn-0x1".into()]), false),
        (sel(&|s| s.exclude = vec!["/dev/disk/by-id/wwn-*".into()]), false),
        (sel(&|s| s.exclude = vec!["wwid:naa.*".into()]), false),
        (sel(&|s| s.exclude = vec!["sdc".into(), "nvme*".into()]), true),
    ];
    for (selector, claimed) in cases {
        let p = plan(&World {
            classes: vec![class("fast", Some(selector.clone()))],
            devices: vec![d.clone()],
            ..Default::default()
        });
        let v = verdict(&p, "fast", "sdb");
        assert_eq!(matches!(v, Verdict::Claim { .. }), claimed, "{selector:?}: {v:?}");
        if !claimed {
            assert!(matches!(v, Verdict::NotSelected(_)), "{v:?}");
        }
    }
    // Sizes are said in IEC units, with the exact bytes (a unit rounds).
    let small = sel(&|s| s.min_size = Some((100 << 30) + 1));
    assert_eq!(
        not_selected(&small, &d).as_deref(),
        Some("100 GiB (107374182400 bytes) is below minSize 100 GiB (107374182401 bytes)")
    );
    let big = sel(&|s| s.max_size = Some(64 << 30));
    assert_eq!(
        not_selected(&big, &d).as_deref(),
        Some("100 GiB (107374182400 bytes) is above maxSize 64 GiB (68719476736 bytes)")
    );
    // A device whose vendor or rotational sysfs does not give never matches a filter on it.
    let mut unknown = d.clone();
    unknown.vendor = None;
    unknown.rotational = None;
    for s in [sel(&|s| s.vendors = vec!["*".into()]), sel(&|s| s.rotational = Some(false))] {
        let p = plan(&World {
            classes: vec![class("fast", Some(s))],
            devices: vec![unknown.clone()],
            ..Default::default()
        });
        assert!(matches!(verdict(&p, "fast", "sdb"), Verdict::NotSelected(_)));
    }
}

#[test]
fn loop_and_other_layers_are_claimed_only_when_named() {
    let mut lp = disk("loop3", "loop:/var/lib/img/a.img@0#12");
    lp.kind = Some(DeviceKind::Selectable(DeviceType::Loop));
    let mut lv = disk("dm-0", "dm:LVM-abc");
    lv.kind = Some(DeviceKind::Other("dm".into()));
    let mut part = disk("sdb1", "wwid:naa.1/part1@2048");
    part.kind = Some(DeviceKind::Selectable(DeviceType::Partition));
    let devices = vec![lp, lv, part];
    let p = plan(&world(devices.clone()));
    for name in ["loop3", "dm-0", "sdb1"] {
        assert!(matches!(verdict(&p, "fast", name), Verdict::NotSelected(_)), "{name}");
    }
    let all = DeviceSelector {
        types: vec![DeviceType::Disk, DeviceType::Partition, DeviceType::Multipath, DeviceType::Loop],
        ..Default::default()
    };
    let p = plan(&World { classes: vec![class("fast", Some(all))], devices, ..Default::default() });
    assert!(matches!(verdict(&p, "fast", "loop3"), Verdict::Claim { .. }));
    assert!(matches!(verdict(&p, "fast", "sdb1"), Verdict::Claim { .. }));
    assert!(matches!(verdict(&p, "fast", "dm-0"), Verdict::NotSelected(_)));
}

#[test]
fn max_per_node_counts_existing_claims_and_takes_devices_in_stable_id_order() {
    let devices: Vec<DeviceFacts> = ["wwid:d", "wwid:b", "wwid:a", "wwid:c"]
        .iter()
        .enumerate()
        .map(|(i, id)| disk(&format!("sd{i}"), id))
        .collect();
    let selector = DeviceSelector { max_per_node: Some(2), ..Default::default() };
    let mut w = World { classes: vec![class("fast", Some(selector))], devices: devices.clone(), ..Default::default() };
    let claimed = |p: &ClaimPlan| -> Vec<String> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                LinkAction::Create(r) => Some(r.disk.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(claimed(&plan(&w)), vec!["wwid:a", "wwid:b"]);
    // With one claim already made (of the last id), one more is taken.
    let existing = devices.iter().find(|d| d.stable_id.as_deref() == Some("wwid:d")).unwrap();
    w.records = vec![record("fast", existing)];
    w.entries = vec![link_entry("fast", &link_name("wwid:d"), Some(&existing.name))];
    let p = plan(&w);
    assert_eq!(claimed(&p), vec!["wwid:a"]);
    assert!(matches!(verdict(&p, "fast", "sd1"), Verdict::NotSelected(ref why) if why.contains("maxPerNode (2)")));
}

#[test]
fn a_device_is_claimed_by_one_class_only() {
    let d = disk("sdb", "wwid:naa.1");
    let w = World {
        classes: vec![class("a", Some(DeviceSelector::default())), class("b", Some(DeviceSelector::default()))],
        devices: vec![d.clone()],
        ..Default::default()
    };
    let p = plan(&w);
    assert!(matches!(verdict(&p, "a", "sdb"), Verdict::Claim { .. }));
    assert_eq!(verdict(&p, "b", "sdb"), Verdict::Refused(Refusal::ClaimedElsewhere("a (link wwid-naa.1)".into())));
    assert_eq!(p.actions.len(), 1);
    // Recorded for a, class b refuses it on later passes too, and so does a partition of it.
    let mut w2 = w.clone();
    w2.records = vec![record("a", &d)];
    w2.entries = vec![link_entry("a", &link_name("wwid:naa.1"), Some("sdb"))];
    let p = plan(&w2);
    assert_eq!(verdict(&p, "a", "sdb"), Verdict::Claimed { name: link_name("wwid:naa.1") });
    assert_eq!(verdict(&p, "b", "sdb"), Verdict::Refused(Refusal::ClaimedElsewhere("a (link wwid-naa.1)".into())));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn an_operator_link_to_the_device_or_its_partition_or_whole_disk_makes_it_already_a_volume() {
    for (entry_device, device) in [("sdb", "sdb"), ("sdb1", "sdb"), ("loop7", "sdb")] {
        let mut d = disk(device, "wwid:naa.1");
        d.sharing = vec!["loop7".into()];
        d.partitions = vec![];
        let mut w = world(vec![d]);
        w.entries = vec![DirEntry {
            unanswered: false,
            class: "manual".into(),
            name: "disk1".into(),
            link: Some("/dev/x".into()),
            device: Some(entry_device.into()),
        }];
        if entry_device == "sdb1" {
            w.devices[0].partitions = vec!["sdb1".into()];
        }
        let v = verdict(&plan(&w), "fast", "sdb");
        assert!(
            matches!(v, Verdict::Refused(Refusal::AlreadyVolume(ref w)) if w.contains("disk1")),
            "{entry_device}: {v:?}"
        );
    }
    // A partition whose whole disk is an entry.
    let mut p1 = disk("sdb1", "wwid:naa.1/part1@2048");
    p1.kind = Some(DeviceKind::Selectable(DeviceType::Partition));
    p1.parent = Some("sdb".into());
    let mut w = World {
        classes: vec![class("fast", Some(DeviceSelector { types: vec![DeviceType::Partition], ..Default::default() }))],
        devices: vec![p1],
        ..Default::default()
    };
    w.entries = vec![link_entry("manual", "whole", Some("sdb"))];
    assert!(matches!(verdict(&plan(&w), "fast", "sdb1"), Verdict::Refused(Refusal::AlreadyVolume(_))));
}

#[test]
fn a_lost_link_of_a_pv_is_made_again_whatever_the_tenant_wrote() {
    let mut d = disk("sdc", "wwid:naa.2");
    d.probe.content = Content::NotBlank("ext4 superblock at 1080".into());
    let name = link_name("wwid:naa.2");
    let mut w = world(vec![d.clone()]);
    w.pvs = vec![PvDisk {
        host_path: format!("/mnt/fast/{name}"),
        disk: Some("wwid:naa.2".into()),
        device: None,
        unbound: false,
    }];
    // With no record (a fresh state directory) and with one.
    let p = plan(&w);
    assert!(matches!(verdict(&p, "fast", "sdc"), Verdict::Claim { relink: true, .. }));
    w.records = vec![record("fast", &d)];
    let p = plan(&w);
    assert_eq!(p.actions, vec![LinkAction::Relink(record("fast", &d))]);
    // A PV of the same path that recorded another disk does not bring it back.
    w.records.clear();
    w.pvs[0].disk = Some("wwid:naa.9".into());
    assert!(matches!(verdict(&plan(&w), "fast", "sdc"), Verdict::Refused(_)));
}

#[test]
fn a_pv_that_recorded_the_disk_elsewhere_makes_it_already_a_volume() {
    let mut w = world(vec![disk("sdc", "wwid:naa.2")]);
    w.pvs = vec![PvDisk {
        host_path: "/mnt/manual/disk1".into(),
        disk: Some("wwid:naa.2".into()),
        device: None,
        unbound: false,
    }];
    assert!(
        matches!(verdict(&plan(&w), "fast", "sdc"), Verdict::Refused(Refusal::AlreadyVolume(ref w)) if w.contains("/mnt/manual/disk1"))
    );
}

#[test]
fn name_pattern_and_taken_names_are_refusals() {
    let mut w = world(vec![disk("sdb", "wwid:naa.1")]);
    w.classes[0].name_pattern = "nvme*".into();
    assert!(matches!(verdict(&plan(&w), "fast", "sdb"), Verdict::Refused(Refusal::NameMismatch { .. })));
    w.classes[0].name_pattern = "*".into();
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: link_name("wwid:naa.1"),
        link: None,
        device: None,
    }];
    assert!(matches!(verdict(&plan(&w), "fast", "sdb"), Verdict::Refused(Refusal::NameTaken(_))));
}

/// Every state of one recorded link: it is removed only when it is a symlink, its device is
/// not selected and no PV has it; it is never removed or changed otherwise except to point
/// at its own device (or nowhere).
#[test]
fn exhaustively_a_recorded_link_is_removed_only_without_a_pv() {
    let d = disk("sdb", "wwid:naa.1");
    let r = record("fast", &d);
    for bits in 0u32..(1 << 7) {
        let on = |i: usize| bits & (1 << i) != 0;
        let selected = on(0);
        let has_pv = on(1);
        let device_present = on(2);
        // Our link as we made it (leading to sdb, or to sdx after a reordering), something
        // else at its name, or our link re-pointed by someone else.
        let entry = match (on(3), on(4)) {
            (false, _) => None,
            (true, false) => Some(DirEntry {
                unanswered: false,
                class: "fast".into(),
                name: r.name.clone(),
                link: Some(r.target.clone()),
                device: Some(if on(5) { "sdb" } else { "sdx" }.into()),
            }),
            (true, true) if on(5) => Some(DirEntry {
                unanswered: false,
                class: "fast".into(),
                name: r.name.clone(),
                link: None,
                device: None,
            }),
            (true, true) => Some(DirEntry {
                unanswered: false,
                class: "fast".into(),
                name: r.name.clone(),
                link: Some("/dev/sdx".into()),
                device: Some("sdx".into()),
            }),
        };
        // Whatever is there, its look may not have answered (a wedged disk or filesystem).
        let unanswered = on(6) && entry.is_some();
        let entry = entry.map(|e| DirEntry { unanswered, ..e });
        let ours = entry.as_ref().is_some_and(|e| e.link.as_deref() == Some(r.target.as_str()));
        let selector = if selected { Some(DeviceSelector::default()) } else { None };
        let mut dev = d.clone();
        let mut other = disk("sdx", "wwid:other");
        other.probe = Probe::default();
        let mut w = World { classes: vec![class("fast", selector)], records: vec![r.clone()], ..Default::default() };
        if device_present {
            dev.probe = Probe::default();
            w.devices.push(dev);
        }
        w.devices.push(other);
        w.entries.extend(entry.clone());
        if has_pv {
            w.pvs.push(PvDisk {
                host_path: r.host_path.clone(),
                disk: Some(r.disk.clone()),
                device: None,
                unbound: false,
            });
        }
        let p = plan(&w);
        let ctx = format!("selected={selected} pv={has_pv} present={device_present} entry={entry:?}: {:?}", p.actions);
        let wanted = selected && device_present;
        if unanswered {
            // Not known to be ours, nor known not to be: the record and its link stay as they are.
            assert!(p.actions.is_empty(), "an entry whose look did not answer is left as it is: {ctx}");
            continue;
        }
        for a in &p.actions {
            match a {
                LinkAction::Remove(x) => {
                    assert_eq!(x, &r, "{ctx}");
                    assert!(!has_pv && !wanted && ours, "{ctx}");
                }
                LinkAction::Forget(_) => {
                    assert!(entry.is_none() && !has_pv || entry.is_some() && !ours, "{ctx}")
                }
                LinkAction::Release(x) => panic!("{ctx}: nothing was held, {x:?} released"),
                LinkAction::Retarget(x) => {
                    assert!(ours, "{ctx}");
                    if device_present {
                        assert_eq!(x.target, "/dev/disk/by-id/wwn-sdb", "{ctx}");
                    } else {
                        assert!(x.target.starts_with(ABSENT_TARGET_DIR), "{ctx}");
                    }
                }
                LinkAction::Create(_) => panic!("a recorded link is never created anew: {ctx}"),
                LinkAction::Relink(x) => {
                    // Only the record's own name, only when its PV lost the link, only to its device.
                    assert!(entry.is_none() && has_pv && device_present, "{ctx}");
                    assert_eq!(
                        (x.name.as_str(), x.target.as_str()),
                        (r.name.as_str(), "/dev/disk/by-id/wwn-sdb"),
                        "{ctx}"
                    );
                }
            }
        }
        if has_pv && ours {
            assert!(!p.actions.iter().any(|a| matches!(a, LinkAction::Remove(_) | LinkAction::Forget(_))), "{ctx}");
        }
        // What is not our link is never changed: only forgotten.
        if entry.is_some() && !ours {
            assert_eq!(p.actions, vec![LinkAction::Forget(r.clone())], "{ctx}");
        }
    }
}

#[test]
fn a_claimed_device_without_pv_that_shows_a_foreign_signature_is_held() {
    let mut d = disk("sdb", "wwid:naa.1");
    let r = record("fast", &d);
    let mut w = world(vec![]);
    w.records = vec![r.clone()];
    w.entries = vec![link_entry("fast", &r.name, Some("sdb"))];
    for (content, held) in
        [(Content::Blank, false), (Content::NotBlank("xfs superblock at 0".into()), true), (Content::Busy, true)]
    {
        d.probe = Probe { done: true, in_use: None, content, activity: None };
        w.devices = vec![d.clone()];
        let p = plan(&w);
        assert_eq!(p.held.len(), usize::from(held), "{:?}", p);
        assert!(p.actions.is_empty());
    }
    // Not probed yet: it is asked for; with a PV it is never probed nor held.
    d.probe = Probe::default();
    w.devices = vec![d.clone()];
    assert!(plan(&w).to_probe.contains("sdb"));
    w.pvs = vec![PvDisk { host_path: r.host_path.clone(), disk: Some(r.disk.clone()), device: None, unbound: false }];
    d.probe = Probe { done: true, in_use: None, content: Content::NotBlank("ext4".into()), activity: None };
    w.devices = vec![d];
    let p = plan(&w);
    assert!(p.held.is_empty() && p.to_probe.is_empty(), "{p:?}");
}

#[test]
fn operator_entries_are_never_acted_on() {
    let d = disk("sdb", "wwid:naa.1");
    let mut w = world(vec![d]);
    w.classes.push(class("gone", None));
    w.entries = vec![
        link_entry("fast", "by-hand", Some("sdb")),
        link_entry("gone", "other", Some("sdz")),
        DirEntry { unanswered: false, class: "fast".into(), name: "mnt1".into(), link: None, device: None },
    ];
    let p = plan(&w);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn link_names_are_stable_distinct_and_safe() {
    let cases = [
        ("wwid:naa.5000c500a0b1c2d3", "wwid-naa.5000c500a0b1c2d3"),
        ("serial:1746632611141523", "serial-1746632611141523"),
        ("wwid:eui.0025388b71b2c3d4", "wwid-eui.0025388b71b2c3d4"),
    ];
    for (id, name) in cases {
        assert_eq!(link_name(id), name);
    }
    let mpath = link_name("dm:mpath-3600508b400105e210000900000490000");
    assert_eq!(mpath, "mpath-3600508b400105e210000900000490000");
    let hashed = [
        "serial:WD WCC4E 123",
        "wwid:t10.ATA     QEMU HARDDISK   QM00001",
        "loop:/var/lib/disks/a.img@0#1234",
        "loop:/var/lib/disks/a.img@0#1235",
        "loop:/other/a.img@0#1234",
        "wwid:naa.5000c500a0b1c2d3/part1@2048",
        "wwid:naa.5000c500a0b1c2d3/part1@4096",
        "wwid:naa.5000c500a0b1c2d3/part2@2048",
        "serial:../../etc",
        "serial:a/b",
        &format!("serial:{}", "x".repeat(300)),
        &format!("serial:{}y", "x".repeat(300)),
    ];
    let mut seen = BTreeSet::new();
    for id in hashed.iter().copied().chain(cases.iter().map(|c| c.0)) {
        let n = link_name(id);
        assert_eq!(n, link_name(id), "stable");
        assert!(n.len() <= 105, "{n}");
        assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{n}");
        assert!(!n.starts_with('.') && n != ".." && !n.is_empty(), "{n}");
        assert!(seen.insert(n.clone()), "two ids named {n}");
    }
    assert!(link_name("loop:/var/lib/disks/a.img@0#1234").starts_with("loop-a.img-"));
    assert!(link_name("wwid:naa.5000c500a0b1c2d3/part1@2048").starts_with("wwid-naa.5000c500a0b1c2d3-part1-"));
}

#[test]
fn by_id_preference_is_hardware_first_and_skips_content_names() {
    let mut d = disk("nvme0n1", "wwid:eui.1");
    d.by_id = vec!["nvme-Samsung_SSD_980_S123".into(), "nvme-eui.0025388b".into(), "lvm-pv-uuid-abc".into()];
    assert_eq!(link_target(&d).as_deref(), Some("/dev/disk/by-id/nvme-eui.0025388b"));
    d.by_id = vec!["lvm-pv-uuid-abc".into(), "md-uuid-1".into()];
    assert_eq!(link_target(&d), None, "never a non-loop disk's /dev node");
}

#[test]
fn ids_overlap_for_a_disk_and_its_partitions_only() {
    assert!(ids_overlap("wwid:a", "wwid:a"));
    assert!(ids_overlap("wwid:a", "wwid:a/part1@2048"));
    assert!(ids_overlap("wwid:a/part1@2048", "wwid:a"));
    assert!(!ids_overlap("wwid:a", "wwid:ab"));
    assert!(!ids_overlap("wwid:a/part1@2048", "wwid:a/part2@4096"));
}

#[test]
fn devices_reporting_one_stable_id_are_never_claimed_and_a_recorded_link_is_left_alone() {
    // Two loop devices over one file, two paths to one LUN without multipath, or two disks
    // whose firmware reports one serial: which is which cannot be told.
    let a = disk("loop10", "loop:/img/dup@0#7");
    let b = disk("loop9", "loop:/img/dup@0#7");
    let mut w = world(vec![b.clone(), a.clone()]);
    let p = plan(&w);
    assert_eq!(verdict(&p, "fast", "loop10"), Verdict::Refused(Refusal::SameDisk("loop9".into())));
    assert_eq!(verdict(&p, "fast", "loop9"), Verdict::Refused(Refusal::SameDisk("loop10".into())));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // Claimed before the twin appeared: the link is neither re-pointed, removed nor judged.
    w.records = vec![record("fast", &a)];
    w.entries = vec![link_entry("fast", &link_name("loop:/img/dup@0#7"), Some("loop10"))];
    let p = plan(&w);
    assert!(p.actions.is_empty() && p.held.is_empty() && p.to_probe.is_empty(), "{p:?}");
    assert!(p.kept.iter().any(|k| k.2.contains("loop10, loop9") || k.2.contains("loop9, loop10")), "{:?}", p.kept);
}

#[test]
fn while_a_discovery_directory_cannot_be_scanned_nothing_new_is_claimed_and_its_links_are_left_alone() {
    let clean = disk("sdb", "wwid:naa.1");
    let theirs = disk("sdc", "wwid:naa.2");
    let mut w = world(vec![clean.clone(), theirs.clone()]);
    // Class "slow" is in the config but its directory is unreadable now; it recorded sdc.
    w.unscanned = vec!["slow".into()];
    w.records = vec![record("slow", &theirs)];
    let p = plan(&w);
    assert_eq!(verdict(&p, "fast", "sdb"), Verdict::Refused(Refusal::Unscanned(vec!["slow".into()])));
    assert_eq!(
        verdict(&p, "fast", "sdc"),
        Verdict::Refused(Refusal::ClaimedElsewhere("slow (link wwid-naa.2)".into()))
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // A PV's lost link is still made again: it is that PV's own disk.
    let name = link_name("wwid:naa.1");
    w.pvs = vec![PvDisk {
        host_path: format!("/mnt/fast/{name}"),
        disk: Some("wwid:naa.1".into()),
        device: None,
        unbound: false,
    }];
    assert!(matches!(verdict(&plan(&w), "fast", "sdb"), Verdict::Claim { relink: true, .. }));
    // A class gone from the config: its records keep others off its devices, and nothing is
    // done to its links.
    let mut w = world(vec![theirs.clone()]);
    w.records = vec![record("gone", &theirs)];
    let p = plan(&w);
    assert_eq!(
        verdict(&p, "fast", "sdc"),
        Verdict::Refused(Refusal::ClaimedElsewhere("gone (link wwid-naa.2)".into()))
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn refusals_that_need_an_operator_are_the_ones_a_used_host_disk_never_gives() {
    // The OS disk of every node, met by a broad filter: mounted, or partitioned: no Warning.
    for r in [
        Refusal::InUse("mounted at /".into()),
        Refusal::Writer("a process has it open: postgres (pid 9) has sdb open for writing (fd 7)".into()),
        Refusal::Partitioned(vec!["sda1".into()]),
        Refusal::Held(vec!["dm-0".into()]),
        Refusal::AlreadyVolume("entry x".into()),
        Refusal::ClaimedElsewhere("b".into()),
        Refusal::SameDisk("sdb".into()),
        Refusal::ReadOnly,
        Refusal::Removable,
        Refusal::Hidden,
        Refusal::NotProbed,
    ] {
        assert!(!r.needs_operator(), "{r}");
    }
    for r in [
        Refusal::NotBlank("xfs superblock at 0".into()),
        Refusal::Unreadable("EIO".into()),
        Refusal::NoStableId,
        Refusal::NoById,
        Refusal::NameMismatch { name: "wwid-x".into(), pattern: "nvme*".into() },
        Refusal::NameTaken("wwid-x".into()),
        Refusal::Unscanned(vec!["slow".into()]),
        Refusal::HostProcessesUnseen("its PID namespace is its own and PID 1 is sh".into()),
    ] {
        assert!(r.needs_operator(), "{r}");
    }
}

#[test]
fn a_partition_of_a_loop_device_needs_no_by_id_name_but_one_of_a_disk_does() {
    let sel = DeviceSelector { types: vec![DeviceType::Partition], ..Default::default() };
    let mut lp = disk("loop3p1", "loop:/img/a@0#1/part1@2048");
    lp.kind = Some(DeviceKind::Selectable(DeviceType::Partition));
    lp.by_id.clear();
    let mut sp = disk("sdb1", "wwid:naa.1/part1@2048");
    sp.kind = Some(DeviceKind::Selectable(DeviceType::Partition));
    sp.by_id.clear();
    let p = plan(&World { classes: vec![class("fast", Some(sel))], devices: vec![lp, sp], ..Default::default() });
    assert!(matches!(verdict(&p, "fast", "loop3p1"), Verdict::Claim { .. }));
    assert_eq!(verdict(&p, "fast", "sdb1"), Verdict::Refused(Refusal::NoById));
}

#[test]
fn a_disk_is_never_linked_by_its_dev_node_and_an_old_dev_node_link_moves_to_by_id() {
    let d = disk("sdb", "wwid:naa.1");
    let r = record("fast", &d);
    let mut bare = d.clone();
    bare.by_id.clear();
    // Its by-id name not there (yet): a dangling link is not pointed at /dev/sdb...
    let mut w = world(vec![bare.clone()]);
    w.records = vec![r.clone()];
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: r.name.clone(),
        link: Some(r.target.clone()),
        device: None,
    }];
    w.pvs = vec![PvDisk { host_path: r.host_path.clone(), disk: Some(r.disk.clone()), device: None, unbound: false }];
    assert!(plan(&w).actions.is_empty(), "{:?}", plan(&w).actions);
    // ...nor is a lost link of its PV made again by it.
    w.entries.clear();
    let p = plan(&w);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.kept.iter().any(|k| k.2.contains("cannot be made again yet")), "{:?}", p.kept);
    // A link an earlier version made by /dev/sdb is moved to the by-id name once there is one.
    let old = ClaimRecord { target: "/dev/sdb".into(), ..r.clone() };
    let mut w = world(vec![d.clone()]);
    w.records = vec![old.clone()];
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: r.name.clone(),
        link: Some("/dev/sdb".into()),
        device: Some("sdb".into()),
    }];
    w.pvs = vec![PvDisk { host_path: r.host_path.clone(), disk: Some(r.disk.clone()), device: None, unbound: false }];
    assert_eq!(
        plan(&w).actions,
        vec![LinkAction::Retarget(ClaimRecord {
            target: r.target.clone(),
            previous: Some("/dev/sdb".into()),
            ..r.clone()
        })]
    );
}

#[test]
fn a_multipath_map_and_its_paths_are_one_disk() {
    let mut map = disk("dm-3", "dm:mpath-3600508b400105e210000900000490000");
    map.kind = Some(DeviceKind::Selectable(DeviceType::Multipath));
    map.by_id =
        vec!["wwn-0x600508b400105e210000900000490000".into(), "dm-uuid-mpath-3600508b400105e210000900000490000".into()];
    // Its own map's name, which udev never moves to a path.
    assert_eq!(link_target(&map).as_deref(), Some("/dev/disk/by-id/dm-uuid-mpath-3600508b400105e210000900000490000"));
    let path = disk("sdc", "wwid:naa.600508b400105e210000900000490000");
    let sel = DeviceSelector { types: vec![DeviceType::Disk, DeviceType::Multipath], ..Default::default() };
    // The map claimed: a path (multipath flushed, say) is not a new disk.
    let mut w = world(vec![path.clone()]);
    w.classes = vec![class("fast", Some(sel.clone()))];
    w.records = vec![record("fast", &map)];
    assert!(matches!(verdict(&plan(&w), "fast", "sdc"), Verdict::Refused(Refusal::ClaimedElsewhere(_))));
    // A PV recorded the map: the path is already a volume.
    let mut w = world(vec![path]);
    w.classes = vec![class("fast", Some(sel))];
    w.pvs = vec![PvDisk { host_path: "/mnt/x/y".into(), disk: map.stable_id.clone(), device: None, unbound: false }];
    assert!(matches!(verdict(&plan(&w), "fast", "sdc"), Verdict::Refused(Refusal::AlreadyVolume(_))));
    assert!(ids_overlap("dm:mpath-2002538b71b2c3d4", "wwid:eui.002538B71B2C3D4/part1@2048"));
    assert!(!ids_overlap("dm:mpath-3600a", "wwid:naa.600b"));
}

#[test]
fn a_link_re_pointed_this_pass_without_a_pv_is_still_judged_before_it_is_published() {
    let mut d = disk("loop5", "loop:/img/a@0#1");
    d.kind = Some(DeviceKind::Selectable(DeviceType::Loop));
    d.by_id.clear();
    d.probe = Probe {
        done: true,
        in_use: None,
        content: Content::NotBlank("ext4 superblock at 1080".into()),
        activity: None,
    };
    let r = ClaimRecord { target: "/dev/loop3".into(), ..record("fast", &d) };
    let sel = DeviceSelector { types: vec![DeviceType::Loop], ..Default::default() };
    let mut w = world(vec![d.clone()]);
    w.classes = vec![class("fast", Some(sel))];
    w.records = vec![r.clone()];
    // After a reordering its link leads to loop3, someone else's device.
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: r.name.clone(),
        link: Some("/dev/loop3".into()),
        device: Some("loop3".into()),
    }];
    let p = plan(&w);
    assert!(matches!(&p.actions[..], [LinkAction::Retarget(x)] if x.target == "/dev/loop5"), "{:?}", p.actions);
    assert_eq!(p.held.len(), 1, "held in the same pass: {p:?}");
    // Not probed yet: asked for, and not published meanwhile (the second plan has the probe).
    w.devices[0].probe = Probe::default();
    assert!(plan(&w).to_probe.contains("loop5"));
    // The commands know no PVs: a recorded device is never probed or held there.
    w.pvs_known = false;
    let p = plan(&w);
    assert!(p.to_probe.is_empty() && p.held.is_empty(), "{p:?}");
}

#[test]
fn a_link_cut_short_while_re_pointing_is_still_ours() {
    let d = disk("sdb", "wwid:naa.1");
    let r = ClaimRecord { previous: Some("/dev/sdb".into()), ..record("fast", &d) };
    let mut w = world(vec![d]);
    w.records = vec![r.clone()];
    w.pvs = vec![PvDisk { host_path: r.host_path.clone(), disk: Some(r.disk.clone()), device: None, unbound: false }];
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: r.name.clone(),
        link: Some("/dev/sdb".into()),
        device: Some("sdb".into()),
    }];
    assert!(matches!(&plan(&w).actions[..], [LinkAction::Retarget(_)]), "{:?}", plan(&w).actions);
}

#[test]
fn host_dirs_are_compared_cleaned_and_excluding_a_disk_excludes_its_partitions() {
    let d = disk("sdb", "wwid:naa.1");
    let r = record("fast", &d);
    let mut w = world(vec![d]);
    w.classes[0].host_dir = "/mnt//fast/".into();
    w.records = vec![ClaimRecord { host_path: host_path("/mnt//fast/", &r.name), ..r.clone() }];
    w.entries = vec![link_entry("fast", &r.name, Some("sdb"))];
    w.pvs = vec![PvDisk {
        host_path: format!("/mnt/fast/{}", r.name),
        disk: Some(r.disk.clone()),
        device: None,
        unbound: false,
    }];
    w.classes[0].selector = None;
    let p = plan(&w);
    assert!(p.actions.is_empty(), "its PV is found, so its link is kept: {:?}", p.actions);
    let mut part = disk("sda1", "wwid:os/part1@2048");
    part.kind = Some(DeviceKind::Selectable(DeviceType::Partition));
    part.parent = Some("sda".into());
    let sel = DeviceSelector { types: vec![DeviceType::Partition], exclude: vec!["sda".into()], ..Default::default() };
    let p = plan(&World { classes: vec![class("fast", Some(sel))], devices: vec![part], ..Default::default() });
    assert!(matches!(verdict(&p, "fast", "sda1"), Verdict::NotSelected(ref w) if w.contains("excluded")));
}

/// A probe that finished with these findings (`in_use`, `activity`: why, when found).
fn finished_probe(in_use: Option<&str>, activity: Option<&str>, content: Content) -> Probe {
    Probe { done: true, in_use: in_use.map(Into::into), content, activity: activity.map(Into::into) }
}

/// The findings a probe of a recorded device can give, and whether each is foreign use.
fn findings() -> Vec<(&'static str, Probe, bool)> {
    let p = finished_probe;
    vec![
        ("clean", p(None, None, Content::Blank), false),
        ("mounted", p(Some("it is mounted at /srv"), None, Content::NotProbed), true),
        ("writer", p(None, Some("someone is using it: 3 writes (12 KiB)"), Content::Blank), true),
        ("opener", p(None, Some("a process has it open: dd (pid 9)"), Content::Blank), true),
        ("signature", p(None, None, Content::NotBlank("ext4 superblock at 1024".into())), true),
        ("busy", p(None, None, Content::Busy), true),
        ("unreadable", p(None, None, Content::Unreadable("EIO".into())), true),
        ("not probed", Probe::default(), false),
    ]
}

#[test]
fn exhaustively_a_recorded_device_is_checked_only_while_no_tenant_has_it() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Pv {
        None,
        Unbound,
        Bound,
    }
    for pv in [Pv::None, Pv::Unbound, Pv::Bound] {
        for held in [None, Some("while its PV was unbound: a writer")] {
            for pvs_known in [true, false] {
                for (what, probe, foreign) in findings() {
                    for unseen in [None, Some("its PID namespace is its own and PID 1 is sh")] {
                        let mut d = disk("sdb", "wwid:naa.1");
                        d.probe = probe.clone();
                        let mut r = record("fast", &d);
                        r.held = held.map(Into::into);
                        let mut w = world(vec![d.clone()]);
                        w.pvs_known = pvs_known;
                        w.host_processes_unseen = unseen.map(Into::into);
                        w.records = vec![r.clone()];
                        w.entries = vec![link_entry("fast", &r.name, Some("sdb"))];
                        if pv != Pv::None {
                            w.pvs = vec![PvDisk {
                                host_path: r.host_path.clone(),
                                disk: Some(r.disk.clone()),
                                device: None,
                                unbound: pv == Pv::Unbound,
                            }];
                        }
                        let p = plan(&w);
                        let case =
                            format!("pv {pv:?}, held {held:?}, pvs known {pvs_known}, probe {what}, unseen {unseen:?}");
                        let judged = pvs_known && pv != Pv::Bound;
                        let probed = probe.done;
                        // Without the host's processes, a probe that found no use (in use, a writer)
                        // proves nothing: held as it is, or held for that, never released or taken
                        // for tampering.
                        let unproven = unseen.is_some() && probe.in_use.is_none() && probe.activity.is_none();
                        if judged && probed && unproven {
                            assert!(p.tampered.is_empty() && p.actions.is_empty(), "{case}: {p:?}");
                            let expected: Vec<String> = match held {
                                Some(h) => vec![h.to_string()],
                                None => vec![Refusal::HostProcessesUnseen(unseen.unwrap().into()).to_string()],
                            };
                            let got: Vec<String> = p.held.iter().map(|(_, _, why)| why.clone()).collect();
                            assert_eq!(got, expected, "{case}");
                            continue;
                        }
                        // A tenant's device (bound, or PVs unknown with a PV) is never probed.
                        assert_eq!(p.to_probe.contains("sdb"), judged && !probed, "{case}: to_probe {:?}", p.to_probe);
                        let tampered = judged && probed && pv == Pv::Unbound && (foreign || held.is_some());
                        assert_eq!(!p.tampered.is_empty(), tampered, "{case}: {:?}", p.tampered);
                        if tampered {
                            assert_eq!(p.tampered[0].host_path, r.host_path, "{case}");
                        }
                        let released = judged && probed && pv == Pv::None && held.is_some() && !foreign;
                        assert_eq!(
                            p.actions.iter().any(|a| matches!(a, LinkAction::Release(x) if x.held.is_none())),
                            released,
                            "{case}: {:?}",
                            p.actions
                        );
                        // Held: whatever is found on a device no tenant has, and a hold not yet
                        // lifted, except on a bound PV's device (the tenant's).
                        let held_now =
                            (judged && probed && foreign) || (held.is_some() && !released && pv != Pv::Bound);
                        assert_eq!(!p.held.is_empty(), held_now, "{case}: {:?}", p.held);
                        // Nothing else is ever done to a recorded link by these checks.
                        assert!(
                            p.actions.iter().all(|a| matches!(a, LinkAction::Release(_))),
                            "{case}: {:?}",
                            p.actions
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_writer_refuses_a_new_claim_like_a_mount_does() {
    let mut d = disk("sdb", "wwid:naa.1");
    d.probe.activity = Some("someone is using it: 1 writes (4 KiB)".into());
    assert_eq!(
        verdict(&plan(&world(vec![d])), "fast", "sdb"),
        Verdict::Refused(Refusal::Writer("someone is using it: 1 writes (4 KiB)".into()))
    );
}

#[test]
fn only_pvs_still_unbound_in_the_store_are_withdrawn_for_a_tampered_device() {
    use crate::core::wipe::cleanup::PvState;
    let pv = |name: &str, phase: &str, claimed: bool, deleting: bool| PvState {
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "9".into(),
        phase: phase.into(),
        claimed,
        deleting,
        host_path: format!("/mnt/fast/{name}"),
        ..Default::default()
    };
    let t = |name: &str| Tampered {
        class: "fast".into(),
        name: name.into(),
        host_path: format!("/mnt/fast/{name}"),
        why: "x".into(),
    };
    let pvs = vec![
        pv("a", "Available", false, false),
        pv("b", "Bound", true, false),
        pv("c", "Released", true, false),
        pv("d", "Available", false, true),
        pv("e", "Pending", false, false),
        pv("f", "Available", true, false),
    ];
    let all: Vec<Tampered> = ["a", "b", "c", "d", "e", "f", "gone", "a"].iter().map(|n| t(n)).collect();
    let got: Vec<(String, String, String)> =
        tamper_withdrawals(&pvs, &all).into_iter().map(|(n, u, rv, _)| (n, u, rv)).collect();
    assert_eq!(
        got,
        vec![("a".into(), "uid-a".into(), "9".into()), ("e".into(), "uid-e".into(), "9".into())],
        "unbound, not deleting, once each, with the resourceVersion seen"
    );
}

#[test]
fn loop_link_names_come_from_the_inode_and_are_distinct_per_file_range_and_partition() {
    let cases = [
        ("loop:7:0:9978155@0", "loop-9978155-"),
        ("loop:7:0:9978155@0+4096", "loop-9978155-"),
        ("loop:0:45:12@1048576", "loop-12-"),
        ("loop:7:0:12@0/part1@2048", "loop-12-part1-"),
        ("loop:7:0:12@0/part2@4096", "loop-12-part2-"),
        // Links of earlier versions keep the names their records hold; the old rule is kept.
        ("loop:/var/lib/disks/a.img@0#1234", "loop-a.img-"),
    ];
    let mut seen = BTreeSet::new();
    for (id, prefix) in cases {
        let n = link_name(id);
        assert!(n.starts_with(prefix) && n.len() == prefix.len() + 8, "{id}: {n}");
        assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{n}");
        assert!(seen.insert(n.clone()), "two ids named {n}");
    }
    // Another filesystem, range or inode is another name; the path never enters it.
    let names: BTreeSet<String> =
        ["loop:7:0:12@0", "loop:7:1:12@0", "loop:7:0:12@512", "loop:7:0:12@0+512", "loop:7:0:13@0"]
            .iter()
            .map(|id| link_name(id))
            .collect();
    assert_eq!(names.len(), 5, "{names:?}");
}

#[test]
fn loop_ids_overlap_by_file_and_range_in_either_format() {
    let cases = [
        ("loop:7:0:5@0", "loop:7:0:5@0", true),
        ("loop:7:0:5@0", "loop:/img/a.img@0#5", true),
        ("loop:7:0:5@0", "loop:/renamed.img@0#5", true),
        ("loop:7:0:5@0", "loop:7:0:5@1048576", true),
        ("loop:7:0:5@0+4096", "loop:7:0:5@4096", false),
        ("loop:7:0:5@0", "loop:7:1:5@0", false),
        ("loop:7:0:5@0", "loop:7:0:6@0", false),
        ("loop:7:0:5@0", "loop:7:0:5@0/part1@2048", true),
        ("loop:7:0:5@0/part1@2048", "loop:7:0:5@0/part2@4096", false),
        ("loop:7:0:5@0/part1@2048", "loop:/img/a.img@0#5/part1@2048", true),
        ("loop:7:0:5@0", "wwid:naa.5", false),
    ];
    for (a, b, want) in cases {
        assert_eq!(ids_overlap(a, b), want, "{a} vs {b}");
        assert_eq!(ids_overlap(b, a), want, "symmetric: {a} vs {b}");
    }
}

#[test]
fn old_loop_ids_are_read_as_the_ids_devices_report_now() {
    let present = ["loop:7:0:5@0", "loop:7:0:5@4096", "loop:7:0:6@0", "wwid:naa.1"];
    let now = |id: &str, backing| current_loop_id(id, backing, present.iter().copied());
    assert_eq!(now("loop:/img/a.img@0#5", None), "loop:7:0:5@0", "a claim record of an earlier version");
    assert_eq!(now("loop:/renamed.img@4096#5", None), "loop:7:0:5@4096");
    assert_eq!(now("loop:/img/a.img@0#5", Some("7:0")), "loop:7:0:5@0");
    assert_eq!(now("loop:/img/a.img@0#5", Some("7:3")), "loop:7:3:5@0", "a PV's backing: converted exactly");
    assert_eq!(now("loop:/img/a.img@0#9", None), "loop:/img/a.img@0#9", "no such device: left as it is");
    assert_eq!(now("loop:7:0:5@0", None), "loop:7:0:5@0");
    assert_eq!(now("wwid:naa.1", None), "wwid:naa.1");
    // Two filesystems with that inode and range: which one cannot be told.
    let two = ["loop:7:0:5@0", "loop:7:1:5@0"];
    assert_eq!(current_loop_id("loop:/a.img@0#5", None, two.iter().copied()), "loop:/a.img@0#5");
}

#[test]
fn a_claim_recorded_by_an_earlier_version_still_finds_its_loop_device() {
    let mut lp = disk("loop3", "loop:7:0:12@0");
    lp.kind = Some(DeviceKind::Selectable(DeviceType::Loop));
    lp.by_id.clear();
    let old_id = "loop:/var/lib/img/a.img@0#12";
    let name = link_name(old_id);
    let r = ClaimRecord {
        class: "fast".into(),
        host_path: host_path("/mnt/fast", &name),
        name: name.clone(),
        disk: current_loop_id(old_id, None, std::iter::once("loop:7:0:12@0")),
        target: "/dev/loop3".into(),
        previous: None,
        held: None,
    };
    let mut w = world(vec![lp]);
    w.classes[0].selector = Some(DeviceSelector { types: vec![DeviceType::Loop], ..Default::default() });
    w.records = vec![r];
    w.entries = vec![DirEntry {
        unanswered: false,
        class: "fast".into(),
        name: name.clone(),
        link: Some("/dev/loop3".into()),
        device: Some("loop3".into()),
    }];
    let p = plan(&w);
    assert_eq!(verdict(&p, "fast", "loop3"), Verdict::Claimed { name }, "{p:?}");
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}
