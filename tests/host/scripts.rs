//! The upstream-compatible cleaner scripts shipped in deploy/scripts (for the `full` image and
//! for operators who mount them), run the way the agent runs them, against real loop devices
//! (needs root); and the image archive of scripts/build-image.sh: reproducible wherever the
//! commit is checked out, with one SHA256SUMS for every archive built into a directory.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use local_static_provisioner::host::wipe::wipe_block::run_cleaner_command;
use support::{LoopDevice, repo_root, require_root, run};

#[tokio::test]
async fn shipped_scripts_leave_no_signatures() {
    let _area = support::area(module_path!());
    if !require_root("shipped_scripts_leave_no_signatures") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 4] =
        [("quick_reset.sh", &[]), ("dd_zero.sh", &[]), ("blkdiscard.sh", &[]), ("shred.sh", &["1"])];
    for (i, (script, args)) in cases.into_iter().enumerate() {
        let lo = LoopDevice::new(&tmp.path().join(format!("disk{i}.img")), 32);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.device));
        let mut argv = vec![repo_root().join("deploy/scripts").join(script).display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        run_cleaner_command(&argv, &lo.device, "test-pv", Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        let blkid = Command::new("blkid").arg("-p").arg(&lo.device).output().unwrap();
        assert_eq!(
            blkid.status.code(),
            Some(2),
            "{script}: blkid still finds {}",
            String::from_utf8_lossy(&blkid.stdout)
        );
    }
}

/// A clone of this repository's commit at `dir`, with the work tree's uncommitted changes to
/// tracked files (so the scripts under test are the ones in the work tree).
fn clone_at(dir: &Path) {
    let repo = repo_root();
    let head =
        String::from_utf8(run(Command::new("git").arg("-C").arg(&repo).args(["rev-parse", "HEAD"])).stdout).unwrap();
    run(Command::new("git").args(["clone", "-q", "--shared", "--no-checkout"]).arg(&repo).arg(dir));
    run(Command::new("git").arg("-C").arg(dir).args(["checkout", "-q", "--detach", head.trim()]));
    let diff = run(Command::new("git").arg("-C").arg(&repo).args(["diff", "--binary", "HEAD"])).stdout;
    if !diff.is_empty() {
        let patch = dir.join("../work-tree.patch");
        std::fs::write(&patch, diff).unwrap();
        run(Command::new("git").arg("-C").arg(dir).arg("apply").arg(&patch));
    }
}

/// scripts/build-image.sh in `checkout`, into `out`, packing the binary in `prebuilt`; returns
/// its first output line ("<name> <digest> <bytes>").
fn build_image(checkout: &Path, out: &Path, prebuilt: &Path, image: &str) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(checkout.join("scripts/build-image.sh"))
        .arg(out)
        .env("LSP_PREBUILT_DIR", prebuilt)
        .env("IMAGE", image)
        .env_remove("SOURCE_DATE_EPOCH")
        .env_remove("ARCH");
    let stdout = String::from_utf8(run(&mut cmd).stdout).unwrap();
    stdout.lines().next().unwrap_or_default().to_string()
}

/// The files named in `dir`/SHA256SUMS, after checking that it verifies.
fn summed(dir: &Path) -> Vec<String> {
    run(Command::new("sha256sum").args(["--quiet", "-c", "SHA256SUMS"]).current_dir(dir));
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    sums.lines().map(|l| l.split_once("  ").unwrap().1.to_string()).collect()
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no image architecture for {other}"),
    }
}

/// Two clones of one commit in different directories give the same image archive and SBOM, byte
/// for byte, with no path of either checkout in them: the SBOM's serial number, timestamp
/// (SOURCE_DATE_EPOCH, the commit's time by default) and bom-refs no longer depend on the build.
/// The binary is not built twice (a release build takes minutes): both pack the one this test
/// suite built (LSP_PREBUILT_DIR), as a CI job that builds once and packs elsewhere does; the
/// binary's own build date is SOURCE_DATE_EPOCH too (build.rs).
#[test]
fn the_image_archive_is_the_same_from_two_clones() {
    let _area = support::area(module_path!());
    let tmp = tempfile::tempdir().unwrap();
    let prebuilt = tmp.path().join("prebuilt");
    std::fs::create_dir(&prebuilt).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_local-static-provisioner"), prebuilt.join("local-static-provisioner")).unwrap();
    let image = "registry.example.com/storage/local-static-provisioner:9.9.9";
    let mut built: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut checkouts: Vec<PathBuf> = Vec::new();
    for (i, place) in ["a/checkout", "somewhere/much/deeper/lsp"].into_iter().enumerate() {
        let checkout = tmp.path().join(place);
        std::fs::create_dir_all(checkout.parent().unwrap()).unwrap();
        clone_at(&checkout);
        let out = tmp.path().join(format!("dist{i}"));
        let line = build_image(&checkout, &out, &prebuilt, image);
        let base = format!("local-static-provisioner-9.9.9-{}", host_arch());
        let archive = std::fs::read(out.join(format!("{base}.oci.tar"))).unwrap();
        let sbom = std::fs::read(out.join(format!("{base}.sbom.cdx.json"))).unwrap();
        assert_eq!(summed(&out), [format!("{base}.oci.tar"), format!("{base}.sbom.cdx.json")]);
        for bytes in [&archive, &sbom] {
            let text = String::from_utf8_lossy(bytes);
            assert!(!text.contains(&*checkout.to_string_lossy()), "{place}: the checkout's path is in the image");
            assert!(!text.contains(&*tmp.path().to_string_lossy()), "{place}: a build path is in the image");
        }
        built.push((line, archive, sbom));
        checkouts.push(checkout);
    }
    let sbom: serde_json::Value = serde_json::from_slice(&built[0].2).unwrap();
    // The commit's time in UTC, as the SBOM writes it.
    let commit_time = run(Command::new("git")
        .arg("-C")
        .arg(&checkouts[0])
        .args(["log", "-1", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "--format=%cd"])
        .env("TZ", "UTC"))
    .stdout;
    let commit_time = String::from_utf8(commit_time).unwrap().trim().to_string();
    assert_eq!(sbom["metadata"]["timestamp"], commit_time.as_str(), "the SBOM's timestamp is the commit's time");
    assert_eq!(built[0].0, built[1].0, "the two clones' images have different digests");
    assert!(built[0].1 == built[1].1, "the two clones' archives differ");
    assert!(built[0].2 == built[1].2, "the two clones' SBOMs differ");
}

/// Images built one after another into one directory (another architecture, another tag) are
/// all in its SHA256SUMS; building one again replaces its own lines.
#[test]
fn sha256sums_lists_every_archive_built_into_a_directory() {
    let _area = support::area(module_path!());
    let tmp = tempfile::tempdir().unwrap();
    let prebuilt = tmp.path().join("prebuilt");
    std::fs::create_dir(&prebuilt).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_local-static-provisioner"), prebuilt.join("local-static-provisioner")).unwrap();
    let out = tmp.path().join("dist");
    let repo = repo_root();
    let arch = host_arch();
    build_image(&repo, &out, &prebuilt, "lsp:1.0.0");
    build_image(&repo, &out, &prebuilt, "lsp:2.0.0");
    build_image(&repo, &out, &prebuilt, "lsp:1.0.0");
    let want: Vec<String> = ["1.0.0", "2.0.0"]
        .iter()
        .flat_map(|tag| {
            let base = format!("local-static-provisioner-{tag}-{arch}");
            [format!("{base}.oci.tar"), format!("{base}.sbom.cdx.json")]
        })
        .collect();
    assert_eq!(summed(&out), want);
}
