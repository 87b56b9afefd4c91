//! Encrypted volumes (core::volumes::encryption): a new volume of a class with `encryption` gets its
//! key and data directory before its PV is created; every pass has the key of each of this
//! node's encrypted PVs in the kernel (a reboot or a remount drops them) and fences the PVs
//! whose key cannot be had; stored keys no PV names are destroyed once they are orphans. The
//! key of a released PV is destroyed by its wipe (host::wipe::run), never here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use tracing::{debug, info, warn};

use std::time::{Duration, Instant};

use super::Agent;
use crate::core::fence::volume_fence::may_be_mounted;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::encryption::{KeyedPv, StoredKey, plan_keys};
use crate::core::volumes::planner::DesiredPv;
use crate::core::wipe::cleanup::PvState;
use crate::host::ops::{Job, Subject};
use crate::host::volumes::key_store::KeyInfo;
use crate::wiper::target_at;

/// The longest a readied key waits for its PV to show in the store before the orphan rule may
/// look at it (then only if its directory is still empty).
const FRESH_AT_MOST: Duration = Duration::from_secs(3600);

/// How often the node's key store is listed for orphans (they wait 10 minutes anyway): a pass
/// does not read every key file.
const LIST_EVERY: Duration = Duration::from_secs(300);

/// What the encryption stage keeps between passes.
#[derive(Debug, Default)]
pub(super) struct KeyState {
    /// When the store was last listed, and whether it held keys then.
    listed: Option<(Instant, bool)>,
    /// Keys readied for new PVs, and when: named, for the orphan rule, until the store shows
    /// their PVs (core::volumes::encryption::plan_keys).
    fresh: BTreeMap<String, Instant>,
}

impl Agent {
    /// Readies the encrypted data directory of every volume in `creates` whose class says
    /// `encryption` (one host operation each, under its deadline) and returns their keys'
    /// identifiers by PV name. A volume that could not be readied is left out of `creates`:
    /// never published unencrypted; told once per cause, and tried again with backoff.
    pub(super) async fn prepare_encrypted(&mut self, creates: &mut Vec<&DesiredPv>) -> BTreeMap<String, String> {
        let encrypting = |d: &DesiredPv, agent: &Agent| {
            agent.config.storage_class_map.get(&d.class).is_some_and(|c| c.encryption.is_some())
        };
        // Until the PVs upstream made for this node are adopted, a volume's PV may exist without
        // this agent's label: readying its data directory could put one into a tenant's live
        // volume. Such volumes wait for the adoption (retried with its backoff).
        if !self.adopted {
            creates.retain(|d| !encrypting(d, self));
            return BTreeMap::new();
        }
        let mut wanted: Vec<(String, String, Result<PathBuf, String>, String)> = Vec::new();
        for d in creates.iter().filter(|d| encrypting(d, self)) {
            let target = target_at(&d.host_path, &d.class, self.config.storage_class_map.get(&d.class)).map(|t| t.path);
            wanted.push((d.name.clone(), d.host_path.clone(), target, d.identity.clone()));
        }
        if wanted.is_empty() {
            return BTreeMap::new();
        }
        let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
        let asked: Vec<(String, String, Result<PathBuf, String>, String)> = wanted.clone();
        let answers = self
            .on_host(move |_| {
                let mut jobs = Vec::new();
                let mut refused = BTreeMap::new();
                for (i, (name, host_path, target, identity)) in asked.into_iter().enumerate() {
                    let path = match target {
                        Ok(p) => p,
                        Err(e) => {
                            refused.insert(i, Err(e));
                            continue;
                        }
                    };
                    let host = shared.clone();
                    let subject = Subject::Volume(host_path.clone());
                    let tag = format!("{name}|{identity}");
                    jobs.push((
                        i,
                        Job::effect(subject, "encryption prepare", timeout, move |on| {
                            host.prepare_encrypted(&path, &host_path, &identity, on)
                        })
                        .tagged(tag),
                    ));
                }
                let (index, jobs): (Vec<usize>, Vec<_>) = jobs.into_iter().unzip();
                for (i, answer) in index.into_iter().zip(ops.run_all(jobs)) {
                    let result = answer.or_error("its encryption is still being readied (a slow disk)");
                    refused.insert(i, result);
                }
                refused
            })
            .await
            .unwrap_or_default();
        // Two PVs never share a key: one a readied directory names that another PV names
        // already (a cloned disk) is refused.
        let named = self.named_keys();
        let mut keys = BTreeMap::new();
        for (i, (name, host_path, _, _)) in wanted.into_iter().enumerate() {
            let mut result = answers.get(&i).cloned().unwrap_or_else(|| Err("the host task failed".into()));
            if let Ok(key) = &result
                && let Some(other) = named.get(key).filter(|other| **other != name)
            {
                result = Err(format!(
                    "its data directory is encrypted with the key of PV {other} ({key}): a copy of that volume's disk?"
                ));
            }
            match result {
                Ok(key) => {
                    debug!(pv = %name, path = %host_path, key = %key, "encrypted data directory ready");
                    self.keys.fresh.insert(key.clone(), Instant::now());
                    keys.insert(name, key);
                }
                Err(e) => {
                    self.metrics.key_failed("prepare");
                    self.effects.record::<(), _>(&EffectKey::Create(name.clone()), &Err(e.clone()));
                    self.inventory_refused(&host_path, "encryption", e.clone());
                    let note = format!("volume at {host_path} not published as {name}: its encryption: {e}");
                    if self.report_unpublished(format!("encryption/{name}/{host_path}/{e}"), &name, note).await {
                        warn!(pv = %name, path = %host_path, "volume not published: its encryption: {e}");
                    }
                }
            }
        }
        creates.retain(|d| !encrypting(d, self) || keys.contains_key(&d.name));
        keys
    }

