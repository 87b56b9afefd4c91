use super::*;

const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;
const PIB: u64 = 1024 * TIB;

/// Sizes from nothing to 1 PiB, odd ones included.
fn sizes() -> Vec<u64> {
    let mut out = vec![0, 1, 511, 512, 4095, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, MIB - 1, MIB, MIB + 1];
    out.extend([2 * MIB - 512, 3 * MIB + 7, 100 * MIB, 255 * MIB, 256 * MIB, 256 * MIB + 1, 257 * MIB - 512]);
    out.extend([300 * MIB, 511 * MIB, 512 * MIB, 513 * MIB + 4096, 1000 * MIB + 3, 4 * GIB, 4 * GIB + 512]);
    out.extend([100 * GIB, 100 * GIB + 12345, 1000 * 1000 * 1000 * 1000, TIB, TIB - 512, 8 * TIB, 15 * TIB + 7]);
    out.extend([PIB - 512, PIB, 3 * PIB / 2]);
    out
}

fn covered(windows: &[(u64, u64)], areas: &[(u64, u64)], at: u64) -> bool {
    windows.iter().chain(areas).any(|&(o, l)| o <= at && at < o + l)
}

#[test]
fn windows_are_in_bounds_sorted_apart_bounded_and_outside_the_signature_areas() {
    for size in sizes() {
        for rot in [None, Some(false), Some(true)] {
            let w = sample_windows(size, rot);
            let areas = signature_areas(size);
            for &(at, len) in &w {
                assert!(len > 0 && len <= 4 * WINDOW && at + len <= size, "{size} {rot:?}: {at}+{len}");
                assert!(!areas.iter().any(|&(o, l)| o < at + len && at < o + l), "{size}: {at} in a signature area");
            }
            for pair in w.windows(2) {
                assert!(pair[0].0 + pair[0].1 < pair[1].0, "{size} {rot:?}: {pair:?} overlap or touch");
            }
            let budget = if rot == Some(true) { BUDGET_ROTATIONAL } else { BUDGET };
            // The grid, two edges of 256 windows, and a few pieces cut by the signature areas.
            // The grid, two edges of 256 windows, 52 XFS group starts, and a few pieces cut by
            // the signature areas.
            assert!(w.len() as u64 <= budget + 564 + areas.len() as u64, "{size} {rot:?}: {} windows", w.len());
            let bytes: u64 = w.iter().map(|r| r.1).sum();
            assert!(bytes <= (budget + 564) * WINDOW, "{size}: {bytes} bytes read");
        }
    }
}

#[test]
fn every_mib_of_the_edges_and_every_grid_point_is_read() {
    for size in sizes() {
        for rot in [None, Some(true)] {
            let w = sample_windows(size, rot);
            let areas = signature_areas(size);
            let stride = grid_stride(size, rot);
            let mut at = 0;
            while at < size {
                assert!(covered(&w, &areas, at), "{size} {rot:?}: grid point {at} not read");
                at += stride;
            }
            let edge_points = (0..size.min(EDGE)).step_by(MIB as usize);
            let end_points = (size.saturating_sub(EDGE) / MIB * MIB..size).step_by(MIB as usize);
            for at in edge_points.chain(end_points) {
                assert!(covered(&w, &areas, at), "{size} {rot:?}: edge point {at} not read");
            }
        }
    }
}

#[test]
fn the_stride_is_a_power_of_two_of_at_least_a_mib_within_budget() {
    for size in sizes() {
        for (rot, budget) in [(None, BUDGET), (Some(false), BUDGET), (Some(true), BUDGET_ROTATIONAL)] {
            let s = grid_stride(size, rot);
            assert!(s.is_power_of_two() && s >= MIB, "{size}: {s}");
            assert!(size.div_ceil(s) <= budget, "{size}: {} grid windows", size.div_ceil(s));
            // The smallest such power: half of it would pass the budget (or be below a MiB).
            assert!(s == MIB || size.div_ceil(s / 2) > budget, "{size}: {s} is not the smallest");
        }
    }
    assert_eq!(grid_stride(100 * GIB, None), 32 * MIB);
    assert_eq!(grid_stride(TIB, None), 256 * MIB);
    assert_eq!(grid_stride(8 * TIB, None), 2 * GIB);
    assert_eq!(grid_stride(TIB, Some(true)), GIB);
    assert_eq!(grid_stride(PIB, None), 256 * GIB);
}

