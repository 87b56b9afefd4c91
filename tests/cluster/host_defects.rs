//! Host defects of issue 29, each on real files, mounts and loop devices:
//!
//! - the used-disk ledger stays bounded: a disk published and withdrawn unclaimed again and
//!   again, then wiped, leaves no trail in `used-disks.json`;
//! - a filesystem that cannot hold `trusted.*` attributes (vfat, a read-only mount) keeps its
//!   used mark in the node-local ledger only, and the agent says so once, in a Warning event;
//! - an Event note as long as the API accepts is accepted, one byte more is not.

use crate::support;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use local_static_provisioner::core::identity::used_mark::{Replace, UsedMark, UsedRead, XATTR_NAME};
use local_static_provisioner::host::identity::used_mark::{
    Accept, Carrier, LEDGER_FILE, Ledger, MarkOutcome, mark_volume, open_volume_root, write_dir_mark,
};
use local_static_provisioner::host::mounts::mountinfo::MountTable;
use serde_json::Value;
use support::used_lab::{Harness, Lab, WAIT, ledger_entry};
use support::{cannot_run, require_root, run, wait_until};

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
    let _area = support::area(module_path!());
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
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    const USED: &str = "v2;blk;disk=wwid:used;size=1048576;dev=8:0";
    ledger.record(&[UsedMark { claimed: true, ..mark(USED, "local-pv-u", "uid-u") }]).unwrap();
    ledger.record_withdrawn(&["uid-upstream".into(), "uid-u".into()]).unwrap();
    assert_eq!(ledger_file(dir.path()), (1, 0));
    assert!(matches!(ledger.lookup(USED, None), UsedRead::Marked(_)));
}

// =============================================================================================
// Filesystems that cannot carry the mark

/// Whether the attribute can be read on `root`: `Err` with the error's text when it cannot
/// (read with Python, independently of the agent's code).
fn read_attribute(root: &Path) -> Result<Vec<u8>, String> {
    let script = "import os, sys; sys.stdout.buffer.write(os.getxattr(sys.argv[1], sys.argv[2]))";
    let out = Command::new("python3").args(["-c", script]).arg(root).arg(XATTR_NAME).output().unwrap();
    if out.status.success() { Ok(out.stdout) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

/// A vfat filesystem (`mkfs.vfat`) on a new loop device, mounted at `at`: by the kernel's vfat
/// driver, or where the kernel has none (a minimal VM kernel) by `fusefat`, which no more holds
/// the attribute. `None` (the test cannot run) when neither is there.
fn vfat(lab: &Lab, test: &str, name: &str, at: &Path) -> Option<()> {
    let kernel = std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.lines().any(|l| l.ends_with("\tvfat")));
    let fuse = Command::new("fusefat").arg("-V").output().is_ok();
    let tools = Command::new("mkfs.vfat").arg("--help").output().is_ok();
    if !tools || !(kernel || fuse) {
        cannot_run(test, "needs mkfs.vfat (dosfstools) and vfat in the kernel or fusefat");
        return None;
    }
    let (dev, _) = lab.loop_dev(name, 64);
    run(Command::new("mkfs.vfat").arg(&dev));
    if kernel {
        lab.mount_dev(&dev, at);
    } else {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("fusefat").args(["-o", "rw+"]).arg(&dev).arg(at));
    }
    Some(())
}

/// On the host side: a vfat volume and a read-only mount say why they keep the mark in the
/// ledger only, a tmpfs carries it; a PV's later writes (its UID, its claim) are not reported
/// as new.
#[test]
fn a_filesystem_that_cannot_hold_the_attribute_says_so_and_why() {
    let _area = support::area(module_path!());
    const TEST: &str = "a_filesystem_that_cannot_hold_the_attribute_says_so_and_why";
    if !require_root(TEST) {
        return;
    }
    let lab = Lab::new("hd-carrier");
    let (fat, ro, tmp) = (lab.path("disks/fat"), lab.path("disks/ro"), lab.path("disks/tmp"));
    if vfat(&lab, TEST, "fat", &fat).is_none() {
        return;
    }
    lab.tmpfs(&tmp, 8);
    let (dev, _) = lab.loop_dev("ro", 64);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    lab.mount_dev_with(&dev, &ro, &["-o", "ro"]);
    let mounts = MountTable::read().unwrap();
    let m = mark("", "local-pv-1", "uid-1");
    let write = |path: &Path| {
        let root = open_volume_root(path).unwrap();
        let fs = mounts.get(path).map(|e| e.fs_type.clone());
        write_dir_mark(root.as_fd(), path, fs.as_deref(), &m).unwrap()
    };
    assert!(
        matches!(write(&fat), Carrier::LedgerOnly { why, .. } if why.contains("fat") && why.contains(XATTR_NAME)),
        "{:?}",
        write(&fat)
    );
    assert!(read_attribute(&fat).is_err());
    assert!(matches!(write(&ro), Carrier::LedgerOnly { why, .. } if why.contains("read-only")), "{:?}", write(&ro));
    assert_eq!(write(&tmp), Carrier::Attribute);
    assert_eq!(UsedMark::from_json(&read_attribute(&tmp).unwrap()), Some(m.clone()));

    // Through the writer the agent uses: the first mark of a PV is reported, its completion not.
    let state = lab.dir("state");
    let ledger = Ledger::open(&state).unwrap();
    let mark_fat = |mark: &UsedMark, replace: Replace| {
        mark_volume(&fat, "", None, Accept::Anything, mark, &ledger, &mounts, |there| replace.allows(mark, there))
            .unwrap()
    };
    let before = UsedMark { uid: None, ..m.clone() };
    let outcome = mark_fat(&before, Replace::BeforeCreate { judged: None });
    let MarkOutcome::Written(written, Carrier::LedgerOnly { first: true, .. }) = outcome else { panic!("{outcome:?}") };
    ledger.record(&[written]).unwrap();
    // Its claim (written whatever is on record, as for every used PV): not reported again.
    let claimed = UsedMark { claimed: true, ..m.clone() };
    let outcome = mark_fat(&claimed, Replace::Keep { used: true });
    let MarkOutcome::Written(written, Carrier::LedgerOnly { first: false, .. }) = outcome else {
        panic!("{outcome:?}")
    };
    ledger.record(&[written]).unwrap();
    // The ledger is what holds it: the volume is known as used on this node (or held as
    // unknown where its filesystem names no disk, as under fusefat).
    let entry = ledger_entry(&state.join(LEDGER_FILE), "local-pv-1").expect("the ledger's entry");
    let read = ledger.lookup(entry["identity"].as_str().unwrap(), Some("/"));
    assert!(matches!(read, UsedRead::Marked(_) | UsedRead::Unknown(_)), "{read:?}");
}

