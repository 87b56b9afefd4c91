//! Who uses a block device without claiming it: its I/O counters (sysfs) and the descriptors
//! the processes this agent can see hold (`/proc/<pid>/fd`). core::devices::activity judges them.
//!
//! What the agent can see: the counters are the kernel's, whatever namespace the agent runs
//! in. `/proc` shows the processes of the agent's PID namespace only: in a pod, that is the
//! host's processes only with `hostPID: true` (deploy/components/host-pid; the chart sets it
//! for classes with devices), otherwise the agent's own: then [`host_processes`] says so and
//! device claims prove nothing unused (core::devices::activity::host_processes_seen).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::core::devices::activity::{IoStat, Opener, host_processes_seen};
use crate::host::devices::blockdev::{loop_status, open_device};
use crate::host::ops::OnDeadline;

/// Whether this agent's `/proc` shows the host's processes (core::devices::activity::host_processes_seen),
/// read from `/proc/self/ns/pid` and `/proc/1/comm`.
pub(crate) fn host_processes() -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let namespace = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
    let comm = std::fs::read_to_string("/proc/1/comm").ok();
    host_processes_seen(namespace, std::process::id(), comm.as_deref())
}

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
    pub(crate) fn devices<'a>(devices: impl IntoIterator<Item = (&'a str, &'a str)>, _on: &OnDeadline) -> Wanted {
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
/// only opened the device for a moment (a probe of the `disks` command, udev's blkid). The
/// second scan is `scan` (the agent runs it under its deadline); its failure is the answer.
pub(crate) fn still_open<E>(
    first: Vec<Opener>,
    wanted: &Wanted,
    scanned: Instant,
    pause: Duration,
    scan: impl FnOnce(&Wanted) -> Result<Vec<Opener>, E>,
) -> Result<Vec<Opener>, E> {
    if first.is_empty() {
        return Ok(first);
    }
    std::thread::sleep(pause.saturating_sub(scanned.elapsed()));
    let again = scan(wanted)?;
    Ok(first.into_iter().filter(|o| again.iter().any(|a| a.pid == o.pid && a.what == o.what)).collect())
}

/// Whether a descriptor whose `/proc/<pid>/fd/<n>` link reads `target` may be a wanted block
/// device or loop backing file, and so must be looked at: only a path may (a socket, a pipe,
/// an anonymous inode or a namespace never is). Decided from the link alone, which the kernel
/// answers from its own records without asking the filesystem the file is on.
pub(crate) fn may_be_wanted(target: &[u8]) -> bool {
    target.first() == Some(&b'/')
}

/// What a descriptor leads to, as far as the scan needs: its type, (device, inode), and the
/// device number of a device node. Read with `statx(AT_STATX_DONT_SYNC)` through the magic
/// link: the attributes the kernel has, without asking the file's filesystem to refresh them
/// (a stopped FUSE daemon, a hung NFS server would never answer); those three never change
/// while the file is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Led {
    block: bool,
    file: bool,
    dev: u64,
    ino: u64,
    rdev: u64,
}

fn led_to(path: &Path, _on: &OnDeadline) -> Option<Led> {
    use rustix::fs::{AtFlags, FileType, StatxFlags};
    let st =
        rustix::fs::statx(rustix::fs::CWD, path, AtFlags::STATX_DONT_SYNC, StatxFlags::TYPE | StatxFlags::INO).ok()?;
    let kind = FileType::from_raw_mode(u32::from(st.stx_mode));
    Some(Led {
        block: kind == FileType::BlockDevice,
        file: kind == FileType::RegularFile,
        dev: nix::sys::stat::makedev(u64::from(st.stx_dev_major), u64::from(st.stx_dev_minor)),
        ino: st.stx_ino,
        rdev: nix::sys::stat::makedev(u64::from(st.stx_rdev_major), u64::from(st.stx_rdev_minor)),
    })
}

