//! The agent's one inotify instance, shared by every watcher (the directory watcher and the
//! block-device watch, host::mounts::watch): inotify instances are few per user on a host
//! (fs.inotify.max_user_instances, 128 by default), and many agents on one host each making
//! several ran out. The instance hands out watches and one thread reads its events and routes
//! each to the owners that asked for it (core::mounts::inotify counts the holds on each descriptor).
//! When the instance cannot be made (instances exhausted) or a watch cannot be added (watches
//! exhausted), the watchers rely on the periodic resync, the shortage is said (the agent tells
//! it on its Node and in a metric), and the instance or the watches are tried again with a
//! growing delay, so raising the sysctl heals it without a restart.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::core::mounts::inotify::{ALL_EVENTS, Added, Owner, Shortage, WatchTable, Wd};
use crate::core::reconcile::backoff::Backoff;
use crate::host::ops::OnDeadline;

/// The first delay before the instance or a watch is tried again after it ran out, and the
/// longest: a raised sysctl is taken up within the longest.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The pause after a failed poll before polling again (the core's backoff, capped at its first
/// delay): the periodic resync finds the changes meanwhile.
const POLL_RETRY: Duration = Duration::from_secs(5);

/// Why a watch was not added.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InotifyError {
    /// The instance could not be made (yet): it is tried again in the background.
    #[error("cannot watch {path}: no inotify instance (fs.inotify.max_user_instances reached?)")]
    NoInstance { path: PathBuf },
    /// fs.inotify.max_user_watches reached (ENOSPC).
    #[error("cannot watch {path}: inotify watches exhausted (raise fs.inotify.max_user_watches)")]
    Exhausted { path: PathBuf },
    /// The kernel dropped the watch while it was being added (the path went).
    #[error("cannot watch {path}: it went while its watch was added")]
    Gone { path: PathBuf },
    /// Any other failure (a missing path, for example).
    #[error("cannot watch {path}: {source}")]
    Failed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The reading thread could not be started.
    #[error("spawn the inotify reader: {0}")]
    Spawn(#[source] std::io::Error),
}

/// A path on the host's devtmpfs that a watch may be added on outside the executor: /dev, a
/// name directly in it, /dev/disk, /dev/disk/by-id (only ever looked up in devtmpfs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevPath(PathBuf);

impl DevPath {
    pub(crate) fn dev() -> Self {
        DevPath(PathBuf::from("/dev"))
    }

    pub(crate) fn disk() -> Self {
        DevPath(PathBuf::from("/dev/disk"))
    }

    pub(crate) fn by_id() -> Self {
        DevPath(PathBuf::from("/dev/disk/by-id"))
    }

    /// `/dev/<name>`, for a name read from /dev (none with a slash, `.` or `..`).
    pub(crate) fn node(name: &std::ffi::OsStr) -> Option<Self> {
        use std::os::unix::ffi::OsStrExt;
        let plain = !name.is_empty() && name != "." && name != ".." && !name.as_bytes().contains(&b'/');
        plain.then(|| DevPath(Path::new("/dev").join(name)))
    }
}

/// What the reading thread tells an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// An event the owner asked for on `wd`, with the kernel's bits.
    Event { wd: Wd, mask: u32 },
    /// The kernel dropped `wd` (IN_IGNORED): the owner holds it no longer.
    Dropped { wd: Wd },
    /// The kernel's queue overflowed: events were lost.
    Overflow,
    /// Add what is missing now: the instance exists (it did not before), or the owner's adds
    /// ran out of watches and their retry is due.
    Retry,
}

/// Where an owner's deliveries go; called on the reading thread, so it only records or wakes.
pub(crate) type Sink = Arc<dyn Fn(Delivery) + Send + Sync>;

/// The shared instance (see the module's doc).
pub(crate) struct Inotify {
    /// The instance, once made.
    fd: OnceLock<OwnedFd>,
    state: Mutex<State>,
    /// Wakes a pass when the shortage changed (the agent tells it).
    changed: Arc<Notify>,
    /// Wakes the reading thread when an owner's watches ran out (its retry timer starts).
    waker: Mutex<Option<std::io::PipeWriter>>,
}

#[derive(Default)]
struct State {
    table: WatchTable,
    sinks: Vec<Sink>,
    /// The instance could not be made for lack of instances (EMFILE).
    no_instance: bool,
    /// The owners whose last adds ran out of watches (ENOSPC).
    short_watches: BTreeSet<Owner>,
}

