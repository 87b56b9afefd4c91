//! Block wipe: erases a released block device before it is offered again, either with a
//! built-in method (signature erase, discard, zero-fill) or with an upstream-style
//! `blockCleanerCommand` run as a child process.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use nix::errno::Errno;
use tokio::io::{AsyncRead, ReadBuf};

use crate::core::devices::signatures::signature_areas;
use crate::host::devices::blockdev;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Longest stretch between two progress reports (and cancel checks of the chunked methods).
const PROGRESS_STEP: u64 = 256 * MIB;
/// Largest BLKDISCARD request: big enough to be fast, small enough to cancel and report.
const DISCARD_CHUNK: u64 = GIB;
/// Largest BLKZEROOUT request.
const ZEROOUT_CHUNK: u64 = 256 * MIB;
/// Buffer size of the pwrite fallback and of the signature erase.
const WRITE_CHUNK: usize = MIB as usize;
/// How many trailing stderr lines of a failed cleaner command go into the error.
const STDERR_TAIL: usize = 5;
/// How long to keep reading output after the cleaner exited (a background child may hold the pipe).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// Built-in ways to wipe a block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockMethod {
    /// Erase every known signature area (partition tables, filesystems, RAID, LVM) so that
    /// nothing is detected on the device; the data in between stays. Fast.
    Quick,
    /// Discard the whole device (fast on SSDs and thin devices), then erase signatures since
    /// discarded blocks need not read back as zeroes. Falls back to Zero when unsupported.
    Discard,
    /// Write zeroes over the whole device (BLKZEROOUT, else plain writes). Slow but thorough.
    Zero,
    /// Upstream's `shred.sh N` (`shred -vzf -n N`): `passes` passes of random data over the
    /// whole device, then a pass of zeroes. The slowest: (passes + 1) times the device.
    Shred {
        /// Passes of random data before the final zero pass.
        passes: u32,
    },
}

/// Passes of upstream's shred.sh when it is given no argument.
pub const DEFAULT_SHRED_PASSES: u32 = 3;

impl BlockMethod {
    /// Parses the configuration spelling ("quick", "discard", "zero", "shred" with upstream's
    /// default pass count).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "quick" => Some(BlockMethod::Quick),
            "discard" => Some(BlockMethod::Discard),
            "zero" => Some(BlockMethod::Zero),
            "shred" => Some(BlockMethod::Shred { passes: DEFAULT_SHRED_PASSES }),
            _ => None,
        }
    }

    /// The configuration spelling, for logs, events and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockMethod::Quick => "quick",
            BlockMethod::Discard => "discard",
            BlockMethod::Zero => "zero",
            BlockMethod::Shred { .. } => "shred",
        }
    }

    /// How many bytes the method writes on a device of `size` bytes, as far as progress and
    /// timeouts go: the device once, or once per pass for shred.
    pub fn work_bytes(self, size: u64) -> u64 {
        match self {
            BlockMethod::Shred { passes } => size.saturating_mul(u64::from(passes) + 1),
            _ => size,
        }
    }

    /// What the method does, for operators (warnings, logs).
    pub fn describe(self) -> String {
        match self {
            BlockMethod::Quick => "the built-in quick method (erase every signature area)".into(),
            BlockMethod::Discard => "the built-in discard method (discard every block, then erase signatures)".into(),
            BlockMethod::Zero => "the built-in zero method (write zeroes over the whole device)".into(),
            BlockMethod::Shred { passes } => {
                format!("the built-in shred method ({passes} pass(es) of random data, then zeroes)")
            }
        }
    }
}

/// What a successful wipe did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockWipeReport {
    /// Size of the device in bytes (what the wipe was about, whatever the method).
    pub bytes: u64,
    /// The method really used, e.g. Zero after a Discard fallback.
    pub method: BlockMethod,
}

