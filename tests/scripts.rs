//! The upstream-compatible cleaner scripts shipped in deploy/scripts (for the `full` image and
//! for operators who mount them), run the way the agent runs them, against real loop devices.
//! Needs root.

mod support;

use std::process::Command;
use std::time::Duration;

use local_static_provisioner::host::wipe_block::run_cleaner_command;
use support::{LoopDevice, repo_root, require_root, run};

#[tokio::test]
async fn shipped_scripts_leave_no_signatures() {
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
