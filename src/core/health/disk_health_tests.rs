use super::*;

const SEC: Duration = Duration::from_secs(1);

fn io(count: Option<u64>) -> Signs {
    Signs { io_errors: count, ..Signs::default() }
}

/// Feeds `looks` (seconds after t0, count) to one key and returns what each look judged.
fn run(looks: &[(u64, Option<u64>)]) -> Vec<Vec<Failing>> {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    looks.iter().map(|&(s, c)| m.judge("disk", &io(c), t0 + Duration::from_secs(s))).collect()
}

fn rise(new: u64) -> Vec<Failing> {
    vec![Failing::IoErrors { new }]
}

#[test]
fn healthy_signs_judge_nothing() {
    let mut m = HealthMemory::default();
    let now = Instant::now();
    assert_eq!(m.judge("a", &Signs::default(), now), vec![]);
    assert_eq!(m.judge("a", &Signs { fs_errors: Some(0), ..Signs::default() }, now), vec![]);
    assert_eq!(m.judge("a", &Signs { io_errors: Some(0), ..Signs::default() }, now), vec![]);
    assert_eq!(m.judge("a", &Signs { io_errors: Some(0), ..Signs::default() }, now + SEC), vec![]);
}

#[test]
fn each_state_sign_alone() {
    let mut m = HealthMemory::default();
    let now = Instant::now();
    let cases = [
        (Signs { read_only: true, ..Signs::default() }, vec![Failing::ReadOnly]),
        (Signs { fs_errors: Some(1), ..Signs::default() }, vec![Failing::FilesystemErrors { count: 1 }]),
        (Signs { fs_errors: Some(u64::MAX), ..Signs::default() }, vec![Failing::FilesystemErrors { count: u64::MAX }]),
        (Signs { shut_down: true, ..Signs::default() }, vec![Failing::ShutDown]),
    ];
    for (signs, want) in cases {
        assert_eq!(m.judge("a", &signs, now), want, "{signs:?}");
    }
    // None of them is remembered: only I/O error counters and I/O failures are.
    assert!(m.is_empty());
    let failure = Signs { io_failure: Some("statx /v: EIO".into()), ..Signs::default() };
    assert_eq!(m.judge("a", &failure, now), vec![Failing::IoFailure("statx /v: EIO".into())]);
    assert_eq!(m.len(), 1);
}

#[test]
fn all_signs_at_once_come_in_a_stable_order() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    let mut signs = Signs {
        read_only: true,
        fs_errors: Some(3),
        shut_down: true,
        io_errors: Some(10),
        io_failure: Some("EIO".into()),
        size: Some(SizeFacts { bytes: 64 << 20, device_bytes: Some(32 << 20), fixed: true }),
        devices: vec!["loop1".into()],
        instance: "mount 40".into(),
    };
    let first = m.judge("a", &signs, t0);
    assert_eq!(
        first,
        vec![
            Failing::ReadOnly,
            Failing::FilesystemErrors { count: 3 },
            Failing::ShutDown,
            Failing::IoFailure("EIO".into()),
            Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: true },
        ]
    );
    signs.io_errors = Some(12);
    let codes: Vec<&str> = m.judge("a", &signs, t0 + SEC).iter().map(Failing::code).collect();
    assert_eq!(codes, ["read-only", "filesystem-errors", "shut-down", "io-errors", "io-failure", "shrunk"]);
}

#[test]
fn state_signs_clear_when_repaired() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    let bad = Signs { read_only: true, fs_errors: Some(2), shut_down: true, ..Signs::default() };
    assert_eq!(m.judge("a", &bad, t0).len(), 3);
    // fsck reset the count, the filesystem was mounted again: healthy at once, no hold.
    assert_eq!(m.judge("a", &Signs { fs_errors: Some(0), ..Signs::default() }, t0 + SEC), vec![]);
    // An unreadable count is not a failure either.
    assert_eq!(m.judge("a", &Signs::default(), t0 + 2 * SEC), vec![]);
}

#[test]
fn an_old_count_is_no_failure() {
    assert_eq!(run(&[(0, Some(57)), (1, Some(57)), (700, Some(57))]), vec![vec![]; 3]);
}

