//! An operator's explicit wipe of one named disk (`wipe-disk --id <stable id>`): whether the
//! disk may be zeroed now. A disk that holds old data is refused by the claim rules forever;
//! the agent never clears data on its own word, but an operator may, for one disk named by its
//! stable id exactly as `disks` prints it. This decides from facts the host and the API gave
//! (`host::wipe::operator_wipe` gathers them); it is pure, so every rule is unit tested.
//!
//! The rules protect whatever still uses the disk's data: the wipe is refused while the disk,
//! or any device sharing its data (its partitions, its whole disk, another loop device over the
//! same file), is mounted, held, open (exclusively or by any process), an entry of a discovery
//! directory (the agent's own claim link of this very disk excepted), or the disk of a PV
//! (a loop device over a file inside a PV's volume is that volume's disk: the same
//! [`DiskKey::overlaps`] rule discovery applies); and whenever one of those cannot be known (a
//! directory not scanned, the API not readable).

use std::collections::BTreeSet;
use std::fmt;

use crate::core::devices::device_claim::{ClaimRecord, DeviceFacts, DeviceKind, DirEntry, PvDisk, ids_overlap};
use crate::core::volumes::volume_safety::DiskKey;

/// A PV as the wipe rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnownPv {
    /// Its name.
    pub name: String,
    /// Whether it is this node's (our node label, its hostname label or its node affinity):
    /// only then can its path lead to a device here.
    pub this_node: bool,
    /// Its path, the disk its identity recorded, and the device its path leads to here.
    pub disk: PvDisk,
    /// What the volume at its path occupies here now (a PV of this node whose path shows a
    /// volume), as discovery sees it.
    pub volume: Option<DiskKey>,
}

/// A process holding the device (or one sharing its data) open: `what` is the kernel name of
/// the device it has open.
pub(crate) use crate::core::devices::activity::Opener;

/// Everything the decision reads.
#[derive(Debug, Clone)]
pub(crate) struct WipeWorld {
    /// The stable id the operator named.
    pub id: String,
    /// Every block device of the node (with `sharing` filled in).
    pub devices: Vec<DeviceFacts>,
    /// Why the named device is in use by the host (mounted, held, open exclusively; it or a
    /// device sharing its data), from the same check the claim probe makes.
    pub in_use: Option<String>,
    /// Processes other than the command itself holding the device or a sharing one open.
    pub openers: Vec<Opener>,
    /// Every entry of every scanned discovery directory.
    pub entries: Vec<DirEntry>,
    /// Classes whose discovery directory could not be scanned (or whose config is invalid).
    pub unscanned: Vec<String>,
    /// The links this agent made (claims.json); empty when unreadable, so that every link
    /// counts as someone else's.
    pub records: Vec<ClaimRecord>,
    /// The cluster's local PVs, or why they could not be read.
    pub pvs: Result<Vec<KnownPv>, String>,
    /// What the named device occupies (its extent on its base disk, or the backing file of a
    /// loop device and where that file lives), as discovery sees a block volume.
    pub target_disk: Option<DiskKey>,
    /// The stable id of the device under the filesystem holding a loop device's backing file
    /// (where it has one): a PV that recorded that disk holds the file.
    pub backing_disk: Option<String>,
}

impl Default for WipeWorld {
    /// No devices, nothing in use, no PVs.
    fn default() -> Self {
        WipeWorld {
            id: String::new(),
            devices: Vec::new(),
            in_use: None,
            openers: Vec::new(),
            entries: Vec::new(),
            unscanned: Vec::new(),
            records: Vec::new(),
            pvs: Ok(Vec::new()),
            target_disk: None,
            backing_disk: None,
        }
    }
}

/// The device a wipe would zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Kernel name.
    pub name: String,
    /// `major:minor`.
    pub dev: String,
    /// Size in bytes, as the inventory read it (the wipe proves it again on its descriptor).
    pub size: u64,
    /// Its stable id (the one named).
    pub stable_id: String,
    /// Its partitions (their table goes with the wipe: the kernel is asked to re-read it).
    pub partitions: Vec<String>,
    /// Every device sharing its data (partitions, whole disk, loop devices over the same file).
    pub related: Vec<String>,
    /// The agent's own claim links of this disk (class, link name): allowed, and published
    /// again by the agent once the disk reads blank.
    pub own_links: Vec<(String, String)>,
}

