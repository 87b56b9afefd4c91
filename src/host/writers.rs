//! Who uses a block device without claiming it: its I/O counters (sysfs) and the descriptors
//! the processes this agent can see hold (`/proc/<pid>/fd`). core::activity judges them.
//!
//! What the agent can see: the counters are the kernel's, whatever namespace the agent runs
//! in. `/proc` shows the processes of the agent's PID namespace only: in a pod, that is the
//! host's processes only with `hostPID: true` (deploy/ and the chart set it), otherwise the
//! agent's own, and then only the counters and the exclusive-open probe see other users.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::core::activity::{IoStat, Opener};
use crate::host::blockdev::{loop_status, open_device};

/// The I/O counters of the block device `name` (kernel name), with `in_flight` as `stat`
/// gives it: every request in flight, reads included. `None` when sysfs has no such device.
pub(crate) fn io_stat(name: &str) -> Option<IoStat> {
    IoStat::parse(&std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("stat")).ok()?)
}

/// The same, with `in_flight` counting writes only (`inflight`: "reads writes"), for checks
/// that must not take a brief reader (udev's blkid) for a writer.
pub(crate) fn io_stat_writes_in_flight(name: &str) -> Option<IoStat> {
    let mut stat = io_stat(name)?;
    let inflight = std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("inflight")).ok()?;
    stat.in_flight = inflight.split_whitespace().nth(1)?.parse().ok()?;
    Some(stat)
}

/// The write counters of the devices in `names` (kernel names), one line each, from one read
/// of `/proc/diskstats` (cheaper than a `stat` file per device, read once a second by the
/// block-device watch while any device is watched): what changes when anything is written,
/// discarded or flushed.
pub(crate) fn written_counters(names: &std::collections::BTreeSet<String>) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.nth(2)?;
            if !names.contains(name) {
                return None;
            }
            let s = IoStat::parse(&fields.collect::<Vec<_>>().join(" "))?;
            Some(format!("written {name} {} {} {} {}", s.writes, s.write_sectors, s.discards, s.flushes))
        })
        .collect()
}

/// What to look for among the open descriptors: block devices by number, and regular files by
/// (device, inode) (the backing files of loop devices), each with the device's kernel name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Wanted {
    /// Block devices: (rdev, kernel name).
    pub devices: Vec<(u64, String)>,
    /// Backing files of loop devices: (st_dev, st_ino, the loop device's kernel name).
    pub files: Vec<(u64, u64, String)>,
}

impl Wanted {
    /// The devices `(major:minor, kernel name)` and the backing file of each loop device among
    /// them (its status read through a read-only open, never `O_EXCL`).
    pub(crate) fn devices<'a>(devices: impl IntoIterator<Item = (&'a str, &'a str)>) -> Wanted {
        let mut wanted = Wanted::default();
        for (dev, name) in devices {
            let Some((major, minor)) = dev.split_once(':') else { continue };
            let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else { continue };
            let rdev = nix::sys::stat::makedev(major, minor);
            wanted.devices.push((rdev, name.to_string()));
            if Path::new("/sys/dev/block").join(dev).join("loop").is_dir()
                && let Some(file) = open_device(rdev, None)
                && let Ok(status) = loop_status(&file)
            {
                wanted.files.push((status.device, status.inode, name.to_string()));
            }
        }
        wanted
    }

    fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.files.is_empty()
    }
}

/// The openers of `first` (a scan of `wanted` made at `scanned`) that a second scan, at least
/// `pause` after it, finds again (the same process on the same device): a process seen once
/// only opened the device for a moment (a probe of the `disks` command, udev's blkid).
pub(crate) fn still_open(first: Vec<Opener>, wanted: &Wanted, scanned: Instant, pause: Duration) -> Vec<Opener> {
    if first.is_empty() {
        return first;
    }
    std::thread::sleep(pause.saturating_sub(scanned.elapsed()));
    let again = openers(wanted);
    first.into_iter().filter(|o| again.iter().any(|a| a.pid == o.pid && a.what == o.what)).collect()
}

