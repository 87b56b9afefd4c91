use super::*;

const DISK: &str = "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:16";

#[test]
fn the_label_is_a_hash_of_the_whole_disk_and_fits_a_label_value() {
    let label = disk_label(DISK).unwrap();
    assert_eq!(label.len(), 40);
    assert!(label.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    // The same disk under another device number, and a partition of it: the same label.
    assert_eq!(disk_label("v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:48"), Some(label.clone()));
    assert_eq!(disk_label("v2;blk;disk=wwid:0x5000c/part1;size=1048576;dev=8:17"), Some(label.clone()));
    assert_ne!(disk_label("v2;blk;disk=wwid:0x5000d;size=1073741824;dev=8:16"), Some(label));
    // A loop device's id of an earlier version (file by path, its filesystem in `backing`)
    // and the current one: one label, so another node finds the PV either way.
    let loop_label = disk_label("v2;blk;disk=loop:7:0:5@0/part1@2048;size=1;dev=7:4");
    assert!(loop_label.is_some());
    assert_eq!(disk_label("v2;blk;disk=loop:/i.img@0#5;backing=7:0;size=1;dev=7:3"), loop_label);
    assert_ne!(disk_label("v2;blk;disk=loop:7:0:6@0;size=1;dev=7:3"), loop_label);
    // Named by numbers only, or a directory: nothing to look up.
    assert_eq!(disk_label("v2;blk;size=1073741824;dev=8:16"), None);
    assert_eq!(disk_label("v2;fs;uuid=u1;ino=2;dev=8:1"), None);
}

#[test]
fn a_pv_without_its_disks_label_gets_it_and_only_a_device_named_by_a_stable_id_has_one() {
    let right = disk_label(DISK).unwrap();
    let other = disk_label("v2;blk;disk=wwid:0x5000d;size=1073741824;dev=8:16").unwrap();
    let identities = [
        (Some(DISK), Some(right.as_str())),
        (Some("v2;blk;disk=wwid:0x5000c/part1;size=1048576;dev=8:17"), Some(right.as_str())),
        (Some("v2;blk;size=1073741824;dev=8:16"), None),
        (Some("v2;fs;uuid=u1;ino=2;dev=8:1"), None),
        (Some("not an identity"), None),
        (None, None),
    ];
    for (identity, want) in identities {
        for label in [None, Some(right.as_str()), Some(other.as_str()), Some("")] {
            let got = missing_disk_label(identity, label);
            // Set exactly when the identity has a label and the PV does not carry that one.
            let expected = want.filter(|w| label != Some(*w)).map(str::to_string);
            assert_eq!(got, expected, "{identity:?} {label:?}");
        }
    }
}

#[test]
fn a_pv_names_the_disk_only_by_its_full_identity() {
    assert!(names_disk(Some("v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:48"), DISK));
    assert!(names_disk(Some("v2;blk;disk=wwid:0x5000c/part2;size=1;dev=8:18"), DISK));
    assert!(!names_disk(Some("v2;blk;disk=wwid:0x5000d;size=1073741824;dev=8:16"), DISK));
    // A label alone (no identity), or an identity named by numbers: proves nothing.
    assert!(!names_disk(None, DISK));
    assert!(!names_disk(Some("v2;blk;size=1073741824;dev=8:16"), DISK));
    assert!(!names_disk(Some(DISK), "v2;blk;size=1073741824;dev=8:16"));
}

#[test]
fn a_loop_file_reborn_at_a_deleted_files_inode_is_another_disk() {
    // A loop device over inode 5 of 7:0, in either id format, whole or a partition, its file's
    // birth time known or not.
    let id = |old: bool, born: Option<u64>, part: bool| {
        let disk = if old { "loop:/i.img@0#5" } else { "loop:7:0:5@0" };
        let part = if part { "/part1@2048" } else { "" };
        let born = born.map(|b| format!(";born={b}")).unwrap_or_default();
        format!("v2;blk;disk={disk}{part};backing=7:0{born};size=1048576;dev=7:3")
    };
    let borns = [None, Some(1_000), Some(2_000)];
    for (old_a, old_b, part_a, part_b) in (0..16).map(|n| (n & 1 != 0, n & 2 != 0, n & 4 != 0, n & 8 != 0)) {
        for a in borns {
            for b in borns {
                let (recorded, found) = (id(old_a, a, part_a), id(old_b, b, part_b));
                // One file unless both birth times are known and differ.
                let want = a.zip(b).is_none_or(|(x, y)| x == y);
                assert_eq!(same_whole_disk(&recorded, &found), want, "{recorded} / {found}");
                assert_eq!(names_disk(Some(&recorded), &found), want, "{recorded} / {found}");
                assert_eq!(same_whole_disk(&found, &recorded), want, "symmetric: {recorded} / {found}");
            }
        }
    }
    // Another inode, or the same inode on another filesystem: never one disk, born or not.
    assert!(!same_whole_disk(&id(false, Some(1), false), "v2;blk;disk=loop:7:0:6@0;born=1;size=1;dev=7:3"));
    assert!(!same_whole_disk(&id(false, Some(1), false), "v2;blk;disk=loop:8:1:5@0;born=1;size=1;dev=7:3"));
    // A birth time means nothing to a disk named by a WWID.
    assert!(same_whole_disk(DISK, "v2;blk;disk=wwid:0x5000c;born=7;size=1073741824;dev=8:16"));
}

fn pv(bits: u8) -> PvWitness {
    PvWitness {
        node: "a".into(),
        name: "pv-a".into(),
        uid: "u-a".into(),
        claimed: bits & 1 != 0,
        released: bits & 2 != 0,
        deleting: bits & 4 != 0,
        own: bits & 8 != 0,
        superseded: bits & 16 != 0,
        released_by_operator: bits & 32 != 0,
    }
}

fn record(bits: u8) -> RecordWitness {
    RecordWitness {
        node: "c".into(),
        pv: "pv-c".into(),
        // Bit 8: the record names the PV above (its UID).
        uid: Some(if bits & 8 != 0 { "u-a".into() } else { "u-c".into() }),
        offered: bits & 1 != 0,
        superseded: bits & 2 != 0,
        released_by_operator: bits & 4 != 0,
    }
}

/// Every combination of this node's evidence, up to one PV naming the disk (any state) and up
/// to one record naming it (any state), readable or not.
type Case = (Own, Option<Vec<PvWitness>>, Option<Vec<RecordWitness>>);

fn every_case() -> Vec<Case> {
    let mut out = Vec::new();
    for mark in [OwnMark::None, OwnMark::Offered, OwnMark::Used] {
        for let_go in [false, true] {
            let own = Own { mark, let_go };
            let mut pv_sets: Vec<Option<Vec<PvWitness>>> = vec![None, Some(Vec::new())];
            pv_sets.extend((0..64).map(|b| Some(vec![pv(b)])));
            for pvs in &pv_sets {
                let mut record_sets: Vec<Option<Vec<RecordWitness>>> = vec![None, Some(Vec::new())];
                record_sets.extend((0..16).map(|b| Some(vec![record(b)])));
                for records in record_sets {
                    out.push((own, pvs.clone(), records));
                }
            }
        }
    }
    out
}

#[test]
fn the_rule_holds_for_every_combination() {
    let cases = every_case();
    assert_eq!(cases.len(), 3 * 2 * 66 * 18);
    for (own, pvs, records) in cases {
        let d = judge(own, pvs.as_deref(), records.as_deref());
        let case = format!("{own:?} {pvs:?} {records:?} -> {d:?}");
        let (Some(pvs), Some(records)) = (&pvs, &records) else {
            assert!(matches!(d, Decision::Unknown(_)), "unreadable evidence decides nothing: {case}");
            continue;
        };
        assert!(!matches!(d, Decision::Unknown(_)), "{case}");
        let live = |p: &&PvWitness| !p.own && !p.superseded;
        let in_use = pvs.iter().filter(live).any(|p| p.claimed && !p.released);
        let released_claim = pvs.iter().filter(live).any(|p| p.claimed && p.released);
        let wiped_for = |u: &String| pvs.iter().any(|p| !p.own && p.superseded && &p.uid == u);
        let counts = |r: &&RecordWitness| !r.offered && !r.superseded && !r.uid.as_ref().is_some_and(wiped_for);
        let operator_vouched = records.iter().filter(counts).any(|r| r.released_by_operator);
        // A claim bound now holds, whatever else says: no word releases it.
        assert_eq!(in_use, matches!(d, Decision::Hold { why: HoldWhy::ClaimedPv, .. }), "{case}");
        // Data is destroyed only on unforgeable evidence: the own mark, a PV a claim used, or
        // an operator's word.
        if let Decision::WipeFirst { because } = &d {
            assert!(!in_use, "{case}");
            let backed = match because {
                WipeCause::OwnMark => own.mark == OwnMark::Used,
                WipeCause::ReleasedPv { .. } => released_claim,
                WipeCause::ReleasedRecord { .. } => operator_vouched && !own.let_go,
            };
            assert!(backed, "a wipe without unforgeable evidence: {case}");
        }
        // A used disk of this node's own is never published as it is.
        if own.mark == OwnMark::Used {
            assert!(!matches!(d, Decision::Publish), "{case}");
        }
        // Nor one a claim of another node used and no wipe here superseded.
        if released_claim {
            assert!(!matches!(d, Decision::Publish), "{case}");
        }
        // One node's word never blocks a disk this node's own records show it let go.
        if own.let_go {
            assert!(!matches!(d, Decision::Hold { why: HoldWhy::UnclaimedPv | HoldWhy::Record, .. }), "{case}");
        }
        // A record alone never holds a disk this node's own mark says is used.
        if own.mark == OwnMark::Used {
            assert!(!matches!(d, Decision::Hold { why: HoldWhy::Record, .. }), "{case}");
        }
        // Such a hold is said with who and what.
        if let Decision::Hold { node, record, uid, why } = &d {
            let words = hold_words(node, record, uid.as_deref(), *why);
            assert!(words.contains(node.as_str()) && words.contains(record.as_str()), "{case}");
            if why.releasable() {
                assert!(!own.let_go, "{case}");
            }
        }
        // Superseded or own PVs, and records offered or superseded (by their own UID or their
        // PV's), count as nothing.
        let counted_pvs: Vec<PvWitness> = pvs.iter().filter(|p| live(p)).cloned().collect();
        let counted_records: Vec<RecordWitness> = records.iter().filter(counts).cloned().collect();
        assert_eq!(d, judge(own, Some(&counted_pvs), Some(&counted_records)), "{case}");
        // No evidence at all: this node's own mark decides.
        if counted_pvs.is_empty() && counted_records.is_empty() {
            let expected = match own.mark {
                OwnMark::Used => Decision::WipeFirst { because: WipeCause::OwnMark },
                _ => Decision::Publish,
            };
            assert_eq!(d, expected, "{case}");
        }
    }
}

#[test]
fn the_attacks_of_issue_40_and_the_cases_they_hid() {
    let own = |mark, let_go| Own { mark, let_go };
    let forged = RecordWitness {
        node: "a".into(),
        pv: "decoy".into(),
        uid: Some("u-x".into()),
        offered: false,
        superseded: false,
        released_by_operator: false,
    };
    // A forged record alone: held and said, never wiped.
    let d = judge(own(OwnMark::None, false), Some(&[]), Some(std::slice::from_ref(&forged)));
    assert!(matches!(d, Decision::Hold { why: HoldWhy::Record, ref node, .. } if node == "a"), "{d:?}");
    // This node's own disk, released and wiped here: the forged record does not block it.
    assert_eq!(judge(own(OwnMark::None, true), Some(&[]), Some(std::slice::from_ref(&forged))), Decision::Publish);
    // The operator released the hold: wiped first (the record taken as a mark), then published.
    let released = RecordWitness { released_by_operator: true, ..forged.clone() };
    let d = judge(own(OwnMark::None, false), Some(&[]), Some(&[released]));
    assert!(matches!(d, Decision::WipeFirst { because: WipeCause::ReleasedRecord { .. } }), "{d:?}");
    // Node A's LocalStorageNode deleted, its Released PV names the disk: wiped first.
    let released_pv = PvWitness { claimed: true, released: true, ..pv(0) };
    let d = judge(own(OwnMark::None, false), Some(std::slice::from_ref(&released_pv)), Some(&[]));
    assert!(matches!(d, Decision::WipeFirst { because: WipeCause::ReleasedPv { .. } }), "{d:?}");
    // ... once: after that wipe it is superseded here.
    let superseded = PvWitness { superseded: true, ..released_pv };
    assert_eq!(judge(own(OwnMark::None, false), Some(&[superseded]), Some(&[])), Decision::Publish);
    // This node's own used disk, and a forged record naming it and a decoy PV by name only
    // (the caller drops a PV that does not name the disk by identity): wiped, as its own mark
    // says, not held.
    let d = judge(own(OwnMark::Used, false), Some(&[]), Some(std::slice::from_ref(&forged)));
    assert_eq!(d, Decision::WipeFirst { because: WipeCause::OwnMark });
    // It went there and came back: this node's used disk, published on A since, is held while
    // A's PV lives (it names the disk: the caller compared its identity).
    let there = pv(0);
    let d = judge(own(OwnMark::Used, false), Some(&[there]), Some(&[]));
    assert!(matches!(d, Decision::Hold { why: HoldWhy::UnclaimedPv, .. }), "{d:?}");
    // A claim bound on another node: held, whatever this node's own records say.
    let bound = PvWitness { claimed: true, ..pv(0) };
    let d = judge(own(OwnMark::Used, true), Some(&[bound]), Some(&[]));
    assert!(matches!(d, Decision::Hold { why: HoldWhy::ClaimedPv, .. }), "{d:?}");
}
