//! Change notifications from the host, so discovery reacts in milliseconds instead of polling:
//! the kernel's mount-table event (POLLPRI on /proc/self/mountinfo, which works inside a
//! container with HostToContainer propagation), inotify on the discovery and config
//! directories, and inotify on the host's /dev (which devtmpfs and udev both change) for block
//! devices. They only say "something changed"; the next pass finds out what. What no event
//! shows (a failing disk's counters, a claimed device written to) is read periodically, only
//! while something is there to read (see [`WatchNeeds`]): an idle agent with nothing to watch
//! reads nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rustix::fs::inotify::WatchFlags;
use tokio::sync::Notify;
use tracing::warn;

use crate::core::mounts::inotify::Owner;
use crate::core::mounts::mount_interest::{
    DeviceInterest, IdChange, MountInterest, MountLine, device_change_matters, id_change, near_devices,
    relevant_indices, relevant_line,
};
use crate::host::HostError;
use crate::host::mounts::inotify::{Delivery, DevPath, Inotify, InotifyError, Sink};
use crate::host::mounts::mountinfo::{MOUNTINFO, MountTable};
use crate::host::ops::{Answer, Job, OnDeadline, Operations, Subject};

/// What the mount watch compares (core::mounts::mount_interest): set by the agent after each pass
/// from what it found, with the fingerprint of the relevant part of the table that pass read.
/// Until the first pass, every mount event wakes a pass.
pub(crate) struct MountWatch {
    /// The interest, and what was last seen of the table through it.
    state: Mutex<Option<Seen>>,
    /// kubelet's directory, as configured, and as the watch thread resolved it (it may wait
    /// on it; a pass does not).
    kubelet_dir: Option<PathBuf>,
    kubelet_resolved: std::sync::OnceLock<Option<PathBuf>>,
    /// Wakes the watch thread to compare the table now with a new interest.
    waker: Mutex<Option<std::io::PipeWriter>>,
}

impl MountWatch {
    /// A watch that knows nothing yet; `kubelet_dir` is where kubelet mounts pods' volumes.
    pub(crate) fn new(kubelet_dir: Option<PathBuf>) -> Self {
        MountWatch {
            state: Mutex::new(None),
            kubelet_dir,
            kubelet_resolved: Default::default(),
            waker: Mutex::new(None),
        }
    }

    /// From now on only changes to the entries `interest` finds relevant wake a pass. `table`
    /// is the table the pass read: a change between its read and this call is found by the
    /// comparison the watch thread makes at once.
    pub(crate) fn set(&self, mut interest: MountInterest, table: &MountTable) {
        interest.kubelet_dir = self.kubelet_resolved.get().cloned().flatten().or_else(|| self.kubelet_dir.clone());
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (fingerprint, near) = relevant_fingerprint(table.text(), Some(&interest));
        if state.as_ref().is_some_and(|s| s.interest == interest && s.fingerprint == fingerprint) {
            return;
        }
        tracing::trace!(paths = interest.paths.len(), devices = interest.devices.len(), "mount interest set");
        *state = Some(Seen { interest, fingerprint, near });
        drop(state);
        use std::io::Write;
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = w.write(&[1]);
        }
    }

    /// Whether `table` differs from what was last seen in what matters, noting it as seen.
    /// Every change matters until the first pass said what it depends on.
    fn differs(&self, text: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(seen) = state.as_mut() else { return true };
        let (now, near) = relevant_fingerprint(text, Some(&seen.interest));
        seen.near = near;
        std::mem::replace(&mut seen.fingerprint, now) != now
    }

    /// Whether every mount in `added` (unique IDs that came since the table was last read) is
    /// one the last pass does not depend on, by its own facts (statmount): a mount that cannot
    /// be looked at (gone already), or whose source is unknown while block devices matter, may
    /// be relevant. Nothing is irrelevant before the first pass.
    fn all_irrelevant(&self, added: &[u64]) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(seen) = state.as_ref() else { return false };
        added.iter().all(|id| {
            let Ok(f) = crate::host::mounts::listmount::mount_facts(*id) else { return false };
            let Some(source) = f.source.as_deref().or((!seen.interest.block_devices).then_some("")) else {
                return false;
            };
            let line = MountLine {
                device: &f.device,
                root: &f.root,
                mount_point: &f.mount_point,
                fs_type: &f.fs_type,
                source,
            };
            !relevant_line(&line, &seen.interest, &seen.near)
        })
    }
}

/// What the watch compares against: the interest the last pass set, the fingerprint of the
/// relevant entries of the table last read, and that table's [`near_devices`].
struct Seen {
    interest: MountInterest,
    fingerprint: u64,
    near: BTreeSet<String>,
}

/// A hash of the lines of the mount table `text` that `interest` finds relevant, each whole (its
/// mount ID too: an entry unmounted and mounted again is a change). A malformed line counts as
/// relevant. The pass's table and the watch's reads are hashed by this one function from their
/// text, so they agree byte for byte. With it, the table's [`near_devices`].
fn relevant_fingerprint(text: &str, interest: Option<&MountInterest>) -> (u64, BTreeSet<String>) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut views = Vec::new();
    for view in crate::host::mounts::mountinfo::line_views(text) {
        match view {
            Ok(view) => views.push(view),
            Err(malformed) => malformed.hash(&mut hasher),
        }
    }
    let lines: Vec<MountLine<'_>> = views
        .iter()
        .map(|v| MountLine {
            device: v.device,
            root: &v.root,
            mount_point: &v.mount_point,
            fs_type: v.fs_type,
            source: v.source,
        })
        .collect();
    for i in relevant_indices(&lines, interest) {
        views[i].line.hash(&mut hasher);
    }
    let near = interest.map(|i| near_devices(&lines, i)).unwrap_or_default();
    (hasher.finish(), near)
}

