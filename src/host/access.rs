//! The agent's one door to the host: what a pass observes (in one blocking call) and the few
//! host effects it has (used marks, the ledger, wipes). The agent and the wiper hold a
//! `dyn HostAccess`, so their executors are unit-tested with a fake host, and everything that
//! touches the machine stays in `host/`. Every method blocks: callers run them on the blocking
//! pool, never on the runtime's workers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::ProvisionerConfig;
use crate::core::cluster::succession::DiskCheck;
use crate::core::devices::device_claim::LinkAction;
use crate::core::identity::disk_identity::{Verdict, judge};
use crate::core::identity::used_mark::{Replace, UsedMark};
use crate::core::volumes::volume_safety::DiskKey;
use crate::core::wipe::cleanup::PvState;
use crate::core::wipe::wipe_history::LastWipe;
use crate::core::wipe::wipe_job::{Progress, WipeError, WipeJob, Wiped};
use crate::host::HostError;
use crate::host::devices::claims::{self, ClaimMemory, ClaimReport};
use crate::host::devices::verify::Verifier;
use crate::host::identity::fingerprint::directory_identity;
use crate::host::identity::fingerprint::{check_disk, presence_and_check, upgraded_identity, volume_identity_in};
use crate::host::identity::used_mark::{Accept, Ledger, MarkOutcome, mark_volume};
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::{Answer, Job, OnDeadline, Operations, Subject};
use crate::host::volumes::discovery::{self, Examine, Scan};
use crate::host::volumes::encryption;
use crate::host::volumes::fscrypt::KeyId;
use crate::host::volumes::key_store::KeyStore;
use crate::host::volumes::kubelet::KubeletView;
use std::os::fd::AsFd as _;

/// What one pass wants to know about the host, beyond the scan of the discovery directories.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    /// The configuration to scan with.
    pub config: ProvisionerConfig,
    /// Host paths that already have a PV (their block devices are not probed for use).
    pub published: BTreeSet<String>,
    /// This node's PVs and where their volumes are: whether each is present, and (when
    /// `disks` is set) which disk each one is on.
    pub pvs: Vec<(PvState, PathBuf)>,
    /// Whether to read the disks of `pvs` (a wipe may start this pass).
    pub disks: bool,
    /// PVs of an earlier incarnation of this Node, to check their disks.
    pub predecessors: Vec<(PvState, PathBuf)>,
    /// Host path and recorded identity of every PV of this node (any class, predecessors'
    /// too): no device one of them has is claimed again.
    pub pv_identities: Vec<(String, Option<String>)>,
    /// Host paths of this node's unbound PVs (Available or Pending, no claim, not being
    /// deleted): their claimed devices are checked for foreign use on every pass.
    pub unbound: BTreeSet<String>,
}

/// What the host showed in one pass, read against one mount table.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Volumes found and entries skipped, with their used marks read.
    pub scan: Scan,
    /// UIDs of the asked PVs whose volume is not at its path.
    pub absent: Vec<String>,
    /// What is at each asked PV's path compared with its recorded disk, by UID (the fences
    /// need to tell another disk from nothing). PVs whose check did not answer are left out.
    pub checks: Vec<(String, DiskCheck)>,
    /// I/O errors the presence checks met, by host path (the failing sign `io-failure`).
    pub io_failures: Vec<(String, String)>,
    /// For each asked PV, its volume's identity in the current format when it recorded one in
    /// an old format and the disk proves to be the same (see host::identity::fingerprint::upgraded_identity).
    pub upgrades: Vec<(String, String)>,
    /// The disk each asked PV's volume is on (only when asked; `None` entries are left out).
    pub disks: Option<Vec<(String, DiskKey)>>,
    /// What each predecessor PV's disk check found, by UID.
    pub succession: Vec<(String, DiskCheck)>,
    /// The device claim pass (when a class has a `devices` section or links were recorded).
    pub claims: Option<ClaimReport>,
    /// Without a claim pass, the node's block devices for the inventory, listed from sysfs
    /// without opening any (host::devices::claims::listing); empty when a claim pass ran.
    pub devices: Vec<crate::core::devices::device_claim::DeviceFacts>,
    /// The mount table this pass read: the mount watch compares what it reads with it
    /// (host::mounts::watch::MountWatch).
    pub mounts: Option<Arc<MountTable>>,
    /// UIDs of the asked encrypted PVs whose volume is present but whose key the kernel does
    /// not have (a reboot or a remount dropped it), or could not say (core::volumes::encryption).
    pub keys_absent: BTreeSet<String>,
}

