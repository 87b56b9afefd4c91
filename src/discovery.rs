//! Discovery: which first-level entries of each class's discovery directory are volumes this
//! node can publish, and why every other entry is not. Reads the host through `host` only.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::{ClassConfig, ProvisionerConfig, VolumeMode};
use crate::core::capacity::round_down_pretty;
use crate::core::pattern::NamePattern;
use crate::core::pv::{FoundVolume, host_path};
use crate::host::HostError;
use crate::host::identity::volume_identity;
use crate::host::mountinfo::MountTable;
use crate::host::volume::{EntryKind, block_device_capacity, entry_kind, filesystem_capacity};

/// Why an entry was not turned into a volume; shown by `discover` and logged by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The whole discovery directory could not be read.
    UnreadableDirectory(String),
    /// The class's namePattern could not be parsed (validation normally prevents this).
    BadPattern(String),
    /// The name does not match namePattern.
    PatternMismatch(String),
    /// The name is not UTF-8 and cannot be a PV path.
    NotUtf8,
    /// A directory that is not a mount point: its space is the parent filesystem's.
    NotMountPoint,
    /// A directory in a Block class.
    DirectoryInBlockClass,
    /// Neither a directory nor a block device.
    NotDirectoryOrBlockDevice,
    /// stat/statfs/ioctl failed (dangling symlink, permissions...).
    Unreadable(String),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::UnreadableDirectory(e) => write!(f, "discovery directory unreadable: {e}"),
            SkipReason::BadPattern(e) => write!(f, "bad namePattern: {e}"),
            SkipReason::PatternMismatch(p) => write!(f, "name does not match namePattern {p:?}"),
            SkipReason::NotUtf8 => write!(f, "name is not valid UTF-8"),
            SkipReason::NotMountPoint => {
                write!(f, "directory is not a mount point (mount a filesystem there, or bind-mount it onto itself)")
            }
            SkipReason::DirectoryInBlockClass => {
                write!(f, "directory in a Block class (only block devices can be Block volumes)")
            }
            SkipReason::NotDirectoryOrBlockDevice => write!(f, "neither a directory nor a block device"),
            SkipReason::Unreadable(e) => write!(f, "{e}"),
        }
    }
}

/// One entry that was not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// StorageClass name.
    pub class: String,
    /// Path as seen by the agent (under mountDir).
    pub path: PathBuf,
    /// Why.
    pub reason: SkipReason,
}

/// The result of scanning every class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Volumes found, in class then entry order.
    pub volumes: Vec<FoundVolume>,
    /// Entries not published, with reasons.
    pub skipped: Vec<Skipped>,
}

/// Scans all classes against the current mount table.
pub fn scan(config: &ProvisionerConfig) -> Result<Scan, HostError> {
    let mounts = MountTable::read()?;
    Ok(scan_with(config, &mounts))
}

/// Scans all classes against a given mount table (one read of the table per pass).
pub fn scan_with(config: &ProvisionerConfig, mounts: &MountTable) -> Scan {
    let mut out = Scan::default();
    for (class, cfg) in &config.storage_class_map {
        scan_class(class, cfg, mounts, &mut out);
    }
    out
}

fn scan_class(class: &str, cfg: &ClassConfig, mounts: &MountTable, out: &mut Scan) {
    let mount_dir = Path::new(&cfg.mount_dir);
    let mut skip = |path: PathBuf, reason| out.skipped.push(Skipped { class: class.to_string(), path, reason });
    let pattern = match NamePattern::parse(&cfg.name_pattern) {
        Ok(p) => p,
        Err(e) => return skip(mount_dir.to_path_buf(), SkipReason::BadPattern(e)),
    };
    let mut names: Vec<_> = match std::fs::read_dir(mount_dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
        Err(e) => return skip(mount_dir.to_path_buf(), SkipReason::UnreadableDirectory(e.to_string())),
    };
    names.sort();
    let mut found = Vec::new();
    for name in names {
        let path = mount_dir.join(&name);
        let Some(name) = name.to_str() else {
            skip(path, SkipReason::NotUtf8);
            continue;
        };
        if !pattern.matches(name) {
            skip(path, SkipReason::PatternMismatch(cfg.name_pattern.clone()));
            continue;
        }
        let identity =
            |bytes| volume_identity(&path).map_err(|e| SkipReason::Unreadable(e.to_string())).map(|id| (bytes, id));
        match inspect(&path, cfg.volume_mode, mounts).and_then(identity) {
            Ok((bytes, identity)) => found.push(FoundVolume {
                class: class.to_string(),
                entry: name.to_string(),
                host_path: host_path(&cfg.host_dir, name),
                capacity_bytes: round_down_pretty(bytes),
                identity,
            }),
            Err(reason) => skip(path, reason),
        }
    }
    out.volumes.extend(found);
}

/// Decides whether one entry is a volume of the class's mode and returns its raw capacity.
fn inspect(path: &Path, mode: VolumeMode, mounts: &MountTable) -> Result<u64, SkipReason> {
    let unreadable = |e: HostError| SkipReason::Unreadable(e.to_string());
    match (entry_kind(path).map_err(unreadable)?, mode) {
        (EntryKind::Directory, VolumeMode::Block) => Err(SkipReason::DirectoryInBlockClass),
        (EntryKind::Directory, VolumeMode::Filesystem) => {
            // A symlink to a mounted directory counts: the mount table holds resolved paths.
            let resolved = std::fs::canonicalize(path).map_err(|e| unreadable(HostError::io("resolve", path, e)))?;
            if !mounts.is_mount_point(&resolved) {
                return Err(SkipReason::NotMountPoint);
            }
            filesystem_capacity(&resolved).map_err(unreadable)
        }
        // A block device in a Filesystem class is a Filesystem PV that kubelet formats.
        (EntryKind::BlockDevice, _) => block_device_capacity(path).map_err(unreadable),
        (EntryKind::Other, _) => Err(SkipReason::NotDirectoryOrBlockDevice),
    }
}
