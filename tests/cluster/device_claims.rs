//! Claiming raw devices (a class's `devices` section) on real loop devices, with the agent under
//! its own RBAC against the real control plane: what an operator sees is links in the
//! discovery directory, PVs, events and the `disks` listing.
//!
//! - a clean device is linked under its stable name and published; nothing is written to it;
//! - devices with a signature (ext4, xfs, swap, dos and gpt tables, LVM2, LUKS2, leftovers of
//!   `wipefs -a`, data we do not recognise), a mounted one, one opened exclusively, a
//!   partitioned one, and one an operator already linked are refused, each with its reason
//!   (md, ZFS, bcache and the others are recognised as tests/host/device_content.rs shows; holders
//!   need device-mapper or md, which this kernel lacks: unit tests only);
//! - detaching and re-attaching the devices in the other order keeps their names and PVs;
//! - a claimed device goes through release, wipe and republish;
//! - maxPerNode is respected, and removing the section removes no link whose PV exists;
//! - a claimed device without a PV that shows a signature we did not put there is held back.
//!
//! Each test selects its devices by a size no other test uses, so agents of tests running side
//! by side never claim each other's devices. This kernel has no scsi_debug module, no
//! device-mapper, no md and no udev: devices with a real WWID, holders and /dev/disk/by-id
//! links are covered by the unit tests of core::devices::device_claim only. Needs root.

use crate::support;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::used_lab::*;
use support::{binary, run, wait_until};

/// A Block class over the lab's `claims/` directory that claims loop devices of exactly
/// `mib` MiB, plus `extra` lines of its devices section.
fn claim_class(h: &Harness, class: &str, mib: u64, extra: &str) -> (PathBuf, PathBuf) {
    let dir = h.lab.dir("claims");
    let section = format!(
        "  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n{extra}"
    );
    let config = h.config("config", &[(class, &dir, &section)]);
    (dir, config)
}

/// Link names in `dir`, sorted.
fn links(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The link in `dir` whose target is the device `dev` now.
fn link_to(dir: &Path, dev: &Path) -> Option<String> {
    links(dir).into_iter().find(|n| std::fs::canonicalize(dir.join(n)).is_ok_and(|t| t == dev))
}

/// Every byte of the first MiB of `dev` is zero.
fn head_is_zero(dev: &Path) -> bool {
    let f = std::fs::File::open(dev).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf.iter().all(|b| *b == 0)
}

/// `local-static-provisioner disks --output json` for `config`, by kernel name.
fn disks_json(config: &Path, state: &Path) -> Vec<Value> {
    let out = run(Command::new(binary())
        .args(["disks", "--output", "json", "--config-dir"])
        .arg(config)
        .arg("--state-dir")
        .arg(state));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("disks prints JSON")
}

fn verdict(listing: &[Value], dev: &Path, class: &str) -> String {
    let name = dev.file_name().unwrap().to_str().unwrap();
    let d = listing.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} not listed"));
    d["classes"][class].as_str().unwrap_or_else(|| panic!("no verdict of {class} for {name}: {d}")).to_string()
}

