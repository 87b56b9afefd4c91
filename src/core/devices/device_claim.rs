//! Claiming raw block devices for a class (its `devices` section): which devices of this node
//! a class may take, under what link name, and what to do with the links this agent made
//! earlier. Pure: `host::devices::claims` gathers the facts and carries out the link actions, and
//! discovery then publishes the links like any other entry.
//!
//! The safety rules, in one place ([`judge`]): a device is claimed only when it is provably
//! unused (a stable id, writable, fixed, no partitions or holders, not mounted or opened
//! exclusively, not already any class's volume or a PV's disk, and every signature area reads
//! zero) and only once. A device is never written to when claimed; a link is only ever
//! changed or removed when this agent recorded it, and never removed while its PV exists.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::config::pattern::NamePattern;
use crate::core::devices::device_selector::{DeviceSelector, DeviceType, Verify, any_glob_matches};
use crate::core::devices::surface::{FullRead, offset_text};
use crate::core::identity::disk_identity::{LoopKey, Shared, devices_share};
use crate::core::volumes::naming::fnv1a32;
use crate::core::volumes::pv::host_path;

/// Where an agent's link points while its device is not on the node: a path nothing creates,
/// so the link dangles instead of leading to whatever device took the old node's name.
pub const ABSENT_TARGET_DIR: &str = "/dev/local-static-provisioner/absent";

/// What a block device is, as far as claiming is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// A kind a class can select.
    Selectable(DeviceType),
    /// Another layer's device (LVM volume, dm-crypt, md, zram, nbd, rom...): never claimed.
    Other(String),
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Selectable(t) => write!(f, "{t}"),
            DeviceKind::Other(what) => f.write_str(what),
        }
    }
}

/// What reading a device's signature areas found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Content {
    /// Not read (the device is not a candidate, or has a PV).
    #[default]
    NotProbed,
    /// Every signature area reads zero: the state a new disk and our own wipes leave.
    Blank,
    /// Somebody holds the device open exclusively.
    Busy,
    /// Something is written there: the recognised signatures, or the first non-zero offset.
    NotBlank(String),
    /// The device could not be read.
    Unreadable(String),
    /// The probe did not return within its deadline (host::ops): nothing is concluded from it.
    Unresponsive(String),
}

/// Whether the device is in use, and what its signature areas hold: the two facts that
/// need opening the device, gathered only for devices a class may claim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Probe {
    /// Whether the probe ran.
    pub done: bool,
    /// Why the device (or one sharing its data) is in use: mounted, held or open exclusively.
    pub in_use: Option<String>,
    /// What the signature areas hold.
    pub content: Content,
    /// Someone other than this agent uses it without claiming it: writes, discards, flushes
    /// or requests in flight over the probe window (or, for a claim whose PV is unbound, since
    /// the previous pass), or a process holding it open (core::devices::activity).
    pub activity: Option<String>,
}

/// One block device of the node, as sysfs, /dev/disk/by-id and a probe describe it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceFacts {
    /// Kernel name (`sdb`, `nvme0n1p1`, `loop3`).
    pub name: String,
    /// `major:minor`.
    pub dev: String,
    /// Type.
    pub kind: Option<DeviceKind>,
    /// The whole disk of a partition (kernel name).
    pub parent: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Read-only (`ro`).
    pub read_only: bool,
    /// Removable media (`removable`).
    pub removable: bool,
    /// A hidden NVMe multipath path (`hidden`): the namespace head is the device to use.
    pub hidden: bool,
    /// `queue/rotational`, when sysfs says.
    pub rotational: Option<bool>,
    /// `device/model`.
    pub model: Option<String>,
    /// `device/vendor`.
    pub vendor: Option<String>,
    /// The stable id the volume identity records (`wwid:...`, `serial:...`, `dm:mpath-...`,
    /// `loop:...`; a partition adds `/part<N>@<start>`): what the link name is made from.
    pub stable_id: Option<String>,
    /// Names in /dev/disk/by-id that lead to this very device.
    pub by_id: Vec<String>,
    /// Kernel names of its partitions.
    pub partitions: Vec<String>,
    /// Kernel names of the devices stacked on it (`holders`).
    pub holders: Vec<String>,
    /// Kernel names of other devices sharing its data (its whole disk, loop devices over it).
    pub sharing: Vec<String>,
    /// In use and content, when probed.
    pub probe: Probe,
    /// Where the full read of this disk stands (only looked at for a class with `verify: full`).
    pub full_read: FullRead,
}

impl DeviceFacts {
    /// What was found on the device, in words (`disks`, the node inventory).
    pub fn content_text(&self) -> String {
        if let Some(why) = &self.probe.in_use {
            return format!("in use: {why}");
        }
        match &self.probe.content {
            Content::NotProbed => "not probed (no class selects it)".into(),
            Content::Blank => "blank".into(),
            Content::Busy => "open exclusively by someone".into(),
            Content::NotBlank(what) => what.clone(),
            Content::Unreadable(e) => format!("unreadable: {e}"),
            Content::Unresponsive(e) => format!("unresponsive: {e}"),
        }
    }

    /// A loop device with nothing attached (size 0): the kernel keeps a few ready, and
    /// listing them only buries the disks.
    pub fn is_unattached_loop(&self) -> bool {
        self.size == 0 && self.name.starts_with("loop")
    }

