//! Claiming raw block devices on the host: the inventory of every block device (sysfs,
//! /dev/disk/by-id, a non-destructive probe of candidates), the entries of the discovery
//! directories, the record of the links this agent made (`claims.json` in the state
//! directory), and the link changes themselves. The decisions are core::devices::device_claim's.
//!
//! Nothing here writes to a device: a device node is only opened read-only, and only with
//! `O_EXCL` (which fails rather than wait while anyone else holds it). Links are made and
//! removed relative to the discovery directory's descriptor, never through a path that a
//! symlink could redirect.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, CWD, Mode, OFlags};

use crate::config::{DeviceType, ProvisionerConfig};
use crate::core::devices::activity::{IoStat, Opener, opened_by_others, written_between};
use crate::core::devices::device_claim::{
    ClaimPlan, ClaimRecord, ClassClaims, Content, DeviceFacts, DeviceKind, DirEntry, LinkAction, Probe, PvDisk,
    Refusal, Verdict, World, current_loop_id, plan,
};
use crate::core::devices::signatures::Content as Found;
use crate::core::devices::surface::{FullRead, WINDOW, offset_text};
use crate::core::volumes::volume_safety::{Extent, MountFacts};
use crate::host::devices::blockdev::{Extents, block_device_in_use, device_number, extent, sysfs_attr};
use crate::host::devices::device_content::{self, Probe as ContentProbe, Reach};
use crate::host::devices::verify::{FullReadJob, FullReads, Verifier};
use crate::host::devices::writers::{self, Wanted};
use crate::host::identity::fingerprint::{open_device, stable_id};
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::{Answer, Job, OnDeadline, Operations, Subject, foreground};
use crate::host::state_file;

/// The file in the state directory listing the links this agent made.
pub(crate) const CLAIMS_FILE: &str = "claims.json";

/// Why a claim step failed, with the path it was about.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// A file operation failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// The claims file is not what this agent writes.
    #[error("{path} is unreadable: {message}; no link is changed until it is fixed or removed")]
    BadRecords { path: PathBuf, message: String },
    /// The class is no longer in the config: its directory is unknown.
    #[error("class {0} is no longer in the config; its links are left as they are")]
    ClassGone(String),
    /// What is at a link's name is not the link this agent recorded.
    #[error("{path}: {message}")]
    NotOurs { path: PathBuf, message: String },
}

fn io(op: &'static str, path: &Path, e: impl Into<std::io::Error>) -> ClaimError {
    ClaimError::Io(crate::host::HostError::io(op, path, e))
}

/// What one claim pass found and did.
#[derive(Debug, Clone, Default)]
pub struct ClaimReport {
    /// Every block device of the node.
    pub devices: Vec<DeviceFacts>,
    /// The plan (verdicts, link changes, kept and held links).
    pub plan: ClaimPlan,
    /// Each link change and whether it was made.
    pub applied: Vec<(LinkAction, Result<(), String>)>,
    /// Why the pass could not run at all (unreadable records).
    pub failed: Option<String>,
    /// The links this agent keeps after the pass, by class.
    pub records: Vec<ClaimRecord>,
    /// The full reads (`verify: full`): the one under way and the results so far.
    pub full_reads: FullReads,
}

/// The links this agent made, as recorded in its state directory.
pub(crate) fn read_records(state_dir: &Path) -> Result<Vec<ClaimRecord>, ClaimError> {
    state_file::read_list(&state_dir.join(CLAIMS_FILE)).map_err(ClaimError::from)
}

/// Replaces the records durably: a crash leaves either list whole (host::state_file).
pub(crate) fn write_records(state_dir: &Path, records: &[ClaimRecord]) -> Result<(), ClaimError> {
    state_file::write_list(state_dir, &state_dir.join(CLAIMS_FILE), records).map_err(ClaimError::from)
}

/// A device as listed: its facts and its extent (None: unknown).
type Listed = (DeviceFacts, Option<Extent>);

/// Every block device of the node, for the inventory when no claim pass runs (no class has a
/// `devices` section): listed from sysfs as a claim pass lists them, but no device is opened,
/// read or probed. Whether one is in use is what the mount table and sysfs say without opening
/// it: it, or a device sharing its data (a partition, its whole disk, another loop device over
/// the same file), is mounted or held by device-mapper, md or LVM. A program holding it open
/// is not seen: that takes the exclusive-open probe of a claim pass.
pub(crate) fn listing(mounts: &MountTable, deadlines: Option<(&Operations, Duration)>) -> Vec<DeviceFacts> {
    let (mut devices, _) = inventory(mounts, deadlines);
    let seen: Vec<Option<String>> = devices.iter().map(|d| seen_in_use(d, &devices, mounts)).collect();
    for (d, in_use) in devices.iter_mut().zip(seen) {
        d.probe.in_use = d.probe.in_use.take().or(in_use);
    }
    devices
}

/// Why `d` is in use as the mount table and sysfs show it (see [`listing`]), if it is.
fn seen_in_use(d: &DeviceFacts, all: &[DeviceFacts], mounts: &MountTable) -> Option<String> {
    let sharing = d.sharing.iter().filter_map(|name| all.iter().find(|o| o.name == *name));
    std::iter::once(d).chain(sharing).find_map(|o| {
        // "in use: mounted at /", "in use: sda1, which shares its data, is mounted at /".
        let which = if o.name == d.name { String::new() } else { format!("{}, which shares its data, is ", o.name) };
        if let Some(m) = mounts.mount_of_device(&o.dev) {
            return Some(format!("{which}mounted at {}", m.mount_point.display()));
        }
        (!o.holders.is_empty()).then(|| format!("{which}held by {} (device-mapper, md or LVM)", o.holders.join(", ")))
    })
}

/// Every block device sysfs lists, with the facts that need no opening of the device but a
/// loop device's status (its stable id and its extent), which the kernel answers with a
/// getattr of the backing file: that blocks while the file's filesystem does not answer (a
/// stopped FUSE daemon, a hung NFS server). So each device's facts are gathered as an
/// operation on the device under its deadline (`deadlines`; the commands gather them as they
/// are). A device whose facts give no answer is listed from sysfs alone, probed and
/// unresponsive: never claimed, and its record keeps its PV as it is (plan_claims). Its extent
/// is unknown, which hides no sharing: only another loop device over the same file shares a
/// loop device's data, and that one's status blocks just the same. The extents are returned
/// too, for the probes to judge sharing without reading them again.
pub(crate) fn inventory(
    mounts: &MountTable,
    deadlines: Option<(&Operations, Duration)>,
) -> (Vec<DeviceFacts>, Extents) {
    let by_id = Arc::new(by_id_names());
    let Ok(rd) = std::fs::read_dir("/sys/class/block") else { return (Vec::new(), Extents::new()) };
    let entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    let table = Arc::new(mounts.clone());
    let timeout = deadlines.map_or(Duration::ZERO, |(_, t)| t);
    let jobs = entries.iter().map(|entry| {
        let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (entry, by_id, table) = (entry.clone(), by_id.clone(), table.clone());
        Job::new(Subject::Device(name), "device facts", timeout, move |on| {
            let d = device_facts(&entry, &by_id, Some(on))?;
            let e = extent(&d.dev, &table.facts(), on);
            Some((d, e))
        })
    });
    let answers: Vec<Answer<Option<Listed>>> = match deadlines {
        Some((ops, _)) => ops.run_each(jobs),
        None => jobs.map(|j| Answer::Done(foreground(j.work))).collect(),
    };
    let unanswered = |entry: &Path, why: String| {
        let d = device_facts(entry, &by_id, None)?;
        let probe = Probe { done: true, in_use: None, content: Content::Unresponsive(why), activity: None };
        Some((DeviceFacts { probe, ..d }, None))
    };
    let mut listed: Vec<Listed> = entries
        .iter()
        .zip(answers)
        .filter_map(|(entry, answer)| match answer {
            Answer::Done(found) => found,
            Answer::Pending => unanswered(entry, "its status is still being read".into()),
            Answer::Unresponsive(e) => unanswered(entry, e.to_string()),
        })
        .collect();
    // In the order people read them: loop2 before loop10.
    listed.sort_by_key(|(d, _)| natural_key(&d.name));
    let (mut devices, extents): (Vec<DeviceFacts>, Vec<Option<Extent>>) = listed.into_iter().unzip();
    // Devices sharing data: same base (disk or backing file), overlapping byte ranges.
    for i in 0..devices.len() {
        let Some(own) = &extents[i] else { continue };
        let sharing: Vec<String> = extents
            .iter()
            .enumerate()
            .filter(|(j, e)| *j != i && e.as_ref().is_some_and(|e| e.overlaps(own)))
            .map(|(j, _)| devices[j].name.clone())
            .collect();
        devices[i].sharing = sharing;
    }
    let extents = devices.iter().zip(extents).map(|(d, e)| (d.dev.clone(), e)).collect();
    (devices, extents)
}

