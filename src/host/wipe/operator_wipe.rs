//! The host side of an operator's wipe of one named disk (`wipe-disk`): gathers the facts the
//! rules of core::wipe::operator_wipe read (the inventory the claim pass uses, the discovery
//! directories' entries, the agent's claim records, whether the disk or anything sharing its
//! data is mounted, held or open by any process), and zeroes the disk.
//!
//! The wipe opens the device `O_RDWR | O_EXCL` (no mount, claim or other exclusive user can
//! start meanwhile) and proves again on that very descriptor that it is the named disk (its
//! stable id read through the descriptor, its size, nothing mounted, held or open), so a device
//! swapped at the node after the decision is never written. It then zeroes every byte
//! (host::wipe::wipe_block's zero method: BLKZEROOUT, else plain writes), drops the buffer cache and
//! reads back both ends and a spread of samples, all before the descriptor is closed.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::config::ProvisionerConfig;
use crate::core::devices::device_claim::DeviceFacts;
use crate::core::volumes::volume_safety::DiskKey;
use crate::core::wipe::operator_wipe::{Opener, Target, WipeWorld, find_target, read_back_ranges, related};
use crate::host::HostError;
use crate::host::devices::blockdev::{
    block_device_in_use, device_number, device_size, extent, flush_buffers, open_device, reread_partitions,
};
use crate::host::devices::claims::{entries, inventory, read_records, roots};
use crate::host::devices::writers::{self, Wanted};
use crate::host::identity::fingerprint::stable_id;
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::foreground;
use crate::host::wipe::wipe_block::{BlockMethod, BlockWipeError, wipe_block_checked};

/// Blocks of 64 KiB read back between the first and the last MiB.
const READ_BACK_SAMPLES: u64 = 64;
/// Attempts of a check or an open that found the device open exclusively: the agent's probe
/// (or `disks`) holds it for a moment only.
const BUSY_ATTEMPTS: u32 = 3;
/// Pause between those attempts, and between the two scans of open descriptors.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// Why the facts could not be gathered or the wipe failed, with the device or path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OperatorWipeError {
    /// The host could not be read.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The device node is missing, or is another device.
    #[error("/dev/{name} is not the device {dev} (missing, or another device now); nothing was written")]
    NoNode { name: String, dev: String },
    /// The deadline passed before the wipe was done.
    #[error("the wipe of /dev/{name} did not finish within {timeout:?} (--timeout): {done} of {total} bytes zeroed")]
    TimedOut { name: String, timeout: Duration, done: u64, total: u64 },
    /// The wipe (or the proof before it, or the read-back after it) failed.
    #[error(transparent)]
    Wipe(#[from] BlockWipeError),
}

/// Everything the decision reads except the PVs (`pvs` is left `Ok(vec![])`), and notes for
/// the operator (an unreadable claims.json).
pub(crate) fn gather(
    config: &ProvisionerConfig,
    failed_classes: &[String],
    state_dir: &Path,
    id: &str,
) -> Result<(WipeWorld, Vec<String>), OperatorWipeError> {
    let mounts = MountTable::read()?;
    let facts = mounts.facts();
    let (devices, _) = inventory(&mounts, None);
    let roots = roots(config, &facts);
    let mut unscanned: Vec<String> =
        config.storage_class_map.keys().filter(|c| !roots.contains_key(*c)).cloned().collect();
    unscanned.extend(failed_classes.iter().cloned());
    unscanned.sort();
    unscanned.dedup();
    let mut notes = Vec::new();
    let records = read_records(state_dir).unwrap_or_else(|e| {
        notes.push(format!("{e}; every link counts as someone else's"));
        Vec::new()
    });
    let mut world = WipeWorld {
        id: id.to_string(),
        entries: entries(&roots, config, None),
        unscanned,
        records,
        pvs: Ok(Vec::new()),
        ..Default::default()
    };
    if let Ok(target) = find_target(id, &devices) {
        let node = device_node(target)?;
        world.in_use = in_use(&node, &mounts, &facts)?;
        world.openers = stable_openers(&devices_by_number(&devices, target));
        let e = foreground(|on| extent(&target.dev, &facts, on));
        world.backing_disk = e.as_ref().and_then(backing_disk);
        world.target_disk = Some(DiskKey::block(target.dev.clone()).with_extent(e));
    }
    world.devices = devices;
    Ok((world, notes))
}

