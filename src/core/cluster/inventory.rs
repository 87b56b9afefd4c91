//! The node inventory: what one agent knows of its node, as the `LocalStorageNode` object (one
//! per Node, cluster-scoped, named after the Node, owned by it) carries it in its status, so that
//! `kubectl get localstoragenodes` and the kubectl plugin answer for the whole cluster without
//! exec'ing into any agent.
//!
//! Pure: the agent gathers the inputs of a pass ([`Inputs`]), [`build`] makes the status, and
//! [`same_content`] says whether it differs from what was last written. The time of the pass is
//! not content: an idle node writes nothing.
//!
//! The status also carries the node's cluster-side copy of its used block disks
//! ([`UsedDiskRecord`]): a block device cannot carry its used mark (core::identity::used_mark), so the
//! node-local ledger was its only record, lost with the node's disk and unseen by another node
//! the device moves to. [`record_witnesses`] is what another agent reads of those records, and
//! core::identity::disk_trust what it makes of them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResource;
use kube::core::CustomResourceExt as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::identity::disk_identity::DiskIdentity;
use crate::core::identity::disk_trust::same_whole_disk;
use crate::core::identity::used_mark::UsedMark;
use crate::core::volumes::capacity::iec;

// The CRD (deploy/base/crd.yaml and the chart's crds/, which tests/static_checks/crd.rs keeps equal to
// [`crd`]) is generated from these types: kube's `CustomResource` derive makes the
// `LocalStorageNode` object, its `Resource` (group, version, kind, plural) and its CRD, schemars
// the schema, and every doc comment below is a field's description (`kubectl explain`), so they
// are written for an operator. What only a reader of the code needs is in plain comments.
//
// Every struct has serde's default, so that a status another version wrote (older, newer, or cut
// short) is read for what it has: one node's object never makes the list of all of them
// unreadable. The fields the API server requires of a write are named in each struct's
// `required` (schemars would take the defaults for "not required").

/// Which Node the object describes: only its name, which the admission policy checks against the
/// token of the agent that writes the object. The status is that agent's.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
// The printer columns repeat `type_ = "integer"` and the like, which clippy takes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "local-static-provisioner.io",
    version = "v1alpha1",
    kind = "LocalStorageNode",
    plural = "localstoragenodes",
    shortname = "lsn",
    category = "local-storage",
    status = "InventoryStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "The local disks and volumes of one node, as its local-static-provisioner agent found them. Named after the Node and owned by it.",
    printcolumn(name = "Disks", type_ = "integer", json_path = ".status.summary.disks", description = "Block devices"),
    printcolumn(
        name = "Claimed",
        type_ = "integer",
        json_path = ".status.summary.claimed",
        description = "Devices claimed by a class"
    ),
    printcolumn(
        name = "Volumes",
        type_ = "integer",
        json_path = ".status.summary.volumes",
        description = "PVs of the node"
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.summary.available",
        description = "Available PVs"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".status.summary.availableCapacity",
        description = "Capacity of the Available PVs"
    ),
    printcolumn(
        name = "Problems",
        type_ = "integer",
        json_path = ".status.summary.problems",
        description = "Things an operator may need to look at"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.agent.version", priority = 1),
    printcolumn(name = "Config-Valid", type_ = "boolean", json_path = ".status.agent.configValid", priority = 1),
    printcolumn(name = "Observed", type_ = "date", json_path = ".status.observedAt", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["nodeName"]))]
pub struct InventorySpec {
    /// The Node this object describes (equal to the object's name).
    pub node_name: String,
}

// The derived object requires its `spec`, and so does the schema: the API server refuses a write
// without one. An object stored without one all the same (written before the CRD said so) is
// read with the default spec instead of failing the list of all of them: serde reads an absent
// field through `deserialize_option` (as an absent `Option`), and so does this, as does `null`.
impl<'de> Deserialize<'de> for InventorySpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase", default)]
        struct Fields {
            node_name: String,
        }
        let fields = Option::<Fields>::deserialize(deserializer)?;
        Ok(fields.map(|f| InventorySpec { node_name: f.node_name }).unwrap_or_default())
    }
}