/// `loop10` -> ("loop", 10, ""), so numbered names sort by number.
fn natural_key(name: &str) -> (String, u64, String) {
    let start = name.find(|c: char| c.is_ascii_digit()).unwrap_or(name.len());
    let end = name[start..].find(|c: char| !c.is_ascii_digit()).map_or(name.len(), |e| start + e);
    (name[..start].to_string(), name[start..end].parse().unwrap_or(0), name[end..].to_string())
}

fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The facts of the device at `class_entry`; `on`: a loop device's status may be read (its
/// stable id), else it is left unknown.
fn device_facts(
    class_entry: &Path,
    by_id: &BTreeMap<String, Vec<String>>,
    on: Option<&OnDeadline>,
) -> Option<DeviceFacts> {
    let dir = std::fs::canonicalize(class_entry).ok()?;
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let dev = sysfs_attr(&dir, "dev")?;
    let is_partition = dir.join("partition").exists();
    // A partition's hardware facts are its disk's.
    let hw = if is_partition { dir.parent()?.to_path_buf() } else { dir.clone() };
    let kind = if is_partition {
        DeviceKind::Selectable(DeviceType::Partition)
    } else if dir.join("loop").is_dir() {
        DeviceKind::Selectable(DeviceType::Loop)
    } else if let Some(uuid) = sysfs_attr(&dir, "dm/uuid") {
        if uuid.starts_with("mpath-") {
            DeviceKind::Selectable(DeviceType::Multipath)
        } else {
            DeviceKind::Other(format!("device-mapper ({})", uuid.split('-').next().unwrap_or("dm")))
        }
    } else if dir.join("dm").is_dir() {
        DeviceKind::Other("device-mapper".into())
    } else if dir.join("md").is_dir() {
        DeviceKind::Other("md".into())
    } else if name.starts_with("loop") && dir.join("queue").is_dir() && !dir.join("device").exists() {
        // A loop device with no file attached: nothing to claim.
        DeviceKind::Other("loop (not attached)".into())
    } else if dir.join("device").exists() && !name.starts_with("zram") && !name.starts_with("nbd") {
        DeviceKind::Selectable(DeviceType::Disk)
    } else {
        DeviceKind::Other(name.trim_end_matches(|c: char| c.is_ascii_digit()).to_string())
    };
    let (major, minor) = dev.split_once(':')?;
    let rdev = nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?);
    // A loop device's id needs its status ioctl: a read-only open, never O_EXCL. A partition of
    // one answers it for its disk.
    let loop_backed =
        matches!(kind, DeviceKind::Selectable(DeviceType::Loop)) || (is_partition && hw.join("loop").is_dir());
    let node = (loop_backed && on.is_some()).then(|| open_device(rdev, None)).flatten();
    let (stable, _) = stable_id(rdev, node.as_ref());
    let flag = |rel: &str| sysfs_attr(&dir, rel).is_some_and(|v| v == "1");
    Some(DeviceFacts {
        parent: is_partition.then(|| hw.file_name().map(|n| n.to_string_lossy().into_owned())).flatten(),
        size: sysfs_attr(&dir, "size").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0).saturating_mul(512),
        read_only: flag("ro"),
        // A USB disk often says it is not removable; anyone can plug one in all the same.
        removable: sysfs_attr(&hw, "removable").is_some_and(|v| v == "1") || on_usb(&hw),
        hidden: flag("hidden"),
        rotational: sysfs_attr(&hw, "queue/rotational").map(|v| v == "1"),
        model: sysfs_attr(&hw, "device/model"),
        vendor: sysfs_attr(&hw, "device/vendor"),
        stable_id: stable,
        by_id: by_id.get(&dev).cloned().unwrap_or_default(),
        partitions: list_dir(&dir).into_iter().filter(|n| dir.join(n).join("partition").exists()).collect(),
        holders: list_dir(&dir.join("holders")),
        sharing: Vec::new(),
        probe: Probe::default(),
        full_read: FullRead::default(),
        kind: Some(kind),
        name,
        dev,
    })
}

/// Whether the device hangs off a USB bus (its sysfs device path goes through one).
fn on_usb(sys_dir: &Path) -> bool {
    std::fs::canonicalize(sys_dir.join("device"))
        .is_ok_and(|p| p.components().any(|c| c.as_os_str().to_string_lossy().starts_with("usb")))
}

/// `major:minor` -> the /dev/disk/by-id names leading to that device.
fn by_id_names() -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let dir = Path::new("/dev/disk/by-id");
    for name in list_dir(dir) {
        if let Ok(meta) = std::fs::metadata(dir.join(&name))
            && meta.file_type().is_block_device()
        {
            out.entry(device_number(meta.rdev())).or_default().push(name);
        }
    }
    out
}

/// Opens the device's node for the probe, only when the node in /dev is that very device.
fn device_node(device: &DeviceFacts) -> Option<PathBuf> {
    let node = PathBuf::from(format!("/dev/{}", device.name));
    let meta = std::fs::metadata(&node).ok()?;
    (meta.file_type().is_block_device() && device_number(meta.rdev()) == device.dev).then_some(node)
}

/// Attempts of a probe that found the device open exclusively: another brief probe (the
/// `disks` command, say) holds it for a moment only, so it is asked again before the device
/// counts as in use.
const BUSY_ATTEMPTS: u32 = 3;
/// Pause between those attempts.
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(30);

/// The probe of one candidate: in use (it or anything sharing its data mounted, held or
/// open exclusively), used without a claim (its I/O counters moving over the probe window)
/// and, when none of these, what it holds where `reach` says to read (or `cached`, a read
/// remembered from an earlier pass). A process holding it open is the caller's to add (see
/// [`plan_claims`]). An exclusive holder is asked about again a few times, so two brief probes
/// that meet do not report each other.
pub(crate) fn probe(
    device: &DeviceFacts,
    mounts: &MountTable,
    facts: &[MountFacts<'_>],
    extents: &Extents,
    reach: &Reach,
    cached: Option<&Content>,
    on: &OnDeadline,
) -> Probe {
    let mut attempt = 1;
    loop {
        let found = probe_once(device, mounts, facts, extents, reach, cached, on);
        let busy = matches!(found.content, Content::Busy)
            || found.in_use.as_deref().is_some_and(|why| why.contains("open exclusively"));
        if !busy || attempt >= BUSY_ATTEMPTS {
            return found;
        }
        attempt += 1;
        std::thread::sleep(BUSY_PAUSE);
    }
}

fn probe_once(
    device: &DeviceFacts,
    mounts: &MountTable,
    facts: &[MountFacts<'_>],
    extents: &Extents,
    reach: &Reach,
    cached: Option<&Content>,
    on: &OnDeadline,
) -> Probe {
    let Some(node) = device_node(device) else {
        let content = Content::Unreadable(format!("/dev/{} is not the device {}", device.name, device.dev));
        return Probe { done: true, in_use: None, content, activity: None };
    };
    let before = writers::io_stat(&device.name);
    let in_use = match block_device_in_use(&node, mounts, facts, Some(extents), on) {
        Ok(v) => v,
        Err(e) => {
            return Probe { done: true, in_use: None, content: Content::Unreadable(e.to_string()), activity: None };
        }
    };
    if in_use.is_some() {
        return Probe { done: true, in_use, content: Content::NotProbed, activity: None };
    }
    let content = match cached {
        Some(content) => content.clone(),
        None => match device_content::probe_content_with(&node, reach) {
            Ok(ContentProbe::Busy) => Content::Busy,
            Ok(ContentProbe::Read { content: Found::Blank, .. }) => Content::Blank,
            Ok(ContentProbe::Read { content: Found::Data { offset }, .. }) => Content::NotBlank(format!(
                "data at byte {} with no signature this agent recognises",
                offset_text(offset)
            )),
            Ok(ContentProbe::Read { content, .. }) => Content::NotBlank(content.to_string()),
            Err(e) => Content::Unreadable(e.to_string()),
        },
    };
    // Our reads have completed: any write, discard or flush in the window, or any request
    // still in flight, is someone else's.
    let after = writers::io_stat(&device.name);
    let counted = match (before, after) {
        (Some(b), Some(a)) => written_between(&b, &a),
        _ => Some(format!("the I/O counters of {} cannot be read", device.name)),
    };
    Probe { done: true, in_use: None, content, activity: counted }
}

/// Whether `o` holds `device` or a device sharing its data, or the backing file of one of them
/// (an opener of a file is named after the first loop device over it, which may be the other).
fn concerns(device: &DeviceFacts, o: &Opener) -> bool {
    o.what == device.name || device.sharing.contains(&o.what)
}

/// What to look for in the processes' descriptors for `devices`: each device, the devices
/// sharing its data, and the backing file of every loop device among them.
fn wanted_for<'a>(
    devices: impl Iterator<Item = &'a DeviceFacts>,
    all: &[DeviceFacts],
    deadlines: Option<(&Operations, Duration)>,
) -> Result<Wanted, String> {
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for d in devices {
        names.insert(&d.name);
        names.extend(d.sharing.iter().map(String::as_str));
    }
    let targets: Vec<(String, String)> =
        all.iter().filter(|d| names.contains(d.name.as_str())).map(|d| (d.dev.clone(), d.name.clone())).collect();
    // A loop device's backing file comes from its status, which blocks while the file's
    // filesystem does not answer: read under the scan's deadline (no answer proves no device
    // unused).
    let tag = format!("{targets:?}");
    let work = move |on: &OnDeadline| Wanted::devices(targets.iter().map(|(d, n)| (d.as_str(), n.as_str())), on);
    let Some((ops, timeout)) = deadlines else { return Ok(foreground(work)) };
    match ops.run_all(vec![Job::new(WRITER_SCAN, "scan targets", timeout, work).tagged(tag)]).pop() {
        Some(Answer::Done(wanted)) => Ok(wanted),
        Some(Answer::Unresponsive(e)) => Err(e.to_string()),
        _ => Err("the status of the loop devices to scan for is still being read".to_string()),
    }
}

/// How the agent runs the claim pass's host operations (host::ops), and the classes whose
/// discovery directory did not answer this pass (not scanned: no device is claimed meanwhile).
#[derive(Clone, Copy)]
pub(crate) struct Deadlines<'a> {
    /// The pool of per-volume operations.
    pub ops: &'a Operations,
    /// Each operation's deadline.
    pub timeout: Duration,
    /// Classes left out of this pass.
    pub unanswered: &'a [String],
}

