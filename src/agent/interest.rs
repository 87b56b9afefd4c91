//! What the last pass depends on among the host's mounts and block devices
//! (core::mounts::mount_interest), told to the watches so that a change elsewhere (kubelet mounting a
//! pod's token, another program's loop device) costs no pass.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::Agent;
use crate::core::config::settings::VolumeMode;
use crate::core::mounts::mount_interest::{DeviceInterest, MountInterest};
use crate::core::volumes::volume_safety::DiskKey;
use crate::host::access::Observation;

impl Agent {
    /// Tells the mount watch and the block-device watch what this pass read: the discovery
    /// directories (as configured and as resolved), the disks of the volumes found and of the
    /// PVs whose disks were read, and whether block devices matter at all (a class claims
    /// devices or has volumeMode Block, or a Block volume was found).
    pub(super) fn say_interest(&self, observation: &Observation) {
        let classes = self.config.storage_class_map.values();
        let claims = classes.clone().any(|c| c.devices.is_some());
        let block_class = classes.clone().any(|c| c.volume_mode == VolumeMode::Block);
        let mut paths: BTreeSet<PathBuf> = classes.map(|c| PathBuf::from(&c.mount_dir)).collect();
        paths.extend(observation.scan.roots.iter().cloned());
        let disks = observation.scan.volumes.iter().map(|v| &v.disk);
        let disks: Vec<&DiskKey> = disks.chain(observation.disks.iter().flatten().map(|(_, d)| d)).collect();
        let mut devices = BTreeSet::new();
        for disk in &disks {
            devices.insert(disk.device().to_string());
            let extent = match disk {
                DiskKey::Filesystem { extent, .. } | DiskKey::Block { extent, .. } => extent,
            };
            if let Some(whole) = extent.as_ref().and_then(|e| e.base.strip_prefix("dev:")) {
                devices.insert(whole.to_string());
            }
        }
        let block_found = disks.iter().any(|d| matches!(d, DiskKey::Block { .. }));
        if let (Some(watch), Some(table)) = (&self.watches.mount_watch, &observation.mounts) {
            let interest = MountInterest {
                paths,
                devices: devices.clone(),
                kubelet_dir: None,
                block_devices: claims || block_class || block_found,
            };
            watch.set(interest, table);
        }
        if let Some(watch) = &self.watches.watch_needs {
            // Anonymous devices (tmpfs, btrfs, overlay) are no block device of the list.
            let on_disks = devices.into_iter().filter(|d| !d.starts_with("0:")).collect();
            watch.set_devices(DeviceInterest { all: claims || block_class || block_found, devices: on_disks });
        }
    }
}