/// Starts a thread that signals `changed` on a mount or unmount in this namespace that touches
/// what the last pass read (see [`MountWatch`]): the table is read on each kernel event and only
/// its relevant entries compared, so kubelet mounting a pod's token or another program's tmpfs
/// costs one read of the table, not a pass. The thread sleeps in poll(2) otherwise.
pub(crate) fn watch_mounts(changed: Arc<Notify>, watch: Arc<MountWatch>) -> Result<(), HostError> {
    let file = File::open(MOUNTINFO).map_err(|e| HostError::io("open", MOUNTINFO, e))?;
    let (reader, writer) = std::io::pipe().map_err(|e| HostError::io("create a pipe for", MOUNTINFO, e))?;
    nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .map_err(|e| HostError::io("set non-blocking the pipe for", MOUNTINFO, std::io::Error::from(e)))?;
    *watch.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
    std::thread::Builder::new()
        .name("mount-watch".into())
        .spawn(move || {
            let mut reader = reader;
            // Resolved here, not in a pass: kubelet's directory on a filesystem that does not
            // answer holds only this thread (and every mount event then wakes a pass).
            let kubelet = watch.kubelet_dir.as_deref().and_then(|d| std::fs::canonicalize(d).ok());
            let _ = watch.kubelet_resolved.set(kubelet);
            let mut buf = Vec::with_capacity(64 * 1024);
            // The mount IDs as of the last table read or look, and the mounts that came since
            // that read and were found irrelevant (core::mounts::mount_interest::id_change).
            let (mut ids, mut listing, mut fresh) = (Vec::new(), None::<Vec<u64>>, BTreeSet::new());
            let mut said_unlisted = false;
            loop {
                let (event, woken) = {
                    let mut fds =
                        [PollFd::new(file.as_fd(), PollFlags::POLLPRI), PollFd::new(reader.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) => {
                            let ready = |fd: &PollFd, f: PollFlags| fd.revents().is_some_and(|r| r.intersects(f));
                            (ready(&fds[0], PollFlags::POLLPRI | PollFlags::POLLERR), ready(&fds[1], PollFlags::POLLIN))
                        }
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(e) => {
                            warn!(error = %e, "polling the mount table failed; relying on the periodic resync");
                            std::thread::sleep(Duration::from_secs(5));
                            continue;
                        }
                    }
                };
                if woken {
                    use std::io::Read;
                    let _ = reader.read(&mut [0u8; 64]);
                }
                if !event && !woken {
                    continue;
                }
                // First the mount IDs (listmount): mounts elsewhere that came and went are told
                // apart without the table. A new interest (woken) is compared on the table.
                let listed = match crate::host::mounts::listmount::mount_ids(&mut ids) {
                    Ok(()) => true,
                    Err(e) => {
                        if !said_unlisted {
                            said_unlisted = true;
                            tracing::info!(error = %e, "mount IDs cannot be listed here (listmount, Linux 6.8+): the mount table is read on every mount event");
                        }
                        false
                    }
                };
                if listed
                    && !woken
                    && let IdChange::LookAt(added) = id_change(listing.as_deref(), &ids, &fresh)
                    && watch.all_irrelevant(&added)
                {
                    tracing::trace!(?added, "mounts came elsewhere");
                    // Only those still mounted: on a busy node kubelet's mounts come and go
                    // elsewhere for ever, and a mount ID is never used again.
                    fresh.retain(|id| ids.binary_search(id).is_ok());
                    fresh.extend(added);
                    listing = Some(ids.clone());
                    continue;
                }
                // The listing taken before the table is read: a mount in between is in the
                // table and comes again as added, to be looked at, at the next event.
                listing = listed.then(|| ids.clone());
                fresh.clear();
                // A table that cannot be read is a change: the pass finds out. Read as
                // MountTable::read reads it (lossily as UTF-8), into the same buffer each time.
                buf.clear();
                let read = File::open(MOUNTINFO).and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut buf));
                let differs = match read {
                    Ok(_) => watch.differs(&String::from_utf8_lossy(&buf)),
                    Err(_) => true,
                };
                if differs {
                    tracing::trace!(woken, "mount table changed where it matters");
                    changed.notify_one();
                } else {
                    tracing::trace!(woken, "mount table read: nothing changed where it matters");
                }
            }
        })
        .map_err(|e| HostError::io("spawn mount watcher for", MOUNTINFO, e))?;
    Ok(())
}

/// How often the block devices are looked at by [`watch_block_devices`] when nothing signals a
/// change: a safety net, run only while a class claims devices (its `devices` section). The
/// kernel's device events (uevents) reach only the host's network namespace, but their effects
/// on the host's /dev are seen at once through inotify (see [`watch_block_devices`]); what
/// leaves no trace there (a device resized or detached without udev) is found by this.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(2);

/// After /dev's names changed, the device list is looked at again this long after.
const LOOK_AGAIN: [Duration; 3] = [Duration::from_millis(50), Duration::from_millis(250), Duration::from_secs(1)];

/// How often the watched devices' write counters are read, while any device is watched.
const WRITES_EVERY: Duration = Duration::from_secs(1);