/// The discovery directories that are safe to scan (see discovery::check_roots), by class.
pub(crate) fn roots(config: &ProvisionerConfig, facts: &[MountFacts<'_>]) -> BTreeMap<String, PathBuf> {
    let (roots, _) = crate::host::volumes::discovery::check_roots(config, facts);
    roots.into_iter().map(|r| (r.class, r.resolved)).collect()
}

/// Every entry of every scannable discovery directory, with what block device it leads to.
/// With `deadlines`, each entry is looked at on the pool of per-volume operations (a mount
/// point of a hung filesystem blocks even `lstat`): one that does not answer keeps its name
/// (taken) and leads to no device. That is exact, not a guess: `lstat` of a symlink or a device
/// node never reaches a disk, so only a mount point can hang, and a mounted disk is in use.
pub(crate) fn entries(
    roots: &BTreeMap<String, PathBuf>,
    config: &ProvisionerConfig,
    deadlines: Option<(&Operations, Duration)>,
) -> Vec<DirEntry> {
    let mut out = Vec::new();
    for (class, root) in roots {
        let names = list_dir(root);
        let look = |name: &String| {
            let (path, class, name) = (root.join(name), class.clone(), name.clone());
            move |_on: &OnDeadline| {
                let Ok(lmeta) = std::fs::symlink_metadata(&path) else { return None };
                let link = lmeta
                    .file_type()
                    .is_symlink()
                    .then(|| std::fs::read_link(&path).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default());
                let device = std::fs::metadata(&path)
                    .ok()
                    .filter(|m| m.file_type().is_block_device())
                    .and_then(|m| kernel_name(m.rdev()));
                Some(DirEntry { unanswered: false, class, name, link, device })
            }
        };
        let found: Vec<Option<DirEntry>> = match deadlines {
            // `local-static-provisioner disks`, an operator's command in a terminal: no deadline.
            None => names.iter().map(|n| foreground(look(n))).collect(),
            Some((ops, timeout)) => {
                let host_dir = config.storage_class_map.get(class).map(|c| c.host_dir.clone()).unwrap_or_default();
                let jobs = names
                    .iter()
                    .map(|n| {
                        Job::new(
                            Subject::Volume(crate::core::volumes::pv::host_path(&host_dir, n)),
                            "inspection",
                            timeout,
                            look(n),
                        )
                    })
                    .collect();
                ops.run_all(jobs)
                    .into_iter()
                    .zip(&names)
                    .map(|(answer, name)| match answer {
                        Answer::Done(entry) => entry,
                        // There, but what it is is not known: never taken for not being our link.
                        Answer::Pending | Answer::Unresponsive(_) => Some(DirEntry {
                            unanswered: true,
                            class: class.clone(),
                            name: name.clone(),
                            link: None,
                            device: None,
                        }),
                    })
                    .collect()
            }
        };
        out.extend(found.into_iter().flatten());
    }
    out
}

fn kernel_name(rdev: u64) -> Option<String> {
    let sys = format!("/sys/dev/block/{}", device_number(rdev));
    Some(std::fs::canonicalize(sys).ok()?.file_name()?.to_string_lossy().into_owned())
}

/// What the claim pass needs from the API side: this node's PVs and the disks they recorded.
pub(crate) fn claim_classes(config: &ProvisionerConfig) -> Vec<ClassClaims> {
    config
        .storage_class_map
        .iter()
        .map(|(class, c)| ClassClaims {
            class: class.clone(),
            host_dir: c.host_dir.clone(),
            name_pattern: c.name_pattern.clone(),
            selector: c.devices.clone(),
        })
        .collect()
}

/// This node's PVs as the claim rules see them: the disk each recorded, for a path this agent
/// can see that is a block device (an upstream PV of a link under /dev) that device, and
/// whether it is unbound (its host path in `unbound`).
pub(crate) fn pv_disks(pvs: &[(String, Option<String>)], unbound: &BTreeSet<String>) -> Vec<PvDisk> {
    pvs.iter()
        .map(|(host_path, identity)| PvDisk {
            host_path: host_path.clone(),
            // A loop id of an earlier version, in the current format (its `backing` gives the
            // device number it lacks), so the claim rules compare it with the ids found now.
            disk: identity
                .as_deref()
                .and_then(crate::core::identity::disk_identity::DiskIdentity::parse)
                .and_then(|id| id.loop_key().and_then(|k| k.render()).or(id.disk)),
            // Only a path under /dev is looked at: any other is a volume's, whose filesystem may
            // not answer (a stat there would hold the claim pass outside any deadline).
            device: Some(host_path)
                .filter(|p| p.starts_with("/dev/"))
                .and_then(|p| std::fs::metadata(p).ok())
                .filter(|m| m.file_type().is_block_device())
                .and_then(|m| kernel_name(m.rdev())),
            unbound: unbound.contains(host_path),
        })
        .collect()
}

/// Gathers the world, probes the candidates, and plans (core::devices::device_claim::plan). `pvs`:
/// this node's PVs, or `None` when they are unknown (the commands, with no cluster).
/// `memory`: what the agent's earlier passes saw (see [`ClaimMemory`]); `None` for the
/// commands.
/// `verifier`: where each disk's full read stands, and who runs the ones a class asks for.
///
/// A device this agent claimed (it has a record) is probed in its signature areas only: it is
/// checked before it is published again after a release, and the quick wipe zeroes exactly
/// those. A held one is probed over its whole surface: its hold is lifted only once it proves
/// as blank as a new claim. Any other candidate is probed over its whole surface (core::devices::surface).
pub(crate) fn plan_claims(
    config: &ProvisionerConfig,
    records: Vec<ClaimRecord>,
    pvs: Option<Vec<PvDisk>>,
    mounts: &MountTable,
    mut memory: Option<&mut ClaimMemory>,
    verifier: Option<&Verifier>,
    deadlines: Option<Deadlines<'_>>,
) -> (Vec<DeviceFacts>, ClaimPlan) {
    let unanswered = deadlines.map_or(&[][..], |d| d.unanswered);
    let deadlines = deadlines.map(|d| (d.ops, d.timeout));
    let facts = mounts.facts();
    let roots = roots(config, &facts);
    let (devices, extents) = inventory(mounts, deadlines);
    let extents = Arc::new(extents);
    let mut world = World {
        classes: claim_classes(config).into_iter().filter(|c| roots.contains_key(&c.class)).collect(),
        devices,
        entries: entries(&roots, config, deadlines),
        records,
        pvs_known: pvs.is_some(),
        pvs: pvs.unwrap_or_default(),
        unscanned: config
            .storage_class_map
            .keys()
            .filter(|c| !roots.contains_key(*c))
            .chain(unanswered)
            .cloned()
            .collect(),
        host_processes_unseen: writers::host_processes().err(),
    };
    // Loop ids recorded by earlier versions (by path) as the devices report them now, so an
    // old record or PV still finds its device.
    let present: Vec<String> = world.devices.iter().filter_map(|d| d.stable_id.clone()).collect();
    let now = |id: &str| current_loop_id(id, None, present.iter().map(String::as_str));
    for r in &mut world.records {
        r.disk = now(&r.disk);
    }
    for pv in &mut world.pvs {
        pv.disk = pv.disk.as_deref().map(now);
    }
    // A device whose facts gave no answer (a loop device over a file of a filesystem that
    // stopped answering) has no stable id of its own: the one record linking to it lends its
    // disk, so that record keeps its PV as it is (core::devices::device_claim: an unresponsive device
    // proves nothing either way) instead of counting as gone. Never claimed, probed or
    // published meanwhile: its probe is done and unresponsive.
    for d in world
        .devices
        .iter_mut()
        .filter(|d| d.stable_id.is_none() && matches!(d.probe.content, Content::Unresponsive(_)))
    {
        let node = format!("/dev/{}", d.name);
        let mut linked = world.records.iter().filter(|r| r.target == node);
        if let (Some(r), None) = (linked.next(), linked.next()) {
            d.stable_id = Some(r.disk.clone());
        }
    }
    // The devices of unbound PVs, by kernel name, with their PV's path.
    let unbound: BTreeMap<String, String> = world
        .records
        .iter()
        .filter(|r| world.pvs.iter().any(|pv| pv.host_path == r.host_path && pv.unbound))
        .filter_map(|r| {
            let mut with_id = world.devices.iter().filter(|d| d.stable_id.as_deref() == Some(r.disk.as_str()));
            match (with_id.next(), with_id.next()) {
                (Some(d), None) => Some((d.name.clone(), r.host_path.clone())),
                _ => None,
            }
        })
        .collect();
    if let Some(m) = memory.as_deref_mut() {
        m.retain(|path| unbound.values().any(|p| p == path), &world.devices);
        for d in world.devices.iter_mut().filter(|d| unbound.contains_key(&d.name)) {
            let path = &unbound[&d.name];
            d.probe.activity = m.check(path, &d.name);
        }
    }
    let first = plan(&world);
    if first.to_probe.is_empty() {
        return (world.devices, first);
    }
    let wanted =
        wanted_for(world.devices.iter().filter(|d| first.to_probe.contains(&d.name)), &world.devices, deadlines);
    let first_scan = wanted.as_ref().map_err(Clone::clone).and_then(|w| scan_openers(w, deadlines));
    let scanned = Instant::now();
    // Each device is probed under its own deadline (host::ops): a wedged one is refused as
    // unresponsive and the others are judged as usual.
    let shared = Arc::new(mounts.clone());
    let mut prepared = Vec::new();
    for d in world.devices.iter_mut().filter(|d| first.to_probe.contains(&d.name)) {
        let ours = d.stable_id.as_ref().is_some_and(|id| world.records.iter().any(|r| r.disk == *id));
        let held =
            d.stable_id.as_ref().is_some_and(|id| world.records.iter().any(|r| r.disk == *id && r.held.is_some()));
        let data_at = verifier.zip(d.stable_id.as_deref()).and_then(|(v, id)| v.data_at(id, d.size));
        let reach = Reach {
            areas_only: ours && !held,
            rotational: d.rotational,
            extra: data_at.map(|at| (at, WINDOW)).into_iter().collect(),
        };
        let since_last_pass = d.probe.activity.take();
        // A surface read is not repeated while the device's write counters stand still.
        let surface = !reach.areas_only && reach.extra.is_empty() && !is_loop(d);
        let counters = writers::io_stat(&d.name);
        let cached = match (surface, &memory) {
            (true, Some(m)) => m.surface_of(d, counters.as_ref()),
            _ => None,
        };
        prepared.push((d.name.clone(), reach, since_last_pass, surface, counters, cached));
    }
    let jobs: Vec<Job<Probe>> = prepared
        .iter()
        .filter_map(|(name, reach, _, _, _, cached)| {
            let d = world.devices.iter().find(|d| d.name == *name)?.clone();
            let (mounts, reach, cached) = (shared.clone(), reach.clone(), cached.clone());
            // A rotational disk's surface read takes seconds: its deadline is longer.
            let timeout =
                deadlines.map_or(Duration::ZERO, |(_, t)| if d.rotational == Some(true) { t * 6 } else { t * 3 });
            let subject = Subject::Device(d.name.clone());
            let extents = extents.clone();
            Some(Job::new(subject, "probe", timeout, move |on| {
                probe(&d, &mounts, &mounts.facts(), &extents, &reach, cached.as_ref(), on)
            }))
        })
        .collect();
    let probes: Vec<Answer<Probe>> = match deadlines {
        Some((ops, _)) => ops.run_all(jobs),
        None => jobs.into_iter().map(|j| Answer::Done(foreground(j.work))).collect(),
    };
    for ((name, _, since_last_pass, surface, counters, cached), found) in prepared.into_iter().zip(probes) {
        let Some(d) = world.devices.iter_mut().find(|d| d.name == name) else { continue };
        d.probe = match found {
            Answer::Done(p) => p,
            // Still reading (a rotational disk's surface): not probed yet, its answer is kept.
            Answer::Pending => Probe::default(),
            Answer::Unresponsive(e) => {
                Probe { done: true, in_use: None, content: Content::Unresponsive(e.to_string()), activity: None }
            }
        };
        let answered = !matches!(d.probe.content, Content::Unresponsive(_));
        if let (true, true, None, Some(m), Some(c)) = (answered, surface, &cached, memory.as_deref_mut(), counters) {
            m.remember_surface(d, c);
        }
        d.probe.activity = since_last_pass.or(d.probe.activity.take());
        if let (Some(v), Some(id)) = (verifier, &d.stable_id) {
            d.full_read = v.status(id, &d.name, d.size, d.probe.content == Content::Blank);
        }
    }
    // A process that holds a device open across two scans uses it; one seen once only opened
    // it for a moment (another probe: the `disks` command, udev's blkid). A scan that gives no
    // answer proves no device unused.
    let stable = first_scan.and_then(|openers| {
        let wanted = wanted.as_ref().map_err(Clone::clone)?;
        writers::still_open(openers, wanted, scanned, OPENER_PAUSE, |w| scan_openers(w, deadlines))
    });
    let unseen = world.host_processes_unseen.is_some();
    let probed = world.devices.iter_mut().filter(|d| first.to_probe.contains(&d.name));
    match stable {
        Ok(stable) => {
            for d in probed.filter(|d| d.probe.activity.is_none()) {
                let mine: Vec<Opener> = stable.iter().filter(|o| concerns(d, o)).cloned().collect();
                d.probe.activity = opened_by_others(&mine);
            }
        }
        // No scan without the host's processes: the planner refuses every candidate for that
        // by itself (Refusal::HostProcessesUnseen), whatever the probe found.
        Err(_) if unseen => {}
        Err(why) => probed.for_each(|d| unproven_unused(&mut d.probe, &why)),
    }
    let second = plan(&world);
    // Full reads asked for by a class's verify: full and not started yet, or whose kept proof
    // no longer holds.
    if let Some(v) = verifier {
        for decision in &second.decisions {
            let Verdict::Refused(Refusal::Verifying(_)) = decision.verdict else { continue };
            let Some(d) = world.devices.iter().find(|d| d.name == decision.device) else { continue };
            if let (FullRead::Unknown | FullRead::Void(_), Some(disk)) = (&d.full_read, &d.stable_id) {
                v.request(FullReadJob { name: d.name.clone(), dev: d.dev.clone(), disk: disk.clone(), size: d.size });
            }
        }
    }
    (world.devices, second)
}

/// The subject of the scan of every process's open descriptors (host::devices::writers::openers).
const WRITER_SCAN: Subject = Subject::Host("writer scan");

/// The scan of every process's descriptors for `wanted` (host::devices::writers::openers): one
/// descriptor on a file of a hung network or FUSE filesystem may hold it, so the agent runs it
/// as an operation on the whole host under its deadline (`deadlines`; the commands, which have
/// none, run it as is). `Err`: why there is no answer (still running: its answer is kept for
/// the next pass; or the scan does not answer; or the agent does not see the host's
/// processes, writers::host_processes, which the planner refuses claims for by itself).
fn scan_openers(wanted: &Wanted, deadlines: Option<(&Operations, Duration)>) -> Result<Vec<Opener>, String> {
    // Only the host's processes can show that none holds the device: without them (a pod
    // without hostPID) the scan proves nothing, and no device is claimed.
    writers::host_processes()?;
    let Some((ops, timeout)) = deadlines else { return Ok(foreground(|on| writers::openers(wanted, on))) };
    let tag = format!("{:?}", (&wanted.devices, &wanted.files));
    let wanted = wanted.clone();
    let job = Job::new(WRITER_SCAN, "scan", timeout, move |on| writers::openers(&wanted, on)).tagged(tag);
    match ops.run_all(vec![job]).pop() {
        Some(Answer::Done(openers)) => Ok(openers),
        Some(Answer::Unresponsive(e)) => Err(e.to_string()),
        _ => Err("the scan of the processes' open descriptors is still running".to_string()),
    }
}

/// A probed device that the scan of open descriptors could not clear (`why`): not proven
/// unused, so it is taken as not answering (never claimed; a recorded one is held with its PV
/// as it is, core::devices::device_claim), unless the probe already found it in use or written to,
/// which stands.
fn unproven_unused(probe: &mut Probe, why: &str) {
    if probe.in_use.is_some() || probe.activity.is_some() || matches!(probe.content, Content::Unresponsive(_)) {
        return;
    }
    probe.content = Content::Unresponsive(format!("not proven unused: {why}"));
}

/// The least time between the two scans of the processes' descriptors (see [`plan_claims`]).
const OPENER_PAUSE: Duration = Duration::from_millis(250);

/// What the agent's earlier claim passes saw, kept between passes by the agent (the commands
/// start afresh), pruned every pass so it never outgrows the node's devices:
/// - the I/O counters of the devices of unbound PVs, by PV path and device: a write between two
///   passes is a writer's, since no tenant has the disk;
/// - the surface read of each candidate, by device, with the write counters it was read at: a
///   device refused for another reason (maxPerNode, a name taken, a full read under way) is not
///   read again on every pass while nothing was written to it. Loop devices are read every time
///   (their backing file can be written without their counters moving).
#[derive(Debug, Default)]
pub(crate) struct ClaimMemory {
    seen: BTreeMap<String, (String, IoStat)>,
    surfaces: BTreeMap<String, SurfaceSeen>,
}

/// One remembered surface read.
#[derive(Debug, Clone)]
struct SurfaceSeen {
    stable_id: Option<String>,
    size: u64,
    counters: IoStat,
    content: Content,
}

/// Whether `d` is a loop device (or a partition of one).
fn is_loop(d: &DeviceFacts) -> bool {
    matches!(d.kind, Some(DeviceKind::Selectable(DeviceType::Loop)))
        || d.stable_id.as_deref().is_some_and(|id| id.starts_with("loop:"))
}

/// The write counters are the same: nothing was written, discarded or flushed since.
fn unwritten(a: &IoStat, b: &IoStat) -> bool {
    (a.writes, a.write_sectors, a.discards, a.flushes) == (b.writes, b.write_sectors, b.discards, b.flushes)
}

impl ClaimMemory {
    /// Keeps only the PV paths `keep` accepts, and the surface reads of devices still there.
    fn retain(&mut self, keep: impl Fn(&str) -> bool, devices: &[DeviceFacts]) {
        self.seen.retain(|path, _| keep(path));
        self.surfaces.retain(|name, s| {
            devices.iter().any(|d| d.name == *name && d.stable_id == s.stable_id && d.size == s.size)
        });
    }

    /// The remembered surface content of `d`, when it is the same device (stable id, size) and
    /// its write counters (`now`) have not moved since it was read.
    fn surface_of(&self, d: &DeviceFacts, now: Option<&IoStat>) -> Option<Content> {
        let s = self.surfaces.get(&d.name)?;
        let same = s.stable_id == d.stable_id && s.size == d.size && now.is_some_and(|n| unwritten(&s.counters, n));
        same.then(|| s.content.clone())
    }

    /// Remembers the surface read of `d` made at `counters`, when it settled something (not a
    /// device in use or written to during the read, whose content is about to change).
    fn remember_surface(&mut self, d: &DeviceFacts, counters: IoStat) {
        let settled = d.probe.in_use.is_none()
            && d.probe.activity.is_none()
            && matches!(d.probe.content, Content::Blank | Content::NotBlank(_));
        if settled {
            let seen = SurfaceSeen {
                stable_id: d.stable_id.clone(),
                size: d.size,
                counters,
                content: d.probe.content.clone(),
            };
            self.surfaces.insert(d.name.clone(), seen);
        } else {
            self.surfaces.remove(&d.name);
        }
    }

    /// What happened on device `name` (the disk of the PV at `path`) since the last pass:
    /// writes, discards, flushes or writes in flight. The first reading (or one of another
    /// device at that path) only sets the baseline; an unreadable one is a doubt reported.
    fn check(&mut self, path: &str, name: &str) -> Option<String> {
        let Some(now) = writers::io_stat_writes_in_flight(name) else {
            self.seen.remove(path);
            return Some(format!("the I/O counters of {name} cannot be read"));
        };
        let found = match self.seen.get(path) {
            Some((dev, before)) if dev == name => {
                written_between(before, &now).map(|w| format!("since the last check, {w}"))
            }
            _ => None,
        };
        if found.is_none() {
            self.seen.insert(path.to_string(), (name.to_string(), now));
        }
        found
    }

    /// Kernel names of the devices of unbound PVs followed now: a write to one is worth a pass
    /// at once (host::mounts::watch).
    pub(crate) fn watched_names(&self) -> BTreeSet<String> {
        self.seen.values().map(|(name, _)| name.clone()).collect()
    }
}

/// Marks the record of the link at `host_path` held for `why` (after its unbound PV was
/// withdrawn for it), so the hold survives a restart. A record already gone is left so.
pub(crate) fn hold_record(state_dir: &Path, host_path: &str, why: &str) -> Result<(), ClaimError> {
    let mut records = read_records(state_dir)?;
    let Some(r) = records.iter_mut().find(|r| r.host_path == host_path) else { return Ok(()) };
    if r.held.as_deref() == Some(why) {
        return Ok(());
    }
    r.held = Some(why.to_string());
    write_records(state_dir, &records)
}

/// The links to hold back while the records cannot be read: which links are the agent's is
/// unknown then, so no symlink in a class with a `devices` section is published unless its PV
/// exists (a link the agent made could lead to a device that shows someone's data).
pub(crate) fn hold_unknown_links(
    config: &ProvisionerConfig,
    pv_paths: &[String],
    mounts: &MountTable,
    why: &str,
    deadlines: Option<(&Operations, Duration)>,
) -> Vec<(String, String, String)> {
    let facts = mounts.facts();
    let mut roots = roots(config, &facts);
    roots.retain(|class, _| config.storage_class_map.get(class).is_some_and(|c| c.devices.is_some()));
    entries(&roots, config, deadlines)
        .into_iter()
        .filter(|e| e.link.is_some())
        .filter(|e| {
            let host_dir = config.storage_class_map.get(&e.class).map(|c| c.host_dir.as_str()).unwrap_or_default();
            !pv_paths.contains(&crate::core::volumes::pv::host_path(host_dir, &e.name))
        })
        .map(|e| (e.class, e.name, format!("a link in a class that claims devices, while {why}")))
        .collect()
}

/// Carries out the link changes of a plan in the class directories, keeping the records in
/// step (written before a link is made, after one is removed). Returns each change's outcome.
pub(crate) fn apply(
    config: &ProvisionerConfig,
    state_dir: &Path,
    records: &mut Vec<ClaimRecord>,
    actions: &[LinkAction],
) -> Vec<(LinkAction, Result<(), String>)> {
    let mut out = Vec::new();
    for action in actions {
        let result = apply_one(config, state_dir, records, action).map_err(|e| e.to_string());
        out.push((action.clone(), result));
    }
    out
}

fn apply_one(
    config: &ProvisionerConfig,
    state_dir: &Path,
    records: &mut Vec<ClaimRecord>,
    action: &LinkAction,
) -> Result<(), ClaimError> {
    // A change of this link that a crash interrupted is settled first (see settle_private).
    match action {
        LinkAction::Release(_) => {}
        LinkAction::Forget(r) => {
            if let Ok(dir) = class_dir(config, &r.class) {
                settle_private(&dir, r)?;
            }
        }
        LinkAction::Create(r) | LinkAction::Relink(r) | LinkAction::Retarget(r) | LinkAction::Remove(r) => {
            settle_private(&class_dir(config, &r.class)?, r)?;
        }
    }
    match action {
        LinkAction::Forget(r) => forget(state_dir, records, r),
        LinkAction::Release(r) => keep(state_dir, records, r.clone()),
        LinkAction::Create(r) | LinkAction::Relink(r) => {
            let dir = class_dir(config, &r.class)?;
            keep(state_dir, records, r.clone())?;
            if let Err(e) = rustix::fs::symlinkat(r.target.as_str(), &dir.fd, r.name.as_str()) {
                // Something took the name meanwhile: it is not ours, so neither is the record.
                forget(state_dir, records, r)?;
                return Err(io("creating the link", &dir.path.join(&r.name), e));
            }
            Ok(())
        }
        LinkAction::Retarget(r) => {
            let dir = class_dir(config, &r.class)?;
            let path = dir.path.join(&r.name);
            let now = link_text(&dir.fd, &r.name, &path)?;
            if Some(now.as_str()) != r.previous.as_deref() && now != r.target {
                forget(state_dir, records, r)?;
                return Err(ClaimError::NotOurs {
                    path,
                    message: format!("points at {now:?}, which this agent did not write; left in place"),
                });
            }
            // The record first, naming both targets: a crash before the new link is in place
            // leaves a link the record still calls ours.
            keep(state_dir, records, r.clone())?;
            match retarget(&dir, r)? {
                Swapped::Done => keep(state_dir, records, ClaimRecord { previous: None, ..r.clone() }),
                Swapped::NotOurs(message) => {
                    forget(state_dir, records, r)?;
                    Err(ClaimError::NotOurs { path, message })
                }
            }
        }
        LinkAction::Remove(r) => {
            let dir = class_dir(config, &r.class)?;
            let path = dir.path.join(&r.name);
            let now = link_text(&dir.fd, &r.name, &path)?;
            if now != r.target {
                // Changed by someone else since we made it: theirs now, left alone.
                forget(state_dir, records, r)?;
                return Err(ClaimError::NotOurs {
                    path,
                    message: format!("points at {now:?}, not {:?} as recorded; left in place", r.target),
                });
            }
            match remove(&dir, r)? {
                Swapped::Done => forget(state_dir, records, r),
                Swapped::NotOurs(message) => {
                    forget(state_dir, records, r)?;
                    Err(ClaimError::NotOurs { path, message })
                }
            }
        }
    }
}

// Checking a link and then changing it by its name would change whatever is at the name by
// then: an operator's link swapped in between would be removed or replaced. So the link is
// first moved, atomically, to a name private to this agent in the same directory (a rename
// within one directory moves exactly the entry there at that instant), and what was moved is
// checked there, where no one else changes it: ours, it goes; not ours, it is put back. A new
// link replaces the old one by an atomic exchange (RENAME_EXCHANGE), so the name never goes
// missing for kubelet; what the exchange took out is checked the same way, and swapped back
// when it is not ours. A crash midway leaves the private name, which the next change of that
// link settles first (see [`settle_private`]).

/// What moving a link out of the way found.
enum Swapped {
    /// It was ours, and the change is made.
    Done,
    /// It was not ours: put back where it was, and why.
    NotOurs(String),
}

/// The private name of the link `name` while it is changed: a dot first, so never a name the
/// claim rules give out, and always the same for one link, so a crash leaves it where the next
/// change of that link finds it.
fn private_name(name: &str) -> String {
    // FNV-1a: stable across builds and short whatever the link's name.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!(".lsp-claim-{hash:016x}")
}

/// What is at a name of a class directory (not followed).
#[derive(Debug, PartialEq, Eq)]
enum At {
    Nothing,
    Link(String),
    /// A directory, a file, a device node...
    Other,
}

fn what_is(dir: &ClassDir, name: &str) -> Result<At, ClaimError> {
    let path = dir.path.join(name);
    match rustix::fs::statat(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => Ok(At::Nothing),
        Err(e) => Err(io("stat", &path, e)),
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink => {
            let text =
                rustix::fs::readlinkat(&dir.fd, name, Vec::new()).map_err(|e| io("reading the link", &path, e))?;
            Ok(At::Link(text.to_string_lossy().into_owned()))
        }
        Ok(_) => Ok(At::Other),
    }
}

/// Whether `at` is the link the record `r` says this agent wrote (to its target, or to the
/// one it had before a re-pointing).
fn recorded(r: &ClaimRecord, at: &At) -> bool {
    matches!(at, At::Link(t) if *t == r.target || Some(t.as_str()) == r.previous.as_deref())
}

fn rename(dir: &ClassDir, from: &str, to: &str, flags: rustix::fs::RenameFlags) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(&dir.fd, from, &dir.fd, to, flags)
}

