//! "Blank" across the whole surface (core::devices::surface, host::devices::device_content, host::devices::verify) on
//! real loop devices: a disk zeroed only at its start, or holding raw data further in, is
//! refused naming the offset; a blank one is still claimed; `verify: full` finds what the
//! samples miss, claims a blank disk once its full read finished, and never reads a disk twice.
//! Nothing is written to any device (checksums and the kernel's write counters, before and
//! after).
//!
//! Devices are selected by sizes no other test uses (331, 337, 353, 359 MiB and 1 TiB), so agents of
//! tests running side by side never see each other's devices. Needs root.

use crate::support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use local_static_provisioner::host::devices::verify::{Found, FullReadJob, VerifyError, read_whole};
use serde_json::Value;
use support::used_lab::*;
use support::{binary, require_root, run, wait_until, write_config};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A config directory with one Block class over `dir` claiming loop devices of exactly `mib`
/// MiB, plus `extra` lines of its devices section.
fn class_config(at: &Path, class: &str, dir: &Path, mib: u64, extra: &str) -> PathBuf {
    let map = format!(
        "{class}:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n{extra}",
        d = dir.display()
    );
    write_config(at, &[("storageClassMap", &map)]);
    at.to_path_buf()
}

/// `disks --output json`: the verdict of `class` on `dev`.
fn disks_verdict(config: &Path, state: &Path, dev: &Path, class: &str) -> String {
    let out = run(Command::new(binary())
        .args(["disks", "--output", "json", "--config-dir"])
        .arg(config)
        .arg("--state-dir")
        .arg(state));
    let listing: Vec<Value> = serde_json::from_slice(&out.stdout).expect("disks prints JSON");
    let name = dev.file_name().unwrap().to_str().unwrap();
    let d = listing.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} not listed"));
    d["classes"][class].as_str().unwrap_or_else(|| panic!("no verdict of {class} for {name}: {d}")).to_string()
}

/// Random bytes (from the kernel), `len` of them.
fn random(len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut buf).unwrap();
    // No zero at the start, so the first non-zero offset is where the data starts.
    buf[0] = 0xa5;
    buf
}

fn write_at(dev: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.write_all_at(bytes, at).unwrap();
    f.sync_all().unwrap();
}

/// The kernel's count of writes and sectors written to a device.
fn writes(dev: &Path) -> (u64, u64) {
    let name = dev.file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    let f: Vec<u64> = stat.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (f[4], f[6])
}

fn sha256(dev: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(dev));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// Zeroes the first `mib` MiB of `dev`, as `dd if=/dev/zero bs=1M count=<mib>` does.
fn zero_head(dev: &Path, mib: u64) {
    run(Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", dev.display())).args([
        "bs=1M",
        &format!("count={mib}"),
        "conv=fsync",
        "status=none",
    ]));
}

#[test]
fn data_beyond_the_signature_areas_is_refused_naming_its_offset_and_a_blank_device_is_not() {
    let _area = support::area(module_path!());
    if !require_root("data_beyond_the_signature_areas_is_refused_naming_its_offset_and_a_blank_device_is_not") {
        return;
    }
    let lab = Lab::new("ds-samples");
    let class = "ds-samples";
    let mib = 331;
    let config = class_config(&lab.path("config"), class, &lab.dir("claims"), mib, "");
    let state = lab.dir("state");
    let dev = |name: &str| lab.loop_dev(name, mib).0;
    let blank = dev("blank");
    let ext4 = dev("ext4");
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&ext4));
    zero_head(&ext4, 100);
    let xfs = dev("xfs");
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&xfs));
    zero_head(&xfs, 100);
    let at_150 = dev("raw-150");
    write_at(&at_150, 150 * MIB, &random(4096));
    let second_last = dev("raw-end");
    let end = mib * MIB - 2 * MIB + 12345;
    write_at(&second_last, end, &random(4096));
    // 1 TiB, sparse: data at 500 GiB only.
    let img = lab.dir("images").join("tera.img");
    run(Command::new("truncate").args(["-s", "1T"]).arg(&img));
    let tera = lab.loop_on(&img);
    write_at(&tera, 500 * GIB, &random(64 * 1024));
    let tera_config = class_config(&lab.path("config-tera"), class, &lab.dir("claims"), 1 << 20, "");

    let small = [&blank, &ext4, &xfs, &at_150, &second_last];
    let sums: Vec<String> = small.iter().map(|d| sha256(d)).collect();
    let counters: Vec<(u64, u64)> = small.iter().chain([&&tera]).map(|d| writes(d)).collect();

    let verdict = |d: &Path| disks_verdict(&config, &state, d, class);
    assert!(verdict(&blank).starts_with("would claim"), "{}", verdict(&blank));
    // ext4's backup superblocks are in the signature areas; XFS's secondary superblocks and
    // the files' blocks are not: only the samples see them.
    for (d, text) in [
        (&ext4, "ext4 backup superblock"),
        (&xfs, "data at byte"),
        (&at_150, "data at byte 157286400 (150 MiB)"),
        (&second_last, &format!("data at byte {end} (")),
    ] {
        let v = verdict(d);
        assert!(v.contains("refused (not-blank)") && v.contains(text), "{}: {v}", d.display());
    }
    let v = disks_verdict(&tera_config, &state, &tera, class);
    assert!(v.contains("refused (not-blank)") && v.contains("data at byte 536870912000 (500 GiB)"), "{v}");

    for ((d, before), now) in small.iter().zip(&sums).zip(small.iter().map(|d| sha256(d))) {
        assert_eq!(before, &now, "{} was written", d.display());
    }
    let after: Vec<(u64, u64)> = small.iter().chain([&&tera]).map(|d| writes(d)).collect();
    assert_eq!(counters, after, "a device was written");
}

