//! What kubelet has mounted for pods, as this agent sees it: the host side of the rule that a
//! wipe waits until kubelet has unmounted the volume (core::volumes::volume_safety::kubelet_mount_of).
//! In a pod the agent sees kubelet's mounts only through hostPaths of the directories kubelet
//! mounts local volumes in (core::volumes::volume_safety::KUBELET_LOCAL_VOLUME_DIRS: `pods/` and the
//! local-volume plugin's two directories), read-only with `mountPropagation: HostToContainer`,
//! at the same paths (deploy/ and the chart mount them; kubelet's whole directory works too);
//! without that view it cannot tell, and refuses to wipe.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::core::volumes::volume_safety::{
    KUBELET_LOCAL_VOLUME_DIRS, KubeletMount, WipeSubject, kubelet_mount_of, kubelet_mounts_visible,
};
use crate::host::HostError;
use crate::host::mounts::mountinfo::MountTable;

/// Where kubelet keeps pods' mounts, and whether this agent must be able to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletView {
    /// kubelet's root directory (`--root-dir`), at the same path inside the agent's container.
    pub dir: PathBuf,
    /// Set when the agent runs in a pod: there a missing directory means the hostPath is not
    /// mounted, not that no kubelet runs, so no wipe may start. A process on a host without a
    /// kubelet (the local demo, tests) has nothing to wait for.
    pub required: bool,
}

/// Why kubelet's hold on a volume could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The agent runs in a pod but a directory kubelet mounts local volumes in (`unseen`, below
    /// kubelet's directory `dir`) is not mounted from the host in it.
    #[error(
        "cannot see kubelet's mounts: {unseen} is not mounted from the host in this container, so nothing shows whether a pod still has the volume mounted there; mount the host's {dir}/pods, {dir}/plugins/kubernetes.io~local-volume and {dir}/plugins/kubernetes.io/local-volume at the same paths (read-only, mountPropagation: HostToContainer) as deploy/ and the chart do, or point --kubelet-dir at kubelet's --root-dir"
    )]
    NotVisible { dir: PathBuf, unseen: PathBuf },
    /// A mount point or the volume could not be examined.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// The volume at `path`, as a wipe subject: the filesystem mounted at `path`, or the block device
/// `path` is (or links to). Owned, to borrow into [`WipeSubject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Filesystem { device: String, root: PathBuf },
    Device { rdev: String },
}

impl Subject {
    /// The filesystem mounted exactly at `root` (a volume's resolved root), if one is.
    pub fn filesystem_at(root: &Path, mounts: &MountTable) -> Option<Subject> {
        mounts.get(root).map(|m| Subject::Filesystem { device: m.device.clone(), root: m.root.clone() })
    }

    /// The block device at `path` (followed: the caller established it is one).
    pub fn device_at(path: &Path) -> Result<Subject, HostError> {
        let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
        Ok(Subject::Device { rdev: major_minor(meta.rdev()) })
    }

    fn borrowed(&self) -> WipeSubject<'_> {
        match self {
            Subject::Filesystem { device, root } => WipeSubject::Filesystem { device, root },
            Subject::Device { rdev } => WipeSubject::Device { rdev },
        }
    }
}

impl KubeletView {
    /// Where kubelet still has `subject` mounted for a pod (see the module doc), from `mounts`
    /// and a look at each mount point below kubelet's directory (a bind-mounted device node
    /// shows the device it is).
    pub fn holder(&self, subject: &Subject, mounts: &MountTable) -> Result<Option<PathBuf>, KubeletError> {
        let not_visible =
            |unseen: &Path| KubeletError::NotVisible { dir: self.dir.clone(), unseen: unseen.to_path_buf() };
        // The mount table names real paths: a kubelet directory reached through a symlink is
        // looked for where it really is.
        let dir = match std::fs::canonicalize(&self.dir) {
            Ok(dir) if dir.is_dir() => dir,
            _ if self.required => return Err(not_visible(&self.dir)),
            _ => return Ok(None),
        };
        if self.required
            && let Some(unseen) = unseen_dir(&dir, mounts)
        {
            return Err(not_visible(&unseen));
        }
        let below: Vec<_> = mounts.mounts_below(&dir).collect();
        let mut nodes = Vec::with_capacity(below.len());
        for m in &below {
            nodes.push(match std::fs::symlink_metadata(&m.mount_point) {
                Ok(meta) if meta.file_type().is_block_device() => Some(major_minor(meta.rdev())),
                Ok(_) => None,
                // Unmounted since the table was read: it holds nothing any more.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(HostError::io("lstat", &m.mount_point, e).into()),
            });
        }
        let facts: Vec<_> = below
            .iter()
            .zip(&nodes)
            .map(|(m, node)| KubeletMount { mount: m.facts(), node_rdev: node.as_deref() })
            .collect();
        Ok(kubelet_mount_of(subject.borrowed(), &facts, &dir).map(Path::to_path_buf))
    }
}