#[test]
fn clean_devices_are_claimed_and_published_and_used_ones_are_refused_with_their_reason() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-refuse") else { return };
    let class = "dc-refuse";
    // mkfs.xfs needs 300 MiB.
    let mib = 307;
    let (dir, config) = claim_class(&h, class, mib, "");
    let dev = |name: &str| h.lab.loop_dev(name, mib).0;
    let (clean_a, clean_b) = (dev("clean-a"), dev("clean-b"));
    let ext4 = dev("ext4");
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&ext4));
    let xfs = dev("xfs");
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&xfs));
    let swap = dev("swap");
    run(Command::new("mkswap").arg(&swap));
    let table = |dev: &Path, label: &str| {
        let mut child = Command::new("sfdisk")
            .args(["-q", "--label", label])
            .arg(dev)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b",\n").unwrap();
        assert!(child.wait().unwrap().success(), "sfdisk {label}");
    };
    let dos = dev("dos");
    table(&dos, "dos");
    let gpt = dev("gpt");
    table(&gpt, "gpt");
    let lvm = dev("lvm");
    // pvcreate writes the label only; it needs no device-mapper (this kernel has none).
    run(Command::new("pvcreate").args(["-q", "-y", "-ff"]).arg(&lvm).env("LVM_SUPPRESS_FD_WARNINGS", "1"));
    let luks = dev("luks");
    let mut format = Command::new("cryptsetup")
        .args(["luksFormat", "--type", "luks2", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "-q"])
        .args(["--key-file", "-"])
        .arg(&luks)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(format.stdin.as_mut().unwrap(), b"not a secret").unwrap();
    drop(format.stdin.take());
    assert!(format.wait().unwrap().success(), "cryptsetup luksFormat");
    let data = dev("data");
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().write_all_at(b"someone's bytes", 8192).unwrap();
    let wiped = dev("wipefs");
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&wiped));
    run(Command::new("wipefs").args(["-q", "-a"]).arg(&wiped));
    let mounted = dev("mounted");
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&mounted));
    h.lab.mount_dev(&mounted, &h.lab.path("mnt/mounted"));
    let img = h.lab.dir("images").join("parts.img");
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
    let partitioned = h.lab.loop_on_partscan(&img);
    table(&partitioned, "dos");
    run(Command::new("partx").arg("-u").arg(&partitioned));
    let excl = dev("exclusive");
    let holder = std::fs::OpenOptions::new().read(true).custom_flags(libc_o_excl()).open(&excl).unwrap();
    let manual = dev("manual");
    std::os::unix::fs::symlink(&manual, dir.join("by-hand")).unwrap();
    let refused: Vec<(&Path, &str, &str)> = vec![
        (&ext4, "not-blank", "ext4"),
        (&xfs, "not-blank", "xfs"),
        (&swap, "not-blank", "swap"),
        (&dos, "not-blank", "dos"),
        (&gpt, "not-blank", "gpt"),
        (&lvm, "not-blank", "LVM2"),
        (&luks, "not-blank", "LUKS2"),
        (&data, "not-blank", "8192"),
        (&wiped, "not-blank", ""),
        (&mounted, "in-use", "mounted"),
        (&partitioned, "partitioned", "partitions"),
        (&excl, "in-use", "exclusively"),
        (&manual, "already-volume", "by-hand"),
    ];
    let blkid_before: Vec<String> = refused.iter().map(|(d, _, _)| blkid(d)).collect();

    // The dry run shows the PVs the claims would publish, and claims nothing.
    let dry = run(Command::new(binary()).args(["discover", "--node-name", &h.node, "--config-dir"]).arg(&config));
    let (out, err) = (String::from_utf8_lossy(&dry.stdout), String::from_utf8_lossy(&dry.stderr));
    for name in ["clean-a", "clean-b"] {
        // Loop link names are made from the backing file's inode (never its path).
        let img = h.lab.path(&format!("images/{name}.img"));
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&img).unwrap());
        assert!(out.contains(&format!("path: {}/loop-{ino}-", dir.display())), "{out}");
    }
    assert_eq!(err.matches("would link").count(), 2, "{err}");
    assert_eq!(links(&dir), vec!["by-hand".to_string()], "discover made a link");

    let agent = h.agent(&config, &[]);
    let published: Vec<String> = [&clean_a, &clean_b]
        .iter()
        .map(|d| {
            let name = wait_until(&format!("{} linked", d.display()), WAIT, || link_to(&dir, d));
            assert!(name.starts_with("loop-"), "{name}");
            assert_eq!(std::fs::read_link(dir.join(&name)).unwrap(), d.as_path(), "no by-id here: the /dev node");
            h.wait_published(&dir.join(&name))
        })
        .collect();
    // The operator's own link is published as it always was, and stays theirs.
    h.wait_published(&dir.join("by-hand"));
    let state = h.lab.path(&format!("state-{}", h.node));
    let listing = disks_json(&config, &state);
    for d in [&clean_a, &clean_b] {
        assert!(verdict(&listing, d, class).starts_with("claimed"), "{}", verdict(&listing, d, class));
        assert!(head_is_zero(d), "claiming wrote to {}", d.display());
    }
    for ((d, code, text), before) in refused.iter().zip(&blkid_before) {
        let v = verdict(&listing, d, class);
        assert!(v.contains(&format!("refused ({code})")) && v.contains(text), "{}: {v}", d.display());
        assert!(link_to(&dir, d).is_none() || *code == "already-volume", "{} was linked", d.display());
        assert_eq!(&blkid(d), before, "{} changed", d.display());
    }
    assert_eq!(links(&dir).len(), 3, "{:?}", links(&dir));
    // Events and metrics say the same.
    let ext4_name = ext4.file_name().unwrap().to_str().unwrap();
    wait_until("a DeviceRefused event for the ext4 device", WAIT, || {
        h.node_event("DeviceRefused", &format!("/dev/{ext4_name} not claimed"))
    });
    wait_until("a DeviceClaimed event", WAIT, || h.node_event("DeviceClaimed", &clean_a.display().to_string()));
    // The gauges of the last pass (a pass can meet the `disks` run above in a probe).
    let want = [
        format!("local_static_provisioner_claimed_devices{{class=\"{class}\"}} 2"),
        format!("local_static_provisioner_device_claims_total{{class=\"{class}\"}} 2"),
        format!("local_static_provisioner_devices_refused{{class=\"{class}\",reason=\"not-blank\"}} 9"),
        format!("local_static_provisioner_devices_refused{{class=\"{class}\",reason=\"in-use\"}} 2"),
    ];
    wait_until("the claim metrics", WAIT, || {
        let metrics = agent.admin_get("/metrics");
        want.iter().all(|w| metrics.contains(w.as_str())).then_some(())
    });
    drop(holder);
    drop(agent);
    assert_eq!(published.len(), 2);
}