    /// The names an `exclude` glob is matched against.
    pub fn names(&self) -> Vec<String> {
        let mut names = vec![self.name.clone(), format!("/dev/{}", self.name)];
        // Excluding a disk excludes its partitions too.
        if let Some(parent) = &self.parent {
            names.push(parent.clone());
            names.push(format!("/dev/{parent}"));
        }
        for id in &self.by_id {
            names.push(id.clone());
            names.push(format!("/dev/disk/by-id/{id}"));
        }
        names.extend(self.stable_id.clone());
        names
    }
}

/// One entry of a class's discovery directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Class whose directory holds it.
    pub class: String,
    /// Entry name.
    pub name: String,
    /// The symlink's target text, when the entry is a symlink.
    pub link: Option<String>,
    /// Kernel name of the block device it is or leads to.
    pub device: Option<String>,
    /// Its look did not answer (a file system or device that stopped answering): it is there,
    /// but whether it is still this agent's link is not known. Never taken for someone
    /// else's entry (which would forget the record of a published disk).
    pub unanswered: bool,
}

/// A link this agent made, kept in the state directory: only these are ever changed or
/// removed by the agent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// Class it was claimed for.
    pub class: String,
    /// Link name in the class's discovery directory.
    pub name: String,
    /// The PV path (hostDir joined with the name), so the PV is found after the class changes.
    pub host_path: String,
    /// The device's stable id.
    pub disk: String,
    /// What the link points at now.
    pub target: String,
    /// What it pointed at before a re-pointing that may not have finished (a crash between
    /// writing this record and the link): a link still showing it is ours too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Why the device is held: while its PV was unbound, something the agent did not put there
    /// showed up on it (a signature, a mount, a writer) and the PV was withdrawn. Kept until
    /// the device proves blank and unused again (an operator cleared it), so a restart does not
    /// forget a writer that has gone quiet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// A PV of this node and the disk it recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvDisk {
    /// Its host path.
    pub host_path: String,
    /// The stable device id in its recorded identity.
    pub disk: Option<String>,
    /// Kernel name of the block device at its path, when the path is a device this agent can
    /// see (an upstream PV made from a link under /dev records no identity).
    pub device: Option<String>,
    /// Not bound to a claim (Available or Pending, no claimRef, not being deleted): no tenant
    /// has the disk, so anything that shows up on it was not put there by a tenant.
    pub unbound: bool,
}

/// What a class asks for.
#[derive(Debug, Clone)]
pub struct ClassClaims {
    /// Class name.
    pub class: String,
    /// Host directory (PV paths are built from it).
    pub host_dir: String,
    /// The class's namePattern: a link it would not match would never be published.
    pub name_pattern: String,
    /// The filter; `None` when the class claims nothing (its old links are let go).
    pub selector: Option<DeviceSelector>,
}

/// Why a device a class's filter selects is not claimed: each protects data or keeps a disk
/// from being published twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No WWID, serial, multipath UUID or backing file: no name that survives a reboot.
    NoStableId,
    /// No /dev/disk/by-id link (no udev): a link to /dev/sdX could lead to another disk after
    /// a reboot, before the agent re-points it, and kubelet would hand that disk to the pod.
    NoById,
    /// The kernel reports it read-only.
    ReadOnly,
    /// Removable media.
    Removable,
    /// A hidden NVMe multipath path.
    Hidden,
    /// It has partitions.
    Partitioned(Vec<String>),
    /// Devices are stacked on it (device-mapper, md, LVM, bcache).
    Held(Vec<String>),
    /// Mounted, or open exclusively (it or a device sharing its data).
    InUse(String),
    /// Used without a claim: written to over the probe window, or held open by a process
    /// (core::devices::activity). Counted as `in-use`; unlike a mount, its end raises no event, so the
    /// agent looks again on a retry deadline.
    Writer(String),
    /// Another entry or PV already has this disk.
    AlreadyVolume(String),
    /// Another class already claimed it.
    ClaimedElsewhere(String),
    /// Another device has the same stable id (two paths to one disk, two loop devices over
    /// one file): one disk, so only the first of them is ever considered.
    SameDisk(String),
    /// Its signature areas hold something.
    NotBlank(String),
    /// The probe could not read it.
    Unreadable(String),
    /// The probe did not return within its deadline (a wedged device).
    Unresponsive(String),
    /// This agent cannot see the host's processes (why: [`World::host_processes_unseen`]), so
    /// nothing proves that no program on the host holds the device open.
    HostProcessesUnseen(String),
    /// Its class reads it whole before its first claim (`verify: full`), and that read has
    /// not finished blank yet.
    Verifying(String),
    /// Not probed yet (a second pass probes it).
    NotProbed,
    /// A class's discovery directory could not be read: whether the device is already an
    /// entry there is unknown.
    Unscanned(Vec<String>),
    /// The class's namePattern does not match the link name.
    NameMismatch { name: String, pattern: String },
    /// Something else already has the link's name in the discovery directory.
    NameTaken(String),
}

impl Refusal {
    /// A short stable name, for metric labels.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NoStableId => "no-stable-id",
            Refusal::NoById => "no-by-id",
            Refusal::ReadOnly => "read-only",
            Refusal::Removable => "removable",
            Refusal::Hidden => "hidden",
            Refusal::Partitioned(_) => "partitioned",
            Refusal::Held(_) => "held",
            Refusal::InUse(_) | Refusal::Writer(_) => "in-use",
            Refusal::AlreadyVolume(_) => "already-volume",
            Refusal::ClaimedElsewhere(_) => "claimed-elsewhere",
            Refusal::SameDisk(_) => "same-disk",
            Refusal::NotBlank(_) => "not-blank",
            Refusal::Unreadable(_) => "unreadable",
            Refusal::Unresponsive(_) => "unresponsive",
            Refusal::HostProcessesUnseen(_) => "host-processes-unseen",
            Refusal::Verifying(_) => "verifying",
            Refusal::NotProbed => "not-probed",
            Refusal::Unscanned(_) => "unscanned",
            Refusal::NameMismatch { .. } => "name-mismatch",
            Refusal::NameTaken(_) => "name-taken",
        }
    }
}

