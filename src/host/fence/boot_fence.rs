//! The agent's own binary, kept on the host for the boot fence: kubelet's `ExecStartPre` runs
//! `<state dir>/bin/local-static-provisioner fence-node` (deploy/host/) before any pod of a
//! booting node is started, when no agent runs yet. The DaemonSet puts it there, as CNI plugins
//! put theirs in /opt/cni/bin, so it is always the version of the agent that runs on the node.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::core::fence::boot_fence::AgentPresence;
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

/// Where `fence-node` notes that kubelet started in this boot: under /run, which every boot
/// empties, so a later start in the same boot is told apart (core::fence::boot_fence; it fences all
/// the same).
pub(crate) const BOOT_MARKER: &str = "/run/local-static-provisioner/boot-fenced";

/// Whether `marker` says kubelet started (and was fenced) earlier in this boot.
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

/// Whether an agent holds `state_dir` now (core::fence::boot_fence::AgentPresence), told by the
/// kernel's table of file locks (/proc/locks) without taking the lock: an agent starting at
/// that instant must not find it taken. The agent's lock (host::identity::used_mark::Ledger) is an
/// exclusive flock on `<state_dir>/lock`; the table names each lock's file by device and inode.
pub(crate) fn agent_presence(state_dir: &Path, proc_locks: &Path) -> AgentPresence {
    use std::os::unix::fs::MetadataExt as _;
    let lock = state_dir.join("lock");
    let meta = match std::fs::metadata(&lock) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return AgentPresence::NeverRan,
        Err(_) => return AgentPresence::Unknown,
    };
    let Ok(table) = std::fs::read_to_string(proc_locks) else { return AgentPresence::Unknown };
    let (major, minor) = (nix::sys::stat::major(meta.dev()), nix::sys::stat::minor(meta.dev()));
    if flock_held(&table, major, minor, meta.ino()) { AgentPresence::Running } else { AgentPresence::Gone }
}

/// Whether /proc/locks (`table`) shows a granted FLOCK on the file with this device and inode.
/// A line: `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF` (device numbers in hex, the
/// inode in decimal); a waiter's has `->` after the number and holds nothing.
fn flock_held(table: &str, major: u64, minor: u64, ino: u64) -> bool {
    table.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return false;
        }
        let Some(file) = fields.get(5) else { return false };
        let mut parts = file.split(':');
        let (Some(maj), Some(min), Some(inode)) = (parts.next(), parts.next(), parts.next()) else { return false };
        u64::from_str_radix(maj, 16).ok() == Some(major)
            && u64::from_str_radix(min, 16).ok() == Some(minor)
            && inode.parse::<u64>().ok() == Some(ino)
    })
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
    fn an_agents_lock_is_seen_held_while_its_holder_lives_and_free_after() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Path::new("/proc/locks");
        assert_eq!(agent_presence(dir.path(), locks), AgentPresence::NeverRan);
        // The agent's own lock, taken as the agent takes it.
        let ledger = crate::host::identity::used_mark::Ledger::open(dir.path()).unwrap();
        assert_eq!(agent_presence(dir.path(), locks), AgentPresence::Running);
        drop(ledger);
        assert_eq!(agent_presence(dir.path(), locks), AgentPresence::Gone);
        // Another file's lock is not the agent's.
        let other = tempfile::tempdir().unwrap();
        let _other = crate::host::identity::used_mark::Ledger::open(other.path()).unwrap();
        assert_eq!(agent_presence(dir.path(), locks), AgentPresence::Gone);
        assert_eq!(agent_presence(dir.path(), &dir.path().join("no-such-table")), AgentPresence::Unknown);
    }

    #[test]
    fn the_lock_table_is_read_by_device_and_inode_and_a_waiter_holds_nothing() {
        let table = "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 99 08:02:42 0 EOF\n\
                     3: -> FLOCK  ADVISORY  WRITE 77 08:02:43 0 EOF\n";
        assert!(flock_held(table, 0xfd, 1, 5678));
        assert!(!flock_held(table, 0xfd, 1, 5679), "another inode");
        assert!(!flock_held(table, 0xfd, 2, 5678), "another device");
        assert!(!flock_held(table, 8, 2, 42), "a POSIX lock is not the agent's");
        assert!(!flock_held(table, 8, 2, 43), "a waiter holds nothing");
        assert!(!flock_held("", 0xfd, 1, 5678));
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
