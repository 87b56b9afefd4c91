//! The full read of `verify: full`: before the first claim of a disk, every byte of it is read
//! and must be zero. Samples (core::devices::surface) bound the time of a probe but only give a
//! probability of seeing a small extent of data; this is the proof, paid once per disk.
//!
//! - One read at a time per node, in a background thread the [`Verifier`] owns: a pass never
//!   waits for it; it asks, and sees the state (queued, N% done, blank, data at an offset).
//! - Read-only and not `O_EXCL`, so the host is never blocked from its own device meanwhile;
//!   the device's write counters (`/sys/class/block/<name>/stat`) are read before and after,
//!   and any write or discard in between voids the result (it is read again later).
//! - Large sequential chunks with `O_DIRECT` (no page cache churn), one reused buffer.
//! - Each finished read is kept in `verified.json` in the state directory (stable id, size,
//!   result, when, and for a blank result the boot ID and the device's write counters at the
//!   end of the read), written like `claims.json` (new file, fsync, rename, directory fsync),
//!   so a disk is not read whole twice while nothing changed: not after a restart of the
//!   agent, nor when claimed again after a release. A blank proof holds only while the node
//!   runs the same boot and the counters have not moved (core::devices::surface::proof_holds); a record
//!   of an earlier version has neither and is void. A record of data whose offset later reads
//!   zero (the operator cleared the disk) is read again (core::devices::surface::recorded).
//! - A read that failed or was voided is tried again after a delay that doubles from a minute
//!   up to [`RETRY_POLICY`]'s cap, with jitter (core::reconcile::backoff, kept per disk and size).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{Mode, OFlags};
use tracing::{info, warn};

use crate::core::devices::activity::{IoStat, written_between};
use crate::core::devices::surface::{
    FullRead, Now, VerifiedRecord, WriteCounters, first_non_zero, percent_step, recorded,
};
use crate::core::reconcile::backoff::{Policy, Retries};
use crate::host::devices::blockdev::{device_number, device_size};
use crate::host::devices::writers;
use crate::host::state_file;

/// The file in the state directory keeping finished full reads.
pub const VERIFIED_FILE: &str = "verified.json";

/// Bytes read at a time.
const CHUNK: usize = 4 << 20;
/// Alignment of the buffer for `O_DIRECT` (any logical block size up to 4 KiB).
const ALIGN: usize = 4096;
/// How long a failed or voided read waits before it is tried again: a minute, doubled with each
/// failure in a row up to half an hour, plus jitter.
pub(crate) const RETRY_POLICY: Policy = Policy { initial: Duration::from_secs(60), max: Duration::from_secs(30 * 60) };
/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's ID, `None` when it cannot be read.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// A full read that failed, naming the device or file.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A system call failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// The records file is not what this agent writes.
    #[error("{path} is unreadable: {message}; no full read is recorded until it is fixed or removed")]
    BadRecords { path: PathBuf, message: String },
    /// The node is not the device that was asked for (it changed under its name).
    #[error("{path} is not the device asked for: {message}")]
    NotTheDevice { path: PathBuf, message: String },
    /// The device was written to during the read: what was read proves nothing.
    #[error("{path} was written to during the full read (its write counters changed); the result is void")]
    Written { path: PathBuf },
}

fn io(op: &'static str, path: &Path, e: impl Into<std::io::Error>) -> VerifyError {
    VerifyError::Io(crate::host::HostError::io(op, path, e))
}

/// The finished full reads kept in `state_dir`.
pub fn read_records(state_dir: &Path) -> Result<Vec<VerifiedRecord>, VerifyError> {
    state_file::read_list(&state_dir.join(VERIFIED_FILE)).map_err(VerifyError::from)
}

/// Replaces the records durably: a crash leaves either list whole (host::state_file).
pub fn write_records(state_dir: &Path, records: &[VerifiedRecord]) -> Result<(), VerifyError> {
    state_file::write_list(state_dir, &state_dir.join(VERIFIED_FILE), records).map_err(VerifyError::from)
}

/// One device to read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullReadJob {
    /// Kernel name (`sdb`, `loop3`).
    pub name: String,
    /// `major:minor`: the node must still be this device.
    pub dev: String,
    /// Stable id, the key of the record.
    pub disk: String,
    /// Size in bytes: the device must still have it.
    pub size: u64,
}

/// What a full read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Every byte zero.
    Blank,
    /// The first non-zero byte.
    Data { offset: u64 },
}