/// What the node's agent reports. Written by that agent only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct InventoryStatus {
    /// The Node (equal to the object's name).
    pub node_name: String,
    /// The counts `kubectl get` shows.
    pub summary: Summary,
    /// The agent and the configuration it runs.
    pub agent: AgentInfo,
    /// Per class of the configuration (and of any PV of a class since removed): its directory,
    /// mode and volumes.
    #[serde(default)]
    pub classes: Vec<ClassInventory>,
    /// The node's block devices (unattached loop devices left out) and what each class with a
    /// `devices` section makes of each.
    #[serde(default)]
    pub devices: Vec<DeviceInventory>,
    /// Every discovery entry and every PV of this node: its PV, phase and flags, or why it is
    /// not published.
    #[serde(default)]
    pub volumes: Vec<VolumeInventory>,
    /// Block disks this node published and has not wiped since (they hold or held a tenant's
    /// data): held back (wiped first) wherever they show up. The cluster-side copy of the node's
    /// ledger of used disks.
    // What another node makes of them: core::identity::disk_trust.
    #[serde(default)]
    pub used_disks: Vec<UsedDiskRecord>,
    /// PV UIDs of other nodes' used-disk records whose disk this node wiped: those records no
    /// longer hold the disk back here, and their node may drop them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<String>,
    /// Released PVs of other nodes (a claim used them) whose disk this node wiped since: they
    /// no longer make it wipe the disk again. Dropped once a lookup of that disk no longer finds
    /// the PV.
    // core::identity::disk_trust reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded_pvs: Vec<SupersededPv>,
    /// Disks held back here by another node's PV or used-disk record, and by which.
    // Judged by core::identity::disk_trust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldDisk>,
    /// When the pass that found this content ended (RFC 3339). Not content: later passes that
    /// found the same write nothing, so this is the time of the last change seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub observed_at: Option<String>,
}

/// A released PV of another node whose disk this node wiped.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["uid", "disk"]))]
pub struct SupersededPv {
    /// The PV's UID.
    pub uid: String,
    /// The disk-id label of the disk this node wiped for it.
    // core::identity::disk_trust::disk_label.
    pub disk: String,
}

/// A volume held back because of another node's PV or used-disk record.
// Judged by core::identity::disk_trust.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["path", "node", "record", "reason"]))]
pub struct HeldDisk {
    /// The host path of the held volume.
    pub path: String,
    /// The node whose PV or record holds it.
    pub node: String,
    /// The PV named (the PV itself, or the one the record names).
    pub record: String,
    /// Its UID: what `kubectl local-storage release-hold` takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `claimed-pv`, `unclaimed-pv` or `record`.
    pub reason: String,
    /// In words.
    pub message: String,
}

/// The counts of the printer columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct Summary {
    /// Block devices listed.
    pub disks: u32,
    /// Of them, claimed by a class.
    pub claimed: u32,
    /// PVs of this node.
    pub volumes: u32,
    /// Of them, Available.
    pub available: u32,
    /// Their capacity in bytes.
    pub available_bytes: u64,
    /// The same, human (IEC).
    pub available_capacity: String,
    /// Entries, devices and PVs with a problem an operator may need to act on, plus an invalid
    /// configuration.
    pub problems: u32,
}

/// The agent and its configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentInfo {
    /// The agent's version and commit.
    pub version: String,
    /// Whether the configuration on disk is the one in use.
    pub config_valid: bool,
    /// Why not, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_problem: Option<String>,
    /// Keys of the configuration the agent does not know (typos), ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_keys: Vec<String>,
}

/// One class of the configuration in use (or of a PV of this node whose class it no longer has).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["name"]))]
pub struct ClassInventory {
    /// StorageClass name.
    pub name: String,
    /// Discovery directory on the host.
    pub host_dir: String,
    /// `Filesystem` or `Block`.
    pub volume_mode: String,
    /// Whether the class claims raw devices (a `devices` section).
    pub claims_devices: bool,
    /// PVs of this class on this node.
    pub volumes: u32,
    /// Of them, Available.
    pub available: u32,
    /// Their capacity in bytes.
    pub available_bytes: u64,
}

/// One block device and its verdicts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["name"]))]
pub struct DeviceInventory {
    /// Kernel name (`sdb`).
    pub name: String,
    /// `major:minor`.
    pub dev: String,
    /// disk, part, loop, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Model, as the kernel shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Serial or WWID: the stable identity claims and records rely on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_id: Option<String>,
    /// Its /dev/disk/by-id names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_id: Vec<String>,
    /// Spinning (true), solid state (false), unknown (absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    /// Read-only.
    #[serde(default)]
    pub read_only: bool,
    /// What the agent found on it (blank, a filesystem, in use: by what).
    pub content: String,
    /// What each class with a `devices` section makes of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<DeviceVerdict>,
}