/// The first directory kubelet mounts local volumes in, below `dir` (resolved), whose mounts do
/// not show in this container (`kubelet_mounts_visible` of core::volumes::volume_safety): judged at the
/// directory, or at its nearest existing parent inside `dir` when kubelet has not made it yet
/// (a whole-directory mount shows it once made; narrower hostPaths make it beforehand).
fn unseen_dir(dir: &Path, mounts: &MountTable) -> Option<PathBuf> {
    let facts = mounts.facts();
    KUBELET_LOCAL_VOLUME_DIRS.iter().map(|sub| dir.join(sub)).find(|wanted| {
        let nearest = wanted.ancestors().take_while(|p| p.starts_with(dir)).find(|p| p.is_dir());
        !nearest.and_then(|p| std::fs::canonicalize(p).ok()).is_some_and(|p| kubelet_mounts_visible(&p, &facts))
    })
}

/// `major:minor` as the mount table writes a device number.
fn major_minor(dev: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(dev), nix::sys::stat::minor(dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_holds_nothing_off_a_pod_and_refuses_in_one() {
        let mounts = MountTable::parse("").unwrap();
        let subject = Subject::Device { rdev: "7:0".into() };
        let off_pod = KubeletView { dir: PathBuf::from("/nonexistent/kubelet"), required: false };
        assert_eq!(off_pod.holder(&subject, &mounts).unwrap(), None);
        let in_pod = KubeletView { required: true, ..off_pod };
        let err = in_pod.holder(&subject, &mounts).unwrap_err();
        assert!(matches!(err, KubeletError::NotVisible { .. }));
        assert!(err.to_string().contains("/nonexistent/kubelet"), "{err}");
    }

    #[test]
    fn in_a_pod_the_directory_must_come_from_a_mount() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let subject = Subject::Device { rdev: "7:0".into() };
        let view = KubeletView { dir: real.clone(), required: true };
        // Only the container's root filesystem: the directory is the image's own.
        let root_only = MountTable::parse("1 0 0:30 / / rw - overlay overlay rw\n").unwrap();
        assert!(matches!(view.holder(&subject, &root_only), Err(KubeletError::NotVisible { .. })));
        // A hostPath mount at it (or above it, other than /) shows the host's mounts.
        for point in [real.clone(), real.parent().unwrap().to_path_buf()] {
            let table = format!(
                "1 0 0:30 / / rw - overlay overlay rw\n2 1 254:0 /x {} rw - ext4 /dev/vda rw\n",
                point.display()
            );
            let mounts = MountTable::parse(&table).unwrap();
            assert_eq!(view.holder(&subject, &mounts).unwrap(), None, "mounted at {}", point.display());
        }
        // Off a pod nothing is required of it.
        let host = KubeletView { required: false, ..view };
        assert_eq!(host.holder(&subject, &root_only).unwrap(), None);
    }

    #[test]
    fn a_pod_mount_of_the_filesystem_is_found_in_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet");
        std::fs::create_dir(&kubelet).unwrap();
        let pod = kubelet.join("pods/u1/volumes/kubernetes.io~local-volume/pv1");
        let table = format!(
            "29 1 254:0 /var/lib/kubelet {k} rw - ext4 /dev/vda rw\n30 1 0:40 / /mnt/disks/vol1 rw - tmpfs tmpfs rw\n31 29 0:40 / {} rw - tmpfs tmpfs rw\n32 29 0:41 / {k}/pods/u2/x rw - tmpfs tmpfs rw\n",
            pod.display(),
            k = kubelet.display()
        );
        let mounts = MountTable::parse(&table).unwrap();
        let view = KubeletView { dir: kubelet.clone(), required: true };
        let vol1 = Subject::filesystem_at(Path::new("/mnt/disks/vol1"), &mounts).unwrap();
        assert_eq!(view.holder(&vol1, &mounts).unwrap(), Some(pod.clone()));
        // Named through a symlink, the directory is looked for where it is.
        let link = dir.path().join("kubelet-link");
        std::os::unix::fs::symlink(&kubelet, &link).unwrap();
        let through_link = KubeletView { dir: link, required: true };
        assert_eq!(through_link.holder(&vol1, &mounts).unwrap(), Some(pod));
        let other = Subject::Filesystem { device: "0:42".into(), root: "/".into() };
        assert_eq!(view.holder(&other, &mounts).unwrap(), None);
    }

    /// The layout deploy/ and the chart mount: only kubelet's `pods/` and the local-volume
    /// plugin's two directories, each a hostPath at its own path, below a kubelet directory of
    /// the container's root filesystem.
    fn narrow_layout(kubelet: &Path) -> String {
        let mut table = String::from("1 0 0:30 / / rw - overlay overlay rw\n");
        for (i, sub) in KUBELET_LOCAL_VOLUME_DIRS.iter().enumerate() {
            std::fs::create_dir_all(kubelet.join(sub)).unwrap();
            table.push_str(&format!(
                "{} 1 254:0 /var/lib/kubelet/{sub} {} ro - ext4 /dev/vda rw\n",
                10 + i,
                kubelet.join(sub).display()
            ));
        }
        table
    }

    #[test]
    fn the_narrow_layout_shows_kubelets_mounts_and_each_of_its_mounts_is_needed() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = std::fs::canonicalize(dir.path()).unwrap().join("kubelet");
        let table = narrow_layout(&kubelet);
        let view = KubeletView { dir: kubelet.clone(), required: true };
        let vol1 = Subject::Filesystem { device: "0:40".into(), root: "/".into() };
        assert_eq!(view.holder(&vol1, &MountTable::parse(&table).unwrap()).unwrap(), None);
        // A pod's mount of the volume, and kubelet's own mount of a block device it formatted.
        for at in ["pods/u1/volumes/kubernetes.io~local-volume/pv1", "plugins/kubernetes.io/local-volume/mounts/pv1"] {
            let point = kubelet.join(at);
            let held = format!("{table}40 10 0:40 / {} rw - xfs /dev/sdb rw\n", point.display());
            assert_eq!(view.holder(&vol1, &MountTable::parse(&held).unwrap()).unwrap(), Some(point));
        }
        // Without any one of the three mounts the agent cannot tell, whatever else it sees.
        for (i, sub) in KUBELET_LOCAL_VOLUME_DIRS.iter().enumerate() {
            let without: String =
                table.lines().filter(|l| !l.starts_with(&format!("{} ", 10 + i))).map(|l| format!("{l}\n")).collect();
            let err = view.holder(&vol1, &MountTable::parse(&without).unwrap()).unwrap_err();
            match &err {
                KubeletError::NotVisible { dir, unseen } => {
                    assert_eq!((dir, unseen), (&kubelet, &kubelet.join(sub)));
                }
                other => panic!("{other:?}"),
            }
            let text = err.to_string();
            assert!(
                text.contains(&format!("{}/pods", kubelet.display())) && text.contains("HostToContainer"),
                "{text}"
            );
        }
        // One removed on the host after the container started shows nothing kubelet mounts now.
        let deleted = table.replace("/var/lib/kubelet/pods ", "/var/lib/kubelet/pods//deleted ");
        assert!(matches!(
            view.holder(&vol1, &MountTable::parse(&deleted).unwrap()),
            Err(KubeletError::NotVisible { unseen, .. }) if unseen == kubelet.join("pods")
        ));
    }

    #[test]
    fn a_directory_kubelet_has_not_made_yet_is_seen_through_a_mount_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = std::fs::canonicalize(dir.path()).unwrap().join("kubelet");
        std::fs::create_dir_all(kubelet.join("pods")).unwrap();
        let view = KubeletView { dir: kubelet.clone(), required: true };
        let subject = Subject::Device { rdev: "7:0".into() };
        // kubelet's whole directory mounted: plugins/ appears in it once kubelet makes it.
        let whole = format!(
            "1 0 0:30 / / rw - overlay overlay rw\n2 1 254:0 /var/lib/kubelet {} ro - ext4 /dev/vda rw\n",
            kubelet.display()
        );
        assert_eq!(view.holder(&subject, &MountTable::parse(&whole).unwrap()).unwrap(), None);
        // Only pods/ mounted: the plugin's directories, missing, would never show kubelet's mounts.
        let pods_only = format!(
            "1 0 0:30 / / rw - overlay overlay rw\n2 1 254:0 /var/lib/kubelet/pods {} ro - ext4 /dev/vda rw\n",
            kubelet.join("pods").display()
        );
        assert!(matches!(
            view.holder(&subject, &MountTable::parse(&pods_only).unwrap()),
            Err(KubeletError::NotVisible { unseen, .. }) if unseen == kubelet.join(KUBELET_LOCAL_VOLUME_DIRS[1])
        ));
    }
}
