//! `discover` against real mounts on this machine: tmpfs, bind mounts, a plain directory, a
//! name with a space, a symlink to a loop device in a Block class, and pattern mismatches.
//! Needs root; skipped with a message otherwise.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use support::{LoopDevice, binary, bind_mount, mount_tmpfs, require_root, run, write_config};

#[test]
fn discover_reports_real_mounts_and_block_devices() {
    let _area = support::area(module_path!());
    if !require_root("discover_reports_real_mounts_and_block_devices") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs_dir = root.join("fs");
    let block_dir = root.join("block");
    std::fs::create_dir_all(&fs_dir).unwrap();
    std::fs::create_dir_all(&block_dir).unwrap();

    // Filesystem class: two tmpfs mounts (one with a space), a bind mount onto itself,
    // a plain directory, a regular file, and a mount that does not match the pattern.
    let _m1 = mount_tmpfs(&fs_dir.join("vol1"), 16);
    let _m2 = mount_tmpfs(&fs_dir.join("vol 2"), 24);
    let bind_src = root.join("bind-src");
    let _m3 = bind_mount(&bind_src, &fs_dir.join("vol3"));
    let _m4 = mount_tmpfs(&fs_dir.join("other"), 8);
    std::fs::create_dir_all(fs_dir.join("vol4-plain")).unwrap();
    std::fs::write(fs_dir.join("vol5-file"), b"x").unwrap();

    // Block class: a symlink to a loop device, a directory, and a dangling link.
    let lo = LoopDevice::new(&root.join("disk.img"), 64);
    symlink(&lo.device, block_dir.join("disk1")).unwrap();
    std::fs::create_dir_all(block_dir.join("disk2-dir")).unwrap();
    symlink(root.join("missing"), block_dir.join("disk3-dangling")).unwrap();

    let config = root.join("config");
    let class_map = format!(
        "local-fs:\n  hostDir: /host{fs}\n  mountDir: {fs}\n  namePattern: \"vol*\"\nlocal-block:\n  hostDir: {block}\n  mountDir: {block}\n  volumeMode: Block\n",
        fs = fs_dir.display(),
        block = block_dir.display()
    );
    write_config(&config, &[("storageClassMap", &class_map), ("labelsForPV", "team: storage\n")]);

    let out = run(Command::new(binary())
        .args([
            "discover",
            "--node-name",
            "test-node",
            "--node-uid",
            "0b9d5a4c-2f4e-4c55-9a51-1a1e3c1e6f7d",
            "--output",
            "json",
        ])
        .arg("--config-dir")
        .arg(&config));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let list: Value = serde_json::from_slice(&out.stdout).expect("discover prints a JSON List");
    assert_eq!(list["kind"], "List");
    assert_eq!(list["apiVersion"], "v1");
    let items = list["items"].as_array().unwrap();
    let mut paths: Vec<&str> = items.iter().map(|pv| pv["spec"]["local"]["path"].as_str().unwrap()).collect();
    paths.sort();
    let host_fs = format!("/host{}", fs_dir.display());
    let mut want = vec![
        format!("{}/disk1", block_dir.display()),
        format!("{host_fs}/vol 2"),
        format!("{host_fs}/vol1"),
        format!("{host_fs}/vol3"),
    ];
    want.sort();
    assert_eq!(paths, want, "stderr: {stderr}");

    let by_path = |p: &str| items.iter().find(|pv| pv["spec"]["local"]["path"] == p).unwrap();
    let vol1 = by_path(&format!("{host_fs}/vol1"));
    // 16 MiB tmpfs: >= 10 MiB, so whole MiB.
    assert_eq!(vol1["spec"]["capacity"]["storage"], "16Mi");
    assert_eq!(vol1["spec"]["volumeMode"], "Filesystem");
    assert_eq!(
        vol1["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"],
        "local-volume-provisioner-test-node-0b9d5a4c-2f4e-4c55-9a51-1a1e3c1e6f7d"
    );
    assert_eq!(vol1["metadata"]["labels"]["team"], "storage");
    assert_eq!(
        vol1["metadata"]["name"].as_str().unwrap(),
        local_static_provisioner::core::volumes::naming::pv_name("vol1", "test-node", "local-fs")
    );
    assert_eq!(by_path(&format!("{host_fs}/vol 2"))["spec"]["capacity"]["storage"], "24Mi");
    let disk = by_path(&format!("{}/disk1", block_dir.display()));
    assert_eq!(disk["spec"]["volumeMode"], "Block");
    assert_eq!(disk["spec"]["capacity"]["storage"], "64Mi");
    assert_eq!(disk["spec"]["storageClassName"], "local-block");

    for (entry, reason) in [
        ("vol4-plain", "not a mount point"),
        ("vol5-file", "neither a directory nor a block device"),
        ("other", "does not match namePattern"),
        ("disk2-dir", "directory in a Block class"),
        ("disk3-dangling", "which cannot be reached (No such file or directory"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("/{entry} ")))
            .unwrap_or_else(|| panic!("no skip line for {entry} in:\n{stderr}"));
        assert!(line.contains(reason), "skip line for {entry} should say {reason:?}: {line}");
    }

    // YAML output carries the same objects as documents.
    let yaml =
        run(Command::new(binary()).args(["discover", "--node-name", "test-node"]).arg("--config-dir").arg(&config));
    let text = String::from_utf8_lossy(&yaml.stdout);
    assert_eq!(text.matches("kind: PersistentVolume").count(), 4, "{text}");
    assert!(String::from_utf8_lossy(&yaml.stderr).contains("REPLACE-WITH-NODE-UID"));
}