    /// The key each PV of this node's store names (any PV there, ours or not, whatever its
    /// state): no such key is ever an orphan, nor readied for another volume.
    fn named_keys(&self) -> BTreeMap<String, String> {
        let mut named = BTreeMap::new();
        for pv in self.pv_store.state() {
            if let (Ok(Some(key)), Some(name)) = (pv.encryption_key(), pv.metadata.name.as_deref()) {
                named.insert(key, name.to_string());
            }
        }
        named
    }

    /// After the create of an encrypted volume's PV: a key whose create did not publish it no
    /// longer waits for its PV. When the name was taken by a PV that does not name this key
    /// (one made before the volume was encrypted, say), the directory just readied is given up
    /// at once, while it is still empty: nothing is left in that tenant's volume.
    pub(super) async fn settle_readied_key(
        &mut self,
        d: &DesiredPv,
        key: &str,
        result: &Result<crate::api::Created, crate::api::ApiError>,
    ) {
        let taken_by_other = match result {
            Ok(crate::api::Created::Created { .. }) => return,
            Ok(crate::api::Created::AlreadyExists(existing)) => {
                existing.encryption_key().ok().flatten().as_deref() != Some(key)
            }
            Err(_) => false,
        };
        self.keys.fresh.remove(key);
        if !taken_by_other {
            return;
        }
        let Ok(target) = target_at(&d.host_path, &d.class, self.config.storage_class_map.get(&d.class)) else { return };
        let info = KeyInfo {
            id: key.to_string(),
            host_path: d.host_path.clone(),
            identity: d.identity.clone(),
            created: String::new(),
            age: None,
        };
        let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
        let subject = Subject::Volume(d.host_path.clone());
        let path = target.path;
        let given_up = self
            .on_host(move |_| {
                ops.run(subject, "readied key given up", timeout, move |on| {
                    shared.destroy_orphan_key(&info, Some(&path), on)
                })
                .or_error("still being given up (a slow disk)")
            })
            .await
            .unwrap_or_else(|| Err("the host task failed".into()));
        match given_up {
            Ok(()) => {
                info!(pv = %d.name, path = %d.host_path, key, "the name is another PV's: the readied encryption key and its empty directory are given up")
            }
            // The orphan rule takes it later, on the same conditions.
            Err(e) => warn!(pv = %d.name, path = %d.host_path, key, "the readied encryption key is kept for now: {e}"),
        }
    }