/// A block wipe that failed, with the device it was about.
#[derive(Debug, thiserror::Error)]
pub enum BlockWipeError {
    /// The path (after following symlinks) is not a block device.
    #[error("{path} is not a block device")]
    NotBlockDevice { path: PathBuf },
    /// The device opened for the wipe is not the disk that was published (checked on the very
    /// descriptor the wipe writes through).
    #[error("{path}: {reason}")]
    NotTheDisk { path: PathBuf, reason: String },
    /// The check after the wipe (see [`wipe_block_checked`]) failed.
    #[error("{path}: after the wipe: {reason}")]
    Check { path: PathBuf, reason: String },
    /// The cancel flag was raised (shutdown or timeout) before the wipe finished.
    #[error("wipe of {path} cancelled after {done} of {total} bytes")]
    Cancelled { path: PathBuf, done: u64, total: u64 },
    /// A system call failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// An external cleaner failed (exit status, signal, spawn error, timeout).
    #[error("cleaner command `{command}` for {path} failed: {detail}")]
    Command { command: String, path: PathBuf, detail: String },
}

impl BlockWipeError {
    fn io(op: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        BlockWipeError::Io(crate::host::HostError::io(op, path, source))
    }
}

/// Wipes the block device at `device` (symlinks followed; must be a block device).
/// `progress(done_bytes, total_bytes)` is called at least every 256 MiB and at the end.
pub fn wipe_block(
    device: &Path,
    method: BlockMethod,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<BlockWipeReport, BlockWipeError> {
    wipe_block_verified(device, method, cancel, progress, &mut |_| Ok(()))
}

/// [`wipe_block`], calling `verify` with the exclusively opened device before anything is
/// written: the caller proves on that very descriptor that it is the published disk (a link or
/// device swapped in at the path after an earlier check is then caught).
pub fn wipe_block_verified(
    device: &Path,
    method: BlockMethod,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
    verify: &mut dyn FnMut(&File) -> Result<(), String>,
) -> Result<BlockWipeReport, BlockWipeError> {
    wipe_block_checked(device, method, cancel, progress, verify, &mut |_| Ok(()))
}

/// [`wipe_block_verified`], then `after` with the same exclusive descriptor once the wipe is
/// written and synced, before it is closed: what runs there (an operator's wipe reads back
/// what it wrote) sees the device before anyone else can claim it.
pub fn wipe_block_checked(
    device: &Path,
    method: BlockMethod,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
    verify: &mut dyn FnMut(&File) -> Result<(), String>,
    after: &mut dyn FnMut(&File) -> Result<(), String>,
) -> Result<BlockWipeReport, BlockWipeError> {
    let meta = std::fs::metadata(device).map_err(|e| BlockWipeError::io("stat", device, e))?;
    if !meta.file_type().is_block_device() {
        return Err(BlockWipeError::NotBlockDevice { path: device.to_path_buf() });
    }
    let file = open_exclusive(device)?;
    // The path may have changed between stat and open: check what was really opened.
    let opened = file.metadata().map_err(|e| BlockWipeError::io("fstat", device, e))?;
    if !opened.file_type().is_block_device() {
        return Err(BlockWipeError::NotBlockDevice { path: device.to_path_buf() });
    }
    verify(&file).map_err(|reason| BlockWipeError::NotTheDisk { path: device.to_path_buf(), reason })?;
    let mut dev = Device { file, path: device, size: 0, cancel };
    dev.size = dev.size()?;
    dev.check_cancel(0)?;

    let used = match method {
        BlockMethod::Quick => {
            dev.erase_signatures()?;
            BlockMethod::Quick
        }
        BlockMethod::Discard => {
            if dev.discard(progress)? {
                dev.erase_signatures()?;
                BlockMethod::Discard
            } else {
                tracing::info!(device = %device.display(), "device does not support discard; zeroing it instead");
                dev.zero(progress)?;
                BlockMethod::Zero
            }
        }
        BlockMethod::Zero => {
            dev.zero(progress)?;
            BlockMethod::Zero
        }
        BlockMethod::Shred { passes } => {
            shred(&dev, passes, &mut fastrand::Rng::new(), progress)?;
            method
        }
    };
    let work = used.work_bytes(dev.size);
    progress(work, work);
    after(&dev.file).map_err(|reason| BlockWipeError::Check { path: device.to_path_buf(), reason })?;
    Ok(BlockWipeReport { bytes: dev.size, method: used })
}

fn open_exclusive(device: &Path) -> Result<File, BlockWipeError> {
    // std adds O_CLOEXEC; O_EXCL without O_CREAT on a block device claims it exclusively
    // and fails with EBUSY while it is mounted, part of a RAID/LVM, or opened O_EXCL elsewhere.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_EXCL.bits())
        .open(device)
        .map_err(|e| {
            let op = if e.raw_os_error() == Some(Errno::EBUSY as i32) {
                "open exclusively (is it mounted?)"
            } else {
                "open"
            };
            BlockWipeError::io(op, device, e)
        })
}

/// An exclusively opened block device being wiped.
struct Device<'a> {
    file: File,
    path: &'a Path,
    size: u64,
    cancel: &'a AtomicBool,
}