#[test]
fn validate_config_lists_every_problem() {
    let _area = support::area(module_path!());
    let tmp = tempfile::tempdir().unwrap();
    let class_map = "a:\n  hostDir: relative/dir\n  mountDir: /mnt/a\nb:\n  hostDir: /proc\n  mountDir: /mnt/b\n  volumeMode: Raw\n";
    write_config(tmp.path(), &[("storageClassMap", class_map), ("minResyncPeriod", "soon\n"), ("bogusKey", "1\n")]);
    let out = Command::new(binary()).args(["validate-config", "--config-dir"]).arg(tmp.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "storageClassMap.a.hostDir",
        "must be an absolute path",
        "storageClassMap.b.hostDir",
        "system directory",
        "storageClassMap.b.volumeMode",
        "minResyncPeriod",
        "unknown config key \"bogusKey\"",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

#[test]
fn validate_config_refuses_likely_misspellings_and_strict_refuses_every_unknown_key() {
    let _area = support::area(module_path!());
    let validate = |dir: &std::path::Path, strict: bool| {
        let mut cmd = Command::new(binary());
        cmd.args(["validate-config", "--config-dir"]).arg(dir);
        if strict {
            cmd.arg("--strict");
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // namePatern: upstream would publish every entry; here the class fails with a suggestion.
    let tmp = tempfile::tempdir().unwrap();
    let class_map = "nvme:\n  hostDir: /mnt/lsp-typo-a\n  mountDir: /mnt/lsp-typo-a\n  namePatern: \"nvme*\"\n";
    write_config(tmp.path(), &[("storageClassMap", class_map)]);
    let (code, err) = validate(tmp.path(), false);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("storageClassMap.nvme.namePatern"), "{err}");
    assert!(err.contains("did you mean \"namePattern\"?"), "{err}");

    // storageClasMap: upstream would publish nothing, silently; here the config is refused.
    let tmp = tempfile::tempdir().unwrap();
    write_config(tmp.path(), &[("storageClasMap", "a:\n  hostDir: /mnt/lsp-typo-a\n  mountDir: /mnt/lsp-typo-a\n")]);
    let (code, err) = validate(tmp.path(), false);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("did you mean \"storageClassMap\"?"), "{err}");

    // A key unlike any known one is a warning, and an error with --strict.
    let tmp = tempfile::tempdir().unwrap();
    let class_map = "a:\n  hostDir: /mnt/lsp-typo-a\n  mountDir: /mnt/lsp-typo-a\n  reclaimPolicy: Retain\n";
    write_config(tmp.path(), &[("storageClassMap", class_map), ("notes", "hello\n")]);
    let (code, err) = validate(tmp.path(), false);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: storageClassMap.a: unknown key \"reclaimPolicy\""), "{err}");
    let (code, err) = validate(tmp.path(), true);
    assert_eq!(code, Some(1), "{err}");
    for line in ["error: storageClassMap.a.reclaimPolicy: unknown key", "error: notes: unknown key"] {
        assert!(err.contains(line), "missing {line:?} in:\n{err}");
    }
    // Upstream's real keys, every one, pass --strict.
    let tmp = tempfile::tempdir().unwrap();
    let class_map = "a:\n  hostDir: /mnt/lsp-typo-a\n  mountDir: /mnt/lsp-typo-a\n  blockCleanerCommand: [\"/scripts/quick_reset.sh\"]\n  volumeMode: Filesystem\n  fsType: ext4\n  namePattern: \"*\"\n  accessMode: ReadWriteOnce\n";
    write_config(
        tmp.path(),
        &[
            ("storageClassMap", class_map),
            ("nodeLabelsForPV", "- topology.kubernetes.io/zone\n"),
            ("labelsForPV", "team: storage\n"),
            ("useAlphaAPI", "false\n"),
            ("useJobForCleaning", "false\n"),
            ("minResyncPeriod", "5m0s\n"),
            ("useNodeNameOnly", "false\n"),
            ("setPVOwnerRef", "false\n"),
            ("removeNodeNotReadyTaint", "false\n"),
            ("provisionerNotReadyNodeTaintKey", "example.com/not-ready\n"),
        ],
    );
    let (code, err) = validate(tmp.path(), true);
    assert_eq!(code, Some(0), "{err}");
}