impl Inotify {
    /// Starts the reading thread, which makes the instance (retrying while instances are
    /// exhausted) and routes its events; `changed` is woken when the shortage changes.
    pub(crate) fn start(changed: Arc<Notify>) -> Result<Arc<Self>, InotifyError> {
        let (reader, writer) = std::io::pipe().map_err(InotifyError::Spawn)?;
        nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .map_err(|e| InotifyError::Spawn(e.into()))?;
        let this = Arc::new(Inotify {
            fd: OnceLock::new(),
            state: Mutex::default(),
            changed,
            waker: Mutex::new(Some(writer)),
        });
        // Made here when it can be, so watchers made next add their watches at once.
        this.try_init();
        let thread = this.clone();
        std::thread::Builder::new()
            .name("inotify".into())
            .spawn(move || thread.run(reader))
            .map_err(InotifyError::Spawn)?;
        Ok(this)
    }

    /// A new owner: its deliveries go to `sink`.
    pub(crate) fn register(&self, sink: Sink) -> Owner {
        let mut state = self.lock();
        state.sinks.push(sink);
        state.sinks.len() - 1
    }

    /// What is short now.
    pub(crate) fn shortage(&self) -> Shortage {
        let state = self.lock();
        Shortage { instances: state.no_instance, watches: !state.short_watches.is_empty() }
    }

    /// Adds a watch on `path` for `owner`'s events `mask` (with IN_MASK_ADD: another owner's
    /// events on the same inode stay asked for). Resolves `path`, which blocks while the
    /// filesystem there does not answer: so it runs on the executor, under its deadline
    /// (`OnDeadline`, host::ops). No lock is held meanwhile.
    pub(crate) fn add(
        &self,
        owner: Owner,
        path: &Path,
        mask: WatchFlags,
        _on: &OnDeadline,
    ) -> Result<Wd, InotifyError> {
        self.add_resolving(owner, path, mask)
    }

    /// [`Self::add`] on the host's devtmpfs ([`DevPath`]), which is in memory: resolving it
    /// never waits on a disk, so it needs no deadline.
    pub(crate) fn add_dev(&self, owner: Owner, path: &DevPath, mask: WatchFlags) -> Result<Wd, InotifyError> {
        self.add_resolving(owner, &path.0, mask)
    }

    fn add_resolving(&self, owner: Owner, path: &Path, mask: WatchFlags) -> Result<Wd, InotifyError> {
        let Some(fd) = self.fd.get() else { return Err(InotifyError::NoInstance { path: path.to_path_buf() }) };
        self.lock().table.add_started();
        let result = inotify::add_watch(fd, path, mask | WatchFlags::MASK_ADD);
        let mut state = self.lock();
        let (outcome, remove) = state.table.add_finished(result.as_ref().ok().map(|wd| (*wd, owner, events(mask))));
        for wd in remove {
            // By descriptor: resolves no path, never blocks.
            let _ = inotify::remove_watch(fd, wd);
        }
        drop(state);
        match (result, outcome) {
            (Ok(wd), Some(Added::Held)) => Ok(wd),
            (Ok(_), _) => Err(InotifyError::Gone { path: path.to_path_buf() }),
            (Err(rustix::io::Errno::NOSPC), _) => Err(InotifyError::Exhausted { path: path.to_path_buf() }),
            (Err(e), _) => Err(InotifyError::Failed { path: path.to_path_buf(), source: e.into() }),
        }
    }

    /// `owner` lets go of a watch it added with `mask`; the kernel's watch goes with its last
    /// hold.
    pub(crate) fn release(&self, owner: Owner, wd: Wd, mask: WatchFlags) {
        let Some(fd) = self.fd.get() else { return };
        let mut state = self.lock();
        for wd in state.table.release(owner, wd, events(mask)) {
            let _ = inotify::remove_watch(fd, wd);
        }
    }

    /// Whether `owner`'s last round of adds ran out of watches: while any owner's did, the
    /// shortage is said and those owners are told to try again ([`Delivery::Retry`]) with a
    /// growing delay.
    pub(crate) fn set_short(&self, owner: Owner, short: bool) {
        let mut state = self.lock();
        let before = !state.short_watches.is_empty();
        let changed = if short { state.short_watches.insert(owner) } else { state.short_watches.remove(&owner) };
        let after = !state.short_watches.is_empty();
        drop(state);
        if changed {
            self.wake();
        }
        if before != after {
            if after {
                warn!("inotify watches are exhausted (fs.inotify.max_user_watches): relying on the periodic resync");
            } else {
                info!("inotify watches are available again");
            }
            self.changed.notify_one();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a sink panicked: the counts are still counts.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        use std::io::Write;
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = w.write(&[1]);
        }
    }