impl Device<'_> {
    fn size(&self) -> Result<u64, BlockWipeError> {
        blockdev::device_size(&self.file).map_err(|e| BlockWipeError::io("ioctl BLKGETSIZE64", self.path, e))
    }

    fn check_cancel(&self, done: u64) -> Result<(), BlockWipeError> {
        self.check_cancel_of(done, self.size)
    }

    fn check_cancel_of(&self, done: u64, total: u64) -> Result<(), BlockWipeError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(BlockWipeError::Cancelled { path: self.path.to_path_buf(), done, total });
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), BlockWipeError> {
        self.file.sync_all().map_err(|e| BlockWipeError::io("fsync", self.path, e))
    }

    /// Zeroes every signature area, flushes, and asks the kernel to forget the partitions.
    fn erase_signatures(&self) -> Result<(), BlockWipeError> {
        let zeroes = vec![0u8; WRITE_CHUNK];
        for (offset, len) in signature_areas(self.size) {
            let mut at = offset;
            let end = offset + len;
            while at < end {
                let n = (end - at).min(WRITE_CHUNK as u64);
                // n <= WRITE_CHUNK, so it fits in usize.
                let buf = &zeroes[..n as usize];
                self.file.write_all_at(buf, at).map_err(|e| BlockWipeError::io("write zeroes to", self.path, e))?;
                at += n;
            }
        }
        self.sync()?;
        blockdev::flush_buffers(&self.file).map_err(|e| BlockWipeError::io("ioctl BLKFLSBUF", self.path, e))?;
        // Fails on unpartitionable devices (e.g. loop devices without partscan) and while
        // partitions are in use; neither matters here.
        if let Err(e) = blockdev::reread_partitions(&self.file) {
            tracing::debug!(device = %self.path.display(), error = %e, "BLKRRPART failed (ignored)");
        }
        Ok(())
    }

    /// Discards the whole device. Ok(false) when the device does not support discard at all.
    fn discard(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<bool, BlockWipeError> {
        let mut done = 0;
        while done < self.size {
            self.check_cancel(done)?;
            let len = (self.size - done).min(DISCARD_CHUNK);
            if let Err(e) = blockdev::discard(&self.file, done, len) {
                if done == 0 && unsupported(e) {
                    return Ok(false);
                }
                return Err(BlockWipeError::io("ioctl BLKDISCARD", self.path, e));
            }
            done += len;
            progress(done, self.size);
        }
        Ok(true)
    }

    /// Writes zeroes over the whole device: BLKZEROOUT, else plain writes.
    fn zero(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), BlockWipeError> {
        let mut done = 0;
        while done < self.size {
            self.check_cancel(done)?;
            let len = (self.size - done).min(ZEROOUT_CHUNK);
            if let Err(e) = blockdev::zero_out(&self.file, done, len) {
                if done == 0 && unsupported(e) {
                    tracing::info!(device = %self.path.display(), "BLKZEROOUT unsupported; writing zeroes");
                    return self.write_zeroes(progress);
                }
                return Err(BlockWipeError::io("ioctl BLKZEROOUT", self.path, e));
            }
            done += len;
            progress(done, self.size);
        }
        self.sync()
    }

    fn write_zeroes(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), BlockWipeError> {
        let zeroes = vec![0u8; WRITE_CHUNK];
        let mut done = 0;
        let mut reported = 0;
        while done < self.size {
            self.check_cancel(done)?;
            let n = (self.size - done).min(WRITE_CHUNK as u64);
            // n <= WRITE_CHUNK, so it fits in usize.
            self.file
                .write_all_at(&zeroes[..n as usize], done)
                .map_err(|e| BlockWipeError::io("write zeroes to", self.path, e))?;
            done += n;
            if done - reported >= PROGRESS_STEP || done == self.size {
                progress(done, self.size);
                reported = done;
            }
        }
        self.sync()
    }
}

