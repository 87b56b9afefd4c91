//! The agent's own binary, kept on the host for the boot fence: kubelet's `ExecStartPre` runs
//! `<state dir>/bin/local-static-provisioner fence-node` (deploy/host/) before any pod of a
//! booting node is started, when no agent runs yet. The DaemonSet puts it there, as CNI plugins
//! put theirs in /opt/cni/bin, so it is always the version of the agent that runs on the node.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::host::HostError;
use crate::host::state_file::{StateFileError, replace_durably};

/// Why the binary could not be installed, naming the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BootFenceError {
    /// Reading our binary or making the directory failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// Writing the copy failed.
    #[error(transparent)]
    Write(#[from] StateFileError),
}

/// Where the binary goes, under the agent's state directory.
pub(crate) fn installed_path(state_dir: &Path) -> PathBuf {
    state_dir.join("bin").join("local-static-provisioner")
}

/// Copies `binary` (the running agent's, `/proc/self/exe`) to `installed_path(state_dir)`
/// unless an identical copy is there: written beside it, synced, renamed over it, so a crash
/// or a kubelet reading it meanwhile sees the old binary or the new one, never half of one.
/// Returns whether it was written.
pub(crate) fn install_binary(binary: &Path, state_dir: &Path) -> Result<bool, BootFenceError> {
    let target = installed_path(state_dir);
    let dir = target.parent().unwrap_or(state_dir).to_path_buf();
    let ours = std::fs::read(binary).map_err(|e| BootFenceError::Host(HostError::io("reading", binary, e)))?;
    if same_content(&target, &ours) {
        return Ok(false);
    }
    std::fs::create_dir_all(&dir).map_err(|e| BootFenceError::Host(HostError::io("creating", &dir, e)))?;
    replace_durably(&dir, &target, &ours, Some(0o755))?;
    Ok(true)
}

/// Where `fence-node` notes that it fenced this boot: under /run, which every boot empties, so
/// a kubelet restarted within a boot (its disks unchanged, the agent running and not looking
/// for the label) does not fence the node again.
pub(crate) const BOOT_MARKER: &str = "/run/local-static-provisioner/boot-fenced";

/// Whether `marker` says this boot was fenced already.
pub(crate) fn fenced_this_boot(marker: &Path) -> bool {
    marker.exists()
}

/// Notes in `marker` that this boot was fenced.
pub(crate) fn note_fenced(marker: &Path) -> Result<(), HostError> {
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir).map_err(|e| HostError::io("creating", dir, e))?;
    }
    std::fs::write(marker, b"").map_err(|e| HostError::io("writing", marker, e))
}

/// Whether the file at `path` holds exactly `content` (a missing or unreadable file does not).
fn same_content(path: &Path, content: &[u8]) -> bool {
    let Ok(mut f) = File::open(path) else { return false };
    if f.metadata().map(|m| m.len()).ok() != Some(content.len() as u64) {
        return false;
    }
    let mut there = Vec::with_capacity(content.len());
    f.read_to_end(&mut there).is_ok() && there == content
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_boot_is_noted_once_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("run/local-static-provisioner/boot-fenced");
        assert!(!fenced_this_boot(&marker));
        note_fenced(&marker).unwrap();
        assert!(fenced_this_boot(&marker));
    }

    #[test]
    fn the_binary_is_copied_once_replaced_when_it_changes_and_executable() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("exe");
        std::fs::write(&src, b"version one").unwrap();
        let state = dir.path().join("state");
        assert!(install_binary(&src, &state).unwrap(), "first install writes");
        let installed = installed_path(&state);
        assert_eq!(std::fs::read(&installed).unwrap(), b"version one");
        assert_eq!(std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o755);
        assert!(!install_binary(&src, &state).unwrap(), "an identical copy is left alone");
        // Same length, other bytes: replaced.
        std::fs::write(&src, b"version two").unwrap();
        assert!(install_binary(&src, &state).unwrap());
        assert_eq!(std::fs::read(&installed).unwrap(), b"version two");
        assert!(!dir.path().join("state/bin/local-static-provisioner.tmp").exists());
        // A binary that cannot be read says which.
        let err = install_binary(&dir.path().join("missing"), &state).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