/// What one class makes of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["class", "verdict"]))]
pub struct DeviceVerdict {
    /// StorageClass name.
    pub class: String,
    /// What the class makes of the device.
    // The words agent::inventory gives core::devices::device_claim's verdicts.
    #[schemars(extend("enum" = ["Claimed", "Claiming", "NotSelected", "Refused", "Held", "Kept"]))]
    pub verdict: String,
    /// A stable code for a refusal (`not-blank`, `in-use`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// In words.
    pub message: String,
}

impl DeviceVerdict {
    /// Whether an operator may need to act: a refusal that needs one, or a held link.
    pub fn is_problem(&self, needs_operator: bool) -> bool {
        self.verdict == "Held" || (self.verdict == "Refused" && needs_operator)
    }
}

/// One discovery entry or PV of this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["class", "path", "phase"]))]
pub struct VolumeInventory {
    /// StorageClass name.
    pub class: String,
    /// Host path.
    pub path: String,
    /// Its PV, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv: Option<String>,
    /// The PV's phase; `Unpublished` for an entry without a PV.
    pub phase: String,
    /// Capacity in bytes (the PV's, or the volume's as found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// The claim bound to it (`namespace/name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// `missing`, `moved`, `stale`, `unresponsive`, `failing`, `deleting`, `held` (by another
    /// node's PV or record: see `status.held`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("items" = {
        "type": "string",
        "enum": ["missing", "moved", "stale", "unresponsive", "failing", "deleting", "held"]
    }))]
    pub flags: Vec<String>,
    /// Why an entry is not published (a stable code), or the reason of a flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// In words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl VolumeInventory {
    /// Whether an operator may need to look at it.
    pub fn is_problem(&self) -> bool {
        self.flags.iter().any(|f| f != "deleting") || (self.pv.is_none() && self.message.is_some())
    }
}

/// A block disk this node published: the cluster-side copy of its used-disk mark.
// The mark is core::identity::used_mark's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("required" = ["identity", "pv", "path", "at"]))]
pub struct UsedDiskRecord {
    /// The disk's identity when it was published.
    // Format: core::identity::disk_identity.
    pub identity: String,
    /// The PV it was published as.
    pub pv: String,
    /// That PV's UID, once it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Its host path then.
    pub path: String,
    /// When it was marked (RFC 3339).
    pub at: String,
    /// A claim was seen bound to the PV.
    #[serde(default)]
    pub claimed: bool,
    /// Its PV was withdrawn unclaimed: offered, never used.
    #[serde(default)]
    pub offered: bool,
}

impl UsedDiskRecord {
    /// The record of a ledger mark (`offered`: its PV was withdrawn unclaimed).
    pub fn of(mark: &UsedMark, offered: bool) -> Self {
        UsedDiskRecord {
            identity: mark.identity.clone(),
            pv: mark.pv.clone(),
            uid: mark.uid.clone(),
            path: mark.path.clone(),
            at: mark.at.clone(),
            claimed: mark.claimed,
            offered,
        }
    }

    /// The mark it copies, as node `node` recorded it.
    pub fn mark(&self, node: &str) -> UsedMark {
        UsedMark {
            pv: self.pv.clone(),
            node: node.to_string(),
            path: self.path.clone(),
            identity: self.identity.clone(),
            at: self.at.clone(),
            uid: self.uid.clone(),
            root: None,
            claimed: self.claimed,
            wiped_filesystems: Vec::new(),
        }
    }
}

/// The LocalStorageNode CustomResourceDefinition, as deploy/base/crd.yaml and the chart's crds/
/// ship it: kube's derive of the types above, its schema made to say what the API server is to
/// enforce and no more ([`api_schema`]).
pub fn crd() -> CustomResourceDefinition {
    let mut crd = LocalStorageNode::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|v| v.open_api_v3_schema.as_mut()) {
            api_schema(schema);
        }
    }
    crd
}