/// What the shred passes need from a device. The real one is the exclusively opened and
/// identity-verified [`Device`]; the unit tests use a fake that fails or is cancelled on
/// demand.
trait Overwrite {
    /// The device's size in bytes.
    fn len(&self) -> u64;
    /// Fails with [`BlockWipeError::Cancelled`] (reporting `done` of `total`) once cancelled.
    fn cancelled(&self, done: u64, total: u64) -> Result<(), BlockWipeError>;
    /// Writes `buf` at `offset`, whole.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), BlockWipeError>;
    /// Makes every write so far durable.
    fn flush(&self) -> Result<(), BlockWipeError>;
    /// Zeroes the whole device (the final pass), reporting bytes done of the device.
    fn zero_all(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), BlockWipeError>;
}

impl Overwrite for Device<'_> {
    fn len(&self) -> u64 {
        self.size
    }

    fn cancelled(&self, done: u64, total: u64) -> Result<(), BlockWipeError> {
        self.check_cancel_of(done, total)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), BlockWipeError> {
        self.file.write_all_at(buf, offset).map_err(|e| BlockWipeError::io("write random data to", self.path, e))
    }

    fn flush(&self) -> Result<(), BlockWipeError> {
        self.sync()
    }

    fn zero_all(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), BlockWipeError> {
        self.zero(progress)
    }
}

/// `passes` passes of random data over the whole device, each made durable before the next,
/// then the zero pass: what `shred -z -n passes` leaves (a device reading all zeroes). Progress
/// and cancellation count the bytes of every pass: `progress(done, size * (passes + 1))`.
fn shred(
    dev: &dyn Overwrite,
    passes: u32,
    random: &mut fastrand::Rng,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), BlockWipeError> {
    let size = dev.len();
    let total = size.saturating_mul(u64::from(passes) + 1);
    let mut buf = vec![0u8; WRITE_CHUNK];
    for pass in 0..u64::from(passes) {
        let base = pass * size;
        let mut done = 0;
        let mut reported = 0;
        while done < size {
            dev.cancelled(base + done, total)?;
            let n = (size - done).min(WRITE_CHUNK as u64);
            // n <= WRITE_CHUNK, so it fits in usize.
            let chunk = &mut buf[..n as usize];
            random.fill(chunk);
            dev.write_at(chunk, done)?;
            done += n;
            if done - reported >= PROGRESS_STEP || done == size {
                progress(base + done, total);
                reported = done;
            }
        }
        dev.flush()?;
    }
    let base = u64::from(passes) * size;
    dev.cancelled(base, total)?;
    dev.zero_all(&mut |done, _| progress(base + done, total))
}

/// Errors meaning "this device cannot do that request at all" rather than a real failure.
fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EINVAL)
}

/// Runs an upstream-style blockCleanerCommand with LOCAL_PV_BLKDEVICE=<device> in its environment,
/// logging its stdout/stderr lines with tracing::info!(pv = pv_name, ...) as they come, honouring
/// its exit status, killing it (by its own PID / kill_on_drop) when `timeout` passes.
///
/// The command runs in its own process group so that a timeout also kills what a script
/// started (e.g. `dd`, `sleep`); dropping the returned future only kills the command itself.
pub async fn run_cleaner_command(
    argv: &[String],
    device: &Path,
    pv_name: &str,
    timeout: Duration,
) -> Result<(), BlockWipeError> {
    run_cleaner_command_until(argv, device, pv_name, timeout, &AtomicBool::new(false)).await
}

/// How often a running cleaner command looks at its cancel flag.
const CANCEL_CHECK: Duration = Duration::from_millis(100);