/// With the agent and the control plane: a vfat volume is published with its mark in the
/// ledger, and the Node gets one Warning event saying the mark is node-local and what that
/// means; not again on later passes, nor when a claim binds (the mark is written again); a
/// tmpfs sibling gets none.
#[test]
fn a_vfat_volume_is_published_with_a_node_local_mark_and_one_warning() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("hd-vfat") else { return };
    let class = "hd-vfat";
    let (disks, config) = h.fs_class(class);
    let (fat, tmp) = (disks.join("fat"), disks.join("tmp"));
    if vfat(&h.lab, "a_vfat_volume_is_published_with_a_node_local_mark_and_one_warning", "fat", &fat).is_none() {
        return;
    }
    h.lab.tmpfs(&tmp, 8);
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&fat);
    let other = h.wait_published(&tmp);
    let ledger = h.ledger(&h.node);
    // (Its UID follows where the filesystem names its disk: not under fusefat, whose
    // filesystem shows only a device number, which proves nothing.)
    wait_until("the vfat volume's mark in the ledger", WAIT, || ledger_entry(&ledger, &pv).map(|_| ()));
    assert!(read_attribute(&fat).is_err(), "vfat carries no attribute");
    let path = fat.display().to_string();
    let note = wait_until("the node-local warning", WAIT, || h.node_event("UsedMarkNodeLocal", &path));
    assert!(note.contains(&pv) && note.contains("fat") && note.contains("another node"), "{note}");

    h.claim("hd-vfat", class, &pv, false);
    wait_until("the claim in the ledger's mark", WAIT, || {
        ledger_entry(&ledger, &pv).filter(|e| e["claimed"] == true).map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(4));
    let events = h.cp.get_json(&["events.events.k8s.io", "-A"]).unwrap();
    let ours: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "UsedMarkNodeLocal" && e["regarding"]["name"] == h.node.as_str())
        .collect();
    assert_eq!(ours.len(), 1, "one event: {ours:#?}");
    assert!(ours[0]["series"].is_null(), "not repeated: {:#?}", ours[0]);
    assert_eq!(ours[0]["type"], "Warning");
    assert_eq!(ours[0]["related"]["name"], pv.as_str());
    assert!(!ours[0]["note"].as_str().unwrap().contains(&other));
    agent.stop();
}

// =============================================================================================
// Event notes

/// The limit the agent cuts notes at is the API's: a note of exactly that many bytes is
/// accepted, one byte more is refused.
#[test]
fn the_api_accepts_a_note_as_long_as_the_cut_leaves_and_no_longer() {
    let _area = support::area(module_path!());
    use local_static_provisioner::api::{EVENT_NOTE_CUT, EVENT_NOTE_MAX, event_note};
    let cut = event_note("n".repeat(5000));
    assert_eq!(cut.len(), EVENT_NOTE_MAX);
    assert!(cut.ends_with(EVENT_NOTE_CUT));
    let cp = support::ControlPlane::get();
    let event = |name: &str, note: &str| {
        let doc = serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "eventTime": "2026-11-27T00:00:00.000000Z",
            "reportingController": "local-static-provisioner.io/test", "reportingInstance": "host-defects",
            "action": "Test", "reason": "NoteLimit", "type": "Normal",
            "regarding": {"kind": "Node", "name": "hd-note", "apiVersion": "v1"},
            "note": note,
        });
        let out = cp.kubectl_stdin(&cp.kubeconfig, &["create", "-f", "-"], Some(&doc.to_string()));
        let _ = cp.kubectl(&["delete", "events.events.k8s.io", "-n", "default", name, "--ignore-not-found"]);
        out
    };
    let accepted = event("hd-note-at-limit", &cut);
    assert!(accepted.status.success(), "{}", String::from_utf8_lossy(&accepted.stderr));
    let over = event("hd-note-over-limit", &format!("{cut}x"));
    assert!(!over.status.success(), "a note over the limit is refused");
    assert!(String::from_utf8_lossy(&over.stderr).contains("note"), "{}", String::from_utf8_lossy(&over.stderr));
}