/// Makes a schema schemars derived from Rust types say what the API server is to enforce of
/// the objects, no more, no less, in words that read as prose; recursively.
/// - No `default`: schemars names serde's defaults (every field here has one, so that a status
///   another version wrote is read for what it has), and the API server would write them into
///   every stored status.
/// - No `nullable`: an `Option` field is absent, never null (`skip_serializing_if`); without
///   `nullable` the API server drops a null instead of storing it.
/// - `int64` for schemars's `uint32` and `uint64` formats, which are not Kubernetes's (it knows
///   `int32` and `int64`); `minimum: 0` still says unsigned.
/// - Descriptions are doc comments, wrapped at the code's width: a line break inside a paragraph
///   becomes a space (`kubectl explain` wraps them itself). The items of a described array have
///   none of their own (their type's doc comment): `kubectl explain` would print it right after
///   the array's, saying the same twice.
fn api_schema(schema: &mut JSONSchemaProps) {
    schema.default = None;
    schema.nullable = None;
    if matches!(schema.format.as_deref(), Some("uint32" | "uint64")) {
        schema.format = Some("int64".into());
    }
    if let Some(text) = &mut schema.description {
        *text = text.split("\n\n").map(|p| p.replace('\n', " ")).collect::<Vec<_>>().join("\n\n");
    }
    for property in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        api_schema(property);
    }
    let described = schema.description.is_some();
    let items = match &mut schema.items {
        Some(JSONSchemaPropsOrArray::Schema(items)) => std::slice::from_mut(items.as_mut()),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.as_mut_slice(),
        None => &mut [],
    };
    for item in items {
        if described {
            item.description = None;
        }
        api_schema(item);
    }
}

/// Whether a ledger mark belongs in the cluster-side copy: a mark of a block device, named by
/// what names it on any node (its stable device ID). A filesystem carries its own mark to any
/// node; a device number or an fsid names nothing on another machine.
pub fn is_portable_block_mark(mark: &UsedMark) -> bool {
    is_portable_block(&mark.identity)
}

/// Whether an identity is a block device's named by its stable ID: what the copy keeps.
pub fn is_portable_block(identity: &str) -> bool {
    DiskIdentity::parse(identity)
        .is_some_and(|d| d.kind == crate::core::identity::disk_identity::Kind::Block && d.disk.is_some())
}

/// Other nodes' used-disk records naming the whole disk found as `identity` on `node`, as
/// witnesses for core::identity::disk_trust. `superseded` holds the UIDs of records whose disk this node
/// wiped since; `released` the UIDs (or PV names) an operator released holds of.
pub fn record_witnesses<'a>(
    records: impl IntoIterator<Item = (&'a str, &'a [UsedDiskRecord])>,
    superseded: &BTreeSet<String>,
    released: &BTreeSet<String>,
    node: &str,
    identity: &str,
) -> Vec<crate::core::identity::disk_trust::RecordWitness> {
    let mut out = Vec::new();
    for (owner, list) in records {
        if owner == node {
            continue;
        }
        for r in list.iter().filter(|r| same_whole_disk(&r.identity, identity)) {
            out.push(crate::core::identity::disk_trust::RecordWitness {
                node: owner.to_string(),
                pv: r.pv.clone(),
                uid: r.uid.clone(),
                offered: r.offered,
                superseded: r.uid.as_ref().is_some_and(|u| superseded.contains(u)),
                released_by_operator: r.uid.as_ref().is_some_and(|u| released.contains(u)) || released.contains(&r.pv),
            });
        }
    }
    out
}

/// The records this node keeps in its copy: its ledger's portable block marks (with whether
/// each was only offered), in a stable order. Only a wipe of the disk here clears one (as it
/// clears the ledger): another node's word never does, so a node that lies about having wiped a
/// disk cannot make this node's record of it go away.
pub fn own_records(ledger: impl IntoIterator<Item = (UsedMark, bool)>) -> Vec<UsedDiskRecord> {
    let mut out: Vec<UsedDiskRecord> = ledger
        .into_iter()
        .filter(|(m, _)| is_portable_block_mark(m))
        .map(|(m, offered)| UsedDiskRecord::of(&m, offered))
        .collect();
    out.sort_by(|a, b| (&a.identity, &a.pv).cmp(&(&b.identity, &b.pv)));
    out.dedup();
    out
}

/// The records of this node's copy that its ledger lacks (a ledger lost or replaced while the
/// copy stayed in the API): put back into the ledger at start-up, so the disks they name are
/// wiped before they are offered, exactly as if the ledger had never been lost.
pub fn missing_from_ledger(copy: &[UsedDiskRecord], ledger: &[UsedMark], node: &str) -> Vec<UsedMark> {
    copy.iter()
        .filter(|r| !ledger.iter().any(|m| m.identity == r.identity && m.pv == r.pv))
        .map(|r| r.mark(node))
        .collect()
}