fn libc_o_excl() -> i32 {
    nix::fcntl::OFlag::O_EXCL.bits()
}

fn blkid(dev: &Path) -> String {
    let out = Command::new("blkid").args(["-p", "-o", "export"]).arg(dev).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn detaching_and_reattaching_in_the_other_order_keeps_names_and_pvs() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-reorder") else { return };
    let class = "dc-reorder";
    let (dir, config) = claim_class(&h, class, 39, "");
    let (a, img_a) = h.lab.loop_dev("first", 39);
    let (b, img_b) = h.lab.loop_dev("second", 39);
    let agent = h.agent(&config, &[]);
    let name_a = wait_until("first linked", WAIT, || link_to(&dir, &a));
    let name_b = wait_until("second linked", WAIT, || link_to(&dir, &b));
    let pv_a = h.wait_published(&dir.join(&name_a));
    let pv_b = h.wait_published(&dir.join(&name_b));
    let (uid_a, uid_b) = (h.uid(&pv_a), h.uid(&pv_b));
    drop(agent);

    // A reboot that enumerates the devices the other way round: b gets a's old node.
    for d in [&a, &b] {
        run(Command::new("losetup").arg("-d").arg(d));
    }
    // Each image on the other's old node (tests running alongside may take a node first:
    // then any free one, which differs from the old too).
    let attach = |node: &Path, img: &Path| {
        let ok = Command::new("losetup").arg(node).arg(img).status().is_ok_and(|s| s.success());
        if ok { node.to_path_buf() } else { h.lab.loop_on(img) }
    };
    let b2 = attach(&a, &img_b);
    let a2 = attach(&b, &img_a);
    assert!(a2 != a && b2 != b, "both devices changed nodes: {a2:?} {b2:?}");
    let agent = h.agent(&config, &[]);
    wait_until("links re-pointed at their own devices", WAIT, || {
        (std::fs::canonicalize(dir.join(&name_a)).ok()? == a2 && std::fs::canonicalize(dir.join(&name_b)).ok()? == b2)
            .then_some(())
    });
    assert_eq!(links(&dir), {
        let mut v = vec![name_a.clone(), name_b.clone()];
        v.sort();
        v
    });
    // Same PVs, never withdrawn, still Available.
    wait_until("both PVs kept", WAIT, || {
        (h.cp.pv_state(&pv_a)? == (uid_a.clone(), "Available".into())
            && h.cp.pv_state(&pv_b)? == (uid_b.clone(), "Available".into()))
            .then_some(())
    });
    assert_eq!(h.pvs_at(&dir.join(&name_a)).len(), 1);
    assert_eq!(h.pvs_at(&dir.join(&name_b)).len(), 1);
    drop(agent);
}