    /// Has the key of each of this node's encrypted PVs (and an earlier incarnation's) that a
    /// pod may mount in the kernel, and destroys the stored keys no PV names any more
    /// (core::volumes::encryption::plan_keys). Returns the PVs whose key could not be had: the fences
    /// keep pods from mounting them.
    pub(super) async fn follow_keys(
        &mut self,
        states: &[PvState],
        predecessors: &[PvState],
        keys_absent: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        let mut keyed = Vec::new();
        let mut unreadable = BTreeSet::new();
        let mut classes = BTreeMap::new();
        for pv in states.iter().chain(predecessors) {
            if pv.encryption.is_some() {
                classes.insert(pv.name.clone(), pv.class.clone());
            }
            match &pv.encryption {
                None => {}
                // Loaded when this pass's presence check found its key missing from the kernel
                // (host::access): a key in place costs no more than that check.
                // Not a Released (or Failed) PV's: no pod gets it mounted again before its wipe,
                // which destroys the key; loading it would race the wipe.
                Some(Ok(key)) => keyed.push(KeyedPv {
                    name: pv.name.clone(),
                    host_path: pv.host_path.clone(),
                    key: key.clone(),
                    live: may_be_mounted(pv)
                        && !matches!(pv.phase.as_str(), "Released" | "Failed")
                        && keys_absent.contains(&pv.uid),
                }),
                Some(Err(why)) => {
                    // Which key is unknown: fenced, and no stored key counts as an orphan.
                    if self.problems.first_seen(format!("key-annotation/{}/{why}", pv.name)) {
                        warn!(pv = %pv.name, "its encryption annotation cannot be read ({why}); fenced");
                    }
                    unreadable.insert(pv.name.clone());
                }
            }
        }
        let encrypting = self.config.storage_class_map.values().any(|c| c.encryption.is_some());
        if encrypting {
            self.tell_unencrypted(states).await;
        }
        let now = Instant::now();
        // The store is listed for orphans now and then, not at every pass; never while nothing
        // is encrypted and it held nothing at the last look.
        let held = self.keys.listed.is_none_or(|(_, held)| held);
        let due = self.keys.listed.is_none_or(|(at, _)| now.duration_since(at) >= LIST_EVERY);
        let wanted = encrypting || !keyed.is_empty() || !unreadable.is_empty() || held;
        let stored = if due && wanted {
            let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
            let listed = self
                .on_host(move |_| {
                    let subject = Subject::Host("key store");
                    ops.run(subject, "key store listing", timeout, move |_| shared.stored_keys())
                        .or_error("the key store is still being listed (a slow disk)")
                })
                .await;
            match listed {
                Some(Ok(keys)) => {
                    self.keys.listed = Some((now, !keys.is_empty()));
                    Some(keys)
                }
                Some(Err(e)) => {
                    warn!(error = %e, "the node's key store cannot be read; no orphan key is destroyed this pass");
                    None
                }
                None => None,
            }
        } else {
            None
        };
        let as_planned = |k: &KeyInfo| StoredKey { id: k.id.clone(), host_path: k.host_path.clone(), age: k.age };
        // Every PV of the store names its key, whoever's it is (an identity change, a label or
        // annotation edited by hand must not make a tenant's key an orphan). Read only when
        // orphans are judged or readied keys wait for their PV: not a scan of every PV per pass.
        let named = if stored.is_some() || !self.keys.fresh.is_empty() { self.named_keys() } else { BTreeMap::new() };
        for (key, name) in &named {
            keyed.push(KeyedPv { name: name.clone(), host_path: String::new(), key: key.clone(), live: false });
        }
        // Keys readied for creates name PVs the store may not show yet: never orphans until it
        // shows them (or the create did not publish; an hour at most, for a watch that lags).
        self.keys.fresh.retain(|key, at| !named.contains_key(key) && now.duration_since(*at) < FRESH_AT_MOST);
        for key in self.keys.fresh.keys() {
            keyed.push(KeyedPv { name: String::new(), host_path: String::new(), key: key.clone(), live: false });
        }
        let planned: Vec<StoredKey> = stored.iter().flatten().map(as_planned).collect();
        // An unreadable annotation may name any stored key: none is an orphan meanwhile.
        let complete = stored.is_some() && unreadable.is_empty();
        let plan = plan_keys(&keyed, &planned, complete);
        let mut locked = unreadable;
        locked.extend(self.load_keys(plan.load, &classes).await);
        let orphans: Vec<KeyInfo> =
            stored.into_iter().flatten().filter(|k| plan.orphans.iter().any(|o| o.id == k.id)).collect();
        self.destroy_orphans(orphans).await;
        locked
    }