/// A private name left by a change that did not finish (a crash) is settled before the link
/// is changed again: this agent's own link there is removed; anything else was moved out of
/// the link's name and is put back, unless the name is taken again (then it is left, and the
/// link not changed, for an operator to look at).
fn settle_private(dir: &ClassDir, r: &ClaimRecord) -> Result<(), ClaimError> {
    let private = private_name(&r.name);
    let at = dir.path.join(&private);
    let found = what_is(dir, &private)?;
    if found == At::Nothing {
        return Ok(());
    }
    if recorded(r, &found) {
        return rustix::fs::unlinkat(&dir.fd, private.as_str(), AtFlags::empty()).map_err(|e| io("unlinking", &at, e));
    }
    match rename(dir, &private, &r.name, rustix::fs::RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) => Err(ClaimError::NotOurs {
            path: at,
            message: format!(
                "was moved out of {} by a link change that did not finish, and cannot be put back ({e}); \
                 move it back or remove it",
                r.name
            ),
        }),
    }
}

/// Removes the link `r` names, only if what is at its name at the instant it is moved is ours
/// (the private name is free: [`apply_one`] settled it).
fn remove(dir: &ClassDir, r: &ClaimRecord) -> Result<Swapped, ClaimError> {
    let (path, private) = (dir.path.join(&r.name), private_name(&r.name));
    between_check_and_change(&path);
    rename(dir, &r.name, &private, rustix::fs::RenameFlags::NOREPLACE).map_err(|e| io("moving aside", &path, e))?;
    let moved = what_is(dir, &private)?;
    if recorded(r, &moved) {
        let at = dir.path.join(&private);
        rustix::fs::unlinkat(&dir.fd, private.as_str(), AtFlags::empty()).map_err(|e| io("unlinking", &at, e))?;
        return Ok(Swapped::Done);
    }
    // Put back (unless an operator's new link took the name meanwhile: that one is kept, and
    // the error says where the moved one is).
    settle_private(dir, r)?;
    Ok(Swapped::NotOurs(format!(
        "{} was swapped in meanwhile, which this agent did not write; left in place",
        shown(moved)
    )))
}

