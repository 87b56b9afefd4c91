//! Change notifications from the host, so discovery reacts in milliseconds instead of polling:
//! the kernel's mount-table event (POLLPRI on /proc/self/mountinfo, which works inside a
//! container with HostToContainer propagation) and inotify on the discovery and config
//! directories. Both only say "something changed"; the next pass finds out what.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use notify::{RecursiveMode, Watcher};
use tokio::sync::Notify;
use tracing::warn;

use super::HostError;
use super::mountinfo::MOUNTINFO;

/// Starts a thread that signals `changed` on every mount or unmount in this namespace. The
/// thread sleeps in poll(2): an idle agent uses no CPU for it.
pub fn watch_mounts(changed: Arc<Notify>) -> Result<(), HostError> {
    let file = File::open(MOUNTINFO).map_err(|e| HostError::io("open", MOUNTINFO, e))?;
    std::thread::Builder::new()
        .name("mount-watch".into())
        .spawn(move || {
            loop {
                let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLPRI)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {
                        tracing::trace!("mount table changed");
                        changed.notify_one()
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        warn!(error = %e, "polling the mount table failed; relying on the periodic resync");
                        std::thread::sleep(Duration::from_secs(5));
                    }
                }
            }
        })
        .map_err(|e| HostError::io("spawn mount watcher for", MOUNTINFO, e))?;
    Ok(())
}

/// How often the block devices are looked at by [`watch_block_devices`].
pub const BLOCK_DEVICE_POLL: Duration = Duration::from_millis(250);

/// The watched devices' write counters are read every this many polls (once a second).
const WRITES_EVERY: u64 = 4;

/// The kernel's failing-disk counters (ext4 error counts, SCSI error counters) are read every
/// this many polls (every 2 s): an ext4 error changes no mount and no device, so nothing else
/// would wake a pass. The superblock options of every mount (a filesystem the kernel made
/// read-only or shut down) every [`SUPERBLOCKS_EVERY`] polls (10 s): the mount table is large
/// on a node with many volumes (measured with bench/bulk-publish.sh 1000: read every 2 s, it
/// took the idle agent from 0.05 to 0.23 CPU-s a minute).
const HEALTH_EVERY: u64 = 8;
const SUPERBLOCKS_EVERY: u64 = 40;

/// Starts a thread that signals `changed` when the node's block devices change: one added or
/// removed, attached (a loop device), resized, stacked on (a device-mapper or md device made
/// over it), or a /dev/disk/by-id name added or removed; and when anything is written to one
/// of the devices in `watched` (the claimed devices of unbound PVs: a write there is someone
/// else's, and the pass that follows withdraws the PV). A class's `devices` section claims new
/// disks within half a second (this poll, then the settle window). Read every
/// [`BLOCK_DEVICE_POLL`]: the kernel's device events (uevents) reach only the host's network
/// namespace, and udev's links appear after them anyway. One small file read and one
/// directory listing each time, plus `/proc/diskstats` once a second while any device is watched; no device is opened.
pub fn watch_block_devices(changed: Arc<Notify>, watched: Arc<Mutex<BTreeSet<String>>>) -> Result<(), HostError> {
    std::thread::Builder::new()
        .name("block-device-watch".into())
        .spawn(move || {
            // The write counters cost the kernel a sum over every CPU per device: read once a
            // second (every WRITES_EVERY polls), which is soon enough for a PV no tenant has.
            let mut written: Vec<String> = Vec::new();
            let mut health: Vec<String> = Vec::new();
            let mut snapshot = |tick: u64| {
                let mut now = block_devices_now();
                if tick.is_multiple_of(WRITES_EVERY) {
                    // A poisoned lock only means a pass panicked: the names are still names.
                    let names = watched.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    written =
                        if names.is_empty() { Vec::new() } else { crate::host::writers::written_counters(&names) };
                }
                if tick.is_multiple_of(HEALTH_EVERY) {
                    let with_superblocks = tick.is_multiple_of(SUPERBLOCKS_EVERY);
                    let now = crate::host::disk_health::signs_fingerprint(with_superblocks);
                    // Between two superblock reads, the last one's hash stands.
                    let kept = health.iter().find(|h| h.starts_with("sb ")).cloned().filter(|_| !with_superblocks);
                    health = kept.into_iter().chain(now).collect();
                }
                now.extend(written.iter().cloned());
                now.extend(health.iter().cloned());
                now
            };
            let mut last = snapshot(0);
            for tick in 1.. {
                std::thread::sleep(BLOCK_DEVICE_POLL);
                let now = snapshot(tick);
                if now != last {
                    tracing::trace!("block devices changed");
                    changed.notify_one();
                    last = now;
                }
            }
        })
        .map_err(|e| HostError::io("spawn block device watcher for", "/sys/class/block", e))?;
    Ok(())
}

