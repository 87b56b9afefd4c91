//! The kernel log as a failing-disk sign (issue 41): a disk that fails only writes leaves no
//! counter the agent reads (ext4's `errors_count` stays 0 for a failed data write, the mount
//! stays read-write); only the kernel log says `I/O error, dev sdb, sector ...`. The host side
//! (host::health::kernel_log) reads `/dev/kmsg`; this side parses a record, finds the device a line
//! names, and remembers it, so every rule is unit-tested with real message formats.
//!
//! A device a line named counts as failing for [`KERNEL_LOG_HOLD`] after the latest such line
//! (a window without a new one clears it, as the I/O error counter's episode does): there is
//! no state in the kernel to look at again, and the log says nothing when the disk recovers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::core::health::disk_health::Failing;

/// How long a device stays failing after the latest kernel log line about it.
pub const KERNEL_LOG_HOLD: Duration = Duration::from_secs(10 * 60);

/// At most this many devices are remembered: the oldest line is forgotten first, so a flood
/// of messages about many devices cannot grow the agent's memory.
pub const MAX_DEVICES: usize = 1024;

/// At most this many bytes of a line are kept as the reason (the annotation stays small).
const MAX_WHAT: usize = 200;

/// One `/dev/kmsg` record: `PRI,SEQ,TIMESTAMP,FLAGS[,...];MESSAGE`, then optional
/// continuation lines (` KEY=value`), which are not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record's sequence number (a gap means records were overwritten before being read).
    pub seq: u64,
    /// Logged by the kernel (facility 0), not written to `/dev/kmsg` by a program: only the
    /// kernel's lines are believed, so no process can make a disk look failing.
    pub kernel: bool,
    /// The message text, without its prefix and its continuation lines.
    pub message: &'a str,
}

/// Parses one record as read from `/dev/kmsg` (one `read` returns one record); None when it
/// is not one.
pub fn parse_record(raw: &str) -> Option<Record<'_>> {
    let (prefix, rest) = raw.split_once(';')?;
    let mut fields = prefix.split(',');
    let priority: u32 = fields.next()?.parse().ok()?;
    let seq: u64 = fields.next()?.parse().ok()?;
    let message = rest.split('\n').next().unwrap_or_default();
    Some(Record { seq, kernel: priority >> 3 == 0, message })
}

/// A kernel log line that says a device failed: the device's kernel name (`sdb`, `sdb1`,
/// `loop3`, `dm-0`, `nvme0n1`) and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskError {
    /// The kernel name of the device (a whole disk or a partition) the line is about.
    pub device: String,
    /// The line, cut to a reasonable length.
    pub what: String,
}

/// The block layer's request errors that mean the disk failed (`<kind> error, dev X, sector`);
/// `operation not supported`, `nonblocking retry`, `kernel resource`... are the caller's or
/// the kernel's, not the disk's.
const REQUEST_ERRORS: [&str; 7] =
    ["I/O", "critical medium", "critical target", "timeout", "protection", "device offline", "recoverable transport"];

/// The device a kernel log line says failed, if it says one did. Recognised (Linux 4.x to
/// 6.x):
/// - the block layer: `I/O error, dev sdb, sector 2048 op 0x1:(WRITE) ...` (also prefixed
///   `blk_update_request: ` or `print_req_error: `), and `critical medium error, dev ...`;
/// - the buffer cache: `Buffer I/O error on dev sdb1, logical block 8, lost async page write`;
/// - ext4's I/O errors that it does not count: `EXT4-fs warning (device sdb1): ext4_end_bio:...
///   I/O error 10 writing to inode ...` (a failed data write), `EXT4-fs (sdb1): I/O error while
///   writing superblock`;
/// - jbd2: `JBD2: Error -5 detected when updating journal superblock for sdb1-8.`,
///   `Aborting journal on device sdb1-8.`;
/// - XFS: `XFS (sdb1): metadata I/O error in ...`, `XFS (sdb1): log I/O error -5`,
///   `XFS (sdb1): writeback error on inode ...`;
/// - NVMe: `nvme0n1: I/O Cmd(0x2) @ LBA 0, 8 blocks, I/O Error (sct 0x2 / sc 0x81) DNR`;
/// - SCSI sense: `sd 2:0:0:0: [sdb] tag#0 Sense Key : Medium Error [current]` (or Hardware).
///
/// Not: what the kernel also keeps as a state the agent reads, whose own sign clears when the
/// filesystem is repaired (a line would hold the sign 10 minutes past the repair): an ext4
/// error (`EXT4-fs error (device sdb1)`, counted in `errors_count`: `filesystem-errors`), a
/// remount read-only (`read-only`), an XFS or ext4 shutdown (`shut-down`).
pub fn disk_error(message: &str) -> Option<DiskError> {
    let device = request_error(message)
        .or_else(|| between(message, "Buffer I/O error on dev ", ","))
        .or_else(|| ext4_error(message))
        .or_else(|| jbd2_error(message))
        .or_else(|| xfs_error(message))
        .or_else(|| nvme_error(message))
        .or_else(|| scsi_sense_error(message))?;
    if !is_device_name(device) {
        return None;
    }
    Some(DiskError { device: device.to_string(), what: cut(message) })
}