#[test]
fn a_claimed_device_is_released_wiped_and_published_again() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-cycle") else { return };
    let class = "dc-cycle";
    let (dir, config) = claim_class(&h, class, 41, "");
    let (dev, _) = h.lab.loop_dev("tenant", 41);
    let _agent = h.agent(&config, &[]);
    let name = wait_until("linked", WAIT, || link_to(&dir, &dev));
    let path = dir.join(&name);
    let pv = h.wait_published(&path);
    let uid = h.uid(&pv);
    h.claim("dc-cycle", class, &pv, true);
    // The tenant makes a filesystem and writes data, as a pod with the raw device would. A
    // probe the agent started before the claim bound may still hold the device exclusively for
    // a moment (mkfs refuses then): tried again for a few seconds.
    wait_until("mkfs by the tenant", std::time::Duration::from_secs(10), || {
        let out = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev).output().unwrap();
        out.status.success().then_some(())
    });
    std::fs::OpenOptions::new().write(true).open(&dev).unwrap().write_all_at(TENANT, 4096).unwrap();
    h.delete_claim("dc-cycle");
    let new = wait_until("published again after the wipe", WAIT, || {
        let (name, phase) = h.pv_at(&path)?;
        (phase == "Available" && h.uid(&name) != uid).then_some(name)
    });
    assert_eq!(new, pv, "the same PV name again: the link name did not change");
    assert!(head_is_zero(&dev), "the tenant's data is gone");
    assert!(blkid(&dev).is_empty(), "no signature left: {}", blkid(&dev));
    assert_eq!(links(&dir), vec![name]);
}

#[test]
fn max_per_node_is_respected_and_removing_the_section_keeps_links_with_pvs() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-max") else { return };
    let class = "dc-max";
    let (dir, config) = claim_class(&h, class, 43, "    maxPerNode: 2\n");
    let mut devs: Vec<PathBuf> = ["d1", "d2", "d3", "d4"].iter().map(|n| h.lab.loop_dev(n, 43).0).collect();
    // Taken in order of stable id (the backing file's filesystem, inode and range), as `disks`
    // reports them: the inodes a filesystem hands out need not follow the order of creation.
    let listing = disks_json(&config, &h.lab.path(&format!("state-{}", h.node)));
    let stable_id = |dev: &PathBuf| {
        let name = dev.file_name().unwrap().to_str().unwrap();
        listing.iter().find(|d| d["name"] == name).unwrap()["stableId"].as_str().unwrap().to_string()
    };
    devs.sort_by_key(stable_id);
    let _agent = h.agent(&config, &[]);
    wait_until("two devices linked", WAIT, || (links(&dir).len() == 2).then_some(()));
    for l in links(&dir) {
        h.wait_published(&dir.join(&l));
    }
    assert!(link_to(&dir, &devs[0]).is_some() && link_to(&dir, &devs[1]).is_some(), "{:?}", links(&dir));
    never_for(3, &|| (links(&dir).len() != 2).then(|| format!("{:?}", links(&dir))));
    let listing = disks_json(&config, &h.lab.path(&format!("state-{}", h.node)));
    assert!(verdict(&listing, &devs[2], class).contains("maxPerNode (2)"), "{}", verdict(&listing, &devs[2], class));

    // Without the section, links whose PV exists stay (and their PVs with them).
    support::write_config(
        &config,
        &[(
            "storageClassMap",
            &format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n", d = dir.display()),
        )],
    );
    never_for(5, &|| (links(&dir).len() != 2).then(|| format!("links changed: {:?}", links(&dir))));
    for l in links(&dir) {
        assert!(h.available_at(&dir.join(&l)).is_some(), "{l} lost its PV");
    }
}

