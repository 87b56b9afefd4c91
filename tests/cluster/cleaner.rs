//! The cleaner against real mounts, loop devices and the real control plane, with the agent
//! under the RBAC from deploy/: released volumes are wiped and published again, a used volume
//! is never published unwiped (crash, manual deletion), nothing outside a volume is touched,
//! and refusals keep every byte. Needs root.

use crate::support;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::volumes::naming::pv_name;
use support::{
    AgentProcess, ControlPlane, LoopDevice, Mount, Zram, binary, mount_tmpfs, require_root, run, umount_when_idle,
    wait_until, write_config,
};

const WAIT: Duration = Duration::from_secs(90);

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(usize::MAX)
}

/// [`support::wait_recycled`] with this file's patience.
fn wait_recycled(cp: &ControlPlane, name: &str, old_uid: &str, volume: Option<&Path>) -> String {
    support::wait_recycled(cp, name, old_uid, volume, WAIT)
}

/// The PV `name` published again after the wipe of PV `old_uid` tells that wipe: its
/// annotation names when, how (`method`) and the PV before it, and `kubectl describe pv` shows
/// it (events of the old PV are not shown: it had another UID; no event of its own tells it,
/// which would cost a request per released PV).
fn assert_recycled_history(cp: &ControlPlane, name: &str, old_uid: &str, method: &str) {
    let pv = cp.get_json(&["pv", name]).unwrap();
    let last = pv["metadata"]["annotations"]["local-static-provisioner.io/last-wipe"].as_str().unwrap_or_default();
    for part in [format!("method={method} "), format!("previous-pv={old_uid}"), "at=20".into(), "duration=".into()] {
        assert!(last.contains(&part), "{name}: {part:?} not in the last-wipe annotation {last:?}");
    }
    let described = cp.kubectl_ok(&["describe", "pv", name]);
    assert!(described.contains(&format!("previous-pv={old_uid}")), "describe shows the history: {described}");
}

fn cleanup_cli(cp: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(binary()).arg("cleanup").args(args).arg("--kubeconfig").arg(&cp.kubeconfig).output().unwrap()
}