impl Refusal {
    /// Whether an operator should look: data found on a disk the filter selects, a disk that
    /// cannot be named or read, a name clash, or a directory that cannot be scanned (a Warning
    /// event). The others describe a disk the host or another volume already uses, which a
    /// broad filter meets on every node (the OS disk is mounted): a Normal event.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            Refusal::NoStableId
                | Refusal::NoById
                | Refusal::NotBlank(_)
                | Refusal::Unreadable(_)
                | Refusal::HostProcessesUnseen(_)
                | Refusal::NameMismatch { .. }
                | Refusal::NameTaken(_)
                | Refusal::Unscanned(_)
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoStableId => write!(f, "it has no WWID, serial or other stable id to name it by across reboots"),
            Refusal::NoById => write!(
                f,
                "no /dev/disk/by-id link leads to it (is udev running?); a link to its /dev node could lead to another disk after a reboot"
            ),
            Refusal::ReadOnly => write!(f, "it is read-only"),
            Refusal::Removable => write!(f, "it is removable media"),
            Refusal::Hidden => write!(f, "it is a hidden NVMe multipath path (use the namespace head)"),
            Refusal::Partitioned(p) => write!(f, "it has partitions ({})", p.join(", ")),
            Refusal::Held(h) => write!(f, "it is held by {} (device-mapper, md, LVM or bcache)", h.join(", ")),
            Refusal::InUse(why) | Refusal::Writer(why) => write!(f, "it is in use: {why}"),
            Refusal::AlreadyVolume(what) => write!(f, "it is already a volume: {what}"),
            Refusal::ClaimedElsewhere(class) => write!(f, "class {class} already claimed it"),
            Refusal::SameDisk(other) => write!(
                f,
                "{other} has the same stable id: they are one disk (two paths to it, or two loop devices over one file), and only {other} is considered"
            ),
            Refusal::NotBlank(what) => write!(
                f,
                "it is not blank: {what} (to offer it, clear it with `blkdiscard -z` or remove its data; `wipefs -a` alone leaves data behind)"
            ),
            Refusal::Unreadable(e) => write!(f, "it could not be read: {e}"),
            Refusal::Unresponsive(e) => write!(f, "it does not answer: {e}"),
            Refusal::HostProcessesUnseen(why) => write!(
                f,
                "it is not proven unused: this agent cannot see the host's processes ({why}: hostPID is off), so nothing shows whether a program on the host holds it open; run the agent with hostPID: true (deploy/components/host-pid; the chart sets it when a class has devices)"
            ),
            Refusal::Verifying(what) => write!(f, "it is read whole before its first claim (verify: full): {what}"),
            Refusal::NotProbed => write!(f, "it has not been probed yet"),
            Refusal::Unscanned(classes) => write!(
                f,
                "the discovery directory of class {} cannot be scanned now, so whether it is already a volume there is unknown",
                classes.join(", ")
            ),
            Refusal::NameMismatch { name, pattern } => {
                write!(f, "its link name {name:?} does not match the class's namePattern {pattern:?}")
            }
            Refusal::NameTaken(name) => {
                write!(f, "another entry is already called {name:?} in the discovery directory")
            }
        }
    }
}

/// What a class makes of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Claimed earlier: its link is this agent's.
    Claimed { name: String },
    /// To be linked now. `relink`: its PV exists and only the link was lost.
    Claim { name: String, target: String, relink: bool },
    /// The filter does not select it (type, size, rotational, model, vendor, exclude, limit).
    NotSelected(String),
    /// Selected, but not safe to claim.
    Refused(Refusal),
}

/// One class's verdict on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Class.
    pub class: String,
    /// Kernel name of the device.
    pub device: String,
    /// What the class makes of it.
    pub verdict: Verdict,
}

/// A change to a link in a class's discovery directory. The record is written before a link
/// is made and dropped after one is removed, so a crash in between leaves a record the next
/// pass settles, never a link nobody owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkAction {
    /// Make a new link (nothing is at the name).
    Create(ClaimRecord),
    /// Make again the lost link of a device whose PV exists (nothing is at the name).
    Relink(ClaimRecord),
    /// Point an existing link of ours elsewhere (its device moved, or is gone).
    Retarget(ClaimRecord),
    /// Remove a link of ours whose device has no PV and is no longer selected.
    Remove(ClaimRecord),
    /// Drop a record whose link is already gone.
    Forget(ClaimRecord),
    /// Lift the hold of a record whose device proved blank and unused again (the record as it
    /// becomes, without `held`).
    Release(ClaimRecord),
}

/// The whole outcome of one claim pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimPlan {
    /// Every (class with a selector, device) verdict.
    pub decisions: Vec<Decision>,
    /// Link changes to make.
    pub actions: Vec<LinkAction>,
    /// Links of ours that stay although their class no longer selects the device: their PV
    /// exists. (class, link name, why)
    pub kept: Vec<(String, String, String)>,
    /// Links of ours with no PV whose device shows something we did not put there: discovery
    /// must not publish them. (class, link name, what was found)
    pub held: Vec<(String, String, String)>,
    /// Kernel names of devices whose probe would settle a verdict or a hold.
    pub to_probe: BTreeSet<String>,
    /// Claimed devices whose PV is unbound and that show something the agent did not put
    /// there: the PV is withdrawn (if still unbound: resourceVersion precondition) and the
    /// record held.
    pub tampered: Vec<Tampered>,
}