/// How often the kernel's failing-disk counters (ext4 error counts, SCSI error counters) are
/// read, while a volume has them: an ext4 error changes no mount and no device, so nothing else
/// would wake a pass. The superblock options of every mount (a filesystem the kernel made
/// read-only or shut down) every [`SUPERBLOCKS_EVERY`], while a volume is a filesystem on a
/// disk: the mount table is large on a node with many volumes (measured with
/// bench/bulk-publish.sh 1000: read every 2 s, it took the idle agent from 0.05 to 0.23 CPU-s
/// a minute).
const HEALTH_EVERY: Duration = Duration::from_secs(2);
const SUPERBLOCKS_EVERY: Duration = Duration::from_secs(10);

/// What the block-device watch reads periodically: set by the agent after each pass from what
/// it found, so an agent with nothing to watch reads nothing and sleeps until an event.
pub(crate) struct WatchNeeds {
    /// The claimed devices of unbound PVs (kernel names): their write counters are followed.
    watched: Arc<Mutex<BTreeSet<String>>>,
    /// What is wanted, and whether any device's write counters were followed when it was set.
    state: Mutex<(Needs, bool)>,
    /// Wakes the watch thread when what it must read changed.
    waker: Mutex<Option<std::io::PipeWriter>>,
    /// Which changes of the device list wake a pass (core::mounts::mount_interest); every change until
    /// the first pass said.
    devices: Mutex<Option<DeviceInterest>>,
}

/// The periodic reads wanted, besides the watched devices' write counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    /// A class claims devices: the safety-net poll of the device list ([`SAFETY_POLL`]).
    pub claims: bool,
    /// A volume is on ext4: its error count is read ([`HEALTH_EVERY`]).
    pub ext4: bool,
    /// A volume is on a disk with a SCSI error counter ([`HEALTH_EVERY`]).
    pub io_counters: bool,
    /// A volume is a filesystem on a disk: superblock options ([`SUPERBLOCKS_EVERY`]).
    pub superblocks: bool,
}

impl WatchNeeds {
    /// Needs that want nothing yet, following the write counters of the names in `watched`.
    pub(crate) fn new(watched: Arc<Mutex<BTreeSet<String>>>) -> Self {
        WatchNeeds {
            watched,
            state: Mutex::new((Needs::default(), false)),
            waker: Mutex::new(None),
            devices: Mutex::new(None),
        }
    }

    /// Sets what is wanted from now on: the watch thread is woken to adjust its timers when
    /// that, or whether any device's write counters are followed, changed.
    pub(crate) fn set(&self, needs: Needs) {
        let writes = !self.watched.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *state != (needs, writes) {
            *state = (needs, writes);
            drop(state);
            self.wake();
        }
    }

    /// Which changes of the device list wake a pass from now on.
    pub(crate) fn set_devices(&self, interest: DeviceInterest) {
        *self.devices.lock().unwrap_or_else(|e| e.into_inner()) = Some(interest);
    }

    /// Puts `now` in `listed`; whether the change matters to a pass.
    fn list_changed(&self, listed: &mut Vec<String>, now: Vec<String>) -> bool {
        let interest = self.devices.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let matters = device_change_matters(listed, &now, interest.as_ref());
        *listed = now;
        matters
    }