/// Whether an extent [at, at + len) meets a window or a signature area.
fn seen(size: u64, rot: Option<bool>, at: u64, len: u64) -> bool {
    meets(&read_ranges(size, rot), at, len)
}

fn read_ranges(size: u64, rot: Option<bool>) -> Vec<(u64, u64)> {
    let mut all = sample_windows(size, rot);
    all.extend(signature_areas(size));
    all
}

fn meets(ranges: &[(u64, u64)], at: u64, len: u64) -> bool {
    ranges.iter().any(|&(o, l)| o < at + len && at < o + l)
}

#[test]
fn an_extent_as_long_as_the_stride_is_always_seen_and_a_mib_always_at_the_edges() {
    for size in [300 * MIB, 100 * GIB, TIB + 4096] {
        let s = grid_stride(size, None);
        for at in [0, 1, s / 3, s - 1, s + 7, size / 2 + 12345, size - s - 3] {
            assert!(seen(size, None, at, s), "{size}: {s} bytes at {at} missed");
        }
        for at in [1, 3 * MIB + 65 * KIB, 200 * MIB + 1, 255 * MIB - 1, size - 256 * MIB + 5, size - 2 * MIB] {
            assert!(seen(size, None, at, MIB), "{size}: a MiB at {at} missed");
        }
    }
}

#[test]
fn the_cases_of_the_brief_are_read() {
    // 150 MiB into a disk "cleaned" with dd count=100, on any size.
    for size in [300 * MIB, 100 * GIB, TIB, 8 * TIB] {
        assert!(seen(size, None, 150 * MIB, 4096), "{size}: 150 MiB");
        assert!(seen(size, Some(true), 150 * MIB, 4096), "{size}: 150 MiB rotational");
        // The second-to-last MiB.
        assert!(seen(size, None, size - 2 * MIB, 4096), "{size}: second-to-last MiB");
    }
    // 500 GiB of 1 TiB: a grid point (256 MiB stride) and 1 GiB on a spinning disk.
    assert!(seen(TIB, None, 500 * GIB, 4096));
    assert!(seen(TIB, Some(true), 500 * GIB, 4096));
    // The allocation group headers of an XFS made on the whole device (one disk: 4 groups of
    // ceil(blocks / 4) 4 KiB blocks; striped: 16 or 32), on sizes that are not round numbers.
    for size in [331 * MIB, 100_000_000_000, 1_000_204_886_016, 3_000_592_982_016] {
        let blocks = size / 4096;
        for n in [4u64, 16, 32] {
            let group = blocks.div_ceil(n) * 4096;
            for i in 1..n {
                assert!(seen(size, Some(true), i * group, 4096), "{size}: group {i} of {n}");
            }
        }
    }
    // A 64 KiB extent between two grid points is not (the full read's case).
    assert!(!seen(TIB, None, 500 * GIB + 128 * MIB, 64 * KIB));
}

#[test]
fn the_probability_of_the_table_is_the_fraction_of_positions_seen() {
    // Count the positions of a 64 KiB extent over one stride of the interior that meet a
    // window: (E + W - 1) / S of them, as the module documentation says.
    let size = 100 * GIB;
    let s = grid_stride(size, None);
    let e = 64 * KIB;
    let base = 10 * s;
    let step = 4 * KIB;
    let ranges = read_ranges(size, None);
    let hits = (0..s / step).filter(|i| meets(&ranges, base + i * step, e)).count() as u64;
    // Positions at a 4 KiB step: the exact count is (E + W) / step - 1 of s / step.
    assert_eq!(hits, (e + WINDOW) / step - 1);
    let p = (e + WINDOW - 1) as f64 / s as f64;
    assert!((p * 100.0 - 0.39).abs() < 0.01, "{p}");
}

#[test]
fn offsets_read_as_bytes_and_units() {
    assert_eq!(offset_text(157_286_400), "157286400 (150 MiB)");
    assert_eq!(offset_text(0), "0");
    assert_eq!(offset_text(1023), "1023");
    assert_eq!(offset_text(8192), "8192 (8 KiB)");
    assert_eq!(offset_text(500 * GIB), "536870912000 (500 GiB)");
    assert_eq!(offset_text(TIB - 2 * MIB + 5), "1099509530629 (1024.0 GiB)");
    assert_eq!(offset_text(1536), "1536 (1.5 KiB)");
}