#[test]
fn a_full_read_reads_every_byte_and_a_write_during_it_voids_it() {
    let _area = support::area(module_path!());
    if !require_root("a_full_read_reads_every_byte_and_a_write_during_it_voids_it") {
        return;
    }
    let lab = Lab::new("ds-read");
    let img = lab.dir("images").join("big.img");
    run(Command::new("truncate").args(["-s", "2G"]).arg(&img));
    let dev = lab.loop_on(&img);
    let name = dev.file_name().unwrap().to_str().unwrap().to_string();
    let dev_number = std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).unwrap().trim().to_string();
    let job = FullReadJob { name: name.clone(), dev: dev_number, disk: "loop:test".into(), size: 2 * GIB };
    let before = writes(&dev);
    let started = Instant::now();
    let done = AtomicU64::new(0);
    assert_eq!(read_whole(&job, &done).unwrap(), Found::Blank);
    let secs = started.elapsed().as_secs_f64();
    eprintln!("full read of a blank sparse 2 GiB loop device: {secs:.1} s, {:.0} MiB/s", 2048.0 / secs);
    assert_eq!(done.into_inner(), 2 * GIB);
    assert_eq!(writes(&dev), before, "the full read wrote");

    // A size that is not the device's: refused before reading.
    let wrong = FullReadJob { size: GIB, ..job.clone() };
    assert!(matches!(read_whole(&wrong, &AtomicU64::new(0)), Err(VerifyError::NotTheDevice { .. })));

    // A write (of zeros: the content stays blank) while it reads voids the result.
    let writer = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            write_at(&dev, GIB + GIB / 2, &[0u8; 4096]);
        })
    };
    let result = read_whole(&job, &AtomicU64::new(0));
    writer.join().unwrap();
    assert!(matches!(result, Err(VerifyError::Written { .. })), "{result:?}");

    // The last byte.
    write_at(&dev, 2 * GIB - 1, &[7]);
    assert_eq!(read_whole(&job, &AtomicU64::new(0)).unwrap(), Found::Data { offset: 2 * GIB - 1 });
}

#[test]
fn verify_full_finds_what_the_samples_miss_claims_a_blank_disk_after_its_read_and_never_reads_it_twice() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ds-full") else { return };
    let class = "ds-full";
    let mib = 353;
    let dir = h.lab.dir("claims");
    let section = format!(
        "  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n    verify: full\n"
    );
    let config = h.config("config", &[(class, &dir, &section)]);
    let sampling = class_config(&h.lab.path("config-sample"), class, &dir, mib, "");
    let (blank, _) = h.lab.loop_dev("blank", mib);
    let (hidden, _) = h.lab.loop_dev("hidden", mib);
    // 64 KiB of data between two sample windows (they start every MiB on a disk this small).
    let at = 170 * MIB + 512 * 1024;
    write_at(&hidden, at, &random(64 * 1024));
    let sums = [sha256(&blank), sha256(&hidden)];
    let counters = [writes(&blank), writes(&hidden)];
    let state = h.lab.path(&format!("state-{}", h.node));
    std::fs::create_dir_all(&state).unwrap();
    // Sampling alone would claim the disk with data.
    let v = disks_verdict(&sampling, &state, &hidden, class);
    assert!(v.starts_with("would claim"), "the samples saw the data: {v}");
    // With verify: full, nothing is claimed before a full read.
    let v = disks_verdict(&config, &state, &blank, class);
    assert!(v.contains("refused (verifying)") && v.contains("full read not started"), "{v}");

    // --settle keeps the link unpublished, so it can be let go below with no PV to mind.
    let agent = h.agent(&config, &["--settle", "1h"]);
    let link = wait_until("the blank device linked after its full read", WAIT, || links_to(&dir, &blank));
    let log = agent.log_text();
    assert!(log.contains("full read: blank"), "{log}");
    let records: Vec<Value> = serde_json::from_slice(&std::fs::read(state.join("verified.json")).unwrap()).unwrap();
    // Once found, the probe reads the recorded offset too, and names it.
    wait_until("the data found by the full read", WAIT, || {
        let v = disks_verdict(&config, &state, &hidden, class);
        v.contains(&format!("refused (not-blank): it is not blank: data at byte {at} (170.5 MiB)")).then_some(())
    });
    assert!(links_to(&dir, &hidden).is_none(), "the disk with data was claimed");
    let metrics = agent.admin_get("/metrics");
    assert!(metrics.contains("local_static_provisioner_full_reads_total{result=\"blank\"} 1"), "{metrics}");
    let reads = |log: &str| log.matches("verify: full read queued device=").count();
    assert_eq!(reads(&agent.log_text()), 2, "one full read per disk");
    assert!(records.iter().any(|r| r["data_at"].is_null()), "{records:?}");
    let records: Vec<Value> = serde_json::from_slice(&std::fs::read(state.join("verified.json")).unwrap()).unwrap();
    assert!(records.iter().any(|r| r["data_at"] == at), "{records:?}");
    agent.stop();

    // Let the claim go (no PV: it never settled), and start again: claimed again at once,
    // without a second full read.
    std::fs::remove_file(dir.join(&link)).unwrap();
    std::fs::write(state.join("claims.json"), b"[]").unwrap();
    let agent = h.agent(&config, &["--settle", "1h"]);
    wait_until("the blank device linked again", WAIT, || links_to(&dir, &blank));
    let v = disks_verdict(&config, &state, &hidden, class);
    assert!(v.contains(&format!("data at byte {at}")), "{v}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let log = agent.stop();
    assert_eq!(reads(&log), 0, "a disk was read whole again: {log}");

    assert_eq!([sha256(&blank), sha256(&hidden)], sums, "a device was written");
    assert_eq!([writes(&blank), writes(&hidden)], counters, "a device was written");
}