/// Why a wipe is refused. Each names the rule and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WipeRefusal {
    /// No device reports the id.
    UnknownId { id: String, similar: Vec<String> },
    /// Several devices report it (two paths to one disk, two loop devices over one file):
    /// which one is meant cannot be told.
    SeveralDevices { id: String, devices: Vec<String> },
    /// A device of a kind that is never claimed (LVM volume, dm-crypt, md, zram...): the host
    /// built it on purpose; its own tools take it apart.
    NotADisk { device: String, kind: String },
    /// The kernel reports it read-only.
    ReadOnly(String),
    /// A hidden NVMe multipath path: the namespace head is the device to name.
    Hidden(String),
    /// Devices are stacked on it or on one sharing its data.
    Held { device: String, holders: Vec<String> },
    /// Mounted, held or open exclusively (it or a device sharing its data).
    InUse(String),
    /// Open by processes.
    Open(Vec<Opener>),
    /// An entry of a discovery directory leads to it (or to a device sharing its data).
    Entry { class: String, name: String, device: String },
    /// A discovery directory could not be scanned: an entry there could lead to it.
    Unscanned(Vec<String>),
    /// A PV recorded this disk (or one sharing its data) in its identity.
    PvRecorded { pv: String, path: String, disk: String },
    /// A PV of this node has a path leading to it (or to a device sharing its data).
    PvPath { pv: String, path: String, device: String },
    /// A loop device over a file inside a PV's volume (or on the disk a PV recorded): its data
    /// is that volume's.
    PvVolume { pv: String, path: String, why: String },
    /// The agent's own link of this disk has a PV: it is a tenant's volume.
    ClaimPublished { class: String, name: String, pv: String },
    /// The PVs could not be read.
    ApiUnreadable(String),
}

impl WipeRefusal {
    /// A short stable name of the rule.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            WipeRefusal::UnknownId { .. } => "unknown-id",
            WipeRefusal::SeveralDevices { .. } => "several-devices",
            WipeRefusal::NotADisk { .. } => "not-a-disk",
            WipeRefusal::ReadOnly(_) => "read-only",
            WipeRefusal::Hidden(_) => "hidden",
            WipeRefusal::Held { .. } => "held",
            WipeRefusal::InUse(_) => "in-use",
            WipeRefusal::Open(_) => "open",
            WipeRefusal::Entry { .. } => "already-volume",
            WipeRefusal::Unscanned(_) => "unscanned",
            WipeRefusal::PvRecorded { .. }
            | WipeRefusal::PvPath { .. }
            | WipeRefusal::PvVolume { .. }
            | WipeRefusal::ClaimPublished { .. } => "has-pv",
            WipeRefusal::ApiUnreadable(_) => "api-unreadable",
        }
    }
}

impl fmt::Display for WipeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WipeRefusal::UnknownId { id, similar } if similar.is_empty() => {
                write!(f, "no device of this node has the stable id {id:?} (`disks` lists every id)")
            }
            WipeRefusal::UnknownId { id, similar } => write!(
                f,
                "no device of this node has the stable id {id:?}; the ids must match exactly, did you mean {}?",
                similar.join(" or ")
            ),
            WipeRefusal::SeveralDevices { id, devices } => write!(
                f,
                "{} all report the stable id {id:?} (two paths to one disk, or two loop devices over one file): which one is meant cannot be told",
                devices.join(", ")
            ),
            WipeRefusal::NotADisk { device, kind } => write!(
                f,
                "{device} is of type {kind}, which the host builds on purpose and is never claimed; take it apart with its own tools"
            ),
            WipeRefusal::ReadOnly(d) => write!(f, "{d} is read-only"),
            WipeRefusal::Hidden(d) => {
                write!(f, "{d} is a hidden NVMe multipath path; name the namespace head (nvmeXnY) instead")
            }
            WipeRefusal::Held { device, holders } => write!(
                f,
                "{device} is held by {} (device-mapper, md, LVM or bcache): take it out of there first",
                holders.join(", ")
            ),
            WipeRefusal::InUse(why) => write!(f, "in use: {why}"),
            WipeRefusal::Open(openers) => {
                let list: Vec<String> = openers.iter().map(|o| o.to_string()).collect();
                write!(f, "open by another process: {}", list.join(", "))
            }
            WipeRefusal::Entry { class, name, device } => write!(
                f,
                "already a volume: entry {name} of class {class}'s discovery directory leads to {device}; remove it first if it is not needed"
            ),
            WipeRefusal::Unscanned(classes) => write!(
                f,
                "the discovery directory of class {} cannot be scanned (or its config is invalid), so whether an entry there leads to it is unknown",
                classes.join(", ")
            ),
            WipeRefusal::PvRecorded { pv, path, disk } => {
                write!(f, "PV {pv} (path {path}) recorded the disk {disk}: it is a volume; delete the PV first")
            }
            WipeRefusal::PvPath { pv, path, device } => {
                write!(f, "PV {pv} has the path {path}, which leads to {device}: it is a volume; delete the PV first")
            }
            WipeRefusal::PvVolume { pv, path, why } => {
                write!(f, "its data is PV {pv}'s (path {path}): {why}; it is that volume's disk; delete the PV first")
            }
            WipeRefusal::ClaimPublished { class, name, pv } => write!(
                f,
                "it is claimed as {name} of class {class} and published as PV {pv}: a tenant's volume; delete the PV first (a released PV is wiped by the agent)"
            ),
            WipeRefusal::ApiUnreadable(e) => {
                write!(f, "cannot prove no PV has it: the PVs could not be read from the API ({e})")
            }
        }
    }
}

