//! A real failing disk for tests: a loop device over `disk.img`, the one file of a small FUSE
//! server (tests/support/fuse_disk.py, standard library only) that the test switches at runtime
//! between healthy, EIO on byte ranges, wedged (every call waits, unanswered) and resized. This
//! kernel has no device-mapper (no dm-error, dm-flakey, dm-delay); this is the same thing one
//! layer lower.
//!
//! The FUSE file is opened with direct I/O: every read and write of the loop device reaches the
//! server. The caches above it do not: a filesystem on the device answers from its page cache
//! and buffer cache; [`drop_caches`] empties them (what is dirty or in use stays).
//!
//! Dropping a [`FailingDisk`] (also after a failed assertion) releases a block first (answers
//! what waits: nothing on the machine may stay wedged, nor a process that touched the disk
//! keep from exiting), then unmounts lazily, detaches the loop device and stops the server by
//! its PID (SIGTERM: it fails what still waits and detaches its mount; SIGKILL after 5 s, which
//! aborts the FUSE connection all the same).

use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{mounts_under, quiet, repo_root, run, wait_until};

/// One failing disk: its FUSE server (our child), the loop device over its file and, when
/// formatted, the ext4 mount on it.
pub struct FailingDisk {
    /// The scratch directory: the backing file, the FUSE mount point, the control socket.
    pub dir: PathBuf,
    /// The loop device over [`Self::image`].
    pub device: PathBuf,
    /// Where [`Self::ext4`] mounted the device.
    pub mount: Option<PathBuf>,
    server: Child,
    control: PathBuf,
}

impl FailingDisk {
    /// Starts the server in `dir` (created) with a sparse disk of `bytes` and attaches a loop
    /// device over it.
    pub fn new(dir: &Path, bytes: u64) -> FailingDisk {
        std::fs::create_dir_all(dir).unwrap();
        let control = dir.join("control.sock");
        let fuse_mnt = dir.join("fuse");
        let log = std::fs::File::create(dir.join("fuse_disk.log")).unwrap();
        let server = Command::new("python3")
            .arg(repo_root().join("tests/support/fuse_disk.py"))
            .arg("--mountpoint")
            .arg(&fuse_mnt)
            .arg("--backing")
            .arg(dir.join("backing.img"))
            .args(["--size", &bytes.to_string()])
            .arg("--control")
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting tests/support/fuse_disk.py (python3)");
        let mut disk = FailingDisk { dir: dir.to_path_buf(), device: PathBuf::new(), mount: None, server, control };
        let image = disk.image();
        wait_until("the FUSE disk served", Duration::from_secs(20), || {
            if let Ok(Some(status)) = disk.server.try_wait() {
                let log = std::fs::read_to_string(disk.dir.join("fuse_disk.log")).unwrap_or_default();
                panic!("fuse_disk.py exited ({status}): {log}");
            }
            (disk.try_command("status").is_some() && std::fs::metadata(&image).is_ok_and(|m| m.len() == bytes))
                .then_some(())
        });
        let out = run(Command::new("losetup").args(["--find", "--show", "--direct-io=off"]).arg(&image));
        disk.device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        disk
    }

    /// The FUSE file the loop device reads and writes.
    pub fn image(&self) -> PathBuf {
        self.dir.join("fuse").join("disk.img")
    }

    /// The server's process ID.
    pub fn server_pid(&self) -> u32 {
        self.server.id()
    }