    /// Tells, once per change, the PVs of an encrypting class that were published before it
    /// encrypted: they are never converted (their data stays as the tenant wrote it) and stay
    /// unencrypted until their wipe; nothing about it is silent.
    async fn tell_unencrypted(&mut self, states: &[PvState]) {
        let classes: Vec<String> = self
            .config
            .storage_class_map
            .iter()
            .filter(|(_, c)| c.encryption.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        for class in classes {
            let plain: Vec<&str> = states
                .iter()
                .filter(|pv| pv.class == class && pv.encryption.is_none() && !pv.deleting)
                .map(|pv| pv.name.as_str())
                .collect();
            if plain.is_empty() {
                continue;
            }
            let shown = plain.iter().take(5).copied().collect::<Vec<_>>().join(", ");
            let more = if plain.len() > 5 { format!(" and {} more", plain.len() - 5) } else { String::new() };
            let note = format!(
                "{} PV(s) of StorageClass {class} were published before it encrypted its volumes ({shown}{more}): they are not converted, and stay unencrypted until they are released and wiped; the volume is then published again encrypted",
                plain.len()
            );
            self.report_node_problem("EncryptionPending", note).await;
        }
    }

    /// Loads the planned keys (one host operation per volume, under its deadline); returns the
    /// PVs whose key could not be loaded, each told once per cause.
    async fn load_keys(
        &mut self,
        load: BTreeMap<String, (String, String)>,
        classes: &BTreeMap<String, String>,
    ) -> BTreeSet<String> {
        if load.is_empty() {
            return BTreeSet::new();
        }
        let mut asked = Vec::new();
        for (name, (host_path, key)) in load {
            let class = classes.get(&name).and_then(|c| self.config.storage_class_map.get(c));
            let path = class
                .and_then(|c| crate::core::volumes::pv::container_path(&host_path, &c.host_dir, &c.mount_dir).ok());
            asked.push((name, host_path, key, path));
        }
        let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
        let jobs_of = asked.clone();
        let answers: Vec<Result<bool, String>> = self
            .on_host(move |_| {
                let jobs: Vec<Job<Result<bool, String>>> = jobs_of
                    .into_iter()
                    .map(|(name, host_path, key, path)| {
                        let host = shared.clone();
                        let subject = Subject::Volume(host_path.clone());
                        Job::new(subject, "key load", timeout, move |on| match path {
                            Some(path) => host.load_key(&path, &key, on),
                            None => Err(format!("PV {name}: its class is not configured; its volume cannot be found")),
                        })
                    })
                    .collect();
                ops.run_all(jobs)
                    .into_iter()
                    .map(|a| a.or_error("its key is still being loaded (a slow disk)"))
                    .collect()
            })
            .await
            .unwrap_or_default();
        let mut locked = BTreeSet::new();
        for ((name, host_path, key, _), answer) in asked.into_iter().zip(answers) {
            match answer {
                Ok(true) => info!(pv = %name, path = %host_path, key = %key, "encryption key loaded into the kernel"),
                Ok(false) => {}
                Err(e) => {
                    self.metrics.key_failed("load");
                    if self.problems.first_seen(format!("key-load/{name}/{e}")) {
                        warn!(pv = %name, path = %host_path, key = %key, "encryption key not loaded: {e}");
                    }
                    locked.insert(name);
                }
            }
        }
        locked
    }

    /// Destroys orphan keys (their volume's root found in this pass's scan, or not mounted);
    /// each failure told once per cause and tried again at a later pass.
    async fn destroy_orphans(&mut self, orphans: Vec<KeyInfo>) {
        for key in orphans {
            let path = self.marks.found_disks.iter().find(|(host_path, _)| *host_path == key.host_path).and_then(
                |(host_path, _)| {
                    self.config.storage_class_map.values().find_map(|c| {
                        crate::core::volumes::pv::container_path(host_path, &c.host_dir, &c.mount_dir).ok()
                    })
                },
            );
            let (ops, timeout, shared, k) = (self.ops.clone(), self.host_timeout, self.host.clone(), key.clone());
            let subject = Subject::Volume(key.host_path.clone());
            let result = self
                .on_host(move |_| {
                    ops.run(subject, "orphan key destroy", timeout, move |on| {
                        shared.destroy_orphan_key(&k, path.as_deref(), on)
                    })
                    .or_error("still being destroyed (a slow disk)")
                })
                .await
                .unwrap_or_else(|| Err("the host task failed".into()));
            match result {
                Ok(()) => {
                    info!(key = %key.id, path = %key.host_path, "orphan encryption key destroyed (no PV names it)")
                }
                Err(e) => {
                    self.metrics.key_failed("orphan");
                    let note = format!(
                        "the encryption key {} (made for the volume at {}) is named by no PV, but is kept: {e}",
                        key.id, key.host_path
                    );
                    self.report_node_problem("EncryptionKeyKept", note).await;
                }
            }
        }
    }
}