/// Every descriptor of another process (not this one, nor its threads, nor another run of this
/// program) that leads to one of
/// `wanted`. Processes that exit while they are read are skipped; a `/proc` that cannot be
/// listed gives nothing (the counters and the exclusive probe still apply).
pub(crate) fn openers(wanted: &Wanted) -> Vec<Opener> {
    let mut out = Vec::new();
    if wanted.is_empty() {
        return out;
    }
    let me = std::process::id();
    // Other runs of this very program (the agent and a `disks` or `wipe-disk` run beside it)
    // only ever open a device briefly to probe it, or hold it `O_EXCL` to wipe it, which the
    // exclusive probe sees: they are not users.
    let program = |pid: &str| std::fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| (m.dev(), m.ino()));
    let own_program = program("self");
    let devices: BTreeSet<u64> = wanted.devices.iter().map(|(d, _)| *d).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me || (own_program.is_some() && program(&pid.to_string()) == own_program) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            // stat() follows the magic link to the open file itself, whatever its path.
            let Ok(meta) = std::fs::metadata(fd.path()) else { continue };
            let found = if meta.file_type().is_block_device() && devices.contains(&meta.rdev()) {
                wanted.devices.iter().find(|(d, _)| *d == meta.rdev()).map(|(_, n)| (n.clone(), false))
            } else if meta.file_type().is_file() {
                wanted
                    .files
                    .iter()
                    .find(|(dev, ino, _)| *dev == meta.dev() && *ino == meta.ino())
                    .map(|(_, _, n)| (n.clone(), true))
            } else {
                None
            };
            let Some((what, backing_file)) = found else { continue };
            let Some(n) = fd.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default().trim().to_string();
            out.push(Opener { pid, comm, fd: n, writable: writable(&p.path(), n), what, backing_file });
        }
    }
    out.sort();
    out
}

/// Whether descriptor `fd` of the process at `proc_dir` was opened for writing (the access
/// mode in `fdinfo`'s octal `flags`); unknown counts as writable.
fn writable(proc_dir: &Path, fd: u32) -> bool {
    let Ok(info) = std::fs::read_to_string(proc_dir.join("fdinfo").join(fd.to_string())) else { return true };
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok());
    flags.is_none_or(|f| f & 0o3 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_file_another_process_holds_is_found_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, b"x").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let wanted = Wanted { devices: vec![], files: vec![(meta.dev(), meta.ino(), "image".into())] };
        // This process's own descriptors never count.
        let _mine = std::fs::File::open(&path).unwrap();
        assert!(openers(&wanted).is_empty());
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 7>>'{}'; exec sleep 30", path.display()))
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut found = Vec::new();
        for _ in 0..100 {
            found = openers(&wanted);
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].pid, found[0].fd, found[0].writable, found[0].what.as_str(), found[0].backing_file),
            (pid, 7, true, "image", true)
        );
    }

    #[test]
    fn diskstats_give_the_write_counters_of_the_named_devices_only() {
        let names: std::collections::BTreeSet<String> = ["loop0".to_string(), "no-such-disk".to_string()].into();
        let lines = written_counters(&names);
        // loop0 exists on every Linux with the loop driver loaded; no-such-disk never does.
        assert!(lines.iter().all(|l| l.starts_with("written loop0 ")), "{lines:?}");
        assert!(lines.len() <= 1, "{lines:?}");
        assert!(written_counters(&Default::default()).is_empty());
    }

    #[test]
    fn nothing_wanted_reads_nothing() {
        assert!(openers(&Wanted::default()).is_empty());
    }

    #[test]
    fn counters_of_a_device_that_does_not_exist_are_none() {
        assert_eq!(io_stat("no-such-device-here"), None);
        assert_eq!(io_stat_writes_in_flight("no-such-device-here"), None);
    }
}
