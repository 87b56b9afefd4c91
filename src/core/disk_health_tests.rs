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
        (
            Signs { io_failure: Some("statx /v: EIO".into()), ..Signs::default() },
            vec![Failing::IoFailure("statx /v: EIO".into())],
        ),
    ];
    for (signs, want) in cases {
        assert_eq!(m.judge("a", &signs, now), want, "{signs:?}");
    }
    // None of them is remembered: only I/O error counters are.
    assert!(m.is_empty());
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
    };
    let first = m.judge("a", &signs, t0);
    assert_eq!(
        first,
        vec![
            Failing::ReadOnly,
            Failing::FilesystemErrors { count: 3 },
            Failing::ShutDown,
            Failing::IoFailure("EIO".into())
        ]
    );
    signs.io_errors = Some(12);
    let codes: Vec<&str> = m.judge("a", &signs, t0 + SEC).iter().map(Failing::code).collect();
    assert_eq!(codes, ["read-only", "filesystem-errors", "shut-down", "io-errors", "io-failure"]);
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
}

// --- plan_health: every PV state against every kind of sign ---

fn pv_state(phase: &str, claimed: bool, deleting: bool, annotated: Option<&str>) -> crate::core::cleanup::PvState {
    crate::core::cleanup::PvState {
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
    ];
    for phase in ["Available", "Pending", "Bound", "Released", "Failed", ""] {
        for claimed in [false, true] {
            for deleting in [false, true] {
                for annotated in [None, Some("read-only: old")] {
                    for signs in &kinds {
                        let pv = pv_state(phase, claimed, deleting, annotated);
                        let failing: BTreeMap<String, Vec<Failing>> = if signs.is_empty() {
                            BTreeMap::new()
                        } else {
                            BTreeMap::from([("/mnt/disks/a".to_string(), signs.clone())])
                        };
                        let actions = plan_health(std::slice::from_ref(&pv), &failing);
                        let case = format!("{phase} claimed={claimed} deleting={deleting} ann={annotated:?} {signs:?}");
                        let unbound = !claimed && !deleting && matches!(phase, "Available" | "Pending");
                        let really_failing = signs.iter().any(|f| !matches!(f, Failing::Unresponsive(_)));
                        let withdrawn = actions.iter().any(|a| matches!(a, HealthAction::Withdraw { .. }));
                        // Only an unbound PV on a disk with a real failing sign is ever deleted.
                        assert_eq!(withdrawn, unbound && really_failing, "{case}");
                        if let Some(HealthAction::Withdraw { resource_version, .. }) = actions.first() {
                            assert_eq!(resource_version, "7", "withdrawn under its resourceVersion: {case}");
                        }
                        if signs.is_empty() {
                            let unflagged = actions == vec![HealthAction::Unflag { name: "pv".into() }];
                            assert_eq!(unflagged, annotated.is_some(), "{case}");
                            assert!(annotated.is_some() || actions.is_empty(), "{case}");
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
    assert!(plan_health(std::slice::from_ref(&pv), &failing).is_empty());
    let elsewhere = BTreeMap::from([("/mnt/disks/b".to_string(), vec![Failing::ShutDown])]);
    let fresh = pv_state("Bound", true, false, None);
    assert!(plan_health(&[fresh], &elsewhere).is_empty());
    assert!(value.starts_with("read-only: "));
    let two = annotation_value(&[Failing::ReadOnly, Failing::FilesystemErrors { count: 1 }]);
    assert!(two.contains("; filesystem-errors: "), "{two}");
}