/// The one device reporting `id`, or why there is not exactly one.
pub(crate) fn find_target<'a>(id: &str, devices: &'a [DeviceFacts]) -> Result<&'a DeviceFacts, WipeRefusal> {
    let found: Vec<&DeviceFacts> = devices.iter().filter(|d| d.stable_id.as_deref() == Some(id)).collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => {
            // A near miss (a partition's suffix left out, a loop id of another inode): named.
            let needle = id.split(['@', '#']).next().unwrap_or(id);
            let similar = devices
                .iter()
                .filter_map(|d| d.stable_id.as_deref())
                .filter(|s| !needle.is_empty() && (s.starts_with(needle) || id.starts_with(*s)))
                .map(str::to_string)
                .collect();
            Err(WipeRefusal::UnknownId { id: id.to_string(), similar })
        }
        many => Err(WipeRefusal::SeveralDevices {
            id: id.to_string(),
            devices: many.iter().map(|d| d.name.clone()).collect(),
        }),
    }
}

/// The kernel names of every device sharing `target`'s data, itself included.
pub(crate) fn related(target: &DeviceFacts) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = BTreeSet::from([target.name.clone()]);
    out.extend(target.partitions.iter().cloned());
    out.extend(target.parent.iter().cloned());
    out.extend(target.sharing.iter().cloned());
    out
}