/// Every descriptor of another process (not this one, nor its threads, nor another run of this
/// program) that leads to one of `wanted`. Processes that exit while they are read are
/// skipped; a `/proc` that cannot be listed gives nothing (the counters and the exclusive
/// probe still apply). Each descriptor's link is read first; only one that names a path is
/// looked at, without a sync (see [`Led`]). The filesystem of such a path may still hold the
/// look (a network filesystem revalidates the path it walks to): the agent runs this under its
/// deadline (host::devices::claims).
pub(crate) fn openers(wanted: &Wanted, on: &OnDeadline) -> Vec<Opener> {
    let mut out = Vec::new();
    if wanted.is_empty() {
        return out;
    }
    let me = std::process::id();
    // Other runs of this very program (the agent and a `disks` or `wipe-disk` run beside it)
    // only ever open a device briefly to probe it, or hold it `O_EXCL` to wipe it, which the
    // exclusive probe sees: they are not users.
    let program = |pid: &str| led_to(Path::new(&format!("/proc/{pid}/exe")), on).map(|l| (l.dev, l.ino));
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
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if !may_be_wanted(target.as_os_str().as_encoded_bytes()) {
                continue;
            }
            // statx follows the magic link to the open file itself, whatever its path.
            let Some(led) = led_to(&fd.path(), on) else { continue };
            let found = if led.block && devices.contains(&led.rdev) {
                wanted.devices.iter().find(|(d, _)| *d == led.rdev).map(|(_, n)| (n.clone(), false))
            } else if led.file {
                wanted
                    .files
                    .iter()
                    .find(|(dev, ino, _)| *dev == led.dev && *ino == led.ino)
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
    use crate::host::ops::foreground;
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
        assert!(foreground(|on| openers(&wanted, on)).is_empty());
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 7>>'{}'; exec sleep 30", path.display()))
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut found = Vec::new();
        for _ in 0..100 {
            found = foreground(|on| openers(&wanted, on));
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
    fn only_descriptors_that_name_a_path_are_looked_at() {
        for target in ["/dev/loop3", "/var/lib/images/disk.img", "/memfd:x (deleted)", "/mnt/gone (deleted)"] {
            assert!(may_be_wanted(target.as_bytes()), "{target}");
        }
        for target in
            ["socket:[1234]", "pipe:[99]", "anon_inode:[eventfd]", "anon_inode:inotify", "net:[4026531840]", ""]
        {
            assert!(!may_be_wanted(target.as_bytes()), "{target}");
        }
    }

    #[test]
    fn a_device_node_is_known_by_its_device_number_without_a_sync() {
        let led = foreground(|on| led_to(Path::new("/dev/null"), on)).expect("/dev/null");
        assert!(!led.block && !led.file, "a character device is neither");
        assert_eq!(led.rdev, nix::sys::stat::makedev(1, 3));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let led = foreground(|on| led_to(&path, on)).unwrap();
        assert!(led.file && (led.dev, led.ino) == (meta.dev(), meta.ino()));
    }

    #[test]
    fn a_second_scan_that_fails_is_the_answer() {
        let o = Opener { pid: 1, comm: "x".into(), fd: 3, writable: true, what: "loop1".into(), backing_file: false };
        let w = Wanted::default();
        let gone: Result<Vec<Opener>, &str> =
            still_open(vec![o.clone()], &w, Instant::now(), Duration::ZERO, |_| Ok(vec![]));
        assert_eq!(gone, Ok(vec![]));
        let kept = still_open(vec![o.clone()], &w, Instant::now(), Duration::ZERO, |_| Ok::<_, &str>(vec![o.clone()]));
        assert_eq!(kept, Ok(vec![o.clone()]));
        assert_eq!(still_open(vec![o], &w, Instant::now(), Duration::ZERO, |_| Err("no answer")), Err("no answer"));
    }

    #[test]
    fn nothing_wanted_reads_nothing() {
        assert!(foreground(|on| openers(&Wanted::default(), on)).is_empty());
    }

    #[test]
    fn counters_of_a_device_that_does_not_exist_are_none() {
        assert_eq!(io_stat("no-such-device-here"), None);
        assert_eq!(io_stat_writes_in_flight("no-such-device-here"), None);
    }
}