/// Keeps of `superseded` only UIDs some inventory still records: once the other node dropped
/// its record (its own wipe of the disk, or its Node deleted), there is nothing to supersede.
pub fn prune_superseded(superseded: &mut BTreeSet<String>, recorded: &BTreeSet<String>) -> bool {
    let before = superseded.len();
    superseded.retain(|u| recorded.contains(u));
    before != superseded.len()
}

/// One PV of this node, as the inventory reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PvInput {
    pub name: String,
    pub class: String,
    pub host_path: String,
    pub phase: String,
    pub capacity_bytes: Option<u64>,
    pub claim: Option<String>,
    pub deleting: bool,
    pub missing: bool,
    pub stale: bool,
    pub moved_to: Option<String>,
    pub failing: Option<String>,
}

/// One discovery entry of this pass: found (a volume) or skipped (with why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryInput {
    pub class: String,
    pub host_path: String,
    pub capacity_bytes: Option<u64>,
    /// Why it is not published (code, words), for a skipped entry or a refused volume.
    pub refused: Option<(String, String)>,
    /// The entry's disk does not answer.
    pub unresponsive: bool,
    /// Skipped for a reason an operator must act on (an evented one).
    pub needs_operator: bool,
}

/// One class of the configuration in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassInput {
    pub name: String,
    pub host_dir: String,
    pub volume_mode: String,
    pub claims_devices: bool,
}

/// What one pass knew, for [`build`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inputs {
    pub node: String,
    pub version: String,
    pub config_problem: Option<String>,
    pub unknown_keys: Vec<String>,
    pub classes: Vec<ClassInput>,
    /// Devices with their verdicts, and whether each verdict needs an operator.
    pub devices: Vec<(DeviceInventory, Vec<bool>)>,
    pub entries: Vec<EntryInput>,
    pub pvs: Vec<PvInput>,
    pub used_disks: Vec<UsedDiskRecord>,
    pub superseded: Vec<String>,
    pub superseded_pvs: Vec<SupersededPv>,
    pub held: Vec<HeldDisk>,
}