#[test]
fn a_rise_fails_for_the_hold_after_the_last_rise() {
    let hold = IO_ERROR_HOLD.as_secs();
    let looks = [
        (0, Some(5)),
        (10, Some(7)),            // rise: 2 new
        (11, Some(7)),            // holding
        (10 + hold - 1, Some(7)), // last second of the hold
        (10 + hold, Some(7)),     // hold over: clears
        (10 + hold + 1, Some(7)),
    ];
    assert_eq!(run(&looks), vec![vec![], rise(2), rise(2), rise(2), vec![], vec![]]);
}

#[test]
fn further_rises_extend_the_hold_and_add_up() {
    let hold = IO_ERROR_HOLD.as_secs();
    let looks = [
        (0, Some(0)),
        (1, Some(1)),
        (hold, Some(4)),         // still in the first hold: extends it, 4 new in all
        (hold + 2, Some(4)),     // past the first rise's hold, within the second's
        (2 * hold - 1, Some(4)), // last second
        (2 * hold, Some(4)),
    ];
    assert_eq!(run(&looks), vec![vec![], rise(1), rise(4), rise(4), rise(4), vec![]]);
}

#[test]
fn a_new_episode_counts_from_the_end_of_the_last() {
    let hold = IO_ERROR_HOLD.as_secs();
    let looks = [
        (0, Some(3)),
        (1, Some(8)),        // 5 new
        (1 + hold, Some(8)), // over; 8 is the new baseline
        (2 + hold, Some(9)), // 1 new, not 6
        (3 + hold, Some(9)),
        (2 + 2 * hold, Some(9)),
    ];
    assert_eq!(run(&looks), vec![vec![], rise(5), vec![], rise(1), rise(1), vec![]]);
}

#[test]
fn a_rise_seen_only_after_the_hold_is_a_new_episode() {
    let hold = IO_ERROR_HOLD.as_secs();
    // The episode ended between looks; the rise seen at the same look as its end starts the next.
    let looks = [(0, Some(0)), (1, Some(2)), (5 * hold, Some(3))];
    assert_eq!(run(&looks), vec![vec![], rise(2), rise(1)]);
}

#[test]
fn a_lower_count_is_a_new_device_and_ends_the_episode() {
    let looks = [
        (0, Some(10)),
        (1, Some(12)),
        (2, Some(0)), // counter reset (device re-created, or a wrap)
        (3, Some(0)),
        (4, Some(1)), // a rise from the new baseline
    ];
    assert_eq!(run(&looks), vec![vec![], rise(2), vec![], vec![], rise(1)]);
}

#[test]
fn an_unreadable_count_neither_rises_nor_recovers() {
    let hold = IO_ERROR_HOLD.as_secs();
    let looks = [
        (0, None),    // nothing known, nothing remembered
        (1, Some(4)), // baseline
        (2, Some(6)),
        (3, None), // the episode goes on
        (4, Some(6)),
        (5, None),
        (2 + hold, None), // and ends on time
        (3 + hold, Some(6)),
        (4 + hold, Some(7)),
    ];
    assert_eq!(run(&looks), vec![vec![], vec![], rise(2), rise(2), rise(2), rise(2), vec![], vec![], rise(1)]);
}

#[test]
fn unknown_counter_leaves_no_memory() {
    let mut m = HealthMemory::default();
    let now = Instant::now();
    for k in 0..100 {
        m.judge(&format!("k{k}"), &io(None), now);
    }
    assert!(m.is_empty());
}

#[test]
fn keys_are_independent() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    assert_eq!(m.judge("a", &io(Some(1)), t0), vec![]);
    assert_eq!(m.judge("b", &io(Some(100)), t0), vec![]);
    assert_eq!(m.judge("a", &io(Some(3)), t0 + SEC), rise(2));
    // "b" first seen at 100; a look at "a"'s count does not move it.
    assert_eq!(m.judge("b", &io(Some(100)), t0 + SEC), vec![]);
    assert_eq!(m.judge("b", &io(Some(101)), t0 + 2 * SEC), rise(1));
    assert_eq!(m.clears_at("a"), Some(t0 + SEC + IO_ERROR_HOLD));
    assert_eq!(m.clears_at("b"), Some(t0 + 2 * SEC + IO_ERROR_HOLD));
    assert_eq!(m.clears_at("c"), None);
}

