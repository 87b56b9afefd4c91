//! The provisioner configuration as the rest of the program reads it: the types of a parsed
//! ConfigMap with upstream's defaults. Pure data, so the core (PV construction, the claim
//! rules) uses it directly; `config` reads, checks and fills it in, and re-exports it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Toleration};
use serde::Serialize;

use crate::core::config::go_duration;
use crate::core::devices::device_selector::DeviceSelector;

/// Upstream's default block cleaner, kept so `validate-config` shows what upstream would run.
pub const DEFAULT_BLOCK_CLEANER: &str = "/scripts/quick_reset.sh";
/// Upstream's default resync period (Go's `5m0s`).
pub const DEFAULT_MIN_RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// Whether entries of a class become filesystem or raw block PVs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum VolumeMode {
    /// A mount point (or a block device kubelet formats with fsType).
    Filesystem,
    /// A raw block device handed to the pod as a device.
    Block,
}

impl VolumeMode {
    /// The value the Kubernetes API uses, so PVs match upstream's byte for byte.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }
}

/// Built-in block wipe methods a class can choose instead of an external command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockCleanMethod {
    /// Erase every signature area (partition tables, superblocks and their copies): seconds.
    Quick,
    /// Discard every block (TRIM/UNMAP), falling back to zeroing; then erase signatures.
    Discard,
    /// Write zeroes over the whole device (offloaded with BLKZEROOUT where supported).
    Zero,
}

impl BlockCleanMethod {
    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "quick" => Some(Self::Quick),
            "discard" => Some(Self::Discard),
            "zero" => Some(Self::Zero),
            _ => None,
        }
    }
}

/// Access modes the API accepts for a PV; anything else is a config error, not an API error
/// at publish time.
pub const ACCESS_MODES: [&str; 4] = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"];

/// One `storageClassMap` entry: which directory to watch and how its entries become PVs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassConfig {
    /// The directory on the host; PV paths are built from it because kubelet resolves them on
    /// the host, not in our container.
    pub host_dir: String,
    /// The same directory as mounted into the agent's container; discovery reads this one.
    pub mount_dir: String,
    /// Upstream's external block cleaner. Run as given when the program exists; upstream's own
    /// script paths fall back to the equivalent built-in method when it does not.
    pub block_cleaner_command: Vec<String>,
    /// Our built-in block wipe method; when set it is used instead of blockCleanerCommand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_clean_method: Option<BlockCleanMethod>,
    /// Filesystem or Block.
    pub volume_mode: VolumeMode,
    /// The single access mode every PV of this class gets.
    pub access_mode: String,
    /// Filesystem type kubelet formats a block device with (Filesystem mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<String>,
    /// Comma-separated Go `filepath.Match` globs; an entry is used if any one matches.
    pub name_pattern: String,
    /// Extra node selector terms, ORed with the node's own hostname term.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selector: Vec<NodeSelectorTerm>,
    /// Raw block devices the agent claims for this class by linking them into its discovery
    /// directory (see docs/devices.md); `None`: only what an operator puts there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceSelector>,
    /// `rootMode`: the mode the wipe gives a Filesystem volume's root (octal), instead of the
    /// one recorded at its first publication or a fresh filesystem's (core::wipe::volume_root).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "octal_mode")]
    pub root_mode: Option<u32>,
    /// `rootOwner`: the owner and group (numeric) the wipe gives a Filesystem volume's root.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "uid_gid")]
    pub root_owner: Option<(u32, u32)>,
    /// `encryption`: each volume's data encrypted at rest with its own key (core::volumes::encryption);
    /// `None`: volumes are published as they are, as upstream does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<crate::core::volumes::encryption::Encryption>,
}

impl ClassConfig {
    /// What the class's configuration says a wiped root is (core::wipe::volume_root).
    pub fn configured_root(&self) -> crate::core::wipe::volume_root::ConfiguredRoot {
        crate::core::wipe::volume_root::ConfiguredRoot { mode: self.root_mode, owner: self.root_owner }
    }
}

/// `rootMode` as written: `"0775"`, not a decimal number.
fn octal_mode<S: serde::Serializer>(mode: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match mode {
        Some(m) => s.serialize_str(&format!("{m:04o}")),
        None => s.serialize_none(),
    }
}

/// `rootOwner` as written: `"1000:1000"`.
fn uid_gid<S: serde::Serializer>(owner: &Option<(u32, u32)>, s: S) -> Result<S::Ok, S::Error> {
    match owner {
        Some((u, g)) => s.serialize_str(&format!("{u}:{g}")),
        None => s.serialize_none(),
    }
}

/// The whole configuration with every default filled in.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionerConfig {
    /// Per StorageClass discovery settings, keyed by class name.
    pub storage_class_map: BTreeMap<String, ClassConfig>,
    /// Node label keys copied onto every PV (when the node has them).
    #[serde(rename = "nodeLabelsForPV")]
    pub node_labels_for_pv: Vec<String>,
    /// Fixed labels added to every PV.
    #[serde(rename = "labelsForPV")]
    pub labels_for_pv: BTreeMap<String, String>,
    /// Put node affinity in the legacy alpha annotation instead of the spec field.
    #[serde(rename = "useAlphaAPI")]
    pub use_alpha_api: bool,
    /// Upstream's Job-based block cleaning; accepted for compatibility.
    pub use_job_for_cleaning: bool,
    /// Tolerations for upstream's cleaning Jobs; accepted for compatibility.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub job_tolerations: Vec<Toleration>,
    /// Upper bound for the periodic full resync that backs up event-driven discovery.
    #[serde(serialize_with = "serialize_go_duration")]
    pub min_resync_period: Duration,
    /// Leave the node UID out of the provisioned-by annotation.
    pub use_node_name_only: bool,
    /// Make every PV owned by its Node object.
    #[serde(rename = "setPVOwnerRef")]
    pub set_pv_owner_ref: bool,
    /// Upstream's start-up taint removal; accepted for compatibility.
    pub remove_node_not_ready_taint: bool,
    /// The taint key used with removeNodeNotReadyTaint.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub provisioner_not_ready_node_taint_key: String,
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        ProvisionerConfig {
            storage_class_map: BTreeMap::new(),
            node_labels_for_pv: Vec::new(),
            labels_for_pv: BTreeMap::new(),
            use_alpha_api: false,
            use_job_for_cleaning: false,
            job_tolerations: Vec::new(),
            min_resync_period: DEFAULT_MIN_RESYNC_PERIOD,
            use_node_name_only: false,
            set_pv_owner_ref: false,
            remove_node_not_ready_taint: false,
            provisioner_not_ready_node_taint_key: String::new(),
        }
    }
}

fn serialize_go_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&go_duration::format_go_duration(*d))
}