/// A claimed device changed under its unbound PV (see [`ClaimPlan::tampered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tampered {
    /// Class of the link.
    pub class: String,
    /// Link name.
    pub name: String,
    /// The PV's host path.
    pub host_path: String,
    /// What was found.
    pub why: String,
}

/// The link name for a device's stable id: the same on every boot and in every order of
/// enumeration, a valid file name, and distinct for distinct ids (a hash of the whole id is
/// added whenever the readable part is not the id itself).
pub fn link_name(stable_id: &str) -> String {
    let hash = format!("{:08x}", fnv1a32(&[stable_id.as_bytes()]));
    let (disk, part) = match stable_id.rsplit_once("/part") {
        Some((disk, rest)) => (disk, rest.split('@').next()),
        None => (stable_id, None),
    };
    let (kind, value) = disk.split_once(':').unwrap_or(("disk", disk));
    // A loop id in the current format (it names no path: see core::identity::disk_identity).
    let current_loop = LoopKey::parse(stable_id).filter(|k| k.dev.is_some());
    let readable = match (kind, current_loop) {
        // A loop device is its backing file's inode; the hash covers its filesystem and range.
        ("loop", Some(key)) => format!("loop-{}", key.ino),
        // An id of an earlier version, by the backing file's path: its name.
        ("loop", None) => {
            let path = value.split('@').next().unwrap_or(value);
            format!("loop-{}", path.rsplit('/').next().unwrap_or(path))
        }
        ("dm", _) => match value.strip_prefix("mpath-") {
            Some(uuid) => format!("mpath-{uuid}"),
            None => format!("dm-{value}"),
        },
        _ => format!("{kind}-{value}"),
    };
    let mut name: String =
        readable.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let exact = name == readable && kind != "loop" && part.is_none();
    if let Some(n) = part {
        name.push_str("-part");
        name.extend(n.chars().filter(char::is_ascii_digit));
    }
    if !exact || name.len() > 96 {
        name.truncate(96);
        name.push('-');
        name.push_str(&hash);
    }
    name
}

/// Where a claim link points: the device's /dev/disk/by-id name (the most stable kind first;
/// for a multipath device its map's own name, which udev never moves to one of the paths).
/// Only a loop device (or a partition of one) may be linked by its /dev node: any other disk's
/// node can be another disk after a reboot, before the agent runs, and kubelet would hand that
/// one to the pod. `None`: no name to link by (yet; udev may still be making it).
pub fn link_target(device: &DeviceFacts) -> Option<String> {
    let multipath = device.kind == Some(DeviceKind::Selectable(DeviceType::Multipath));
    let order: &[&str] = if multipath {
        &["dm-uuid-mpath-", "wwn-", "dm-name-"]
    } else {
        &["wwn-", "nvme-eui.", "scsi-3", "nvme-", "scsi-", "ata-", "virtio-"]
    };
    let rank = |id: &str| order.iter().position(|p| id.starts_with(p)).unwrap_or(order.len());
    // Names udev derives from the content (an LVM or md UUID) change when the content does.
    let by_id = device
        .by_id
        .iter()
        .filter(|id| !id.starts_with("lvm-pv-uuid-") && !id.starts_with("md-uuid-"))
        .min_by_key(|id| (rank(id), (*id).clone()))
        .map(|id| format!("/dev/disk/by-id/{id}"));
    let loop_backed = device.stable_id.as_deref().is_some_and(|id| id.starts_with("loop:"));
    by_id.or_else(|| loop_backed.then(|| format!("/dev/{}", device.name)))
}

/// Whether a link's target is a /dev/disk/by-id name.
fn is_by_id(target: &str) -> bool {
    target.starts_with("/dev/disk/by-id/")
}

/// The filter part of the rules: why `selector` does not select `device`, if it does not.
pub fn not_selected(selector: &DeviceSelector, device: &DeviceFacts) -> Option<String> {
    match &device.kind {
        Some(DeviceKind::Selectable(t)) if selector.types.contains(t) => {}
        Some(DeviceKind::Other(kind)) => return Some(format!("type {kind} is never claimed")),
        Some(kind) => {
            let types: Vec<&str> = selector.types.iter().map(|t| t.as_str()).collect();
            return Some(format!("type {kind} is not in types [{}]", types.join(", ")));
        }
        None => return Some("its type is unknown".into()),
    }
    if let Some(min) = selector.min_size.filter(|m| device.size < *m) {
        return Some(format!("{} is below minSize {}", sized(device.size), sized(min)));
    }
    if let Some(max) = selector.max_size.filter(|m| device.size > *m) {
        return Some(format!("{} is above maxSize {}", sized(device.size), sized(max)));
    }
    if let Some(want) = selector.rotational {
        match device.rotational {
            Some(r) if r == want => {}
            Some(r) => return Some(format!("rotational is {r}, the class wants {want}")),
            None => return Some("sysfs does not say whether it is rotational".into()),
        }
    }
    for (globs, value, what) in
        [(&selector.models, &device.model, "model"), (&selector.vendors, &device.vendor, "vendor")]
    {
        if globs.is_empty() {
            continue;
        }
        let Some(value) = value.as_deref() else {
            return Some(format!("sysfs gives no {what}, and the class selects by {what}"));
        };
        if any_glob_matches(globs, [value]).is_none() {
            return Some(format!("{what} {value:?} matches none of {globs:?}"));
        }
    }
    let names = device.names();
    if let Some(glob) = any_glob_matches(&selector.exclude, names.iter().map(String::as_str)) {
        return Some(format!("excluded by {glob:?}"));
    }
    None
}