#[test]
fn clears_at_follows_the_episode() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    m.judge("a", &io(Some(0)), t0);
    assert_eq!(m.clears_at("a"), None);
    m.judge("a", &io(Some(1)), t0 + SEC);
    assert_eq!(m.clears_at("a"), Some(t0 + SEC + IO_ERROR_HOLD));
    m.judge("a", &io(Some(2)), t0 + 5 * SEC);
    assert_eq!(m.clears_at("a"), Some(t0 + 5 * SEC + IO_ERROR_HOLD));
    m.judge("a", &io(Some(2)), t0 + 5 * SEC + IO_ERROR_HOLD);
    assert_eq!(m.clears_at("a"), None);
}

#[test]
fn retain_bounds_the_memory() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    for k in 0..1000 {
        m.judge(&format!("k{k}"), &io(Some(k)), t0);
    }
    assert_eq!(m.len(), 1000);
    m.retain(|k| k == "k7" || k == "k8");
    assert_eq!(m.len(), 2);
    // A forgotten key starts again from its first count: no failure from the old baseline.
    assert_eq!(m.judge("k9", &io(Some(500)), t0 + SEC), vec![]);
    assert_eq!(m.judge("k7", &io(Some(8)), t0 + SEC), rise(1));
    m.retain(|_| false);
    assert!(m.is_empty());
}

#[test]
fn time_going_backwards_does_not_panic_or_clear() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now() + 100 * SEC;
    m.judge("a", &io(Some(0)), t0);
    assert_eq!(m.judge("a", &io(Some(1)), t0), rise(1));
    assert_eq!(m.judge("a", &io(Some(1)), t0 - 50 * SEC), rise(1));
}

#[test]
fn codes_are_stable_kebab_case_and_sentences_read() {
    let all = [
        Failing::ReadOnly,
        Failing::FilesystemErrors { count: 1 },
        Failing::FilesystemErrors { count: 2 },
        Failing::ShutDown,
        Failing::IoErrors { new: 1 },
        Failing::IoErrors { new: 30 },
        Failing::IoFailure("statx /mnt/disks/v1: Input/output error (os error 5)".into()),
        Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: false },
        Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: true },
        Failing::KernelLog("I/O error, dev sdb, sector 8".into()),
    ];
    for f in &all {
        let code = f.code();
        assert!(!code.is_empty() && code.chars().all(|c| c.is_ascii_lowercase() || c == '-'), "{code}");
        let text = f.to_string();
        assert!(text.starts_with(|c: char| c.is_ascii_lowercase()), "{text}");
        assert!(!text.ends_with('.'), "{text}");
    }
    assert_eq!(
        all[1].to_string(),
        "the filesystem has recorded 1 error (ext4 errors_count); it stays so until fsck repairs it"
    );
    assert!(all[2].to_string().contains("2 errors"));
    assert_eq!(all[4].to_string(), "the disk reported 1 new I/O error (block-layer error counter)");
    assert!(all[5].to_string().contains("30 new I/O errors"));
    assert!(all[6].to_string().ends_with("statx /mnt/disks/v1: Input/output error (os error 5)"));
    assert_eq!(
        all[7].to_string(),
        "the volume is 32 MiB now, smaller than the 64 MiB its PV offers: writes beyond its end fail"
    );
    assert_eq!(
        all[8].to_string(),
        "the filesystem (64 MiB) is larger than its device now (32 MiB): writes beyond the device's end fail"
    );
    assert_eq!(all[9].to_string(), "the kernel log says: I/O error, dev sdb, sector 8");
}

// --- plan_health: every PV state against every kind of sign ---