/// A blank proof kept in verified.json holds only while the device's write counters stay: a
/// disk verified, let go unpublished, then written to (one block of zeros: its content still
/// reads blank, only the counters tell) is not claimed on the old proof; `disks` says why, and
/// the agent reads it whole again before it claims it.
#[test]
fn a_full_read_proof_is_void_once_the_disk_was_written_and_the_disk_is_read_again() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ds-void") else { return };
    let class = "ds-void";
    let mib = 359;
    let dir = h.lab.dir("claims");
    let section = format!(
        "  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n    verify: full\n"
    );
    let config = h.config("config", &[(class, &dir, &section)]);
    let (dev, _) = h.lab.loop_dev("d", mib);
    let state = h.lab.path(&format!("state-{}", h.node));
    std::fs::create_dir_all(&state).unwrap();
    let agent = h.agent(&config, &["--settle", "1h"]);
    let link = wait_until("the blank device linked after its full read", WAIT, || links_to(&dir, &dev));
    let log = agent.stop();
    let reads = |log: &str| log.matches("verify: full read queued device=").count();
    assert_eq!(reads(&log), 1, "{log}");
    let records: Vec<Value> = serde_json::from_slice(&std::fs::read(state.join("verified.json")).unwrap()).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().to_string();
    assert!(
        records
            .iter()
            .any(|r| r["data_at"].is_null() && r["boot"] == boot.as_str() && r["counters"]["writes"].is_u64()),
        "the proof keeps the boot and the write counters: {records:?}"
    );
    // Let the claim go (no PV: it never settled): claimed again at once on the proof.
    std::fs::remove_file(dir.join(&link)).unwrap();
    std::fs::write(state.join("claims.json"), b"[]").unwrap();
    assert!(disks_verdict(&config, &state, &dev, class).starts_with("would claim"), "the proof holds");

    // One block written (zeros: the samples and the whole surface still read blank).
    let before = writes(&dev);
    write_at(&dev, 200 * MIB, &[0u8; 4096]);
    assert_ne!(writes(&dev), before, "the write moved the counters");
    let v = disks_verdict(&config, &state, &dev, class);
    assert!(
        v.contains("refused (verifying)") && v.contains("no longer holds") && v.contains("written since the read"),
        "{v}"
    );
    let agent = h.agent(&config, &["--settle", "1h"]);
    let linked = wait_until("the device linked again after a new full read (or a read failed)", WAIT, || {
        links_to(&dir, &dev).map(Ok).or_else(|| agent.log_text().contains("full read failed").then_some(Err(())))
    });
    let log = agent.stop();
    assert!(linked.is_ok(), "{log}");
    assert_eq!(reads(&log), 1, "read whole again before it was claimed: {log}");
    assert!(disks_verdict(&config, &state, &dev, class).contains("claimed"), "the new proof holds");
}

/// The link in `dir` whose target is `dev`.
fn links_to(dir: &Path, dev: &Path) -> Option<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| std::fs::canonicalize(dir.join(n)).is_ok_and(|t| t == dev))
}