/// The status for a pass's inputs: sorted, so that the same node gives the same content
/// whatever order the host listed things in.
pub fn build(inputs: Inputs) -> InventoryStatus {
    let mut classes: BTreeMap<String, ClassInventory> = inputs
        .classes
        .iter()
        .map(|c| {
            let class = ClassInventory {
                name: c.name.clone(),
                host_dir: c.host_dir.clone(),
                volume_mode: c.volume_mode.clone(),
                claims_devices: c.claims_devices,
                ..Default::default()
            };
            (c.name.clone(), class)
        })
        .collect();
    let mut volumes: BTreeMap<(String, String), VolumeInventory> = BTreeMap::new();
    let mut problems = u32::from(inputs.config_problem.is_some());
    let mut summary = Summary::default();
    for pv in &inputs.pvs {
        summary.volumes += 1;
        let available = pv.phase == "Available" && !pv.deleting;
        let class = classes
            .entry(pv.class.clone())
            .or_insert_with(|| ClassInventory { name: pv.class.clone(), ..Default::default() });
        class.volumes += 1;
        if available {
            summary.available += 1;
            class.available += 1;
            let bytes = pv.capacity_bytes.unwrap_or(0);
            summary.available_bytes += bytes;
            class.available_bytes += bytes;
        }
        let mut flags = Vec::new();
        let mut reason = None;
        for (on, flag) in [(pv.missing, "missing"), (pv.moved_to.is_some(), "moved"), (pv.stale, "stale")] {
            if on {
                flags.push(flag.to_string());
            }
        }
        if let Some(why) = &pv.failing {
            flags.push("failing".into());
            reason = Some(why.clone());
        }
        if let Some(to) = &pv.moved_to {
            reason.get_or_insert_with(|| format!("its disk was found at {to}"));
        }
        if pv.deleting {
            flags.push("deleting".into());
        }
        let v = VolumeInventory {
            class: pv.class.clone(),
            path: pv.host_path.clone(),
            pv: Some(pv.name.clone()),
            phase: pv.phase.clone(),
            capacity_bytes: pv.capacity_bytes,
            claim: pv.claim.clone(),
            flags,
            reason: None,
            message: reason,
        };
        volumes.insert((pv.class.clone(), pv.host_path.clone()), v);
    }
    for e in &inputs.entries {
        let key = (e.class.clone(), e.host_path.clone());
        match volumes.get_mut(&key) {
            Some(v) => {
                if e.unresponsive && !v.flags.iter().any(|f| f == "unresponsive") {
                    v.flags.push("unresponsive".into());
                    if let Some((_, words)) = &e.refused {
                        v.message.get_or_insert_with(|| words.clone());
                    }
                }
            }
            None => {
                let (reason, message) = match &e.refused {
                    Some((code, words)) => (Some(code.clone()), Some(words.clone())),
                    None => (None, None),
                };
                let v = VolumeInventory {
                    class: e.class.clone(),
                    path: e.host_path.clone(),
                    pv: None,
                    phase: "Unpublished".into(),
                    capacity_bytes: e.capacity_bytes,
                    claim: None,
                    flags: if e.unresponsive { vec!["unresponsive".into()] } else { Vec::new() },
                    reason,
                    message: message.filter(|_| e.needs_operator || e.unresponsive),
                };
                volumes.insert(key, v);
            }
        }
    }
    // A disk held by another node's PV or record: its entry says by which.
    for h in &inputs.held {
        if let Some(v) = volumes.values_mut().find(|v| v.path == h.path && v.pv.is_none()) {
            if !v.flags.iter().any(|f| f == "held") {
                v.flags.push("held".into());
            }
            v.reason = Some(format!("held-by-{}", h.reason));
            v.message = Some(h.message.clone());
        }
    }
    problems += volumes.values().filter(|v| v.is_problem()).count() as u32;
    let mut devices: Vec<DeviceInventory> = Vec::new();
    for (mut d, needs) in inputs.devices {
        summary.disks += 1;
        if d.classes.iter().any(|c| c.verdict == "Claimed") {
            summary.claimed += 1;
        }
        if d.classes.iter().zip(needs.iter().chain(std::iter::repeat(&false))).any(|(c, n)| c.is_problem(*n)) {
            problems += 1;
        }
        d.classes.sort_by(|a, b| a.class.cmp(&b.class));
        devices.push(d);
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    summary.problems = problems;
    summary.available_capacity = iec(summary.available_bytes);
    let mut used_disks = inputs.used_disks;
    used_disks.sort_by(|a, b| (&a.identity, &a.pv).cmp(&(&b.identity, &b.pv)));
    used_disks.dedup();
    let mut superseded = inputs.superseded;
    superseded.sort();
    superseded.dedup();
    let mut superseded_pvs = inputs.superseded_pvs;
    superseded_pvs.sort();
    superseded_pvs.dedup();
    let mut held = inputs.held;
    held.sort();
    held.dedup();
    InventoryStatus {
        node_name: inputs.node,
        summary,
        agent: AgentInfo {
            version: inputs.version,
            config_valid: inputs.config_problem.is_none(),
            config_problem: inputs.config_problem,
            unknown_keys: inputs.unknown_keys,
        },
        classes: classes.into_values().collect(),
        devices,
        volumes: volumes.into_values().collect(),
        used_disks,
        superseded,
        superseded_pvs,
        held,
        observed_at: None,
    }
}

/// Whether two statuses say the same, their pass times aside: only a difference is written.
pub fn same_content(a: &InventoryStatus, b: &InventoryStatus) -> bool {
    InventoryStatus { observed_at: None, ..a.clone() } == InventoryStatus { observed_at: None, ..b.clone() }
}

/// How long a change of the inventory may wait before it is written (agent::inventory turns
/// each into a delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteWait {
    /// Written promptly (a disk, a verdict, a problem, the used-disk records).
    Prompt,
    /// The pass's publishing is under way (volumes settling, PVs created or deleted that the
    /// store does not show yet): the next passes change the view again within a second, so the
    /// change waits for them, a little, and a node coming up writes its volumes and their PVs
    /// in one write instead of one per step.
    Publishing,
    /// Only the API's view of this node's PVs changed ([`only_pv_view_changes`]).
    View,
}