/// Points the link `r` names at its new target, only if what the new link replaces at the
/// instant of the exchange is ours (the private name is free: [`apply_one`] settled it).
fn retarget(dir: &ClassDir, r: &ClaimRecord) -> Result<Swapped, ClaimError> {
    use rustix::fs::RenameFlags;
    let (path, private) = (dir.path.join(&r.name), private_name(&r.name));
    let at = dir.path.join(&private);
    rustix::fs::symlinkat(r.target.as_str(), &dir.fd, private.as_str()).map_err(|e| io("creating the link", &at, e))?;
    between_check_and_change(&path);
    if let Err(e) = rename(dir, &private, &r.name, RenameFlags::EXCHANGE) {
        // Nothing was exchanged: the new link goes, and the name is as it was.
        let _ = rustix::fs::unlinkat(&dir.fd, private.as_str(), AtFlags::empty());
        return Err(io("exchanging the new link with", &path, e));
    }
    let replaced = what_is(dir, &private)?;
    if recorded(r, &replaced) {
        rustix::fs::unlinkat(&dir.fd, private.as_str(), AtFlags::empty()).map_err(|e| io("unlinking", &at, e))?;
        return Ok(Swapped::Done);
    }
    // Not ours: exchanged back, so it is at its name again and the new link at the private one.
    rename(dir, &private, &r.name, RenameFlags::EXCHANGE).map_err(|e| io("exchanging back", &path, e))?;
    settle_private(dir, r)?;
    Ok(Swapped::NotOurs(format!(
        "{} was swapped in meanwhile, which this agent did not write; left in place",
        shown(replaced)
    )))
}