/// The write counters of the device `name`.
fn write_counters(name: &str) -> Result<IoStat, VerifyError> {
    let path = PathBuf::from(format!("/sys/class/block/{name}/stat"));
    let missing = std::io::Error::new(std::io::ErrorKind::InvalidData, "missing or not a stat line");
    writers::io_stat(name).ok_or_else(|| io("reading", &path, missing))
}

/// Reads the whole of `job`'s device, sequentially, and says whether every byte is zero;
/// `done` follows the bytes read. Logs every 10% and at the end, with the rate.
pub fn read_whole(job: &FullReadJob, done: &AtomicU64) -> Result<Found, VerifyError> {
    read_whole_counted(job, done).map(|(found, _)| found)
}

/// [`read_whole`], with the device's write counters read at its end (after the check that
/// nothing was written during the read): what a blank proof is kept with.
fn read_whole_counted(job: &FullReadJob, done: &AtomicU64) -> Result<(Found, IoStat), VerifyError> {
    let node = PathBuf::from(format!("/dev/{}", job.name));
    let base = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = match rustix::fs::open(&node, base | OFlags::DIRECT, Mode::empty()) {
        Ok(fd) => fd,
        // A device or kernel without O_DIRECT: through the page cache then.
        Err(rustix::io::Errno::INVAL) => {
            rustix::fs::open(&node, base, Mode::empty()).map_err(|e| io("open read-only", &node, e))?
        }
        Err(e) => return Err(io("open read-only", &node, e)),
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| io("fstat", &node, e))?;
    let not_it = |message: String| VerifyError::NotTheDevice { path: node.clone(), message };
    if !meta.file_type().is_block_device() || device_number(meta.rdev()) != job.dev {
        return Err(not_it(format!("it is not the block device {}", job.dev)));
    }
    let size = device_size(&file).map_err(|e| io("ioctl BLKGETSIZE64", &node, e))?;
    if size != job.size {
        return Err(not_it(format!("{size} bytes, not {}", job.size)));
    }
    let before = write_counters(&job.name)?;
    let mut buf = vec![0u8; CHUNK + ALIGN];
    let skip = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
    let chunk = &mut buf[skip..skip + CHUNK];
    let started = Instant::now();
    let mut at = 0u64;
    let mut step = 0;
    let rate = |bytes: u64| bytes as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64().max(1e-6);
    while at < size {
        let want = usize::try_from(size - at).unwrap_or(CHUNK).min(CHUNK);
        let n = file.read_at(&mut chunk[..want], at).map_err(|e| io("read", &node, e))?;
        if n == 0 {
            let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("end of device at byte {at}"));
            return Err(io("read", &node, e));
        }
        if let Some(i) = first_non_zero(&chunk[..n]) {
            let offset = at + i as u64;
            info!(device = %job.name, disk = %job.disk, offset, "full read: data found");
            return Ok((Found::Data { offset }, before));
        }
        at += n as u64;
        done.store(at, Ordering::Relaxed);
        let now = percent_step(at, size);
        if now > step && now < 100 {
            step = now;
            info!(device = %job.name, percent = now, rate_mib_s = format!("{:.0}", rate(at)), "full read progress");
        }
    }
    // Someone else's reads may still be in flight; only what was written voids the read.
    let after = IoStat { in_flight: 0, ..write_counters(&job.name)? };
    if written_between(&before, &after).is_some() {
        return Err(VerifyError::Written { path: node });
    }
    info!(
        device = %job.name,
        disk = %job.disk,
        bytes = size,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        rate_mib_s = format!("{:.0}", rate(size)),
        "full read: blank"
    );
    Ok((Found::Blank, after))
}

/// What the running read has done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// Kernel name.
    pub name: String,
    /// Stable id.
    pub disk: String,
    /// Bytes read.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

/// The verifier's figures for metrics: the read under way and the reads finished since start,
/// by result (`blank`, `data`, `voided`, `failed`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullReads {
    /// The read under way.
    pub running: Option<Running>,
    /// Reads finished, by result.
    pub results: BTreeMap<&'static str, u64>,
}

/// Runs full reads one at a time in a background thread and keeps their results. Cheap to
/// clone; every clone is the same verifier.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

type Wake = Arc<dyn Fn() + Send + Sync>;

struct Inner {
    state_dir: PathBuf,
    /// Whether reads may run (the agent) or only the records are shown (the commands).
    runs: bool,
    /// This boot's ID (it cannot change while the process runs).
    boot: Option<String>,
    state: Mutex<State>,
}