/// The stable id of the device under the filesystem that holds a loop device's backing file
/// (the extent's base `file:<M:m>:<inode>`), where that filesystem has one.
fn backing_disk(e: &crate::core::volumes::volume_safety::Extent) -> Option<String> {
    let device = match &e.file {
        Some(location) => location.device.clone(),
        None => e.base.strip_prefix("file:")?.rsplit_once(':')?.0.to_string(),
    };
    let (major, minor) = device.split_once(':')?;
    let rdev = nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?);
    let node = open_device(rdev, None);
    stable_id(rdev, node.as_ref()).0
}

/// What the volume at each of `paths` occupies here now, as discovery sees it (`None` where no
/// volume is there, or the mount table cannot be read).
pub(crate) fn volumes_at(paths: &[String]) -> Vec<Option<DiskKey>> {
    let Ok(mounts) = MountTable::read() else { return vec![None; paths.len()] };
    let facts = mounts.facts();
    // `wipe-disk` is an operator's command in a terminal: no deadline.
    crate::host::ops::foreground(|on| {
        paths.iter().map(|p| crate::host::volumes::discovery::disk_at(Path::new(p), &mounts, &facts, on)).collect()
    })
}

/// The device's node in /dev, only when it is that very device.
fn device_node(device: &DeviceFacts) -> Result<PathBuf, OperatorWipeError> {
    let node = PathBuf::from(format!("/dev/{}", device.name));
    let ok = std::fs::metadata(&node)
        .is_ok_and(|m| m.file_type().is_block_device() && device_number(m.rdev()) == device.dev);
    if ok { Ok(node) } else { Err(OperatorWipeError::NoNode { name: device.name.clone(), dev: device.dev.clone() }) }
}

/// [`block_device_in_use`], asked again a few times while only an exclusive open is seen.
fn in_use(
    node: &Path,
    mounts: &MountTable,
    facts: &[crate::core::volumes::volume_safety::MountFacts<'_>],
) -> Result<Option<String>, HostError> {
    let mut attempt = 1;
    loop {
        let found = foreground(|on| block_device_in_use(node, mounts, facts, None, on))?;
        if !found.as_deref().is_some_and(|why| why.contains("open exclusively")) || attempt >= BUSY_ATTEMPTS {
            return Ok(found);
        }
        attempt += 1;
        std::thread::sleep(BUSY_PAUSE);
    }
}

/// `major:minor` -> kernel name of the target and every device sharing its data.
fn devices_by_number(devices: &[DeviceFacts], target: &DeviceFacts) -> BTreeMap<String, String> {
    let names = related(target);
    devices.iter().filter(|d| names.contains(&d.name)).map(|d| (d.dev.clone(), d.name.clone())).collect()
}

/// The processes (other than this one) with a descriptor on any of `devices`, seen in two
/// scans a moment apart: a brief probe (the agent's, `disks`) is not a user.
/// Every process (other than this one) with a descriptor of one of `devices` (`major:minor` ->
/// kernel name) or of the backing file of a loop device among them, as host::devices::writers finds
/// them. Only the processes of this PID namespace are seen (in a pod: hostPID).
fn stable_openers(devices: &BTreeMap<String, String>) -> Vec<Opener> {
    let wanted = foreground(|on| Wanted::devices(devices.iter().map(|(dev, name)| (dev.as_str(), name.as_str())), on));
    let again = |w: &Wanted| Ok::<_, std::convert::Infallible>(foreground(|on| writers::openers(w, on)));
    writers::still_open(foreground(|on| writers::openers(&wanted, on)), &wanted, Instant::now(), BUSY_PAUSE, again)
        .unwrap_or_else(|e| match e {})
}

/// What the wipe did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Wiped {
    /// Bytes zeroed (the whole device).
    pub bytes: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// Bytes read back and found zero.
    pub read_back: u64,
    /// The outcome of asking the kernel to re-read the partition table (when it had one).
    pub reread: Option<Result<(), String>>,
}