/// Whether two stable ids name overlapping data: the same device, a disk and one of its
/// partitions, two partitions of one disk at the same start whatever their numbers (ids carry
/// no sizes: see core::identity::disk_identity::spans_share), or two loop devices over overlapping
/// ranges of one backing file (ids of either format: see core::identity::disk_identity::LoopKey).
pub fn ids_overlap(a: &str, b: &str) -> bool {
    if let (Some(x), Some(y)) = (LoopKey::parse(a), LoopKey::parse(b)) {
        return x.overlaps(&y);
    }
    devices_share(a, None, b, None, lun_key).is_some_and(|s| s != Shared::Apart)
}

/// One spelling for the ids of one LUN: a multipath map's UUID is `mpath-` and the LUN's
/// designator in hex with its type first (3 for NAA, 2 for EUI-64), while each path reports
/// the same designator as `naa.`/`eui.` in its WWID. Without this, a path of a claimed
/// multipath device would look like another disk. Takes a whole device's id.
fn lun_key(disk: &str) -> String {
    let lower = disk.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("dm:mpath-3") {
        format!("lun:naa.{rest}")
    } else if let Some(rest) = lower.strip_prefix("dm:mpath-2") {
        format!("lun:eui.{rest}")
    } else if let Some(rest) = lower.strip_prefix("wwid:naa.").or_else(|| lower.strip_prefix("wwid:0x")) {
        format!("lun:naa.{rest}")
    } else if let Some(rest) = lower.strip_prefix("wwid:eui.") {
        format!("lun:eui.{rest}")
    } else {
        disk.to_string()
    }
}

/// Everything one claim pass looks at.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// Every class of the config (those without a selector too: their old links are let go).
    pub classes: Vec<ClassClaims>,
    /// Every block device of the node.
    pub devices: Vec<DeviceFacts>,
    /// Every entry of every class's discovery directory.
    pub entries: Vec<DirEntry>,
    /// The links this agent made.
    pub records: Vec<ClaimRecord>,
    /// This node's PVs.
    pub pvs: Vec<PvDisk>,
    /// Classes of the config whose discovery directory could not be scanned: their entries
    /// are unknown, so no new device is claimed while there are any.
    pub unscanned: Vec<String>,
    /// Whether `pvs` is this node's PVs (the agent) or unknown (the `disks` and `discover`
    /// commands, which have no cluster): then a recorded device is never probed or held, since
    /// it may be a tenant's.
    pub pvs_known: bool,
    /// Why the processes in this agent's `/proc` are not the host's, when they are not
    /// (core::devices::activity::host_processes_seen: a pod without hostPID). Then no scan of open
    /// descriptors proves a device unused: no device is claimed, and a recorded one is judged
    /// as one that does not answer.
    pub host_processes_unseen: Option<String>,
}

/// The safety rules for one device a class's filter selects (see the module documentation).
/// `name` is its link name; `expected_path` the PV path that link would have.
fn judge(world: &World, class: &ClassClaims, device: &DeviceFacts, stable_id: &str) -> Verdict {
    let name = link_name(stable_id);
    let expected_path = host_path(&class.host_dir, &name);
    let target = link_target(device);
    // Any other claim of this disk, of a partition of it, or of the same LUN by another path.
    if let Some(other) = world.records.iter().find(|r| ids_overlap(&r.disk, stable_id)) {
        return Verdict::Refused(Refusal::ClaimedElsewhere(format!("{} (link {})", other.class, other.name)));
    }
    // The PV of this very link exists: the link was lost (a volatile hostDir after a reboot,
    // or deleted by hand); bring it back, whatever the tenant wrote on the disk.
    if world.pvs.iter().any(|pv| pv.host_path == expected_path && pv.disk.as_deref() == Some(stable_id))
        && !world.entries.iter().any(|e| e.class == class.class && e.name == name)
    {
        return match target {
            Some(target) => Verdict::Claim { name, target, relink: true },
            None => Verdict::Refused(Refusal::NoById),
        };
    }
    if let Some(pv) = world.pvs.iter().find(|pv| pv.disk.as_deref().is_some_and(|d| ids_overlap(d, stable_id))) {
        return Verdict::Refused(Refusal::AlreadyVolume(format!("the PV at {} recorded this disk", pv.host_path)));
    }
    let related = |n: &String| {
        *n == device.name
            || device.sharing.contains(n)
            || device.partitions.contains(n)
            || device.parent.as_ref() == Some(n)
    };
    if let Some(pv) = world.pvs.iter().find(|pv| pv.device.as_ref().is_some_and(related)) {
        return Verdict::Refused(Refusal::AlreadyVolume(format!("the PV at {} leads to it", pv.host_path)));
    }
    if !world.unscanned.is_empty() {
        return Verdict::Refused(Refusal::Unscanned(world.unscanned.clone()));
    }
    if let Some(e) = world.entries.iter().find(|e| e.device.as_ref().is_some_and(related)) {
        return Verdict::Refused(Refusal::AlreadyVolume(format!(
            "entry {} of class {} leads to {}",
            e.name,
            e.class,
            e.device.as_deref().unwrap_or("?")
        )));
    }
    // A loop device, or a partition of one (its id says so): labs and tests, named by file.
    let loop_backed = stable_id.starts_with("loop:");
    let refusal = if device.by_id.is_empty() && !loop_backed {
        Some(Refusal::NoById)
    } else if device.read_only {
        Some(Refusal::ReadOnly)
    } else if device.removable {
        Some(Refusal::Removable)
    } else if device.hidden {
        Some(Refusal::Hidden)
    } else if !device.partitions.is_empty() {
        Some(Refusal::Partitioned(device.partitions.clone()))
    } else if !device.holders.is_empty() {
        Some(Refusal::Held(device.holders.clone()))
    } else if !device.probe.done {
        Some(Refusal::NotProbed)
    } else if let Some(why) = &device.probe.in_use {
        Some(Refusal::InUse(why.clone()))
    } else if let Some(why) = &device.probe.activity {
        Some(Refusal::Writer(why.clone()))
    } else if let Some(why) = &world.host_processes_unseen {
        Some(Refusal::HostProcessesUnseen(why.clone()))
    } else {
        match &device.probe.content {
            Content::Blank if class.selector.as_ref().is_some_and(|s| s.verify == Verify::Full) => {
                match &device.full_read {
                    FullRead::Data { offset } => Some(Refusal::NotBlank(format!(
                        "data at byte {}, found by the full read",
                        offset_text(*offset)
                    ))),
                    other => other.pending().map(Refusal::Verifying),
                }
            }
            Content::Blank => None,
            Content::Busy => Some(Refusal::InUse("someone opened it exclusively".into())),
            Content::NotBlank(what) => Some(Refusal::NotBlank(what.clone())),
            Content::Unreadable(e) => Some(Refusal::Unreadable(e.clone())),
            Content::Unresponsive(e) => Some(Refusal::Unresponsive(e.clone())),
            Content::NotProbed => Some(Refusal::NotProbed),
        }
    };
    if let Some(r) = refusal {
        return Verdict::Refused(r);
    }
    let matches_pattern = NamePattern::parse(&class.name_pattern).is_ok_and(|p| p.matches(&name));
    if !matches_pattern {
        return Verdict::Refused(Refusal::NameMismatch { name, pattern: class.name_pattern.clone() });
    }
    if world.entries.iter().any(|e| e.class == class.class && e.name == name) {
        return Verdict::Refused(Refusal::NameTaken(name));
    }
    match target {
        Some(target) => Verdict::Claim { name, target, relink: false },
        None => Verdict::Refused(Refusal::NoById),
    }
}