/// The decision: the device to zero, or every rule that refuses it (none when allowed).
pub(crate) fn decide(world: &WipeWorld) -> Result<Target, Vec<WipeRefusal>> {
    let target = find_target(&world.id, &world.devices).map_err(|r| vec![r])?;
    let related = related(target);
    let mut refusals = Vec::new();
    match &target.kind {
        Some(DeviceKind::Selectable(_)) => {}
        Some(DeviceKind::Other(kind)) => {
            refusals.push(WipeRefusal::NotADisk { device: target.name.clone(), kind: kind.clone() })
        }
        None => refusals.push(WipeRefusal::NotADisk { device: target.name.clone(), kind: "unknown".into() }),
    }
    if target.read_only {
        refusals.push(WipeRefusal::ReadOnly(target.name.clone()));
    }
    if target.hidden {
        refusals.push(WipeRefusal::Hidden(target.name.clone()));
    }
    for d in world.devices.iter().filter(|d| related.contains(&d.name) && !d.holders.is_empty()) {
        refusals.push(WipeRefusal::Held { device: d.name.clone(), holders: d.holders.clone() });
    }
    if let Some(why) = &world.in_use {
        refusals.push(WipeRefusal::InUse(why.clone()));
    }
    let mut openers: Vec<Opener> = world.openers.iter().filter(|o| related.contains(&o.what)).cloned().collect();
    openers.sort();
    openers.dedup();
    if !openers.is_empty() {
        refusals.push(WipeRefusal::Open(openers));
    }
    // The agent's own links of this very disk: the claim of a disk it may publish once blank.
    let own =
        |e: &DirEntry| world.records.iter().find(|r| r.class == e.class && r.name == e.name && r.disk == world.id);
    let mut own_links = Vec::new();
    for e in &world.entries {
        let Some(device) = e.device.as_ref().filter(|d| related.contains(*d)) else { continue };
        match own(e) {
            Some(r) if e.device.as_deref() == Some(target.name.as_str()) && e.link.is_some() => {
                own_links.push((r.class.clone(), r.name.clone(), r.host_path.clone()))
            }
            _ => refusals.push(WipeRefusal::Entry {
                class: e.class.clone(),
                name: e.name.clone(),
                device: device.clone(),
            }),
        }
    }
    if !world.unscanned.is_empty() {
        refusals.push(WipeRefusal::Unscanned(world.unscanned.clone()));
    }
    // A PV recorded this disk, a partition of it or its whole disk (ids_overlap), or exactly
    // another device sharing its data (a loop device over another range of the same file).
    let shared_ids: Vec<&str> = world
        .devices
        .iter()
        .filter(|d| related.contains(&d.name) && d.name != target.name)
        .filter_map(|d| d.stable_id.as_deref())
        .collect();
    let has_data = |d: &str| ids_overlap(d, &world.id) || shared_ids.contains(&d);
    match &world.pvs {
        Err(e) => refusals.push(WipeRefusal::ApiUnreadable(e.clone())),
        Ok(pvs) => {
            for pv in pvs {
                let recorded = pv.disk.disk.as_deref().filter(|d| has_data(d));
                let leads = pv.disk.device.as_ref().filter(|d| pv.this_node && related.contains(*d));
                let claim = own_links.iter().find(|(_, _, path)| pv.this_node && *path == pv.disk.host_path);
                if let Some((class, name, _)) = claim {
                    refusals.push(WipeRefusal::ClaimPublished {
                        class: class.clone(),
                        name: name.clone(),
                        pv: pv.name.clone(),
                    });
                } else if let Some(disk) = recorded {
                    refusals.push(WipeRefusal::PvRecorded {
                        pv: pv.name.clone(),
                        path: pv.disk.host_path.clone(),
                        disk: disk.to_string(),
                    });
                } else if let Some(device) = leads {
                    refusals.push(WipeRefusal::PvPath {
                        pv: pv.name.clone(),
                        path: pv.disk.host_path.clone(),
                        device: device.clone(),
                    });
                } else if let Some(why) = shares_volume(world, pv) {
                    refusals.push(WipeRefusal::PvVolume { pv: pv.name.clone(), path: pv.disk.host_path.clone(), why });
                }
            }
        }
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    Ok(Target {
        name: target.name.clone(),
        dev: target.dev.clone(),
        size: target.size,
        stable_id: world.id.clone(),
        partitions: target.partitions.clone(),
        related: related.into_iter().filter(|n| *n != target.name).collect(),
        own_links: own_links.into_iter().map(|(class, name, _)| (class, name)).collect(),
    })
}

/// Why the named device's data is in `pv`'s volume, if it is: the volume at the PV's path
/// here shares data with the device by discovery's own rule ([`DiskKey::overlaps`]: a loop
/// device whose backing file lies inside that volume, overlapping extents), or a PV of this
/// node recorded the disk that holds the loop device's backing file. Not another node's: its
/// record names a disk of that node, and disks of different machines can report one serial
/// (virtual disks do), so a loop image on this node's root disk would be refused for any
/// node's directory volume (seen on a shared control plane: every node's root disk was
/// `serial:overlayblk`).
fn shares_volume(world: &WipeWorld, pv: &KnownPv) -> Option<String> {
    let in_volume = pv.this_node
        && pv.volume.as_ref().zip(world.target_disk.as_ref()).is_some_and(|(volume, target)| volume.overlaps(target));
    if in_volume {
        return Some("the volume at that path holds its data (a loop device over a file inside it)".into());
    }
    let (true, Some(recorded), Some(backing)) = (pv.this_node, pv.disk.disk.as_deref(), world.backing_disk.as_deref())
    else {
        return None;
    };
    ids_overlap(recorded, backing)
        .then(|| format!("its backing file lies on the disk {backing}, which the PV recorded ({recorded})"))
}

/// The deadline of a wipe of `size` bytes: ten minutes plus the time the slowest acceptable
/// disk (10 MiB/s) takes to be written once.
pub(crate) fn default_timeout(size: u64) -> std::time::Duration {
    const MIN_RATE: u64 = 10 * 1024 * 1024;
    std::time::Duration::from_secs(600 + size.div_ceil(MIN_RATE))
}

/// Offsets and lengths read back after the wipe: the first and last MiB (partition tables,
/// superblocks) and `samples` blocks of 64 KiB spread evenly in between, all within `size`.
pub(crate) fn read_back_ranges(size: u64, samples: u64) -> Vec<(u64, u64)> {
    const MIB: u64 = 1024 * 1024;
    const SAMPLE: u64 = 64 * 1024;
    let mut out = vec![(0, size.min(MIB))];
    if size > MIB {
        out.push((size - size.min(MIB), size.min(MIB)));
    }
    if size > 2 * MIB + SAMPLE && samples > 0 {
        let span = size - 2 * MIB - SAMPLE;
        for i in 0..samples {
            // Spread from the end of the first MiB to the start of the last, 4 KiB aligned.
            let at = MIB + (span / samples.max(1)) * i + span / (2 * samples);
            out.push((at & !4095, SAMPLE));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
#[path = "operator_wipe_tests.rs"]
mod tests;