/// One used mark to write (see host::identity::used_mark::mark_volume).
#[derive(Debug, Clone)]
pub struct MarkJob {
    /// Where the volume is, inside this container.
    pub path: PathBuf,
    /// The identity the disk must prove to have.
    pub recorded: String,
    /// An operator's confirmation of an unproven identity.
    pub confirmed: Option<String>,
    /// What counts as proof.
    pub accept: Accept,
    /// The mark to write.
    pub mark: UsedMark,
    /// Which mark already there may be replaced.
    pub replace: Replace,
}

/// The host operations the agent and the wiper need.
pub trait HostAccess: Send + Sync + 'static {
    /// Scans the discovery directories and checks the asked PVs' volumes, against one read of
    /// the mount table. Fails only when the mount table cannot be read.
    fn observe(&self, ask: Ask) -> Result<Observation, HostError>;
    /// The mount table the used marks of one batch are written against.
    fn mount_table(&self) -> Result<Arc<MountTable>, HostError>;
    /// Writes one used mark (on the agent's pool of per-volume operations, under a deadline:
    /// a frozen filesystem blocks the write).
    fn mark_one(&self, job: &MarkJob, mounts: &MountTable, on: &OnDeadline) -> Result<MarkOutcome, String>;
    /// Records the marks written in the ledger, in one durable write; a failed write turns
    /// their outcomes into errors.
    fn record_marks(&self, outcomes: &mut [Result<MarkOutcome, String>]);
    /// Records PVs let go while no claim was on them (see host::identity::used_mark::Ledger).
    fn record_withdrawn(&self, uids: &[String]) -> Result<(), String>;
    /// The identity of the volume at `path`, in the current format.
    fn identity(&self, path: &std::path::Path, on: &OnDeadline) -> Result<String, String>;
    /// Wipes one volume after proving it is the published disk; returns what was wiped.
    /// Stops early (with an error) once `cancel` is set; `progress` gets the size and the bytes
    /// done.
    fn wipe(
        &self,
        job: &WipeJob,
        cancel: &AtomicBool,
        progress: &Progress,
        on: &OnDeadline,
    ) -> Result<Wiped, WipeError>;
    /// Marks the claim record of the link at `host_path` held for `why`, durably: its
    /// unbound PV was withdrawn because its device changed under it.
    fn hold_claim(&self, host_path: &str, why: &str) -> Result<(), String>;
    /// Drops the records of completed wipes (host::wipe::wipe_record) whose PV UID `keep` rejects;
    /// returns the UIDs still recorded. A host that keeps none has none.
    fn forget_wipes(&self, _keep: &(dyn Fn(&str) -> bool + Sync)) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
    /// Keeps the last completed wipe of a volume durably until its new PV exists
    /// (host::wipe::wipe_history). A host that keeps none forgets it.
    fn note_last_wipe(&self, _wipe: &LastWipe) -> Result<(), String> {
        Ok(())
    }
    /// The ledger's marks that go into the node inventory's cluster-side copy
    /// (core::cluster::inventory::is_portable_block_mark), each with whether it was only offered, when
    /// the ledger changed since generation `since`; `Ok(None)` when it did not. A host
    /// without a ledger has none.
    fn used_copy(&self, _since: Option<u64>) -> Result<Option<crate::host::identity::used_mark::MarksAt>, String> {
        Ok(None)
    }
    /// Puts back into the ledger, durably, marks its cluster-side copy holds and it lacks (a
    /// lost ledger). A host without a ledger keeps nothing.
    fn restore_marks(&self, _copy: &dyn Fn(&[UsedMark]) -> Vec<UsedMark>) -> Result<usize, String> {
        Ok(0)
    }
    /// Drops the last wipes `keep` rejects; returns those kept. A host that keeps none has none.
    fn last_wipes(&self, _keep: &(dyn Fn(&LastWipe) -> bool + Sync)) -> Result<Vec<LastWipe>, String> {
        Ok(Vec::new())
    }
    /// Readies the encrypted data directory of the volume at `path` (inside this container;
    /// `host_path` and the identity discovery `recorded` go with its key) on the disk proven to
    /// be that one, and returns its key's identifier (host::volumes::encryption::prepare). A host that
    /// keeps no keys refuses.
    fn prepare_encrypted(
        &self,
        path: &std::path::Path,
        _host_path: &str,
        _recorded: &str,
        _on: &OnDeadline,
    ) -> Result<String, String> {
        Err(format!("{}: this host keeps no encryption keys", path.display()))
    }
    /// Has key `key` (hex identifier) in the kernel for the encrypted volume at `path`; `true`
    /// when it had to be added (host::volumes::encryption::load). A host that keeps no keys cannot.
    fn load_key(&self, path: &std::path::Path, key: &str, _on: &OnDeadline) -> Result<bool, String> {
        Err(format!("{}: this host keeps no encryption keys (key {key})", path.display()))
    }
    /// The keys in the node's store. A host that keeps none has none.
    fn stored_keys(&self) -> Result<Vec<crate::host::volumes::key_store::KeyInfo>, String> {
        Ok(Vec::new())
    }
    /// Destroys a stored key no PV names (core::volumes::encryption::plan_keys) unless kubelet holds a
    /// mount of its disk; `path`: where its volume is mounted in this container, if it is (the
    /// kernel's copy goes too). A host that keeps no keys has none to destroy.
    fn destroy_orphan_key(
        &self,
        _key: &crate::host::volumes::key_store::KeyInfo,
        _path: Option<&std::path::Path>,
        _on: &OnDeadline,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// The real host: the mount table, the volumes, the node-local ledger, kubelet's mounts.
#[derive(Clone)]
pub(crate) struct RealHost {
    ledger: Ledger,
    kubelet: KubeletView,
    /// What the claim passes saw, between passes (host::devices::claims::ClaimMemory).
    baselines: Arc<Mutex<ClaimMemory>>,
    /// The devices of unbound PVs, whose writes the block-device watch turns into a pass.
    watched: Arc<Mutex<BTreeSet<String>>>,
    /// The full reads of `verify: full` (one at a time, in the background), kept next to the
    /// ledger in the state directory.
    verifier: Verifier,
    /// Where every operation on one volume or device runs, under its deadline.
    ops: Operations,
    /// That deadline.
    timeout: Duration,
}

impl RealHost {
    /// The host, with the ledger of used disks this agent holds and where kubelet's mounts are.
    /// Every per-volume operation runs on `ops` (the executor shared with the agent and the
    /// wiper) with `timeout` as its deadline: taken here, not set afterwards, since a host that
    /// made its own executor would be a second pool nobody sees.
    pub(crate) fn new(ledger: Ledger, kubelet: KubeletView, ops: Operations, timeout: Duration) -> Self {
        let verifier = Verifier::new(ledger.path().parent().unwrap_or(std::path::Path::new(".")));
        RealHost { ledger, kubelet, baselines: Arc::default(), watched: Arc::default(), verifier, ops, timeout }
    }

    /// Shares `watched` with the block-device watch (host::mounts::watch::watch_block_devices): after
    /// each claim pass it holds the devices of unbound PVs.
    pub(crate) fn watching(mut self, watched: Arc<Mutex<BTreeSet<String>>>) -> Self {
        self.watched = watched;
        self
    }

    /// The state directory (the ledger's), where the small records live.
    fn state_dir(&self) -> Result<&std::path::Path, String> {
        self.ledger.path().parent().ok_or_else(|| "the ledger has no state directory".to_string())
    }

    /// Calls `wake` as a full read progresses (every 10%) and when it ends, so the agent runs a
    /// pass: the device is claimed (or refused) without waiting for the resync.
    pub(crate) fn on_full_read_change(self, wake: impl Fn() + Send + Sync + 'static) -> Self {
        self.verifier.on_change(wake);
        self
    }
}

impl RealHost {
    /// The device claim pass (see host::devices::claims): skipped while no class has a `devices`
    /// section and no link of ours is recorded.
    /// The classes whose discovery directory does not answer (a hung network or FUSE
    /// filesystem under it): each is looked at on the pool of per-volume operations, and one
    /// that does not answer in time is left out of this pass, with why.
    fn wedged_directories(&self, config: &ProvisionerConfig) -> BTreeMap<String, (String, String)> {
        let jobs = config
            .storage_class_map
            .values()
            .map(|c| {
                let dir = std::path::PathBuf::from(&c.mount_dir);
                Job::new(Subject::Directory(c.mount_dir.clone()), "directory check", self.timeout, move |on| {
                    list_directory(&dir, on)
                })
            })
            .collect();
        config
            .storage_class_map
            .iter()
            .zip(self.ops.run_all(jobs))
            .filter_map(|((class, c), answer)| match answer {
                Answer::Done(()) => None,
                Answer::Pending => {
                    Some((class.clone(), (c.mount_dir.clone(), "it is still being listed (a slow filesystem)".into())))
                }
                Answer::Unresponsive(e) => Some((class.clone(), (c.mount_dir.clone(), e.to_string()))),
            })
            .collect()
    }

    fn claim_devices(&self, ask: &Ask, mounts: &MountTable, wedged: &[String]) -> Option<ClaimReport> {
        let state_dir = self.ledger.path().parent()?.to_path_buf();
        let mut records = match claims::read_records(&state_dir) {
            Ok(r) => r,
            Err(e) => {
                let paths: Vec<String> = ask.pv_identities.iter().map(|(path, _)| path.clone()).collect();
                let why = "the agent's claim records are unreadable";
                let held =
                    claims::hold_unknown_links(&ask.config, &paths, mounts, why, Some((&self.ops, self.timeout)));
                let plan = crate::core::devices::device_claim::ClaimPlan { held, ..Default::default() };
                return Some(ClaimReport { failed: Some(e.to_string()), plan, ..Default::default() });
            }
        };
        if records.is_empty() && ask.config.storage_class_map.values().all(|c| c.devices.is_none()) {
            return None;
        }
        let pvs = claims::pv_disks(&ask.pv_identities, &ask.unbound);
        // A poisoned lock only means a pass panicked mid-way: the counters are still counters.
        let mut baselines = self.baselines.lock().unwrap_or_else(|e| e.into_inner());
        let verifier = Some(&self.verifier);
        let (mut devices, mut plan) = claims::plan_claims(
            &ask.config,
            records.clone(),
            Some(pvs.clone()),
            mounts,
            Some(&mut baselines),
            verifier,
            Some(claims::Deadlines { ops: &self.ops, timeout: self.timeout, unanswered: wedged }),
        );
        let mut applied = claims::apply(&ask.config, &state_dir, &mut records, &plan.actions);
        // A claim let go or a link removed frees the device (or a maxPerNode place) for a
        // claim judged afresh: planned again now rather than at the next event.
        let freed =
            applied.iter().any(|(a, r)| r.is_ok() && matches!(a, LinkAction::Forget(_) | LinkAction::Remove(_)));
        if freed {
            (devices, plan) = claims::plan_claims(
                &ask.config,
                records.clone(),
                Some(pvs),
                mounts,
                Some(&mut baselines),
                verifier,
                Some(claims::Deadlines { ops: &self.ops, timeout: self.timeout, unanswered: wedged }),
            );
            applied.extend(claims::apply(&ask.config, &state_dir, &mut records, &plan.actions));
        }
        *self.watched.lock().unwrap_or_else(|e| e.into_inner()) = baselines.watched_names();
        Some(ClaimReport { devices, plan, applied, failed: None, records, full_reads: self.verifier.figures() })
    }
}

/// What the scan does first with a discovery directory: resolve it and list it (a hung
/// filesystem under it blocks here).
fn list_directory(dir: &std::path::Path, _on: &OnDeadline) {
    let _ = std::fs::canonicalize(dir).and_then(std::fs::read_dir).map(|rd| rd.count());
}

impl HostAccess for RealHost {
    fn observe(&self, ask: Ask) -> Result<Observation, HostError> {
        let mounts = Arc::new(MountTable::read()?);
        // A class whose discovery directory does not answer sits this pass out (its PVs keep
        // their state: their own checks do not answer either); no device is claimed meanwhile,
        // since one may already be a volume there.
        let wedged = self.wedged_directories(&ask.config);
        let mut ask = ask;
        ask.config.storage_class_map.retain(|class, _| !wedged.contains_key(class));
        let wedged_classes: Vec<String> = wedged.keys().cloned().collect();
        // Claims first, so the links made now are scanned (and held ones kept back) this pass.
        let claims = self.claim_devices(&ask, &mounts, &wedged_classes);
        // No claim pass: the inventory still lists every disk (an operator's first look).
        let devices = match claims {
            None => claims::listing(&mounts, Some((&self.ops, self.timeout))),
            Some(_) => Vec::new(),
        };
        self.ledger.reload_if_unreadable();
        let examine = Examine {
            ops: self.ops.clone(),
            timeout: self.timeout,
            ledger: Some(self.ledger.clone()),
            extents: Default::default(),
        };
        let mut scan = discovery::scan_examined(&ask.config, mounts.clone(), &ask.published, &[], Some(&examine));
        for (class, (dir, why)) in wedged {
            let reason = discovery::SkipReason::UnreadableDirectory(format!("{dir}: {why}"));
            scan.skipped.push(discovery::Skipped { class, path: std::path::PathBuf::from(dir), reason });
        }
        if let Some(c) = &claims {
            discovery::hold_back(&mut scan, &ask.config, &c.plan.held);
            // A device changed under its unbound PV is held whatever the ledger says of it:
            // never wiped on the agent's own word, never offered, until an operator clears it.
            let tampered: Vec<(String, String, String)> =
                c.plan.tampered.iter().map(|t| (t.class.clone(), t.name.clone(), t.why.clone())).collect();
            discovery::hold_back_always(&mut scan, &ask.config, &tampered);
        }
        // Each PV's volume is looked at under its own deadline: present, its identity in the
        // current format, and (when asked) its disk. An unresponsive one is none of these.
        let with_disks = ask.disks;
        let jobs = ask.pvs.iter().map(|(pv, path)| {
            // Only what the check reads: a thousand PVs' whole states would be copied per pass.
            let (identity, deleting) = (pv.identity.clone(), pv.deleting);
            let key = pv.encryption.clone().and_then(Result::ok);
            let (path, mounts) = (path.clone(), mounts.clone());
            let domain = mounts.domain_of(&path);
            Job::new(Subject::Volume(pv.host_path.clone()), "presence check", self.timeout, move |on| {
                let (present, check, io_failure) = presence_and_check(&path, identity.as_deref(), &mounts, on);
                let recorded = identity.as_deref().filter(|id| crate::core::identity::disk_identity::is_legacy(id));
                let upgrade = recorded.filter(|_| !deleting).and_then(|id| upgraded_identity(&path, id, &mounts, on));
                let disk = if with_disks { discovery::disk_at(&path, &mounts, &mounts.facts(), on) } else { None };
                let key_absent =
                    key.filter(|_| present).is_some_and(|k| !matches!(encryption::key_present(&path, &k), Ok(true)));
                (present, check, upgrade, disk, io_failure, key_absent)
            })
            .on(domain)
        });
        let checked = self.ops.run_each(jobs);
        let (mut absent, mut checks, mut upgrades, mut disks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut io_failures = Vec::new();
        let mut keys_absent = BTreeSet::new();
        for ((pv, _), result) in ask.pvs.iter().zip(checked) {
            let Some((present, check, upgrade, disk, io_failure, key_absent)) = result.done() else { continue };
            if key_absent {
                keys_absent.insert(pv.uid.clone());
            }
            if let Some(what) = io_failure {
                io_failures.push((pv.host_path.clone(), what));
            }
            if !present {
                absent.push(pv.uid.clone());
            }
            checks.push((pv.uid.clone(), check));
            if let Some(id) = upgrade {
                upgrades.push((pv.uid.clone(), id));
            }
            if let Some(d) = disk {
                disks.push((pv.uid.clone(), d));
            }
        }
        let jobs = ask
            .predecessors
            .iter()
            .map(|(pv, path)| {
                let (recorded, path, mounts) = (pv.identity.clone(), path.clone(), mounts.clone());
                let domain = mounts.domain_of(&path);
                Job::new(Subject::Volume(pv.host_path.clone()), "disk check", self.timeout, move |on| {
                    check_disk(&path, recorded.as_deref(), &mounts, on)
                })
                .on(domain)
            })
            .collect();
        let succession = ask
            .predecessors
            .iter()
            .zip(self.ops.run_all(jobs))
            .filter_map(|((pv, _), check)| Some((pv.uid.clone(), check.done()?)))
            .collect();
        let disks = ask.disks.then_some(disks);
        let mounts = Some(mounts);
        Ok(Observation {
            scan,
            absent,
            checks,
            io_failures,
            upgrades,
            disks,
            succession,
            claims,
            devices,
            mounts,
            keys_absent,
        })
    }

    fn mount_table(&self) -> Result<Arc<MountTable>, HostError> {
        Ok(Arc::new(MountTable::read()?))
    }

    fn mark_one(&self, job: &MarkJob, mounts: &MountTable, _on: &OnDeadline) -> Result<MarkOutcome, String> {
        let there_ok = |there: Option<&UsedMark>| job.replace.allows(&job.mark, there);
        mark_volume(
            &job.path,
            &job.recorded,
            job.confirmed.as_deref(),
            job.accept,
            &job.mark,
            &self.ledger,
            mounts,
            there_ok,
        )
        .or_else(|e| {
            // The disk failed the write (or the read before it): a failing sign, not a retry.
            if e.is_disk_failure() { Ok(MarkOutcome::DiskFailing(e.to_string())) } else { Err(e.to_string()) }
        })
    }

    fn record_marks(&self, outcomes: &mut [Result<MarkOutcome, String>]) {
        self.ledger.record_outcomes(outcomes.iter_mut());
    }

    fn record_withdrawn(&self, uids: &[String]) -> Result<(), String> {
        self.ledger.record_withdrawn(uids).map_err(|e| e.to_string())
    }

    fn used_copy(&self, since: Option<u64>) -> Result<Option<crate::host::identity::used_mark::MarksAt>, String> {
        self.ledger.marks_since(since, crate::core::cluster::inventory::is_portable_block_mark)
    }

    fn restore_marks(&self, copy: &dyn Fn(&[UsedMark]) -> Vec<UsedMark>) -> Result<usize, String> {
        let missing = copy(&self.ledger.marks()?);
        self.ledger.record(&missing).map_err(|e| e.to_string())?;
        Ok(missing.len())
    }

    fn identity(&self, path: &std::path::Path, _on: &OnDeadline) -> Result<String, String> {
        let mounts = MountTable::read().map_err(|e| e.to_string())?;
        volume_identity_in(path, &mounts).map_err(|e| e.to_string())
    }

    fn wipe(
        &self,
        job: &WipeJob,
        cancel: &AtomicBool,
        progress: &Progress,
        _on: &OnDeadline,
    ) -> Result<Wiped, WipeError> {
        super::wipe::run::wipe(&self.ledger, &self.kubelet, job, cancel, progress)
    }

    fn hold_claim(&self, host_path: &str, why: &str) -> Result<(), String> {
        claims::hold_record(self.state_dir()?, host_path, why).map_err(|e| e.to_string())
    }

    fn forget_wipes(&self, keep: &(dyn Fn(&str) -> bool + Sync)) -> Result<Vec<String>, String> {
        crate::host::wipe::wipe_record::retain(self.state_dir()?, keep).map_err(|e| e.to_string())
    }

    fn note_last_wipe(&self, wipe: &LastWipe) -> Result<(), String> {
        crate::host::wipe::wipe_history::note(self.state_dir()?, wipe).map_err(|e| e.to_string())
    }

    fn last_wipes(&self, keep: &(dyn Fn(&LastWipe) -> bool + Sync)) -> Result<Vec<LastWipe>, String> {
        crate::host::wipe::wipe_history::retain(self.state_dir()?, keep).map_err(|e| e.to_string())
    }

    fn prepare_encrypted(
        &self,
        path: &std::path::Path,
        host_path: &str,
        recorded: &str,
        _on: &OnDeadline,
    ) -> Result<String, String> {
        let store = KeyStore::new(self.state_dir()?);
        let mounts = MountTable::read().map_err(|e| e.to_string())?;
        let root = encrypted_root(path)?;
        // Proven on the descriptor the key and the policy go through: the disk discovery found.
        let found = directory_identity(root.as_fd(), path, Some(&mounts)).map_err(|e| e.to_string())?;
        let same = found.identity == recorded || matches!(judge(recorded, &found, None), Verdict::Same(_));
        if !same {
            return Err(format!(
                "{}: the volume changed since discovery (found {}, discovery saw {recorded}); not encrypted now",
                path.display(),
                found.identity
            ));
        }
        let id =
            encryption::prepare(root.as_fd(), path, host_path, &found.identity, &store).map_err(|e| e.to_string())?;
        Ok(id.to_hex())
    }

    fn load_key(&self, path: &std::path::Path, key: &str, _on: &OnDeadline) -> Result<bool, String> {
        let id = KeyId::from_hex(key).ok_or_else(|| format!("{key:?} is not a key identifier"))?;
        let store = KeyStore::new(self.state_dir()?);
        let root = encrypted_root(path)?;
        let loaded = encryption::load(root.as_fd(), path, &id, &store).map_err(|e| e.to_string())?;
        Ok(loaded == encryption::Loaded::Added)
    }

    fn stored_keys(&self) -> Result<Vec<crate::host::volumes::key_store::KeyInfo>, String> {
        KeyStore::new(self.state_dir()?).list().map_err(|e| e.to_string())
    }

    fn destroy_orphan_key(
        &self,
        key: &crate::host::volumes::key_store::KeyInfo,
        path: Option<&std::path::Path>,
        _on: &OnDeadline,
    ) -> Result<(), String> {
        let id = KeyId::from_hex(&key.id).ok_or_else(|| format!("{:?} is not a key identifier", key.id))?;
        // Only on the disk it was made for, found mounted at its path: a key whose disk is
        // not here may still be a tenant's only way to their data (the disk comes back).
        let Some(path) = path else {
            return Err(format!("key {}: its disk is not mounted at {}; kept until it is", key.id, key.host_path));
        };
        let store = KeyStore::new(self.state_dir()?);
        let mounts = MountTable::read().map_err(|e| e.to_string())?;
        let root = encrypted_root(path)?;
        let found = directory_identity(root.as_fd(), path, Some(&mounts)).map_err(|e| e.to_string())?;
        let same = found.identity == key.identity || matches!(judge(&key.identity, &found, None), Verdict::Same(_));
        if !same {
            return Err(format!(
                "key {}: another disk is at {} now ({}, the key was made for {}); kept",
                key.id, key.host_path, found.identity, key.identity
            ));
        }
        // Any mount kubelet has of this filesystem keeps the key: a pod may still use it.
        let resolved = crate::host::volumes::volume::resolve_entry(path).map_err(|e| e.to_string())?.1;
        let subject = crate::host::volumes::kubelet::Subject::filesystem_at(&resolved, &mounts)
            .ok_or_else(|| format!("key {}: {} is not a mount point; kept", key.id, path.display()))?;
        if let Some(at) = self.kubelet.holder(&subject, &mounts).map_err(|e| e.to_string())? {
            return Err(format!("key {}: kubelet still has its volume mounted at {}; kept", key.id, at.display()));
        }
        encryption::abandon(root.as_fd(), path, &id, &store).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The root of the Filesystem volume at `path`, opened for an encryption step: a directory
/// (a link is never followed out of the discovery directory, and a block device has no
/// directory to encrypt).
fn encrypted_root(path: &std::path::Path) -> Result<std::fs::File, String> {
    use crate::host::volumes::volume::{EntryKind, resolve_entry};
    let (kind, resolved) = resolve_entry(path).map_err(|e| e.to_string())?;
    if kind != EntryKind::Directory {
        return Err(format!(
            "{}: encryption needs a mounted filesystem, and this entry is not a directory ({kind:?})",
            path.display()
        ));
    }
    crate::host::identity::used_mark::open_volume_root(&resolved).map_err(|e| e.to_string())
}