#[test]
fn progress_is_told_in_steps_of_ten_percent() {
    assert_eq!(percent_step(0, 100), 0);
    assert_eq!(percent_step(9, 100), 0);
    assert_eq!(percent_step(10, 100), 10);
    assert_eq!(percent_step(99, 100), 90);
    assert_eq!(percent_step(100, 100), 100);
    assert_eq!(percent_step(200, 100), 100);
    assert_eq!(percent_step(5, 0), 100);
    assert_eq!(percent_step(u64::MAX / 2, u64::MAX), 40);
    assert_eq!(FullRead::Reading { done: 37, total: 100 }.pending().unwrap(), "full read 30% done");
    assert_eq!(FullRead::Blank.pending(), None);
    assert_eq!(FullRead::Data { offset: 1 }.pending(), None);
    assert!(FullRead::Unknown.pending().unwrap().contains("not started"));
    assert!(FullRead::Queued.pending().unwrap().contains("queued"));
    assert!(FullRead::Failed("voided".into()).pending().unwrap().contains("voided"));
}

const C: WriteCounters = WriteCounters { writes: 10, write_sectors: 80, discards: 1 };

fn record(disk: &str, data_at: Option<u64>, boot: Option<&str>, counters: Option<WriteCounters>) -> VerifiedRecord {
    VerifiedRecord { disk: disk.into(), size: 100, data_at, at: 1, boot: boot.map(String::from), counters }
}

#[test]
fn a_record_counts_for_the_same_disk_and_size_and_stale_data_is_read_again() {
    let records = vec![record("wwid:a", None, Some("b1"), Some(C)), record("wwid:b", Some(42), None, None)];
    let now = Now { boot: Some("b1"), counters: Some(C) };
    assert_eq!(recorded(&records, "wwid:a", 100, true, now), Some(FullRead::Blank));
    assert_eq!(recorded(&records, "wwid:a", 100, false, now), Some(FullRead::Blank));
    assert_eq!(recorded(&records, "wwid:a", 200, true, now), None, "another size is another disk");
    assert_eq!(recorded(&records, "wwid:c", 100, true, now), None);
    assert_eq!(recorded(&records, "wwid:b", 100, false, now), Some(FullRead::Data { offset: 42 }));
    assert_eq!(recorded(&records, "wwid:b", 100, true, now), None, "cleared since: read again");
    let moved = Now { counters: Some(WriteCounters { writes: 11, ..C }), ..now };
    let Some(FullRead::Void(why)) = recorded(&records, "wwid:a", 100, true, moved) else { panic!("void") };
    assert!(why.contains("written since the read: 1 writes"), "{why}");
    assert!(FullRead::Void(why).pending().unwrap().contains("read again"));
}