    /// Formats the device ext4 and mounts it at `point` (created) with `options`.
    pub fn ext4(&mut self, point: &Path, options: &str) {
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&self.device));
        std::fs::create_dir_all(point).unwrap();
        run(Command::new("mount").args(["-t", "ext4", "-o", options]).arg(&self.device).arg(point));
        self.mount = Some(point.to_path_buf());
    }

    /// Reads (`reads`) and/or writes (`writes`) touching `range` (bytes of the disk) fail
    /// with EIO from now on, beside the ranges already failing.
    pub fn set_eio(&self, range: Range<u64>, reads: bool, writes: bool) {
        let ops = match (reads, writes) {
            (true, true) => "rw",
            (true, false) => "r",
            (false, true) => "w",
            (false, false) => return,
        };
        self.command(&format!("eio {} {} {ops}", range.start, range.end));
    }

    /// Every read and/or write of the whole disk fails with EIO (whatever its size later).
    pub fn set_eio_everywhere(&self, reads: bool, writes: bool) {
        self.set_eio(0..u64::MAX >> 1, reads, writes);
    }

    /// No failing range, no block: a healthy disk again (what waited is answered).
    pub fn healthy(&self) {
        self.command("healthy");
    }

    /// Wedges the disk: every request from now on waits, unanswered, until [`Self::release`].
    pub fn block(&self) {
        self.command("block");
    }

    /// Answers what waits (as the failing ranges say) and answers again.
    pub fn release(&self) {
        self.command("release");
    }

    /// The disk now has `bytes` (its backing file too), and the loop device is told
    /// (`losetup -c`): the kernel's size of the device follows.
    pub fn resize(&self, bytes: u64) {
        self.command(&format!("resize {bytes}"));
        run(Command::new("losetup").arg("-c").arg(&self.device));
        let name = self.device.file_name().unwrap().to_string_lossy().into_owned();
        let sectors = std::fs::read_to_string(format!("/sys/class/block/{name}/size")).unwrap();
        assert_eq!(sectors.trim().parse::<u64>().unwrap() * 512, bytes, "{} after losetup -c", self.device.display());
    }

    /// The server's state: `blocked`, `size`, `ranges`, `pending`, counters of `reads`,
    /// `writes`, `eio_reads`, `eio_writes`, `requests`.
    pub fn status(&self) -> Value {
        let answer = self.command("status");
        serde_json::from_str(answer.trim_start_matches("ok ")).expect("fuse_disk status JSON")
    }

    /// Sends a control command, panicking unless the server says `ok`.
    fn command(&self, line: &str) -> String {
        let answer = self.try_command(line).unwrap_or_else(|| panic!("fuse_disk control {line:?}: no answer"));
        assert!(answer.starts_with("ok"), "fuse_disk control {line:?}: {answer}");
        answer
    }

    fn try_command(&self, line: &str) -> Option<String> {
        let mut stream = UnixStream::connect(&self.control).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        stream.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer.trim().to_string())
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        // Release first: a process stuck on the disk (a test's agent) could neither exit nor
        // let the unmount finish.
        let _ = self.try_command("release");
        if let Some(point) = self.mount.take() {
            quiet(Command::new("umount").arg("-l").arg(&point));
        }
        if !self.device.as_os_str().is_empty() {
            quiet(Command::new("losetup").arg("-d").arg(&self.device));
        }
        let pid = nix::unistd::Pid::from_raw(self.server.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !matches!(self.server.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = self.server.kill();
                let _ = self.server.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in mounts_under(&self.dir) {
            quiet(Command::new("umount").arg("-l").arg(&p));
        }
    }
}

/// Drops the kernel's clean page cache, dentries and inodes (`echo 3 > drop_caches`): what a
/// filesystem on a failing disk reads next comes from the disk.
pub fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("writing /proc/sys/vm/drop_caches (root)");
}

/// Whether a direct read of `len` bytes at `offset` of `device` fails with EIO (`dd
/// iflag=direct`: no cache in between).
pub fn read_fails(device: &Path, offset: u64, len: u64) -> bool {
    let out = Command::new("dd")
        .arg(format!("if={}", device.display()))
        .args(["of=/dev/null", "bs=4096", "iflag=direct,skip_bytes,count_bytes"])
        .arg(format!("skip={offset}"))
        .arg(format!("count={len}"))
        .output()
        .expect("running dd");
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Input/output error")
}