    /// Wakes the watch thread.
    fn wake(&self) {
        use std::io::Write;
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = w.write(&[1]);
        }
    }

    /// What is wanted now, and the names whose write counters are followed.
    fn now(&self) -> (Needs, BTreeSet<String>) {
        let needs = self.state.lock().unwrap_or_else(|e| e.into_inner()).0;
        // A poisoned lock only means a pass panicked: the names are still names.
        (needs, self.watched.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The host's device directory and udev's stable names, watched with inotify.
const DEV: &str = "/dev";
const BY_ID: &str = "/dev/disk/by-id";

/// Starts a thread that signals `changed` when the node's block devices change: one added or
/// removed, attached (a loop device), resized, stacked on (a device-mapper or md device made
/// over it), or a /dev/disk/by-id name added or removed; and when anything is written to one
/// of the watched devices (the claimed devices of unbound PVs: a write there is someone
/// else's, and the pass that follows withdraws the PV). The device list (`/proc/partitions`
/// and the by-id names) is read when inotify on /dev says something happened there: a node
/// created or deleted (devtmpfs, udev), a device's node closed after a write (`losetup`
/// attaching a loop device writes to it) or its attributes set (udev does on every change
/// event), a by-id name made or removed; a pass follows only when the list changed. Reading a
/// device (every pass does) is no event. Periodic reads only as `needs` asks: the list as a
/// safety net ([`SAFETY_POLL`]) while a class claims devices, `/proc/diskstats` once a second
/// while any device is watched, the failing-disk counters while a volume has them. So an agent
/// with nothing to watch reads nothing while nothing happens. No device is opened.
pub(crate) fn watch_block_devices(
    changed: Arc<Notify>,
    needs: Arc<WatchNeeds>,
    inotify: Arc<Inotify>,
) -> Result<(), HostError> {
    let (reader, writer) = std::io::pipe().map_err(|e| HostError::io("create a pipe for", DEV, e))?;
    // A pass never waits on the thread: a full pipe (the thread gone) drops the wake-up.
    nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .map_err(|e| HostError::io("set non-blocking the pipe for", DEV, std::io::Error::from(e)))?;
    *needs.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
    let mut devices = DeviceWatch::new(inotify, needs.clone());
    std::thread::Builder::new()
        .name("block-device-watch".into())
        .spawn(move || {
            let mut reader = reader;
            let start = std::time::Instant::now();
            // When each periodic read is next due (kept while unwanted, so a need that returns
            // resumes on its old rhythm).
            let mut next = [start + SAFETY_POLL, start + WRITES_EVERY, start + HEALTH_EVERY, start + SUPERBLOCKS_EVERY];
            let periods = [SAFETY_POLL, WRITES_EVERY, HEALTH_EVERY, SUPERBLOCKS_EVERY];
            let (mut listed, mut written, mut counters, mut superblocks) =
                (block_devices_now(), Vec::new(), Vec::new(), 0u64);
            // When the device list is looked at again after /dev's names changed.
            let mut looks: Vec<std::time::Instant> = Vec::new();
            loop {
                let (want, names) = needs.now();
                let wanted = [want.claims, !names.is_empty(), want.ext4 || want.io_counters, want.superblocks];
                let now = std::time::Instant::now();
                let due = (0..4).filter(|i| wanted[*i]).map(|i| next[i]).chain(looks.first().copied()).min();
                let timeout = match due {
                    None => PollTimeout::NONE,
                    Some(at) => {
                        let ms = at.saturating_duration_since(now).as_millis().min(60_000) as u16;
                        PollTimeout::from(ms)
                    }
                };
                let (signalled, woken) = {
                    // The shared instance's events for this watch are queued by its reading thread
                    // (host::mounts::inotify), which wakes this one through the same pipe as a pass does.
                    let mut fds = [PollFd::new(reader.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, timeout) {
                        Ok(_) => {
                            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| r.intersects(PollFlags::POLLIN));
                            (devices.has_queued(), ready(&fds[0]))
                        }
                        Err(nix::errno::Errno::EINTR) => (false, false),
                        Err(e) => {
                            warn!(error = %e, "polling for device events failed; relying on the periodic resync");
                            std::thread::sleep(Duration::from_secs(5));
                            (false, false)
                        }
                    }
                };
                if woken {
                    use std::io::Read;
                    let _ = reader.read(&mut [0u8; 64]);
                }
                // An event on /dev is a reason to look, not a change by itself: a device written
                // through its node by another program (a `mkfs`, a `dd`) changes nothing a pass
                // would see, while one attached, added, resized or named does change the list.
                let (events, renamed) = if signalled { devices.changed() } else { (false, false) };
                let now = std::time::Instant::now();
                if renamed {
                    // A device's node appears before the device is set up (`losetup` asks the
                    // kernel for a new loop device, then attaches it): its own events may come
                    // before its node was watched, so the list is looked at again shortly.
                    looks = LOOK_AGAIN.iter().map(|after| now + *after).collect();
                }
                let look_again = looks.first().is_some_and(|at| *at <= now);
                looks.retain(|at| *at > now);
                // The device list is read at most once per wake-up, for an event or the safety net.
                let listed_now = events || look_again;
                let mut change = listed_now && needs.list_changed(&mut listed, block_devices_now());
                let now = std::time::Instant::now();
                for i in 0..4 {
                    if !wanted[i] || next[i] > now {
                        continue;
                    }
                    // The next one a whole period on, skipping what a long sleep missed.
                    next[i] = (next[i] + periods[i]).max(now);
                    let differs = match i {
                        0 => !listed_now && needs.list_changed(&mut listed, block_devices_now()),
                        1 => replace_if_differs(&mut written, crate::host::devices::writers::written_counters(&names)),
                        2 => replace_if_differs(
                            &mut counters,
                            crate::host::health::disk_health::counters_fingerprint(want.ext4, want.io_counters),
                        ),
                        _ => replace_if_differs(
                            &mut superblocks,
                            crate::host::health::disk_health::superblock_options_hash(),
                        ),
                    };
                    change |= differs;
                }
                if change {
                    tracing::trace!("block devices changed");
                    changed.notify_one();
                }
            }
        })
        .map_err(|e| HostError::io("spawn block device watcher for", DEV, e))?;
    Ok(())
}

/// Puts `now` in `last`; whether it differed.
fn replace_if_differs<T: PartialEq>(last: &mut T, now: T) -> bool {
    let differs = *last != now;
    *last = now;
    differs
}

/// What the safety-net poll compares: the kernel's list of block devices with their sizes
/// (`/proc/partitions`: one read; a loop device attached, a disk added or resized, a
/// device-mapper or md device stacked on another all change it) and the names in
/// /dev/disk/by-id.
fn block_devices_now() -> Vec<String> {
    let mut out: Vec<String> =
        std::fs::read_to_string("/proc/partitions").unwrap_or_default().lines().map(str::to_string).collect();
    if let Ok(rd) = std::fs::read_dir(BY_ID) {
        out.extend(rd.flatten().map(|e| format!("by-id {}", e.file_name().to_string_lossy())));
    }
    out.sort();
    out
}

/// inotify on /dev (names created, deleted or moved), on each block device node in it
/// (written to through it, or its attributes set) and on /dev/disk/by-id when it exists, as
/// one owner of the agent's shared instance (host::mounts::inotify), whose reading thread queues this
/// watch's events and wakes its thread. /dev's other nodes (`null`, ttys) are written all the
/// time and never watched one by one. Adds here resolve paths on devtmpfs only ([`DevPath`]):
/// they never wait on a filesystem that does not answer, so they run on this thread.
struct DeviceWatch {
    inotify: Arc<Inotify>,
    owner: Owner,
    /// What the reading thread delivered, not yet looked at.
    queue: Arc<Mutex<Vec<Delivery>>>,
    /// The watch on /dev (missing while there is no instance, or no watch left).
    dev: Option<i32>,
    /// The watches on /dev/disk and /dev/disk/by-id (missing without udev until it makes them).
    disk: Option<i32>,
    by_id: Option<i32>,
    /// Each block device node's watch, by name.
    nodes: std::collections::BTreeMap<String, i32>,
}

/// Deliveries queued beyond this are replaced by one overflow (the device list is read again).
const QUEUE_MAX: usize = 1024;

impl DeviceWatch {
    const NAMES: WatchFlags = WatchFlags::CREATE
        .union(WatchFlags::DELETE)
        .union(WatchFlags::MOVED_FROM)
        .union(WatchFlags::MOVED_TO)
        .union(WatchFlags::ONLYDIR);
    const NODE: WatchFlags = WatchFlags::CLOSE_WRITE.union(WatchFlags::ATTRIB).union(WatchFlags::DONT_FOLLOW);

    /// Registers with `inotify` (its deliveries wake the thread through `needs`) and watches
    /// what it can now; what it cannot is added when the instance tells it to retry.
    fn new(inotify: Arc<Inotify>, needs: Arc<WatchNeeds>) -> Self {
        let queue: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let into = queue.clone();
        let owner = inotify.register(Arc::new(move |delivery| {
            let mut queue = into.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() < QUEUE_MAX {
                queue.push(delivery);
            } else if queue.last() != Some(&Delivery::Overflow) {
                queue.push(Delivery::Overflow);
            }
            drop(queue);
            needs.wake();
        }));
        let mut watch =
            DeviceWatch { inotify, owner, queue, dev: None, disk: None, by_id: None, nodes: Default::default() };
        watch.follow_names();
        watch
    }

    /// Whether deliveries wait to be looked at.
    fn has_queued(&self) -> bool {
        !self.queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Adds a watch; notes in `short` when watches ran out.
    fn add(&self, path: &DevPath, flags: WatchFlags, short: &mut bool) -> Option<i32> {
        match self.inotify.add_dev(self.owner, path, flags) {
            Ok(wd) => Some(wd),
            Err(InotifyError::Exhausted { .. }) => {
                *short = true;
                None
            }
            Err(_) => None,
        }
    }

    /// Watches /dev, every block device node now in it (again: a node made anew under the same
    /// name is another inode; no longer the ones gone), /dev/disk and /dev/disk/by-id once they
    /// exist. Tells the instance whether watches ran out.
    fn follow_names(&mut self) {
        let mut short = false;
        if self.dev.is_none() {
            self.dev = self.add(&DevPath::dev(), Self::NAMES, &mut short);
        }
        let mut nodes = std::collections::BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(DEV) {
            for e in rd.flatten() {
                use std::os::unix::fs::FileTypeExt;
                if !e.file_type().is_ok_and(|t| t.is_block_device()) {
                    continue;
                }
                let Some(path) = DevPath::node(&e.file_name()) else { continue };
                let name = e.file_name().to_string_lossy().into_owned();
                match self.add(&path, Self::NODE, &mut short) {
                    Some(wd) => {
                        nodes.insert(name, wd);
                    }
                    // Not added again: the last round's hold, if any, is kept.
                    None => {
                        if let Some(wd) = self.nodes.remove(&name) {
                            nodes.insert(name, wd);
                        }
                    }
                }
            }
        }
        // The other holds of the last round go (each node added again above holds a new one
        // first, so a watch that stays never drops to no hold in between).
        for wd in std::mem::take(&mut self.nodes).into_values() {
            self.inotify.release(self.owner, wd, Self::NODE);
        }
        self.nodes = nodes;
        if self.disk.is_none() {
            self.disk = self.add(&DevPath::disk(), Self::NAMES, &mut short);
        }
        if self.by_id.is_none() {
            self.by_id = self.add(&DevPath::by_id(), Self::NAMES, &mut short);
        }
        self.inotify.set_short(self.owner, short);
    }

    /// Looks at the queued deliveries: whether any was a change (a watch the kernel dropped,
    /// the node of a device that went, is not one), and whether /dev's names changed (then
    /// they are followed anew).
    fn changed(&mut self) -> (bool, bool) {
        let queued = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let (mut change, mut names) = (false, false);
        for delivery in queued {
            match delivery {
                Delivery::Dropped { wd } => {
                    // A watched directory went (/dev/disk/by-id removed), or a node: watched
                    // again when it returns.
                    for slot in [&mut self.dev, &mut self.disk, &mut self.by_id] {
                        if *slot == Some(wd) {
                            *slot = None;
                        }
                    }
                    self.nodes.retain(|_, w| *w != wd);
                    names |= self.dev.is_none();
                }
                Delivery::Event { wd, .. } => {
                    names |= Some(wd) == self.dev || Some(wd) == self.disk;
                    change = true;
                }
                // Events lost, or watches that could not be added are to be tried again (the
                // instance made at last, watches freed): what they would have shown is read.
                Delivery::Overflow | Delivery::Retry => {
                    names = true;
                    change = true;
                }
            }
        }
        if names {
            self.follow_names();
        }
        (change, names)
    }
}

/// inotify watches on a set of directories (non-recursive), adjusted when the config changes,
/// as one owner of the agent's shared instance (host::mounts::inotify), whose reading thread signals
/// `changed` for this watcher's events. Adding a watch resolves the directory's path, which
/// blocks for as long as the filesystem there does not answer (a FUSE daemon stopped, a hung
/// NFS export): each add runs on the executor (host::ops) under the directory's subject and
/// deadline, so a pass never waits on one longer than the grace, and a directory that does not
/// answer is reported and tried again once it answers.
pub(crate) struct DirWatcher {
    inotify: Arc<Inotify>,
    owner: Owner,
    /// The directories watched, with their watch descriptors (one hold each).
    watched: BTreeMap<PathBuf, i32>,
    /// Watches added by adds the caller went on without (pending, or a background retry of a
    /// directory that stopped answering), by directory: taken up by the next call.
    late: Arc<Mutex<BTreeMap<PathBuf, i32>>>,
    /// Watch descriptors the kernel dropped (the directory removed, its filesystem unmounted):
    /// their directories are watched again by the next call.
    dropped: Arc<Mutex<BTreeSet<i32>>>,
    ops: Operations,
    timeout: Duration,
}

/// Why a directory is not watched (yet): it is tried again by the next call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WatchProblem {
    /// The add failed (a missing directory, no inotify instance, for example).
    #[error("cannot watch {dir}: {why}")]
    Failed { dir: PathBuf, why: String },
    /// No inotify watch was left (fs.inotify.max_user_watches).
    #[error("cannot watch {dir}: inotify watches exhausted (fs.inotify.max_user_watches)")]
    Exhausted { dir: PathBuf },
    /// The add is still running within its deadline (a slow filesystem).
    #[error("watching {dir} is still being set up (its filesystem answers slowly)")]
    Pending { dir: PathBuf },
    /// The directory does not answer (host::ops).
    #[error("cannot watch {dir}: {why}")]
    Unresponsive { dir: PathBuf, why: String },
}

/// What a watched directory's events must be to count as a change: names made, removed or
/// moved, files written or their attributes set, and the directory itself going. Opening and
/// reading (which every pass does) are not asked for, or every pass would trigger the next.
const DIR_EVENTS: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

impl DirWatcher {
    /// A watcher on `inotify` that signals `changed` on any event in a watched directory (and
    /// when its watches are to be tried again); its adds run on `ops` with `timeout` as their
    /// deadline.
    pub(crate) fn new(inotify: Arc<Inotify>, changed: Arc<Notify>, ops: Operations, timeout: Duration) -> Self {
        let dropped: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
        let gone = dropped.clone();
        let sink: Sink = Arc::new(move |delivery| {
            if let Delivery::Dropped { wd } = delivery {
                gone.lock().unwrap_or_else(|e| e.into_inner()).insert(wd);
            }
            tracing::trace!(?delivery, "directory changed");
            changed.notify_one();
        });
        let owner = inotify.register(sink);
        DirWatcher { inotify, owner, watched: BTreeMap::new(), late: Arc::default(), dropped, ops, timeout }
    }

    /// Watches exactly `dirs` from now on, each add as an operation on its subject (a
    /// discovery directory, the config directory). Returns the directories that are not
    /// watched (yet): missing ones, ones whose add is still running, ones that do not answer;
    /// each is tried again by the next call. Waits at most the executor's grace, whatever the
    /// directories do. Tells the instance whether watches ran out.
    pub(crate) fn watch_exactly(&mut self, dirs: &BTreeMap<PathBuf, Subject>) -> Vec<WatchProblem> {
        // Watches the kernel dropped are made again (no one holds them any more); watches that
        // adds made after their caller went on are taken up (or let go, when no longer wanted
        // or already held).
        let dropped = std::mem::take(&mut *self.dropped.lock().unwrap_or_else(|e| e.into_inner()));
        self.watched.retain(|_, wd| !dropped.contains(wd));
        let late = std::mem::take(&mut *self.late.lock().unwrap_or_else(|e| e.into_inner()));
        for (dir, wd) in late {
            if dropped.contains(&wd) {
                continue;
            }
            if dirs.contains_key(&dir) && !self.watched.contains_key(&dir) {
                self.watched.insert(dir, wd);
            } else {
                self.inotify.release(self.owner, wd, DIR_EVENTS);
            }
        }
        let gone: Vec<PathBuf> = self.watched.keys().filter(|d| !dirs.contains_key(*d)).cloned().collect();
        for dir in gone {
            if let Some(wd) = self.watched.remove(&dir) {
                // By descriptor: no path is resolved, nothing can block.
                self.inotify.release(self.owner, wd, DIR_EVENTS);
            }
        }
        let wanted: Vec<(&PathBuf, &Subject)> = dirs.iter().filter(|(d, _)| !self.watched.contains_key(*d)).collect();
        let jobs = wanted
            .iter()
            .map(|(dir, subject)| {
                let (dir, inotify, owner, late) = ((*dir).clone(), self.inotify.clone(), self.owner, self.late.clone());
                Job::new((*subject).clone(), "directory watch", self.timeout, move |on| {
                    add_dir_watch(&inotify, owner, &dir, &late, on)
                })
            })
            .collect();
        let mut problems = Vec::new();
        for ((dir, _), answer) in wanted.into_iter().zip(self.ops.run_all(jobs)) {
            let dir = dir.clone();
            match answer {
                Answer::Done(Ok(wd)) => {
                    // Taken now: the copy in `late` is for a caller that went on. (An answer the
                    // executor kept from an earlier call may name a hold let go since: then the
                    // directory is added again by the next call.)
                    let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
                    if late.get(&dir) == Some(&wd) {
                        late.remove(&dir);
                        drop(late);
                        self.watched.insert(dir, wd);
                    }
                }
                Answer::Done(Err(InotifyError::Exhausted { .. })) => problems.push(WatchProblem::Exhausted { dir }),
                Answer::Done(Err(why)) => problems.push(WatchProblem::Failed { dir, why: why.to_string() }),
                Answer::Pending => problems.push(WatchProblem::Pending { dir }),
                Answer::Unresponsive(e) => problems.push(WatchProblem::Unresponsive { dir, why: e.to_string() }),
            }
        }
        let short = problems.iter().any(|p| matches!(p, WatchProblem::Exhausted { .. }));
        self.inotify.set_short(self.owner, short);
        problems
    }

    /// The directories watched now.
    #[cfg(test)]
    fn watched(&self) -> BTreeSet<PathBuf> {
        self.watched.keys().cloned().collect()
    }
}

/// Adds the watch on `dir` (the call that blocks while its filesystem does not answer): the
/// watch descriptor, also left in `late` for a caller that went on without it.
fn add_dir_watch(
    inotify: &Inotify,
    owner: Owner,
    dir: &std::path::Path,
    late: &Mutex<BTreeMap<PathBuf, i32>>,
    on: &OnDeadline,
) -> Result<i32, InotifyError> {
    let wd = inotify.add(owner, dir, DIR_EVENTS, on)?;
    // A late add of the same directory not taken up yet is one hold too many: let go of it.
    if let Some(earlier) = late.lock().unwrap_or_else(|e| e.into_inner()).insert(dir.to_path_buf(), wd) {
        inotify.release(owner, earlier, DIR_EVENTS);
    }
    Ok(wd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Directories to watch, each its own discovery directory subject.
    fn dirs(paths: &[PathBuf]) -> BTreeMap<PathBuf, Subject> {
        paths.iter().map(|p| (p.clone(), Subject::Directory(p.display().to_string()))).collect()
    }

    #[test]
    fn a_directory_that_does_not_answer_costs_only_its_own_watch_and_is_watched_once_it_answers() {
        let tmp = tempfile::tempdir().unwrap();
        let (slow, fine) = (tmp.path().join("slow"), tmp.path().join("fine"));
        std::fs::create_dir(&slow).unwrap();
        std::fs::create_dir(&fine).unwrap();
        let ops = Operations::new();
        let timeout = Duration::from_millis(300);
        // The slow directory's subject is held by an operation that does not return (the
        // directory check of a pass, stuck in the kernel on a stopped FUSE daemon).
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = release.clone();
        let subject = Subject::Directory(slow.display().to_string());
        let stuck = ops.run(subject, "directory check", timeout, move |_| {
            while !held.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        assert!(!matches!(stuck, Answer::Done(())));
        let inotify = Inotify::start(Arc::new(Notify::new())).unwrap();
        let mut w = DirWatcher::new(inotify, Arc::new(Notify::new()), ops.clone(), timeout);
        let wanted = dirs(&[slow.clone(), fine.clone()]);
        let started = std::time::Instant::now();
        let problems = w.watch_exactly(&wanted);
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
        assert_eq!(w.watched(), BTreeSet::from([fine.clone()]), "the answering directory is watched at once");
        assert!(
            matches!(&problems[..], [WatchProblem::Pending { dir } | WatchProblem::Unresponsive { dir, .. }] if *dir == slow),
            "{problems:?}"
        );
        std::thread::sleep(timeout);
        let problems = w.watch_exactly(&wanted);
        assert!(matches!(&problems[..], [WatchProblem::Unresponsive { dir, .. }] if *dir == slow), "{problems:?}");
        // It answers again: its background retry adds the watch, and a later call takes it up.
        release.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while w.watched().len() < 2 && std::time::Instant::now() < deadline {
            let _ = w.watch_exactly(&wanted);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(w.watched(), BTreeSet::from([slow.clone(), fine.clone()]));
        // A directory no longer wanted is let go.
        assert!(w.watch_exactly(&dirs(std::slice::from_ref(&fine))).is_empty());
        assert_eq!(w.watched(), BTreeSet::from([fine]));
    }

    #[test]
    fn directory_changes_are_signalled() {
        let tmp = tempfile::tempdir().unwrap();
        let changed = Arc::new(Notify::new());
        let inotify = Inotify::start(Arc::new(Notify::new())).unwrap();
        let mut w = DirWatcher::new(inotify, changed.clone(), Operations::new(), Duration::from_secs(5));
        let errors = w.watch_exactly(&dirs(&[tmp.path().to_path_buf(), tmp.path().join("missing")]));
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
    fn a_loop_device_attached_is_signalled_with_nothing_polled() {
        if !crate::host::test_env::require_root("a_loop_device_attached_is_signalled_with_nothing_polled") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("watched.img");
        std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let changed = Arc::new(Notify::new());
        // Nothing wanted: no class claims devices, so only inotify on /dev can tell.
        let inotify = Inotify::start(Arc::new(Notify::new())).unwrap();
        watch_block_devices(changed.clone(), Arc::new(WatchNeeds::new(Arc::default())), inotify).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let out = std::process::Command::new("losetup").args(["--find", "--show"]).arg(&img).output().unwrap();
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let got = tokio::time::timeout(Duration::from_secs(5), changed.notified()).await;
            let _ = std::process::Command::new("losetup").arg("-d").arg(&dev).status();
            got.expect("block device event");
        });
    }

    #[test]
    fn a_read_of_each_part_differs_only_when_it_changed() {
        let mut last = vec!["a".to_string()];
        assert!(!replace_if_differs(&mut last, vec!["a".to_string()]));
        assert!(replace_if_differs(&mut last, vec!["b".to_string()]));
        assert_eq!(last, vec!["b".to_string()]);
        assert!(replace_if_differs(&mut last, Vec::new()), "a part no longer read differs once");
        assert!(!replace_if_differs(&mut last, Vec::new()));
    }

    #[test]
    fn mount_changes_are_signalled() {
        if !crate::host::test_env::require_root("mount_changes_are_signalled") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let changed = Arc::new(Notify::new());
        watch_mounts(changed.clone(), Arc::new(MountWatch::new(None))).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let status = std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(tmp.path()).status();
            assert!(status.unwrap().success());
            let got = tokio::time::timeout(Duration::from_secs(5), changed.notified()).await;
            let _ = std::process::Command::new("umount").arg(tmp.path()).status();
            got.expect("mount event");
        });
    }

    #[test]
    fn the_fingerprint_follows_only_relevant_lines_and_a_table_agrees_with_its_text() {
        let interest = MountInterest { paths: [PathBuf::from("/mnt/disks")].into(), ..Default::default() };
        let fp = |text: &str| relevant_fingerprint(text, Some(&interest));
        let base = "20 1 0:50 / /mnt/disks/a rw - tmpfs tmpfs rw\n21 1 0:51 / /other rw - tmpfs tmpfs rw\n";
        assert_eq!(fp(base), relevant_fingerprint(MountTable::parse(base).unwrap().text(), Some(&interest)));
        // Churn elsewhere: no change.
        assert_eq!(fp(base), fp("20 1 0:50 / /mnt/disks/a rw - tmpfs tmpfs rw\n"));
        assert_eq!(fp(base), fp(&format!("{base}30 1 0:60 / /var/lib/kubelet/pods/x rw - tmpfs tmpfs rw\n")));
        // A new entry, the same one mounted again (a new ID), an escaped name, its bind elsewhere.
        assert_ne!(fp(base), fp(&format!("{base}22 1 0:52 / /mnt/disks/b rw - tmpfs tmpfs rw\n")));
        assert_ne!(fp(base), fp(&base.replace("20 1 0:50", "23 1 0:50")));
        assert_ne!(fp(base), fp(&format!("{base}24 1 0:53 / /mnt/disks/with\\040space rw - tmpfs tmpfs rw\n")));
        assert_ne!(fp(base), fp(&format!("{base}25 1 0:50 / /var/lib/kubelet/pods/p/v rw - tmpfs tmpfs rw\n")));
        // A line that cannot be read counts.
        assert_ne!(fp(base), fp(&format!("{base}garbage\n")));
    }

    #[test]
    fn only_mounts_the_last_pass_depends_on_are_signalled() {
        if !crate::host::test_env::require_root("only_mounts_the_last_pass_depends_on_are_signalled") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let (disks, elsewhere, bind) = (base.join("disks"), base.join("elsewhere"), base.join("bind"));
        let (vol, new) = (disks.join("vol1"), disks.join("vol2"));
        for d in [&disks, &elsewhere, &bind, &vol, &new] {
            std::fs::create_dir_all(d).unwrap();
        }
        let run = |args: &[&std::ffi::OsStr]| {
            let ok = std::process::Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success());
            assert!(ok, "{args:?}");
        };
        let tmpfs_at = |at: &std::path::Path| {
            run(&["mount".as_ref(), "-t".as_ref(), "tmpfs".as_ref(), "tmpfs".as_ref(), at.as_ref()])
        };
        let umount = |at: &std::path::Path| {
            let _ = std::process::Command::new("umount").arg(at).status();
        };
        tmpfs_at(&vol);
        let changed = Arc::new(Notify::new());
        let watch = Arc::new(MountWatch::new(None));
        watch_mounts(changed.clone(), watch.clone()).unwrap();
        let interest = MountInterest { paths: BTreeSet::from([disks.clone()]), ..Default::default() };
        watch.set(interest, &MountTable::read().unwrap());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let signalled = |within_ms: u64| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(within_ms), changed.notified()).await.is_ok()
            })
        };
        let quiet_after_set = !signalled(300);
        // Another tmpfs mounted and unmounted elsewhere, three times: nothing the pass read.
        for _ in 0..3 {
            tmpfs_at(&elsewhere);
            umount(&elsewhere);
        }
        let quiet_after_churn = !signalled(500);
        // One mounted elsewhere and kept: a mount that came (looked at alone) and then, after
        // a relevant one made the table be read, goes (the table tells).
        tmpfs_at(&elsewhere);
        let quiet_while_kept = !signalled(300);
        // A bind mount of the volume elsewhere (kubelet's into a pod), its unmount, a new entry.
        run(&["mount".as_ref(), "--bind".as_ref(), vol.as_os_str(), bind.as_os_str()]);
        let bind_seen = signalled(5000);
        umount(&elsewhere);
        let quiet_after_kept_went = !signalled(300);
        umount(&bind);
        let unbind_seen = signalled(5000);
        tmpfs_at(&new);
        let entry_seen = signalled(5000);
        umount(&new);
        let entry_gone_seen = signalled(5000);
        umount(&vol);
        let volume_gone_seen = signalled(5000);
        assert!(quiet_after_set, "setting the interest alone is no change");
        assert!(quiet_after_churn, "a mount elsewhere must not wake a pass");
        assert!(quiet_while_kept && quiet_after_kept_went, "{quiet_while_kept} {quiet_after_kept_went}");
        assert!(bind_seen && unbind_seen, "a bind mount of a volume: {bind_seen} {unbind_seen}");
        assert!(entry_seen && entry_gone_seen, "an entry mounted: {entry_seen} {entry_gone_seen}");
        assert!(volume_gone_seen, "a volume unmounted");
    }
}