#[test]
fn released_filesystem_volume_is_wiped_and_published_again() {
    let _area = support::area(module_path!());
    if !require_root("released_filesystem_volume_is_wiped_and_published_again") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-fs-node";
    cp.create_node(node);
    cp.create_storage_class("clean-fs", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let vol = fs_dir.join("vol1");
    let _m = mount_tmpfs(&vol, 64);
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o751)).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("keepdir")).unwrap();
    std::fs::write(outside.join("keep.txt"), b"keep me").unwrap();
    std::fs::write(outside.join("keepdir/inner.txt"), b"me too").unwrap();

    let config = tmp.path().join("config");
    let class_map = format!("clean-fs:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));

    let name = pv_name("vol1", node, "clean-fs");
    let first_uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(uid, _)| uid));
    let pv = cp.get_json(&["pv", &name]).unwrap();
    let finalizers = pv["metadata"]["finalizers"].as_array().unwrap();
    assert!(finalizers.contains(&serde_json::json!("local-static-provisioner.io/wipe")), "{finalizers:?}");
    assert!(
        pv["metadata"]["annotations"]["local-static-provisioner.io/volume-identity"]
            .as_str()
            .unwrap()
            .starts_with("v2;fs;")
    );
    assert_eq!(cp.bind_claim("clean-fs-claim", "clean-fs", false), name);

    // What a pod would leave behind: deep trees, odd names, read-only files, symlinks out.
    let mut deep = vol.join("deep");
    for i in 0..200 {
        deep = deep.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom"), b"x").unwrap();
    std::fs::write(vol.join(OsStr::from_bytes(b"not-utf8-\xff\xfe")), b"x").unwrap();
    std::fs::write(vol.join("new\nline"), b"x").unwrap();
    let ro = vol.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::write(ro.join("file"), b"x").unwrap();
    std::fs::set_permissions(ro.join("file"), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    symlink(outside.join("keep.txt"), vol.join("link-to-file")).unwrap();
    symlink(outside.join("keepdir"), vol.join("link-to-dir")).unwrap();
    // And on the root itself: an attribute, mode, owner and a chattr flag for the next tenant.
    rustix::fs::setxattr(&vol, "user.tenant", b"secret", rustix::fs::XattrFlags::empty()).unwrap();
    std::os::unix::fs::chown(&vol, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
    run(Command::new("chattr").arg("+d").arg(&vol));

    cp.release_claim("clean-fs-claim");
    wait_recycled(&cp, &name, &first_uid, Some(&vol));
    assert_eq!(entries(&vol), 0, "volume must be empty");
    // The root is as the operator left it when the volume was first published (recorded then),
    // with nothing of the tenant's on it.
    let meta = std::fs::metadata(&vol).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o751, "root mode as first published");
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "root owner as first published");
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::listxattr(&vol, &mut names[..]).unwrap();
    assert!(!names[..n].windows(4).any(|w| w == b"user"), "{:?}", String::from_utf8_lossy(&names[..n]));
    let root =
        rustix::fs::open(&vol, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty())
            .unwrap();
    assert_eq!(rustix::fs::ioctl_getflags(&root).unwrap().bits() & 0x40, 0, "nodump cleared");
    assert_eq!(std::fs::read(outside.join("keep.txt")).unwrap(), b"keep me");
    assert_eq!(std::fs::read(outside.join("keepdir/inner.txt")).unwrap(), b"me too");
    // A wipe this quick is told in the log and the metrics, and on the new PV (one event and an
    // annotation), not with events of its own about the old PV (requests per PV).
    assert!(agent.log_text().contains(&format!("volume wiped pv=\"{name}\"")), "{}", agent.log_text());
    assert!(!cp.has_event(&name, "VolumeCleaned", "wiped"));
    assert_recycled_history(&cp, &name, &first_uid, "filesystem");
    let metrics = agent.admin_get("/metrics");
    assert!(
        metrics
            .contains("local_volume_provisioner_persistentvolume_delete_total{mode=\"Filesystem\",type=\"process\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("local_static_provisioner_wipe_bytes_total{mode=\"Filesystem\"}"), "{metrics}");
    assert!(metrics.contains("local_volume_provisioner_apiserver_requests_total{method=\"create\"}"), "{metrics}");
    assert!(metrics.contains("local_static_provisioner_volumes{state=\"Available\"} 1"), "{metrics}");
    assert!(agent.admin_get("/readyz").starts_with("HTTP/1.1 200"));
    drop(agent);
}

#[test]
fn block_volumes_are_wiped_by_builtin_quick_and_by_a_command() {
    let _area = support::area(module_path!());
    if !require_root("block_volumes_are_wiped_by_builtin_quick_and_by_a_command") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-blk-node";
    cp.create_node(node);
    cp.create_storage_class("clean-blk", "Delete");
    cp.create_storage_class("clean-cmd", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let (blk_dir, cmd_dir) = (tmp.path().join("blk"), tmp.path().join("cmd"));
    std::fs::create_dir_all(&blk_dir).unwrap();
    std::fs::create_dir_all(&cmd_dir).unwrap();

    // disk1: a GPT with one partition holding ext4, plus ext4 on the whole device's start.
    let disk1 = LoopDevice::new(&tmp.path().join("disk1.img"), 128);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk1.device));
    let gpt = "label: gpt\nstart=2048, size=100000, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n";
    let mut sfdisk = Command::new("sfdisk")
        .args(["--quiet", "--wipe", "never"])
        .arg(&disk1.device)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut sfdisk.stdin.take().unwrap(), gpt.as_bytes()).unwrap();
    assert!(sfdisk.wait().unwrap().success());
    let probe = run(Command::new("blkid").arg("-p").arg(&disk1.device));
    assert!(
        String::from_utf8_lossy(&probe.stdout).contains("gpt")
            || String::from_utf8_lossy(&probe.stdout).contains("ext4")
    );
    symlink(&disk1.device, blk_dir.join("disk1")).unwrap();

    let disk2 = LoopDevice::new(&tmp.path().join("disk2.img"), 64);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk2.device));
    symlink(&disk2.device, cmd_dir.join("disk2")).unwrap();
    let marker = tmp.path().join("marker");
    let script = tmp.path().join("cleaner.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nset -e\necho \"cleaning $LOCAL_PV_BLKDEVICE\"\nprintf '%s' \"$LOCAL_PV_BLKDEVICE\" > {}\nwipefs -a \"$LOCAL_PV_BLKDEVICE\"\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let config = tmp.path().join("config");
    let class_map = format!(
        "clean-blk:\n  hostDir: {b}\n  mountDir: {b}\n  volumeMode: Block\nclean-cmd:\n  hostDir: {c}\n  mountDir: {c}\n  volumeMode: Block\n  blockCleanerCommand: [\"{s}\"]\n",
        b = blk_dir.display(),
        c = cmd_dir.display(),
        s = script.display()
    );
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));

    let (n1, n2) = (pv_name("disk1", node, "clean-blk"), pv_name("disk2", node, "clean-cmd"));
    let u1 = wait_until("disk1 PV", WAIT, || cp.pv_state(&n1).map(|(u, _)| u));
    let u2 = wait_until("disk2 PV", WAIT, || cp.pv_state(&n2).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("clean-blk-claim", "clean-blk", true), n1);
    assert_eq!(cp.bind_claim("clean-cmd-claim", "clean-cmd", true), n2);
    cp.release_claim("clean-blk-claim");
    cp.release_claim("clean-cmd-claim");
    wait_recycled(&cp, &n1, &u1, None);
    wait_recycled(&cp, &n2, &u2, None);
    assert_recycled_history(&cp, &n1, &u1, "quick");
    assert_recycled_history(&cp, &n2, &u2, "command-cleaner.sh");

    let blkid = Command::new("blkid").arg("-p").arg(&disk1.device).output().unwrap();
    assert_eq!(blkid.status.code(), Some(2), "blkid must find nothing: {}", String::from_utf8_lossy(&blkid.stdout));
    let wipefs = run(Command::new("wipefs").arg(&disk1.device));
    assert!(wipefs.stdout.is_empty(), "wipefs must find nothing: {}", String::from_utf8_lossy(&wipefs.stdout));
    let marker_text = std::fs::read_to_string(&marker).unwrap_or_else(|e| panic!("marker: {e}\n{}", agent.log_text()));
    assert_eq!(marker_text, cmd_dir.join("disk2").display().to_string());
    assert!(agent.log_text().contains("cleaning"), "the command's output is logged");
    drop(agent);
}