/// What [`watch_block_devices`] compares: the kernel's list of block devices with their sizes
/// (`/proc/partitions`: one read; a loop device attached, a disk added, a device-mapper or md
/// device stacked on another all change it) and the names in /dev/disk/by-id.
fn block_devices_now() -> Vec<String> {
    let mut out: Vec<String> =
        std::fs::read_to_string("/proc/partitions").unwrap_or_default().lines().map(str::to_string).collect();
    if let Ok(rd) = std::fs::read_dir("/dev/disk/by-id") {
        out.extend(rd.flatten().map(|e| format!("by-id {}", e.file_name().to_string_lossy())));
    }
    out.sort();
    out
}

/// inotify watches on a set of directories (non-recursive), adjusted when the config changes.
pub struct DirWatcher {
    watcher: notify::RecommendedWatcher,
    watched: BTreeSet<PathBuf>,
}

impl DirWatcher {
    /// A watcher that signals `changed` on any event in a watched directory.
    pub fn new(changed: Arc<Notify>) -> Result<Self, HostError> {
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            // Opening and reading (which every pass does) must not trigger the next pass.
            Ok(ev) if matches!(ev.kind, notify::EventKind::Access(_)) => {}
            Ok(ev) => {
                tracing::trace!(kind = ?ev.kind, paths = ?ev.paths, "directory changed");
                changed.notify_one()
            }
            Err(e) => warn!(error = %e, "directory watch error"),
        })
        .map_err(|e| HostError::io("create inotify watcher for", "discovery directories", std::io::Error::other(e)))?;
        Ok(DirWatcher { watcher, watched: BTreeSet::new() })
    }

    /// Watches exactly `dirs` from now on. Returns the directories that could not be watched
    /// (missing ones, for example); they are retried on the next call.
    pub fn watch_exactly(&mut self, dirs: &BTreeSet<PathBuf>) -> Vec<HostError> {
        let mut errors = Vec::new();
        for gone in self.watched.difference(dirs).cloned().collect::<Vec<_>>() {
            let _ = self.watcher.unwatch(&gone);
            self.watched.remove(&gone);
        }
        for dir in dirs {
            if self.watched.contains(dir) {
                continue;
            }
            match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir.clone());
                }
                Err(e) => errors.push(HostError::io("watch", dir.clone(), std::io::Error::other(e))),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_changes_are_signalled() {
        let tmp = tempfile::tempdir().unwrap();
        let changed = Arc::new(Notify::new());
        let mut w = DirWatcher::new(changed.clone()).unwrap();
        let errors = w.watch_exactly(&BTreeSet::from([tmp.path().to_path_buf(), tmp.path().join("missing")]));
        assert_eq!(errors.len(), 1, "the missing directory is reported");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            std::fs::write(tmp.path().join("existing"), b"x").unwrap();
            tokio::time::timeout(Duration::from_secs(5), changed.notified()).await.expect("inotify event");
            // Reading a directory or a file is not a change: no notification, or every pass
            // (which reads them) would trigger the next one.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let drained = tokio::time::timeout(Duration::from_millis(50), changed.notified()).await;
            let _ = drained;
            let _ = std::fs::read_dir(tmp.path()).unwrap().count();
            let _ = std::fs::read(tmp.path().join("existing")).unwrap();
            let spurious = tokio::time::timeout(Duration::from_millis(500), changed.notified()).await;
            assert!(spurious.is_err(), "reading must not count as a change");
            std::fs::create_dir(tmp.path().join("new")).unwrap();
            tokio::time::timeout(Duration::from_secs(5), changed.notified()).await.expect("inotify event");
        });
    }

    #[test]
    fn a_loop_device_attached_is_signalled() {
        if !crate::host::test_env::require_root("a_loop_device_attached_is_signalled") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("watched.img");
        std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let changed = Arc::new(Notify::new());
        watch_block_devices(changed.clone(), Arc::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // Let the watcher take its first look before the change.
            tokio::time::sleep(BLOCK_DEVICE_POLL + Duration::from_millis(200)).await;
            let out = std::process::Command::new("losetup").args(["--find", "--show"]).arg(&img).output().unwrap();
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let got = tokio::time::timeout(Duration::from_secs(5), changed.notified()).await;
            let _ = std::process::Command::new("losetup").arg("-d").arg(&dev).status();
            got.expect("block device event");
        });
    }

    #[test]
    fn mount_changes_are_signalled() {
        if !crate::host::test_env::require_root("mount_changes_are_signalled") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let changed = Arc::new(Notify::new());
        watch_mounts(changed.clone()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let status = std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(tmp.path()).status();
            assert!(status.unwrap().success());
            let got = tokio::time::timeout(Duration::from_secs(5), changed.notified()).await;
            let _ = std::process::Command::new("umount").arg(tmp.path()).status();
            got.expect("mount event");
        });
    }
}