/// A moved entry as an error message shows it.
fn shown(at: At) -> String {
    match at {
        At::Link(t) => format!("a link to {t:?}"),
        At::Other => "something that is not a symlink".into(),
        At::Nothing => "nothing".into(),
    }
}

/// What a test does to a link's path between its check and its change (an operator's swap).
#[cfg(test)]
type Swap = Box<dyn FnMut(&Path)>;

#[cfg(test)]
thread_local! {
    static BETWEEN_CHECK_AND_CHANGE: std::cell::RefCell<Option<Swap>> = const { std::cell::RefCell::new(None) };
}

/// The point between a link's check and its change, where a test may swap the link.
fn between_check_and_change(path: &Path) {
    #[cfg(test)]
    BETWEEN_CHECK_AND_CHANGE.with(|hook| {
        if let Some(f) = hook.borrow_mut().as_mut() {
            f(path)
        }
    });
    #[cfg(not(test))]
    let _ = path;
}

/// Records `r` (in place of any record of the same link) and writes the records.
fn keep(state_dir: &Path, records: &mut Vec<ClaimRecord>, r: ClaimRecord) -> Result<(), ClaimError> {
    records.retain(|x| !(x.class == r.class && x.name == r.name));
    records.push(r);
    write_records(state_dir, records)
}

