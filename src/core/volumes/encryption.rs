//! Per-volume encryption at rest (a class's `encryption: fscrypt`): what a PV records of it,
//! and the pure rules of the keys' life. Each published volume of such a class gets a fresh
//! 64-byte key and an fscrypt v2 policy on one directory at its root, [`ENCRYPTED_DIR`], which
//! is the path the PV gives kubelet; the root itself keeps the agent's records (the used mark,
//! the root record) and cannot be encrypted (the kernel refuses a policy on a filesystem's
//! root). Releasing the claim destroys the key before the wipe removes the files: the data is
//! gone the moment the key is, whatever the disk does with its blocks. docs/encryption.md has
//! the design and the threat model.
//!
//! Pure: the agent feeds what the API and the key store hold; host::volumes::encryption does the rest.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PersistentVolume;
use serde::Serialize;

/// The directory at a volume's root that holds the tenant's (encrypted) data; the PV's
/// `spec.local.path` names it.
pub const ENCRYPTED_DIR: &str = "lsp-encrypted";

/// The annotation on an encrypted volume's PV: `fscrypt-v2 key=<32 hex digits>`, the kernel's
/// identifier of its key (never the key).
pub const ANN_ENCRYPTION: &str = "local-static-provisioner.io/encryption";

/// The scheme the annotation's value starts with.
const SCHEME: &str = "fscrypt-v2";

/// How long a key in the node's store may go without a PV naming it before it is destroyed: a
/// publish stores the key, then creates the PV in the same pass; a key whose PV never came (the
/// agent killed between the two, the create refused) is an orphan once this has passed.
pub const ORPHAN_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// A class's encryption setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    /// fscrypt v2: a key per volume, kept on the node (docs/encryption.md).
    Fscrypt,
}

impl Encryption {
    /// Parses the config spelling (`none` is no encryption).
    pub fn parse(s: &str) -> Result<Option<Encryption>, String> {
        match s {
            "" | "none" => Ok(None),
            "fscrypt" => Ok(Some(Encryption::Fscrypt)),
            other => Err(format!("{other:?} is not an encryption (use fscrypt, or none)")),
        }
    }
}

/// The annotation's value for the key with identifier `key_id` (hex).
pub fn annotation_value(key_id: &str) -> String {
    format!("{SCHEME} key={key_id}")
}

/// The key identifier an annotation value names: exactly `fscrypt-v2 key=<32 lower-case hex>`.
pub fn key_of(value: &str) -> Result<String, String> {
    let key = value
        .strip_prefix(SCHEME)
        .and_then(|rest| rest.strip_prefix(" key="))
        .ok_or_else(|| format!("{value:?} is not `{SCHEME} key=<identifier>`"))?;
    let hex = key.len() == 32 && key.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(format!("{key:?} is not a key identifier (32 lower-case hex digits)"));
    }
    Ok(key.to_string())
}

/// The path kubelet mounts for an encrypted volume whose root is at `host_path`.
pub fn data_path(host_path: &str) -> String {
    format!("{}/{ENCRYPTED_DIR}", host_path.trim_end_matches('/'))
}

/// A PV's volume root from its `spec.local.path`: the path less [`ENCRYPTED_DIR`] when the PV
/// says it is encrypted (`annotation` set) and the path ends in it; else the path itself. So
/// every rule about a PV's volume (its identity, its marks, its wipe) reads the root, as for
/// any volume.
pub fn volume_path<'a>(local_path: &'a str, annotation: Option<&str>) -> &'a str {
    match annotation {
        Some(_) => local_path
            .strip_suffix(ENCRYPTED_DIR)
            .and_then(|p| p.strip_suffix('/'))
            .filter(|p| !p.is_empty())
            .unwrap_or(local_path),
        None => local_path,
    }
}

/// Makes `pv` (built for the volume root, core::volumes::pv) the PV of the encrypted volume: its path
/// names the data directory, its annotation the key.
pub fn encrypt_pv(pv: &mut PersistentVolume, key_id: &str) {
    if let Some(local) = pv.spec.as_mut().and_then(|s| s.local.as_mut()) {
        local.path = data_path(&local.path);
    }
    pv.metadata.annotations.get_or_insert_default().insert(ANN_ENCRYPTION.into(), annotation_value(key_id));
}