/// The device a kernel log line says changed size (`loop3: detected capacity change from
/// 65536 to 98304`, logged by the block layer for every disk, loop device or partition table
/// rescan since Linux 5.11): no sign, but a size is a fact the next pass must see, and a
/// resize done without udev leaves no trace in /dev.
pub fn capacity_change(message: &str) -> Option<&str> {
    let (device, rest) = message.split_once(": ")?;
    (rest.starts_with("detected capacity change from ") && is_device_name(device)).then_some(device)
}

/// `[prefix: ]<kind> error, dev X, sector ...` with a kind of [`REQUEST_ERRORS`].
fn request_error(message: &str) -> Option<&str> {
    let at = message.find(" error, dev ")?;
    let kind = message[..at].rsplit(": ").next()?;
    if !REQUEST_ERRORS.contains(&kind) {
        return None;
    }
    let rest = &message[at + " error, dev ".len()..];
    rest.split(',').next()
}

fn ext4_error(message: &str) -> Option<&str> {
    if let Some(device) = between(message, "EXT4-fs warning (device ", ")") {
        return message.contains("I/O error").then_some(device);
    }
    let device = between(message, "EXT4-fs (", ")")?;
    message.contains("I/O error").then_some(device)
}

fn jbd2_error(message: &str) -> Option<&str> {
    let journal = if message.starts_with("JBD2: ") && (message.contains("Error") || message.contains("I/O error")) {
        message.rsplit(" for ").next()
    } else {
        message.strip_prefix("Aborting journal on device ")
    }?;
    // `sdb1-8.`: the device, then the journal's inode number.
    let journal = journal.trim_end_matches('.');
    let (device, inode) = journal.rsplit_once('-')?;
    inode.bytes().all(|b| b.is_ascii_digit()).then_some(device)
}

fn xfs_error(message: &str) -> Option<&str> {
    let device = between(message, "XFS (", ")")?;
    let said = ["I/O error", "writeback error"];
    said.iter().any(|s| message.contains(s)).then_some(device)
}

fn nvme_error(message: &str) -> Option<&str> {
    let (device, rest) = message.split_once(": I/O Cmd(")?;
    (device.starts_with("nvme") && rest.contains("Error")).then_some(device)
}

fn scsi_sense_error(message: &str) -> Option<&str> {
    if !message.starts_with("sd ") {
        return None;
    }
    let device = between(message, "[", "]")?;
    let said = ["Sense Key : Medium Error", "Sense Key : Hardware Error"];
    said.iter().any(|s| message.contains(s)).then_some(device)
}

/// The text between `start` and the next `end` after it.
fn between<'a>(message: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = message.find(start)? + start.len();
    let len = message[from..].find(end)?;
    Some(&message[from..from + len])
}

/// A kernel block device name: letters, digits, `-`, `_`, `.`, `!` (cciss!c0d0), not empty.
fn is_device_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'!'))
}

/// The line cut to [`MAX_WHAT`] bytes, at a character boundary.
fn cut(message: &str) -> String {
    if message.len() <= MAX_WHAT {
        return message.to_string();
    }
    let mut end = MAX_WHAT;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// The devices the kernel log said failed, each with its latest line and when it was read.
#[derive(Debug, Clone, Default)]
pub struct KernelLogMemory {
    devices: BTreeMap<String, (String, Instant)>,
}

impl KernelLogMemory {
    /// Remembers a line about a failing device, read at `now`; the oldest device is forgotten
    /// when [`MAX_DEVICES`] are remembered.
    pub fn note(&mut self, error: DiskError, now: Instant) {
        self.devices.insert(error.device, (error.what, now));
        while self.devices.len() > MAX_DEVICES {
            let oldest = self.devices.iter().min_by_key(|(_, (_, at))| *at).map(|(name, _)| name.clone());
            let Some(oldest) = oldest else { break };
            self.devices.remove(&oldest);
        }
    }

    /// The sign `kernel-log` for a volume on the devices `names` (its own device and every
    /// device under it, whole disks included), from the latest line about any of them read
    /// since `since` (when this instance of the volume was first seen: an earlier line is about
    /// a disk that had the name before) and within [`KERNEL_LOG_HOLD`]; None when there is
    /// none. Lines older than the hold are forgotten.
    pub fn failing(&mut self, names: &[String], since: Instant, now: Instant) -> Option<Failing> {
        self.devices.retain(|_, (_, at)| now.saturating_duration_since(*at) < KERNEL_LOG_HOLD);
        names
            .iter()
            .filter_map(|n| self.devices.get(n))
            .filter(|(_, at)| *at >= since)
            .max_by_key(|(_, at)| *at)
            .map(|(what, _)| Failing::KernelLog(what.clone()))
    }

    /// Number of devices remembered.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether no device is remembered.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

#[cfg(test)]
#[path = "kernel_log_tests.rs"]
mod tests;