/// Drops the record of `r`'s link and writes the records.
fn forget(state_dir: &Path, records: &mut Vec<ClaimRecord>, r: &ClaimRecord) -> Result<(), ClaimError> {
    records.retain(|x| !(x.class == r.class && x.name == r.name));
    write_records(state_dir, records)
}

struct ClassDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// The class's discovery directory, opened without following a final symlink (its resolved
/// path, as discovery scans it).
fn class_dir(config: &ProvisionerConfig, class: &str) -> Result<ClassDir, ClaimError> {
    let c = config.storage_class_map.get(class).ok_or_else(|| ClaimError::ClassGone(class.to_string()))?;
    let path = std::fs::canonicalize(&c.mount_dir).map_err(|e| io("resolving", Path::new(&c.mount_dir), e))?;
    let fd = rustix::fs::openat(
        CWD,
        &path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(|e| io("opening", &path, e))?;
    Ok(ClassDir { fd, path })
}

/// What the symlink `name` of `dir` points at; an error when it is no longer a symlink.
fn link_text(dir: &impl AsFd, name: &str, path: &Path) -> Result<String, ClaimError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| io("stat", path, e))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Symlink {
        return Err(ClaimError::NotOurs {
            path: path.to_path_buf(),
            message: "is no longer a symlink; left in place".into(),
        });
    }
    let text = rustix::fs::readlinkat(dir, name, Vec::new()).map_err(|e| io("reading the link", path, e))?;
    Ok(text.to_string_lossy().into_owned())
}