/// A key in the node's store, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    /// The kernel's identifier (hex).
    pub id: String,
    /// The volume root it was made for (host path).
    pub host_path: String,
    /// How long ago it was stored (None: unknown, and never destroyed while it is: a key
    /// just made must not pass for an old one).
    pub age: Option<std::time::Duration>,
}

/// What to do with the node's keys this pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPlan {
    /// Keys to have in the kernel, by PV name: (volume root, key id). Every encrypted PV of this
    /// node that a pod may still mount (or whose data is still to be destroyed by its wipe).
    pub load: BTreeMap<String, (String, String)>,
    /// Stored keys that no PV names any more and that are older than [`ORPHAN_AFTER`]: destroyed
    /// (after the host has proven that kubelet holds no mount of their volume).
    pub orphans: Vec<StoredKey>,
}

/// One PV that names a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedPv {
    /// PV name.
    pub name: String,
    /// Its volume root (host path).
    pub host_path: String,
    /// The key it names.
    pub key: String,
    /// Whether its volume is to be loaded: not withdrawn (a PV being deleted that no claim
    /// ever used is on its way out; its wipe destroys the key).
    pub live: bool,
}

/// The keys' plan from the PVs that name keys (this node's and an earlier incarnation's, and
/// those this agent created that the store does not show yet) and the node's store.
///
/// - A key any PV names is kept, whatever the PV's phase: a Released PV's key is destroyed by
///   its wipe (which proves the disk first), never here.
/// - A live PV's key is loaded; a PV whose key is not in the store cannot be (the host says so,
///   and the volume is fenced).
/// - A stored key no PV names is destroyed once it is older than [`ORPHAN_AFTER`] (a key of
///   unknown age never is), and never while `complete` is false (the PV store not synced, or a
///   read of the store failed): then nothing proves that no PV names it. The caller counts the
///   keys it readied for PVs the store may not show yet as named.
pub fn plan_keys(pvs: &[KeyedPv], stored: &[StoredKey], complete: bool) -> KeyPlan {
    let named: BTreeSet<&str> = pvs.iter().map(|p| p.key.as_str()).collect();
    let load = pvs.iter().filter(|p| p.live).map(|p| (p.name.clone(), (p.host_path.clone(), p.key.clone()))).collect();
    let orphans = if complete {
        stored
            .iter()
            .filter(|k| !named.contains(k.id.as_str()))
            .filter(|k| k.age.is_some_and(|age| age >= ORPHAN_AFTER))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    KeyPlan { load, orphans }
}

/// Whether a Released or deleted PV's volume is to have its key destroyed by its wipe: only the
/// key the PV names, and only on the disk the wipe proved is the PV's.
pub fn key_to_destroy(annotation: Option<&str>) -> Result<Option<String>, String> {
    annotation.map(key_of).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const K1: &str = "0123456789abcdef0123456789abcdef";
    const K2: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn the_annotation_names_exactly_one_key_identifier() {
        assert_eq!(key_of(&annotation_value(K1)), Ok(K1.to_string()));
        let bad = [
            "",
            "fscrypt-v2",
            "fscrypt-v2 key=",
            "fscrypt-v1 key=0123456789abcdef0123456789abcdef",
            "fscrypt-v2 key=0123456789ABCDEF0123456789ABCDEF",
            "fscrypt-v2 key=0123456789abcdef0123456789abcde",
            "fscrypt-v2 key=0123456789abcdef0123456789abcdef0",
            "fscrypt-v2 key=0123456789abcdef0123456789abcdeg",
            "fscrypt-v2  key=0123456789abcdef0123456789abcdef",
            " fscrypt-v2 key=0123456789abcdef0123456789abcdef",
        ];
        for value in bad {
            assert!(key_of(value).is_err(), "{value:?}");
        }
        assert_eq!(key_to_destroy(None), Ok(None));
        assert_eq!(key_to_destroy(Some(&annotation_value(K2))), Ok(Some(K2.to_string())));
        assert!(key_to_destroy(Some("fscrypt-v2 key=x")).is_err());
    }

    #[test]
    fn the_volume_root_is_the_path_less_the_data_directory_only_when_encrypted() {
        let ann = annotation_value(K1);
        let cases = [
            ("/mnt/disks/a/lsp-encrypted", Some(ann.as_str()), "/mnt/disks/a"),
            ("/mnt/disks/a/lsp-encrypted", None, "/mnt/disks/a/lsp-encrypted"),
            ("/mnt/disks/a", Some(ann.as_str()), "/mnt/disks/a"),
            ("/mnt/disks/a", None, "/mnt/disks/a"),
            ("/mnt/disks/alsp-encrypted", Some(ann.as_str()), "/mnt/disks/alsp-encrypted"),
            ("/lsp-encrypted", Some(ann.as_str()), "/lsp-encrypted"),
            ("lsp-encrypted", Some(ann.as_str()), "lsp-encrypted"),
        ];
        for (path, annotation, want) in cases {
            assert_eq!(volume_path(path, annotation), want, "{path} {annotation:?}");
        }
        // What is published for a root comes back as that root.
        for root in ["/mnt/disks/a", "/mnt/fast/vol-1", "/x"] {
            assert_eq!(volume_path(&data_path(root), Some(&ann)), root);
        }
    }

    #[test]
    fn an_encrypted_pv_points_at_its_data_directory_and_names_its_key() {
        use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolumeSpec};
        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource { path: "/mnt/disks/a".into(), fs_type: None }),
                ..Default::default()
            }),
            ..Default::default()
        };
        encrypt_pv(&mut pv, K1);
        assert_eq!(pv.spec.as_ref().unwrap().local.as_ref().unwrap().path, "/mnt/disks/a/lsp-encrypted");
        let ann = pv.metadata.annotations.as_ref().unwrap().get(ANN_ENCRYPTION).cloned();
        assert_eq!(ann.as_deref().map(key_of), Some(Ok(K1.to_string())));
    }

    #[test]
    fn the_config_spelling() {
        assert_eq!(Encryption::parse("fscrypt"), Ok(Some(Encryption::Fscrypt)));
        assert_eq!(Encryption::parse("none"), Ok(None));
        assert_eq!(Encryption::parse(""), Ok(None));
        for bad in ["FSCRYPT", "luks", "true", "fscrypt-v2"] {
            assert!(Encryption::parse(bad).unwrap_err().contains(bad), "{bad}");
        }
    }

    fn stored(id: &str, age: Option<u64>) -> StoredKey {
        StoredKey { id: id.into(), host_path: "/mnt/disks/a".into(), age: age.map(Duration::from_secs) }
    }

    /// Every combination of who names a key, its age and whether the PV store is complete: a key
    /// is destroyed here only when nothing names it, it is old enough, and the store is complete.
    #[test]
    fn a_stored_key_is_destroyed_only_when_no_pv_names_it_after_the_grace_and_with_a_complete_store() {
        let ages = [None, Some(0), Some(ORPHAN_AFTER.as_secs() - 1), Some(ORPHAN_AFTER.as_secs()), Some(86_400)];
        let namers: [&[KeyedPv]; 4] = [
            &[],
            &[KeyedPv { name: "pv-a".into(), host_path: "/mnt/disks/a".into(), key: K1.into(), live: true }],
            &[KeyedPv { name: "pv-a".into(), host_path: "/mnt/disks/a".into(), key: K1.into(), live: false }],
            &[KeyedPv { name: "pv-b".into(), host_path: "/mnt/disks/b".into(), key: K2.into(), live: true }],
        ];
        for age in ages {
            for pvs in namers {
                for complete in [false, true] {
                    let plan = plan_keys(pvs, &[stored(K1, age)], complete);
                    let named = pvs.iter().any(|p| p.key == K1);
                    let old = age.is_some_and(|a| a >= ORPHAN_AFTER.as_secs());
                    let destroyed = plan.orphans.iter().any(|k| k.id == K1);
                    assert_eq!(destroyed, complete && !named && old, "{age:?} {pvs:?} {complete}");
                    // Loaded: exactly the live PVs' keys, whatever the store holds.
                    let loaded: Vec<&str> = plan.load.values().map(|(_, k)| k.as_str()).collect();
                    let live: Vec<&str> = pvs.iter().filter(|p| p.live).map(|p| p.key.as_str()).collect();
                    assert_eq!(loaded, live);
                }
            }
        }
    }
}