/// The claim pass: every class's verdict on every device, the link changes to make, and the
/// links to hold back from discovery. Devices are taken in order of stable id, so the same
/// ones are chosen on every pass and node when a class has a maxPerNode.
pub fn plan(world: &World) -> ClaimPlan {
    let mut out = ClaimPlan::default();
    let mut devices: Vec<&DeviceFacts> = world.devices.iter().collect();
    devices.sort_by(|a, b| {
        (a.stable_id.is_none(), &a.stable_id, &a.name).cmp(&(b.stable_id.is_none(), &b.stable_id, &b.name))
    });
    // (class, device kernel name) pairs whose device the class still selects and has a record for.
    let mut still_selected: BTreeSet<(String, String)> = BTreeSet::new();
    // Devices claimed in this pass, so two classes never take the same one.
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    let by_id = devices_of_each_disk(&devices);
    for class in &world.classes {
        let Some(selector) = &class.selector else { continue };
        let mut count = world.records.iter().filter(|r| r.class == class.class).count();
        for device in &devices {
            let mut verdict = match not_selected(selector, device) {
                Some(why) => Verdict::NotSelected(why),
                None => match &device.stable_id {
                    None => Verdict::Refused(Refusal::NoStableId),
                    Some(id) => match world.records.iter().find(|r| r.class == class.class && r.disk == *id) {
                        Some(r) => {
                            still_selected.insert((class.class.clone(), device.name.clone()));
                            Verdict::Claimed { name: r.name.clone() }
                        }
                        None => match (taken.iter().find(|(t, _)| ids_overlap(t, id)), twins(&by_id, id, &device.name))
                        {
                            (Some((_, other)), _) => Verdict::Refused(Refusal::ClaimedElsewhere(other.clone())),
                            (None, Some(others)) => Verdict::Refused(Refusal::SameDisk(others)),
                            (None, None) => judge(world, class, device, id),
                        },
                    },
                },
            };
            if let Verdict::Claim { relink: false, .. } = verdict
                && selector.max_per_node.is_some_and(|max| count >= max as usize)
            {
                let max = selector.max_per_node.unwrap_or_default();
                verdict = Verdict::NotSelected(format!("the class already has maxPerNode ({max}) devices"));
            }
            if let (Verdict::Refused(Refusal::NotProbed), false) = (&verdict, device.probe.done) {
                out.to_probe.insert(device.name.clone());
            }
            if let (Verdict::Claim { name, target, relink }, Some(id)) = (&verdict, &device.stable_id) {
                count += 1;
                taken.insert(id.clone(), format!("{} (link {name})", class.class));
                let record = ClaimRecord {
                    class: class.class.clone(),
                    name: name.clone(),
                    host_path: host_path(&class.host_dir, name),
                    disk: id.clone(),
                    target: target.clone(),
                    previous: None,
                    held: None,
                };
                out.actions.push(if *relink { LinkAction::Relink(record) } else { LinkAction::Create(record) });
            }
            out.decisions.push(Decision { class: class.class.clone(), device: device.name.clone(), verdict });
        }
    }
    // Records of classes not scanned now (their directory unreadable, or the class gone from
    // the config) are left alone, their links as they are; they still keep other classes off
    // their devices (above).
    let scanned =
        |class: &str| world.classes.iter().any(|c| c.class == class) && !world.unscanned.iter().any(|u| u == class);
    for record in world.records.iter().filter(|r| scanned(&r.class)) {
        let devices: Vec<&DeviceFacts> = by_id.get(record.disk.as_str()).cloned().unwrap_or_default();
        settle_record(world, record, &devices, &still_selected, &mut out);
    }
    out
}