/// As [`run_cleaner_command`], and stopped as soon as `cancel` is set (the agent's shutdown,
/// the wiper's own size-scaled timeout): its process group is killed and the command reaped,
/// so no cleaner outlives the wipe it was started for, or the agent.
pub async fn run_cleaner_command_until(
    argv: &[String],
    device: &Path,
    pv_name: &str,
    timeout: Duration,
    cancel: &AtomicBool,
) -> Result<(), BlockWipeError> {
    let command = argv.join(" ");
    let fail =
        |detail: String| BlockWipeError::Command { command: command.clone(), path: device.to_path_buf(), detail };
    let Some((program, args)) = argv.split_first() else {
        return Err(fail("empty command".to_string()));
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("LOCAL_PV_BLKDEVICE", device)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("could not start {program}: {e}")))?;
    tracing::info!(pv = pv_name, command = %command, device = %device.display(), pid = child.id(), "running block cleaner command");

    let tail = Mutex::new(VecDeque::with_capacity(STDERR_TAIL));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let outcome = tokio::time::timeout(timeout, async {
        let readers = async {
            tokio::join!(log_lines(stdout, pv_name, "stdout", None), log_lines(stderr, pv_name, "stderr", Some(&tail)))
        };
        let mut readers = std::pin::pin!(readers);
        let mut readers_done = false;
        let mut check = tokio::time::interval(CANCEL_CHECK);
        let status = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                _ = &mut readers, if !readers_done => readers_done = true,
                _ = check.tick() => if cancel.load(Ordering::Relaxed) { break None },
            }
        };
        if !readers_done && status.is_some() {
            // Both pipes normally close with the command; a leftover background child may
            // keep them open, which must not hold the wipe.
            let _ = tokio::time::timeout(OUTPUT_GRACE, &mut readers).await;
        }
        status
    })
    .await;

    let status = match outcome {
        Ok(Some(Ok(status))) => status,
        Ok(Some(Err(e))) => return Err(fail(format!("waiting for it: {e}"))),
        Ok(None) => {
            kill_group(&mut child).await;
            return Err(fail("cancelled (the agent stops, or the wipe ran out of time); killed".to_string()));
        }
        Err(_) => {
            kill_group(&mut child).await;
            return Err(fail(format!("timed out after {timeout:?}; killed")));
        }
    };
    if status.success() {
        tracing::info!(pv = pv_name, command = %command, "block cleaner command succeeded");
        return Ok(());
    }
    let how = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => format!("ended with {status}"),
    };
    let lines: Vec<String> = match tail.lock() {
        Ok(t) => t.iter().cloned().collect(),
        Err(poisoned) => poisoned.into_inner().iter().cloned().collect(),
    };
    let detail = if lines.is_empty() { how } else { format!("{how}; stderr: {}", lines.join(" | ")) };
    Err(fail(detail))
}

/// Kills the process group of a cleaner command (its own PID, which leads the group it was
/// started in) and reaps the command.
async fn kill_group(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // The child is not reaped yet, so its PID (and group id) cannot have been reused.
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Logs every line read from `reader` until end of file, keeping the last lines in `tail`.
async fn log_lines<R: AsyncRead + Unpin>(
    reader: Option<R>,
    pv_name: &str,
    stream: &'static str,
    tail: Option<&Mutex<VecDeque<String>>>,
) {
    const MAX_LINE: usize = 64 * 1024;
    let Some(mut reader) = reader else { return };
    let mut buf = vec![0u8; 8192];
    let mut pending: Vec<u8> = Vec::new();
    let emit = |bytes: &[u8]| {
        let line = String::from_utf8_lossy(bytes);
        let line = line.trim_end_matches(['\n', '\r']);
        tracing::info!(pv = pv_name, stream, "{line}");
        if let Some(tail) = tail {
            let mut t = match tail.lock() {
                Ok(t) => t,
                Err(poisoned) => poisoned.into_inner(),
            };
            if t.len() == STDERR_TAIL {
                t.pop_front();
            }
            t.push_back(line.to_string());
        }
    };
    loop {
        let n = match read_some(&mut reader, &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(pos) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            emit(&line);
        }
        if pending.len() > MAX_LINE {
            emit(&pending);
            pending.clear();
        }
    }
    if !pending.is_empty() {
        emit(&pending);
    }
}

/// One read from an async reader (tokio's io-util extension traits are not enabled here).
async fn read_some<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut *reader).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Upstream's shipped scripts mapped to the built-in method doing the same, used when the
/// configured script does not exist in our image: `/scripts/quick_reset.sh` -> Quick,
/// `/scripts/blkdiscard.sh` -> Discard, `/scripts/dd_zero.sh` -> Zero, `/scripts/shred.sh [N]`
/// -> Shred with N passes (3 without N, as the script). None when `argv` is not one of them;
/// an error when it is but its argument cannot be honoured (the script would have refused it,
/// or, for `-h`, printed its usage and wiped nothing).
pub fn builtin_for_upstream_command(argv: &[String]) -> Option<Result<BlockMethod, String>> {
    let (program, args) = argv.split_first()?;
    Some(Ok(match program.as_str() {
        "/scripts/quick_reset.sh" => BlockMethod::Quick,
        "/scripts/blkdiscard.sh" => BlockMethod::Discard,
        "/scripts/dd_zero.sh" => BlockMethod::Zero,
        "/scripts/shred.sh" => match args.first().map(String::as_str) {
            None => BlockMethod::Shred { passes: DEFAULT_SHRED_PASSES },
            Some(n) => match shred_passes(n) {
                Some(passes) => BlockMethod::Shred { passes },
                None => {
                    return Some(Err(format!(
                        "its argument {n:?} is not a pass count (upstream's script accepts only digits: `shred.sh [N]`)"
                    )));
                }
            },
        },
        _ => return None,
    }))
}

