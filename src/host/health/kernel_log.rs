//! Reads the kernel log (`/dev/kmsg`) for the lines that say a disk failed (issue 41): a disk
//! that fails only writes shows nowhere else. Read-only and non-blocking, from the agent's
//! start on (the reader seeks to the end first: a line from before the start is no news, as
//! the I/O error counter's first count is not), on its own thread, which sleeps in poll(2)
//! until the kernel logs something. Every record is parsed by core::health::kernel_log; a line about
//! a device is remembered there (bounded) and wakes a pass. Only the kernel's own records
//! count: a line a program writes to `/dev/kmsg` never makes a disk look failing.
//!
//! Reading `/dev/kmsg` needs CAP_SYSLOG when `kernel.dmesg_restrict` is set (the DaemonSet in
//! deploy/ is privileged, and mounts the host's /dev). Without it the reader says so once and
//! the sign `kernel-log` is never seen; every other sign still is.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::core::health::kernel_log::{KernelLogMemory, capacity_change, disk_error, parse_record};
use crate::host::HostError;

/// The kernel's log device.
pub const KMSG: &str = "/dev/kmsg";

/// A record is at most this long (the kernel's own limit is 1 KiB of text plus its prefix
/// and dictionary; a longer one fails the read with EINVAL and is skipped).
const RECORD_MAX: usize = 8 * 1024;

/// The kernel log, open for reading from its end.
pub struct KernelLog {
    file: File,
}

impl KernelLog {
    /// Opens `path` (`/dev/kmsg`) read-only and non-blocking, at its end.
    pub fn open(path: &Path) -> Result<Self, HostError> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_nonblock())
            .open(path)
            .map_err(|e| HostError::io("open", path, e))?;
        file.seek(SeekFrom::End(0)).map_err(|e| HostError::io("seek to the end of", path, e))?;
        Ok(KernelLog { file })
    }

    /// Reads every record logged since the last read, each line about a failing disk
    /// remembered in `memory` at `now`; returns how many records call for a pass (those, and
    /// a disk's size changed). Never blocks.
    pub fn drain(&mut self, memory: &Mutex<KernelLogMemory>) -> usize {
        let mut buf = vec![0u8; RECORD_MAX];
        let mut noted = 0;
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let record = parse_record(&text).filter(|r| r.kernel);
                    if let Some(device) = record.as_ref().and_then(|r| capacity_change(r.message)) {
                        debug!(device, "the kernel log says a disk changed size");
                        noted += 1;
                        continue;
                    }
                    let Some(error) = record.and_then(|r| disk_error(r.message)) else { continue };
                    debug!(device = %error.device, line = %error.what, "the kernel log says a disk failed");
                    memory.lock().unwrap_or_else(|e| e.into_inner()).note(error, Instant::now());
                    noted += 1;
                }
                // Records were overwritten before being read: the next read goes on after them.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                // A record longer than the buffer is skipped by the kernel.
                Err(e) if e.kind() == ErrorKind::InvalidInput => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    warn!(error = %e, "reading the kernel log failed");
                    break;
                }
            }
        }
        noted
    }
}

/// `O_NONBLOCK` for `OpenOptions::custom_flags`.
fn libc_nonblock() -> i32 {
    nix::fcntl::OFlag::O_NONBLOCK.bits()
}

/// Starts the thread that follows the kernel log: it sleeps in poll(2) until the kernel logs
/// something, reads it, and signals `changed` when a line said a disk failed. Fails (the
/// caller says so once, and goes on without the sign) when `/dev/kmsg` cannot be read.
pub(crate) fn watch_kernel_log(
    path: &Path,
    memory: Arc<Mutex<KernelLogMemory>>,
    changed: Arc<Notify>,
) -> Result<(), HostError> {
    let mut log = KernelLog::open(path)?;
    std::thread::Builder::new()
        .name("kernel-log-watch".into())
        .spawn(move || {
            loop {
                if log.drain(&memory) > 0 {
                    changed.notify_one();
                }
                let mut fds = [PollFd::new(log.file.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        warn!(error = %e, "polling the kernel log failed; it is read again in 5 s");
                        std::thread::sleep(std::time::Duration::from_secs(5));
                    }
                }
            }
        })
        .map_err(|e| HostError::io("spawn the kernel log reader for", path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line a program writes to /dev/kmsg (as root) is read, and not believed: only the
    /// kernel's own lines count. (A real one, from a loop device shrunk under ext4, is read in
    /// tests/host/disk_health.rs.)
    #[test]
    fn a_line_written_by_a_program_is_not_believed() {
        if !crate::host::test_env::require_root("a_line_written_by_a_program_is_not_believed") {
            return;
        }
        let device = format!("lsptest{}", std::process::id());
        let line = format!("I/O error, dev {device}, sector 8 op 0x1:(WRITE) flags 0x0 phys_seg 1 prio class 0");
        let opened = Instant::now();
        let mut log = KernelLog::open(Path::new(KMSG)).unwrap();
        let memory = Mutex::new(KernelLogMemory::default());
        log.drain(&memory);
        std::fs::write(KMSG, &line).expect("write to /dev/kmsg");
        assert_eq!(log.drain(&memory), 0);
        assert_eq!(memory.lock().unwrap().failing(&[device], opened, Instant::now()), None);
        // A drain without new lines reads nothing and does not block.
        assert_eq!(log.drain(&memory), 0);
    }

    #[test]
    fn an_unreadable_log_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        assert!(KernelLog::open(&dir.path().join("no-kmsg")).is_err());
    }
}