/// Zeroes `target` (see the module documentation); `progress(done, total)` as the wipe goes.
/// Stops with an error once `timeout` has passed.
pub(crate) fn wipe(
    target: &Target,
    timeout: Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Wiped, OperatorWipeError> {
    let node = PathBuf::from(format!("/dev/{}", target.name));
    let expected = std::fs::metadata(&node)
        .ok()
        .filter(|m| m.file_type().is_block_device() && device_number(m.rdev()) == target.dev)
        .map(|m| m.rdev())
        .ok_or_else(|| OperatorWipeError::NoNode { name: target.name.clone(), dev: target.dev.clone() })?;
    let sharing: BTreeMap<String, String> = std::iter::once(target.name.clone())
        .chain(target.related.iter().cloned())
        .filter_map(|name| {
            let dev = crate::host::devices::blockdev::sysfs_attr(&Path::new("/sys/class/block").join(&name), "dev")?;
            Some((dev, name))
        })
        .collect();
    let cancel = AtomicBool::new(false);
    let started = Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let mut reread = None;
    let mut read_back = 0;
    let result = std::thread::scope(|s| {
        // The deadline: raises the cancel flag, which the wipe checks between chunks.
        let cancel = &cancel;
        s.spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(timeout) {
                cancel.store(true, Ordering::Relaxed);
            }
        });
        let mut verify = |file: &File| prove(file, target, expected, &sharing);
        let mut after = |file: &File| {
            flush_buffers(file).map_err(|e| format!("ioctl BLKFLSBUF: {e}"))?;
            read_back = check_zero(file, target.size)?;
            if !target.partitions.is_empty() {
                reread = Some(reread_partitions(file).map_err(|e| e.to_string()));
            }
            Ok(())
        };
        let mut attempt = 1;
        let result = loop {
            match wipe_block_checked(&node, BlockMethod::Zero, cancel, progress, &mut verify, &mut after) {
                Err(BlockWipeError::Io(crate::host::HostError::Io { op, .. }))
                    if op.starts_with("open exclusively") && attempt < BUSY_ATTEMPTS =>
                {
                    attempt += 1;
                    std::thread::sleep(BUSY_PAUSE);
                }
                other => break other,
            }
        };
        drop(done_tx);
        result
    });
    let report = result.map_err(|e| match e {
        BlockWipeError::Cancelled { done, total, .. } => {
            OperatorWipeError::TimedOut { name: target.name.clone(), timeout, done, total }
        }
        e => e.into(),
    })?;
    Ok(Wiped { bytes: report.bytes, elapsed: started.elapsed(), read_back, reread })
}

/// The proof, on the exclusively opened descriptor, that it is the named disk and that nothing
/// uses its data: its device number, its stable id read through the descriptor (a loop
/// device's binding comes from the descriptor itself), its size, and nothing mounted, held or
/// open by another process since the decision.
fn prove(file: &File, target: &Target, expected: u64, sharing: &BTreeMap<String, String>) -> Result<(), String> {
    let meta = file.metadata().map_err(|e| format!("fstat: {e}"))?;
    if !meta.file_type().is_block_device() || meta.rdev() != expected {
        return Err(format!("the opened node is {}, not {}", device_number(meta.rdev()), target.dev));
    }
    let (id, _) = stable_id(meta.rdev(), Some(file));
    if id.as_deref() != Some(target.stable_id.as_str()) {
        return Err(format!("its stable id is now {:?}, not {:?}; nothing was written", id, target.stable_id));
    }
    let size = device_size(file).map_err(|e| format!("ioctl BLKGETSIZE64: {e}"))?;
    if size != target.size {
        return Err(format!("its size is now {size} bytes, not {} as listed; nothing was written", target.size));
    }
    let mounts = MountTable::read().map_err(|e| e.to_string())?;
    for (dev, name) in sharing {
        if let Some(m) = mounts.mount_of_device(dev) {
            return Err(format!("{name} was mounted at {} meanwhile; nothing was written", m.mount_point.display()));
        }
        let holders = std::fs::read_dir(format!("/sys/dev/block/{dev}/holders")).map(|rd| rd.count()).unwrap_or(0);
        if holders > 0 {
            return Err(format!("{name} got holders meanwhile; nothing was written"));
        }
    }
    let open = stable_openers(sharing);
    if !open.is_empty() {
        let list: Vec<String> = open.iter().map(|o| o.to_string()).collect();
        return Err(format!("opened meanwhile: {}; nothing was written", list.join(", ")));
    }
    Ok(())
}

/// Reads back the ranges of core::wipe::operator_wipe::read_back_ranges; the bytes read, or the first
/// non-zero offset.
fn check_zero(file: &File, size: u64) -> Result<u64, String> {
    let mut buf = Vec::new();
    let mut total = 0;
    for (at, len) in read_back_ranges(size, READ_BACK_SAMPLES) {
        // Each range is at most 1 MiB.
        buf.resize(usize::try_from(len).unwrap_or(0), 0);
        file.read_exact_at(&mut buf, at).map_err(|e| format!("reading back at {at}: {e}"))?;
        if let Some(i) = buf.iter().position(|b| *b != 0) {
            return Err(format!("byte {} reads {:#04x} after zeroing", at + i as u64, buf[i]));
        }
        total += len;
    }
    Ok(total)
}