    /// Makes the instance if there is none; whether there is one now. A change of shortage
    /// wakes a pass; the owners are told to add their watches once it is made.
    fn try_init(&self) -> bool {
        if self.fd.get().is_some() {
            return true;
        }
        let made = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK);
        let mut state = self.lock();
        let was_short = state.no_instance;
        match made {
            Ok(fd) => {
                let _ = self.fd.set(fd);
                state.no_instance = false;
                let sinks = state.sinks.clone();
                drop(state);
                if was_short {
                    info!("an inotify instance was made: changes are seen at once again");
                    self.changed.notify_one();
                }
                for sink in sinks {
                    sink(Delivery::Retry);
                }
                true
            }
            Err(e) => {
                state.no_instance = e == rustix::io::Errno::MFILE;
                let now_short = state.no_instance;
                drop(state);
                if !was_short {
                    warn!(
                        error = %e,
                        "cannot make an inotify instance (fs.inotify.max_user_instances?): changes are found by the \
                         periodic resync; trying again"
                    );
                }
                if now_short != was_short {
                    self.changed.notify_one();
                }
                false
            }
        }
    }

    /// The reading thread: makes the instance (with a growing delay between tries), then reads
    /// and routes its events, and tells owners short of watches to try again when due.
    fn run(self: Arc<Self>, mut waker: std::io::PipeReader) {
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        while !self.try_init() {
            std::thread::sleep(backoff.next_delay(fastrand::f64()));
        }
        let Some(fd) = self.fd.get() else { return };
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        let mut retry_at: Option<Instant> = None;
        let mut poll_backoff = Backoff::new(POLL_RETRY, POLL_RETRY);
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        loop {
            let short = !self.lock().short_watches.is_empty();
            if !short {
                retry_at = None;
                backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
            } else if retry_at.is_none() {
                retry_at = Some(Instant::now() + backoff.next_delay(fastrand::f64()));
            }
            let timeout = match retry_at {
                None => PollTimeout::NONE,
                Some(at) => {
                    PollTimeout::from(at.saturating_duration_since(Instant::now()).as_millis().min(60_000) as u16)
                }
            };
            let (events, woken) = {
                let mut fds =
                    [PollFd::new(fd.as_fd(), PollFlags::POLLIN), PollFd::new(waker.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, timeout) {
                    Ok(_) => {
                        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| r.intersects(PollFlags::POLLIN));
                        (ready(&fds[0]), ready(&fds[1]))
                    }
                    Err(nix::errno::Errno::EINTR) => (false, false),
                    Err(e) => {
                        warn!(error = %e, "polling inotify failed; relying on the periodic resync");
                        std::thread::sleep(poll_backoff.next_delay(fastrand::f64()));
                        (false, false)
                    }
                }
            };
            if woken {
                use std::io::Read;
                let _ = waker.read(&mut [0u8; 64]);
            }
            if events {
                let mut reader = inotify::Reader::new(fd, &mut buf);
                let mut read = Vec::new();
                loop {
                    match reader.next() {
                        Ok(event) => read.push((event.wd(), event.events())),
                        Err(rustix::io::Errno::INTR) => {}
                        // AGAIN: every queued event read.
                        Err(_) => break,
                    }
                }
                self.route(&read);
            }
            if retry_at.is_some_and(|at| at <= Instant::now()) {
                retry_at = None;
                let state = self.lock();
                let due: Vec<Sink> = state.short_watches.iter().filter_map(|o| state.sinks.get(*o).cloned()).collect();
                drop(state);
                for sink in due {
                    sink(Delivery::Retry);
                }
            }
        }
    }

    /// Sends each event read to the owners it is for (core::mounts::inotify::WatchTable::owners_of).
    fn route(&self, read: &[(Wd, ReadFlags)]) {
        let mut state = self.lock();
        let mut out: Vec<(Sink, Delivery)> = Vec::new();
        for (wd, flags) in read {
            let to = |owners: Vec<Owner>, state: &State, delivery: Delivery, out: &mut Vec<(Sink, Delivery)>| {
                out.extend(owners.into_iter().filter_map(|o| state.sinks.get(o).map(|s| (s.clone(), delivery))));
            };
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                let all = (0..state.sinks.len()).collect();
                to(all, &state, Delivery::Overflow, &mut out);
            } else if flags.contains(ReadFlags::IGNORED) {
                let owners = state.table.dropped(*wd);
                to(owners, &state, Delivery::Dropped { wd: *wd }, &mut out);
            } else {
                let owners = state.table.owners_of(*wd, flags.bits());
                to(owners, &state, Delivery::Event { wd: *wd, mask: flags.bits() }, &mut out);
            }
        }
        drop(state);
        for (sink, delivery) in out {
            sink(delivery);
        }
    }

    /// The instance's descriptor, for tests that count the process's instances.
    #[cfg(test)]
    pub(crate) fn has_instance(&self) -> bool {
        self.fd.get().is_some()
    }
}