/// The devices reporting each stable id. More than one means two paths to one disk (without
/// multipath), two loop devices over one file, or two disks whose firmware reports one serial:
/// which is which cannot be told, so none of them is claimed.
fn devices_of_each_disk<'a>(sorted: &[&'a DeviceFacts]) -> BTreeMap<&'a str, Vec<&'a DeviceFacts>> {
    let mut out: BTreeMap<&str, Vec<&DeviceFacts>> = BTreeMap::new();
    for d in sorted {
        if let Some(id) = &d.stable_id {
            out.entry(id.as_str()).or_default().push(d);
        }
    }
    out
}

/// The id a device of the node reports now for a loop id recorded by an earlier version (in
/// a claim record or a PV's identity): the one id in `present` that names the same data (see
/// core::identity::disk_identity::LoopKey; `backing` is the recorded identity's, when there is one). Any
/// other id, and one that none or several present ids match, is returned as it is.
pub fn current_loop_id<'a>(recorded: &str, backing: Option<&str>, present: impl Iterator<Item = &'a str>) -> String {
    let Some(key) = LoopKey::parse(recorded).filter(|k| k.dev.is_none()).map(|k| k.with_backing(backing)) else {
        return recorded.to_string();
    };
    let mut found: Vec<&str> =
        present.filter(|id| LoopKey::parse(id).is_some_and(|k| k.dev.is_some() && k.same(&key))).collect();
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [one] => one.to_string(),
        _ => key.render().unwrap_or_else(|| recorded.to_string()),
    }
}

/// The other devices reporting `id`, when there are any.
fn twins(by_id: &BTreeMap<&str, Vec<&DeviceFacts>>, id: &str, name: &str) -> Option<String> {
    let others: Vec<&str> =
        by_id.get(id).into_iter().flatten().map(|d| d.name.as_str()).filter(|n| *n != name).collect();
    (!others.is_empty()).then(|| others.join(", "))
}

/// What becomes of one link this agent made (see [`plan`]). `devices`: those reporting its
/// disk's stable id now (normally one).
fn settle_record(
    world: &World,
    r: &ClaimRecord,
    devices: &[&DeviceFacts],
    still_selected: &BTreeSet<(String, String)>,
    out: &mut ClaimPlan,
) {
    let has_pv = world.pvs.iter().any(|pv| pv.host_path == r.host_path);
    let device = match devices {
        [one] => Some(*one),
        _ => None,
    };
    let wanted = device.is_some_and(|d| still_selected.contains(&(r.class.clone(), d.name.clone())));
    let entry = world.entries.iter().find(|e| e.class == r.class && e.name == r.name);
    // Ours: as this agent wrote it, or as it was before a re-pointing cut short by a crash.
    let ours =
        |e: &DirEntry| e.link.is_some() && (e.link.as_deref() == Some(r.target.as_str()) || e.link == r.previous);
    let remade = |target: String| ClaimRecord { target, previous: None, ..r.clone() };
    let repointed = |target: String| ClaimRecord { target, previous: Some(r.target.clone()), ..r.clone() };
    let kept = |out: &mut ClaimPlan, why: String| out.kept.push((r.class.clone(), r.name.clone(), why));
    let Some(e) = entry else {
        match (has_pv, device.and_then(link_target)) {
            // Its PV exists: made again, to its own device, by a name that survives a reboot
            // (none yet: udev may still be making it; the next change brings another pass).
            (true, Some(target)) => out.actions.push(LinkAction::Relink(remade(target))),
            (true, None) => {
                kept(out, "its link is gone and cannot be made again yet (no by-id name, or not one device)".into())
            }
            // Gone and no PV: judged afresh as a new device, with every safety rule.
            (false, _) => out.actions.push(LinkAction::Forget(r.clone())),
        }
        return;
    };
    if e.unanswered {
        return kept(out, "its link does not answer (the look at it passed its deadline); left as it is".into());
    }
    if !ours(e) {
        // Not a symlink any more, or pointing where this agent never pointed it: someone put
        // something else there, and it is theirs now, left as it is.
        return out.actions.push(LinkAction::Forget(r.clone()));
    }
    if devices.len() > 1 {
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        return kept(
            out,
            format!("{} report its stable id; the link is left as it is until one goes", names.join(", ")),
        );
    }
    if !wanted && !has_pv {
        return out.actions.push(LinkAction::Remove(r.clone()));
    }
    if !wanted {
        let why = match device {
            Some(_) => "the class no longer selects this device; the link stays while its PV exists",
            None => "its device is not on the node; the link stays while its PV exists",
        };
        kept(out, why.into());
    }
    let now = e.link.as_deref().unwrap_or_default();
    let absent = format!("{ABSENT_TARGET_DIR}/{}", r.name);
    match (device, device.and_then(link_target)) {
        // Its device moved (a loop device attached again in another order), or a by-id name
        // now exists for a link made by its /dev node.
        (Some(d), Some(target))
            if e.device.as_deref() != Some(d.name.as_str()) || (!is_by_id(now) && is_by_id(&target)) =>
        {
            out.actions.push(LinkAction::Retarget(repointed(target)))
        }
        // It leads to another device and its own has no safe name (or is gone): nowhere.
        (Some(d), None) if e.device.is_some() && e.device.as_deref() != Some(d.name.as_str()) => {
            out.actions.push(LinkAction::Retarget(repointed(absent)))
        }
        (None, _) if e.device.is_some() => out.actions.push(LinkAction::Retarget(repointed(absent))),
        _ => {}
    }
    judge_record(world, r, device, wanted, has_pv, out);
}