/// The block cleaner warnings of `cfg` as seen from this container: which programs exist
/// here, and which of upstream's scripts have a built-in equivalent (see
/// [`crate::config::cleaner_warnings`]).
pub fn cleaner_warnings_here(cfg: &crate::config::ProvisionerConfig) -> Vec<String> {
    crate::config::cleaner_warnings(cfg, &|program| Path::new(program).exists(), &|argv| {
        builtin_for_upstream_command(argv).map(|r| r.map(BlockMethod::describe))
    })
}

/// shred.sh's check of its argument (`^[0-9]+$`), as a pass count.
fn shred_passes(arg: &str) -> Option<u32> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    arg.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn upstream_scripts_map_to_builtins() {
        let map = |words: &[&str]| builtin_for_upstream_command(&argv(words));
        assert_eq!(map(&["/scripts/quick_reset.sh"]), Some(Ok(BlockMethod::Quick)));
        assert_eq!(map(&["/scripts/blkdiscard.sh"]), Some(Ok(BlockMethod::Discard)));
        assert_eq!(map(&["/scripts/dd_zero.sh"]), Some(Ok(BlockMethod::Zero)));
        // shred.sh: the pass count from its argument, 3 without one, extra arguments ignored
        // (as the script does).
        assert_eq!(map(&["/scripts/shred.sh", "2"]), Some(Ok(BlockMethod::Shred { passes: 2 })));
        assert_eq!(map(&["/scripts/shred.sh"]), Some(Ok(BlockMethod::Shred { passes: 3 })));
        assert_eq!(map(&["/scripts/shred.sh", "0"]), Some(Ok(BlockMethod::Shred { passes: 0 })));
        assert_eq!(map(&["/scripts/shred.sh", "007"]), Some(Ok(BlockMethod::Shred { passes: 7 })));
        assert_eq!(map(&["/scripts/shred.sh", "1", "extra"]), Some(Ok(BlockMethod::Shred { passes: 1 })));
        // Arguments the script refuses (or, for -h, answers without wiping) are errors.
        for bad in ["-h", "two", "-1", "+2", "1.5", "", " 2", "99999999999"] {
            let got = map(&["/scripts/shred.sh", bad]);
            assert!(matches!(&got, Some(Err(e)) if e.contains("not a pass count")), "{bad:?}: {got:?}");
        }
        assert_eq!(map(&["/usr/local/bin/my-wipe"]), None);
        assert_eq!(map(&["quick_reset.sh"]), None);
        assert_eq!(map(&["/scripts/shred.sh2"]), None);
        assert_eq!(map(&[]), None);
    }

    #[test]
    fn method_names_round_trip() {
        for m in [BlockMethod::Quick, BlockMethod::Discard, BlockMethod::Zero] {
            assert_eq!(BlockMethod::parse(m.as_str()), Some(m));
            assert_eq!(serde_json::to_string(&m).unwrap(), format!("\"{}\"", m.as_str()));
        }
        assert_eq!(BlockMethod::parse("shred"), Some(BlockMethod::Shred { passes: DEFAULT_SHRED_PASSES }));
        assert_eq!(BlockMethod::Shred { passes: 2 }.as_str(), "shred");
        assert_eq!(BlockMethod::parse("Quick"), None);
    }

    #[test]
    fn shred_work_counts_every_pass() {
        assert_eq!(BlockMethod::Shred { passes: 2 }.work_bytes(10), 30);
        assert_eq!(BlockMethod::Shred { passes: 0 }.work_bytes(10), 10);
        assert_eq!(BlockMethod::Zero.work_bytes(10), 10);
        assert_eq!(BlockMethod::Shred { passes: u32::MAX }.work_bytes(u64::MAX), u64::MAX);
        assert!(BlockMethod::Shred { passes: 2 }.describe().contains("2 pass(es) of random data, then zeroes"));
    }

    /// A device in memory: records every write, fails the n-th write or flush, and raises
    /// the cancel flag after a number of writes.
    struct FakeDevice {
        data: std::cell::RefCell<Vec<u8>>,
        writes: std::cell::Cell<usize>,
        flushes: std::cell::Cell<usize>,
        fail_write: Option<usize>,
        fail_flush: Option<usize>,
        fail_zero: bool,
        cancel_after_writes: Option<usize>,
    }

    impl FakeDevice {
        fn new(size: usize) -> Self {
            FakeDevice {
                data: std::cell::RefCell::new(vec![0xA5; size]),
                writes: Default::default(),
                flushes: Default::default(),
                fail_write: None,
                fail_flush: None,
                fail_zero: false,
                cancel_after_writes: None,
            }
        }
    }

    impl Overwrite for FakeDevice {
        fn len(&self) -> u64 {
            self.data.borrow().len() as u64
        }

        fn cancelled(&self, done: u64, total: u64) -> Result<(), BlockWipeError> {
            if self.cancel_after_writes.is_some_and(|n| self.writes.get() >= n) {
                return Err(BlockWipeError::Cancelled { path: "/dev/fake".into(), done, total });
            }
            Ok(())
        }

        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), BlockWipeError> {
            self.writes.set(self.writes.get() + 1);
            if self.fail_write == Some(self.writes.get()) {
                return Err(BlockWipeError::io("write random data to", Path::new("/dev/fake"), Errno::EIO));
            }
            let at = offset as usize;
            self.data.borrow_mut()[at..at + buf.len()].copy_from_slice(buf);
            Ok(())
        }

        fn flush(&self) -> Result<(), BlockWipeError> {
            self.flushes.set(self.flushes.get() + 1);
            if self.fail_flush == Some(self.flushes.get()) {
                return Err(BlockWipeError::io("fsync", Path::new("/dev/fake"), Errno::EIO));
            }
            Ok(())
        }

        fn zero_all(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), BlockWipeError> {
            if self.fail_zero {
                return Err(BlockWipeError::io("ioctl BLKZEROOUT", Path::new("/dev/fake"), Errno::EIO));
            }
            let size = self.len();
            self.data.borrow_mut().fill(0);
            progress(size, size);
            Ok(())
        }
    }

    fn run_shred(dev: &FakeDevice, passes: u32) -> (Result<(), BlockWipeError>, Vec<(u64, u64)>) {
        let mut calls = Vec::new();
        let mut random = fastrand::Rng::with_seed(1234);
        let result = shred(dev, passes, &mut random, &mut |d, t| calls.push((d, t)));
        (result, calls)
    }

    #[test]
    fn shred_overwrites_every_byte_each_pass_then_zeroes() {
        // 2.5 chunks: the last write of each pass is a partial one.
        let size = WRITE_CHUNK * 5 / 2;
        let dev = FakeDevice::new(size);
        let (result, calls) = run_shred(&dev, 2);
        result.unwrap();
        assert!(dev.data.borrow().iter().all(|&b| b == 0), "the final pass leaves zeroes");
        assert_eq!(dev.writes.get(), 2 * 3, "three writes per random pass");
        assert_eq!(dev.flushes.get(), 2, "each random pass is made durable");
        let total = 3 * size as u64;
        assert_eq!(calls.last(), Some(&(total, total)));
        assert!(calls.iter().all(|&(_, t)| t == total), "{calls:?}");
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "progress never goes back: {calls:?}");
        // The end of each random pass is reported.
        assert!(calls.contains(&(size as u64, total)) && calls.contains(&(2 * size as u64, total)), "{calls:?}");
    }

    #[test]
    fn shred_random_pass_leaves_no_old_data_and_does_not_repeat() {
        let size = WRITE_CHUNK * 2;
        let mut dev = FakeDevice::new(size);
        // No zero pass here: look at what the random pass wrote.
        dev.fail_zero = true;
        let (result, _) = run_shred(&dev, 1);
        assert!(result.is_err());
        let data = dev.data.borrow();
        let old = data.iter().filter(|&&b| b == 0xA5).count();
        // Random bytes equal the old pattern about once in 256.
        assert!(old < size / 128, "{old} bytes still hold the old pattern");
        assert_ne!(data[..WRITE_CHUNK], data[WRITE_CHUNK..], "each chunk gets fresh data");
    }

    #[test]
    fn shred_with_no_random_pass_only_zeroes() {
        let dev = FakeDevice::new(1000);
        let (result, calls) = run_shred(&dev, 0);
        result.unwrap();
        assert_eq!(dev.writes.get(), 0);
        assert!(dev.data.borrow().iter().all(|&b| b == 0));
        assert_eq!(calls, [(1000, 1000)]);
    }

    #[test]
    fn shred_stops_at_the_first_failed_write_or_flush() {
        let size = WRITE_CHUNK * 3;
        let mut dev = FakeDevice::new(size);
        dev.fail_write = Some(5);
        let (result, _) = run_shred(&dev, 2);
        let e = result.unwrap_err();
        assert!(e.to_string().contains("write random data to /dev/fake"), "{e}");
        assert_eq!(dev.writes.get(), 5, "nothing is written after the failure");
        assert!(dev.data.borrow().iter().any(|&b| b != 0), "no zero pass after a failure");

        let mut dev = FakeDevice::new(size);
        dev.fail_flush = Some(1);
        let (result, _) = run_shred(&dev, 2);
        assert!(result.unwrap_err().to_string().contains("fsync"));
        assert_eq!(dev.writes.get(), 3, "the second pass does not start");

        let mut dev = FakeDevice::new(size);
        dev.fail_zero = true;
        let (result, _) = run_shred(&dev, 1);
        assert!(result.unwrap_err().to_string().contains("BLKZEROOUT"));
    }

    #[test]
    fn shred_cancel_is_seen_between_chunks_and_reports_work_done() {
        let size = WRITE_CHUNK * 4;
        let mut dev = FakeDevice::new(size);
        dev.cancel_after_writes = Some(6);
        let (result, _) = run_shred(&dev, 3);
        match result {
            Err(BlockWipeError::Cancelled { done, total, .. }) => {
                assert_eq!(done, 6 * WRITE_CHUNK as u64, "the second pass was half done");
                assert_eq!(total, 4 * size as u64);
            }
            other => panic!("expected Cancelled, got {other:?}"),
        }
        assert_eq!(dev.writes.get(), 6);
        // Cancelled before anything: nothing written.
        let mut dev = FakeDevice::new(size);
        dev.cancel_after_writes = Some(0);
        assert!(matches!(run_shred(&dev, 1).0, Err(BlockWipeError::Cancelled { done: 0, .. })));
        assert_eq!(dev.writes.get(), 0);
        // Cancelled after the random passes: the zero pass does not start.
        let mut dev = FakeDevice::new(size);
        dev.cancel_after_writes = Some(4);
        assert!(matches!(run_shred(&dev, 1).0, Err(BlockWipeError::Cancelled { .. })));
        assert!(dev.data.borrow().iter().any(|&b| b != 0));
    }

    #[test]
    fn cleaner_future_is_send() {
        fn assert_send<T: Send>(_: T) {}
        let argv = vec!["true".to_string()];
        assert_send(run_cleaner_command(&argv, Path::new("/dev/null"), "pv", Duration::from_secs(1)));
    }

    #[test]
    fn errors_name_the_path() {
        let e = BlockWipeError::io("open exclusively (is it mounted?)", Path::new("/dev/loop9"), Errno::EBUSY);
        assert!(e.to_string().contains("/dev/loop9"), "{e}");
        assert!(e.to_string().contains("mounted"), "{e}");
        let e = BlockWipeError::Cancelled { path: "/dev/sdz".into(), done: 1, total: 2 };
        assert!(e.to_string().contains("/dev/sdz"), "{e}");
    }
}