/// The event bits of a watch's flags (the add's own flags, IN_ONLYDIR and the like, left out).
fn events(mask: WatchFlags) -> u32 {
    mask.bits() & ALL_EVENTS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An add on the calling thread (the test's directories answer).
    fn add(inotify: &Inotify, owner: Owner, path: &Path, mask: WatchFlags) -> Result<Wd, InotifyError> {
        crate::host::ops::foreground(|on| inotify.add(owner, path, mask, on))
    }

    #[test]
    fn only_plain_names_under_dev_are_dev_paths() {
        assert_eq!(DevPath::node("loop0".as_ref()), Some(DevPath(PathBuf::from("/dev/loop0"))));
        for name in ["", ".", "..", "disk/by-id", "../etc"] {
            assert_eq!(DevPath::node(name.as_ref()), None, "{name:?}");
        }
    }

    /// Deliveries recorded by an owner.
    fn recorder() -> (Sink, Arc<Mutex<Vec<Delivery>>>) {
        let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let into = got.clone();
        (Arc::new(move |d| into.lock().unwrap().push(d)), got)
    }

    fn wait_for(got: &Mutex<Vec<Delivery>>, what: impl Fn(&Delivery) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if got.lock().unwrap().iter().any(&what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn two_owners_of_one_directory_each_get_their_events_and_one_letting_go_keeps_the_others_watch() {
        let tmp = tempfile::tempdir().unwrap();
        let inotify = Inotify::start(Arc::new(Notify::new())).unwrap();
        assert!(inotify.has_instance());
        let ((sink_a, got_a), (sink_b, got_b)) = (recorder(), recorder());
        let (a, b) = (inotify.register(sink_a), inotify.register(sink_b));
        let wd_a = add(&inotify, a, tmp.path(), WatchFlags::CREATE).unwrap();
        let wd_b = add(&inotify, b, tmp.path(), WatchFlags::DELETE).unwrap();
        assert_eq!(wd_a, wd_b, "one inode, one descriptor");
        std::fs::write(tmp.path().join("f"), b"").unwrap();
        assert!(wait_for(&got_a, |d| matches!(d, Delivery::Event { wd, .. } if *wd == wd_a)), "A asked for creates");
        std::fs::remove_file(tmp.path().join("f")).unwrap();
        assert!(wait_for(&got_b, |d| matches!(d, Delivery::Event { .. })), "B asked for deletes");
        // B's add did not replace A's mask (IN_MASK_ADD), and B never saw the create.
        assert_eq!(got_b.lock().unwrap().len(), 1, "{:?}", got_b.lock().unwrap());
        // A lets go: B's watch stays and still reports deletes; A gets nothing more.
        inotify.release(a, wd_a, WatchFlags::CREATE);
        got_a.lock().unwrap().clear();
        std::fs::write(tmp.path().join("g"), b"").unwrap();
        std::fs::remove_file(tmp.path().join("g")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got_b.lock().unwrap().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(got_b.lock().unwrap().len(), 2, "B's second delete: {:?}", got_b.lock().unwrap());
        assert!(got_a.lock().unwrap().is_empty(), "{:?}", got_a.lock().unwrap());
        // B lets go: the kernel drops the watch (IN_IGNORED is sent to no one: no holder).
        inotify.release(b, wd_b, WatchFlags::DELETE);
        std::thread::sleep(Duration::from_millis(100));
        assert!(inotify.lock().table == WatchTable::default());
    }

    #[test]
    fn a_watched_directory_removed_is_told_dropped_to_its_owners() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let inotify = Inotify::start(Arc::new(Notify::new())).unwrap();
        let (sink, got) = recorder();
        let owner = inotify.register(sink);
        let wd = add(&inotify, owner, &dir, WatchFlags::CREATE).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert!(wait_for(&got, |d| *d == Delivery::Dropped { wd }), "{:?}", got.lock().unwrap());
        assert!(matches!(add(&inotify, owner, &dir, WatchFlags::CREATE), Err(InotifyError::Failed { .. })));
    }

    #[test]
    fn an_owner_short_of_watches_is_said_and_told_to_retry_until_it_is_not() {
        let changed = Arc::new(Notify::new());
        let inotify = Inotify::start(changed.clone()).unwrap();
        let (sink, got) = recorder();
        let owner = inotify.register(sink);
        assert_eq!(inotify.shortage(), Shortage::default());
        inotify.set_short(owner, true);
        assert_eq!(inotify.shortage(), Shortage { instances: false, watches: true });
        assert!(wait_for(&got, |d| *d == Delivery::Retry), "a retry within the first delay");
        inotify.set_short(owner, false);
        assert_eq!(inotify.shortage(), Shortage::default());
    }
}