/// What a recorded device shows that nobody may have put there while no tenant has it: in
/// use, used by a writer, or anything in its signature areas. `None`: blank and unused.
fn foreign_finding(d: &DeviceFacts) -> Option<String> {
    match (&d.probe.in_use, &d.probe.activity, &d.probe.content) {
        (Some(why), _, _) => Some(format!("it is in use ({why})")),
        (None, Some(why), _) => Some(format!("it is in use ({why})")),
        (None, None, Content::Blank) => None,
        (None, None, Content::NotBlank(what)) => Some(what.clone()),
        (None, None, Content::Busy) => Some("it is open exclusively by someone".into()),
        (None, None, Content::Unreadable(why)) => Some(format!("it cannot be read ({why})")),
        (None, None, Content::Unresponsive(why)) => Some(format!("it does not answer ({why})")),
        (None, None, Content::NotProbed) => Some("it was not read".into()),
    }
}

/// The checks of a recorded device that no tenant has: before it is published (again), while
/// its PV is unbound, and while it is held. A device whose PV is bound or released is the
/// tenant's (its data, kubelet's filesystem) and is never probed or judged here. Without this
/// node's PVs (the commands) a recorded device may be a tenant's, and is neither probed nor
/// judged.
fn judge_record(
    world: &World,
    r: &ClaimRecord,
    device: Option<&DeviceFacts>,
    wanted: bool,
    has_pv: bool,
    out: &mut ClaimPlan,
) {
    let pv_unbound = world.pvs.iter().any(|pv| pv.host_path == r.host_path && pv.unbound);
    let hold = |out: &mut ClaimPlan, what: String| out.held.push((r.class.clone(), r.name.clone(), what));
    let tampered = |out: &mut ClaimPlan, why: String| {
        out.tampered.push(Tampered {
            class: r.class.clone(),
            name: r.name.clone(),
            host_path: r.host_path.clone(),
            why,
        })
    };
    let judged = world.pvs_known && ((wanted && !has_pv) || pv_unbound || (r.held.is_some() && !has_pv));
    let Some(d) = device.filter(|_| judged) else {
        // Not judged now (gone, a tenant's, or no PVs known): a hold stays as it is.
        if let (Some(why), false) = (&r.held, has_pv && !pv_unbound) {
            hold(out, why.clone());
        }
        return;
    };
    if !d.probe.done {
        out.to_probe.insert(d.name.clone());
        if let Some(why) = &r.held {
            hold(out, why.clone());
        }
        return;
    }
    // A device that does not answer proves nothing either way: its PV keeps its state and a
    // hold stays, until it answers again. It is never published meanwhile.
    if let Content::Unresponsive(why) = &d.probe.content {
        let why = r.held.clone().unwrap_or_else(|| format!("it does not answer: {why}"));
        if !has_pv || pv_unbound {
            hold(out, why);
        }
        return;
    }
    // Without the host's processes nothing proves it unused either: the same, unless the probe
    // found it in use or used by a writer, which stands.
    if let (Some(why), None, None) = (&world.host_processes_unseen, &d.probe.in_use, &d.probe.activity) {
        let why = r.held.clone().unwrap_or_else(|| Refusal::HostProcessesUnseen(why.clone()).to_string());
        if !has_pv || pv_unbound {
            hold(out, why);
        }
        return;
    }
    let found = foreign_finding(d);
    match (&r.held, found) {
        (Some(why), _) if pv_unbound => {
            tampered(out, why.clone());
            hold(out, why.clone());
        }
        (Some(why), Some(now)) => hold(out, format!("{why}; now: {now}")),
        (Some(_), None) => out.actions.push(LinkAction::Release(ClaimRecord { held: None, ..r.clone() })),
        (None, Some(now)) if pv_unbound => {
            let why = format!("while its PV was unbound: {now}");
            tampered(out, why.clone());
            hold(out, why);
        }
        (None, Some(now)) => hold(out, now),
        (None, None) => {}
    }
}

/// The unbound PVs to withdraw for the tampered devices of a plan: only those that are still
/// unbound and not being deleted as the agent's store shows them, each with the
/// resourceVersion seen, so a PV bound meanwhile is left alone (the delete fails on it).
/// Returns (PV name, UID, resourceVersion, tampered device).
pub fn tamper_withdrawals<'a>(
    pvs: &[crate::core::wipe::cleanup::PvState],
    tampered: &'a [Tampered],
) -> Vec<(String, String, String, &'a Tampered)> {
    let mut out: Vec<(String, String, String, &Tampered)> = tampered
        .iter()
        .filter_map(|t| {
            let pv = pvs.iter().find(|pv| {
                pv.host_path == t.host_path
                    && !pv.deleting
                    && !pv.claimed
                    && matches!(pv.phase.as_str(), "Available" | "Pending")
            })?;
            Some((pv.name.clone(), pv.uid.clone(), pv.resource_version.clone(), t))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// A size for people, exact where the unit rounds: `16 MiB (16777216 bytes)`.
fn sized(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", crate::core::volumes::capacity::iec(bytes))
}

#[cfg(test)]
#[path = "device_claim_tests.rs"]
mod tests;