impl From<state_file::StateFileError> for ClaimError {
    fn from(e: state_file::StateFileError) -> Self {
        match e {
            state_file::StateFileError::Io(e) => ClaimError::Io(e),
            state_file::StateFileError::Unreadable { path, message } => ClaimError::BadRecords { path, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, ProvisionerConfig, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("disks");
        let state = tmp.path().join("state");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let text = format!("fast:\n  hostDir: {d}\n  mountDir: {d}\n  devices: {{}}\n", d = dir.display());
        let config = crate::config::parse_entries("t", &[("storageClassMap".into(), text)]).unwrap().config;
        (tmp, config, dir, state)
    }

    fn record(dir: &Path, name: &str, target: &str) -> ClaimRecord {
        ClaimRecord {
            class: "fast".into(),
            name: name.into(),
            host_path: dir.join(name).display().to_string(),
            disk: format!("wwid:{name}"),
            target: target.into(),
            previous: None,
            held: None,
        }
    }

    #[test]
    fn a_device_the_descriptor_scan_could_not_clear_is_not_proven_unused() {
        let blank = Probe { done: true, in_use: None, content: Content::Blank, activity: None };
        let mut p = blank.clone();
        unproven_unused(&mut p, "the writer scan is unresponsive");
        assert!(matches!(&p.content, Content::Unresponsive(w) if w.contains("not proven unused")), "{p:?}");
        // What the probe found stands: in use, written to, or not answering itself.
        for found in [
            Probe { in_use: Some("mounted".into()), ..blank.clone() },
            Probe { activity: Some("written to".into()), ..blank.clone() },
            Probe { content: Content::Unresponsive("probe".into()), ..blank.clone() },
        ] {
            let mut p = found.clone();
            unproven_unused(&mut p, "x");
            assert_eq!(p, found);
        }
    }

    #[test]
    fn a_scan_that_does_not_answer_in_time_is_no_answer() {
        let ops = Operations::new();
        let wanted = Wanted { devices: vec![(nix::sys::stat::makedev(7, 250), "loop250".into())], files: vec![] };
        // Nothing holds that device: the scan answers (empty) within its deadline.
        assert_eq!(scan_openers(&wanted, Some((&ops, Duration::from_secs(10)))), Ok(vec![]));
        // The scan's subject held by one that does not return: no answer, never "unused".
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = release.clone();
        let stuck = ops.run(WRITER_SCAN, "scan", Duration::from_millis(100), move |_| {
            while !held.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        assert!(!matches!(stuck, Answer::Done(())));
        let answer = scan_openers(&wanted, Some((&ops, Duration::from_millis(100))));
        release.store(true, std::sync::atomic::Ordering::SeqCst);
        // Unresponsive (the stuck scan passed its deadline) or, on a loaded machine where the
        // stuck scan has not yet been taken up by a thread, still running: no answer either way.
        assert!(answer.as_ref().is_err_and(|e| e.contains("writer scan") || e.contains("still running")), "{answer:?}");
    }

    #[test]
    fn links_are_made_re_pointed_and_removed_with_the_records_in_step() {
        let (_tmp, config, dir, state) = setup();
        let r = record(&dir, "wwid-a", "/dev/loop1");
        let out = apply(&config, &state, &mut Vec::new(), &[LinkAction::Create(r.clone())]);
        assert!(out[0].1.is_ok(), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-a")).unwrap(), Path::new("/dev/loop1"));
        assert_eq!(read_records(&state).unwrap(), vec![r.clone()]);

        let moved = ClaimRecord { target: "/dev/loop7".into(), previous: Some("/dev/loop1".into()), ..r.clone() };
        let out = apply(&config, &state, &mut read_records(&state).unwrap(), &[LinkAction::Retarget(moved.clone())]);
        assert!(out[0].1.is_ok(), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-a")).unwrap(), Path::new("/dev/loop7"));
        let moved = ClaimRecord { previous: None, ..moved };
        assert_eq!(read_records(&state).unwrap(), vec![moved.clone()]);
        // A re-pointing whose link someone else changed meanwhile is refused.
        let again = ClaimRecord { target: "/dev/loop8".into(), previous: Some("/dev/loop6".into()), ..moved.clone() };
        let out = apply(&config, &state, &mut read_records(&state).unwrap(), &[LinkAction::Retarget(again)]);
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("did not write")), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-a")).unwrap(), Path::new("/dev/loop7"));
        std::fs::write(state.join(CLAIMS_FILE), serde_json::to_vec(std::slice::from_ref(&moved)).unwrap()).unwrap();

        let out = apply(&config, &state, &mut read_records(&state).unwrap(), &[LinkAction::Remove(moved)]);
        assert!(out[0].1.is_ok(), "{out:?}");
        assert!(std::fs::symlink_metadata(dir.join("wwid-a")).is_err());
        assert_eq!(read_records(&state).unwrap(), Vec::new());
        assert_eq!(list_dir(&dir), Vec::<String>::new(), "no private name is left");
    }

    #[test]
    fn what_is_not_the_recorded_link_is_never_removed_or_replaced() {
        let (_tmp, config, dir, state) = setup();
        // Re-pointed by someone else since: left in place, and no longer ours.
        let r = record(&dir, "wwid-b", "/dev/loop2");
        std::os::unix::fs::symlink("/dev/sdz", dir.join("wwid-b")).unwrap();
        let out = apply(&config, &state, &mut vec![r.clone()], &[LinkAction::Remove(r.clone())]);
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("left in place")), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-b")).unwrap(), Path::new("/dev/sdz"));
        assert_eq!(read_records(&state).unwrap(), Vec::new());
        // A directory (a mount point, say) at the name: neither removed nor replaced.
        let c = record(&dir, "wwid-c", "/dev/loop3");
        std::fs::create_dir(dir.join("wwid-c")).unwrap();
        for action in [LinkAction::Remove(c.clone()), LinkAction::Retarget(c.clone())] {
            let out = apply(&config, &state, &mut vec![c.clone()], &[action]);
            assert!(out[0].1.as_ref().is_err_and(|e| e.contains("no longer a symlink")), "{out:?}");
            assert!(dir.join("wwid-c").is_dir());
        }
        // A name taken between the plan and the link: the record is rolled back.
        std::fs::write(dir.join("wwid-d"), b"someone's file").unwrap();
        let d = record(&dir, "wwid-d", "/dev/loop4");
        let out = apply(&config, &state, &mut Vec::new(), &[LinkAction::Create(d)]);
        assert!(out[0].1.is_err(), "{out:?}");
        assert_eq!(std::fs::read(dir.join("wwid-d")).unwrap(), b"someone's file");
        assert_eq!(read_records(&state).unwrap(), Vec::new());
    }

    /// Runs `f` with `swap` done between each link's check and its change.
    fn with_swap<T>(swap: impl FnMut(&Path) + 'static, f: impl FnOnce() -> T) -> T {
        BETWEEN_CHECK_AND_CHANGE.with(|h| *h.borrow_mut() = Some(Box::new(swap)));
        let out = f();
        BETWEEN_CHECK_AND_CHANGE.with(|h| *h.borrow_mut() = None);
        out
    }

    /// An operator's link swapped in after the check, before the change: kept, and no
    /// longer recorded as ours.
    #[test]
    fn a_link_swapped_in_between_the_check_and_the_change_is_left_in_place() {
        let (_tmp, config, dir, state) = setup();
        let operator = |target: &'static str| {
            move |path: &Path| {
                std::fs::remove_file(path).unwrap();
                std::os::unix::fs::symlink(target, path).unwrap();
            }
        };
        let r = record(&dir, "wwid-s", "/dev/loop1");
        std::os::unix::fs::symlink("/dev/loop1", dir.join("wwid-s")).unwrap();
        let out = with_swap(operator("/dev/sdop"), || {
            apply(&config, &state, &mut vec![r.clone()], &[LinkAction::Remove(r.clone())])
        });
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("left in place")), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-s")).unwrap(), Path::new("/dev/sdop"), "the operator's link");
        assert_eq!(read_records(&state).unwrap(), Vec::new());

        let t = record(&dir, "wwid-t", "/dev/loop3");
        let moved = ClaimRecord { target: "/dev/loop3".into(), previous: Some("/dev/loop2".into()), ..t };
        std::os::unix::fs::symlink("/dev/loop2", dir.join("wwid-t")).unwrap();
        let out = with_swap(operator("/dev/sdop2"), || {
            apply(&config, &state, &mut vec![moved.clone()], &[LinkAction::Retarget(moved.clone())])
        });
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("left in place")), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-t")).unwrap(), Path::new("/dev/sdop2"), "the operator's link");
        assert_eq!(read_records(&state).unwrap(), Vec::new());
        // A directory swapped in (a mount point, say): exchanged back, whole.
        let u = ClaimRecord { name: "wwid-u".into(), ..moved.clone() };
        std::os::unix::fs::symlink("/dev/loop2", dir.join("wwid-u")).unwrap();
        let out = with_swap(
            |path: &Path| {
                std::fs::remove_file(path).unwrap();
                std::fs::create_dir(path).unwrap();
                std::fs::write(path.join("data"), b"theirs").unwrap();
            },
            || apply(&config, &state, &mut vec![u.clone()], &[LinkAction::Retarget(u.clone())]),
        );
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("not a symlink")), "{out:?}");
        assert_eq!(std::fs::read(dir.join("wwid-u/data")).unwrap(), b"theirs");
        // Nothing else is left in the directory.
        assert_eq!(list_dir(&dir), ["wwid-s", "wwid-t", "wwid-u"].map(String::from));
    }

    /// A change a crash interrupted leaves the link at its private name: the next change of
    /// that link removes it when it is ours and puts it back when it is not.
    #[test]
    fn a_link_change_interrupted_by_a_crash_is_settled_by_the_next_one() {
        let (_tmp, config, dir, state) = setup();
        let private = |name: &str| dir.join(private_name(name));
        // Ours, moved aside before its removal: removed, the record forgotten.
        let a = record(&dir, "wwid-a", "/dev/loop1");
        std::os::unix::fs::symlink("/dev/loop1", private("wwid-a")).unwrap();
        let out = apply(&config, &state, &mut vec![a.clone()], &[LinkAction::Forget(a.clone())]);
        assert!(out[0].1.is_ok(), "{out:?}");
        // Theirs, swapped in and moved aside: put back, and the name is theirs.
        let b = record(&dir, "wwid-b", "/dev/loop2");
        std::os::unix::fs::symlink("/dev/sdop", private("wwid-b")).unwrap();
        let out = apply(&config, &state, &mut vec![b.clone()], &[LinkAction::Relink(b.clone())]);
        assert!(out[0].1.is_err(), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-b")).unwrap(), Path::new("/dev/sdop"));
        // Theirs, while the name is taken again: nothing is changed, and the error says where.
        let c = record(&dir, "wwid-c", "/dev/loop3");
        std::os::unix::fs::symlink("/dev/sdop3", private("wwid-c")).unwrap();
        std::os::unix::fs::symlink("/dev/loop3", dir.join("wwid-c")).unwrap();
        let out = apply(&config, &state, &mut vec![c.clone()], &[LinkAction::Remove(c.clone())]);
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("cannot be put back")), "{out:?}");
        assert_eq!(std::fs::read_link(dir.join("wwid-c")).unwrap(), Path::new("/dev/loop3"));
        assert_eq!(std::fs::read_link(private("wwid-c")).unwrap(), Path::new("/dev/sdop3"));
        std::fs::remove_file(private("wwid-c")).unwrap();
        assert_eq!(list_dir(&dir), ["wwid-b", "wwid-c"].map(String::from));
        assert_eq!(read_records(&state).unwrap(), Vec::new());
    }

    #[test]
    fn unreadable_records_are_an_error_naming_the_file_and_are_left_as_they_are() {
        let (_tmp, _config, _dir, state) = setup();
        assert_eq!(read_records(&state).unwrap(), Vec::new(), "no file: no records");
        std::fs::write(state.join(CLAIMS_FILE), b"[{\"class\":").unwrap();
        let e = read_records(&state).unwrap_err().to_string();
        assert!(e.contains("claims.json") && e.contains("no link is changed"), "{e}");
        assert_eq!(std::fs::read(state.join(CLAIMS_FILE)).unwrap(), b"[{\"class\":");
    }

    #[test]
    fn a_class_gone_from_the_config_gets_no_link() {
        let (_tmp, config, dir, state) = setup();
        let mut r = record(&dir, "wwid-e", "/dev/loop5");
        r.class = "gone".into();
        let out = apply(&config, &state, &mut Vec::new(), &[LinkAction::Create(r)]);
        assert!(out[0].1.as_ref().is_err_and(|e| e.contains("no longer in the config")), "{out:?}");
        assert!(std::fs::symlink_metadata(dir.join("wwid-e")).is_err());
    }

    #[test]
    fn a_surface_read_is_reused_only_while_nothing_was_written_to_the_same_device() {
        let mut m = ClaimMemory::default();
        let mut d = DeviceFacts {
            name: "sdb".into(),
            stable_id: Some("wwid:naa.1".into()),
            size: 1 << 40,
            kind: Some(DeviceKind::Selectable(DeviceType::Disk)),
            ..Default::default()
        };
        d.probe = Probe { done: true, in_use: None, content: Content::Blank, activity: None };
        let at = IoStat { writes: 5, write_sectors: 40, in_flight: 0, discards: 0, flushes: 1 };
        m.remember_surface(&d, at);
        assert_eq!(m.surface_of(&d, Some(&at)), Some(Content::Blank));
        // Reads and requests in flight are not writes.
        assert_eq!(m.surface_of(&d, Some(&IoStat { in_flight: 3, ..at })), Some(Content::Blank));
        for moved in [
            IoStat { writes: 6, ..at },
            IoStat { write_sectors: 41, ..at },
            IoStat { discards: 1, ..at },
            IoStat { flushes: 2, ..at },
        ] {
            assert_eq!(m.surface_of(&d, Some(&moved)), None, "{moved:?}");
        }
        assert_eq!(m.surface_of(&d, None), None, "unreadable counters");
        let other = DeviceFacts { stable_id: Some("wwid:naa.2".into()), ..d.clone() };
        assert_eq!(m.surface_of(&other, Some(&at)), None, "another disk under the name");
        let resized = DeviceFacts { size: 1 << 30, ..d.clone() };
        assert_eq!(m.surface_of(&resized, Some(&at)), None);
        // A device in use or written during the read is not remembered.
        let mut busy = d.clone();
        busy.probe.activity = Some("someone is using it: 1 writes".into());
        m.remember_surface(&busy, at);
        assert_eq!(m.surface_of(&d, Some(&at)), None);
        // Pruned with the devices.
        m.remember_surface(&d, at);
        assert_eq!(m.surface_of(&d, Some(&at)), Some(Content::Blank));
        m.retain(|_| true, &[other]);
        assert_eq!(m.surface_of(&d, Some(&at)), None, "sdb is another disk now: forgotten");
        assert!(m.surfaces.is_empty());
    }

    #[test]
    fn natural_order_puts_loop2_before_loop10() {
        let mut names = vec!["loop10", "sda", "loop2", "nvme0n1", "nvme0n1p2", "loop1"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, vec!["loop1", "loop2", "loop10", "nvme0n1", "nvme0n1p2", "sda"]);
    }
}