#[test]
fn a_claimed_device_without_pv_that_shows_a_foreign_signature_is_held_back() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-held") else { return };
    let class = "dc-held";
    let (dir, config) = claim_class(&h, class, 47, "");
    let (dev, _) = h.lab.loop_dev("held", 47);
    // The agent claimed the device, then stopped before publishing it (a crash), and someone
    // put a filesystem on it meanwhile.
    let state = h.lab.dir(&format!("state-{}", h.node));
    let listing = disks_json(&config, &state);
    let v = verdict(&listing, &dev, class);
    let name = v
        .strip_prefix("would claim as ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let disk = listing.iter().find(|d| d["name"] == dev.file_name().unwrap().to_str().unwrap()).unwrap()["stableId"]
        .as_str()
        .unwrap()
        .to_string();
    let record = serde_json::json!([{
        "class": class, "name": name, "host_path": dir.join(&name).display().to_string(),
        "disk": disk, "target": dev.display().to_string(),
    }]);
    std::fs::write(state.join("claims.json"), record.to_string()).unwrap();
    std::os::unix::fs::symlink(&dev, dir.join(&name)).unwrap();
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    let _agent = h.agent(&config, &[]);
    wait_until("a DeviceHeld event", WAIT, || h.node_event("DeviceHeld", &name));
    never_for(3, &|| h.pv_at(&dir.join(&name)).map(|pv| format!("published: {pv:?}")));
    assert!(blkid(&dev).contains("TYPE=ext4"), "the data is kept");
    assert_eq!(links(&dir), vec![name.clone()], "the link is kept");
    // Cleared by the operator: published.
    run(Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "oflag=direct", "status=none"])
        .arg(format!("of={}", dev.display()))
        .arg(format!("count={}", 47)));
    h.wait_published(&dir.join(&name));
}

#[test]
fn unreadable_claim_records_hold_back_every_new_link_of_a_claiming_class() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dc-records") else { return };
    let class = "dc-records";
    let (dir, config) = claim_class(&h, class, 53, "");
    let (dev, _) = h.lab.loop_dev("linked", 53);
    let state = h.lab.dir(&format!("state-{}", h.node));
    std::fs::write(state.join("claims.json"), b"{ not json").unwrap();
    // Which links are the agent's is unknown: even a clean device behind a link waits.
    std::os::unix::fs::symlink(&dev, dir.join("disk-1")).unwrap();
    let _agent = h.agent(&config, &[]);
    wait_until("a DeviceClaimFailed event naming the file", WAIT, || h.node_event("DeviceClaimFailed", "claims.json"));
    never_for(3, &|| h.pv_at(&dir.join("disk-1")).map(|pv| format!("published: {pv:?}")));
    assert_eq!(links(&dir), vec!["disk-1".to_string()], "nothing claimed meanwhile");
    assert_eq!(std::fs::read(state.join("claims.json")).unwrap(), b"{ not json", "the file is left as it is");
    // The operator removes the broken file: the link is published (an operator's own link).
    std::fs::remove_file(state.join("claims.json")).unwrap();
    h.wait_published(&dir.join("disk-1"));
    never_for(2, &|| (links(&dir) != vec!["disk-1".to_string()]).then(|| format!("{:?}", links(&dir))));
}