struct State {
    /// The records file's content, or why it cannot be read (then nothing is read or written).
    records: Result<Vec<VerifiedRecord>, String>,
    queue: VecDeque<FullReadJob>,
    running: Option<(FullReadJob, Arc<AtomicU64>)>,
    worker: bool,
    /// Reads that failed or were voided, by disk and size: tried again when their backoff
    /// ([`RETRY_POLICY`]) has passed; dropped once a read of the disk finishes.
    failed: Retries<(String, u64)>,
    results: BTreeMap<&'static str, u64>,
    wake: Option<Wake>,
}

impl Verifier {
    /// The agent's verifier over `state_dir`: it reads devices when asked.
    pub fn new(state_dir: &Path) -> Self {
        Self::with(state_dir, true)
    }

    /// The records of `state_dir` only, never reading a device (the `disks` command).
    pub fn view(state_dir: &Path) -> Self {
        Self::with(state_dir, false)
    }

    fn with(state_dir: &Path, runs: bool) -> Self {
        let records = read_records(state_dir).map_err(|e| e.to_string());
        if let Err(e) = &records {
            warn!("{e}");
        }
        let state = State {
            records,
            queue: VecDeque::new(),
            running: None,
            worker: false,
            failed: Retries::default(),
            results: BTreeMap::new(),
            wake: None,
        };
        let inner = Inner { state_dir: state_dir.to_path_buf(), runs, boot: boot_id(), state: Mutex::new(state) };
        Verifier { inner: Arc::new(inner) }
    }

    /// `wake` is called at every 10% of a read and when it ends, so a pass runs soon.
    pub fn on_change(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.lock().wake = Some(Arc::new(wake));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where a kept record says data was found on this disk: the probe reads there too, so a
    /// disk cleared since is read again.
    pub fn data_at(&self, disk: &str, size: u64) -> Option<u64> {
        let state = self.lock();
        let records = state.records.as_ref().ok()?;
        records.iter().find(|r| r.disk == disk && r.size == size).and_then(|r| r.data_at)
    }

    /// Where the full read of this disk (kernel name `name` now) stands. `probe_blank`: the
    /// probe just read the disk's samples (and any recorded data offset) as zero. A kept blank
    /// proof counts only while this boot runs and the device's write counters stay as they
    /// were at its end; otherwise the disk is `Void` until a new read is under way.
    pub fn status(&self, disk: &str, name: &str, size: u64, probe_blank: bool) -> FullRead {
        let counters = writers::io_stat(name).map(|s| WriteCounters::from(&s));
        let now = Now { boot: self.inner.boot.as_deref(), counters };
        let state = self.lock();
        let records = match &state.records {
            Ok(r) => r,
            Err(e) => return FullRead::Failed(e.clone()),
        };
        let void = match recorded(records, disk, size, probe_blank, now) {
            Some(FullRead::Void(why)) => Some(why),
            Some(found) => return found,
            None => None,
        };
        if let Some((job, done)) = &state.running
            && job.disk == disk
            && job.size == size
        {
            return FullRead::Reading { done: done.load(Ordering::Relaxed), total: size };
        }
        if state.queue.iter().any(|j| j.disk == disk && j.size == size) {
            return FullRead::Queued;
        }
        let key = (disk.to_string(), size);
        match state.failed.get(&key) {
            // Its record stays until a read finishes, so the next failure doubles the delay.
            Some(r) if !state.failed.may_try(&key, Instant::now(), None) => FullRead::Failed(r.error.clone()),
            _ => void.map_or(FullRead::Unknown, FullRead::Void),
        }
    }

    /// Asks for a full read of `job`'s device (nothing when one is recorded and holds, under
    /// way, queued or failed and still backing off, or when this verifier only shows records).
    pub fn request(&self, job: FullReadJob) {
        let status = self.status(&job.disk, &job.name, job.size, false);
        if !self.inner.runs || !matches!(status, FullRead::Unknown | FullRead::Void(_)) {
            return;
        }
        let mut state = self.lock();
        info!(device = %job.name, disk = %job.disk, bytes = job.size, "full read queued");
        state.queue.push_back(job);
        if state.worker {
            return;
        }
        state.worker = true;
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("full-read".into()).spawn(move || me.work());
        if let Err(e) = spawned {
            state.worker = false;
            state.queue.clear();
            warn!(error = %e, "full read: no thread could be started; asked again at the next pass");
        }
    }

    /// The worker: reads the queue one device at a time until it is empty.
    fn work(&self) {
        loop {
            let (job, done) = {
                let mut state = self.lock();
                let Some(job) = state.queue.pop_front() else {
                    state.worker = false;
                    return;
                };
                let done = Arc::new(AtomicU64::new(0));
                state.running = Some((job.clone(), done.clone()));
                (job, done)
            };
            let progress = ProgressWake { verifier: self, job: &job, done: &done };
            let result = std::thread::scope(|s| {
                let reader = s.spawn(|| read_whole_counted(&job, &done));
                progress.follow(&reader);
                reader.join().unwrap_or_else(|_| Err(io("read", Path::new(&job.name), std::io::Error::other("panic"))))
            });
            self.finish(&job, result);
        }
    }

    fn finish(&self, job: &FullReadJob, result: Result<(Found, IoStat), VerifyError>) {
        let wake = {
            let mut state = self.lock();
            state.running = None;
            let key = (job.disk.clone(), job.size);
            let (data_at, counters) = match result {
                Ok((Found::Blank, after)) => (None, Some(WriteCounters::from(&after))),
                Ok((Found::Data { offset }, _)) => (Some(offset), None),
                Err(e) => {
                    let kind = if matches!(e, VerifyError::Written { .. }) { "voided" } else { "failed" };
                    let due =
                        state.failed.failed(&key, RETRY_POLICY, e.to_string(), None, Instant::now(), fastrand::f64());
                    let after = due.saturating_duration_since(Instant::now());
                    warn!(device = %job.name, disk = %job.disk, retry_in_s = after.as_secs(), "full read {kind}: {e}; tried again later");
                    *state.results.entry(kind).or_default() += 1;
                    return self.wake_with(state);
                }
            };
            state.failed.succeeded(&key);
            *state.results.entry(if data_at.is_some() { "data" } else { "blank" }).or_default() += 1;
            let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let boot = counters.and(self.inner.boot.clone());
            if let Ok(records) = &mut state.records {
                records.retain(|r| !(r.disk == job.disk && r.size == job.size));
                records.push(VerifiedRecord { disk: job.disk.clone(), size: job.size, data_at, at, boot, counters });
                if let Err(e) = write_records(&self.inner.state_dir, records) {
                    warn!("full read of {} kept in memory only: {e}", job.name);
                }
            }
            state.wake.clone()
        };
        if let Some(wake) = wake {
            wake();
        }
    }

    fn wake_with(&self, state: MutexGuard<'_, State>) {
        let wake = state.wake.clone();
        drop(state);
        if let Some(wake) = wake {
            wake();
        }
    }

    /// The read under way and the results so far.
    pub fn figures(&self) -> FullReads {
        let state = self.lock();
        let running = state.running.as_ref().map(|(job, done)| Running {
            name: job.name.clone(),
            disk: job.disk.clone(),
            done: done.load(Ordering::Relaxed),
            total: job.size,
        });
        FullReads { running, results: state.results.clone() }
    }
}

/// Wakes the agent at every 10% of a read, while it runs.
struct ProgressWake<'a> {
    verifier: &'a Verifier,
    job: &'a FullReadJob,
    done: &'a AtomicU64,
}