/// Removes a directory made under the host's /dev when dropped.
struct DevDir(std::path::PathBuf);

impl Drop for DevDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Upstream's EKS example: a class whose hostDir is /dev/disk/kubernetes, where a udev
/// rule puts links to the instance-store disks. Such a dedicated directory of the real /dev is
/// scanned, and each entry is still judged as a block device: the blank disk is offered, the
/// mounted one refused; a class on udev's own /dev/disk/by-id is refused whole.
#[test]
fn a_class_on_a_dedicated_directory_of_dev_offers_its_blank_disks_only() {
    let _area = support::area(module_path!());
    if !require_root("a_block_class_on_a_dedicated_directory_of_dev_offers_its_blank_disks_only") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dev_dir = DevDir(PathBuf::from(format!("/dev/disk/lsp-test-{}", std::process::id())));
    std::fs::create_dir_all(&dev_dir.0).unwrap();
    let blank = LoopDevice::new(&root.join("blank.img"), 64);
    let used = LoopDevice::new(&root.join("used.img"), 64);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&used.device));
    let _mounted = {
        let at = root.join("used-mnt");
        std::fs::create_dir_all(&at).unwrap();
        run(Command::new("mount").arg(&used.device).arg(&at));
        support::Mount { path: at }
    };
    symlink(&blank.device, dev_dir.0.join("nvme-blank")).unwrap();
    symlink(&used.device, dev_dir.0.join("nvme-used")).unwrap();

    // Upstream's example is a Filesystem class (kubelet formats each disk); Block works alike.
    for mode in ["Filesystem", "Block"] {
        let config = root.join(format!("config-{mode}"));
        let class_map = format!(
            "nvme-ssd:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: {mode}\nudev:\n  hostDir: /dev/disk/by-id\n  mountDir: /dev/disk/by-id\n  volumeMode: {mode}\n",
            d = dev_dir.0.display()
        );
        write_config(&config, &[("storageClassMap", &class_map)]);
        let out = Command::new(binary())
            .args(["discover", "--node-name", "test-node", "--output", "json", "--config-dir"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
        let items = list["items"].as_array().unwrap();
        let paths: Vec<&str> = items.iter().map(|pv| pv["spec"]["local"]["path"].as_str().unwrap()).collect();
        assert_eq!(paths, [format!("{}/nvme-blank", dev_dir.0.display())], "{mode}: stderr: {stderr}");
        assert_eq!(items[0]["spec"]["volumeMode"], mode);
        let used_line = stderr.lines().find(|l| l.contains("/nvme-used")).unwrap_or_else(|| panic!("{stderr}"));
        assert!(used_line.contains("is mounted at"), "{used_line}");
        assert!(stderr.contains("/dev/disk/by-id"), "the udev class is named: {stderr}");
        assert!(stderr.contains("`devices` section"), "with the advice: {stderr}");
    }
}