/// Every combination of the record's boot and counters (kept or not, as an old record) and
/// the boot and counters now (the same, another, moved in each field, unreadable): the proof
/// holds only for the same boot and unmoved counters.
#[test]
fn a_blank_proof_holds_only_in_its_boot_while_the_write_counters_stay() {
    let counters = [
        None,
        Some(C),
        Some(WriteCounters { writes: 11, ..C }),
        Some(WriteCounters { write_sectors: 88, ..C }),
        Some(WriteCounters { discards: 2, ..C }),
        Some(WriteCounters { writes: 0, write_sectors: 0, discards: 0 }),
    ];
    for rec_boot in [None, Some("b1")] {
        for rec_counters in [None, Some(C)] {
            for now_boot in [None, Some("b1"), Some("b2")] {
                for now_counters in counters {
                    let r = record("wwid:a", None, rec_boot, rec_counters);
                    let got = proof_holds(&r, Now { boot: now_boot, counters: now_counters });
                    let holds = rec_boot.is_some()
                        && rec_counters.is_some()
                        && now_boot == rec_boot
                        && now_counters == rec_counters;
                    let ctx = format!("{rec_boot:?} {rec_counters:?} / {now_boot:?} {now_counters:?}: {got:?}");
                    assert_eq!(got.is_ok(), holds, "{ctx}");
                    let why = got.err().unwrap_or_default();
                    if rec_boot.is_none() || rec_counters.is_none() {
                        assert!(why.contains("earlier version"), "{ctx}");
                    } else if now_boot == Some("b2") {
                        assert!(why.contains("booted again"), "{ctx}");
                    }
                }
            }
        }
    }
    // An old record (no boot, no counters) from verified.json is void.
    let old: VerifiedRecord = serde_json::from_str(r#"{"disk":"wwid:a","size":100,"data_at":null,"at":1}"#).unwrap();
    assert!(proof_holds(&old, Now { boot: Some("b1"), counters: Some(C) }).is_err());
}

mod claim_rules {
    //! How core::devices::device_claim's judge uses a device's full read.
    use crate::core::devices::device_claim::{
        ClassClaims, Content, DeviceFacts, DeviceKind, Probe, Refusal, Verdict, World, plan,
    };
    use crate::core::devices::device_selector::{DeviceSelector, DeviceType, Verify};
    use crate::core::devices::surface::FullRead;

    fn device(content: Content, full_read: FullRead) -> DeviceFacts {
        DeviceFacts {
            name: "sdb".into(),
            dev: "8:16".into(),
            kind: Some(DeviceKind::Selectable(DeviceType::Disk)),
            size: 1 << 40,
            stable_id: Some("wwid:naa.1".into()),
            by_id: vec!["wwn-0x1".into()],
            probe: Probe { done: true, in_use: None, content, activity: None },
            full_read,
            ..Default::default()
        }
    }

    fn verdict(verify: Verify, d: DeviceFacts) -> Verdict {
        let selector = DeviceSelector { verify, ..Default::default() };
        let class = ClassClaims {
            class: "fast".into(),
            host_dir: "/mnt/fast".into(),
            name_pattern: "*".into(),
            selector: Some(selector),
        };
        let p = plan(&World { classes: vec![class], devices: vec![d], pvs_known: true, ..Default::default() });
        p.decisions[0].verdict.clone()
    }

    #[test]
    fn a_full_read_class_claims_only_after_the_read_finished_blank() {
        let blank = || Content::Blank;
        let cases: Vec<(FullRead, &str)> = vec![
            (FullRead::Unknown, "full read not started yet"),
            (FullRead::Queued, "queued"),
            (FullRead::Reading { done: 45, total: 100 }, "full read 40% done"),
            (FullRead::Failed("written to".into()), "written to"),
        ];
        for (state, text) in cases {
            match verdict(Verify::Full, device(blank(), state.clone())) {
                Verdict::Refused(r @ Refusal::Verifying(_)) => {
                    assert_eq!(r.code(), "verifying");
                    assert!(!r.needs_operator(), "waiting is no operator's problem");
                    assert!(r.to_string().contains(text), "{state:?}: {r}");
                }
                other => panic!("{state:?}: {other:?}"),
            }
        }
        assert!(matches!(verdict(Verify::Full, device(blank(), FullRead::Blank)), Verdict::Claim { .. }));
        match verdict(Verify::Full, device(blank(), FullRead::Data { offset: 150 << 20 })) {
            Verdict::Refused(r @ Refusal::NotBlank(_)) => {
                assert!(r.to_string().contains("data at byte 157286400 (150 MiB), found by the full read"), "{r}");
                assert!(r.needs_operator());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sampling_class_ignores_the_full_read_and_the_probe_comes_first() {
        for state in [FullRead::Unknown, FullRead::Queued, FullRead::Data { offset: 7 }] {
            assert!(matches!(verdict(Verify::Sample, device(Content::Blank, state)), Verdict::Claim { .. }));
        }
        // What the probe sees is refused as such, whatever the full read says.
        let found = Content::NotBlank("data at byte 1".into());
        for verify in [Verify::Sample, Verify::Full] {
            let v = verdict(verify, device(found.clone(), FullRead::Blank));
            assert!(matches!(v, Verdict::Refused(Refusal::NotBlank(_))), "{verify:?}: {v:?}");
        }
        let v = verdict(Verify::Full, device(Content::Busy, FullRead::Unknown));
        assert!(matches!(v, Verdict::Refused(Refusal::InUse(_))), "{v:?}");
    }
}