impl ProgressWake<'_> {
    fn follow<T>(&self, reader: &std::thread::ScopedJoinHandle<'_, T>) {
        let mut step = 0;
        while !reader.is_finished() {
            std::thread::sleep(Duration::from_millis(200));
            let now = percent_step(self.done.load(Ordering::Relaxed), self.job.size);
            if now > step && now < 100 {
                step = now;
                let wake = self.verifier.lock().wake.clone();
                if let Some(wake) = wake {
                    wake();
                }
            }
        }
    }
}

impl From<state_file::StateFileError> for VerifyError {
    fn from(e: state_file::StateFileError) -> Self {
        match e {
            state_file::StateFileError::Io(e) => VerifyError::Io(e),
            state_file::StateFileError::Unreadable { path, message } => VerifyError::BadRecords { path, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_zero_byte_is_found_in_any_block() {
        let mut bytes = vec![0u8; 3 * 4096 + 100];
        assert_eq!(first_non_zero(&bytes), None);
        bytes[2 * 4096 + 17] = 1;
        assert_eq!(first_non_zero(&bytes), Some(2 * 4096 + 17));
        bytes[3 * 4096 + 99] = 9;
        assert_eq!(first_non_zero(&bytes), Some(2 * 4096 + 17));
        assert_eq!(first_non_zero(&bytes[3 * 4096..]), Some(99));
        assert_eq!(first_non_zero(&[]), None);
    }

    #[test]
    fn records_round_trip_and_an_unreadable_file_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_records(dir.path()).unwrap(), Vec::new());
        // A blank proof of this boot.
        let counters = Some(WriteCounters { writes: 1, write_sectors: 8, discards: 0 });
        let records = vec![
            VerifiedRecord { disk: "wwid:b".into(), size: 10, data_at: Some(4), at: 2, boot: None, counters: None },
            VerifiedRecord { disk: "wwid:a".into(), size: 10, data_at: None, at: 1, boot: boot_id(), counters },
        ];
        write_records(dir.path(), &records).unwrap();
        let back = read_records(dir.path()).unwrap();
        assert_eq!(back, vec![records[1].clone(), records[0].clone()]);
        let v = Verifier::view(dir.path());
        // No device of that name: its counters cannot be read, so the blank proof is void.
        let FullRead::Void(why) = v.status("wwid:a", "no-such-dev", 10, false) else { panic!("void") };
        assert!(why.contains("write counters cannot be read"), "{why}");
        assert_eq!(v.status("wwid:b", "no-such-dev", 10, false), FullRead::Data { offset: 4 });
        assert_eq!(v.data_at("wwid:b", 10), Some(4));
        assert_eq!(v.status("wwid:b", "no-such-dev", 10, true), FullRead::Unknown);
        assert_eq!(v.status("wwid:a", "no-such-dev", 11, false), FullRead::Unknown);
        // A view never reads.
        v.request(FullReadJob { name: "loop9".into(), dev: "7:9".into(), disk: "wwid:c".into(), size: 1 });
        assert_eq!(v.status("wwid:c", "loop9", 1, false), FullRead::Unknown);

        std::fs::write(dir.path().join(VERIFIED_FILE), b"[{").unwrap();
        let v = Verifier::new(dir.path());
        let FullRead::Failed(why) = v.status("wwid:a", "loop9", 10, false) else {
            panic!("an unreadable file is a failure")
        };
        assert!(why.contains("verified.json") && why.contains("unreadable"), "{why}");
        v.request(FullReadJob { name: "loop9".into(), dev: "7:9".into(), disk: "wwid:a".into(), size: 10 });
        assert_eq!(std::fs::read(dir.path().join(VERIFIED_FILE)).unwrap(), b"[{");
    }

    /// A read that fails (no such device) is tried again after a delay that doubles from a
    /// minute, with jitter, kept per disk: core::reconcile::backoff's records, not a fixed interval.
    #[test]
    fn a_failed_read_backs_off_with_jitter_per_disk() {
        let dir = tempfile::tempdir().unwrap();
        let v = Verifier::new(dir.path());
        let job = FullReadJob { name: "lsp-no-such-dev".into(), dev: "7:250".into(), disk: "wwid:f".into(), size: 1 };
        let key = (job.disk.clone(), job.size);
        let failed = |v: &Verifier| {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                if let FullRead::Failed(why) = v.status(&job.disk, &job.name, 1, false) {
                    return why;
                }
                assert!(Instant::now() < until, "the read never failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let mut delays = Vec::new();
        for attempt in 1..=3u32 {
            v.request(job.clone());
            let why = failed(&v);
            assert!(why.contains("lsp-no-such-dev"), "{why}");
            let state = v.lock();
            let r = state.failed.get(&key).expect("a retry record");
            assert_eq!(r.failures, attempt);
            let wait = r.due.saturating_duration_since(Instant::now());
            assert!(wait <= r.delay.mul_f64(1.2) && wait + Duration::from_secs(5) >= r.delay, "{wait:?} {r:?}");
            delays.push(r.delay.as_secs());
            drop(state);
            // Asked again before its time: nothing is queued.
            v.request(job.clone());
            assert!(matches!(v.status(&job.disk, &job.name, 1, false), FullRead::Failed(_)));
            v.lock().failed.expire_for_test(Instant::now());
            assert_eq!(v.status(&job.disk, &job.name, 1, false), FullRead::Unknown, "due: asked again");
        }
        assert_eq!(delays, [60, 120, 240]);
        // Another disk has its own record.
        assert!(v.lock().failed.get(&("wwid:g".to_string(), 1)).is_none());
    }

    #[test]
    fn a_node_that_is_not_the_device_asked_for_is_refused() {
        let job = FullReadJob { name: "null".into(), dev: "1:3".into(), disk: "x".into(), size: 1 };
        let e = read_whole(&job, &AtomicU64::new(0)).unwrap_err();
        assert!(matches!(e, VerifyError::NotTheDevice { .. }) || matches!(e, VerifyError::Io(_)), "{e}");
    }
}