/// How long the change from `written` (None: nothing written by this process yet) to `now` may
/// wait, `publishing` saying whether this node's publishing is under way. The used-disk records
/// (evidence other nodes judge by) never wait for publishing: a change to them is prompt.
pub fn write_wait(written: Option<&InventoryStatus>, now: &InventoryStatus, publishing: bool) -> WriteWait {
    if written.is_some_and(|w| only_pv_view_changes(w, now)) {
        return WriteWait::View;
    }
    let records = |s: &InventoryStatus| (s.used_disks.clone(), s.superseded.clone(), s.superseded_pvs.clone());
    let records_kept = match written {
        Some(w) => records(w) == records(now),
        None => now.used_disks.is_empty() && now.superseded.is_empty() && now.superseded_pvs.is_empty(),
    };
    if publishing && records_kept { WriteWait::Publishing } else { WriteWait::Prompt }
}

/// Whether every difference between the status `written` and the status `now` is the API's
/// own view of this node's PVs (a phase, a claim, a PV being deleted or made again), which the
/// PV objects show at once: such a write may wait and go out with the next, so a claim bound or
/// a released PV wiped, deleted and published again costs no write of its own (a node writes
/// that view at most about once a minute whatever its churn: agent::inventory's VIEW_DELAY).
///
/// So is what a device no class judges holds (mounted where, held by what): its appearing,
/// going or resizing, and every verdict, are not.
///
/// A volume's change is of that view when `written` showed it with a settled PV (Available,
/// Bound or Released: a new PV's first phase, Pending, is shown Available at once) and no
/// problem (no flag but `deleting`, no words), and `now` shows it with a PV and no problem, or unpublished with no
/// reason yet (between the delete and the create). Anything else is not: a device, a verdict,
/// any other flag, a refusal, the configuration, the used-disk copy and the records of other
/// nodes' disks (evidence another node judges by), a volume `written` did not show (a new disk
/// is shown at once), and the capacity of a volume whose PV is Available or Bound (a disk that
/// shrank). The counts derive from the volumes, so they follow what the volumes say.
pub fn only_pv_view_changes(written: &InventoryStatus, now: &InventoryStatus) -> bool {
    let quiet = |v: &VolumeInventory| v.flags.iter().all(|f| f == "deleting") && v.message.is_none();
    let had_pv: BTreeSet<(&str, &str)> = written
        .volumes
        .iter()
        .filter(|v| v.pv.is_some() && quiet(v) && matches!(v.phase.as_str(), "Available" | "Bound" | "Released"))
        .map(|v| (v.class.as_str(), v.path.as_str()))
        .collect();
    let is_view = |v: &VolumeInventory| {
        let view = match v.pv {
            None => v.flags.is_empty() && v.reason.is_none() && v.message.is_none(),
            Some(_) => quiet(v),
        };
        view && had_pv.contains(&(v.class.as_str(), v.path.as_str()))
    };
    // The volumes whose view changed, and whether their capacity still counts (a settled PV's).
    let views: BTreeMap<(&str, &str), bool> = now
        .volumes
        .iter()
        .filter(|v| is_view(v))
        .map(|v| {
            ((v.class.as_str(), v.path.as_str()), v.pv.is_some() && matches!(v.phase.as_str(), "Available" | "Bound"))
        })
        .collect();
    // Both sides with those volumes reduced to what is not the view, and without the counts.
    let settled =
        |s: &InventoryStatus| InventoryStatus {
            summary: Summary {
                volumes: 0,
                available: 0,
                available_bytes: 0,
                available_capacity: String::new(),
                problems: 0,
                ..s.summary.clone()
            },
            classes: s
                .classes
                .iter()
                .map(|c| ClassInventory { volumes: 0, available: 0, available_bytes: 0, ..c.clone() })
                .collect(),
            volumes: s
                .volumes
                .iter()
                .map(|v| match views.get(&(v.class.as_str(), v.path.as_str())) {
                    Some(keep_capacity) => VolumeInventory {
                        class: v.class.clone(),
                        path: v.path.clone(),
                        capacity_bytes: if *keep_capacity { v.capacity_bytes } else { None },
                        ..Default::default()
                    },
                    None => v.clone(),
                })
                .collect(),
            // What a device no class judges holds (where it is mounted, by whom it is held) is
            // the host's view, shown with the next write: kubelet mounts a CSI disk for every pod.
            devices: s
                .devices
                .iter()
                .map(|d| {
                    if d.classes.is_empty() {
                        DeviceInventory { content: String::new(), ..d.clone() }
                    } else {
                        d.clone()
                    }
                })
                .collect(),
            observed_at: None,
            ..s.clone()
        };
    settled(written) == settled(now)
}

#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;