fn pv_state(
    phase: &str,
    claimed: bool,
    deleting: bool,
    annotated: Option<&str>,
) -> crate::core::wipe::cleanup::PvState {
    crate::core::wipe::cleanup::PvState {
        name: "pv".into(),
        uid: "u".into(),
        resource_version: "7".into(),
        phase: phase.into(),
        claimed,
        deleting,
        host_path: "/mnt/disks/a".into(),
        disk_failing: annotated.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn plan_health_withdraws_only_unbound_pvs_on_failing_disks_and_annotates_the_rest() {
    let kinds: Vec<Vec<Failing>> = vec![
        vec![],
        vec![Failing::Unresponsive("its used mark write has not answered".into())],
        vec![Failing::ReadOnly],
        vec![Failing::FilesystemErrors { count: 2 }, Failing::Unresponsive("x".into())],
        vec![Failing::ShutDown],
        vec![Failing::IoErrors { new: 1 }],
        vec![Failing::IoFailure("EIO".into())],
        vec![Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: false }],
        vec![Failing::KernelLog("I/O error, dev sdb, sector 8".into())],
    ];
    for phase in ["Available", "Pending", "Bound", "Released", "Failed", ""] {
        for claimed in [false, true] {
            for deleting in [false, true] {
                for annotated in [None, Some("read-only: old")] {
                    for (signs, looked) in kinds.iter().flat_map(|k| [(k, true), (k, false)]) {
                        let pv = pv_state(phase, claimed, deleting, annotated);
                        let failing: BTreeMap<String, Vec<Failing>> = if signs.is_empty() {
                            BTreeMap::new()
                        } else {
                            BTreeMap::from([("/mnt/disks/a".to_string(), signs.clone())])
                        };
                        // A disk with signs was looked at; one without may or may not have been.
                        let judged: BTreeSet<String> =
                            (looked || !signs.is_empty()).then(|| "/mnt/disks/a".to_string()).into_iter().collect();
                        let actions = plan_health(std::slice::from_ref(&pv), &failing, &judged);
                        let case = format!(
                            "{phase} claimed={claimed} deleting={deleting} ann={annotated:?} {signs:?} looked={looked}"
                        );
                        let unbound = !claimed && !deleting && matches!(phase, "Available" | "Pending");
                        let really_failing = signs.iter().any(|f| !matches!(f, Failing::Unresponsive(_)));
                        let withdrawn = actions.iter().any(|a| matches!(a, HealthAction::Withdraw { .. }));
                        // Only an unbound PV on a disk with a real failing sign is ever deleted.
                        assert_eq!(withdrawn, unbound && really_failing, "{case}");
                        if let Some(HealthAction::Withdraw { resource_version, .. }) = actions.first() {
                            assert_eq!(resource_version, "7", "withdrawn under its resourceVersion: {case}");
                        }
                        if signs.is_empty() {
                            // Cleared only when proven: looked at and found healthy.
                            let unflagged = actions == vec![HealthAction::Unflag { name: "pv".into() }];
                            assert_eq!(unflagged, annotated.is_some() && looked, "{case}");
                            assert!(unflagged || actions.is_empty(), "{case}");
                        } else if deleting && !claimed {
                            assert!(actions.is_empty(), "a PV being withdrawn is left to go: {case}");
                        } else if !withdrawn {
                            assert_eq!(
                                actions,
                                vec![HealthAction::Flag { name: "pv".into(), value: annotation_value(signs) }],
                                "{case}"
                            );
                        }
                        assert!(actions.len() <= 1, "{case}");
                    }
                }
            }
        }
    }
}

#[test]
fn plan_health_does_not_repeat_an_annotation_already_there_and_ignores_other_volumes() {
    let signs = vec![Failing::ReadOnly];
    let value = annotation_value(&signs);
    let pv = pv_state("Bound", true, false, Some(&value));
    let failing = BTreeMap::from([("/mnt/disks/a".to_string(), signs)]);
    let judged = BTreeSet::from(["/mnt/disks/a".to_string(), "/mnt/disks/b".to_string()]);
    assert!(plan_health(std::slice::from_ref(&pv), &failing, &judged).is_empty());
    let elsewhere = BTreeMap::from([("/mnt/disks/b".to_string(), vec![Failing::ShutDown])]);
    let fresh = pv_state("Bound", true, false, None);
    assert!(plan_health(&[fresh], &elsewhere, &judged).is_empty());
    assert!(value.starts_with("read-only: "));
    let two = annotation_value(&[Failing::ReadOnly, Failing::FilesystemErrors { count: 1 }]);
    assert!(two.contains("; filesystem-errors: "), "{two}");
}

/// I/O failures met in a look or witnessed elsewhere hold for IO_FAILURE_HOLD after the last.
#[test]
fn io_failures_hold_after_the_last_one_and_the_latest_says_why() {
    let t0 = Instant::now();
    let failure = |what: &str| Signs { io_failure: Some(what.into()), ..Signs::default() };
    let clean = Signs::default();
    let hold = IO_FAILURE_HOLD;
    // (seconds after t0, what the look met (None: a clean read), witnessed then, want)
    type Step = (u64, Option<&'static str>, Option<&'static str>, Option<&'static str>);
    let table: &[(&str, &[Step])] = &[
        (
            "one EIO, then clean reads: held, then cleared",
            &[
                (0, Some("EIO a"), None, Some("EIO a")),
                (1, None, None, Some("EIO a")),
                (hold.as_secs() - 1, None, None, Some("EIO a")),
                (hold.as_secs(), None, None, None),
                (hold.as_secs() + 1, None, None, None),
            ],
        ),
        (
            "a later EIO extends the hold and names itself",
            &[
                (0, Some("EIO a"), None, Some("EIO a")),
                (100, Some("EIO b"), None, Some("EIO b")),
                (hold.as_secs(), None, None, Some("EIO b")),
                (hold.as_secs() + 100, None, None, None),
            ],
        ),
        (
            "a witnessed failure (a mark write) counts at the next look",
            &[
                (0, None, Some("fsync: EIO"), Some("fsync: EIO")),
                (5, None, None, Some("fsync: EIO")),
                (hold.as_secs() + 5, None, None, None),
            ],
        ),
        (
            "the look's own failure wins over an older witness",
            &[(0, None, Some("fsync: EIO"), Some("fsync: EIO")), (5, Some("statx: EIO"), None, Some("statx: EIO"))],
        ),
    ];
    for (name, steps) in table {
        let mut m = HealthMemory::default();
        for &(at, met, witnessed, want) in *steps {
            let now = t0 + Duration::from_secs(at);
            if let Some(w) = witnessed {
                m.witness("v", w, now);
            }
            let signs = met.map_or_else(|| clean.clone(), failure);
            let got = m.judge("v", &signs, now);
            let want: Vec<Failing> = want.map(|w| Failing::IoFailure(w.into())).into_iter().collect();
            assert_eq!(got, want, "{name} at {at}s");
        }
    }
    // Forgotten with its key.
    let mut m = HealthMemory::default();
    m.witness("v", "EIO", t0);
    m.retain(|k| k != "v");
    assert!(m.is_empty());
    assert_eq!(m.judge("v", &clean, t0), vec![]);
}

fn size(bytes: u64, device_bytes: Option<u64>, fixed: bool) -> SizeFacts {
    SizeFacts { bytes, device_bytes, fixed }
}

#[test]
fn shrunk_and_grown_against_the_pv_capacity_and_rounding() {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    // (PV capacity, size now, device under it, fixed, shrunk, grown)
    type Case = (Option<u64>, u64, Option<u64>, bool, Option<Failing>, Option<(u64, u64)>);
    let table: &[Case] = &[
        // Unchanged: the PV offers the size rounded down; nothing either way.
        (Some(10 * GIB), 10 * GIB + 500 * MIB, None, true, None, None),
        (Some(64 * MIB), 64 * MIB, Some(64 * MIB), true, None, None),
        (Some(5 * MIB + 3), 5 * MIB + 3, None, true, None, None),
        // Below the PV's rounded capacity by one byte: shrunk (writes beyond it fail).
        (
            Some(10 * GIB),
            10 * GIB - 1,
            None,
            true,
            Some(Failing::Shrunk { was: 10 * GIB, now: 10 * GIB - 1, device: false }),
            None,
        ),
        // A block device halved.
        (
            Some(64 * MIB),
            32 * MIB,
            None,
            true,
            Some(Failing::Shrunk { was: 64 * MIB, now: 32 * MIB, device: false }),
            None,
        ),
        // Grown within the rounding step: the PV would offer the same: nothing.
        (Some(10 * GIB), 10 * GIB + 1023 * MIB, None, true, None, None),
        // Grown past it: told, not failing.
        (Some(10 * GIB), 11 * GIB, None, true, None, Some((10 * GIB, 11 * GIB))),
        (Some(32 * MIB), 64 * MIB, None, true, None, Some((32 * MIB, 64 * MIB))),
        // A pooled filesystem's size moves with its neighbours: never compared with the PV.
        (Some(10 * GIB), 5 * GIB, None, false, None, None),
        (Some(10 * GIB), 50 * GIB, None, false, None, None),
        // A filesystem larger than its device: shrunk whatever the PV says, even with no PV.
        (
            None,
            64 * MIB,
            Some(32 * MIB),
            true,
            Some(Failing::Shrunk { was: 64 * MIB, now: 32 * MIB, device: true }),
            None,
        ),
        (
            Some(64 * MIB),
            64 * MIB,
            Some(32 * MIB),
            false,
            Some(Failing::Shrunk { was: 64 * MIB, now: 32 * MIB, device: true }),
            None,
        ),
        // A device larger than its filesystem (grown, not resized yet) is fine.
        (Some(64 * MIB), 64 * MIB, Some(128 * MIB), true, None, None),
        // No PV: no capacity to compare.
        (None, 32 * MIB, None, true, None, None),
    ];
    for (capacity, bytes, device, fixed, want_shrunk, want_grown) in table {
        let facts = size(*bytes, *device, *fixed);
        assert_eq!(shrunk(*capacity, &facts), *want_shrunk, "{capacity:?} {facts:?}");
        assert_eq!(grown(*capacity, &facts), *want_grown, "{capacity:?} {facts:?}");
    }
}

#[test]
fn a_shrunk_volume_is_judged_failing_with_its_pv_capacity() {
    let mut m = HealthMemory::default();
    let now = Instant::now();
    let signs = Signs { size: Some(size(32 << 20, None, true)), ..Signs::default() };
    assert_eq!(
        m.judge_volume("v", &signs, Some(64 << 20), now),
        vec![Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: false }]
    );
    // Without its PV (a new volume) the size alone says nothing.
    assert_eq!(m.judge("v", &signs, now), vec![]);
    assert!(m.is_empty(), "size signs are judged afresh, not remembered");
}

#[test]
fn growth_is_told_once_per_size() {
    let mut m = HealthMemory::default();
    let grown_to = |mib: u64| size(mib << 20, None, true);
    let cap = Some(32u64 << 20);
    assert_eq!(m.growth("v", cap, Some(&grown_to(32))), None);
    assert_eq!(m.growth("v", cap, Some(&grown_to(64))), Some((32 << 20, 64 << 20)));
    assert_eq!(m.growth("v", cap, Some(&grown_to(64))), None, "told once");
    assert_eq!(m.growth("v", cap, None), None, "an unread size forgets what was told");
    assert_eq!(
        m.growth("v", cap, Some(&grown_to(64))),
        Some((32 << 20, 64 << 20)),
        "told again after a look without it"
    );
    assert_eq!(m.growth("v", cap, Some(&grown_to(128))), Some((32 << 20, 128 << 20)), "a new size is told");
    assert_eq!(m.growth("w", None, Some(&grown_to(128))), None, "no PV");
    m.retain(|_| false);
    assert!(m.is_empty());
}

#[test]
fn read_only_after_an_error_or_by_the_operator() {
    // (superblock options, ext4 errors_count, kernel's after an error)
    let table = [
        ("rw", None, false),
        ("rw", Some(3), false),
        // An operator's read-only mount: no errors.
        ("ro", None, false),
        ("ro", Some(0), false),
        ("ro,relatime", Some(0), false),
        // Older kernels' errors=remount-ro: a read-only superblock with errors recorded.
        ("ro", Some(1), true),
        ("ro,errors=remount-ro", Some(7), true),
        // Linux 6.x: the superblock stays rw, emergency_ro says the kernel did it.
        ("rw,errors=remount-ro,emergency_ro", Some(1), true),
        ("rw,emergency_ro", None, true),
        ("ro,shutdown", None, true),
        ("rw,shutdown", Some(0), true),
        // Not the words themselves.
        ("rw,noemergency_ro", None, false),
        ("rw,shutdowns", None, false),
        ("", None, false),
        ("xro", Some(5), false),
    ];
    for (options, errors, want) in table {
        assert_eq!(read_only_after_error(options, errors), want, "{options:?} {errors:?}");
    }
}

#[test]
fn a_volume_instance_is_seen_since_it_first_was() {
    let mut m = HealthMemory::default();
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(60);
    assert_eq!(m.seen_since("v", "mount 40", t0), t0);
    assert_eq!(m.seen_since("v", "mount 40", later), t0, "the same instance: since it was first seen");
    assert_eq!(m.seen_since("v", "mount 41", later), later, "mounted again: a new instance");
    assert_eq!(m.seen_since("w", "mount 40", later), later, "another path");
    m.retain(|k| k != "v");
    assert_eq!(m.seen_since("v", "mount 41", later + Duration::from_secs(1)), later + Duration::from_secs(1));
}