#[test]
fn sigkill_during_a_wipe_resumes_and_never_offers_the_dirty_volume() {
    let _area = support::area(module_path!());
    if !require_root("sigkill_during_a_wipe_resumes_and_never_offers_the_dirty_volume") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-kill-node";
    cp.create_node(node);
    cp.create_storage_class("clean-kill", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let vol = fs_dir.join("big");
    let _m = mount_tmpfs(&vol, 2048);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("clean-kill:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent-1.log"));
    let name = pv_name("big", node, "clean-kill");
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("clean-kill-claim", "clean-kill", false), name);
    for d in 0..400 {
        let dir = vol.join(format!("dir{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..1000 {
            std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
    }
    cp.release_claim("clean-kill-claim");
    let started = Instant::now();
    while !agent.log_text().contains("starting wipe") {
        assert!(started.elapsed() < WAIT, "wipe never started:\n{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(agent); // SIGKILL, mid-wipe.
    let left = entries(&vol);
    assert!(left > 0, "the wipe finished before the kill; the test needs a bigger tree");
    let (still, phase) = cp.pv_state(&name).expect("the PV must survive the crash");
    assert_eq!(still, uid, "the PV must not be deleted before its wipe completed");
    assert_eq!(phase, "Released");

    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent-2.log"));
    wait_recycled(&cp, &name, &uid, Some(&vol));
    assert_eq!(entries(&vol), 0);
    drop(agent);
}

#[test]
fn a_hand_deleted_used_pv_is_wiped_before_it_returns() {
    let _area = support::area(module_path!());
    if !require_root("a_hand_deleted_used_pv_is_wiped_before_it_returns") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-manual-node";
    cp.create_node(node);
    cp.create_storage_class("clean-retain", "Retain");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let vol = fs_dir.join("vol");
    let _m = mount_tmpfs(&vol, 16);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("clean-retain:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let name = pv_name("vol", node, "clean-retain");
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(u, _)| u));
    cp.bind_claim("clean-manual-claim", "clean-retain", false);
    std::fs::write(vol.join("secret"), b"tenant data").unwrap();
    cp.release_claim("clean-manual-claim");
    wait_until("Released", WAIT, || (cp.pv_state(&name)?.1 == "Released").then_some(()));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(std::fs::read(vol.join("secret")).unwrap(), b"tenant data", "Retain keeps the data");

    cp.kubectl_ok(&["delete", "pv", &name, "--wait=false"]);
    wait_recycled(&cp, &name, &uid, Some(&vol));
    assert_eq!(entries(&vol), 0, "a used volume comes back only wiped");
    drop(agent);
}

#[test]
fn refusals_keep_every_byte_and_say_why() {
    let _area = support::area(module_path!());
    if !require_root("refusals_keep_every_byte_and_say_why") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-refuse-node";
    cp.create_node(node);
    cp.create_storage_class("clean-refuse", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let (nested, swapped, bound) = (fs_dir.join("nested"), fs_dir.join("swapped"), fs_dir.join("bound"));
    let _m1 = mount_tmpfs(&nested, 16);
    let _m2 = mount_tmpfs(&swapped, 16);
    let _m3 = mount_tmpfs(&bound, 16);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("clean-refuse:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let names: Vec<String> = ["nested", "swapped", "bound"].iter().map(|e| pv_name(e, node, "clean-refuse")).collect();
    for n in &names {
        wait_until("PVs published", WAIT, || cp.pv_state(n));
    }
    let claims = ["refuse-nested", "refuse-swapped", "refuse-bound"];
    let mut bound_to = Vec::new();
    for c in claims {
        bound_to.push(cp.bind_claim(c, "clean-refuse", false));
    }
    let path_of = |pv: &str| -> std::path::PathBuf {
        let v = cp.get_json(&["pv", pv]).unwrap();
        v["spec"]["local"]["path"].as_str().unwrap().into()
    };
    let (pv_nested, pv_swapped, pv_bound) = (&bound_to[0], &bound_to[1], &bound_to[2]);
    let (p_nested, p_swapped, p_bound) = (path_of(pv_nested), path_of(pv_swapped), path_of(pv_bound));

    // A nested mount inside one volume; a different disk swapped in at another's path.
    std::fs::write(p_nested.join("data"), b"kept").unwrap();
    let _inner = mount_tmpfs(&p_nested.join("inner"), 8);
    std::fs::write(p_nested.join("inner/data"), b"inner kept").unwrap();
    umount_when_idle(&p_swapped);
    let _other = mount_tmpfs(&p_swapped, 16);
    std::fs::write(p_swapped.join("other-disk"), b"not yours").unwrap();
    std::fs::write(p_bound.join("live"), b"in use").unwrap();

    cp.release_claim(claims[0]);
    cp.release_claim(claims[1]);
    wait_until("nested mount refused", WAIT, || cp.has_event(pv_nested, "VolumeFailedDelete", "inner").then_some(()));
    // Depending on timing the agent first notices the foreign disk as its volume missing, or
    // refuses the wipe on the identity check; both keep the other disk's data.
    wait_until("swapped disk refused", WAIT, || {
        (cp.has_event(pv_swapped, "VolumeFailedDelete", "identity")
            || cp.has_event(pv_swapped, "VolumeMissing", "missing"))
        .then_some(())
    });

    // A cleanup request on a Bound PV is refused, visibly.
    let out = cleanup_cli(&cp, &[pv_bound.as_str(), "--wait", "--timeout", "60s"]);
    assert!(!out.status.success(), "a Bound PV must be refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Bound"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(cp.has_event(pv_bound, "VolumeCleanupRefused", "Bound"));

    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(std::fs::read(p_nested.join("data")).unwrap(), b"kept");
    assert_eq!(std::fs::read(p_nested.join("inner/data")).unwrap(), b"inner kept");
    assert_eq!(std::fs::read(p_swapped.join("other-disk")).unwrap(), b"not yours");
    assert_eq!(std::fs::read(p_bound.join("live")).unwrap(), b"in use");
    for pv in [pv_nested, pv_swapped] {
        assert_eq!(cp.pv_state(pv).unwrap().1, "Released", "{pv} stays Released");
    }
    assert_eq!(cp.pv_state(pv_bound).unwrap().1, "Bound");
    drop(agent);
}

#[test]
fn cleanup_requests_recycle_available_and_retained_volumes() {
    let _area = support::area(module_path!());
    if !require_root("cleanup_requests_recycle_available_and_retained_volumes") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-trigger-node";
    cp.create_node(node);
    cp.create_storage_class("clean-trigger", "Retain");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let (avail, kept) = (fs_dir.join("avail"), fs_dir.join("kept"));
    let _m1 = mount_tmpfs(&avail, 16);
    let _m2 = mount_tmpfs(&kept, 16);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("clean-trigger:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let (n_avail, n_kept) = (pv_name("avail", node, "clean-trigger"), pv_name("kept", node, "clean-trigger"));
    let u_avail = wait_until("PV published", WAIT, || cp.pv_state(&n_avail).map(|(u, _)| u));
    wait_until("PV published", WAIT, || cp.pv_state(&n_kept));

    // Available: withdrawn, wiped, published again.
    std::fs::write(avail.join("stale"), b"x").unwrap();
    let out = cleanup_cli(&cp, &[n_avail.as_str(), "--wait", "--timeout", "90s"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    assert_eq!(entries(&avail), 0);
    assert_ne!(cp.pv_state(&n_avail).unwrap().0, u_avail);

    // Released with Retain: kept until asked, then wiped.
    let pv = cp.bind_claim("trigger-kept", "clean-trigger", false);
    let u_kept = cp.pv_state(&pv).unwrap().0;
    let kept_path = if pv == n_kept { &kept } else { &avail };
    std::fs::write(kept_path.join("data"), b"x").unwrap();
    cp.release_claim("trigger-kept");
    wait_until("Released", WAIT, || (cp.pv_state(&pv)?.1 == "Released").then_some(()));
    let out = cleanup_cli(&cp, &[pv.as_str(), "--wait", "--timeout", "90s"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(entries(kept_path), 0);
    assert_ne!(cp.pv_state(&pv).unwrap().0, u_kept);
    drop(agent);
}

fn mount_device(device: &Path, at: &Path) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    run(Command::new("mount").arg(device).arg(at));
    Mount { path: at.to_path_buf() }
}

/// Issue 12: while the agent was down, the disks of two Released PVs were replaced by clones
/// (same ext4 UUID, same files). The clone on another loop device is provably another disk and
/// is never wiped. The clone on a device with no stable ID (zram) cannot be told from the
/// original: its wipe waits, the event says what to check and the exact command to confirm,
/// and only a confirmation of exactly the identity found lets it proceed.
#[test]
fn cloned_disks_swapped_in_while_released_are_refused_until_confirmed() {
    let _area = support::area(module_path!());
    if !require_root("cloned_disks_swapped_in_while_released_are_refused_until_confirmed") {
        return;
    }
    let zram = Zram::new(64).zip(Zram::new(64));
    if zram.is_none() {
        support::cannot_run(
            "the zram part of cloned_disks_swapped_in_while_released_are_refused_until_confirmed",
            "no zram in this kernel; only the provably different clone is tested",
        );
    }
    let cp = ControlPlane::get();
    let node = "clean-identity-node";
    cp.create_node(node);
    cp.create_storage_class("clean-identity", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let (cloned, noid) = (fs_dir.join("cloned"), fs_dir.join("noid"));
    let (img_a, img_b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
    let disk_a = LoopDevice::new(&img_a, 64);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk_a.device));
    let m_cloned = mount_device(&disk_a.device, &cloned);
    let uuid = "5b0c2e8e-6c1f-4d7e-9a4b-2f1e0d9c8b7a";
    let m_noid = zram.as_ref().map(|(original, _)| {
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-U", uuid]).arg(&original.device));
        mount_device(&original.device, &noid)
    });
    let config = tmp.path().join("config");
    let class_map = format!("clean-identity:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent-1.log"));

    let mut entries_used = vec!["cloned"];
    if zram.is_some() {
        entries_used.push("noid");
    }
    let mut pvs = BTreeMap::new();
    for entry in &entries_used {
        let name = pv_name(entry, node, "clean-identity");
        wait_until("PV published", WAIT, || cp.pv_state(&name));
        let claim = format!("identity-{entry}");
        let bound = cp.bind_claim(&claim, "clean-identity", false);
        let v = cp.get_json(&["pv", &bound]).unwrap();
        let path = std::path::PathBuf::from(v["spec"]["local"]["path"].as_str().unwrap());
        std::fs::write(path.join("tenant"), b"tenant data").unwrap();
        let uid = v["metadata"]["uid"].as_str().unwrap().to_string();
        pvs.insert(path, (bound, uid, claim));
    }
    drop(agent); // The node goes down.

    // Clones swapped in: byte-for-byte copies, same UUID, same tenant file, plus their own.
    drop(m_cloned);
    run(Command::new("cp").arg("--sparse=always").arg(&img_a).arg(&img_b));
    let disk_b = LoopDevice::new(&img_b, 64);
    let _m_clone = mount_device(&disk_b.device, &cloned);
    std::fs::write(cloned.join("clone-only"), b"not yours").unwrap();
    let _m_noid_clone = zram.as_ref().map(|(original, clone)| {
        drop(m_noid);
        run(Command::new("dd")
            .arg(format!("if={}", original.device.display()))
            .arg(format!("of={}", clone.device.display()))
            .args(["bs=1M", "status=none"]));
        let m = mount_device(&clone.device, &noid);
        std::fs::write(noid.join("clone-only"), b"not yours").unwrap();
        m
    });
    for (_, _, claim) in pvs.values() {
        cp.release_claim(claim);
    }
    for (pv, _, _) in pvs.values() {
        wait_until("Released", WAIT, || (cp.pv_state(pv)?.1 == "Released").then_some(()));
    }

    // The agent comes back; a long settle window keeps the presence check from flagging the
    // volumes first, so each wipe meets the identity check.
    let log2 = tmp.path().join("agent-2.log");
    let agent = AgentProcess::start_with(&config, node, &kubeconfig, &log2, &["--settle", "1h"]);
    let (pv_cloned, uid_cloned, _) = pvs[&cloned].clone();
    wait_until("the clone on another device refused", WAIT, || {
        cp.has_event(&pv_cloned, "VolumeFailedDelete", "identity mismatch").then_some(())
    });
    assert!(cp.has_event(&pv_cloned, "VolumeFailedDelete", "the device is another one"));
    assert!(cp.describe_shows_event(&pv_cloned, "VolumeFailedDelete"), "kubectl describe pv shows the refusal");

    if zram.is_some() {
        let (pv_noid, uid_noid, _) = pvs[&noid].clone();
        let command =
            format!("kubectl annotate pv {pv_noid} --overwrite local-static-provisioner.io/identity-confirmed='");
        wait_until("the unproven clone refused, with the command to confirm", WAIT, || {
            cp.has_event(&pv_noid, "VolumeFailedDelete", &command).then_some(())
        });
        let result = cp.get_json(&["pv", &pv_noid]).unwrap()["metadata"]["annotations"]
            ["local-static-provisioner.io/cleanup-result"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(result.contains("no stable ID"), "{result}");
        let found = result.split(&command).nth(1).and_then(|rest| rest.split('\'').next()).unwrap().to_string();
        assert!(found.starts_with("v2;fs;uuid=") && !found.contains("disk="), "{found}");
        let recorded = cp.get_json(&["pv", &pv_noid]).unwrap()["metadata"]["annotations"]
            ["local-static-provisioner.io/volume-identity"]
            .as_str()
            .unwrap()
            .to_string();

        // Confirming anything but the identity found now changes nothing.
        let annotate = |value: &str| {
            cp.kubectl_ok(&[
                "annotate",
                "pv",
                &pv_noid,
                "--overwrite",
                &format!("local-static-provisioner.io/identity-confirmed={value}"),
            ])
        };
        annotate(&recorded);
        wait_until("the wrong confirmation checked", WAIT, || {
            agent.log_text().contains("checking the disk identity again").then_some(())
        });
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(std::fs::read(noid.join("clone-only")).unwrap(), b"not yours");
        assert_eq!(cp.pv_state(&pv_noid).map(|(u, _)| u), Some(uid_noid.clone()));

        // The operator checked the disk and confirms exactly what was found: it is wiped.
        annotate(&found);
        wait_until("the confirmed disk wiped and its PV gone", WAIT, || {
            (cp.pv_state(&pv_noid).map(|(u, _)| u) != Some(uid_noid.clone())).then_some(())
        });
        assert_eq!(entries(&noid), 0, "the confirmed volume is wiped");
        assert!(agent.log_text().contains(&format!("volume wiped pv=\"{pv_noid}\"")));
    }

    // The provably different clone is never wiped, confirmation or not.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(std::fs::read(cloned.join("clone-only")).unwrap(), b"not yours");
    assert_eq!(std::fs::read(cloned.join("tenant")).unwrap(), b"tenant data");
    assert_eq!(cp.pv_state(&pv_cloned), Some((uid_cloned, "Released".to_string())));
    drop(agent);
    drop(disk_a);
}

/// kubelet can still have a released volume mounted for a pod (a force-deleted pod's containers
/// outlive its claim): the wipe waits, says why in an event, and what the "container" writes in
/// the meantime is wiped too, once kubelet has let go. Both kinds: a filesystem bind-mounted
/// under kubelet's pods directory, and a block device node bind-mounted under its plugins
/// directory (how kubelet maps a Block volume). kubelet's directory is a stand-in here
/// (--kubelet-dir); tests/real_node.rs shows the same with a real kubelet.
#[test]
fn a_volume_kubelet_still_holds_is_wiped_only_once_kubelet_lets_go() {
    let _area = support::area(module_path!());
    if !require_root("a_volume_kubelet_still_holds_is_wiped_only_once_kubelet_lets_go") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-held-node";
    cp.create_node(node);
    cp.create_storage_class("clean-held-fs", "Delete");
    cp.create_storage_class("clean-held-blk", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let (fs_dir, blk_dir, kubelet) = (tmp.path().join("fs"), tmp.path().join("blk"), tmp.path().join("kubelet"));
    std::fs::create_dir_all(&blk_dir).unwrap();
    let vol = fs_dir.join("vol1");
    let _vol = mount_tmpfs(&vol, 16);
    let disk = LoopDevice::new(&tmp.path().join("disk.img"), 16);
    symlink(&disk.device, blk_dir.join("disk1")).unwrap();

    let config = tmp.path().join("config");
    let class_map = format!(
        "clean-held-fs:\n  hostDir: {f}\n  mountDir: {f}\nclean-held-blk:\n  hostDir: {b}\n  mountDir: {b}\n  volumeMode: Block\n",
        f = fs_dir.display(),
        b = blk_dir.display()
    );
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let kubelet_flag = kubelet.display().to_string();
    let agent = AgentProcess::start_with(
        &config,
        node,
        &kubeconfig,
        &tmp.path().join("agent.log"),
        &["--kubelet-dir", &kubelet_flag],
    );
    let (fs_pv, blk_pv) = (pv_name("vol1", node, "clean-held-fs"), pv_name("disk1", node, "clean-held-blk"));
    let fs_uid = wait_until("fs PV", WAIT, || cp.pv_state(&fs_pv).map(|(u, _)| u));
    let blk_uid = wait_until("block PV", WAIT, || cp.pv_state(&blk_pv).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("held-fs", "clean-held-fs", false), fs_pv);
    assert_eq!(cp.bind_claim("held-blk", "clean-held-blk", true), blk_pv);

    // kubelet's mounts for the pods, as it makes them.
    let pod_dir = kubelet.join("pods/u1/volumes/kubernetes.io~local-volume").join(&fs_pv);
    std::fs::create_dir_all(&pod_dir).unwrap();
    let pod_mount = support::bind_mount(&vol, &pod_dir);
    let map_dir = kubelet.join("plugins/kubernetes.io~local-volume/volumeDevices").join(&blk_pv);
    std::fs::create_dir_all(&map_dir).unwrap();
    let map_path = map_dir.join("u1");
    std::fs::write(&map_path, b"").unwrap();
    run(Command::new("mount").arg("--bind").arg(&disk.device).arg(&map_path));
    let map_mount = Mount { path: map_path.clone() };
    std::fs::write(pod_dir.join("tenant-data"), b"before").unwrap();
    run(Command::new("mkswap").arg(&map_path));

    cp.release_claim("held-fs");
    cp.release_claim("held-blk");
    for pv in [&fs_pv, &blk_pv] {
        wait_until(&format!("{pv}: wipe waits for kubelet"), WAIT, || {
            cp.has_event(pv, "VolumeStillMounted", "still mounted for a pod").then_some(())
        });
    }
    // The "containers" go on writing; nothing has been wiped or republished.
    std::fs::write(pod_dir.join("written-after-release"), b"after").unwrap();
    assert_eq!(cp.pv_state(&fs_pv), Some((fs_uid.clone(), "Released".into())));
    assert_eq!(cp.pv_state(&blk_pv), Some((blk_uid.clone(), "Released".into())));
    assert_eq!(entries(&vol), 2, "nothing wiped while held");
    let probe = run(Command::new("blkid").arg("-p").arg("-o").arg("value").arg("-s").arg("TYPE").arg(&disk.device));
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "swap", "the device is untouched while mapped");

    // kubelet lets go: both are wiped (including what was written meanwhile) and come back.
    drop(pod_mount);
    umount_when_idle(&map_path);
    drop(map_mount); // already unmounted: a no-op
    wait_recycled(&cp, &fs_pv, &fs_uid, Some(&vol));
    wait_recycled(&cp, &blk_pv, &blk_uid, None);
    assert_eq!(entries(&vol), 0);
    let blkid = Command::new("blkid").arg("-p").arg(&disk.device).output().unwrap();
    assert_eq!(blkid.status.code(), Some(2), "no signature left: {}", String::from_utf8_lossy(&blkid.stdout));
    drop(agent);
}

/// A class that is invalid when the agent starts (a typo in its own settings) does not run,
/// while the other classes do, and nothing is taken from its PVs: a released one is neither
/// wiped nor published again (its data stays, the event says why) until the class is fixed,
/// and then it is wiped and published again.
#[test]
fn a_class_invalid_at_start_up_keeps_its_released_volume_untouched_until_fixed() {
    let _area = support::area(module_path!());
    if !require_root("a_class_invalid_at_start_up_keeps_its_released_volume_untouched_until_fixed") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "clean-invalid-node";
    cp.create_node(node);
    cp.create_storage_class("clean-inv", "Delete");
    cp.create_storage_class("clean-inv-ok", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ok_dir) = (tmp.path().join("inv"), tmp.path().join("ok"));
    let vol = dir.join("vol1");
    let _m = mount_tmpfs(&vol, 16);
    let _ok = mount_tmpfs(&ok_dir.join("vol1"), 16);
    let class = |name: &str, d: &Path, extra: &str| {
        format!("{name}:\n  hostDir: {d}\n  mountDir: {d}\n{extra}", d = d.display())
    };
    let valid = class("clean-inv", &dir, "");
    let config = tmp.path().join("config");
    write_config(&config, &[("storageClassMap", &valid)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let name = pv_name("vol1", node, "clean-inv");
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(uid, _)| uid));
    assert_eq!(cp.bind_claim("clean-inv-claim", "clean-inv", false), name);
    std::fs::write(vol.join("tenant.txt"), b"tenant data").unwrap();
    drop(agent);

    // Restarted with a typo in that class, and a valid class beside it.
    let ok = class("clean-inv-ok", &ok_dir, "");
    let broken = format!("{}{ok}", class("clean-inv", &dir, "  volumeMode: Filesytem\n"));
    write_config(&config, &[("storageClassMap", &broken)]);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent-2.log"));
    wait_until("the valid class published", WAIT, || cp.pv_state(&pv_name("vol1", node, "clean-inv-ok")));
    cp.release_claim("clean-inv-claim");
    wait_until("the refused wipe reported", WAIT, || {
        cp.has_event(&name, "VolumeFailedDelete", "\"clean-inv\" is invalid in the ConfigMap").then_some(())
    });
    assert_eq!(cp.pv_state(&name), Some((uid.clone(), "Released".to_string())), "the PV is kept");
    assert_eq!(std::fs::read(vol.join("tenant.txt")).unwrap(), b"tenant data", "nothing is wiped");
    let ready = agent.admin_get("/readyz");
    assert!(ready.contains("class \"clean-inv\" is invalid and not used"), "{ready}");

    // Fixed: the released volume is wiped and published again.
    write_config(&config, &[("storageClassMap", &format!("{valid}{ok}"))]);
    wait_recycled(&cp, &name, &uid, Some(&vol));
    assert_eq!(entries(&vol), 0, "volume must be empty");
    drop(agent);
}
